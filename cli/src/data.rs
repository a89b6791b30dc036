//! The demo's data: a seeded generator of a few thousand realistic context items, and the changes
//! the demo makes to them later (a clause's second version, revised chunks, late chunks). Every run
//! draws the same items in the same order.

use ctxlog::{ContextItem, Scope};
use serde_json::{json, Value};

/// The demo clock's starting time: 2024-05-10T10:00:00Z.
pub(crate) const DEMO_NOW: i64 = 1_715_335_200;
/// Items the demo writes in bulk.
pub(crate) const BULK_ITEMS: i64 = 3_000;
/// Sessions s1..=s20.
pub(crate) const SESSIONS: u64 = 20;
pub(crate) const HOUR: i64 = 3_600;
pub(crate) const DAY: i64 = 24 * HOUR;
/// TTLs of the types that expire.
const TOOL_RESULT_TTL: u64 = 6 * 3_600;
const METRIC_TTL: u64 = 3_600;
const PROFILE_TTL: u64 = 7 * 24 * 3_600;
/// The document chunks that get a second version after the snapshot.
pub(crate) const REVISED: usize = 25;
/// Late document chunks added into the query window after the snapshot.
pub(crate) const LATE: i64 = 10;
/// The generator's seed.
const SEED: u64 = 0x00C7_7106;

/// A small seeded generator (`SplitMix64`), so that every run writes the same items.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `choices` (a constant list, never empty).
    fn pick<'a>(&mut self, choices: &[&'a str]) -> &'a str {
        let count = u64::try_from(choices.len()).expect("a slice's length fits in a u64");
        let at = usize::try_from(self.below(count)).expect("a number below a slice's length fits in a usize");
        choices[at]
    }

    /// A confidence in 0.50..=0.99.
    fn confidence(&mut self) -> f64 {
        let hundredths = u32::try_from(50 + self.below(50)).expect("below 100");
        f64::from(hundredths) / 100.0
    }

    fn session(&mut self) -> Scope {
        Scope::Session(format!("s{}", 1 + self.below(SESSIONS)))
    }
}

const DOCS: [&str; 4] = ["msa_acme_2024", "dpa_globex_2023", "sla_initech_v2", "nda_umbrella"];
const CLAUSE_TEXT: [&str; 4] = [
    "Either party may terminate this Agreement on ninety (90) days' written notice.",
    "Liability of either party is capped at the fees paid in the twelve months before the claim.",
    "Personal data is processed only on documented instructions from the controller.",
    "Disputes are settled by arbitration seated in the place named in Schedule 2.",
];

/// The `BULK_ITEMS` items the demo writes first, the same on every run.
pub(crate) fn bulk_items() -> Vec<ContextItem> {
    let mut rng = Rng(SEED);
    let mut clauses = 0u64;
    (0..BULK_ITEMS).map(|n| bulk_item(n, &mut rng, &mut clauses)).collect()
}

/// The `n`-th bulk item: realistic shapes of every built-in type plus `legal_clause`, in a seeded mix.
fn bulk_item(n: i64, rng: &mut Rng, clauses: &mut u64) -> ContextItem {
    // Spread over the 24 hours before the demo clock, oldest first.
    let span = n * DAY / BULK_ITEMS;
    let timestamp = DEMO_NOW - DAY + span + i64::try_from(rng.below(30)).expect("below 30");
    let roll = rng.below(100);
    match roll {
        0..=39 => bulk_document_chunk(n, timestamp, rng),
        40..=63 => bulk_message(n, timestamp, rng),
        64..=77 => bulk_tool_result(n, timestamp, rng),
        78..=87 => bulk_metric(n, timestamp, rng),
        88..=92 => {
            *clauses += 1;
            bulk_legal_clause(*clauses, timestamp, rng)
        }
        93..=95 => bulk_user_profile(n, timestamp, rng),
        96..=97 => bulk_feedback(n, timestamp, rng),
        _ => bulk_product_document(n, timestamp, rng),
    }
}

// The bulk items of each type. Each draws from `rng` in the order its fields are written, so that
// the seeded data (and with it everything the demo prints) stays the same from run to run.

fn bulk_document_chunk(n: i64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    let doc = rng.pick(&DOCS);
    ContextItem::new(
        format!("dc_{n:05}"),
        "document_chunk",
        json!({"doc": doc, "chunk": rng.below(400), "lang": "en",
               "text": rng.pick(&CLAUSE_TEXT)}),
        rng.pick(&["contracts_sharepoint", "policy_wiki", "product_docs"]),
        timestamp,
        "1",
        Scope::GlobalReadonly,
    )
    .with_confidence(rng.confidence())
}

fn bulk_message(n: i64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    ContextItem::new(
        format!("msg_{n:05}"),
        "message",
        json!({"role": rng.pick(&["user", "assistant"]), "turn": rng.below(40),
               "text": rng.pick(&["Can you summarise clause 12?", "Here is the termination clause.",
                                  "What changed since the last draft?", "The cap is twelve months of fees."])}),
        "chat_ui",
        timestamp,
        "1",
        rng.session(),
    )
}

