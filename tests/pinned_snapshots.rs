//! Pinned snapshots are reproducible: a snapshot pinned by name (also one taken through a session
//! view, which keeps that session's visibility) answers `get` (everything, and a typed/time query),
//! `resolve` (found, expired-later, superseded-later, deleted-later, nonexistent refs) and `digest()`
//! byte-identically after new versions, deletes, the clock passing expiries, compactions, a reopen
//! and more writes; `snapshots()` lists it with the bytes it keeps; unpinning lets compaction give
//! the space back and `open_snapshot` then says SnapshotNotFound; names are validated and unique;
//! receipts replay identically while the pin lives, fail with SnapshotNotFound after, and a tampered
//! receipt is ReceiptMismatch; digests tell different snapshots apart.

mod common;

use std::sync::Arc;

use common::*;
use ctxlog::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn open_manual(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Store {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(32 << 10)
        .auto_compact(false)
        .open(dir)
        .expect("open store")
}

/// Content of about `kib` KiB: pseudo-random hex from the tag, which the log's LZ4 cannot shrink.
fn bulky(tag: &str, kib: usize) -> Value {
    json!({"tag": tag, "body": common::incompressible(tag, 1024 * kib)})
}

fn with(id: &str, kind: &str, ts: i64, version: &str, scope: Scope, content: Value) -> ContextItem {
    ContextItem::new(id, kind, content, "pin_tests", ts, version, scope)
}

/// The items present when the snapshots are pinned.
fn initial_items() -> Vec<ContextItem> {
    vec![
        with(
            "keep",
            "document_chunk",
            NOW - 500,
            "1",
            Scope::GlobalReadonly,
            bulky("keep", 2),
        ),
        // Expires at NOW + 100: after the pin.
        with(
            "exp",
            "tool_result",
            NOW - 100,
            "1",
            Scope::GlobalReadonly,
            bulky("exp", 8),
        )
        .with_ttl(200),
        // Expired at NOW - 990: before the pin.
        with(
            "old",
            "tool_result",
            NOW - 1_000,
            "1",
            Scope::GlobalReadonly,
            bulky("old", 8),
        )
        .with_ttl(10),
        with(
            "sup",
            "document_chunk",
            NOW - 300,
            "1",
            Scope::GlobalReadonly,
            bulky("sup", 8),
        )
        .with_confidence(0.5),
        with("del", "message", NOW - 200, "1", Scope::GlobalWritable, bulky("del", 8)),
        with(
            "gw",
            "tool_result",
            NOW - 50,
            "1",
            Scope::GlobalWritable,
            json!({"gw": true}),
        ),
        with(
            "s1note",
            "message",
            NOW - 40,
            "1",
            Scope::Session("s1".into()),
            json!("s1 only"),
        ),
        with(
            "s2note",
            "message",
            NOW - 30,
            "1",
            Scope::Session("s2".into()),
            json!("s2 only"),
        ),
        with(
            "cl_1",
            "legal_clause",
            NOW - 20,
            "1",
            Scope::GlobalReadonly,
            json!({"clause": 1}),
        ),
    ]
}

/// Refs of every kind: found, expired-later, expired-already, superseded-later, deleted-later,
/// unknown version, nonexistent, other session.
const REFS: [&str; 16] = [
    "keep", "keep@1", "exp", "exp@1", "old", "sup", "sup@1", "sup@2", "del", "del@1", "nope", "gw", "s1note", "s2note",
    "cl_1", "nope@1",
];

fn typed_query() -> ContextQuery {
    ContextQuery::new()
        .types(["tool_result", "message"])
        .time_range(TimeRange::new(NOW - 400, NOW).expect("range"))
        .newest_first()
}

/// Every answer of a snapshot, serialized.
#[derive(Debug, PartialEq)]
struct Answers {
    all: String,
    typed: String,
    resolved: String,
    digest: String,
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("serialize")
}

fn answers(snap: &Snapshot) -> Answers {
    Answers {
        all: to_json(&snap.get(&ContextQuery::new()).expect("get")),
        typed: to_json(&snap.get(&typed_query()).expect("typed get")),
        resolved: to_json(&snap.resolve(REFS).expect("resolve")),
        digest: snap.digest().expect("digest"),
    }
}

/// The digest as documented: SHA-256 over the canonical JSON of every item shown, ordered by (id,
/// version), each followed by a newline.
fn expected_digest(items: &[ContextItem]) -> String {
    let mut sorted = items.to_vec();
    sorted.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
    let mut hasher = Sha256::new();
    for item in &sorted {
        hasher.update(canonical_json(&serde_json::to_value(item).expect("to value")));
        hasher.update(b"\n");
    }
    let hex: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn pin_named<'a>(list: &'a [SnapshotInfo], name: &str) -> &'a SnapshotInfo {
    list.iter()
        .find(|info| info.name == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {list:?}"))
}

fn reclaimed(report: &CompactionReport) -> (u64, u64, u64) {
    (
        report.reclaimed_expired,
        report.reclaimed_superseded,
        report.reclaimed_deleted,
    )
}

#[test]
fn pinned_snapshots_answer_identically_through_churn_compaction_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let store = open_manual(dir.path(), &clock);
    store
        .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9]+$"))
        .expect("register");
    store.add(initial_items()).expect("add");

    // A snapshot of now, unpinned, for comparing digests with the pin of the same state.
    let same_state = store.snapshot();
    let info = store.pin_snapshot("audit").expect("pin audit");
    assert_eq!(info.name, "audit");
    assert_eq!(info.taken_at, NOW);
    assert_eq!(info.session, None);
    assert_eq!(info.seq, same_state.seq(), "a fresh pin is of the current seq");
    let s1_info = store
        .session("s1")
        .snapshot()
        .pin("s1-audit")
        .expect("pin through a session");
    assert_eq!(s1_info.session.as_deref(), Some("s1"));
    assert!(s1_info.seq > info.seq, "the first pin's record is a batch of its own");

    let audit = store.open_snapshot("audit").expect("open audit");
    let s1 = store.open_snapshot("s1-audit").expect("open s1-audit");
    assert_eq!(s1.session(), Some("s1"));
    let want_audit = answers(&audit);
    let want_s1 = answers(&s1);
    assert!(
        want_audit.typed.contains("\"id\":\"exp\"") && want_audit.typed.contains("\"id\":\"s2note\""),
        "the typed/time query should match several items: {}",
        want_audit.typed
    );
    assert!(!want_s1.typed.contains("s2note"), "{}", want_s1.typed);
    println!("audit digest {}; s1-audit digest {}", want_audit.digest, want_s1.digest);

    // What the pinned answers are, independently of the engine.
    let stored: Vec<ContextItem> = initial_items().iter().map(stored_form).collect();
    let visible_at_pin = |session: Option<&str>| -> Vec<ContextItem> {
        stored
            .iter()
            .filter(|i| i.id != "old")
            .filter(|i| !matches!((&i.scope, session), (Scope::Session(owner), Some(s)) if owner != s))
            .cloned()
            .collect()
    };
    let mut audit_items = audit.get(&ContextQuery::new()).expect("get");
    audit_items.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want_items = visible_at_pin(None);
    want_items.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(
        audit_items, want_items,
        "the audit pin sees every live item of every scope"
    );
    let s1_items = s1.get(&ContextQuery::new()).expect("get s1");
    assert!(s1_items.iter().any(|i| i.id == "s1note"), "{s1_items:?}");
    assert!(
        !s1_items.iter().any(|i| i.id == "s2note"),
        "the session pin must not show another session's item"
    );
    assert_eq!(s1_items.len(), visible_at_pin(Some("s1")).len());
    assert_eq!(want_audit.digest, expected_digest(&want_items));
    assert_eq!(want_s1.digest, expected_digest(&s1_items));
    assert_eq!(
        same_state.digest().expect("digest"),
        want_audit.digest,
        "snapshots of the same state have the same digest"
    );
    assert_ne!(want_audit.digest, want_s1.digest, "different views, different digests");
    drop(same_state);

    let pinned_resolves = audit.resolve(REFS).expect("resolve");
    assert_eq!(pinned_resolves[0], Resolution::Found(stored[0].clone()));
    assert_eq!(
        pinned_resolves[2],
        Resolution::Found(stored[1].clone()),
        "exp is live at the pin"
    );
    assert_eq!(
        pinned_resolves[4],
        Resolution::Expired {
            id: "old".into(),
            expired_at: NOW - 990
        }
    );
    assert_eq!(
        pinned_resolves[6],
        Resolution::Found(stored[3].clone()),
        "sup@1 is the latest at the pin"
    );
    assert!(
        matches!(&pinned_resolves[7], Resolution::NotFound { .. }),
        "sup@2 does not exist yet"
    );
    assert_eq!(pinned_resolves[8], Resolution::Found(stored[4].clone()));
    assert!(matches!(&pinned_resolves[10], Resolution::NotFound { .. }));
    let s1_resolves = s1.resolve(["s1note", "s2note"]).expect("resolve s1");
    assert!(matches!(&s1_resolves[0], Resolution::Found(i) if i.id == "s1note"));
    assert_eq!(
        s1_resolves[1],
        Resolution::NotFound {
            reference: "s2note".into()
        }
    );

    // Receipts, taken now and kept as JSON.
    let (receipt_answers, receipt) = audit.resolve_with_receipt(REFS).expect("receipt");
    assert_eq!(receipt_answers, pinned_resolves);
    assert_eq!(receipt.seq, info.seq);
    assert_eq!(receipt.answers.len(), REFS.len());
    let receipt_json = serde_json::to_string(&receipt).expect("receipt json");
    let (s1_receipt_answers, s1_receipt) = s1.resolve_with_receipt(["s1note", "s2note", "gw"]).expect("s1 receipt");
    drop(audit);
    drop(s1);

    // Churn: new versions, deletes, the clock past expiries, something superseded that no pin sees.
    store
        .add([
            with(
                "sup",
                "document_chunk",
                NOW - 10,
                "2",
                Scope::GlobalReadonly,
                bulky("sup2", 8),
            ),
            with("later", "message", NOW, "1", Scope::GlobalReadonly, bulky("later", 4)),
            with(
                "s1new",
                "message",
                NOW,
                "1",
                Scope::Session("s1".into()),
                json!("new in s1"),
            ),
        ])
        .expect("churn add");
    store
        .add([with(
            "later",
            "message",
            NOW,
            "2",
            Scope::GlobalReadonly,
            json!("later v2"),
        )])
        .expect("later v2");
    assert!(store.delete("del").expect("delete"));
    clock.set(NOW + 150);
    assert!(matches!(
        &store.resolve(["exp"]).expect("resolve")[0],
        Resolution::Expired { .. }
    ));
    let kept = store.snapshots();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(
        pin_named(&kept, "audit").bytes_kept > 24 * 1024,
        "audit keeps sup@1, del, exp and old: {kept:?}"
    );
    assert!(pin_named(&kept, "s1-audit").bytes_kept > 0, "{kept:?}");

    let report = store.compact().expect("compact with pins");
    assert_eq!(
        reclaimed(&report),
        (0, 1, 0),
        "only later@1 is seen by no view: {report:?}"
    );
    let check = |store: &Store, when: &str| {
        let audit = store.open_snapshot("audit").expect("open audit");
        assert!(
            answers(&audit) == want_audit,
            "{when}: the audit pin answers differently"
        );
        assert_eq!(answers(&audit).digest, want_audit.digest, "{when}");
        let s1 = store.open_snapshot("s1-audit").expect("open s1-audit");
        assert!(answers(&s1) == want_s1, "{when}: the s1-audit pin answers differently");
        let receipt: Receipt = serde_json::from_str(&receipt_json).expect("receipt from json");
        let replayed = store.replay(&receipt).expect("replay");
        assert_eq!(
            serde_json::to_string(&replayed).expect("json"),
            serde_json::to_string(&receipt_answers).expect("json"),
            "{when}: replay answers differently"
        );
        assert_eq!(
            store.replay(&s1_receipt).expect("replay s1"),
            s1_receipt_answers,
            "{when}"
        );
        let list = store.snapshots();
        let listed = pin_named(&list, "audit");
        assert_eq!(
            (listed.seq, listed.taken_at, listed.session.clone()),
            (info.seq, NOW, None),
            "{when}"
        );
        let listed = pin_named(&list, "s1-audit");
        assert_eq!(
            (listed.seq, listed.taken_at, listed.session.as_deref()),
            (s1_info.seq, NOW, Some("s1")),
            "{when}"
        );
        assert!(pin_named(&list, "audit").bytes_kept > 0, "{when}: {list:?}");
        let verify = store.verify().expect("verify");
        assert!(verify.is_ok(), "{when}: {:?}", verify.problems);
    };
    check(&store, "after churn and compaction");

    drop(store);
    let store = open_manual(dir.path(), &clock);
    check(&store, "after reopen");

    // More writes and another compaction.
    store
        .add([
            with(
                "sup",
                "document_chunk",
                NOW + 100,
                "3",
                Scope::GlobalReadonly,
                json!("sup v3"),
            ),
            with(
                "exp",
                "tool_result",
                NOW + 100,
                "2",
                Scope::GlobalReadonly,
                json!("exp v2"),
            ),
            with(
                "gone",
                "message",
                NOW + 100,
                "1",
                Scope::GlobalReadonly,
                bulky("gone", 2),
            ),
        ])
        .expect("more writes");
    assert!(store.delete("gw").expect("delete gw"));
    assert!(store.delete("gone").expect("delete gone"));
    clock.set(NOW + 10_000);
    let report = store.compact().expect("second compaction");
    assert_eq!(
        reclaimed(&report),
        (0, 1, 1),
        "only sup@2 (added and superseded since the pins) and `gone` are seen by no view: {report:?}"
    );
    check(&store, "after more writes and a second compaction");

    // A pin of now differs from the old one.
    let later = store.pin_snapshot("later").expect("pin later");
    let later_digest = store
        .open_snapshot("later")
        .expect("open later")
        .digest()
        .expect("digest");
    assert_ne!(later_digest, want_audit.digest, "different states, different digests");
    assert_eq!(later.taken_at, NOW + 10_000);

    // A tampered receipt is refused.
    let mut tampered: Receipt = serde_json::from_str(&receipt_json).expect("receipt");
    let position = tampered
        .answers
        .iter()
        .position(|a| a.reference == "keep")
        .expect("keep answer");
    let hash = tampered.answers[position]
        .hash
        .clone()
        .expect("found answers carry a hash");
    let flipped = if hash.ends_with('0') { "1" } else { "0" };
    tampered.answers[position].hash = Some(format!("{}{flipped}", &hash[..hash.len() - 1]));
    match store.replay(&tampered) {
        Err(Error::ReceiptMismatch { position: at, .. }) => assert_eq!(at, position),
        other => panic!("a tampered receipt gave {other:?}"),
    }
    let mut tampered: Receipt = serde_json::from_str(&receipt_json).expect("receipt");
    let position = tampered
        .answers
        .iter()
        .position(|a| a.reference == "nope")
        .expect("nope");
    tampered.answers[position].status = "found".into();
    assert!(
        matches!(store.replay(&tampered), Err(Error::ReceiptMismatch { .. })),
        "a receipt claiming a found answer for a nonexistent id must be refused"
    );

    // Unpinning lets compaction give the space back.
    let before = store.stats().bytes_on_disk;
    assert!(store.unpin_snapshot("audit").expect("unpin"));
    assert!(store.unpin_snapshot("s1-audit").expect("unpin"));
    assert!(
        !store.unpin_snapshot("audit").expect("unpin again"),
        "no such pin any more"
    );
    assert!(store.unpin_snapshot("later").expect("unpin later"));
    let report = store.compact().expect("compact after unpin");
    let after = store.stats().bytes_on_disk;
    println!(
        "unpin: bytes_on_disk {before} -> {after} (ratio {:.3}); {report:?}",
        after as f64 / before as f64
    );
    // old (expired); exp@1 and sup@1 (superseded; sup@2 went before); del and gw (deleted).
    assert_eq!(reclaimed(&report), (1, 2, 2), "{report:?}");
    assert!(after < before, "bytes_on_disk did not fall: {before} -> {after}");
    assert!(
        before - after > 24 * 1024,
        "the pins kept at least 24 KiB of content: {before} -> {after}"
    );
    assert!(store.snapshots().is_empty(), "{:?}", store.snapshots());
    assert!(matches!(
        store.open_snapshot("audit"),
        Err(Error::SnapshotNotFound { .. })
    ));
    let receipt: Receipt = serde_json::from_str(&receipt_json).expect("receipt");
    assert!(
        matches!(store.replay(&receipt), Err(Error::SnapshotNotFound { .. })),
        "a receipt of an unpinned snapshot"
    );
    assert!(matches!(store.replay(&s1_receipt), Err(Error::SnapshotNotFound { .. })));
    // The current state is untouched by all of it.
    let now = store
        .resolve(["keep", "sup", "sup@1", "exp", "old", "del", "gw"])
        .expect("resolve");
    assert_eq!(now[0], Resolution::Found(stored[0].clone()));
    assert!(matches!(&now[1], Resolution::Found(i) if i.version == "3"));
    assert!(matches!(&now[2], Resolution::Superseded { latest, .. } if latest.version == "3"));
    assert!(matches!(&now[3], Resolution::Found(i) if i.version == "2"));
    for answer in &now[4..] {
        assert!(matches!(answer, Resolution::NotFound { .. }), "{answer:?}");
    }
    drop(store);
    let store = open_manual(dir.path(), &clock);
    assert!(matches!(
        store.open_snapshot("s1-audit"),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(store.snapshots().is_empty());
    let verify = store.verify().expect("verify");
    assert!(verify.is_ok(), "{:?}", verify.problems);
}

#[test]
fn pin_names_are_validated_and_unique() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let store = open_manual(dir.path(), &clock);
    store.add([item("a", NOW, "1", json!(1))]).expect("add");
    store.pin_snapshot("p1").expect("pin");
    assert!(
        matches!(store.pin_snapshot("p1"), Err(Error::Invalid { .. })),
        "pinning an existing name through the store"
    );
    let snap = store.snapshot();
    assert!(
        matches!(snap.pin("p1"), Err(Error::Invalid { .. })),
        "pinning an existing name through a snapshot"
    );
    for bad in ["has space", "", "slash/name", "a@b", &"x".repeat(129)] {
        assert!(
            matches!(store.pin_snapshot(bad), Err(Error::Invalid { .. })),
            "{bad:?} must be refused"
        );
        assert!(matches!(snap.pin(bad), Err(Error::Invalid { .. })), "{bad:?}");
    }
    assert!(matches!(store.unpin_snapshot("has space"), Err(Error::Invalid { .. })));
    assert_eq!(store.snapshots().len(), 1, "{:?}", store.snapshots());
    assert!(matches!(store.open_snapshot("p2"), Err(Error::SnapshotNotFound { .. })));
    // After an unpin the name is free again; after a reopen it is still taken.
    snap.pin("p2").expect("pin p2");
    drop(store);
    drop(snap);
    let store = open_manual(dir.path(), &clock);
    assert!(
        matches!(store.pin_snapshot("p2"), Err(Error::Invalid { .. })),
        "after reopen"
    );
    assert!(store.unpin_snapshot("p1").expect("unpin"));
    store.pin_snapshot("p1").expect("the name is free again");
    assert_eq!(
        store.snapshots().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        vec!["p1", "p2"]
    );
}

