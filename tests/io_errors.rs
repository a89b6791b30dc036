//! I/O errors injected by `SimDisk` at every storage call of a reference workload.
//!
//! The reference workload (open, 200 batches with deletes, pins and reads among them, a compaction that
//! rewrites segments and writes a checkpoint, a `verify`, close, reopen, more writes, close) is run
//! once without faults to count its storage calls N. Then, for each call k in 0..N, each of EIO,
//! ENOSPC and a short write, and each of "call k fails once" and "every call from k on fails", it is
//! run again on a fresh disk with the fault armed, and the suite checks that:
//!
//! - every operation returns `Ok` or a typed error (`Io`, or `Poisoned` once a write has failed), and
//!   nothing panics, neither the caller's thread nor the store's own threads;
//! - a failed write or fsync of the log poisons the store: every later write is refused with
//!   `Poisoned` without any storage call (a compaction makes no write call either), and its reason
//!   names the failure that poisoned it;
//! - no file handle is written or synced again after a write, `set_len` or fsync on it failed (the
//!   fsync is never retried on that handle);
//! - a failure elsewhere (a compaction or checkpoint file, a read, a directory fsync of a compaction)
//!   is returned to its caller and the store goes on: when the call failed only once, every later
//!   operation works (a second open after a failed one, a read after a failed read);
//! - reads that succeed show exactly the acknowledged state;
//! - once the faults stop, the store opens (on the disk as it is, on a copy that lost power, and on a
//!   copy taken right after the first write acknowledged after the fault that keeps only what was
//!   synced), shows every acknowledged add, delete and pin byte for byte and at most the one write
//!   whose failure poisoned it (whole or not at all), `verify()` finds nothing, no `.tmp` is left,
//!   and after a clean close there is one checkpoint and a second open shows the same.
//!
//! The suite prints how many runs and distinct call sites it exercised and asserts that the fault
//! hit call k in every run, and that every call site and kind of call of the workload was faulted.
//! The regression tests of the bugs it found, and a smaller suite over the one kind of call the
//! workload never makes (`set_len`, when opening cuts a torn tail), come first.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ctxlog::storage::{Call, CallKind, Fault, SimDisk};
use ctxlog::*;
use serde_json::json;

const DIR: &str = "/sim/store";
/// Batches of the reference workload.
const BATCHES: usize = 200;
/// Distinct ids the batches write, so that most versions are superseded and compaction reclaims.
const IDS: usize = 24;

fn open(disk: &SimDisk) -> Result<Store> {
    open_with_segments_of(disk, 8192)
}

