//! SIGKILL crash test: a child process (this test binary, re-executed) adds batches under
//! `Durability::Immediate` and prints every id only after its `add` returned Ok; the parent kills it
//! with SIGKILL at a random moment, reopens the store and proves that every acknowledged id is still
//! there with the content it was written with, that every batch survived whole or not at all (and,
//! per child, as a prefix of the batches it wrote), that nothing else was replayed, and that
//! `verify()` finds the store sound. The same store is carried through every iteration, so recovery
//! from one crash is itself crashed into by the next child.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxlog::*;
use serde_json::json;
use sha2::{Digest, Sha256};

/// Set (to the store directory) only in the child process.
const CHILD_DIR_ENV: &str = "CTXLOG_CRASH_CHILD_DIR";
/// The iteration number the child writes under, so that its ids are new.
const CHILD_RUN_ENV: &str = "CTXLOG_CRASH_CHILD_RUN";
/// Overrides the number of iterations of the parent.
const ITERATIONS_ENV: &str = "CTXLOG_CRASH_ITERATIONS";
const DEFAULT_ITERATIONS: u64 = 200;
/// The name of the child test function, for `--exact`.
const CHILD_TEST: &str = "crash_child_writer";
const SEGMENT_SIZE: u64 = 64 << 10;
const CLOCK_START: i64 = 1_700_000_000;
const SIGKILL: i32 = 9;

fn open_store(dir: &Path) -> Result<Store> {
    Options::new()
        .durability(Durability::Immediate)
        .segment_size(SEGMENT_SIZE)
        .clock(Arc::new(ManualClock::new(CLOCK_START)))
        .open(dir)
}

/// How many items batch `batch` of run `run` holds, the same in parent and child: 1..=20, and every
/// eighth batch 300 (a bulk batch, applied to the index while its fsync runs).
fn batch_size(run: u64, batch: u64) -> u64 {
    if batch % 8 == 7 {
        return 300;
    }
    fastrand::Rng::with_seed(run.wrapping_mul(1_000_003) ^ batch.wrapping_mul(0x5851_F42D_4C95_7F2D)).u64(1..=20)
}

fn item_id(run: u64, batch: u64, i: u64) -> String {
    format!("r{run}-b{batch}-{i}")
}

/// Parses `r{run}-b{batch}-{i}`.
fn parse_id(id: &str) -> Option<(u64, u64, u64)> {
    let mut parts = id.split('-');
    let run = parts.next()?.strip_prefix('r')?.parse().ok()?;
    let batch = parts.next()?.strip_prefix('b')?.parse().ok()?;
    let i = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((run, batch, i))
}

/// The item exactly as the child writes it (without its hash).
fn written_item(run: u64, batch: u64, i: u64) -> ContextItem {
    let size = batch_size(run, batch);
    ContextItem::new(
        item_id(run, batch, i),
        "document_chunk",
        json!({
            "run": run,
            "batch": batch,
            "i": i,
            "size": size,
            "text": format!("crash payload of run {run}, batch {batch}, item {i} of {size}"),
        }),
        "crash-test",
        CLOCK_START + i64::try_from(batch).expect("batch fits in i64"),
        "1",
        Scope::GlobalWritable,
    )
}

/// The item as the store must give it back: what was written plus its content hash.
fn stored_item(run: u64, batch: u64, i: u64) -> ContextItem {
    let item = written_item(run, batch, i);
    let digest = Sha256::digest(canonical_json(&item.content));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    item.with_hash(format!("sha256:{hex}"))
}

/// The child: adds batches forever, acknowledging each id on stdout only after `add` returned Ok.
/// Without the environment variable (an ordinary test run) it does nothing.
#[test]
fn crash_child_writer() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let run: u64 = std::env::var(CHILD_RUN_ENV)
        .expect("the child needs its run number")
        .parse()
        .expect("run number");
    let store = open_store(Path::new(&dir)).expect("child: opening the store");
    let stdout = std::io::stdout();
    for batch in 0u64.. {
        let items: Vec<ContextItem> = (0..batch_size(run, batch))
            .map(|i| written_item(run, batch, i))
            .collect();
        let ids: Vec<String> = items.iter().map(|item| item.id.clone()).collect();
        let outcomes = store.add(items).expect("child: add");
        assert_eq!(outcomes.len(), ids.len(), "child: one outcome per item");
        let mut out = stdout.lock();
        for id in &ids {
            writeln!(out, "ACK {id}").expect("child: writing an ack");
        }
        out.flush().expect("child: flushing acks");
    }
}

/// What the parent has established about the runs so far.
#[derive(Default)]
struct History {
    /// For each run: how many of its batches the store holds (always a prefix 0..n).
    batches_present: BTreeMap<u64, u64>,
    /// Batches and items of every run checked so far.
    total_batches: u64,
    total_items: u64,
    /// Every id any child acknowledged.
    acknowledged: u64,
    /// Runs whose child acknowledged nothing (killed before or while opening, or mid-first-add).
    silent_runs: u64,
    /// Torn tails recovery truncated.
    truncations: u64,
    /// Recoveries that cut zeros allocated ahead of the newest segment's appends.
    unwritten_cuts: u64,
    /// Full checks (every stored item read back through `get`).
    full_checks: u64,
}

