//! SIGKILL crash test with compaction and checkpoints running: a child process (this test binary,
//! re-executed) churns a store opened with `Durability::Immediate`, 32 KiB segments,
//! `auto_compact(true)` and a `ManualClock` that it advances by 30 s before every operation. It adds
//! batches of new versions of a small pool of ids (some with a TTL), deletes ids, pins and unpins
//! snapshots, holds live snapshot handles for a while (checking in-process that their digest never
//! changes), and calls `compact()` every few operations, so that segments are rewritten
//! (`NNNNNNNN.seg.tmp` then rename) and checkpoints are installed while the child may be killed.
//!
//! The child prints, each on its own flushed line: `CLOCK t` before it sets its clock to `t` (so the
//! parent knows an upper bound of every clock the child's compactions ran at), `BEGIN <op>` before an
//! operation (so the parent knows the one operation that may be in flight), and `ACK <op> ...` only
//! after the operation returned Ok (with what it returned: sequence numbers, content hashes, delete
//! and unpin answers, the pinned snapshot's digest).
//!
//! The parent kills the child with SIGKILL at a random moment, replays the acknowledged operations
//! into an exact model (checking every answer the child printed against it), decides from the
//! reopened store's sequence number whether the one in-flight operation happened (each writing
//! operation is exactly one frame, compaction writes none), and checks, at the child's last clock:
//! every id resolves as the model says (Found with identical content; a TTL item that expired at
//! that clock may be Expired or, once reclaimed, NotFound; a deleted id NotFound); the in-flight
//! batch is visible whole or not at all; `get` returns each live id once, exactly the model's
//! unexpired items; `stats().items` counts the Found and Expired ids; every acknowledged pin opens
//! with its seq, taken_at and the digest the model computes, every unpinned one is
//! `SnapshotNotFound`; `verify()` is clean; recovery removed exactly the stray `*.tmp` files the
//! kill left and none remains; `stats().segments` equals the number of `*.seg` files. The same
//! store is carried through every iteration.
//!
//! `CTXLOG_CRASH_ITERATIONS` overrides the 200 iterations.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
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
const CHILD_DIR_ENV: &str = "CTXLOG_CC_CHILD_DIR";
/// The iteration number the child runs as, so that its versions and pin names are new.
const CHILD_RUN_ENV: &str = "CTXLOG_CC_CHILD_RUN";
/// The clock value the child starts from: the last clock the previous child reached.
const CHILD_CLOCK_ENV: &str = "CTXLOG_CC_CHILD_CLOCK";
/// Overrides the number of iterations of the parent.
const ITERATIONS_ENV: &str = "CTXLOG_CRASH_ITERATIONS";
const DEFAULT_ITERATIONS: u64 = 200;
/// The name of the child test function, for `--exact`.
const CHILD_TEST: &str = "crash_compaction_child";
const SEGMENT_SIZE: u64 = 32 << 10;
const CLOCK_START: i64 = 1_700_000_000;
/// Seconds the child's clock moves before every operation.
const CLOCK_STEP: i64 = 30;
/// The ids every batch writes new versions of.
const POOL: u64 = 40;
const TTLS: [u64; 5] = [20, 45, 90, 300, 1500];
/// The child pins no more than this many snapshots at once (pins keep what they see).
const MAX_PINS: usize = 4;
/// Every this many operations (drawn per child from this range) the child calls `compact()`; one
/// child in three does not (compaction is slow enough that most kills would land inside it).
const COMPACT_EVERY: (u64, u64) = (3, 10);
const SIGKILL: i32 = 9;
/// Every line of the protocol starts with this (libtest may print in front of the first one).
const MARK: &str = "@@ ";

/// A small deterministic PRNG (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn open_store(dir: &Path, clock: &Arc<ManualClock>, auto_compact: bool) -> Result<Store> {
    Options::new()
        .durability(Durability::Immediate)
        .segment_size(SEGMENT_SIZE)
        .auto_compact(auto_compact)
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .open(dir)
}

fn pool_id(n: u64) -> String {
    format!("k{n:02}")
}

