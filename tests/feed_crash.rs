//! SIGKILL crash test of the change feed's promise, "every durable change, in order, exactly once":
//! a child process (this test binary, re-executed) runs two writer threads that add and delete items
//! under `Durability::Immediate`, printing each operation only after it returned Ok, and a subscriber
//! thread that appends every change it receives to a record file of its own (`received.log`, one JSON
//! line per change, beside the store). The parent kills the child with SIGKILL at a random moment and
//! starts the next one on the same store and the same record file: its subscriber resumes after the
//! last seq the file holds whole. At the end the parent resumes the subscriber once more, lets it
//! catch up to `last_seq()`, and checks that the record is exactly `changes(0)`, field by field, each
//! change once and in order, and that every writer's changes are a prefix of the operations it
//! performed holding at least every acknowledged one, with the acknowledged seqs.
//!
//! The resuming client's rule: a kill may fall between the lines of one batch (a batch of several
//! items is several changes of one seq), and a change does not say whether it is its batch's last.
//! So on resuming, the subscriber drops a torn last line and every line of the last seq it holds,
//! and subscribes after the seq before: that batch is delivered again, whole.
//!
//! No compaction: with no history retained (there is no `Options::history_retention` in this build,
//! and its default is zero), compaction may drop change records a subscriber has not yet recorded and
//! move `history_start()` past them, and resuming would then rightly be `HistoryCompacted`. So the
//! store runs with `auto_compact(false)` and nothing calls `compact()`: the test is about resuming,
//! and every seq it resumes after is kept.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxlog::{Change, ChangeFilter, ContextItem, Durability, Error, ManualClock, Options, Scope, Store};
use serde_json::json;

/// Set (to the directory holding the store and the record file) only in the child process.
const CHILD_DIR_ENV: &str = "CTXLOG_FEED_CRASH_CHILD_DIR";
/// The run number of the child, so that its ids are new.
const CHILD_RUN_ENV: &str = "CTXLOG_FEED_CRASH_CHILD_RUN";
/// Overrides the number of children the parent kills.
const ITERATIONS_ENV: &str = "CTXLOG_FEED_CRASH_ITERATIONS";
const DEFAULT_ITERATIONS: u64 = 30;
/// The name of the child test function, for `--exact`.
const CHILD_TEST: &str = "feed_crash_child";
/// Writer threads per child.
const WRITERS: u64 = 2;
/// Small, so that segments roll while the children write.
const SEGMENT_SIZE: u64 = 16 << 10;
const CLOCK_START: i64 = 1_700_000_000;
const SIGKILL: i32 = 9;
/// Small, so that a slow subscriber lags and resumes after `Lagged`.
const SUBSCRIPTION_BUFFER: usize = 500;
const STORE_DIR: &str = "store";
const RECORD_FILE: &str = "received.log";
/// How long the final catch-up may take.
const PATIENCE: Duration = Duration::from_secs(30);

fn open_store(dir: &Path) -> Store {
    Options::new()
        .durability(Durability::Immediate)
        .segment_size(SEGMENT_SIZE)
        .auto_compact(false)
        .subscription_buffer(SUBSCRIPTION_BUFFER)
        .clock(Arc::new(ManualClock::new(CLOCK_START)))
        .open(dir)
        .unwrap_or_else(|e| panic!("opening the store in {}: {e}", dir.display()))
}

fn item_id(run: u64, writer: u64, k: u64) -> String {
    format!("r{run}-w{writer}-{k}")
}

/// The (run, writer) whose script an id belongs to.
fn owner(id: &str) -> Option<(u64, u64)> {
    let mut parts = id.split('-');
    let run = parts.next()?.strip_prefix('r')?.parse().ok()?;
    let writer = parts.next()?.strip_prefix('w')?.parse().ok()?;
    let _k: u64 = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((run, writer))
}

fn written_item(run: u64, writer: u64, k: u64, version: u64) -> ContextItem {
    ContextItem::new(
        item_id(run, writer, k),
        if k.is_multiple_of(2) {
            "document_chunk"
        } else {
            "tool_result"
        },
        json!({
            "run": run,
            "writer": writer,
            "k": k,
            "version": version,
            "text": format!("feed crash payload of run {run}, writer {writer}, id {k}, version {version}: {}",
                "padding so that segments roll ".repeat(4)),
        }),
        "feed-crash-test",
        CLOCK_START,
        version.to_string(),
        Scope::GlobalWritable,
    )
}

