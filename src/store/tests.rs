//! Tests of the store handle: the add path's batch limit and leftovers, the free thread, and the
//! registry of live snapshot handles.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::engine::shared::LEFTOVER_ITEMS_MAX;
use crate::item::Scope;
use crate::limits::{BATCH_ITEMS_MAX, PARALLEL_ADD_ITEMS_MIN};

fn batch(first: usize, n: usize) -> Vec<ContextItem> {
    (first..first + n)
        .map(|k| {
            ContextItem::new(
                format!("item-{k:06}"),
                "message",
                serde_json::json!({"k": k, "text": "words ".repeat(30)}),
                "src",
                1_700_000_000 + i64::try_from(k).unwrap(),
                "1",
                Scope::GlobalReadonly,
            )
        })
        .collect()
}

/// How many of `ops` still hold their content tree.
fn contents_in(ops: &[Op]) -> usize {
    ops.iter()
        .filter(|op| matches!(op, Op::Put(valid) if !valid.item.content.is_null()))
        .count()
}

/// The kept leftovers: how many content trees, and each put's type, source and record length
/// (and whether its id and version were taken out for the answer).
fn leftovers(store: &Store) -> (usize, Vec<(String, String, usize, bool)>) {
    let left = store.inner.shared.leftovers();
    left.as_ref().map_or((0, Vec::new()), |garbage| {
        let puts = garbage
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Put(valid) => Some((
                    valid.item.kind.clone(),
                    valid.item.source.clone(),
                    valid.record.len(),
                    valid.item.id.is_empty() && valid.item.version.is_empty(),
                )),
                _ => None,
            })
            .collect();
        (contents_in(&garbage.ops), puts)
    })
}

/// Puts a stand-in free thread in place: it takes nothing until `go` is sent, then reports,
/// for each batch it frees, its content trees and its operations.
fn stand_in_freer(
    store: &Store,
) -> (
    crossbeam_channel::Sender<()>,
    crossbeam_channel::Receiver<(usize, usize)>,
) {
    let (sender, receiver) = crossbeam_channel::bounded::<Garbage>(1);
    let (go, wait) = crossbeam_channel::bounded::<()>(1);
    let (report, reports) = crossbeam_channel::unbounded();
    let handle = std::thread::spawn(move || {
        let _ = wait.recv();
        for garbage in receiver {
            let _ = report.send((contents_in(&garbage.ops), garbage.ops.len()));
        }
    });
    assert!(store.inner.freer.set(Some((sender, handle))).is_ok());
    (go, reports)
}

#[test]
fn a_batch_over_the_item_limit_is_refused_after_one_item_too_many_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Options::new().durability(Durability::Never).open(dir.path()).unwrap();
    // An endless iterator: the add takes one item over the limit, no more, and refuses.
    let mut made = 0usize;
    let items = std::iter::from_fn(|| {
        made += 1;
        Some(ContextItem::new(
            format!("i{made}"),
            "message",
            serde_json::json!({}),
            "src",
            1_700_000_000,
            "1",
            Scope::GlobalReadonly,
        ))
    });
    match store.add(items) {
        Err(Error::TooLarge {
            what,
            len,
            max,
            index: None,
        }) => {
            assert_eq!(what, "batch (items)");
            assert_eq!((len, max), (BATCH_ITEMS_MAX as u64 + 1, BATCH_ITEMS_MAX as u64));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(made, BATCH_ITEMS_MAX + 1);
    assert_eq!(store.stats().items, 0);
    // The refusal left the store usable: the next batch goes through whole.
    assert_eq!(store.add(batch(0, 3)).unwrap().len(), 3);
    assert_eq!(store.stats().items, 3);
}

#[test]
fn the_free_thread_starts_with_the_first_large_add_and_stops_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Options::new().durability(Durability::Never).open(dir.path()).unwrap();
    store.add(batch(0, PARALLEL_ADD_ITEMS_MIN - 1)).unwrap();
    assert!(store.inner.freer.get().is_none(), "a small add frees its own");
    for k in 0..3 {
        store.add(batch(1000 * (k + 1), 300)).unwrap();
    }
    let Some(Some((_, handle))) = store.inner.freer.get() else {
        panic!("the free thread did not start");
    };
    assert_eq!(handle.thread().name(), Some("ctxlog-drop"));
    let weak = Arc::downgrade(&store.inner);
    drop(store);
    assert!(weak.upgrade().is_none());
}

#[test]
fn a_large_add_leaves_its_leftovers_to_the_free_thread_or_when_it_is_busy_to_the_next_add() {
    let dir = tempfile::tempdir().unwrap();
    let store = Options::new().durability(Durability::Never).open(dir.path()).unwrap();
    let (go, freed) = stand_in_freer(&store);
    let answers = store.add(batch(0, 300)).unwrap();
    // The answers still carry every id and version, in order.
    assert_eq!(answers.len(), 300);
    assert!(matches!(&answers[7], AddOutcome::Added { id, version, .. } if id == "item-000007" && version == "1"));
    // The first batch went to the free thread's queue; the free thread holds it.
    assert_eq!(leftovers(&store), (0, Vec::new()));
    // The queue is full: the next large batch's leftovers are kept, contents, records and
    // strings, ids and versions taken out.
    store.add(batch(300, PARALLEL_ADD_ITEMS_MIN)).unwrap();
    let (contents, puts) = leftovers(&store);
    assert_eq!((contents, puts.len()), (PARALLEL_ADD_ITEMS_MIN, PARALLEL_ADD_ITEMS_MIN));
    assert!(puts
        .iter()
        .all(|(kind, source, record, taken)| kind == "message" && source == "src" && *record > 0 && *taken));
    // Any next add frees them during its wait; a small one leaves nothing of its own.
    store.add(batch(600, 1)).unwrap();
    assert_eq!(leftovers(&store), (0, Vec::new()));
    // A batch over the cap frees its own: nothing kept, nothing queued.
    store.add(batch(1000, LEFTOVER_ITEMS_MAX + 1)).unwrap();
    assert_eq!(leftovers(&store), (0, Vec::new()));
    // Let go, the free thread gets the first batch only, whole.
    go.send(()).unwrap();
    assert_eq!(freed.recv_timeout(Duration::from_secs(10)), Ok((300, 300)));
    assert!(freed.recv_timeout(Duration::from_millis(200)).is_err());
    // What was added reads back whole.
    let found = store
        .snapshot()
        .resolve(["item-000007", "item-000300", "item-005096"])
        .unwrap();
    assert!(found.iter().all(|r| matches!(r, Resolution::Found(_))), "{found:?}");
}

/// A snapshot handle dropped while the registry of live handles is locked (a compaction holds it
/// across its rename and directory fsync) does not wait for it: its release is queued, and the
/// registry's next holder applies it before reading.
#[test]
fn a_handle_dropped_while_the_registry_is_locked_does_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.add(batch(0, 3)).unwrap();
    let (snap, other) = (store.snapshot(), store.snapshot());
    let seq = snap.seq();
    let shared = store.shared();
    let live = shared.live_snapshots();
    assert_eq!(live.get(&seq), Some(&2));
    let (done, dropped) = crossbeam_channel::bounded(1);
    let dropper = std::thread::spawn(move || {
        drop(snap);
        done.send(()).unwrap();
    });
    assert_eq!(dropped.recv_timeout(Duration::from_secs(10)), Ok(()));
    dropper.join().unwrap();
    drop(live);
    // Applied by the next holder: one handle left at that seq, then none.
    assert_eq!(shared.live_snapshots().get(&seq), Some(&1));
    drop(other);
    assert!(shared.live_snapshots().is_empty());
}
