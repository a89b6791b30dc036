//! I/O errors injected by `SimDisk` reach the caller as typed errors: a failed append or fsync
//! poisons the store (every later write is refused, the fsync is not retried), and once the faults
//! stop, reopening keeps everything acknowledged and `verify()` passes. The start of the I/O-error
//! suite; the full one fails every call of a reference workload in turn.

mod common;

use std::sync::Arc;

use ctxlog::storage::{CallKind, Fault, SimDisk};
use ctxlog::*;
use serde_json::json;

const DIR: &str = "/sim/store";

fn open(disk: &SimDisk) -> Result<Store> {
    Options::new()
        .storage(Arc::new(disk.clone()))
        .clock(Arc::new(ManualClock::new(common::NOW)))
        .auto_compact(false)
        .open(DIR)
}

#[test]
fn a_failed_write_or_sync_poisons_the_store_and_loses_nothing_acknowledged() {
    // The add of the second batch makes two calls: its append, then its fsync.
    for (offset, fault) in [
        (0, Fault::Io),
        (0, Fault::NoSpace),
        (0, Fault::ShortWrite),
        (1, Fault::Io),
        (1, Fault::NoSpace),
    ] {
        let disk = SimDisk::new();
        let store = open(&disk).expect("open");
        let first = common::item("doc-1", common::NOW, "1", json!({"n": 1}));
        store.add([first.clone()]).expect("add");
        let next = disk.calls();
        disk.fail(next + offset, next + offset, fault);
        let failed = store.add([common::item("doc-2", common::NOW, "1", json!({"n": 2}))]);
        assert!(
            matches!(failed, Err(Error::Io { .. } | Error::Poisoned { .. })),
            "{fault:?} at call {offset} of the add: {failed:?}"
        );
        let calls = disk.calls();
        let refused = store.add([common::item("doc-3", common::NOW, "1", json!({"n": 3}))]);
        assert!(matches!(refused, Err(Error::Poisoned { .. })), "{fault:?}: {refused:?}");
        assert_eq!(
            disk.calls(),
            calls,
            "a poisoned store makes no storage call for a write"
        );
        drop(store);

        let store = open(&disk).expect("reopen once the faults stop");
        let items = store.get(&ContextQuery::new()).expect("get");
        assert!(
            items.contains(&common::stored_form(&first)),
            "{fault:?}: the acknowledged batch is there"
        );
        assert!(
            items.iter().all(|item| item.id != "doc-3"),
            "{fault:?}: a refused batch is not"
        );
        assert!(store.verify().expect("verify").is_ok(), "{fault:?}");
    }
}

/// The index of the first call of `kind` made from call `from` on.
fn first_call(disk: &SimDisk, from: u64, kind: CallKind) -> u64 {
    disk.call_log()
        .iter()
        .find(|call| call.index >= from && call.kind == kind)
        .map(|call| call.index)
        .unwrap_or_else(|| panic!("no {kind:?} call from call {from} on"))
}

/// Found by the suite: when the fsync of a new segment's header failed, the open failed, and the next
/// open took the segment as it found it, neither synced nor with its directory entry synced; the
/// batches it then acknowledged went into a file that a power loss could remove.
#[test]
fn a_segment_whose_creation_failed_is_made_durable_by_the_next_open() {
    for kind in [CallKind::SyncAll, CallKind::SyncDir] {
        let disk = SimDisk::new();
        disk.record_calls(true);
        let probe = disk.copy();
        drop(open(&probe).expect("open"));
        // The same calls on a fresh disk: fail the first sync of the new segment (or of the directory).
        disk.fail(first_call(&probe, 0, kind), first_call(&probe, 0, kind), Fault::Io);
        assert!(matches!(open(&disk), Err(Error::Io { .. })), "{kind:?}");
        let store = open(&disk).expect("the second open");
        let item = common::item("doc-1", common::NOW, "1", json!({"n": 1}));
        store.add([item.clone()]).expect("add");
        let after = disk.copy().crash_losing_unsynced();
        let recovered = open(&after).expect("open after the power loss");
        assert_eq!(
            common::everything(&recovered),
            vec![common::stored_form(&item)],
            "{kind:?}: an acknowledged batch was lost"
        );
    }
}

/// Found by the suite: a batch whose fsync failed is not acknowledged, but stays in the file; the
/// next open replayed it and showed it without making it durable, so a power loss could then take
/// back what readers had seen. Opening now syncs what it replays.
#[test]
fn what_an_open_shows_survives_a_power_loss() {
    let disk = SimDisk::new();
    let store = open(&disk).expect("open");
    let first = common::item("doc-1", common::NOW, "1", json!({"n": 1}));
    store.add([first.clone()]).expect("add");
    // The next add makes two calls, its append and its fsync: make the fsync fail.
    let next = disk.calls();
    disk.fail(next + 1, next + 1, Fault::Io);
    let second = common::item("doc-2", common::NOW, "1", json!({"n": 2}));
    assert!(matches!(store.add([second.clone()]), Err(Error::Poisoned { .. })));
    drop(store);
    let store = open(&disk).expect("reopen");
    let shown = common::everything(&store);
    assert_eq!(shown, vec![common::stored_form(&first), common::stored_form(&second)]);
    let after = disk.copy().crash_losing_unsynced();
    let recovered = open(&after).expect("open after the power loss");
    assert_eq!(common::everything(&recovered), shown, "what the open showed was lost");
}

/// Found by the suite: every command refused by a poisoned writer wrapped the poisoning reason in one
/// more "the store refuses writes after an earlier I/O failure (...)", so the reason grew with each
/// refused write. It now names the failure that poisoned the store, once.
#[test]
fn a_poisoned_store_keeps_the_reason_of_the_first_failure() {
    let disk = SimDisk::new();
    let store = open(&disk).expect("open");
    let next = disk.calls();
    disk.fail(next, next, Fault::NoSpace);
    let failed = store.add([common::item("doc-1", common::NOW, "1", json!({"n": 1}))]);
    let Err(Error::Poisoned { reason: first }) = failed else {
        panic!("the failed add answered {failed:?}")
    };
    assert!(first.contains("os error 28"), "{first}");
    for attempt in 0..5 {
        let refused = store.add([common::item("doc-2", common::NOW, "1", json!({"n": 2}))]);
        assert!(
            matches!(&refused, Err(Error::Poisoned { reason }) if *reason == first),
            "refused write {attempt}: {refused:?}"
        );
        let flushed = store.flush();
        assert!(
            matches!(&flushed, Err(Error::Poisoned { reason }) if *reason == first),
            "refused flush {attempt}: {flushed:?}"
        );
    }
}