/// The item written for (id, version): its content depends on nothing else.
fn written_item(id: &str, version: &str, timestamp: i64, ttl: Option<u64>) -> ContextItem {
    let pad = id.bytes().chain(version.bytes()).map(u64::from).sum::<u64>() % 300 + 40;
    let pad = usize::try_from(pad).expect("small");
    let mut item = ContextItem::new(
        id,
        "document_chunk",
        json!({
            "id": id,
            "v": version,
            "text": format!("churn payload of {id}@{version} {}", "x".repeat(pad)),
        }),
        "crash-compaction",
        timestamp,
        version,
        Scope::GlobalWritable,
    );
    if let Some(ttl) = ttl {
        item = item.with_ttl(ttl);
    }
    item
}

fn content_hash(item: &ContextItem) -> String {
    let digest = Sha256::digest(canonical_json(&item.content));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The item as the store must give it back: what was written plus its content hash.
fn stored_item(id: &str, version: &str, timestamp: i64, ttl: Option<u64>) -> ContextItem {
    let item = written_item(id, version, timestamp, ttl);
    let hash = content_hash(&item);
    item.with_hash(hash)
}

fn expires_at(item: &ContextItem) -> Option<i64> {
    Some(item.timestamp + i64::try_from(item.ttl_seconds?).ok()?)
}

fn expired(item: &ContextItem, now: i64) -> bool {
    expires_at(item).is_some_and(|at| at <= now)
}

/// Writes protocol lines, each flushed at once.
struct Out(std::io::Stdout);

impl Out {
    fn line(&self, text: &str) {
        let mut out = self.0.lock();
        writeln!(out, "{MARK}{text}").expect("child: writing a line");
        out.flush().expect("child: flushing");
    }
}

/// One item of an add: (id, version, ttl).
type AddSpec = (String, String, Option<u64>);

/// The child: churns forever. Without the environment variable (an ordinary test run) it does
/// nothing.
#[test]
fn crash_compaction_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let run: u64 = std::env::var(CHILD_RUN_ENV)
        .expect("the child needs its run number")
        .parse()
        .expect("run number");
    let start: i64 = std::env::var(CHILD_CLOCK_ENV)
        .expect("the child needs its clock")
        .parse()
        .expect("clock");
    let clock = Arc::new(ManualClock::new(start));
    let store = open_store(Path::new(&dir), &clock, true).expect("child: opening the store");
    let out = Out(std::io::stdout());
    let mut rng = Rng(run.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xA5A5);
    let compact_every = if rng.range(0, 2) == 0 {
        u64::MAX
    } else {
        rng.range(COMPACT_EVERY.0, COMPACT_EVERY.1)
    };
    let mut pins: Vec<String> = store.snapshots().into_iter().map(|info| info.name).collect();
    // A live handle held for a few operations, with its digest when taken and when to drop it.
    let mut held: Option<(Snapshot, String, u64)> = None;
    let mut now = start;
    for op in 0u64.. {
        now += CLOCK_STEP;
        out.line(&format!("CLOCK {now}"));
        clock.set(now);

        if let Some((snapshot, digest, until)) = &held {
            let again = snapshot.digest().expect("child: digest of a held snapshot");
            assert_eq!(&again, digest, "child: a live snapshot's digest changed");
            if op >= *until {
                held = None;
            }
        } else if rng.range(0, 6) == 0 {
            let snapshot = store.snapshot();
            let digest = snapshot.digest().expect("child: digest");
            held = Some((snapshot, digest, op + rng.range(2, 8)));
        }

        let roll = rng.range(0, 99);
        if roll < 60 || (roll < 78 && pins.len() >= MAX_PINS) {
            let count = rng.range(1, 6);
            let mut chosen = BTreeSet::new();
            while (chosen.len() as u64) < count {
                chosen.insert(rng.range(0, POOL - 1));
            }
            let specs: Vec<AddSpec> = chosen
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let ttl = (rng.range(0, 9) < 4)
                        .then(|| TTLS[usize::try_from(rng.range(0, TTLS.len() as u64 - 1)).unwrap()]);
                    (pool_id(*n), format!("r{run}.o{op}.{i}"), ttl)
                })
                .collect();
            let described: Vec<String> = specs
                .iter()
                .map(|(id, version, ttl)| format!("{id}:{version}:{}", ttl.unwrap_or(0)))
                .collect();
            out.line(&format!("BEGIN ADD {now} {}", described.join(" ")));
            let items: Vec<ContextItem> = specs
                .iter()
                .map(|(id, version, ttl)| written_item(id, version, now, *ttl))
                .collect();
            let hashes: Vec<String> = items.iter().map(content_hash).collect();
            let outcomes = store.add(items).expect("child: add");
            let seqs: BTreeSet<u64> = outcomes
                .iter()
                .map(|outcome| match outcome {
                    AddOutcome::Added { seq, .. } => *seq,
                    other => panic!("child: a new version answered {other:?}"),
                })
                .collect();
            assert_eq!(seqs.len(), 1, "child: one batch, one seq: {seqs:?}");
            let batch_seq = seqs.first().copied().unwrap_or(0);
            out.line(&format!(
                "ACK ADD {} {batch_seq} {}",
                store.stats().seq,
                hashes.join(" ")
            ));
        } else if roll < 70 {
            let id = pool_id(rng.range(0, POOL - 1));
            out.line(&format!("BEGIN DEL {id}"));
            let existed = store.delete(&id).expect("child: delete");
            out.line(&format!("ACK DEL {existed} {}", store.stats().seq));
        } else if roll < 78 {
            let name = format!("p{run}-{op}");
            out.line(&format!("BEGIN PIN {name}"));
            let info = store.pin_snapshot(&name).expect("child: pin");
            let digest = store
                .open_snapshot(&name)
                .expect("child: opening the new pin")
                .digest()
                .expect("child: digest of the new pin");
            pins.push(name);
            out.line(&format!(
                "ACK PIN {} {} {digest} {}",
                info.seq,
                info.taken_at,
                store.stats().seq
            ));
        } else {
            // Mostly an existing pin; now and then a name never pinned (false, nothing written).
            let name = if pins.is_empty() || roll >= 96 {
                format!("never{run}-{op}")
            } else {
                pins.remove(usize::try_from(rng.range(0, pins.len() as u64 - 1)).unwrap())
            };
            out.line(&format!("BEGIN UNPIN {name}"));
            let existed = store.unpin_snapshot(&name).expect("child: unpin");
            out.line(&format!("ACK UNPIN {existed} {}", store.stats().seq));
        }

        if op % compact_every == compact_every - 1 {
            out.line("BEGIN COMPACT");
            let report = store.compact().expect("child: compact");
            out.line(&format!(
                "ACK COMPACT {} {}",
                report.segments_rewritten,
                store.stats().seq
            ));
        }
    }
}