/// One operation of a writer: one batch, so one seq.
enum Op {
    Add(Vec<ContextItem>),
    Delete(String),
}

impl Op {
    /// The changes the feed must hold for it, at `seq`.
    fn changes(&self, seq: u64) -> Vec<Change> {
        match self {
            Op::Add(items) => items.iter().map(|item| common::added(item, seq, CLOCK_START)).collect(),
            Op::Delete(id) => vec![Change::Deleted {
                seq,
                committed_at: CLOCK_START,
                id: id.clone(),
                scope: Scope::GlobalWritable,
            }],
        }
    }
}

/// The operations writer `writer` of run `run` performs, in order: the same in the child, which
/// performs them, and in the parent, which checks the feed against them. Mixed: batches of 1-3 items
/// that add new ids or new versions of ids it holds, and deletes of ids it holds (never of an id it
/// does not hold, so every delete is a change; a deleted id is not used again).
struct Script {
    run: u64,
    writer: u64,
    rng: fastrand::Rng,
    next_k: u64,
    /// Ids it holds: (k, latest version).
    live: Vec<(u64, u64)>,
}

impl Script {
    fn new(run: u64, writer: u64) -> Self {
        Script {
            run,
            writer,
            rng: fastrand::Rng::with_seed(
                run.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (writer + 1).wrapping_mul(0x9E37_79B9),
            ),
            next_k: 0,
            live: Vec::new(),
        }
    }

    /// The index of one of the ids it holds (there must be one).
    fn pick_live(&mut self) -> usize {
        let at = self.rng.u64(0..=self.live.len() as u64 - 1);
        usize::try_from(at).expect("an index below the length")
    }

    fn next_op(&mut self) -> Op {
        if !self.live.is_empty() && self.rng.u64(0..=99) < 20 {
            let at = self.pick_live();
            let (k, _) = self.live.swap_remove(at);
            return Op::Delete(item_id(self.run, self.writer, k));
        }
        let size = self.rng.u64(1..=3);
        let mut touched = HashSet::new();
        let mut items = Vec::new();
        for _ in 0..size {
            let reuse = (!self.live.is_empty() && self.rng.u64(0..=99) < 40)
                .then(|| self.pick_live())
                .filter(|at| !touched.contains(&self.live[*at].0));
            let (k, version) = match reuse {
                Some(at) => {
                    self.live[at].1 += 1;
                    self.live[at]
                }
                None => {
                    let k = self.next_k;
                    self.next_k += 1;
                    self.live.push((k, 1));
                    (k, 1)
                }
            };
            touched.insert(k);
            items.push(written_item(self.run, self.writer, k, version));
        }
        Op::Add(items)
    }
}

/// Prints one whole line on stdout and flushes it.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("child: writing stdout");
    out.flush().expect("child: flushing stdout");
}

/// The record file as a resuming subscriber finds it: the changes of its complete lines, and the
/// byte length of each prefix of them (`ends[i]`: where line `i` ends).
fn read_record(path: &Path) -> (Vec<Change>, Vec<u64>, u64) {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("reading {}: {e}", path.display()),
    };
    let mut changes = Vec::new();
    let mut ends = Vec::new();
    let mut at = 0;
    while let Some(newline) = bytes[at..].iter().position(|b| *b == b'\n') {
        let line = &bytes[at..at + newline];
        let change: Change = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!(
                "line {} of the record is no change ({e}): {:?}",
                changes.len() + 1,
                String::from_utf8_lossy(line)
            )
        });
        changes.push(change);
        at += newline + 1;
        ends.push(at as u64);
    }
    (changes, ends, bytes.len() as u64)
}

/// What a subscriber did on resuming.
struct Resumed {
    file: File,
    /// The seq it subscribes after (0 for an empty record).
    after: u64,
    /// Changes kept.
    kept: usize,
    /// Whole lines dropped (those of the last seq, maybe a partial batch).
    dropped: usize,
    /// Bytes of a torn last line cut.
    torn: u64,
}