fn bulk_tool_result(n: i64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    ContextItem::new(
        format!("tr_{n:05}"),
        "tool_result",
        json!({"tool": rng.pick(&["web_search", "sql_runner", "contract_lookup"]),
               "query": rng.pick(&["acme termination notice", "open invoices Q2", "globex dpa annex"]),
               "hits": rng.below(25)}),
        rng.pick(&["search_api", "warehouse"]),
        timestamp,
        "1",
        rng.session(),
    )
    .with_ttl(TOOL_RESULT_TTL)
    .with_confidence(rng.confidence())
}

fn bulk_metric(n: i64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    let micros = u32::try_from(rng.below(400_000)).expect("below 400,000");
    ContextItem::new(
        format!("mm_{n:05}"),
        "monitoring_metric",
        json!({"metric": rng.pick(&["p95_latency_ms", "error_rate", "tokens_per_s"]),
               "host": format!("api-{}", 1 + rng.below(6)),
               "value": f64::from(micros) / 1_000.0}),
        "prometheus",
        timestamp,
        "1",
        Scope::GlobalWritable,
    )
    .with_ttl(METRIC_TTL)
}

/// The `clauses`-th legal clause; its id is its section number, which the registered pattern allows.
fn bulk_legal_clause(clauses: u64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    let section = format!("{}.{}", 1 + clauses / 10, 1 + clauses % 10);
    ContextItem::new(
        format!("cl_{section}"),
        "legal_clause",
        json!({"contract": rng.pick(&DOCS), "section": section,
               "jurisdiction": rng.pick(&["CN", "DE", "US"]), "text": rng.pick(&CLAUSE_TEXT)}),
        "contracts_sharepoint",
        timestamp,
        "1",
        Scope::GlobalReadonly,
    )
    .with_confidence(rng.confidence())
}

fn bulk_user_profile(n: i64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    let scope = rng.session();
    ContextItem::new(
        format!("up_{n:05}"),
        "user_profile",
        json!({"user": format!("u_{}", rng.below(500)), "plan": rng.pick(&["free", "pro", "team"]),
               "locale": rng.pick(&["en-GB", "de-DE", "zh-CN"])}),
        "profile_service",
        timestamp,
        "1",
        scope,
    )
    .with_ttl(PROFILE_TTL)
}

fn bulk_feedback(n: i64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    ContextItem::new(
        format!("fb_{n:05}"),
        "user_feedback",
        json!({"rating": 1 + rng.below(5), "comment": rng.pick(&["helpful", "missed clause 7", "too long"])}),
        "chat_ui",
        timestamp,
        "1",
        rng.session(),
    )
}

fn bulk_product_document(n: i64, timestamp: i64, rng: &mut Rng) -> ContextItem {
    ContextItem::new(
        format!("pd_{n:05}"),
        "product_document",
        json!({"product": rng.pick(&["ctx-gateway", "ctx-review"]), "section": "pricing",
               "text": "Seats are billed monthly."}),
        "product_docs",
        timestamp,
        "1",
        Scope::GlobalReadonly,
    )
}

/// Version 2 of `clause`, with amended text.
pub(crate) fn amended_clause(clause: &ContextItem) -> ContextItem {
    let mut amended = ContextItem::new(
        clause.id.clone(),
        "legal_clause",
        clause.content.clone(),
        clause.source.clone(),
        DEMO_NOW,
        "2",
        clause.scope.clone(),
    );
    if let Value::Object(fields) = &mut amended.content {
        fields.insert(
            "text".into(),
            json!("Amended: termination on thirty (30) days' written notice."),
        );
    }
    amended
}

/// Version 2 of the first `REVISED` chunks, with revised text.
pub(crate) fn revised_chunks(chunks: &[ContextItem]) -> Vec<ContextItem> {
    chunks
        .iter()
        .take(REVISED)
        .map(|item| {
            let mut content = item.content.clone();
            if let Value::Object(fields) = &mut content {
                fields.insert("text".into(), json!("Revised after legal review."));
            }
            ContextItem::new(
                item.id.clone(),
                "document_chunk",
                content,
                item.source.clone(),
                item.timestamp,
                "2",
                Scope::GlobalReadonly,
            )
        })
        .collect()
}

/// `LATE` new chunks whose timestamps fall in the query window, five minutes apart.
pub(crate) fn late_chunks() -> Vec<ContextItem> {
    (0..LATE)
        .map(|n| {
            ContextItem::new(
                format!("dc_late_{n:02}"),
                "document_chunk",
                json!({"doc": "msa_acme_2024", "chunk": 400 + n, "lang": "en", "text": "Late-arriving annex."}),
                "contracts_sharepoint",
                DEMO_NOW - 2 * HOUR + n * 300,
                "1",
                Scope::GlobalReadonly,
            )
        })
        .collect()
}