/// An operation as a `BEGIN` line describes it.
#[derive(Clone, Debug)]
enum Op {
    Add { timestamp: i64, items: Vec<AddSpec> },
    Delete(String),
    Pin(String),
    Unpin(String),
    Compact,
}

#[derive(Debug)]
enum Line {
    Clock(i64),
    Begin(Op),
    Ack(Vec<String>),
}

fn parse_op(words: &[&str]) -> Option<Op> {
    match words {
        ["ADD", timestamp, items @ ..] => {
            let items = items
                .iter()
                .map(|spec| {
                    let mut parts = spec.split(':');
                    let id = parts.next()?.to_owned();
                    let version = parts.next()?.to_owned();
                    let ttl: u64 = parts.next()?.parse().ok()?;
                    parts
                        .next()
                        .is_none()
                        .then_some((id, version, (ttl > 0).then_some(ttl)))
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Op::Add {
                timestamp: timestamp.parse().ok()?,
                items,
            })
        }
        ["DEL", id] => Some(Op::Delete((*id).to_owned())),
        ["PIN", name] => Some(Op::Pin((*name).to_owned())),
        ["UNPIN", name] => Some(Op::Unpin((*name).to_owned())),
        ["COMPACT"] => Some(Op::Compact),
        _ => None,
    }
}

/// Reads complete protocol lines; a last line cut short by the kill does not count.
fn read_lines(stdout: impl Read) -> Vec<Line> {
    let mut lines = Vec::new();
    for text in common::complete_lines(stdout) {
        let Some(at) = text.find(MARK) else { continue };
        let words: Vec<&str> = text[at + MARK.len()..].split_whitespace().collect();
        let line = match words.as_slice() {
            ["CLOCK", t] => Line::Clock(t.parse().unwrap_or_else(|_| panic!("bad clock line {text:?}"))),
            ["BEGIN", rest @ ..] => Line::Begin(parse_op(rest).unwrap_or_else(|| panic!("bad BEGIN line {text:?}"))),
            ["ACK", rest @ ..] => Line::Ack(rest.iter().map(|w| (*w).to_owned()).collect()),
            _ => panic!("unexpected line from the child: {text:?}"),
        };
        lines.push(line);
    }
    lines
}

/// What a pin must answer: the seq and time it was taken at and the digest of what it shows.
#[derive(Clone, Debug)]
struct PinModel {
    seq: u64,
    taken_at: i64,
    digest: String,
}

/// The exact state the parent expects, as of the last check plus the acknowledged operations.
struct Model {
    /// Per pool id, its latest version since its last delete (`None`: deleted or never added).
    latest: BTreeMap<String, Option<ContextItem>>,
    pins: BTreeMap<String, PinModel>,
    unpinned: BTreeSet<String>,
    /// The store's sequence number.
    seq: u64,
    /// The highest clock any child may have reached.
    clock: i64,
}

/// The digest `Snapshot::digest` must give for a view of the model's state at `now`.
fn model_digest(model: &Model, now: i64) -> String {
    let mut items: Vec<&ContextItem> = model
        .latest
        .values()
        .flatten()
        .filter(|item| !expired(item, now))
        .collect();
    items.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
    let mut hasher = Sha256::new();
    for item in items {
        let value = serde_json::to_value(item).expect("item to JSON");
        hasher.update(canonical_json(&value));
        hasher.update(b"\n");
    }
    let hex: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Model {
    /// Whether `op` writes a frame (and so moves the sequence number by one) in this state.
    fn writes(&self, op: &Op) -> bool {
        match op {
            Op::Add { .. } | Op::Pin(_) => true,
            Op::Delete(id) => self.latest.get(id).is_some_and(Option::is_some),
            Op::Unpin(name) => self.pins.contains_key(name),
            Op::Compact => false,
        }
    }

    /// Applies `op`, done at clock `now`.
    fn apply(&mut self, op: &Op, now: i64) {
        let writes = self.writes(op);
        match op {
            Op::Add { timestamp, items } => {
                for (id, version, ttl) in items {
                    self.latest
                        .insert(id.clone(), Some(stored_item(id, version, *timestamp, *ttl)));
                }
            }
            Op::Delete(id) => {
                self.latest.insert(id.clone(), None);
            }
            Op::Pin(name) => {
                let digest = model_digest(self, now);
                let pin = PinModel {
                    seq: self.seq,
                    taken_at: now,
                    digest,
                };
                assert!(self.pins.insert(name.clone(), pin).is_none(), "pin {name} pinned twice");
                self.unpinned.remove(name);
            }
            Op::Unpin(name) => {
                if self.pins.remove(name).is_some() {
                    self.unpinned.insert(name.clone());
                }
            }
            Op::Compact => {}
        }
        if writes {
            self.seq += 1;
        }
    }
}

/// Counters for the summary line.
#[derive(Default)]
struct Tally {
    acknowledged: u64,
    adds: u64,
    deletes: u64,
    pins: u64,
    unpins: u64,
    compactions: u64,
    compactions_rewriting: u64,
    in_flight_applied: u64,
    in_flight_lost: u64,
    checkpoint_used: u64,
    checkpoint_rejected: u64,
    stray_tmp: u64,
    stray_segment_tmp: u64,
    stray_checkpoint_tmp: u64,
    truncations: u64,
    silent_runs: u64,
    long_runs: u64,
    /// What the child was doing when killed: the unacknowledged operation, or "between".
    killed_during: BTreeMap<&'static str, u64>,
}

fn word<'a>(ack: &'a [String], at: usize, context: &str) -> &'a str {
    ack.get(at)
        .unwrap_or_else(|| panic!("{context}: ACK line too short: {ack:?}"))
}

