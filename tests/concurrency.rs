//! Concurrency: 8 writer threads adding many batches under `Durability::Immediate` (sharing fsyncs
//! through group commit) while 2 reader threads query the store and its snapshots. Proves that every
//! batch is atomic to readers (each reader sees a batch whole or not at all), that each writer's batches
//! become visible in order and no later than their `add` returns (read-your-writes), that a snapshot's
//! answers do not change while writers go on and that it sees exactly as many batches as its sequence
//! number, that sequence numbers are unique and gapless, and that every acknowledged item is present
//! with its content at the end and again after reopening.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxlog::*;
use serde_json::json;
use sha2::{Digest, Sha256};

const WRITERS: u64 = 8;
const READERS: u64 = 2;
const BATCHES_PER_WRITER: u64 = 300;
const CLOCK_START: i64 = 1_700_000_000;

fn open_store(dir: &Path) -> Result<Store> {
    Options::new()
        .durability(Durability::Immediate)
        .clock(Arc::new(ManualClock::new(CLOCK_START)))
        .open(dir)
}

/// How many items batch `batch` of writer `writer` holds: 1..=10, deterministic.
fn batch_size(writer: u64, batch: u64) -> u64 {
    let mut z = (writer << 32 | batch).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    1 + (z ^ (z >> 31)) % 10
}

fn written_item(writer: u64, batch: u64, i: u64) -> ContextItem {
    let size = batch_size(writer, batch);
    ContextItem::new(
        format!("t{writer}-b{batch}-{i}"),
        "document_chunk",
        json!({"batch": format!("{writer}-{batch}"), "size": size, "i": i}),
        "concurrency-test",
        CLOCK_START + i64::try_from(batch).expect("small"),
        "1",
        Scope::GlobalWritable,
    )
}

/// The item as the store must give it back: with its content hash.
fn stored_item(writer: u64, batch: u64, i: u64) -> ContextItem {
    let item = written_item(writer, batch, i);
    let digest = Sha256::digest(canonical_json(&item.content));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    item.with_hash(format!("sha256:{hex}"))
}

/// Parses `t{writer}-b{batch}-{i}`.
fn parse_id(id: &str) -> Option<(u64, u64, u64)> {
    let mut parts = id.split('-');
    let writer = parts.next()?.strip_prefix('t')?.parse().ok()?;
    let batch = parts.next()?.strip_prefix('b')?.parse().ok()?;
    let i = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((writer, batch, i))
}

/// Checks one read: every item is exactly as written, every batch (grouped by the content's "batch"
/// field) holds all of its "size" items, and each writer's visible batches are a prefix 0..n with n
/// at least `floor` (what was acknowledged before the read began). Returns n per writer.
fn check_read(items: &[ContextItem], floor: &[u64], context: &str) -> Vec<u64> {
    let mut groups: BTreeMap<(u64, u64), BTreeSet<u64>> = BTreeMap::new();
    for item in items {
        let (writer, batch, i) = parse_id(&item.id).unwrap_or_else(|| panic!("{context}: unexpected id {}", item.id));
        assert_eq!(
            item,
            &stored_item(writer, batch, i),
            "{context}: {} came back different",
            item.id
        );
        let label = item.content["batch"].as_str().expect("a batch label");
        let (label_writer, label_batch) = label.split_once('-').expect("t-b");
        let key = (
            label_writer.parse().expect("writer number"),
            label_batch.parse().expect("batch number"),
        );
        assert!(
            groups.entry(key).or_default().insert(i),
            "{context}: {} returned twice",
            item.id
        );
    }
    let mut visible = vec![0u64; floor.len()];
    let mut by_writer: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for (&(writer, batch), members) in &groups {
        let size = batch_size(writer, batch);
        assert_eq!(
            members.len() as u64,
            size,
            "{context}: batch {writer}-{batch} is seen partly: {} of its {size} items ({members:?})",
            members.len()
        );
        by_writer.entry(writer).or_default().insert(batch);
    }
    for (writer, batches) in by_writer {
        let n = batches.len() as u64;
        assert_eq!(
            batches.last().copied(),
            n.checked_sub(1),
            "{context}: writer {writer}'s visible batches are not a prefix: {batches:?}"
        );
        visible[usize::try_from(writer).expect("small")] = n;
    }
    for (writer, (&seen, &acked)) in visible.iter().zip(floor).enumerate() {
        assert!(
            seen >= acked,
            "{context}: writer {writer} had {acked} batches acknowledged before the read, the read sees {seen}"
        );
    }
    visible
}

fn acknowledged(acked: &[AtomicU64]) -> Vec<u64> {
    acked.iter().map(|a| a.load(Ordering::Acquire)).collect()
}

