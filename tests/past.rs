//! Reads of the past: `snapshot_at` and `snapshot_as_of` answer what the store answered then, byte
//! for byte, for every moment `history_retention` keeps, through compactions and reopens; older
//! moments are answered exactly or refused with `HistoryCompacted`, never answered wrong; bounds
//! are `Invalid`; a store compacted by a build that kept no floor answers only from its reopening.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ctxlog::{ContextItem, ContextQuery, Error, ManualClock, Options, Scope, Snapshot, Store};
use serde_json::json;

/// 2024-05-10T10:00:00Z.
const NOW: i64 = 1_715_335_200;

fn open(dir: &Path, clock: &Arc<ManualClock>, retention: Duration) -> Store {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn ctxlog::Clock>)
        .auto_compact(false)
        .segment_size(4 << 10)
        .history_retention(retention)
        .open(dir)
        .expect("open")
}

/// What a view answers: its digest (the canonical JSON of every item it shows) and each id's
/// resolution, as JSON.
fn answer(view: &Snapshot, ids: &[String]) -> (String, String) {
    let digest = view.digest().expect("digest");
    let resolved = view.resolve(ids.iter().map(String::as_str)).expect("resolve");
    (digest, serde_json::to_string(&resolved).expect("json"))
}

/// One moment of the workload: the seq and clock time right after a batch, and what the store
/// answered then.
struct Moment {
    seq: u64,
    time: i64,
    answer: (String, String),
}

/// Runs `steps` random batches (adds of new versions with and without TTL, deletes), advancing
/// the clock 0-4 s before each, and records each moment.
fn workload(store: &Store, clock: &ManualClock, rng: &mut fastrand::Rng, steps: usize, ids: &[String]) -> Vec<Moment> {
    let mut moments = Vec::new();
    for _ in 0..steps {
        clock.advance(rng.i64(0..5));
        let now = ctxlog::Clock::now(clock);
        if rng.u8(0..6) == 0 {
            let id = &ids[rng.usize(0..ids.len())];
            if !store.delete(id).expect("delete") {
                continue;
            }
        } else {
            let count = rng.u64(1..=3);
            let mut batch: BTreeMap<String, ContextItem> = BTreeMap::new();
            for k in 0..count {
                // Unique: the batch's seq and the item's place in it.
                let version = format!("{}-{k}", store.last_seq() + 1);
                let id = ids[rng.usize(0..ids.len())].clone();
                let mut item = ContextItem::new(
                    id.as_str(),
                    "tool_result",
                    json!({"id": id, "v": version.as_str(), "pad": "x".repeat(rng.usize(0..300))}),
                    "tests",
                    now,
                    version.as_str(),
                    Scope::GlobalWritable,
                );
                if rng.u8(0..3) == 0 {
                    item = item.with_ttl(rng.u64(1..=12));
                }
                batch.insert(id, item);
            }
            store.add(batch.into_values()).expect("add");
        }
        moments.push(Moment {
            seq: store.last_seq(),
            time: now,
            answer: answer(&store.snapshot(), ids),
        });
    }
    moments
}

/// Commits one more batch (an item of its own).
fn add_next(store: &Store) {
    let item = ContextItem::new(
        "next",
        "tool_result",
        json!({"n": 1}),
        "tests",
        NOW,
        "1",
        Scope::GlobalWritable,
    );
    store.add([item]).expect("add");
}

fn ids() -> Vec<String> {
    (0..10).map(|n| format!("id{n}")).collect()
}

