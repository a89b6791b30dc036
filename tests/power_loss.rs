//! Simulated power loss: random workloads (batches under `Durability::Immediate`, `Never` or
//! `Periodic`, deletes, compactions, pins, unpins, flushes, reopens) run on a `SimDisk` whose power is cut after a random number of
//! storage calls (between two operations, or in the middle of one: an append, a sync, a segment
//! rotation, a compaction's rename, a checkpoint, a recovery). The disk then comes back as the seed
//! decides (durable state plus a subset of the unsynced writes, one possibly torn, and a prefix of the
//! unsynced directory changes), the store is reopened on it, and the test proves:
//!
//! - every operation acknowledged (`Ok`) before the cut is there (under `Never` and `Periodic`, every
//!   one before the last `flush` or clean reopen): each item identical, each delete and pin in effect;
//! - the state is a prefix of what was written: exactly the acknowledged operations, plus at most the
//!   one that was in flight at the cut, whole or not at all (no batch half visible); under `Never`
//!   and `Periodic`, operations after the last durable point may be lost, but only as a suffix;
//! - the files form one valid set: opening works, `verify()` finds nothing, no `.tmp` is left, and
//!   each pin's snapshot still shows what it showed when it was taken.
//!
//! The meta-tests switch the file syncs off, and then the directory syncs, and assert that this
//! property then fails: a power-loss suite that cannot fail proves nothing.
//!
//! `PROPTEST_CASES` sets the number of cases (default [`DEFAULT_CASES`]).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ctxlog::storage::SimDisk;
use ctxlog::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use serde_json::json;

const DEFAULT_CASES: u32 = 10_000;
/// Cases a meta-test may run before the broken disk must have been caught.
const META_CASES: u32 = 400;
const DIR: &str = "/sim/store";
/// The period of `Periodic` cases: shorter than a workload (an operation takes tens of microseconds, a
/// case a few milliseconds), so that the writer's timer can sync inside one and cuts can fall before,
/// inside and after those syncs. When they happen is not observable, so the property holds
/// `Periodic` to what it holds `Never` to: everything up to the last `flush` (or clean reopen).
const PERIOD: Duration = Duration::from_millis(1);

#[derive(Debug, Clone)]
enum Op {
    /// One batch: (id number, content size) per item; ids are made distinct within the batch.
    Add(Vec<(u8, u16)>),
    /// A bulk batch of 256 + n % 64 new ids, which also puts every `doc-` id again: a group the
    /// writer applies to the index while its fsync runs.
    Bulk(u8),
    Delete(u8),
    Compact,
    Pin(u8),
    Unpin(u8),
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop::collection::vec((0u8..12, 0u16..700), 1..4).prop_map(Op::Add),
        1 => any::<u8>().prop_map(Op::Bulk),
        2 => (0u8..12).prop_map(Op::Delete),
        1 => Just(Op::Compact),
        1 => (0u8..3).prop_map(Op::Pin),
        1 => (0u8..3).prop_map(Op::Unpin),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

/// A workload and where its power is cut.
#[derive(Debug, Clone)]
struct Case {
    ops: Vec<Op>,
    /// Where the cut falls among the storage calls the workload makes (0 = before the first, 1 =
    /// after the last, which then closes the store cleanly).
    cut: f64,
    /// Chooses what survives of the unsynced state.
    seed: u64,
    /// If set, the power is cut again while the store recovers (and closes) on the crashed disk:
    /// where the second cut falls, and what survives it.
    recovery_cut: Option<(f64, u64)>,
    /// `Immediate` (every `add` durable when it returns), `Never` (durable at `flush`) or
    /// `Periodic(PERIOD)` (durable at `flush`, and at timer syncs the model does not see).
    durability: Durability,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(op(), 1..30),
        0.0f64..=1.0,
        any::<u64>(),
        prop::option::of((0.0f64..=1.0, any::<u64>())),
        prop_oneof![
            3 => Just(Durability::Immediate),
            1 => Just(Durability::Never),
            1 => Just(Durability::Periodic(PERIOD)),
        ],
    )
        .prop_map(|(ops, cut, seed, recovery_cut, durability)| Case {
            ops,
            cut,
            seed,
            recovery_cut,
            durability,
        })
}

