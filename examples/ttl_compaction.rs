//! TTLs and compaction, on a clock the example moves by hand.
//!
//! An item with a TTL expires `ttl_seconds` after its timestamp: from then on `get` leaves it out and
//! `resolve` answers `Expired`. Its bytes stay on disk until `compact()` reclaims them; after that
//! the id answers `NotFound`. A snapshot judges TTL at the time it was taken, so a pinned snapshot
//! taken before the expiry keeps answering as it did, and compaction keeps what it sees.
//!
//! Run it with `cargo run --example ttl_compaction`; `cargo test` runs it as well.

use std::sync::Arc;

use ctxlog::{
    format_rfc3339, Clock, CompactionReport, ContextItem, ContextQuery, ManualClock, Options, Resolution, Scope,
};
use serde_json::json;

/// 2024-05-10T10:00:00Z.
const NOW: i64 = 1_715_335_200;
const HOUR: i64 = 3_600;
const PIN: &str = "before-expiry";

/// A tool result that expires an hour after `NOW`, with a few KiB of content.
fn search_result(id: &str) -> ContextItem {
    let hits: Vec<String> = (0..64).map(|n| format!("{id}: hit {n} of the search")).collect();
    let content = json!({"tool": "web_search", "hits": hits});
    ContextItem::new(
        id,
        "tool_result",
        content,
        "search_api",
        NOW,
        "1",
        Scope::GlobalWritable,
    )
    .with_ttl(3_600)
}

/// Resolutions in a few words, for printing.
fn describe(answers: &[Resolution]) -> String {
    let word = |answer: &Resolution| match answer {
        Resolution::Found(item) => format!("{} Found", item.id),
        Resolution::Expired { id, expired_at } => format!("{id} Expired at {}", format_rfc3339(*expired_at)),
        Resolution::NotFound { reference } => format!("{reference} NotFound"),
        other => format!("{other:?}"),
    };
    answers.iter().map(word).collect::<Vec<_>>().join(", ")
}

fn print_report(label: &str, r: &CompactionReport) {
    println!(
        "{label}: reclaimed {} expired, {} superseded, {} deleted; segment bytes {} -> {}",
        r.reclaimed_expired, r.reclaimed_superseded, r.reclaimed_deleted, r.bytes_before, r.bytes_after
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    // Every expiry decision asks the store's clock; a ManualClock moves only when told to.
    // Background compaction is off so that the example decides when to compact.
    let clock = Arc::new(ManualClock::new(NOW));
    let store = Options::new()
        .clock(clock.clone())
        .auto_compact(false)
        .open(dir.path())?;

    // tr1 before the pin, tr2 and tr3 after it; `doc` has no TTL.
    let doc = ContextItem::new(
        "doc",
        "product_document",
        json!("Seats are billed monthly."),
        "docs",
        NOW,
        "1",
        Scope::GlobalReadonly,
    );
    store.add([doc, search_result("tr1")])?;
    // Pin a snapshot (it judges TTL at NOW, the clock's time when it is taken), and note its answers.
    let snap = store.snapshot();
    snap.pin(PIN)?;
    let everything = ContextQuery::new();
    let pinned_answers = (snap.get(&everything)?, snap.resolve(["tr1", "doc"])?);
    drop(snap); // the pin keeps the snapshot; this handle is not needed
    store.add([search_result("tr2"), search_result("tr3")])?;
    let results = ContextQuery::new().types(["tool_result"]);
    assert_eq!(store.get(&results)?.len(), 3);

    // Two hours later every tool result has expired: get leaves them out, resolve says Expired.
    clock.advance(2 * HOUR);
    assert!(store.get(&results)?.is_empty());
    let answers = store.resolve(["tr1", "tr2", "doc"])?;
    println!("at {}: {}", format_rfc3339(clock.now()), describe(&answers));
    assert_eq!(
        answers[0],
        Resolution::Expired {
            id: "tr1".into(),
            expired_at: NOW + HOUR
        }
    );
    assert!(matches!(&answers[1], Resolution::Expired { .. }));
    assert!(matches!(&answers[2], Resolution::Found(_)));
    // Expired items still count until compaction reclaims them.
    assert_eq!(store.stats().items, 4);

    // Compaction reclaims tr2 and tr3; tr1 stays because the pinned snapshot still sees it.
    let report = store.compact()?;
    print_report("compact (pin held)", &report);
    assert_eq!(report.reclaimed_expired, 2);
    assert!(report.bytes_after < report.bytes_before);
    let answers = store.resolve(["tr1", "tr2", "tr3"])?;
    assert!(matches!(&answers[0], Resolution::Expired { .. }));
    assert!(matches!(
        &answers[1..],
        [Resolution::NotFound { .. }, Resolution::NotFound { .. }]
    ));
    println!("after compaction: {}", describe(&answers));

    // The pinned snapshot still answers as it did before the expiry: tr1 is there for it.
    let snap = store.open_snapshot(PIN)?;
    let seen: Vec<String> = snap.get(&results)?.into_iter().map(|i| i.id).collect();
    let taken_at = format_rfc3339(snap.taken_at());
    println!("pinned snapshot taken at {taken_at}: tool results {seen:?}");
    assert_eq!(seen, ["tr1"]);
    assert_eq!((snap.get(&everything)?, snap.resolve(["tr1", "doc"])?), pinned_answers);
    drop(snap);

    // Unpin: the next compaction reclaims tr1 too, which then answers NotFound.
    store.unpin_snapshot(PIN)?;
    let report = store.compact()?;
    print_report("compact (unpinned)", &report);
    assert_eq!(report.reclaimed_expired, 1);
    assert!(matches!(&store.resolve(["tr1"])?[..], [Resolution::NotFound { .. }]));
    assert_eq!(store.stats().items, 1);
    assert!(store.verify()?.is_ok());

    println!("ttl_compaction: all checks passed");
    Ok(())
}

// `cargo test` builds this example as a test (`test = true` in Cargo.toml) and runs `main` here.
#[cfg(test)]
#[test]
fn runs() {
    main().expect("the ttl_compaction example runs");
}