fn all_items() -> Vec<ContextItem> {
    (0..WRITERS)
        .flat_map(|w| (0..BATCHES_PER_WRITER).flat_map(move |b| (0..batch_size(w, b)).map(move |i| (w, b, i))))
        .map(|(w, b, i)| stored_item(w, b, i))
        .collect()
}

/// The whole store must be exactly every item written.
fn check_complete(store: &Store, context: &str) {
    let everything = vec![BATCHES_PER_WRITER; usize::try_from(WRITERS).unwrap()];
    let items = store
        .get(&ContextQuery::new())
        .unwrap_or_else(|e| panic!("{context}: get failed: {e}"));
    assert_eq!(
        check_read(&items, &everything, context),
        everything,
        "{context}: not every batch is there"
    );
    let expected = all_items();
    assert_eq!(items.len(), expected.len(), "{context}: item count");
    let stats = store.stats();
    assert_eq!(stats.items, expected.len() as u64, "{context}: stats().items");
    assert_eq!(stats.seq, WRITERS * BATCHES_PER_WRITER, "{context}: stats().seq");
    let ids: Vec<&str> = expected.iter().map(|item| item.id.as_str()).collect();
    let resolutions = store
        .resolve(&ids)
        .unwrap_or_else(|e| panic!("{context}: resolve failed: {e}"));
    for (item, resolution) in expected.iter().zip(resolutions) {
        match resolution {
            Resolution::Found(found) => assert_eq!(&found, item, "{context}: {} differs", item.id),
            other => panic!("{context}: {} resolves to {other:?}", item.id),
        }
    }
}

/// What one reader thread saw.
#[derive(Debug, Default)]
struct ReaderReport {
    reads: u64,
    snapshots: u64,
    partial_views: u64,
    largest_read: usize,
}

fn reader(store: &Store, acked: &[AtomicU64], done: &AtomicBool, id: u64) -> ReaderReport {
    let query = ContextQuery::new();
    let mut report = ReaderReport::default();
    let mut last_fresh = vec![0u64; usize::try_from(WRITERS).unwrap()];
    let mut last_snapshot_seq = 0u64;
    loop {
        // Read the flag first, so that one full round runs after the writers finished.
        let finished = done.load(Ordering::Acquire);

        let floor = acknowledged(acked);
        let items = store.get(&query).expect("reader get");
        let context = format!("reader {id}, read {}", report.reads);
        let fresh = check_read(&items, &floor, &context);
        for (writer, (now, before)) in fresh.iter().zip(&last_fresh).enumerate() {
            assert!(
                now >= before,
                "{context}: writer {writer}'s batches went from {before} visible to {now}"
            );
        }
        if fresh.iter().sum::<u64>() < WRITERS * BATCHES_PER_WRITER {
            report.partial_views += 1;
        }
        report.largest_read = report.largest_read.max(items.len());
        last_fresh = fresh;
        report.reads += 1;

        let floor = acknowledged(acked);
        let snapshot = store.snapshot();
        let context = format!("reader {id}, snapshot {} at seq {}", report.snapshots, snapshot.seq());
        assert!(
            snapshot.seq() >= last_snapshot_seq,
            "{context}: the snapshot seq went back from {last_snapshot_seq}"
        );
        last_snapshot_seq = snapshot.seq();
        let first = snapshot.get(&query).expect("snapshot get");
        let seen = check_read(&first, &floor, &context);
        assert_eq!(
            seen.iter().sum::<u64>(),
            snapshot.seq(),
            "{context}: a snapshot must see exactly one batch per sequence number"
        );
        // Let writers go on, then ask the same snapshot again: same answer, byte for byte.
        std::thread::sleep(Duration::from_millis(2));
        let again = snapshot.get(&query).expect("snapshot get again");
        assert!(
            first == again,
            "{context}: the snapshot's answer changed while writers went on"
        );
        report.snapshots += 1;

        if finished {
            return report;
        }
    }
}