/// Which syncs the simulated disk honours.
#[derive(Debug, Clone, Copy)]
struct Syncs {
    files: bool,
    dirs: bool,
}

const HONEST: Syncs = Syncs {
    files: true,
    dirs: true,
};

/// The store's content as the model sees it: id -> the item's current form, and pin -> the items its
/// snapshot shows.
#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    items: BTreeMap<String, ContextItem>,
    pins: BTreeMap<String, BTreeMap<String, ContextItem>>,
}

fn open(disk: &SimDisk, durability: Durability) -> Result<Store> {
    Options::new()
        .storage(Arc::new(disk.clone()))
        .clock(Arc::new(ManualClock::new(common::NOW)))
        .durability(durability)
        .segment_size(4096)
        .auto_compact(false)
        .open(DIR)
        .inspect(|store| {
            // Every store opened, after a cut too, continues its newest segment.
            if let Some(problem) = ctxlog::testing::fuzz::opened_store_problem(store) {
                panic!("{problem}");
            }
        })
}

/// What running the workload wrote and acknowledged.
struct Outcome {
    /// The state after each operation that changed it, in order, from the empty store; the last one
    /// may be that of an operation in flight at the cut (it returned an error).
    states: Vec<Model>,
    /// The first of `states` that recovery may give back: the state of the last acknowledged
    /// operation under `Immediate`, of the last `flush` (or clean reopen) under `Never` and `Periodic`.
    durable: usize,
    /// What the store was doing when the power went off.
    cut_in: &'static str,
}

/// Runs `ops` until the first error (which must come from the cut power), then drops the store.
fn run(disk: &SimDisk, ops: &[Op], durability: Durability) -> std::result::Result<Outcome, String> {
    let immediate = durability == Durability::Immediate;
    let mut states = vec![Model::default()];
    let mut durable = 0;
    let mut cut_in = "";
    let mut note = |what: &'static str| {
        if cut_in.is_empty() && disk.is_powered_off() {
            cut_in = what;
        }
    };
    let cut = |what: &str, e: &Error, states: Vec<Model>, durable: usize, cut_in: &'static str| {
        if disk.is_powered_off() {
            Ok(Outcome {
                states,
                durable,
                cut_in,
            })
        } else {
            Err(format!("{what} failed with the power on: {e}"))
        }
    };
    let mut store = match open(disk, durability) {
        Ok(store) => store,
        Err(e) => return cut("opening", &e, states, durable, "open"),
    };
    note("open");
    for (position, op) in ops.iter().enumerate() {
        let model = states.last().cloned().unwrap_or_default();
        let mut next = model.clone();
        let mut synced = false;
        let result = match op {
            Op::Add(items) => {
                let mut seen = BTreeSet::new();
                let batch: Vec<ContextItem> = items
                    .iter()
                    .filter(|(id, _)| seen.insert(*id))
                    .map(|(id, size)| {
                        let id = format!("doc-{id}");
                        let content = json!({ "op": position, "text": "x".repeat(usize::from(*size)) });
                        common::item(&id, common::NOW, &format!("v{position}"), content)
                    })
                    .collect();
                for item in &batch {
                    next.items.insert(item.id.clone(), common::stored_form(item));
                }
                store.add(batch).map(drop)
            }
            Op::Bulk(n) => {
                let fresh = (0..256 + u64::from(*n % 64)).map(|i| (format!("bulk-{position}-{i}"), 8));
                let again = (0..12).map(|id| (format!("doc-{id}"), 40));
                let batch: Vec<ContextItem> = fresh
                    .chain(again)
                    .map(|(id, size)| {
                        let content = json!({ "op": position, "text": "y".repeat(size) });
                        common::item(&id, common::NOW, &format!("v{position}"), content)
                    })
                    .collect();
                for item in &batch {
                    next.items.insert(item.id.clone(), common::stored_form(item));
                }
                store.add(batch).map(drop)
            }
            Op::Delete(id) => {
                next.items.remove(&format!("doc-{id}"));
                store.delete(&format!("doc-{id}")).map(drop)
            }
            Op::Compact => store.compact().map(drop),
            Op::Pin(n) => {
                let name = format!("pin-{n}");
                if model.pins.contains_key(&name) {
                    continue;
                }
                next.pins.insert(name.clone(), model.items.clone());
                store.pin_snapshot(&name).map(drop)
            }
            Op::Unpin(n) => {
                next.pins.remove(&format!("pin-{n}"));
                store.unpin_snapshot(&format!("pin-{n}")).map(drop)
            }
            Op::Flush => {
                synced = true;
                store.flush()
            }
            Op::Reopen => {
                // Closing syncs the log; an open that works proves the power was still on for it.
                drop(store);
                match open(disk, durability) {
                    Ok(reopened) => {
                        store = reopened;
                        synced = true;
                        Ok(())
                    }
                    Err(e) => {
                        note("reopen");
                        return cut("reopening", &e, states, durable, cut_in);
                    }
                }
            }
        };
        note(match op {
            Op::Add(_) => "add",
            Op::Bulk(_) => "bulk add",
            Op::Delete(_) => "delete",
            Op::Compact => "compact",
            Op::Pin(_) => "pin",
            Op::Unpin(_) => "unpin",
            Op::Flush => "flush",
            Op::Reopen => "reopen",
        });
        let changed = next != model;
        if changed {
            states.push(next);
        }
        match result {
            Ok(()) => {
                if immediate || synced {
                    durable = states.len() - 1;
                }
            }
            Err(e) => {
                drop(store);
                return cut(&format!("{op:?}"), &e, states, durable, cut_in);
            }
        }
    }
    drop(store);
    note("close");
    Ok(Outcome {
        states,
        durable,
        cut_in: if cut_in.is_empty() { "nowhere" } else { cut_in },
    })
}