fn open_with_segments_of(disk: &SimDisk, segment_size: u64) -> Result<Store> {
    Options::new()
        .storage(Arc::new(disk.clone()))
        .clock(Arc::new(ManualClock::new(common::NOW)))
        .segment_size(segment_size)
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

/// A batch of many puts is applied to the index while its fsync runs, and published only once the
/// fsync succeeded. When that fsync fails, the store is poisoned and nothing of the batch is ever
/// seen: no id, no version that it supersedes ended, no count, no change to the digest, no
/// checkpoint. After a reopen the batch is whole or absent (its bytes were written; only their
/// fsync failed).
#[test]
fn a_bulk_batch_whose_fsync_fails_is_never_seen() {
    // Segments large enough for the whole batch: its frame goes into the active segment.
    let open = |disk: &SimDisk| open_with_segments_of(disk, 64 << 20);
    let first = common::item("doc-1", common::NOW, "1", json!({"n": 1}));
    let mut bulk: Vec<ContextItem> = (0..600)
        .map(|n| common::item(&format!("bulk-{n:04}"), common::NOW + n, "1", json!({"n": n})))
        .collect();
    bulk.push(common::item("doc-1", common::NOW, "2", json!({"n": 2})));

    // A dry run finds the bulk add's fsync among the storage calls (the calls are deterministic).
    let dry = SimDisk::new();
    dry.record_calls(true);
    let store = open(&dry).expect("open");
    store.add([first.clone()]).expect("add");
    let _ = store.stats();
    store.snapshot().digest().expect("digest");
    let from = dry.calls();
    store.add(bulk.clone()).expect("bulk add");
    let sync_at = first_call(&dry, from, CallKind::SyncData);
    drop(store);

    // A power cut at the fsync fails it (and every later call) too.
    for fault in [Some(Fault::Io), Some(Fault::NoSpace), None] {
        let disk = SimDisk::new();
        let store = open(&disk).expect("open");
        store.add([first.clone()]).expect("add");
        let stats = store.stats();
        let digest = store.snapshot().digest().expect("digest");
        assert_eq!(disk.calls(), from, "the runs make the same calls");
        match fault {
            Some(fault) => disk.fail(sync_at, sync_at, fault),
            None => disk.cut_power_after(sync_at - from),
        }
        let failed = store.add(bulk.clone()).map(|outcomes| outcomes.len());
        assert!(
            matches!(failed, Err(Error::Io { .. } | Error::Poisoned { .. })),
            "{fault:?}: {failed:?}"
        );

        // Reads need the disk: after a power cut they fail, and only what a reopen finds counts.
        if fault.is_some() {
            let resolved = store.resolve(["bulk-0000", "bulk-0599", "doc-1"]).expect("resolve");
            assert!(
                matches!(resolved.first(), Some(Resolution::NotFound { .. })),
                "{fault:?}: {resolved:?}"
            );
            assert!(
                matches!(resolved.get(1), Some(Resolution::NotFound { .. })),
                "{fault:?}: {resolved:?}"
            );
            assert_eq!(
                resolved.get(2),
                Some(&Resolution::Found(common::stored_form(&first))),
                "{fault:?}: the version the batch would have superseded is still the latest"
            );
            assert_eq!(
                store.get(&ContextQuery::new()).expect("get"),
                vec![common::stored_form(&first)],
                "{fault:?}"
            );
            let after = store.stats();
            assert_eq!(
                (after.items, after.versions, after.seq),
                (stats.items, stats.versions, stats.seq),
                "{fault:?}: the counts leave the batch out"
            );
            assert_eq!(store.snapshot().digest().expect("digest"), digest, "{fault:?}");
        }
        drop(store);
        assert!(
            !disk
                .file_names(Path::new(DIR))
                .iter()
                .any(|name| name.starts_with("checkpoint-")),
            "{fault:?}: a poisoned store wrote a checkpoint: {:?}",
            disk.file_names(Path::new(DIR))
        );

        let disk = if fault.is_some() {
            disk
        } else {
            // What the power cut left: the batch's bytes were never synced, so they are gone, or
            // (a seeded crash keeps some unsynced writes) there whole.
            for seed in 0..8 {
                let crashed = disk.crash(seed);
                let store = open(&crashed).expect("open after the power cut");
                let items = store.get(&ContextQuery::new()).expect("get");
                let bulk_seen = items.iter().filter(|item| item.id.starts_with("bulk-")).count();
                assert!(
                    bulk_seen == 0 || bulk_seen == 600,
                    "seed {seed}: {bulk_seen} of the batch's 600 new ids"
                );
                assert!(
                    items.iter().any(|item| item.id == "doc-1"),
                    "seed {seed}: doc-1 was acknowledged"
                );
                assert!(store.verify().expect("verify").is_ok(), "seed {seed}");
            }
            disk.crash_losing_unsynced()
        };
        let store = open(&disk).expect("reopen once the faults stop");
        let items = store.get(&ContextQuery::new()).expect("get");
        let bulk_seen = items.iter().filter(|item| item.id.starts_with("bulk-")).count();
        let doc = items
            .iter()
            .find(|item| item.id == "doc-1")
            .map(|item| item.version.as_str());
        assert!(
            (bulk_seen == 0 && doc == Some("1")) || (bulk_seen == 600 && doc == Some("2")),
            "{fault:?}: after a reopen, {bulk_seen} of the batch's 600 new ids and doc-1 at {doc:?}"
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

/// `words` pseudo-random 16-digit hex words: text that does not compress.
fn noise(seed: u64, words: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..words)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Compaction writes a rewritten segment in steps of 1 MiB, not whole: a fault at each of those
/// writes (and at the final sync) fails the compaction with `Io`, leaves the old segment in place
/// and no temporary file, and the store goes on: a second compaction reclaims, and every item reads
/// back the same before and after a reopen.
#[test]
fn a_rewrite_written_in_steps_fails_cleanly_at_each_step() {
    // 1,200 items of about 2.5 KiB (most kept, a tenth superseded): a rewrite of about 3 MiB.
    let items: Vec<ContextItem> = (0..1200)
        .map(|n| {
            common::item(
                &format!("doc-{n}"),
                common::NOW,
                "1",
                json!({"n": n, "text": noise(n, 150)}),
            )
        })
        .collect();
    let open_big = |disk: &SimDisk| {
        Options::new()
            .storage(Arc::new(disk.clone()))
            .clock(Arc::new(ManualClock::new(common::NOW)))
            .segment_size(64 << 20)
            .auto_compact(false)
            .open(DIR)
    };
    let load = |disk: &SimDisk| -> Store {
        let store = open_big(disk).expect("open");
        for chunk in items.chunks(100) {
            store.add(chunk.to_vec()).expect("add");
        }
        let newer: Vec<ContextItem> = items
            .iter()
            .step_by(10)
            .map(|item| {
                let mut item = item.clone();
                item.version = "2".into();
                item
            })
            .collect();
        store.add(newer).expect("add newer versions");
        store
    };
    // Where the rewrite's calls fall: its appends to the temporary file and the sync after them.
    let probe = SimDisk::new();
    let store = load(&probe);
    probe.record_calls(true);
    let from = probe.calls();
    store.compact().expect("compact");
    let steps: Vec<(u64, CallKind)> = probe
        .call_log()
        .iter()
        .filter(|call| call.index >= from && call.path.to_string_lossy().ends_with(".seg.tmp"))
        .filter(|call| matches!(call.kind, CallKind::Append | CallKind::SyncAll))
        .map(|call| (call.index - from, call.kind))
        .collect();
    let appends = steps.iter().filter(|(_, kind)| *kind == CallKind::Append).count();
    assert!(appends >= 3, "the rewrite is written in steps: {steps:?}");
    let expected = common::everything(&store);
    drop(store);

    for (offset, kind) in steps {
        for fault in [Fault::Io, Fault::NoSpace, Fault::ShortWrite] {
            let disk = SimDisk::new();
            let store = load(&disk);
            let at = disk.calls() + offset;
            disk.fail(at, at, fault);
            let failed = store.compact();
            assert!(
                matches!(failed, Err(Error::Io { .. })),
                "{fault:?} at {kind:?} (call {offset} of the compaction): {failed:?}"
            );
            assert!(stray_tmp(&disk).is_empty(), "{fault:?} at {kind:?}: a .tmp was left");
            assert_eq!(common::everything(&store), expected, "{fault:?} at {kind:?}");
            let report = store.compact().expect("the next compaction");
            assert!(report.reclaimed_superseded > 0, "{report:?}");
            assert!(store.verify().expect("verify").is_ok());
            drop(store);
            let store = open_big(&disk).expect("reopen");
            assert_eq!(common::everything(&store), expected, "{fault:?} at {kind:?}, reopened");
        }
    }
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

/// The reference workload never truncates (`set_len`): recovery does, after a torn write. A short
/// write leaves half a frame; every call of the open that cuts it off fails in turn (once, and from
/// then on), and the open after that must cut it, keep the acknowledged batch and verify.
#[test]
fn every_call_of_an_open_that_cuts_a_torn_tail_fails() {
    let torn = SimDisk::new();
    let store = open(&torn).expect("open");
    let first = common::item("doc-1", common::NOW, "1", json!({"n": 1}));
    store.add([first.clone()]).expect("add");
    let next = torn.calls();
    torn.fail(next, next, Fault::ShortWrite);
    let failed = store.add([common::item("doc-2", common::NOW, "1", json!({"n": 2}))]);
    assert!(matches!(failed, Err(Error::Poisoned { .. })), "{failed:?}");
    drop(store);

    let dry = torn.copy();
    dry.record_calls(true);
    let store = open(&dry).expect("the dry open");
    assert!(store.stats().recovery.truncated_bytes > 0, "the open cut no torn tail");
    drop(store);
    let calls = dry.call_log();
    let truncation = calls
        .iter()
        .find(|call| call.kind == CallKind::SetLen)
        .expect("the open truncates");
    let mut runs = 0;
    for call in &calls {
        for fault in FAULTS {
            for last in [call.index, u64::MAX] {
                let disk = torn.copy();
                disk.record_calls(true);
                disk.fail(call.index, last, fault);
                let opened = catch_unwind(AssertUnwindSafe(|| open(&disk).map(drop)))
                    .unwrap_or_else(|_| panic!("the open panicked with {fault:?} at {call:?}"));
                let log = disk.call_log();
                if call.index <= truncation.index {
                    assert!(
                        matches!(opened, Err(Error::Io { .. })),
                        "{fault:?} at {call:?}: {opened:?}"
                    );
                }
                check_no_retry(&log).unwrap_or_else(|e| panic!("{fault:?} at {call:?}: {e}"));
                disk.clear_faults();
                let store = open(&disk).unwrap_or_else(|e| panic!("{fault:?} at {call:?}: reopening: {e}"));
                assert_eq!(common::everything(&store), vec![common::stored_form(&first)]);
                assert!(store.verify().expect("verify").is_ok(), "{fault:?} at {call:?}");
                runs += 1;
            }
        }
    }
    assert!(runs >= 6 * 10, "only {runs} runs");
}

/// One step of the reference workload.
#[derive(Debug, Clone)]
enum Step {
    /// Opens the store (the first open, or the reopen after a close).
    Open,
    /// Adds batch number `n`.
    Add(usize),
    Delete(String),
    Pin(&'static str),
    Unpin(&'static str),
    /// Reads everything, and every pin's snapshot.
    Get,
    Compact,
    Verify,
    /// Drops the store: the writer syncs and a checkpoint is written.
    Close,
}

impl Step {
    fn label(&self) -> &'static str {
        match self {
            Step::Open => "open",
            Step::Add(_) => "add",
            Step::Delete(_) => "delete",
            Step::Pin(_) => "pin",
            Step::Unpin(_) => "unpin",
            Step::Get => "get",
            Step::Compact => "compact",
            Step::Verify => "verify",
            Step::Close => "close",
        }
    }
}

/// Open, 200 batches (a delete every 9, two pins and an unpin, a full read every 50), a compaction
/// that rewrites and checkpoints, a `verify`, a batch, close, reopen, a read, a batch, an unpin, close.
fn reference_workload() -> Vec<Step> {
    let mut steps = vec![Step::Open];
    for n in 0..BATCHES {
        steps.push(Step::Add(n));
        if n % 9 == 4 {
            steps.push(Step::Delete(format!("doc-{}", (n * 7) % IDS)));
        }
        match n {
            60 => steps.push(Step::Pin("p1")),
            130 => steps.push(Step::Pin("p2")),
            170 => steps.push(Step::Unpin("p1")),
            _ => {}
        }
        if n % 50 == 49 {
            steps.push(Step::Get);
        }
    }
    steps.extend([
        Step::Compact,
        Step::Verify,
        Step::Add(BATCHES),
        Step::Close,
        Step::Open,
        Step::Get,
        Step::Add(BATCHES + 1),
        Step::Unpin("p2"),
        Step::Close,
    ]);
    steps
}

/// Batch `n`: one to three small items of distinct ids, each a new version.
fn batch(n: usize) -> Vec<ContextItem> {
    (0..1 + n % 3)
        .map(|j| {
            let id = format!("doc-{}", (n * 5 + j * 7) % IDS);
            let content = json!({ "n": n, "j": j, "text": "x".repeat((n * 13 + j * 31) % 60) });
            common::item(&id, common::NOW, &format!("v{n}"), content)
        })
        .collect()
}

/// Every batch of the workload, and its items as the store gives them back (hash filled in):
/// computed once, since the model applies them in every run.
fn batches() -> &'static [(Vec<ContextItem>, Vec<ContextItem>)] {
    static BATCHES_MADE: std::sync::OnceLock<Vec<(Vec<ContextItem>, Vec<ContextItem>)>> = std::sync::OnceLock::new();
    BATCHES_MADE.get_or_init(|| {
        (0..BATCHES + 2)
            .map(|n| {
                let items = batch(n);
                let stored = items.iter().map(common::stored_form).collect();
                (items, stored)
            })
            .collect()
    })
}

/// The store's content as the model sees it: id -> the item, and pin -> what its snapshot shows.
#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    items: BTreeMap<String, ContextItem>,
    pins: BTreeMap<String, BTreeMap<String, ContextItem>>,
}

impl Model {
    /// Applies `step`, a write.
    fn apply(&mut self, step: &Step) {
        match step {
            Step::Add(n) => {
                for item in batches()
                    .get(*n)
                    .map(|(_, stored)| stored.as_slice())
                    .unwrap_or_default()
                {
                    self.items.insert(item.id.clone(), item.clone());
                }
            }
            Step::Delete(id) => {
                self.items.remove(id);
            }
            Step::Pin(name) => {
                self.pins.insert((*name).to_owned(), self.items.clone());
            }
            Step::Unpin(name) => {
                self.pins.remove(*name);
            }
            _ => {}
        }
    }

    fn summary(&self) -> String {
        let items: Vec<String> = self
            .items
            .values()
            .map(|item| format!("{}@{}", item.id, item.version))
            .collect();
        let pins: Vec<String> = self
            .pins
            .iter()
            .map(|(name, items)| format!("{name}:{}", items.len()))
            .collect();
        format!("items {items:?}, pins {pins:?}")
    }
}

/// The state a store shows.
fn observe(store: &Store) -> Result<Model> {
    let items = store
        .get(&ContextQuery::new())?
        .into_iter()
        .map(|item| (item.id.clone(), item))
        .collect();
    let mut pins = BTreeMap::new();
    for info in store.snapshots() {
        let seen = store.open_snapshot(&info.name)?.get(&ContextQuery::new())?;
        pins.insert(
            info.name,
            seen.into_iter().map(|item| (item.id.clone(), item)).collect(),
        );
    }
    Ok(Model { items, pins })
}

/// How the fault is armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// Only call k fails.
    Once,
    /// Call k and every later one fail.
    FromOn,
}

/// One faulted run: the call that fails first, the fault, the mode.
type Job = (u64, Fault, Mode);

const FAULTS: [Fault; 3] = [Fault::Io, Fault::NoSpace, Fault::ShortWrite];
const MODES: [Mode; 2] = [Mode::Once, Mode::FromOn];

/// What a run of the workload did.
#[derive(Default)]
struct Outcome {
    /// Everything acknowledged so far.
    acked: Model,
    /// `acked` plus the one write whose failure poisoned the store, if one did: recovery may show it
    /// whole, or not at all.
    maybe: Option<Model>,
    /// The first storage call of each step, for naming call sites: (call, step label).
    boundaries: Vec<(u64, &'static str)>,
    /// A copy of the disk as it was when the first write after the fault was acknowledged, and the
    /// state then.
    after_fault: Option<(SimDisk, Model)>,
    /// Whether the compaction rewrote segments and the reopen started from a checkpoint (dry run).
    compaction_rewrote: bool,
    reopened_from_checkpoint: bool,
}

/// Runs the workload on `disk` (faults armed or not). `Err` says how the store broke a promise.
#[allow(clippy::too_many_lines)]
fn run(disk: &SimDisk, steps: &[Step], mode: Option<Mode>) -> std::result::Result<Outcome, String> {
    let mut out = Outcome::default();
    let mut store: Option<Store> = None;
    // Set once a write of the log has failed: every later write must be refused.
    let mut poisoned = false;
    // Set at the first error: with `Mode::Once` every later operation must work (or be refused as
    // poisoned); with `Mode::FromOn` the run stops once the store is poisoned or will not open.
    let mut failed = false;
    let mut skip_to_close = false;
    for (position, step) in steps.iter().enumerate() {
        let at = |what: &str| format!("step {position} ({step:?}): {what}");
        out.boundaries.push((disk.calls(), step.label()));
        if skip_to_close && !matches!(step, Step::Close) {
            continue;
        }
        skip_to_close = false;
        if store.is_none() && !matches!(step, Step::Open) {
            continue;
        }
        let before = disk.calls();
        let unexpected = |e: &Error| -> std::result::Result<(), String> {
            match (mode, e) {
                (None, e) => Err(at(&format!("failed without a fault: {e}"))),
                (Some(_), Error::Io { .. } | Error::Poisoned { .. }) => Ok(()),
                (Some(_), e) => Err(at(&format!(
                    "an I/O fault gave an error that is not Io or Poisoned: {e:?}"
                ))),
            }
        };
        match step {
            Step::Open => {
                let was_failed = failed;
                let opened = match open(disk) {
                    Ok(opened) => opened,
                    Err(e) => {
                        unexpected(&e)?;
                        failed = true;
                        match mode {
                            Some(Mode::Once) if was_failed => {
                                return Err(at(&format!("the open failed after the single fault was over: {e}")))
                            }
                            // The fault is over: a second open must work.
                            Some(Mode::Once) => {
                                open(disk).map_err(|e| at(&format!("opening again after a failed open: {e}")))?
                            }
                            _ => return Ok(out),
                        }
                    }
                };
                // `stats` makes storage calls too (the bytes on disk): in every run, so that the calls
                // are the same as in the dry run.
                let from_checkpoint = opened.stats().recovery.checkpoint_seq.is_some();
                if mode.is_none() {
                    out.reopened_from_checkpoint = from_checkpoint;
                }
                // The state it shows settles the fate of a write that failed before the close.
                let seen = match observe(&opened) {
                    Ok(seen) => seen,
                    Err(e) => {
                        unexpected(&e)?;
                        match mode {
                            Some(Mode::Once) if !failed => {
                                failed = true;
                                observe(&opened).map_err(|e| at(&format!("a second read after the open: {e}")))?
                            }
                            Some(Mode::Once) => {
                                return Err(at(&format!("a read failed after the single fault was over: {e}")))
                            }
                            _ => return Ok(out),
                        }
                    }
                };
                check_state(&seen, &out.acked, out.maybe.as_ref()).map_err(|e| at(&e))?;
                out.acked = seen;
                out.maybe = None;
                poisoned = false;
                store = Some(opened);
            }
            Step::Close => {
                drop(store.take());
            }
            Step::Get => {
                let Some(s) = &store else { continue };
                match observe(s) {
                    Ok(seen) if seen == out.acked => {}
                    Ok(seen) => {
                        return Err(at(&format!(
                            "a read shows {}, not the acknowledged {}",
                            seen.summary(),
                            out.acked.summary()
                        )))
                    }
                    Err(e) => {
                        unexpected(&e)?;
                        if mode == Some(Mode::Once) && failed {
                            return Err(at(&format!("a read failed again after a single fault: {e}")));
                        }
                        failed = true;
                    }
                }
            }
            Step::Verify => {
                let Some(s) = &store else { continue };
                match s.verify() {
                    Ok(report) if report.is_ok() => {}
                    Ok(report) => return Err(at(&format!("verify found problems: {:?}", report.problems))),
                    Err(e) => {
                        unexpected(&e)?;
                        if mode == Some(Mode::Once) && failed {
                            return Err(at(&format!("verify failed again after a single fault: {e}")));
                        }
                        failed = true;
                    }
                }
            }
            Step::Compact => {
                let Some(s) = &store else { continue };
                match s.compact() {
                    Ok(report) => {
                        if mode.is_none() {
                            out.compaction_rewrote = report.segments_rewritten > 0;
                        }
                    }
                    Err(e) => {
                        unexpected(&e)?;
                        if mode == Some(Mode::Once) && failed && !poisoned {
                            return Err(at(&format!("compaction failed again after a single fault: {e}")));
                        }
                        failed = true;
                        if matches!(e, Error::Poisoned { .. }) {
                            poisoned = true;
                        }
                    }
                }
            }
            Step::Add(_) | Step::Delete(_) | Step::Pin(_) | Step::Unpin(_) => {
                let Some(s) = &store else { continue };
                let result = write(s, step);
                match result {
                    Ok(()) if poisoned => return Err(at("a poisoned store acknowledged a write")),
                    Ok(()) => {
                        out.acked.apply(step);
                        if failed && out.after_fault.is_none() {
                            // The first write acknowledged after a fault: it must be durable.
                            out.after_fault = Some((disk.copy(), out.acked.clone()));
                        }
                    }
                    Err(e) => {
                        unexpected(&e)?;
                        if poisoned {
                            // Refused: certainly not written, and without touching the disk.
                            if !matches!(e, Error::Poisoned { .. }) || disk.calls() != before {
                                return Err(at(&format!(
                                    "a poisoned store made {} storage calls for a write and answered {e:?}",
                                    disk.calls() - before
                                )));
                            }
                        } else {
                            if mode == Some(Mode::Once) && failed {
                                return Err(at(&format!("a write failed after the single fault was over: {e}")));
                            }
                            let mut next = out.acked.clone();
                            next.apply(step);
                            out.maybe = Some(next);
                            poisoned = true;
                            failed = true;
                        }
                    }
                }
            }
        }
        if poisoned {
            if let Some(s) = &store {
                probe_poisoned(disk, s).map_err(|e| at(&e))?;
            }
            if mode == Some(Mode::FromOn) {
                return Ok(out);
            }
            // Everything up to the close would be refused in the same way.
            skip_to_close = true;
        }
    }
    Ok(out)
}

/// Runs a write step.
fn write(store: &Store, step: &Step) -> Result<()> {
    match step {
        Step::Add(n) => store
            .add(batches().get(*n).map(|(items, _)| items.clone()).unwrap_or_default())
            .map(drop),
        Step::Delete(id) => store.delete(id).map(drop),
        Step::Pin(name) => store.pin_snapshot(name).map(drop),
        Step::Unpin(name) => store.unpin_snapshot(name).map(drop),
        _ => Ok(()),
    }
}

/// Every kind of write on a poisoned store is refused with `Poisoned` and makes no storage call; a
/// compaction or flush writes nothing either.
fn probe_poisoned(disk: &SimDisk, store: &Store) -> std::result::Result<(), String> {
    type Probe<'a> = Box<dyn Fn() -> Result<()> + 'a>;
    let probes: [(&str, Probe<'_>); 6] = [
        (
            "add",
            Box::new(|| {
                store
                    .add([common::item("probe", common::NOW, "1", json!({}))])
                    .map(drop)
            }),
        ),
        ("delete", Box::new(|| store.delete("doc-1").map(drop))),
        ("pin", Box::new(|| store.pin_snapshot("probe").map(drop))),
        ("unpin", Box::new(|| store.unpin_snapshot("p1").map(drop))),
        ("flush", Box::new(|| store.flush())),
        (
            "register_type",
            Box::new(|| store.register_type(TypeSpec::new("probe_type"))),
        ),
    ];
    for (what, probe) in probes {
        let before = disk.calls();
        match probe() {
            Err(Error::Poisoned { reason }) => {
                if reason.contains("refuses writes") {
                    return Err(format!(
                        "a poisoned store's {what} gives a reason that nests an earlier refusal: {reason}"
                    ));
                }
            }
            other => return Err(format!("a poisoned store's {what} answered {other:?}")),
        }
        if disk.calls() != before {
            return Err(format!("a poisoned store's {what} made a storage call"));
        }
    }
    let before = disk.calls();
    if let Err(e) = store.compact() {
        if !matches!(e, Error::Poisoned { .. }) {
            return Err(format!("a poisoned store's compaction failed with {e}"));
        }
    }
    check_no_write_calls(disk, before)
}

/// No call from `from` on wrote anything.
fn check_no_write_calls(disk: &SimDisk, from: u64) -> std::result::Result<(), String> {
    let writes: Vec<Call> = disk
        .call_log()
        .into_iter()
        .filter(|call| call.index >= from && !is_read(call.kind))
        .collect();
    if writes.is_empty() {
        Ok(())
    } else {
        Err(format!("a poisoned store made write calls: {writes:?}"))
    }
}

fn is_read(kind: CallKind) -> bool {
    matches!(
        kind,
        CallKind::List | CallKind::Len | CallKind::Read | CallKind::OpenRead | CallKind::ReadAt | CallKind::Map
    )
}

/// The state shown must be the acknowledged one, or that plus the write whose failure poisoned the
/// store.
fn check_state(seen: &Model, acked: &Model, maybe: Option<&Model>) -> std::result::Result<(), String> {
    if seen == acked || Some(seen) == maybe {
        return Ok(());
    }
    let lost: Vec<String> = acked
        .items
        .iter()
        .filter(|(id, item)| seen.items.get(*id) != Some(item))
        .map(|(id, item)| format!("{id}@{}", item.version))
        .collect();
    Err(format!(
        "the store shows {}\nacknowledged: {}\nacknowledged items missing or different: {lost:?}\nor with the failed \
         write: {:?}",
        seen.summary(),
        acked.summary(),
        maybe.map(Model::summary),
    ))
}

/// After a write, `set_len` or fsync failed on a file handle, nothing is written to it or synced on it
/// again.
fn check_no_retry(log: &[Call]) -> std::result::Result<(), String> {
    let mut failed_handles: BTreeMap<u64, &Call> = BTreeMap::new();
    for call in log {
        let Some(handle) = call.handle else { continue };
        if !call.kind.writes_file() {
            continue;
        }
        if let Some(failure) = failed_handles.get(&handle) {
            return Err(format!(
                "{:?} on {} after {:?} failed on the same handle (call {}): {call:?}",
                call.kind,
                call.path.display(),
                failure.kind,
                failure.index
            ));
        }
        if call.fault.is_some() {
            failed_handles.insert(handle, call);
        }
    }
    Ok(())
}

fn stray_tmp(disk: &SimDisk) -> Vec<String> {
    disk.file_names(Path::new(DIR))
        .into_iter()
        .filter(|name| name.ends_with(".tmp"))
        .collect()
}

/// Once the faults stop: the store opens, shows what the run allows, verifies and leaves no `.tmp`;
/// with `reopen`, it also closes to one checkpoint and opens again to the same state.
fn check_recovered(disk: &SimDisk, out: &Outcome, what: &str, reopen: bool) -> std::result::Result<(), String> {
    let store = open(disk).map_err(|e| format!("{what}: opening once the faults stop: {e}"))?;
    let seen = observe(&store).map_err(|e| format!("{what}: reading after the reopen: {e}"))?;
    check_state(&seen, &out.acked, out.maybe.as_ref()).map_err(|e| format!("{what}: {e}"))?;
    let report = store.verify().map_err(|e| format!("{what}: verify: {e}"))?;
    if !report.is_ok() {
        return Err(format!("{what}: verify found problems: {:?}", report.problems));
    }
    let stray = stray_tmp(disk);
    if !stray.is_empty() {
        return Err(format!("{what}: temporary files left after opening: {stray:?}"));
    }
    if !reopen {
        return Ok(());
    }
    drop(store);
    let names = disk.file_names(Path::new(DIR));
    let checkpoints = names.iter().filter(|name| name.starts_with("checkpoint-")).count();
    if checkpoints != 1 || names.iter().any(|name| name.ends_with(".tmp")) {
        return Err(format!("{what}: after a clean close the files are {names:?}"));
    }
    let again = open(disk).map_err(|e| format!("{what}: second open: {e}"))?;
    let seen_again = observe(&again).map_err(|e| format!("{what}: reading after the second open: {e}"))?;
    if seen_again != seen {
        return Err(format!(
            "{what}: a second open shows {}, the first {}",
            seen_again.summary(),
            seen.summary()
        ));
    }
    Ok(())
}

/// One faulted run: the workload with the fault armed at call `k`, then the checks once the faults
/// stop. Returns the faulted call (the log entry of call `k`).
fn check_fault(
    steps: &[Step],
    dry_log: &[Call],
    k: u64,
    fault: Fault,
    mode: Mode,
) -> std::result::Result<Call, String> {
    let disk = SimDisk::new();
    disk.record_calls(true);
    disk.fail(k, if mode == Mode::Once { k } else { u64::MAX }, fault);
    let panics = common::store_thread_panics();
    let out = catch_unwind(AssertUnwindSafe(|| run(&disk, steps, Some(mode))))
        .map_err(|panic| format!("the workload panicked: {}", panic_message(&*panic)))??;
    if common::store_thread_panics() != panics {
        return Err("a store thread panicked".into());
    }
    let log = disk.call_log();
    let hit = log
        .iter()
        .find(|call| call.index == k)
        .cloned()
        .ok_or_else(|| format!("the workload made only {} calls: call {k} was never made", log.len()))?;
    if hit.fault != Some(fault) {
        return Err(format!("call {k} did not fail with {fault:?}: {hit:?}"));
    }
    if dry_log
        .get(usize::try_from(k).unwrap_or(usize::MAX))
        .map(|call| (call.kind, &call.path))
        != Some((hit.kind, &hit.path))
    {
        return Err(format!("call {k} is not the same call as in the dry run: {hit:?}"));
    }
    check_no_retry(&log)?;
    disk.clear_faults();
    // A copy that loses power now, keeping what the seed chooses of the unsynced state.
    let crashed = disk.copy().crash(k);
    catch_unwind(AssertUnwindSafe(|| -> std::result::Result<(), String> {
        check_recovered(&disk, &out, "the disk as it is", true)?;
        check_recovered(&crashed, &out, "the disk after a power loss", false)?;
        if let Some((copy, acked)) = &out.after_fault {
            // Everything acknowledged after the fault was durable: a power loss that keeps only
            // synced data and directory entries loses none of it.
            let mid = Outcome {
                acked: acked.clone(),
                ..Outcome::default()
            };
            check_recovered(
                &copy.crash_losing_unsynced(),
                &mid,
                "a power loss right after the first write acknowledged after the fault",
                false,
            )?;
        }
        Ok(())
    }))
    .map_err(|panic| format!("recovery panicked: {}", panic_message(&*panic)))??;
    if common::store_thread_panics() != panics {
        return Err("a store thread panicked during recovery".into());
    }
    Ok(hit)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(not a string)".into())
}

/// What a call touched: the store directory, a segment, a checkpoint, or their temporary files.
fn file_class(path: &Path) -> &'static str {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if path == Path::new(DIR) {
        "directory"
    } else if name.ends_with(".seg.tmp") {
        "segment .tmp"
    } else if name.ends_with(".seg") {
        "segment"
    } else if name.ends_with(".idx.tmp") {
        "checkpoint .tmp"
    } else if name.starts_with("checkpoint-") {
        "checkpoint"
    } else {
        "other"
    }
}

/// The step that call `index` belongs to.
fn step_of(boundaries: &[(u64, &'static str)], index: u64) -> &'static str {
    let after = boundaries.partition_point(|(first, _)| *first <= index);
    boundaries.get(after.saturating_sub(1)).map_or("?", |(_, label)| label)
}

#[test]
fn every_storage_call_of_a_reference_workload_fails_with_eio_enospc_and_a_short_write() {
    common::count_store_thread_panics();
    let started = Instant::now();
    let steps = reference_workload();

    // The dry run: no fault, every call logged.
    let dry = SimDisk::new();
    dry.record_calls(true);
    let out = run(&dry, &steps, None).unwrap_or_else(|e| panic!("dry run: {e}"));
    let calls = dry.calls();
    let log = dry.call_log();
    assert!(out.compaction_rewrote, "the compaction rewrote no segment");
    assert!(
        out.reopened_from_checkpoint,
        "the reopen did not start from a checkpoint"
    );
    let kinds_made: BTreeSet<CallKind> = log.iter().map(|call| call.kind).collect();
    for kind in [
        CallKind::Append,
        CallKind::Allocate,
        CallKind::SyncData,
        CallKind::SyncAll,
        CallKind::SyncDir,
        CallKind::CreateNew,
        CallKind::Create,
        CallKind::Rename,
        CallKind::Remove,
        CallKind::Map,
        CallKind::ReadAt,
        CallKind::Read,
    ] {
        assert!(kinds_made.contains(&kind), "the workload makes no {kind:?} call");
    }
    let sites_made: BTreeSet<(&str, CallKind, &str)> = log
        .iter()
        .map(|call| (step_of(&out.boundaries, call.index), call.kind, file_class(&call.path)))
        .collect();

    // Every call, every fault, both modes, spread over the cores.
    let jobs: Vec<Job> = (0..calls)
        .flat_map(|k| {
            FAULTS
                .iter()
                .flat_map(move |fault| MODES.iter().map(move |mode| (k, *fault, *mode)))
        })
        .collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8));
    let results: Vec<Vec<(Job, std::result::Result<Call, String>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    while let Some(&job) = jobs.get(next.fetch_add(1, Ordering::SeqCst)) {
                        let (k, fault, mode) = job;
                        let result = check_fault(&steps, &log, k, fault, mode);
                        let failed = result.is_err();
                        done.push((job, result));
                        if failed {
                            // Stop every worker: one counterexample is enough.
                            next.store(jobs.len(), Ordering::SeqCst);
                            break;
                        }
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    let mut exercised: BTreeSet<Job> = BTreeSet::new();
    let mut kinds_faulted: BTreeMap<CallKind, u64> = BTreeMap::new();
    let mut sites_faulted: BTreeSet<(&str, CallKind, &str)> = BTreeSet::new();
    for ((k, fault, mode), result) in results.into_iter().flatten() {
        match result {
            Ok(hit) => {
                exercised.insert((k, fault, mode));
                if fault == Fault::Io && mode == Mode::Once {
                    *kinds_faulted.entry(hit.kind).or_default() += 1;
                }
                sites_faulted.insert((step_of(&out.boundaries, k), hit.kind, file_class(&hit.path)));
            }
            Err(e) => {
                let call = log.get(usize::try_from(k).unwrap_or(usize::MAX));
                panic!(
                    "{fault:?} {mode:?} at call {k} of {calls} ({} {:?} {}): {e}",
                    step_of(&out.boundaries, k),
                    call.map(|call| call.kind),
                    call.map(|call| call.path.display().to_string()).unwrap_or_default()
                )
            }
        }
    }

    let elapsed = started.elapsed();
    eprintln!(
        "I/O errors: {calls} storage calls x {} faults x {} modes = {} runs of the reference workload in {elapsed:.1?}",
        FAULTS.len(),
        MODES.len(),
        exercised.len()
    );
    eprintln!(
        "  {} distinct call sites (step, call, file) faulted of {} made:",
        sites_faulted.len(),
        sites_made.len()
    );
    for (step, kind, file) in &sites_faulted {
        eprintln!("    {step:8} {kind:?} {file}");
    }
    eprintln!("  calls by kind: {kinds_faulted:?}");
    let missed: Vec<Job> = (0..calls)
        .flat_map(|k| {
            FAULTS
                .iter()
                .flat_map(move |fault| MODES.iter().map(move |mode| (k, *fault, *mode)))
        })
        .filter(|job| !exercised.contains(job))
        .collect();
    assert!(missed.is_empty(), "runs missed: {missed:?}");
    assert_eq!(
        sites_faulted, sites_made,
        "a call site of the workload was never faulted"
    );
    let kinds: BTreeSet<CallKind> = kinds_faulted.keys().copied().collect();
    assert_eq!(kinds, kinds_made, "a kind of call of the workload was never faulted");
}
