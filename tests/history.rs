//! The change feed: every change committed after a sequence number, in order, each once, with its
//! commit time; where it starts (`history_start`) and how compaction moves that start; a store
//! written in segment format 2 and reopened by this build.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{added, feed};
use ctxlog::{AddOutcome, Change, ContextItem, Error, ManualClock, Options, Scope, Store, TypeSpec};
use serde_json::json;

/// 2024-05-10T10:00:00Z.
const NOW: i64 = 1_715_335_200;

fn open(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    Options::new()
        .clock(clock.clone())
        .auto_compact(false)
        .open(dir)
        .expect("open")
}

fn item(id: &str, version: &str, scope: Scope) -> ContextItem {
    ContextItem::new(
        id,
        "tool_result",
        json!({"id": id, "v": version}),
        "tests",
        NOW,
        version,
        scope,
    )
}

#[test]
fn the_feed_holds_every_change_in_order_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let store = open(dir.path(), &clock);
    assert_eq!((store.last_seq(), store.history_start().unwrap()), (0, 0));
    assert!(feed(&store, 0).is_empty());

    let (a1, b1) = (
        item("a", "1", Scope::GlobalWritable),
        item("b", "1", Scope::Session("s1".into())),
    );
    let seq1 = common::batch_seq(&store.add([a1.clone(), b1.clone()]).unwrap());
    clock.advance(5);
    let a2 = item("a", "2", Scope::GlobalReadonly);
    let seq2 = common::batch_seq(&store.add([a2.clone()]).unwrap());
    // Adding a stored version again commits nothing.
    assert!(matches!(
        store.add([a2.clone()]).unwrap()[0],
        AddOutcome::Unchanged { .. }
    ));
    assert_eq!(store.last_seq(), seq2);
    // A type registration and a pin commit batches, but change no item.
    store.register_type(TypeSpec::new("note")).unwrap();
    store.snapshot().pin("p").unwrap();
    clock.advance(7);
    assert!(store.delete("b").unwrap());
    let seq3 = store.last_seq();
    assert!(seq1 < seq2 && seq2 < seq3, "{seq1} {seq2} {seq3}");

    let expected = vec![
        added(&a1, seq1, NOW),
        added(&b1, seq1, NOW),
        added(&a2, seq2, NOW + 5),
        Change::Deleted {
            seq: seq3,
            committed_at: NOW + 12,
            id: "b".into(),
            scope: Scope::Session("s1".into()),
        },
    ];
    assert_eq!(feed(&store, 0), expected);
    // Resuming after any seq gives exactly the changes after it.
    for after in 0..=store.last_seq() {
        let tail: Vec<Change> = expected.iter().filter(|c| c.seq() > Some(after)).cloned().collect();
        assert_eq!(feed(&store, after), tail, "after {after}");
    }
    // The feed is the log's: a reopen changes nothing, commit times included.
    drop(store);
    clock.advance(100);
    let store = open(dir.path(), &clock);
    assert_eq!(feed(&store, 0), expected);
    // An iterator ends where the log stood when it was made.
    let mut changes = store.changes(seq2).unwrap();
    let c1 = item("c", "1", Scope::GlobalWritable);
    let seq4 = common::batch_seq(&store.add([c1.clone()]).unwrap());
    assert_eq!(changes.next().map(Result::unwrap), expected.last().cloned());
    assert!(changes.next().is_none());
    assert_eq!(feed(&store, seq3), vec![added(&c1, seq4, NOW + 112)]);
    // Past the last seq: refused, naming the field.
    match store.changes(seq4 + 1) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field, "after"),
        other => panic!("expected Invalid, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn commit_times_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let store = open(dir.path(), &clock);
    store.add([item("a", "1", Scope::GlobalWritable)]).unwrap();
    clock.set(NOW - 3_600);
    store.add([item("b", "1", Scope::GlobalWritable)]).unwrap();
    drop(store);
    let store = open(dir.path(), &clock);
    store.add([item("c", "1", Scope::GlobalWritable)]).unwrap();
    clock.set(NOW + 10);
    store.add([item("d", "1", Scope::GlobalWritable)]).unwrap();
    let times: Vec<i64> = feed(&store, 0)
        .iter()
        .map(|change| match change {
            Change::Added { committed_at, .. } => *committed_at,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(times, vec![NOW, NOW, NOW, NOW + 10]);
}

#[test]
fn compaction_moves_the_start_past_what_it_removed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let store = open(dir.path(), &clock);
    // Batch 1: an item that expires; batch 2: one that is deleted later; then items that stay.
    let gone = item("gone", "1", Scope::GlobalWritable).with_ttl(10);
    let seq1 = common::batch_seq(&store.add([gone]).unwrap());
    let seq2 = common::batch_seq(&store.add([item("deleted", "1", Scope::GlobalWritable)]).unwrap());
    let kept: Vec<ContextItem> = (0..20)
        .map(|n| item(&format!("k{n}"), "1", Scope::GlobalWritable))
        .collect();
    for kept in &kept {
        store.add([kept.clone()]).unwrap();
    }
    assert!(store.delete("deleted").unwrap());
    let before = feed(&store, 0);
    assert_eq!(store.history_start().unwrap(), 0);

    clock.advance(60);
    let report = store.compact().unwrap();
    assert_eq!(
        (report.reclaimed_expired, report.reclaimed_deleted),
        (1, 1),
        "{report:?}"
    );
    // The batches whose records were removed are gone from the feed; the rest is as it was.
    let start = store.history_start().unwrap();
    // Exactly past them: the batches after them were not touched.
    assert!(seq1 < seq2);
    assert_eq!(start, seq2);
    match store.changes(start - 1) {
        Err(Error::HistoryCompacted { oldest_available }) => assert_eq!(oldest_available, start),
        other => panic!("expected HistoryCompacted, got {:?}", other.map(|_| ())),
    }
    let tail: Vec<Change> = before.iter().filter(|c| c.seq() > Some(start)).cloned().collect();
    assert_eq!(feed(&store, start), tail);
    // The delete itself stays in the feed while its tombstone is kept.
    assert!(
        matches!(tail.last(), Some(Change::Deleted { id, .. }) if id == "deleted"),
        "{tail:?}"
    );
    // The start is kept across a reopen.
    drop(store);
    let store = open(dir.path(), &clock);
    assert_eq!(store.history_start().unwrap(), start);
    assert_eq!(feed(&store, start), tail);
}

#[test]
fn a_store_of_format_2_starts_its_feed_where_this_build_began() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v2");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let clock = Arc::new(ManualClock::new(NOW));
    let store = open(dir.path(), &clock);
    let last = store.last_seq();
    assert!(last > 0);
    // The format-2 batches have no commit times: the feed starts after them.
    assert_eq!(store.history_start().unwrap(), last);
    assert!(feed(&store, last).is_empty());
    assert!(matches!(
        store.changes(last - 1),
        Err(Error::HistoryCompacted { oldest_available }) if oldest_available == last
    ));
    let new = item("new", "1", Scope::GlobalWritable);
    let seq = common::batch_seq(&store.add([new.clone()]).unwrap());
    assert_eq!(seq, last + 1);
    assert_eq!(store.history_start().unwrap(), last);
    assert_eq!(feed(&store, last), vec![added(&new, seq, NOW)]);
    drop(store);
    let store = open(dir.path(), &clock);
    assert_eq!(feed(&store, last), vec![added(&new, seq, NOW)]);
}