/// How often each situation came up in the honest run, to show what the cases covered.
static COVERAGE: std::sync::Mutex<BTreeMap<&'static str, u64>> = std::sync::Mutex::new(BTreeMap::new());

fn count(what: &'static str) {
    *COVERAGE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(what)
        .or_default() += 1;
}

/// The state a store shows.
fn observe(store: &Store) -> std::result::Result<Model, String> {
    let items = store
        .get(&ContextQuery::new())
        .map_err(|e| format!("get after recovery: {e}"))?
        .into_iter()
        .map(|item| (item.id.clone(), item))
        .collect();
    let mut pins = BTreeMap::new();
    for info in store.snapshots() {
        let seen = store
            .open_snapshot(&info.name)
            .and_then(|snapshot| snapshot.get(&ContextQuery::new()))
            .map_err(|e| format!("reading pin {:?} after recovery: {e}", info.name))?;
        pins.insert(
            info.name,
            seen.into_iter().map(|item| (item.id.clone(), item)).collect(),
        );
    }
    Ok(Model { items, pins })
}

/// Runs one case with the disk honouring `syncs`; `Err` says how the store broke its promise.
fn check(case: &Case, syncs: Syncs) -> std::result::Result<(), String> {
    let total = calls_of(case)?;
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let cut_after = (case.cut * total as f64) as u64;
    check_cut_after(case, syncs, cut_after, total)
}

/// The storage calls of the whole workload, counted by a dry run, so that the cut can fall anywhere.
fn calls_of(case: &Case) -> std::result::Result<u64, String> {
    let dry = SimDisk::new();
    run(&dry, &case.ops, case.durability)?;
    Ok(dry.calls())
}