/// Reads complete `ACK <id>` lines; a last line cut short by the kill is not an acknowledgement.
fn read_acks(stdout: impl Read) -> Vec<String> {
    let mut acks = Vec::new();
    for text in common::complete_lines(stdout) {
        // libtest may print "test crash_child_writer ... " in front of the first line.
        if let Some(at) = text.find("ACK ") {
            acks.push(text[at + 4..].trim_end().to_owned());
        }
    }
    acks
}

/// Resolves every item of batch `batch` of `run`: how many are found (each checked against what was
/// written). Anything but Found or NotFound fails the test.
fn found_in_batch(store: &Store, run: u64, batch: u64, context: &str) -> u64 {
    let size = batch_size(run, batch);
    let ids: Vec<String> = (0..size).map(|i| item_id(run, batch, i)).collect();
    let resolutions = store
        .resolve(&ids)
        .unwrap_or_else(|e| panic!("{context}: resolving batch r{run}-b{batch} failed: {e}"));
    assert_eq!(
        resolutions.len() as u64,
        size,
        "{context}: one resolution per reference"
    );
    let mut found = 0;
    for (i, resolution) in (0..size).zip(resolutions) {
        match resolution {
            Resolution::Found(item) => {
                assert_eq!(
                    item,
                    stored_item(run, batch, i),
                    "{context}: {} resolved to other data",
                    ids[usize::try_from(i).unwrap()]
                );
                found += 1;
            }
            Resolution::NotFound { .. } => {}
            other => panic!("{context}: {} resolves to {other:?}", ids[usize::try_from(i).unwrap()]),
        }
    }
    found
}

/// Reads every stored item back through `get` and checks it against what was written, that every
/// batch is whole, that every run's batches are a prefix, and that earlier runs are unchanged.
fn check_every_item(store: &Store, run: u64, history: &History) {
    let items = store
        .get(&ContextQuery::new())
        .unwrap_or_else(|e| panic!("run {run}: get failed: {e}"));
    let mut batches: BTreeMap<u64, BTreeMap<u64, HashSet<u64>>> = BTreeMap::new();
    for item in &items {
        let (item_run, batch, i) =
            parse_id(&item.id).unwrap_or_else(|| panic!("run {run}: unexpected id {:?} in the store", item.id));
        assert!(item_run <= run, "run {run}: item {:?} of a future run", item.id);
        assert_eq!(
            item,
            &stored_item(item_run, batch, i),
            "run {run}: item {} came back different",
            item.id
        );
        assert!(
            batches.entry(item_run).or_default().entry(batch).or_default().insert(i),
            "run {run}: id {} returned twice",
            item.id
        );
    }
    for (&item_run, run_batches) in &batches {
        for (&batch, members) in run_batches {
            let size = batch_size(item_run, batch);
            assert_eq!(
                members.len() as u64,
                size,
                "run {run}: batch r{item_run}-b{batch} is torn: {} of {size} items present ({members:?})",
                members.len()
            );
        }
        let count = run_batches.len() as u64;
        assert_eq!(
            run_batches.keys().next_back().copied(),
            count.checked_sub(1),
            "run {run}: the batches of run {item_run} are not a prefix: {:?}",
            run_batches.keys().collect::<Vec<_>>()
        );
    }
    for (&earlier, &expected) in &history.batches_present {
        let now = batches.get(&earlier).map_or(0, |b| b.len() as u64);
        assert_eq!(
            now, expected,
            "run {run}: run {earlier} had {expected} batches after its crash, now {now}"
        );
    }
    let runs_with_batches = batches.keys().filter(|r| **r < run).count();
    let runs_known = history.batches_present.values().filter(|n| **n > 0).count();
    assert_eq!(
        runs_with_batches, runs_known,
        "run {run}: batches of unexpected runs are stored"
    );
}

