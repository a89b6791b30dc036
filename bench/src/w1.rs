//! Workload W1, deterministic, with the content hash a store would fill in. Shared by the
//! benches and the profiling drivers.

use ctxlog::{canonical_json, ContextItem, Scope};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Item `n`'s timestamp is `BASE_TS + n`.
pub const BASE_TS: i64 = 1_700_000_000;

/// The types and their shares (percent).
pub const TYPES: [(&str, u32); 7] = [
    ("document_chunk", 40),
    ("message", 20),
    ("tool_result", 15),
    ("monitoring_metric", 10),
    ("user_profile", 5),
    ("user_feedback", 5),
    ("product_document", 5),
];
/// The words of the "text" field.
pub const WORDS: [&str; 16] = [
    "context", "model", "session", "clause", "contract", "invoice", "metric", "latency", "customer", "policy",
    "answer", "question", "summary", "vector", "record", "window",
];

/// A small deterministic generator (SplitMix64).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Item `n` of W1, with its content hash filled in (as a store returns it).
pub fn item(n: u64) -> ContextItem {
    let r = mix(n);
    let pick = u32::try_from(r % 100).unwrap_or(0);
    let mut acc = 0;
    let kind = TYPES
        .iter()
        .find(|(_, share)| {
            acc += share;
            pick < acc
        })
        .map_or("document_chunk", |(kind, _)| kind);
    let scope = match mix(r) % 10 {
        0..=6 => Scope::Session(format!("s{}", n % 1000)),
        7 | 8 => Scope::GlobalReadonly,
        _ => Scope::GlobalWritable,
    };
    let mut text = String::with_capacity(440);
    let mut w = r;
    while text.len() < 420 {
        w = mix(w);
        text.push_str(WORDS[usize::try_from(w % 16).unwrap_or(0)]);
        text.push(' ');
    }
    let timestamp = BASE_TS + i64::try_from(n).unwrap_or(0);
    let mut item = ContextItem::new(
        format!("item-{n:08}"),
        kind,
        json!({"title": format!("doc {n}"), "lang": "en", "n": n, "text": text}),
        format!("source-{}", r % 20),
        timestamp,
        "1",
        scope,
    );
    if n.is_multiple_of(2) {
        item = item.with_ttl(3600);
    }
    if kind == "tool_result" {
        item = item.with_confidence(f64::from(u32::try_from(r % 101).unwrap_or(0)) / 100.0);
    }
    let digest = Sha256::digest(canonical_json(&item.content));
    let mut hex = String::with_capacity(71);
    hex.push_str("sha256:");
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    item.with_hash(hex)
}

/// The KiB values of `fields` (such as `"VmHWM:"`) in this process's /proc status, in order; 0 for
/// each that /proc does not tell.
fn status_kib<const N: usize>(fields: [&str; N]) -> [u64; N] {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    fields.map(|name| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    })
}

/// The process's peak resident set size (VmHWM), in KiB; 0 where /proc does not tell.
pub fn peak_rss_kib() -> u64 {
    let [peak] = status_kib(["VmHWM:"]);
    peak
}

/// The process's resident set now, in KiB: anonymous memory (heap, stacks) and file-backed pages
/// (mapped files, the binary), from /proc (zeros where it does not tell).
pub fn rss_kinds_kib() -> (u64, u64) {
    let [anon, file] = status_kib(["RssAnon:", "RssFile:"]);
    (anon, file)
}

/// A store for durable single adds in `dir`: `Durability::Immediate`, a `ManualClock` at
/// [`BASE_TS`] (no W1 item expires), no background compaction.
pub fn open_durable(dir: &std::path::Path) -> ctxlog::Result<ctxlog::Store> {
    ctxlog::Options::new()
        .durability(ctxlog::Durability::Immediate)
        .clock(std::sync::Arc::new(ctxlog::ManualClock::new(BASE_TS)))
        .auto_compact(false)
        .open(dir)
}

/// Loads items `0..n` into `store` in durable batches of 1,000 (as P1 does).
pub fn load(store: &ctxlog::Store, n: u64) -> ctxlog::Result<()> {
    let mut next = 0;
    while next < n {
        let end = n.min(next + 1000);
        store.add((next..end).map(item))?;
        next = end;
    }
    Ok(())
}

/// The latency at quantile `q` of `sorted` (seconds), in milliseconds.
pub fn quantile_ms(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // An index into a non-empty slice: the rounding cannot go past its end.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(at).copied().unwrap_or(0.0) * 1e3
}