/// Runs one case with the power cut after `cut_after` of the workload's `total` storage calls.
fn check_cut_after(case: &Case, syncs: Syncs, cut_after: u64, total: u64) -> std::result::Result<(), String> {
    let disk = SimDisk::new();
    disk.set_sync_files(syncs.files);
    disk.set_sync_dirs(syncs.dirs);
    // Unsynced writes may reach the disk in any order: under `Never` and `Periodic` a lost frame may
    // be followed by one that survived (see tests/unsynced_order.rs).
    disk.set_reorder_unsynced(true);
    disk.cut_power_after(cut_after);
    let outcome = run(&disk, &case.ops, case.durability)?;
    let mut restored = disk.crash(case.seed);
    if let Some((cut, seed)) = case.recovery_cut {
        // Recovery writes too (a truncated tail, a re-created segment, stray files removed, the
        // checkpoint at close): cut the power somewhere in it.
        let dry = restored.copy();
        drop(open(&dry, case.durability));
        let total = dry.calls() - restored.calls();
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        restored.cut_power_after((cut * total as f64) as u64);
        match open(&restored, case.durability) {
            Ok(store) => drop(store),
            Err(e) if restored.is_powered_off() => drop(e),
            Err(e) => return Err(format!("recovery failed with the power on: {e}")),
        }
        restored = restored.crash(seed);
    }

    let store = open(&restored, case.durability)
        .map_err(|e| format!("reopening after the crash (cut after call {cut_after} of {total}): {e}"))?;
    let seen = observe(&store)?;
    if syncs.files && syncs.dirs {
        count(match case.durability {
            Durability::Immediate => "durability: Immediate",
            Durability::Never => "durability: Never",
            _ => "durability: Periodic",
        });
        count(match outcome.cut_in {
            "open" => "cut in: open",
            "add" => "cut in: add",
            "bulk add" => "cut in: bulk add",
            "delete" => "cut in: delete",
            "compact" => "cut in: compact",
            "pin" => "cut in: pin",
            "unpin" => "cut in: unpin",
            "flush" => "cut in: flush",
            "reopen" => "cut in: close or reopen",
            "close" => "cut in: final close",
            _ => "cut in: nowhere (after the last call)",
        });
        let recovery = store.stats().recovery;
        if recovery.truncated_bytes > 0 {
            count("recovery: torn tail truncated");
        }
        if recovery.removed_torn_segment {
            count("recovery: torn new segment removed");
        }
        if recovery.removed_temporary_files > 0 {
            count("recovery: stray .tmp removed");
        }
        if recovery.checkpoint_seq.is_some() {
            count("recovery: from a checkpoint");
        }
        if recovery.checkpoint_rejected.is_some() {
            count("recovery: checkpoint rejected, full replay");
        }
        if case.recovery_cut.is_some() {
            count("second cut during recovery");
        }
        if outcome.states.get(outcome.durable) != Some(&seen) {
            count("recovered more than the durable state");
        }
    }
    let allowed = outcome.states.get(outcome.durable..).unwrap_or_default();
    if !allowed.contains(&seen) {
        let written = outcome.states.iter().position(|state| *state == seen);
        return Err(format!(
            "cut after call {cut_after} of {total}: recovered state is not one that the acknowledged operations \
             allow (state {written:?} of {} written, durable from {})\n recovered: {:?}\n durable: {:?}",
            outcome.states.len(),
            outcome.durable,
            summary(&seen),
            outcome.states.get(outcome.durable).map(summary),
        ) + &format!(
            "\n written: {:?}",
            outcome.states.iter().map(summary).collect::<Vec<_>>()
        ));
    }
    let report = store.verify().map_err(|e| format!("verify after recovery: {e}"))?;
    if !report.is_ok() {
        return Err(format!("verify after recovery found problems: {:?}", report.problems));
    }
    let stray: Vec<String> = restored
        .file_names(Path::new(DIR))
        .into_iter()
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    if !stray.is_empty() {
        return Err(format!("temporary files left after recovery: {stray:?}"));
    }
    // Closing and opening again (from the checkpoint written at close) must show the same state.
    drop(store);
    let again = open(&restored, case.durability).map_err(|e| format!("second reopen: {e}"))?;
    let seen_again = observe(&again)?;
    if seen_again != seen {
        return Err(format!(
            "a second reopen shows another state: {:?} then {:?}",
            summary(&seen),
            summary(&seen_again)
        ));
    }
    // A clean close leaves one set of files: the segments and a single checkpoint.
    drop(again);
    let names = restored.file_names(Path::new(DIR));
    let checkpoints = names.iter().filter(|name| name.starts_with("checkpoint-")).count();
    if checkpoints != 1 || names.iter().any(|name| name.ends_with(".tmp")) {
        return Err(format!("after a clean close the files are {names:?}"));
    }
    Ok(())
}