#[test]
fn writers_and_readers_see_whole_batches() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_store(dir.path()).expect("open");
    let acked: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);

    let (seqs, readers) = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|id| {
                let (store, acked, done) = (store.clone(), &acked, &done);
                scope.spawn(move || reader(&store, acked, done, id))
            })
            .collect();
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let (store, acked) = (store.clone(), &acked);
                scope.spawn(move || {
                    let mut seqs = Vec::new();
                    for batch in 0..BATCHES_PER_WRITER {
                        let size = batch_size(writer, batch);
                        let items: Vec<ContextItem> = (0..size).map(|i| written_item(writer, batch, i)).collect();
                        let outcomes = store.add(items).expect("add");
                        assert_eq!(outcomes.len() as u64, size, "one outcome per item");
                        let batch_seqs: BTreeSet<u64> = outcomes
                            .iter()
                            .map(|outcome| match outcome {
                                AddOutcome::Added { seq, .. } => *seq,
                                other => panic!("writer {writer}, batch {batch}: {other:?}"),
                            })
                            .collect();
                        assert_eq!(batch_seqs.len(), 1, "a batch is one frame: one seq for all its items");
                        let seq = *batch_seqs.first().expect("a seq");
                        assert!(
                            seqs.last().is_none_or(|last| seq > *last),
                            "writer {writer}: seq {seq} after {seqs:?}"
                        );
                        seqs.push(seq);
                        // Read-your-writes: acknowledged means visible.
                        let id = format!("t{writer}-b{batch}-{}", size - 1);
                        match store.resolve([&id]).expect("resolve").pop() {
                            Some(Resolution::Found(item)) => {
                                assert_eq!(item, stored_item(writer, batch, size - 1), "{id} differs");
                            }
                            other => panic!("writer {writer}: {id} just added resolves to {other:?}"),
                        }
                        acked[usize::try_from(writer).expect("small")].store(batch + 1, Ordering::Release);
                    }
                    seqs
                })
            })
            .collect();
        let seqs: Vec<u64> = writers
            .into_iter()
            .flat_map(|w| w.join().expect("a writer panicked"))
            .collect();
        done.store(true, Ordering::Release);
        let readers: Vec<ReaderReport> = readers
            .into_iter()
            .map(|r| r.join().expect("a reader panicked"))
            .collect();
        (seqs, readers)
    });

    // Sequence numbers: one per batch, unique, gapless.
    let total = WRITERS * BATCHES_PER_WRITER;
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len() as u64, total, "sequence numbers are not unique");
    assert_eq!(
        (unique.first().copied(), unique.last().copied()),
        (Some(1), Some(total)),
        "sequence numbers are not 1..={total}"
    );
    for (id, report) in readers.iter().enumerate() {
        assert!(
            report.reads >= 2 && report.snapshots >= 2,
            "reader {id} hardly ran: {report:?}"
        );
    }
    assert!(
        readers.iter().any(|r| r.partial_views > 0),
        "no reader ever ran while writers were still writing: {readers:?}"
    );

    check_complete(&store, "after the writers finished");
    drop(store);
    let store = open_store(dir.path()).expect("reopen");
    let recovery = store.stats().recovery;
    assert_eq!(recovery.truncated_bytes, 0, "the reopen truncated bytes");
    assert_eq!(store.stats().seq, total, "the reopen found another number of batches");
    // A clean close leaves a checkpoint of every batch; without one the whole log is replayed.
    let covered = recovery.checkpoint_seq.unwrap_or(0) + recovery.frames;
    assert_eq!(
        covered, total,
        "the reopen covered another number of frames: {recovery:?}"
    );
    check_complete(&store, "after reopening");
    let report = store.verify().expect("verify");
    assert!(report.is_ok(), "verify found problems: {:?}", report.problems);
    println!(
        "concurrency: {WRITERS} writers x {BATCHES_PER_WRITER} batches ({} items), {READERS} readers {readers:?}, in {:.1?}",
        all_items().len(),
        started.elapsed()
    );
}

