//! An audit trail: prove later exactly which context a model was given.
//!
//! Before a model call, pin a snapshot and read the context through it; keep the snapshot's digest
//! and a receipt of the resolve with the model's answer. Whatever happens to the store afterwards
//! (new versions, deletes, compactions, restarts), the pinned snapshot answers the same and
//! `Store::replay(receipt)` gives back the identical answers, until the pin is removed.
//!
//! Run it with `cargo run --example audit_trail`; `cargo test` runs it as well.

use ctxlog::{ContextItem, ContextQuery, Error, Receipt, Resolution, Scope, Store};
use serde_json::json;

/// The pin's name: one per model call, say.
const PIN: &str = "call-2024-05-10-0001";
/// 2024-05-10T10:00:00Z.
const NOW: i64 = 1_715_335_200;

fn clause(id: &str, version: &str, text: &str) -> ContextItem {
    let content = json!({"contract": "msa_acme_2024", "text": text});
    ContextItem::new(
        id,
        "document_chunk",
        content,
        "contracts",
        NOW,
        version,
        Scope::GlobalReadonly,
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path())?;
    store.add([
        clause("cl1", "1", "Termination on 90 days' notice."),
        clause("cl2", "1", "Liability capped at 12 months of fees."),
        clause("cl3", "1", "Arbitration in Geneva."),
    ])?;

    // The model call: pin a snapshot, and read its context through it.
    let snap = store.snapshot();
    let info = snap.pin(PIN)?;
    let chunks = ContextQuery::new().types(["document_chunk"]);
    let given = snap.get(&chunks)?;
    let refs = ["cl1", "cl2", "cl3@1"];
    let (answers, receipt) = snap.resolve_with_receipt(refs)?;
    // The digest: one SHA-256 over everything the snapshot shows.
    let digest = snap.digest()?;
    // The receipt is plain data (serde): store it as JSON with the model's answer.
    let receipt_json = serde_json::to_string(&receipt)?;
    println!("pinned {} at seq {}; digest {digest}", info.name, info.seq);
    println!("receipt: {receipt_json}");
    assert!(answers.iter().all(|a| matches!(a, Resolution::Found(_))));
    drop(snap); // the pin, not this handle, is what keeps the snapshot

    // The store moves on: a new version, a delete, a new item.
    store.add([
        clause("cl1", "2", "Termination on 30 days' notice."),
        clause("cl4", "1", "Governing law: Swiss."),
    ])?;
    assert!(store.delete("cl2")?);
    let live = store.resolve(refs)?;
    assert!(matches!(&live[0], Resolution::Found(item) if item.version == "2"));
    assert!(matches!(&live[1], Resolution::NotFound { .. }));
    // The pin keeps what only it still sees: cl1@1 and cl2.
    let kept = store
        .snapshots()
        .into_iter()
        .find(|s| s.name == PIN)
        .map_or(0, |s| s.bytes_kept);
    println!("after the changes the pin keeps {kept} bytes the live state no longer needs");
    assert!(kept > 0);

    // Compaction reclaims nothing the pin still sees.
    let report = store.compact()?;
    println!(
        "compact with the pin held: reclaimed {} superseded, {} deleted",
        report.reclaimed_superseded, report.reclaimed_deleted
    );
    assert_eq!(report.reclaimed_superseded + report.reclaimed_deleted, 0);

    // Restart: drop the store and open the directory again.
    drop(store);
    let store = Store::open(dir.path())?;

    // The pinned snapshot answers exactly as it did, with the same digest.
    let reopened = store.open_snapshot(PIN)?;
    assert_eq!(reopened.get(&chunks)?, given);
    assert_eq!(reopened.resolve(refs)?, answers);
    assert_eq!(reopened.digest()?, digest);
    drop(reopened);
    // And the receipt, read back from its JSON, replays to the identical answers.
    let receipt: Receipt = serde_json::from_str(&receipt_json)?;
    assert_eq!(store.replay(&receipt)?, answers);
    println!("after compaction and restart: same answers, same digest, receipt replays");

    // Once the audit period is over: unpin, and the next compaction reclaims what only the pin kept.
    assert!(store.unpin_snapshot(PIN)?);
    let report = store.compact()?;
    println!(
        "compact after unpin: reclaimed {} superseded, {} deleted; segment bytes {} -> {}",
        report.reclaimed_superseded, report.reclaimed_deleted, report.bytes_before, report.bytes_after
    );
    assert_eq!((report.reclaimed_superseded, report.reclaimed_deleted), (1, 1));
    assert!(report.bytes_after < report.bytes_before);
    // The receipt can no longer be replayed, nor the snapshot opened.
    assert!(matches!(store.replay(&receipt), Err(Error::SnapshotNotFound { .. })));
    assert!(matches!(store.open_snapshot(PIN), Err(Error::SnapshotNotFound { .. })));
    // The live state is untouched throughout.
    assert_eq!(store.resolve(refs)?, live);
    assert!(store.verify()?.is_ok());

    println!("audit_trail: all checks passed");
    Ok(())
}

// `cargo test` builds this example as a test (`test = true` in Cargo.toml) and runs `main` here.
#[cfg(test)]
#[test]
fn runs() {
    main().expect("the audit_trail example runs");
}