/// Opens the record file for appending, cut back to the changes of every seq but its last (which may
/// be a batch recorded in part) and without a torn last line.
fn resume_record(path: &Path) -> Resumed {
    let (changes, ends, len) = read_record(path);
    let last = changes.last().and_then(Change::seq);
    let kept = changes
        .iter()
        .rposition(|change| change.seq() != last)
        .map_or(0, |i| i + 1);
    let after = kept
        .checked_sub(1)
        .map_or(0, |i| changes[i].seq().expect("recorded changes have seqs"));
    let keep_bytes = kept.checked_sub(1).map_or(0, |i| ends[i]);
    let complete = ends.last().copied().unwrap_or(0);
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    file.set_len(keep_bytes).expect("cutting the record back");
    Resumed {
        file,
        after,
        kept,
        dropped: changes.len() - kept,
        torn: len - complete,
    }
}

/// How long the subscriber of run `run` works on each change it recorded: two runs in three it is
/// slow (1 ms a change, behind the writers, so it replays from the log, lags, and is killed between
/// the lines of a batch), the third it keeps up with them (live changes).
fn subscriber_pause(run: u64) -> Duration {
    if run.is_multiple_of(3) {
        Duration::ZERO
    } else {
        Duration::from_millis(1)
    }
}

/// The subscriber: resumes the record file in `root`, then appends each change it receives, one
/// whole line per `write_all` (no fsync: a killed process leaves its writes in the page cache).
/// With `until`, returns once it recorded that seq and the feed has nothing more for a moment;
/// without, runs until the process is killed. `report` is told how it resumed.
fn subscribe_and_record(store: &Store, root: &Path, until: Option<u64>, pause: Duration, report: &dyn Fn(String)) {
    let mut resumed = resume_record(&root.join(RECORD_FILE));
    report(format!(
        "SUB {} {} {} {}",
        resumed.after, resumed.kept, resumed.dropped, resumed.torn
    ));
    let mut after = resumed.after;
    let mut last = after;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut subscription = store
            .subscribe(ChangeFilter::new().after(after))
            .unwrap_or_else(|e| panic!("subscribing after {after}: {e}"));
        loop {
            match subscription.recv_timeout(Duration::from_millis(100)) {
                Ok(Some(change)) => {
                    let seq = change
                        .seq()
                        .unwrap_or_else(|| panic!("a change without a seq: {change:?}"));
                    assert!(seq > after, "subscribed after {after}, received {change:?}");
                    assert!(seq >= last, "received seq {seq} after seq {last}: {change:?}");
                    let mut line = change.to_json();
                    line.push('\n');
                    resumed
                        .file
                        .write_all(line.as_bytes())
                        .expect("appending to the record");
                    last = seq;
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                }
                Ok(None) => {
                    if let Some(until) = until {
                        if last >= until {
                            return;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "the subscriber reached seq {last} of {until}"
                        );
                    }
                }
                Err(Error::Lagged { resume_after }) => {
                    // It ends a batch whole before it reports the lag: resume after what it holds.
                    assert_eq!(
                        resume_after, last,
                        "lagged with resume_after {resume_after}, recorded up to {last}"
                    );
                    report(format!("LAG {resume_after}"));
                    after = resume_after;
                    break;
                }
                Err(e) => panic!("the subscription failed after seq {last}: {e}"),
            }
        }
    }
}

/// The child: a subscriber and `WRITERS` writers, until it is killed. Without the environment
/// variable (an ordinary test run) it does nothing.
#[test]
fn feed_crash_child() {
    let Some(root) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let run: u64 = std::env::var(CHILD_RUN_ENV)
        .expect("the child needs its run number")
        .parse()
        .expect("run number");
    // A panic on any thread ends the child at once, by itself: the parent then reports it.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        std::process::exit(101);
    }));
    let root = PathBuf::from(root);
    let store = open_store(&root.join(STORE_DIR));
    let mut threads = Vec::new();
    {
        let store = store.clone();
        threads.push(std::thread::spawn(move || {
            subscribe_and_record(&store, &root, None, subscriber_pause(run), &|line| say(&line));
        }));
    }
    for writer in 0..WRITERS {
        let store = store.clone();
        threads.push(std::thread::spawn(move || {
            let mut script = Script::new(run, writer);
            for op in 0u64.. {
                match script.next_op() {
                    Op::Add(items) => {
                        let count = items.len();
                        let outcomes = store.add(items).expect("child: add");
                        assert_eq!(outcomes.len(), count, "child: one outcome per item");
                        let seq = common::batch_seq(&outcomes);
                        say(&format!("ACK {writer} {op} add {seq}"));
                    }
                    Op::Delete(id) => {
                        let existed = store.delete(&id).expect("child: delete");
                        say(&format!("ACK {writer} {op} del {existed}"));
                    }
                }
            }
        }));
    }
    for thread in threads {
        thread.join().expect("child thread");
    }
}

