//! I/O errors injected by `SimDisk` reach the caller as typed errors: a failed append or fsync
//! poisons the store (every later write is refused, the fsync is not retried), and once the faults
//! stop, reopening keeps everything acknowledged and `verify()` passes. The start of the I/O-error
//! suite; the full one fails every call of a reference workload in turn.

mod common;

use std::sync::Arc;

use ctxlog::storage::{Fault, SimDisk};
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