/// Opens the store after the kill of run `run` and checks it; drops the store on return.
fn check_after_crash(dir: &Path, run: u64, acks: &[String], full: bool, history: &mut History) {
    let store = open_store(dir).unwrap_or_else(|e| panic!("run {run}: reopening after SIGKILL failed: {e}"));
    let stats = store.stats();
    if stats.recovery.truncated_bytes > 0 {
        history.truncations += 1;
    }
    if stats.recovery.unwritten_bytes > 0 {
        history.unwritten_cuts += 1;
    }
    let context = format!("run {run}");

    // Every id this child acknowledged resolves, with its content.
    let mut acked_batches = 0u64;
    for id in acks {
        let (ack_run, batch, _) = parse_id(id).unwrap_or_else(|| panic!("{context}: malformed ack {id:?}"));
        assert_eq!(ack_run, run, "{context}: ack {id:?} of another run");
        acked_batches = acked_batches.max(batch + 1);
    }
    let resolutions = store
        .resolve(acks)
        .unwrap_or_else(|e| panic!("{context}: resolve failed: {e}"));
    assert_eq!(resolutions.len(), acks.len());
    for (id, resolution) in acks.iter().zip(resolutions) {
        let (ack_run, batch, i) = parse_id(id).unwrap_or_else(|| panic!("malformed ack {id:?}"));
        match resolution {
            Resolution::Found(item) => assert_eq!(
                item,
                stored_item(ack_run, batch, i),
                "{context}: acknowledged {id} resolved to other data"
            ),
            other => panic!("{context}: acknowledged id {id} resolves to {other:?}"),
        }
    }

    // This run's batches: each whole or absent, a prefix of what the child wrote, at least every
    // acknowledged one (a batch written but not yet acknowledged may have survived too).
    let mut present = 0u64;
    let mut present_items = 0u64;
    loop {
        let size = batch_size(run, present);
        let found = found_in_batch(&store, run, present, &context);
        if found == 0 {
            break;
        }
        assert_eq!(
            found, size,
            "{context}: batch b{present} is torn: {found} of {size} items present"
        );
        present += 1;
        present_items += size;
    }
    for later in present + 1..present + 4 {
        assert_eq!(
            found_in_batch(&store, run, later, &context),
            0,
            "{context}: batch b{later} survived but b{present} did not"
        );
    }
    assert!(
        present >= acked_batches,
        "{context}: {acked_batches} batches acknowledged, only {present} survived"
    );

    // One frame per batch, no deletes: the log holds exactly the batches established, no other frame.
    let expected_items = history.total_items + present_items;
    assert_eq!(stats.items, expected_items, "{context}: stats().items");
    assert_eq!(
        stats.seq,
        history.total_batches + present,
        "{context}: stats().seq is not the number of batches"
    );

    let report = store
        .verify()
        .unwrap_or_else(|e| panic!("{context}: verify failed: {e}"));
    assert!(
        report.is_ok(),
        "{context}: verify found problems: {:?}",
        report.problems
    );
    assert_eq!(
        report.records_checked, expected_items,
        "{context}: verify checked another count"
    );

    if full {
        check_every_item(&store, run, history);
        history.full_checks += 1;
    }

    history.batches_present.insert(run, present);
    history.total_batches += present;
    history.total_items += present_items;
    history.acknowledged += acks.len() as u64;
    if acks.is_empty() {
        history.silent_runs += 1;
    }
    drop(store);
}

#[test]
fn sigkill_never_loses_acknowledged_batches() {
    if std::env::var_os(CHILD_DIR_ENV).is_some() {
        return;
    }
    let iterations: u64 = std::env::var(ITERATIONS_ENV)
        .ok()
        .map(|v| v.parse().expect("CTXLOG_CRASH_ITERATIONS must be a number"))
        .unwrap_or(DEFAULT_ITERATIONS);
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("current exe");
    let started = Instant::now();
    let mut history = History::default();

    for run in 0..iterations {
        let delay = Duration::from_millis(fastrand::Rng::with_seed(0xC0FF_EE00 ^ run).u64(5..=60));
        let spawned = Instant::now();
        let mut command = Command::new(&exe);
        command
            .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, dir.path())
            .env(CHILD_RUN_ENV, run.to_string());
        let killed = common::run_until_killed(command, spawned, delay, read_acks);
        let (acks, errors, early, status) = (killed.output, killed.stderr, killed.ended_early, killed.status);
        assert!(
            !early && status.signal() == Some(SIGKILL),
            "run {run}: the child ended by itself ({status}) instead of being killed after {delay:?}; stderr:\n{errors}"
        );

        // Every item is read back through `get` every tenth run and after the last one; every run
        // checks its own batches, the counts of everything, and `verify()`.
        let full = run % 10 == 9 || run + 1 == iterations;
        check_after_crash(dir.path(), run, &acks, full, &mut history);
    }

    // A final reopen after the last check is clean: the last recovery left nothing to truncate.
    let store = open_store(dir.path()).expect("final reopen");
    let recovery = store.stats().recovery;
    assert_eq!(recovery.truncated_bytes, 0, "a clean reopen truncated bytes");
    assert_eq!(
        recovery.unwritten_bytes, 0,
        "a store closed cleanly left allocated zeros after its newest segment's last frame"
    );
    let stats = store.stats();
    assert_eq!(stats.items, history.total_items, "final reopen: stats().items");
    assert_eq!(stats.seq, history.total_batches, "final reopen: stats().seq");
    println!(
        "crash test: {iterations} iterations in {:.1?}: {} acknowledged ids, {} items stored in {} batches, \
         {} runs acknowledged nothing, {} recoveries truncated a torn tail, {} cut allocated zeros, {} full checks, \
         {} segments",
        started.elapsed(),
        history.acknowledged,
        history.total_items,
        history.total_batches,
        history.silent_runs,
        history.truncations,
        history.unwritten_cuts,
        history.full_checks,
        stats.segments,
    );
    // A killed writer leaves the space it allocated ahead: recovery must have cut it, on real files.
    assert!(
        iterations < 20 || history.unwritten_cuts > 0,
        "no recovery in {iterations} runs cut allocated zeros: the kills did not test them"
    );
    assert!(
        iterations < 20 || history.acknowledged > 0,
        "no child acknowledged anything in {iterations} runs: the test proves nothing"
    );
}