/// One acknowledged operation: its writer's seq for an add, what `delete` returned for a delete.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ack {
    Add(u64),
    Delete(bool),
}

/// What a child printed.
#[derive(Default)]
struct ChildOutput {
    /// Per writer, its acknowledged operations in order.
    acks: BTreeMap<u64, Vec<Ack>>,
    /// How its subscriber resumed: after, kept, dropped, torn.
    resumed: Option<(u64, usize, usize, u64)>,
    /// Times its subscriber lagged and subscribed again.
    lags: u64,
}

/// Reads complete lines; a last line cut short by the kill is not an acknowledgement.
fn read_output(stdout: impl Read) -> Result<ChildOutput, String> {
    let mut output = ChildOutput::default();
    for text in common::complete_lines(stdout) {
        // libtest may print "test feed_crash_child ... " in front of the first line.
        if let Some(at) = text.find("ACK ") {
            let words: Vec<&str> = text[at + 4..].split_whitespace().collect();
            let [writer, op, what, value] = words[..] else {
                return Err(format!("malformed line {text:?}"));
            };
            let writer: u64 = writer.parse().map_err(|_| format!("malformed line {text:?}"))?;
            let op: usize = op.parse().map_err(|_| format!("malformed line {text:?}"))?;
            let ack = match (what, value.parse::<u64>(), value.parse::<bool>()) {
                ("add", Ok(seq), _) => Ack::Add(seq),
                ("del", _, Ok(existed)) => Ack::Delete(existed),
                _ => return Err(format!("malformed line {text:?}")),
            };
            let acks = output.acks.entry(writer).or_default();
            if acks.len() != op {
                return Err(format!("writer {writer} acknowledged op {op} after {} ops", acks.len()));
            }
            acks.push(ack);
        } else if let Some(at) = text.find("SUB ") {
            let words: Vec<u64> = text[at + 4..]
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| format!("malformed line {text:?}"))?;
            let [after, kept, dropped, torn] = words[..] else {
                return Err(format!("malformed line {text:?}"));
            };
            let count = |n: u64| usize::try_from(n).map_err(|_| format!("malformed line {text:?}"));
            output.resumed = Some((after, count(kept)?, count(dropped)?, torn));
        } else if text.contains("LAG ") {
            output.lags += 1;
        }
    }
    Ok(output)
}

/// Each recorded change once, in seq order: seqs never decrease and no (seq, id) comes twice.
fn check_record_order(record: &[Change], context: &str) {
    let mut seen = HashSet::new();
    let mut last = 0;
    for (i, change) in record.iter().enumerate() {
        let seq = change
            .seq()
            .unwrap_or_else(|| panic!("{context}: line {} has no seq: {change:?}", i + 1));
        assert!(seq >= last, "{context}: line {} has seq {seq} after seq {last}", i + 1);
        let id = change
            .id()
            .unwrap_or_else(|| panic!("{context}: line {} has no id: {change:?}", i + 1));
        assert!(
            seen.insert((seq, id.to_owned())),
            "{context}: line {} records {change:?} a second time",
            i + 1
        );
        last = seq;
    }
}