#[test]
fn bytes_kept_counts_only_what_the_pin_alone_keeps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let store = open_manual(dir.path(), &clock);
    store.add([item("a", NOW, "1", bulky("a", 4))]).expect("add");
    store.pin_snapshot("p").expect("pin");
    assert_eq!(
        pin_named(&store.snapshots(), "p").bytes_kept,
        0,
        "nothing superseded yet"
    );
    store.add([item("a", NOW, "2", json!("small"))]).expect("add v2");
    let kept = pin_named(&store.snapshots(), "p").bytes_kept;
    assert!(kept > 4 * 1024, "the pin alone keeps a@1: {kept}");
    let report = store.compact().expect("compact");
    assert_eq!(reclaimed(&report), (0, 0, 0), "{report:?}");
    assert_eq!(pin_named(&store.snapshots(), "p").bytes_kept, kept);
    assert!(matches!(
        &store.open_snapshot("p").expect("open").resolve(["a"]).expect("resolve")[0],
        Resolution::Found(i) if i.version == "1"
    ));
    assert!(store.unpin_snapshot("p").expect("unpin"));
    let report = store.compact().expect("compact");
    assert_eq!(reclaimed(&report), (0, 1, 0), "{report:?}");
}

#[test]
fn receipts_of_unpinned_snapshots_cannot_be_replayed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let store = open_manual(dir.path(), &clock);
    store.add([item("a", NOW, "1", json!(1))]).expect("add");
    let (answers, receipt) = store.snapshot().resolve_with_receipt(["a", "b"]).expect("receipt");
    assert!(matches!(&answers[0], Resolution::Found(_)));
    assert!(
        matches!(store.replay(&receipt), Err(Error::SnapshotNotFound { .. })),
        "a receipt of a snapshot that was never pinned"
    );
    // Pinning a snapshot of the same state later does not make it match: taken_at differs.
    clock.advance(5);
    store.pin_snapshot("p").expect("pin");
    assert!(matches!(store.replay(&receipt), Err(Error::SnapshotNotFound { .. })));
}