/// With a retention longer than the whole run, every moment is answered exactly by both calls,
/// after compactions that reclaim what no view of the present needs, and after a reopen.
#[test]
fn every_retained_moment_is_answered_as_it_was_then() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(NOW));
    let retention = Duration::from_secs(24 * 3600);
    let ids = ids();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut moments = Vec::new();
    {
        let store = open(dir.path(), &clock, retention);
        for _ in 0..3 {
            moments.extend(workload(&store, &clock, &mut rng, 60, &ids));
            store.compact().expect("compact");
        }
        check_all(&store, &moments, &ids);
    }
    let store = open(dir.path(), &clock, retention);
    check_all(&store, &moments, &ids);
    // Long after, with nothing retained any more, compaction reclaims, and the old moments are
    // refused rather than answered wrong; the present is still answered.
    clock.advance(48 * 3600);
    drop(store);
    let store = open(dir.path(), &clock, Duration::ZERO);
    let report = store.compact().expect("compact");
    assert!(report.segments_rewritten > 0, "{report:?}");
    let refused = moments
        .iter()
        .filter(|moment| matches!(store.snapshot_at(moment.seq), Err(Error::HistoryCompacted { .. })))
        .count();
    assert!(refused > 0, "no moment was refused after reclaiming its versions");
    exact_or_refused(&store, &moments, &ids);
    // Reclaiming expired versions changed what even the last seq resolved (expired, then not
    // found): the floor stands past it. The next batch is answered again.
    add_next(&store);
    let last = store.last_seq();
    assert_eq!(
        answer(&store.snapshot_at(last).expect("the last seq"), &ids),
        answer(&store.snapshot(), &ids)
    );
}

fn check_all(store: &Store, moments: &[Moment], ids: &[String]) {
    for moment in moments {
        let at = store.snapshot_at(moment.seq).expect("snapshot_at");
        assert_eq!(answer(&at, ids), moment.answer, "snapshot_at({})", moment.seq);
        let as_of = store.snapshot_as_of(moment.time).expect("snapshot_as_of");
        // Several batches may share a second: as of it, the store stood after the last of them.
        let last_of_second = moments.iter().rev().find(|m| m.time == moment.time).expect("itself");
        assert_eq!(as_of.seq(), last_of_second.seq, "as of {}", moment.time);
        assert_eq!(answer(&as_of, ids), last_of_second.answer, "as of {}", moment.time);
    }
}

/// Every moment is answered as it was, or refused with `HistoryCompacted`.
fn exact_or_refused(store: &Store, moments: &[Moment], ids: &[String]) -> usize {
    let mut answered = 0;
    for moment in moments {
        match store.snapshot_at(moment.seq) {
            Ok(view) => {
                assert_eq!(answer(&view, ids), moment.answer, "snapshot_at({})", moment.seq);
                answered += 1;
            }
            Err(Error::HistoryCompacted { .. }) => {}
            Err(e) => panic!("snapshot_at({}): {e}", moment.seq),
        }
    }
    answered
}

/// With a short retention, compaction between runs of the workload keeps every moment of the
/// retained span answered exactly, reclaims what is older, and answers older moments exactly or
/// not at all.
#[test]
fn a_short_retention_keeps_its_span_and_reclaims_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(NOW));
    let retention = Duration::from_secs(40);
    let ids = ids();
    let mut rng = fastrand::Rng::with_seed(11);
    let store = open(dir.path(), &clock, retention);
    let mut moments = Vec::new();
    let mut reclaimed = 0;
    for round in 0..8 {
        moments.extend(workload(&store, &clock, &mut rng, 40, &ids));
        let report = store.compact().expect("compact");
        reclaimed += report.reclaimed_expired + report.reclaimed_superseded + report.reclaimed_deleted;
        let now = ctxlog::Clock::now(&*clock);
        for moment in moments.iter().filter(|m| m.time > now - 40) {
            let view = store
                .snapshot_at(moment.seq)
                .unwrap_or_else(|e| panic!("round {round}: snapshot_at({}): {e}", moment.seq));
            assert_eq!(
                answer(&view, &ids),
                moment.answer,
                "round {round}: snapshot_at({})",
                moment.seq
            );
        }
        exact_or_refused(&store, &moments, &ids);
    }
    assert!(reclaimed > 0, "compaction never reclaimed anything");
    let answered = exact_or_refused(&store, &moments, &ids);
    assert!(
        answered < moments.len(),
        "every moment was still answered: nothing was reclaimed"
    );
}