fn number(ack: &[String], at: usize, context: &str) -> u64 {
    word(ack, at, context)
        .parse()
        .unwrap_or_else(|_| panic!("{context}: not a number at {at} of {ack:?}"))
}

/// Checks one acknowledged operation against the model and applies it.
fn acknowledge(model: &mut Model, op: &Op, ack: &[String], now: i64, context: &str, tally: &mut Tally) {
    let expected_kind = match op {
        Op::Add { .. } => "ADD",
        Op::Delete(_) => "DEL",
        Op::Pin(_) => "PIN",
        Op::Unpin(_) => "UNPIN",
        Op::Compact => "COMPACT",
    };
    assert_eq!(word(ack, 0, context), expected_kind, "{context}: ACK of another op");
    let before = model.seq;
    let writes = model.writes(op);
    match op {
        Op::Add { timestamp, items } => {
            assert_eq!(number(ack, 2, context), before + 1, "{context}: the add's batch seq");
            let hashes: Vec<String> = items
                .iter()
                .map(|(id, version, ttl)| content_hash(&written_item(id, version, *timestamp, *ttl)))
                .collect();
            assert_eq!(
                ack.get(3..).map(<[String]>::to_vec),
                Some(hashes),
                "{context}: content digests"
            );
            tally.adds += 1;
        }
        Op::Delete(id) => {
            assert_eq!(
                word(ack, 1, context),
                writes.to_string(),
                "{context}: delete({id}) answered otherwise than the model ({:?})",
                model.latest.get(id)
            );
            tally.deletes += 1;
        }
        Op::Pin(_) => {
            assert_eq!(number(ack, 1, context), before, "{context}: the pin's seq");
            assert_eq!(
                i64::try_from(number(ack, 2, context)).expect("time"),
                now,
                "{context}: the pin's taken_at"
            );
            assert_eq!(
                word(ack, 3, context),
                model_digest(model, now),
                "{context}: the new pin's digest is not the model's"
            );
            tally.pins += 1;
        }
        Op::Unpin(name) => {
            assert_eq!(
                word(ack, 1, context),
                writes.to_string(),
                "{context}: unpin({name}) answered otherwise than the model"
            );
            tally.unpins += 1;
        }
        Op::Compact => {
            tally.compactions += 1;
            if number(ack, 1, context) > 0 {
                tally.compactions_rewriting += 1;
            }
        }
    }
    model.apply(op, now);
    // Where each ACK line carries `stats().seq` after the operation.
    let stats_seq_at = match op {
        Op::Add { .. } => 1,
        Op::Pin(_) => 4,
        Op::Delete(_) | Op::Unpin(_) | Op::Compact => 2,
    };
    assert_eq!(
        number(ack, stats_seq_at, context),
        model.seq,
        "{context}: stats().seq after {op:?}"
    );
    tally.acknowledged += u64::from(!matches!(op, Op::Compact));
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("listing the store")
        .map(|entry| entry.expect("dir entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(suffix))
        .collect();
    names.sort();
    names
}

/// Reopens the store after a kill, settles the in-flight operation and checks everything.
fn check_after_crash(
    dir: &Path,
    run: u64,
    pending: Option<&Op>,
    pending_clock: i64,
    model: &mut Model,
    tally: &mut Tally,
) {
    let context = format!("run {run}");
    let tmp_before = files_ending(dir, ".tmp");
    let clock = Arc::new(ManualClock::new(model.clock));
    let store =
        open_store(dir, &clock, false).unwrap_or_else(|e| panic!("{context}: reopening after SIGKILL failed: {e}"));
    let stats = store.stats();
    let recovery = &stats.recovery;

    // Recovery removed exactly the temporary files the kill left, and none remains.
    assert_eq!(
        recovery.removed_temporary_files,
        tmp_before.len() as u64,
        "{context}: stray files before the reopen: {tmp_before:?}"
    );
    let tmp_after = files_ending(dir, ".tmp");
    assert!(tmp_after.is_empty(), "{context}: {tmp_after:?} left after the reopen");
    if !tmp_before.is_empty() {
        tally.stray_tmp += 1;
    }
    tally.stray_segment_tmp += tmp_before.iter().filter(|name| name.ends_with(".seg.tmp")).count() as u64;
    tally.stray_checkpoint_tmp += tmp_before.iter().filter(|name| name.ends_with(".idx.tmp")).count() as u64;
    if recovery.checkpoint_seq.is_some() {
        tally.checkpoint_used += 1;
    }
    if recovery.checkpoint_rejected.is_some() {
        tally.checkpoint_rejected += 1;
    }
    if recovery.truncated_bytes > 0 {
        tally.truncations += 1;
    }
    if let Some(seq) = recovery.checkpoint_seq {
        assert!(
            seq <= stats.seq,
            "{context}: checkpoint at seq {seq} after the log's {}",
            stats.seq
        );
    }

    // The in-flight operation happened whole or not at all: one frame, or none.
    if let Some(op) = pending {
        if model.writes(op) {
            assert!(
                stats.seq == model.seq || stats.seq == model.seq + 1,
                "{context}: seq {} after in-flight {op:?}, acknowledged state at {}",
                stats.seq,
                model.seq
            );
            if stats.seq == model.seq + 1 {
                model.apply(op, pending_clock);
                tally.in_flight_applied += 1;
            } else {
                tally.in_flight_lost += 1;
            }
        }
    }
    assert_eq!(
        stats.seq, model.seq,
        "{context}: the log holds another number of frames than the acknowledged ones (+ the in-flight one)"
    );

    // Every pool id, and its latest version by reference, resolves as the model says at the clock.
    let now = model.clock;
    let mut refs = Vec::new();
    for (id, latest) in &model.latest {
        refs.push(id.clone());
        if let Some(item) = latest {
            refs.push(format!("{id}@{}", item.version));
        }
    }
    let resolutions = store
        .resolve(&refs)
        .unwrap_or_else(|e| panic!("{context}: resolve failed: {e}"));
    assert_eq!(resolutions.len(), refs.len());
    let mut found_ids = BTreeSet::new();
    let mut expired_ids = BTreeSet::new();
    for (reference, resolution) in refs.iter().zip(resolutions) {
        let id = reference.split('@').next().unwrap_or_default();
        let latest = model.latest.get(id).cloned().flatten();
        let in_flight =
            pending.is_some_and(|op| matches!(op, Op::Add { items, .. } if items.iter().any(|(i, ..)| i == id)));
        let hint = if in_flight {
            " (an id of the in-flight batch: the batch is half visible)"
        } else {
            ""
        };
        match (latest, resolution) {
            (None, Resolution::NotFound { .. }) => {}
            (Some(item), Resolution::Found(got)) if !expired(&item, now) => {
                assert_eq!(got, item, "{context}: {reference} resolved to other data{hint}");
                found_ids.insert(id.to_owned());
            }
            (Some(item), Resolution::Expired { id: got, expired_at }) if expired(&item, now) => {
                assert_eq!(got, id, "{context}: {reference}");
                assert_eq!(Some(expired_at), expires_at(&item), "{context}: {reference} expired_at");
                expired_ids.insert(id.to_owned());
            }
            // An expired latest version may have been reclaimed by compaction.
            (Some(item), Resolution::NotFound { .. }) if expired(&item, now) => {}
            (expected, other) => {
                panic!("{context}: {reference} resolves to {other:?}, the model has {expected:?} at clock {now}{hint}")
            }
        }
    }
    for id in &found_ids {
        assert!(!expired_ids.contains(id), "{context}: {id} both found and expired");
    }

    // `get` gives every live id once, exactly the model's unexpired latest versions.
    let items = store
        .get(&ContextQuery::new())
        .unwrap_or_else(|e| panic!("{context}: get failed: {e}"));
    let mut seen = HashSet::new();
    for item in &items {
        assert!(
            seen.insert(item.id.clone()),
            "{context}: get returned {} twice",
            item.id
        );
    }
    let mut expected: Vec<ContextItem> = model
        .latest
        .values()
        .flatten()
        .filter(|item| !expired(item, now))
        .cloned()
        .collect();
    expected.sort_by(|a, b| (a.timestamp, &a.id).cmp(&(b.timestamp, &b.id)));
    assert_eq!(items, expected, "{context}: get(everything)");
    assert_eq!(
        stats.items,
        (found_ids.len() + expired_ids.len()) as u64,
        "{context}: stats().items is not the number of ids found or expired ({} found, {} expired)",
        found_ids.len(),
        expired_ids.len()
    );
    assert_eq!(
        stats.segments,
        files_ending(dir, ".seg").len() as u64,
        "{context}: stats().segments is not the number of .seg files"
    );

    // Pins: the listing, and each pin's seq, time and digest; unpinned names are gone.
    let listed: BTreeMap<String, (u64, i64)> = store
        .snapshots()
        .into_iter()
        .map(|info| (info.name, (info.seq, info.taken_at)))
        .collect();
    let modelled: BTreeMap<String, (u64, i64)> = model
        .pins
        .iter()
        .map(|(name, pin)| (name.clone(), (pin.seq, pin.taken_at)))
        .collect();
    assert_eq!(listed, modelled, "{context}: snapshots()");
    for (name, pin) in &model.pins {
        let snapshot = store
            .open_snapshot(name)
            .unwrap_or_else(|e| panic!("{context}: open_snapshot({name}) failed: {e}"));
        assert_eq!(snapshot.seq(), pin.seq, "{context}: pin {name} seq");
        assert_eq!(snapshot.taken_at(), pin.taken_at, "{context}: pin {name} taken_at");
        let digest = snapshot
            .digest()
            .unwrap_or_else(|e| panic!("{context}: digest of pin {name} failed: {e}"));
        assert_eq!(
            digest, pin.digest,
            "{context}: pin {name} answers otherwise than when pinned"
        );
    }
    for name in &model.unpinned {
        assert!(
            matches!(store.open_snapshot(name), Err(Error::SnapshotNotFound { .. })),
            "{context}: unpinned {name} still opens"
        );
    }

    let report = store
        .verify()
        .unwrap_or_else(|e| panic!("{context}: verify failed: {e}"));
    assert!(
        report.is_ok(),
        "{context}: verify found problems: {:?}",
        report.problems
    );
    drop(store);
}

#[test]
fn sigkill_during_compaction_and_checkpoints() {
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
    let mut tally = Tally::default();
    let mut model = Model {
        latest: (0..POOL).map(|n| (pool_id(n), None)).collect(),
        pins: BTreeMap::new(),
        unpinned: BTreeSet::new(),
        seq: 0,
        clock: CLOCK_START,
    };

    for run in 0..iterations {
        let mut rng = Rng(0x00C0_FFEE ^ run.wrapping_mul(0x9E37_79B9));
        // Mostly short lives; every 25th child lives past the background compactor's first tick (1 s).
        let long = run % 25 == 12;
        let delay = Duration::from_millis(if long {
            rng.range(1000, 1400)
        } else {
            rng.range(10, 160)
        });
        tally.long_runs += u64::from(long);
        let spawned = Instant::now();
        let mut command = Command::new(&exe);
        command
            .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, dir.path())
            .env(CHILD_RUN_ENV, run.to_string())
            .env(CHILD_CLOCK_ENV, model.clock.to_string());
        let killed = common::run_until_killed(command, spawned, delay, read_lines);
        let (lines, errors, early, status) = (killed.output, killed.stderr, killed.ended_early, killed.status);
        assert!(
            !early && status.signal() == Some(SIGKILL),
            "run {run}: the child ended by itself ({status}) instead of being killed after {delay:?}; stderr:\n{errors}"
        );

        // Replay what the child acknowledged into the model, checking every answer it printed.
        let context = format!("run {run}");
        let mut pending: Option<Op> = None;
        let mut clock = model.clock;
        let mut acked = 0u64;
        for line in lines {
            match line {
                Line::Clock(t) => {
                    assert!(
                        pending.is_none(),
                        "{context}: CLOCK while {pending:?} is unacknowledged"
                    );
                    assert!(t > clock, "{context}: the child's clock went from {clock} to {t}");
                    clock = t;
                }
                Line::Begin(op) => {
                    assert!(
                        pending.is_none(),
                        "{context}: BEGIN while {pending:?} is unacknowledged"
                    );
                    pending = Some(op);
                }
                Line::Ack(words) => {
                    let op = pending
                        .take()
                        .unwrap_or_else(|| panic!("{context}: ACK {words:?} without BEGIN"));
                    acknowledge(&mut model, &op, &words, clock, &context, &mut tally);
                    acked += 1;
                }
            }
        }
        if acked == 0 {
            tally.silent_runs += 1;
        }
        let doing = match &pending {
            None => "between",
            Some(Op::Add { .. }) => "add",
            Some(Op::Delete(_)) => "delete",
            Some(Op::Pin(_)) => "pin",
            Some(Op::Unpin(_)) => "unpin",
            Some(Op::Compact) => "compact",
        };
        *tally.killed_during.entry(doing).or_default() += 1;
        model.clock = clock;
        check_after_crash(dir.path(), run, pending.as_ref(), clock, &mut model, &mut tally);
    }

    // A final clean reopen: it starts from the checkpoint written by the last check's close and
    // has nothing to repair.
    let clock = Arc::new(ManualClock::new(model.clock));
    let store = open_store(dir.path(), &clock, false).expect("final reopen");
    let stats = store.stats();
    assert_eq!(stats.recovery.truncated_bytes, 0, "a clean reopen truncated bytes");
    assert_eq!(
        stats.recovery.removed_temporary_files, 0,
        "a clean reopen found stray files"
    );
    assert_eq!(
        stats.recovery.checkpoint_seq,
        Some(stats.seq),
        "a clean reopen did not start from the checkpoint written at close ({:?})",
        stats.recovery.checkpoint_rejected
    );
    assert_eq!(
        stats.recovery.frames, 0,
        "a clean reopen replayed frames after the close checkpoint"
    );
    assert_eq!(stats.seq, model.seq, "final reopen: stats().seq");
    println!(
        "crash_compaction: {iterations} iterations in {:.1?}: {} acknowledged ops ({} adds, {} deletes, {} pins, \
         {} unpins), {} compactions acknowledged ({} rewrote segments), in-flight op applied {} / lost {}, \
         {} reopens used a checkpoint, {} rejected one, {} found a stray .tmp ({} segment and {} checkpoint temporaries), {} truncated a torn tail, \
         {} children acknowledged nothing, {} long-lived children, killed during {:?}, {} segments, seq {}",
        started.elapsed(),
        tally.acknowledged,
        tally.adds,
        tally.deletes,
        tally.pins,
        tally.unpins,
        tally.compactions,
        tally.compactions_rewriting,
        tally.in_flight_applied,
        tally.in_flight_lost,
        tally.checkpoint_used,
        tally.checkpoint_rejected,
        tally.stray_tmp,
        tally.stray_segment_tmp,
        tally.stray_checkpoint_tmp,
        tally.truncations,
        tally.silent_runs,
        tally.long_runs,
        tally.killed_during,
        stats.segments,
        stats.seq,
    );
    assert!(
        iterations < 20 || tally.acknowledged > 0,
        "no child acknowledged anything in {iterations} runs: the test proves nothing"
    );
    assert!(
        iterations < 50 || tally.compactions_rewriting > 0,
        "no compaction rewrote a segment in {iterations} runs: the test proves nothing about compaction"
    );
}