/// Ids with their versions, and pins with the ids they see: short enough to read in a failure.
fn summary(model: &Model) -> (Vec<String>, Vec<String>) {
    let items = model
        .items
        .values()
        .map(|item| format!("{}@{}", item.id, item.version))
        .collect();
    let pins = model
        .pins
        .iter()
        .map(|(name, items)| format!("{name}:{}", items.len()))
        .collect();
    (items, pins)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Threads the honest run's cases are split over, each with a runner of its own: one case is
/// single-threaded work (the store's threads mostly wait on each other), so one runner would leave
/// the other cores idle.
fn runners(cases: u32) -> u32 {
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    u32::try_from(cores).unwrap_or(u32::MAX).clamp(1, 4).min(cases.max(1))
}

#[test]
fn acknowledged_batches_survive_power_loss() {
    let started = std::time::Instant::now();
    let total = cases();
    let threads = runners(total);
    let done = std::sync::atomic::AtomicU32::new(0);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let done = &done;
                scope.spawn(move || {
                    let base = Config::default();
                    // A fixed seed (PROPTEST_RNG_SEED) gives each runner its own, derived from it.
                    let rng_seed = match base.rng_seed {
                        RngSeed::Fixed(seed) => RngSeed::Fixed(seed.wrapping_add(u64::from(thread))),
                        RngSeed::Random => RngSeed::Random,
                    };
                    let mut runner = TestRunner::new(Config {
                        cases: total / threads + u32::from(thread < total % threads),
                        failure_persistence: None,
                        rng_seed,
                        ..base
                    });
                    let result = runner.run(&case(), |case| {
                        let done = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        if done.is_multiple_of(100_000) {
                            eprintln!("power loss: {done} cases in {:.1?}", started.elapsed());
                        }
                        check(&case, HONEST).map_err(TestCaseError::fail)
                    });
                    result.err().map(|e| format!("runner {thread}: {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|handle| handle.join().expect("a power-loss runner panicked outside a case"))
            .collect()
    });
    if let Some(first) = failures.first() {
        panic!("{first}");
    }
    let ran = done.into_inner();
    eprintln!(
        "power loss: {ran} cases on {threads} threads in {:.1?}",
        started.elapsed()
    );
    assert_eq!(ran, total, "every case ran once");
    for (what, cases) in COVERAGE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
    {
        eprintln!("  {what}: {cases}");
    }
}

/// Runs the property on a disk that does not honour `syncs` and returns after how many cases it
/// failed, if it did.
fn first_failure(syncs: Syncs) -> Option<u32> {
    let mut runner = TestRunner::new(Config {
        cases: META_CASES,
        failure_persistence: None,
        max_shrink_iters: 0,
        ..Config::default()
    });
    let count = std::cell::Cell::new(0u32);
    let result = runner.run(&case(), |case| {
        count.set(count.get() + 1);
        check(&case, syncs).map_err(TestCaseError::fail)
    });
    match result {
        Err(TestError::Fail(reason, case)) => {
            eprintln!("caught after {} cases: {reason}\n{case:?}", count.get());
            Some(count.get())
        }
        Err(TestError::Abort(reason)) => panic!("aborted: {reason}"),
        Ok(()) => None,
    }
}

#[test]
fn the_suite_fails_without_file_syncs() {
    let caught = first_failure(Syncs {
        files: false,
        dirs: true,
    });
    assert!(
        caught.is_some(),
        "with sync_data / sync_all off, {META_CASES} cases found no loss"
    );
}

#[test]
fn the_suite_fails_without_directory_syncs() {
    let caught = first_failure(Syncs {
        files: true,
        dirs: false,
    });
    assert!(
        caught.is_some(),
        "with the directory sync off, {META_CASES} cases found no loss"
    );
}

/// The `Periodic` cases are not `Never` cases under another name: with neither a flush nor a close, a
/// batch becomes durable on its own once the writer's timer has fired, while under `Never` it stays
/// unsynced.
#[test]
fn periodic_syncs_on_its_timer_and_never_does_not() {
    let durable_now = |disk: &SimDisk| -> bool {
        let durable = disk.copy().crash_losing_unsynced();
        let store = open(&durable, Durability::Never).expect("opening what is durable");
        let found = store.resolve(["doc-1"]).expect("resolve");
        matches!(found.first(), Some(Resolution::Found(_)))
    };
    for durability in [Durability::Periodic(PERIOD), Durability::Never] {
        let disk = SimDisk::new();
        let store = open(&disk, durability).expect("open");
        store
            .add([common::item("doc-1", common::NOW, "1", json!({ "text": "timer" }))])
            .expect("add");
        let started = std::time::Instant::now();
        let mut synced = durable_now(&disk);
        while !synced && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(PERIOD * 5);
            synced = durable_now(&disk);
            if durability == Durability::Never && started.elapsed() > PERIOD * 50 {
                break;
            }
        }
        assert_eq!(
            synced,
            durability != Durability::Never,
            "{durability:?}: durable without a flush after {:?}",
            started.elapsed()
        );
        drop(store);
    }
}

/// Found by this suite. Under `Durability::Never`, compaction retired a version because a later,
/// published but not yet synced, batch superseded it, and made that rewrite durable (rename and
/// directory sync) before the log was synced: a power cut in between kept the rewrite and lost the
/// newer version, and the id vanished from the store. Here the power is cut after every call of a
/// compaction in turn, everything unsynced is lost, and the id must still be there in one of its
/// versions.
#[test]
fn compaction_never_outlives_the_log_that_superseded_what_it_reclaims() {
    let run = |cut: u64| -> (SimDisk, bool) {
        let disk = SimDisk::new();
        let store = open(&disk, Durability::Never).expect("open");
        let text = common::incompressible("fill", 900);
        store
            .add([common::item("doc-x", common::NOW, "1", json!({ "text": text }))])
            .expect("add");
        for n in 0..4 {
            store
                .add([common::item(
                    &format!("fill-{n}"),
                    common::NOW,
                    "1",
                    json!({ "text": text }),
                )])
                .expect("add");
        }
        store.flush().expect("flush");
        // doc-x@1 now lies in a sealed segment; its successor waits unsynced in the active one.
        store
            .add([common::item("doc-x", common::NOW, "2", json!({ "text": "new" }))])
            .expect("add");
        disk.cut_power_after(cut);
        let compacted = store.compact().is_ok();
        drop(store);
        (disk, compacted)
    };
    let mut cut = 0;
    loop {
        let (disk, finished) = run(cut);
        let store = open(&disk.crash_losing_unsynced(), Durability::Never).expect("reopen");
        let found = store.resolve(["doc-x"]).expect("resolve");
        assert!(
            matches!(found.first(), Some(Resolution::Found(item)) if item.version == "1" || item.version == "2"),
            "power cut after call {cut} of the compaction: doc-x is {found:?}"
        );
        if finished {
            break;
        }
        cut += 1;
    }
    assert!(cut > 5, "the compaction made only {cut} storage calls");
}

/// A fixed workload that goes through every kind of operation (two segment rotations, a delete, a
/// pin, a compaction that rewrites and checkpoints, a reopen, an unpin), with the power cut after
/// each of its storage calls in turn, each with a few seeds for what survives.
#[test]
fn a_cut_after_every_storage_call_of_a_reference_workload() {
    let mut ops: Vec<Op> = (0u8..6).map(|n| Op::Add(vec![(n, 600), (n + 6, 300)])).collect();
    ops.extend([
        Op::Delete(2),
        Op::Pin(0),
        Op::Add(vec![(0, 500), (1, 500)]),
        Op::Add(vec![(0, 10)]),
        Op::Compact,
        Op::Reopen,
        Op::Unpin(0),
        Op::Add(vec![(3, 100), (4, 100), (5, 100)]),
        Op::Compact,
    ]);
    for durability in [Durability::Immediate, Durability::Never] {
        let mut case = Case {
            ops: ops.clone(),
            cut: 0.0,
            seed: 0,
            recovery_cut: None,
            durability,
        };
        let total = calls_of(&case).expect("dry run");
        assert!(total > 80, "the reference workload made only {total} storage calls");
        for cut_after in 0..=total {
            for seed in 0..4 {
                case.seed = seed;
                if let Err(e) = check_cut_after(&case, HONEST, cut_after, total) {
                    panic!("{durability:?}, seed {seed}: {e}");
                }
            }
        }
        eprintln!("reference workload, {durability:?}: cut after each of {total} storage calls, 4 seeds each");
    }
}