/// Views past the last seq or the clock's now are `Invalid`; seq 0 is the empty store; the floor
/// survives a reopen; pins keep working.
#[test]
fn bounds_the_empty_past_and_the_floor_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(NOW));
    let ids = ids();
    let store = open(dir.path(), &clock, Duration::ZERO);
    let empty = store.snapshot_at(0).expect("seq 0");
    assert!(empty.get(&ContextQuery::new()).expect("get").is_empty());
    assert!(store
        .snapshot_as_of(NOW - 100)
        .expect("before the first batch")
        .get(&ContextQuery::new())
        .expect("get")
        .is_empty());
    let mut rng = fastrand::Rng::with_seed(3);
    let moments = workload(&store, &clock, &mut rng, 120, &ids);
    let last = store.last_seq();
    match store.snapshot_at(last + 1) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field, "seq"),
        other => panic!("past the last seq: {other:?}"),
    }
    let now = ctxlog::Clock::now(&*clock);
    match store.snapshot_as_of(now + 1) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field, "t"),
        other => panic!("past now: {other:?}"),
    }
    // A pin of the present stays readable whatever compaction does.
    let pinned = store.snapshot();
    let pinned_answer = answer(&pinned, &ids);
    pinned.pin("audit").expect("pin");
    drop(pinned);
    clock.advance(1000);
    store.compact().expect("compact");
    let refused: Vec<u64> = moments
        .iter()
        .filter(|m| matches!(store.snapshot_at(m.seq), Err(Error::HistoryCompacted { .. })))
        .map(|m| m.seq)
        .collect();
    assert!(!refused.is_empty(), "compaction reclaimed nothing a moment showed");
    exact_or_refused(&store, &moments, &ids);
    drop(store);
    let store = open(dir.path(), &clock, Duration::ZERO);
    for seq in &refused {
        assert!(
            matches!(store.snapshot_at(*seq), Err(Error::HistoryCompacted { .. })),
            "seq {seq} refused before the reopen, answered after it"
        );
    }
    assert_eq!(answer(&store.open_snapshot("audit").expect("pin"), &ids), pinned_answer);
}

/// Every flipped bit of `history.floor` is caught (its CRC, magic, version or size): the store
/// opens with every item as it was, views from before the opening are refused, later ones are
/// answered, and the first commit writes a sound floor again.
#[test]
fn a_damaged_floor_file_only_moves_the_past_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(NOW));
    let ids = ids();
    let mut rng = fastrand::Rng::with_seed(5);
    {
        let store = open(dir.path(), &clock, Duration::ZERO);
        workload(&store, &clock, &mut rng, 60, &ids);
        clock.advance(100);
        let report = store.compact().expect("compact");
        assert!(report.segments_rewritten > 0, "{report:?}");
    }
    let path = dir.path().join("history.floor");
    let sound = std::fs::read(&path).expect("compaction wrote the floor");
    assert_eq!(sound.len(), 32);
    let present = {
        let store = open(dir.path(), &clock, Duration::ZERO);
        answer(&store.snapshot(), &ids)
    };
    for bit in 0..sound.len() * 8 {
        let mut damaged = sound.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        std::fs::write(&path, &damaged).expect("damage");
        let store = open(dir.path(), &clock, Duration::ZERO);
        assert_eq!(answer(&store.snapshot(), &ids), present, "bit {bit}");
        let last = store.last_seq();
        assert!(
            matches!(store.snapshot_at(last), Err(Error::HistoryCompacted { oldest_available }) if oldest_available == last),
            "bit {bit}: a view from before the opening was answered"
        );
    }
    // Cut short, and then the first commit after the opening writes a sound floor.
    std::fs::write(&path, &sound[..20]).expect("truncate");
    let store = open(dir.path(), &clock, Duration::ZERO);
    let last = store.last_seq();
    add_next(&store);
    assert!(store.snapshot_at(last + 1).is_ok());
    let rewritten = std::fs::read(&path).expect("floor");
    assert_eq!(rewritten.len(), 32);
    assert_eq!(u64::from_le_bytes(rewritten[12..20].try_into().expect("8 bytes")), last);
}