/// Bulk batches (300 puts each, enough to be applied to the index while their fsync runs) from one
/// writer, while two readers keep reading: every count, query and resolve answers as of whole
/// published batches. The statistics count exactly the batches up to their sequence number, a
/// snapshot sees exactly its batches, and a re-put id resolves to the version of the snapshot's last
/// batch, never to one of a batch still being synced.
#[test]
fn bulk_batches_are_seen_whole_and_only_once_published() {
    const BULK_BATCHES: u64 = 40;
    const NEW_IDS: u64 = 250;
    const SHARED_IDS: u64 = 50;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_store(dir.path()).expect("open");
    let expected_items = |seq: u64| if seq == 0 { 0 } else { NEW_IDS * seq + SHARED_IDS };
    let done = AtomicBool::new(false);
    let reads = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|reader| {
                let (store, done) = (store.clone(), &done);
                scope.spawn(move || {
                    let mut reads = 0u64;
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        let stats = store.stats();
                        assert_eq!(
                            (stats.items, stats.versions),
                            (expected_items(stats.seq), (NEW_IDS + SHARED_IDS) * stats.seq),
                            "reader {reader}: the counts at seq {}",
                            stats.seq
                        );
                        let snapshot = store.snapshot();
                        let seq = snapshot.seq();
                        let items = snapshot.get(&ContextQuery::new()).expect("get");
                        assert_eq!(
                            items.len() as u64,
                            expected_items(seq),
                            "reader {reader}: items at seq {seq}"
                        );
                        let window = ContextQuery::new()
                            .types(["document_chunk"])
                            .time_range(TimeRange::new(CLOCK_START, CLOCK_START + 1_000_000).expect("range"));
                        let windowed = snapshot.get(&window).expect("get window");
                        assert_eq!(windowed.len(), items.len(), "reader {reader}: window at seq {seq}");
                        match snapshot.resolve(["shared-7"]).expect("resolve").pop() {
                            Some(Resolution::Found(item)) => {
                                assert_eq!(
                                    item.version,
                                    format!("v{seq}"),
                                    "reader {reader}: shared-7 at seq {seq}"
                                );
                            }
                            Some(Resolution::NotFound { .. }) => assert_eq!(seq, 0, "reader {reader}"),
                            other => panic!("reader {reader}: shared-7 at seq {seq}: {other:?}"),
                        }
                        reads += 1;
                        if finished {
                            return reads;
                        }
                    }
                })
            })
            .collect();
        for batch in 1..=BULK_BATCHES {
            let item = |id: String, version: String, n: u64| {
                ContextItem::new(
                    id,
                    "document_chunk",
                    json!({"batch": batch, "n": n}),
                    "bulk-test",
                    CLOCK_START + i64::try_from(batch * 1000 + n).expect("small"),
                    version,
                    Scope::GlobalWritable,
                )
            };
            let items: Vec<ContextItem> = (0..NEW_IDS)
                .map(|n| item(format!("bulk-{batch}-{n}"), "1".into(), n))
                .chain((0..SHARED_IDS).map(|n| item(format!("shared-{n}"), format!("v{batch}"), NEW_IDS + n)))
                .collect();
            let outcomes = store.add(items).expect("bulk add");
            assert_eq!(outcomes.len() as u64, NEW_IDS + SHARED_IDS);
            assert_eq!(store.stats().seq, batch, "one sequence number per batch");
        }
        done.store(true, Ordering::Release);
        readers
            .into_iter()
            .map(|r| r.join().expect("a reader panicked"))
            .collect::<Vec<u64>>()
    });
    assert!(reads.iter().all(|r| *r > 0), "every reader read: {reads:?}");
    assert_eq!(store.stats().items, expected_items(BULK_BATCHES));
}

/// Two threads add large batches (checked on several threads, each run looking up its ids once
/// they are checked, so that the writer need not) of the same new ids, version "1", with other
/// contents. Whichever batch the writer takes second, in the same group as the first or after the
/// first was applied to the index, must meet the first's versions: each round, one batch is added
/// whole and the other refused at its first item, and every id holds the added batch's content.
#[test]
fn large_batches_of_the_same_new_ids_from_two_threads_are_one_added_and_one_refused() {
    const ITEMS: u64 = 600;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new()
        .durability(Durability::Never)
        .add_threads(2)
        .clock(Arc::new(ManualClock::new(CLOCK_START)))
        .open(dir.path())
        .expect("open");
    let racing = |round: u64, writer: u64| -> Vec<ContextItem> {
        (0..ITEMS)
            .map(|i| {
                ContextItem::new(
                    format!("race{round}-{i}"),
                    "document_chunk",
                    json!({"writer": writer, "i": i}),
                    "concurrency-test",
                    CLOCK_START,
                    "1",
                    Scope::GlobalWritable,
                )
            })
            .collect()
    };
    for round in 0..40 {
        let barrier = std::sync::Barrier::new(2);
        let answers: Vec<Result<Vec<AddOutcome>>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|writer| {
                    let (store, barrier) = (&store, &barrier);
                    let batch = racing(round, writer);
                    s.spawn(move || {
                        barrier.wait();
                        store.add(batch)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("adder")).collect()
        });
        let winners: Vec<usize> = (0..2).filter(|w| answers[*w].is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {answers:?}");
        let winner = winners[0];
        let added = answers[winner].as_ref().expect("added");
        assert_eq!(added.len() as u64, ITEMS);
        assert!(
            added.iter().all(|o| matches!(o, AddOutcome::Added { .. })),
            "round {round}"
        );
        match &answers[1 - winner] {
            Err(Error::VersionConflict { id, index, .. }) => {
                assert_eq!(id, &format!("race{round}-0"));
                assert_eq!(*index, Some(0));
            }
            other => panic!("round {round}: the second batch was answered {other:?}"),
        }
        for i in (0..ITEMS).step_by(37) {
            let id = format!("race{round}-{i}");
            match store.resolve([id.as_str()]).expect("resolve").pop() {
                Some(Resolution::Found(item)) => assert_eq!(item.content, json!({"writer": winner, "i": i})),
                other => panic!("{id}: {other:?}"),
            }
        }
    }
}