/// Checks `feed` (the store's whole feed) against the scripts of runs `0..runs` and what their
/// children acknowledged: every change belongs to one of them; each writer's changes, grouped by
/// seq in feed order, are exactly its first operations, at least all it acknowledged and at most
/// one more (the one in flight when it was killed), at the seqs it acknowledged.
fn check_feed_against_acks(feed: &[Change], acks: &BTreeMap<(u64, u64), Vec<Ack>>, runs: u64, context: &str) {
    let mut by_writer: BTreeMap<(u64, u64), Vec<Vec<Change>>> = BTreeMap::new();
    for change in feed {
        let id = change
            .id()
            .unwrap_or_else(|| panic!("{context}: a change without an id: {change:?}"));
        let key = owner(id).unwrap_or_else(|| panic!("{context}: a change of an unknown id: {change:?}"));
        assert!(
            key.0 < runs && key.1 < WRITERS,
            "{context}: a change of no child's: {change:?}"
        );
        let groups = by_writer.entry(key).or_default();
        match groups.last_mut() {
            Some(group) if group[0].seq() == change.seq() => group.push(change.clone()),
            _ => groups.push(vec![change.clone()]),
        }
    }
    for run in 0..runs {
        for writer in 0..WRITERS {
            let key = (run, writer);
            let acked = acks.get(&key).map_or(&[][..], Vec::as_slice);
            let groups = by_writer.remove(&key).unwrap_or_default();
            assert!(
                groups.len() == acked.len() || groups.len() == acked.len() + 1,
                "{context}: writer {writer} of run {run} acknowledged {} operations, the feed holds {}",
                acked.len(),
                groups.len()
            );
            let mut script = Script::new(run, writer);
            for (op, group) in groups.iter().enumerate() {
                let seq = group[0].seq().expect("grouped changes have seqs");
                let expected = script.next_op();
                assert_eq!(
                    group,
                    &expected.changes(seq),
                    "{context}: operation {op} of writer {writer} of run {run} is not in the feed as performed"
                );
                match (acked.get(op), &expected) {
                    (None, _) => {}
                    (Some(Ack::Add(acked_seq)), Op::Add(_)) => assert_eq!(
                        *acked_seq, seq,
                        "{context}: operation {op} of writer {writer} of run {run} was acknowledged at another seq"
                    ),
                    (Some(Ack::Delete(existed)), Op::Delete(id)) => {
                        assert!(*existed, "{context}: deleting {id}, which it held, returned false");
                    }
                    (Some(ack), _) => {
                        panic!("{context}: operation {op} of writer {writer} of run {run} acknowledged as {ack:?}")
                    }
                }
            }
        }
    }
    assert!(
        by_writer.is_empty(),
        "{context}: changes of unknown writers: {by_writer:?}"
    );
}

#[test]
fn sigkilled_subscriber_resumes_with_exactly_the_acknowledged_changes() {
    if std::env::var_os(CHILD_DIR_ENV).is_some() {
        return;
    }
    let iterations: u64 = std::env::var(ITERATIONS_ENV)
        .ok()
        .map(|v| v.parse().expect("CTXLOG_FEED_CRASH_ITERATIONS must be a number"))
        .unwrap_or(DEFAULT_ITERATIONS);
    let root = tempfile::tempdir().expect("temp dir");
    let record_path = root.path().join(RECORD_FILE);
    let exe = std::env::current_exe().expect("current exe");
    let started = Instant::now();
    let mut acks: BTreeMap<(u64, u64), Vec<Ack>> = BTreeMap::new();
    // Children whose subscriber resumed after a seq above 0 and then recorded more.
    let mut resumed_midway = 0u64;
    let (mut dropped_lines, mut torn_lines, mut silent, mut checks) = (0usize, 0u64, 0u64, 0u64);
    let mut record_len = 0usize;
    let mut lags = 0u64;
    // After each kill: the record's last seq and how many of its changes the record held.
    let mut tails: Vec<(u64, usize)> = Vec::new();

    for run in 0..iterations {
        let delay = Duration::from_millis(fastrand::Rng::with_seed(0xFEED_0000 ^ run).u64(20..=300));
        let spawned = Instant::now();
        let mut command = Command::new(&exe);
        command
            .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, root.path())
            .env(CHILD_RUN_ENV, run.to_string());
        let killed = common::run_until_killed(command, spawned, delay, read_output);
        assert!(
            !killed.ended_early && killed.status.signal() == Some(SIGKILL),
            "run {run}: the child ended by itself ({}) instead of being killed after {delay:?}; stderr:\n{}",
            killed.status,
            killed.stderr
        );
        let output = killed
            .output
            .unwrap_or_else(|e| panic!("run {run}: {e}; stderr:\n{}", killed.stderr));
        let context = format!("run {run}");

        // The record as the kill left it: complete lines in order, once each.
        let (record, _, _) = read_record(&record_path);
        check_record_order(&record, &context);
        if let Some((after, kept, dropped, torn)) = output.resumed {
            assert!(
                kept <= record_len,
                "{context}: the subscriber kept {kept} lines of {record_len}"
            );
            dropped_lines += dropped;
            torn_lines += torn;
            if after > 0 && record.len() > kept {
                resumed_midway += 1;
            }
        }
        record_len = record.len();
        lags += output.lags;
        if let Some(seq) = record.last().and_then(Change::seq) {
            tails.push((seq, record.iter().rev().take_while(|c| c.seq() == Some(seq)).count()));
        }
        if output.acks.values().all(Vec::is_empty) {
            silent += 1;
        }
        for (writer, writer_acks) in output.acks {
            acks.insert((run, writer), writer_acks);
        }

        // Every third run the parent reopens the store (the others leave recovery to the next
        // child): the record is a prefix of the feed, and the feed matches the acknowledgements.
        if run % 3 == 2 {
            let store = open_store(&root.path().join(STORE_DIR));
            let feed = common::feed(&store, 0);
            assert!(
                record.len() <= feed.len() && record[..] == feed[..record.len()],
                "{context}: the record ({} changes) is not a prefix of the feed ({} changes)",
                record.len(),
                feed.len()
            );
            check_feed_against_acks(&feed, &acks, run + 1, &context);
            checks += 1;
        }
    }

    // The last resume, without a kill: the subscriber catches up to the last seq.
    let store = open_store(&root.path().join(STORE_DIR));
    let last_seq = store.last_seq();
    assert_eq!(
        store.history_start().expect("history_start"),
        0,
        "nothing compacted the feed"
    );
    subscribe_and_record(&store, root.path(), Some(last_seq), Duration::ZERO, &|_| {});
    let (record, ends, len) = read_record(&record_path);
    assert_eq!(
        ends.last().copied().unwrap_or(0),
        len,
        "the final record ends with a torn line"
    );
    check_record_order(&record, "final");
    let feed = common::feed(&store, 0);
    assert_eq!(
        record.last().and_then(Change::seq),
        Some(last_seq),
        "the final record does not reach last_seq()"
    );
    assert_eq!(
        record.len(),
        feed.len(),
        "the final record and the feed differ in length"
    );
    for (i, (recorded, fed)) in record.iter().zip(&feed).enumerate() {
        assert_eq!(recorded, fed, "change {i} of the record is not the feed's");
    }
    check_feed_against_acks(&feed, &acks, iterations, "final");
    // Kills that left a batch recorded in part, which the next subscriber had to record again whole.
    let mut per_seq: BTreeMap<u64, usize> = BTreeMap::new();
    for change in &feed {
        *per_seq.entry(change.seq().expect("seq")).or_default() += 1;
    }
    let partial_batches = tails.iter().filter(|(seq, held)| per_seq[seq] > *held).count();

    let acknowledged: usize = acks.values().map(Vec::len).sum();
    println!(
        "feed crash test: {iterations} kills in {:.1?}: {} changes in {last_seq} seqs, {acknowledged} acknowledged \
         operations, {silent} children acknowledged nothing, {resumed_midway} subscribers resumed mid-way and \
         recorded more, {lags} lags, {partial_batches} kills left a batch recorded in part, {dropped_lines} \
         lines of a last seq dropped on resuming, {torn_lines} torn bytes cut, {checks} intermediate checks, \
         {} segments",
        started.elapsed(),
        feed.len(),
        store.stats().segments,
    );
    assert!(
        acknowledged > 0,
        "no child acknowledged anything: the test proves nothing"
    );
    assert!(
        iterations < 20 || partial_batches > 0,
        "no kill left a batch recorded in part: resuming after a partial batch was not tested"
    );
    assert!(
        iterations < 10 || resumed_midway >= 3,
        "only {resumed_midway} subscribers resumed from a non-empty record and recorded more"
    );
}
