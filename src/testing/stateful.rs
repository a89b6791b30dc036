//! The `stateful` fuzz target: arbitrary bytes read as a sequence of store operations (decoded in
//! `stateful/ops.rs`), run on a [`SimDisk`] and, side by side, on the reference model
//! ([`crate::testing::model`], which `tests/model.rs` drives too). Any answer that the model does
//! not allow, any panic, and any state after a power cut that the acknowledged operations do not
//! allow is a finding (the function panics).
//!
//! Operations: `add` batches of 1 to 3 items (through the store or a session view; 6 ids, 3
//! versions, 3 types, 4 scopes, TTLs, confidences, usual or other content, so that re-adds answer
//! `Unchanged` and conflicts happen), `delete`, `get` with filters, `resolve` of `id` and
//! `id@version`, live snapshots read later, clock advances, `compact`, `pin_snapshot` (of the
//! store or of a session view's snapshot), `unpin_snapshot`, `open_snapshot`, `flush`, a clean
//! reopen, a power cut between two operations ([`SimDisk::crash`], then the store reopens, maybe
//! after a second cut inside recovery), and a power cut armed to fall after a given number of
//! storage calls: inside the next operations, or between them.
//!
//! The first byte's bit 1 chooses whether content is stored compressed (`Options::compress_content`;
//! one content of the pool is long and repetitive, so that it is), and its bit 0 the durability:
//! `Immediate` (every operation that returned `Ok` is durable) or `Never` (durable at `flush`, at a
//! clean reopen, and at a compaction that rewrote something, which syncs the log first). The model
//! therefore does not follow one state but a set of candidates, each with the states a power cut
//! may bring back (from its last durable state to its current one, plus the operation in flight
//! when the power went off, and each part of a compaction cut short); after a cut, a clean reopen
//! and at the end the store must show one of them exactly (every current item, every `id@version`,
//! every pin and what it shows, its digest included, `stats().items`: an
//! [`Observation`](crate::testing::model::Observation)), `verify()` must find nothing, and no
//! `.tmp` may be left. Candidates that later answers contradict are dropped; when none is left,
//! that is a finding.
//!
//! Unsynced writes may survive a power cut in any order, under every durability: a lost write
//! followed by a kept one is a hole that recovery truncates (the sync marks of segment formats 2 and 3).

use std::fmt::Debug;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::storage::SimDisk;
use crate::testing::fuzz::opened_store_problem;
use crate::testing::model::{
    denied_at, listed_pins, observe, pin_in_store, ref_text, snapshot_answers, ItemSpec, QuerySpec, Ref, State,
    StoreAdd, View, START,
};
use crate::{ChangeFilter, Clock, ContextItem, Durability, Error, ManualClock, Options, Snapshot, Store, Subscription};

mod ops;

pub use ops::OPS_MAX;
use ops::{decode, Op};

const DIR: &str = "/fuzz/store";
/// Small segments, so that the log rotates and compaction has sealed segments to rewrite.
const SEGMENT_SIZE: u64 = 4096;
/// Live snapshot handles kept at most (the oldest is dropped first).
const SNAPS_MAX: usize = 4;

/// One way the store may be: the states a power cut may bring back, from the last durable one
/// (first) to the current one (last), and the live snapshot handles.
#[derive(Clone, Debug, PartialEq)]
struct Candidate {
    history: Vec<State>,
    snaps: Vec<View>,
    /// Every batch committed since the last power cut: (seq, commit time, the model right after
    /// it), for views of the past. Every candidate has as many, for the same batches.
    past: Vec<(u64, i64, crate::testing::model::Model)>,
}

impl Candidate {
    fn current(&self) -> &State {
        match self.history.last() {
            Some(state) => state,
            None => panic!("a candidate without a state"),
        }
    }

    fn current_mut(&mut self) -> &mut State {
        match self.history.last_mut() {
            Some(state) => state,
            None => panic!("a candidate without a state"),
        }
    }

    /// The current state is durable: nothing before it can come back.
    fn make_durable(&mut self) {
        let keep = self.history.len().saturating_sub(1);
        self.history.drain(..keep);
    }

    /// The views compaction must keep: live handles and pins.
    fn views(&self) -> Vec<usize> {
        self.current().views(&self.snaps)
    }
}

/// The store's change feed from where it starts: the start, and the changes with their sequence
/// numbers (checked to increase, each batch's changes together, all past the start) set to 0, as
/// the model records them. An error is the store's (a power cut armed to fall in these reads, say).
fn store_feed(store: &Store, step: usize) -> crate::Result<(u64, Vec<crate::Change>)> {
    let start = store.history_start()?;
    let changes = store.changes(start)?.collect::<crate::Result<Vec<_>>>()?;
    let mut last = start;
    let mut out = Vec::with_capacity(changes.len());
    for mut change in changes {
        let seq = change.seq().unwrap_or(0);
        assert!(
            seq > start && seq >= last,
            "step {step}: feed seq {seq} after {last} (start {start})"
        );
        last = seq;
        if let crate::Change::Added { seq, .. } | crate::Change::Deleted { seq, .. } = &mut change {
            *seq = 0;
        }
        out.push(change);
    }
    Ok((start, out))
}

/// Whether the store's feed (from [`store_feed`]) is what `state` committed: all of it while no
/// compaction has moved the start, else exactly its last changes.
fn feed_shows(state: &State, (start, feed): &(u64, Vec<crate::Change>)) -> bool {
    if *start == 0 {
        state.feed == *feed
    } else {
        state.feed.ends_with(feed)
    }
}

fn dedup(candidates: &mut Vec<Candidate>) {
    let mut unique: Vec<Candidate> = Vec::with_capacity(candidates.len());
    for candidate in candidates.drain(..) {
        if !unique.contains(&candidate) {
            unique.push(candidate);
        }
    }
    *candidates = unique;
}

fn trace_on() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("CTXLOG_STATEFUL_TRACE").is_some())
}

/// One run: the store on its simulated disk, and the model's candidates.
struct Run {
    durability: Durability,
    /// `Options::compress_content`.
    compress: bool,
    clock: Arc<ManualClock>,
    disk: SimDisk,
    store: Option<Store>,
    /// Live snapshot handles, in the order of every candidate's `snaps`.
    handles: Vec<Snapshot>,
    worlds: Vec<Candidate>,
    last_seq: u64,
    /// The seed of an armed power cut.
    armed: Option<u64>,
    /// Counts power cuts: a snapshot handle taken before one is not kept.
    cuts: u64,
    step: usize,
    /// Whether a compaction ran (it may have raised the floor of the views of the past).
    compacted: bool,
    /// The last seq recorded in the candidates' `past`, or the store's last seq after the last
    /// power cut (the batches before it are not recorded).
    noted_seq: u64,
    /// A subscriber (first byte's bit 2): its subscription, the seq it started after, and what it
    /// received. It resumes after each reopen and power cut, and at each clean reopen and at the
    /// end it must have received exactly the store's feed after its start.
    sub: Option<Subscriber>,
}

/// The subscriber of a run (see [`Run::sub`]).
struct Subscriber {
    /// `None` between a close of the store and the next open.
    subscription: Option<Subscription>,
    /// The seq it started after.
    after: u64,
    received: Vec<crate::Change>,
    /// Whether it starts again from scratch at the next open (what it received may be gone).
    restart: bool,
}

impl Run {
    fn open(&self, disk: &SimDisk) -> crate::Result<Store> {
        Options::new()
            .storage(Arc::new(disk.clone()))
            .clock(Arc::clone(&self.clock) as Arc<dyn Clock>)
            .durability(self.durability)
            .compress_content(self.compress)
            .segment_size(SEGMENT_SIZE)
            .auto_compact(false)
            .open(DIR)
            .inspect(|store| {
                if let Some(problem) = opened_store_problem(store) {
                    panic!("{problem}");
                }
            })
    }

    fn store(&self) -> &Store {
        match &self.store {
            Some(store) => store,
            None => panic!("the store is closed between operations"),
        }
    }

    fn immediate(&self) -> bool {
        self.durability == Durability::Immediate
    }

    /// Settles an operation whose store answer is `actual`: with an answer, keeps the candidates
    /// whose `apply` (run on their current state) expects the same; with an error while the power is
    /// off, the operation was in flight: every candidate may now also be in the state `apply`
    /// leads to, and the power cut is played out. `changes` says whether the operation may change
    /// the state (reads do not).
    fn settle<A: PartialEq + Debug>(
        &mut self,
        what: &str,
        actual: crate::Result<A>,
        changes: bool,
        apply: impl Fn(&mut Candidate) -> A,
    ) {
        match actual {
            Ok(actual) => {
                let immediate = self.immediate();
                let mut refused = Vec::new();
                self.worlds.retain_mut(|candidate| {
                    if changes {
                        let state = candidate.current().clone();
                        candidate.history.push(state);
                    }
                    let expected = apply(candidate);
                    if expected != actual {
                        refused.push(format!("{expected:?}"));
                        return false;
                    }
                    if changes {
                        let len = candidate.history.len();
                        if immediate {
                            candidate.make_durable();
                        } else if len >= 2 && candidate.history.get(len - 1) == candidate.history.get(len - 2) {
                            candidate.history.pop();
                        }
                    }
                    true
                });
                if self.worlds.is_empty() {
                    panic!(
                        "step {}: {what}: the store answered {actual:?}; the model expected {}",
                        self.step,
                        refused.join(" or ")
                    );
                }
                dedup(&mut self.worlds);
            }
            Err(e) if self.disk.is_powered_off() => {
                if changes {
                    for candidate in &mut self.worlds {
                        let mut next = Candidate {
                            history: vec![candidate.current().clone()],
                            snaps: candidate.snaps.clone(),
                            past: Vec::new(),
                        };
                        let _ = apply(&mut next);
                        candidate.history.push(next.current().clone());
                    }
                }
                if trace_on() {
                    eprintln!("  {what} in flight at the power cut: {e}");
                }
                self.power_cut();
            }
            Err(e) => panic!("step {}: {what} failed with the power on: {e:?}", self.step),
        }
    }

    /// Plays out an armed (and reached) power cut.
    fn power_cut(&mut self) {
        let seed = self.armed.take().unwrap_or(0);
        self.crash(seed, None);
    }

    /// Cuts the power (if it is not off already), brings the disk back as `seed` decides, maybe
    /// cuts it again inside recovery, reopens, and checks that the store shows one of the states the
    /// candidates allow, and nothing else.
    fn crash(&mut self, seed: u64, recovery_cut: Option<(u64, u64)>) {
        self.armed = None;
        self.cuts += 1;
        let mut restored = self.disk.crash(seed);
        self.handles.clear();
        drop(self.store.take());
        // Under `Immediate` every change delivered was durable; under `Never` it may be gone.
        let immediate = self.immediate();
        self.close_sub(immediate);
        if let Some((after, seed)) = recovery_cut {
            restored.cut_power_after(after);
            match self.open(&restored) {
                Ok(store) => drop(store),
                Err(e) if restored.is_powered_off() => drop(e),
                Err(e) => panic!("step {}: recovery failed with the power on: {e:?}", self.step),
            }
            restored = restored.crash(seed);
        }
        self.disk = restored;
        let store = match self.open(&self.disk) {
            Ok(store) => store,
            Err(e) => panic!("step {}: opening after a power cut failed: {e:?}", self.step),
        };
        let seen = match observe(&store) {
            Ok(seen) => seen,
            Err(e) => panic!("step {}: reading after a power cut failed: {e:?}", self.step),
        };
        let now = self.clock.now();
        let feed = match store_feed(&store, self.step) {
            Ok(feed) => feed,
            Err(e) => panic!(
                "step {}: reading the change feed after a power cut failed: {e:?}",
                self.step
            ),
        };
        let mut survivors = Vec::new();
        for candidate in &self.worlds {
            for state in &candidate.history {
                if state.observation(now) == seen && feed_shows(state, &feed) {
                    // Batches after the last durable state may be gone, and their seqs taken
                    // by others: no view of the past is checked from before the cut.
                    survivors.push(Candidate {
                        history: vec![state.clone()],
                        snaps: Vec::new(),
                        past: Vec::new(),
                    });
                }
            }
        }
        if survivors.is_empty() {
            let allowed: Vec<String> = self
                .worlds
                .iter()
                .flat_map(|c| c.history.iter())
                .map(|state| format!("{}\n   shows {}", state.summary(), state.observation(now).brief()))
                .collect();
            panic!(
                "step {}: after a power cut the store shows a state the acknowledged operations do not allow\n \
                 seen: {}\n allowed: {allowed:#?}",
                self.step,
                seen.brief()
            );
        }
        dedup(&mut survivors);
        self.worlds = survivors;
        self.check_files(&store, "after a power cut");
        self.last_seq = store.stats().seq;
        self.noted_seq = store.last_seq();
        self.resume_sub(&store);
        if trace_on() {
            eprintln!("  recovered: {:?}", store.stats().recovery);
            for candidate in &self.worlds {
                eprintln!("  state: {}", candidate.current().summary());
            }
        }
        self.store = Some(store);
    }

    /// The store has closed (cleanly, or by a power cut): the subscriber takes what was queued to
    /// it, then `Closed`. With `keep`, what it received is kept and it resumes after it; without
    /// (it may hold changes the cut took back), it starts again from scratch.
    fn close_sub(&mut self, keep: bool) {
        let step = self.step;
        // (An armed cut may fall in the replay's reads as it drains.)
        let disk = self.disk.clone();
        let Some(sub) = self.sub.as_mut() else {
            return;
        };
        if let Some(mut subscription) = sub.subscription.take() {
            loop {
                match subscription.recv_timeout(std::time::Duration::from_secs(10)) {
                    Ok(Some(change)) => sub.received.push(change),
                    Err(Error::Closed) => break,
                    // A replay read that a cut failed.
                    Err(_) if disk.is_powered_off() => break,
                    other => panic!("step {step}: a closing subscription answered {other:?}"),
                }
            }
        }
        sub.restart |= !keep;
    }

    /// Subscribes again on the reopened `store`: after the last seq the subscriber received (or,
    /// when it starts again or compaction took that history, from where the feed starts, with
    /// nothing received).
    fn resume_sub(&mut self, store: &Store) {
        let step = self.step;
        let disk = self.disk.clone();
        let Some(sub) = self.sub.as_mut() else {
            return;
        };
        let start = match store.history_start() {
            Ok(start) => start,
            Err(_) if disk.is_powered_off() => return,
            Err(e) => panic!("step {step}: history_start failed: {e:?}"),
        };
        let mut resume = sub
            .received
            .iter()
            .rev()
            .find_map(crate::Change::seq)
            .unwrap_or(sub.after);
        if sub.restart || resume < start {
            sub.after = start;
            sub.received.clear();
            sub.restart = false;
            resume = start;
        }
        match store.subscribe(ChangeFilter::new().after(resume)) {
            Ok(subscription) => sub.subscription = Some(subscription),
            Err(_) if disk.is_powered_off() => sub.restart = true,
            Err(e) => panic!("step {step}: resuming a subscription after {resume} failed: {e:?}"),
        }
    }

    /// The subscriber receives up to the store's last change; what it received since its start
    /// (expiries aside) must be exactly the feed after its start, and every expiry it heard of
    /// due by now. (Not while a cut is armed: it could fall inside these reads.)
    fn check_sub(&mut self, store: &Store, when: &str) {
        if self.armed.is_some() {
            return;
        }
        let step = self.step;
        let now = self.clock.now();
        let Some(Subscriber {
            subscription: Some(subscription),
            after,
            received,
            ..
        }) = self.sub.as_mut()
        else {
            return;
        };
        if let Err(e) = store.expire_due() {
            panic!("step {step}: expire_due {when} failed: {e:?}");
        }
        // Compaction may have taken the oldest changes it received out of the feed: compare from
        // where the feed starts.
        let from = match store.history_start() {
            Ok(start) => start.max(*after),
            Err(e) => panic!("step {step}: history_start {when} failed: {e:?}"),
        };
        let feed = match store
            .changes(from)
            .and_then(|changes| changes.collect::<crate::Result<Vec<_>>>())
        {
            Ok(feed) => feed,
            Err(e) => panic!("step {step}: the feed after {from} {when} failed: {e:?}"),
        };
        let past = received
            .iter()
            .filter(|c| c.seq().is_some_and(|seq| seq <= from))
            .count();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let committed = |received: &[crate::Change]| received.iter().filter(|c| c.seq().is_some()).count();
        while committed(received) < past + feed.len() && std::time::Instant::now() < deadline {
            match subscription.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok(Some(change)) => received.push(change),
                Ok(None) => {}
                Err(e) => panic!("step {step}: the subscription {when} answered {e:?}"),
            }
        }
        while let Ok(Some(change)) = subscription.try_recv() {
            received.push(change);
        }
        let got: Vec<&crate::Change> = received
            .iter()
            .filter(|c| c.seq().is_some_and(|seq| seq > from))
            .collect();
        let want: Vec<&crate::Change> = feed.iter().collect();
        assert_eq!(
            got, want,
            "step {step}: {when} the subscriber (after {after}) received other than the feed after {from}"
        );
        let seqs: Vec<u64> = received.iter().filter_map(crate::Change::seq).collect();
        assert!(
            seqs.iter().zip(seqs.iter().skip(1)).all(|(a, b)| a <= b),
            "step {step}: {when} the subscriber received batches out of order or twice: {seqs:?}"
        );
        for change in received.iter() {
            if let crate::Change::Expired { id, expired_at, .. } = change {
                assert!(
                    *expired_at <= now,
                    "step {step}: {id} announced expired at {expired_at}, before {now}"
                );
            }
        }
    }

    /// Records, in every candidate, the batch the last operation committed, if it did.
    fn note_batch(&mut self) {
        let Some(store) = self.store.as_ref() else {
            return;
        };
        let seq = store.last_seq();
        if seq <= self.noted_seq {
            return;
        }
        self.noted_seq = seq;
        let now = self.clock.now();
        for candidate in &mut self.worlds {
            let model = candidate.current().model.clone();
            candidate.past.push((seq, now, model));
        }
    }

    /// `snapshot_at` (or, with `at` false, `snapshot_as_of` the commit time) of a batch committed
    /// since the last power cut, picked by `pick`: answered as a candidate's model was then, or
    /// refused with `HistoryCompacted` once a compaction ran. Candidates it contradicts are dropped.
    fn past(&mut self, at: bool, pick: u8, query: &QuerySpec, refs: &[Ref]) {
        let step = self.step;
        let Some((seq, time)) = self.worlds.first().and_then(|candidate| {
            let len = candidate.past.len();
            (len > 0).then(|| {
                candidate
                    .past
                    .get(usize::from(pick) % len)
                    .map(|(seq, time, _)| (*seq, *time))
            })?
        }) else {
            return;
        };
        let store = self.store();
        let result = if at {
            store.snapshot_at(seq)
        } else {
            store.snapshot_as_of(time)
        };
        let answers = result.and_then(|snapshot| snapshot_answers(&snapshot, query, refs));
        let seen = match answers {
            Ok(seen) => seen,
            Err(_) if self.disk.is_powered_off() => return,
            Err(Error::HistoryCompacted { .. }) if self.compacted => return,
            Err(e) => panic!("step {step}: a view of the past (seq {seq}, time {time}) failed: {e:?}"),
        };
        let expected = |candidate: &Candidate| {
            // As of `time`: the last batch committed by then.
            let model = if at {
                candidate.past.iter().find(|(s, ..)| *s == seq)
            } else {
                candidate.past.iter().rev().find(|(_, t, _)| *t <= time)
            }
            .map(|(_, _, model)| model.clone())
            .unwrap_or_default();
            View {
                model,
                taken_at: time,
                session: None,
                step,
            }
            .answers(query, refs)
        };
        if !self.worlds.iter().any(|candidate| expected(candidate) == seen) {
            panic!(
                "step {step}: a view of the past (seq {seq}, time {time}) answered {seen:?}, which no candidate allows"
            );
        }
        self.worlds.retain(|candidate| expected(candidate) == seen);
    }

    /// `verify()` finds nothing and no `.tmp` file is left.
    fn check_files(&self, store: &Store, when: &str) {
        match store.verify() {
            Ok(report) if report.is_ok() => {}
            Ok(report) => panic!("step {}: verify {when}: {:?}", self.step, report.problems),
            Err(e) => panic!("step {}: verify {when} failed: {e:?}", self.step),
        }
        let stray: Vec<String> = self
            .disk
            .file_names(Path::new(DIR))
            .into_iter()
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(stray.is_empty(), "step {}: {when}: files left: {stray:?}", self.step);
    }

    /// Keeps the candidates whose current state the store shows.
    fn check_current(&mut self, store: &Store, when: &str) {
        let seen = match observe(store) {
            Ok(seen) => seen,
            // An armed cut fell here: the power cut is played out next.
            Err(_) if self.disk.is_powered_off() => return,
            Err(e) => panic!("step {}: reading {when} failed: {e:?}", self.step),
        };
        let now = self.clock.now();
        let feed = match store_feed(store, self.step) {
            Ok(feed) => feed,
            // An armed cut fell here: the power cut is played out next.
            Err(_) if self.disk.is_powered_off() => return,
            Err(e) => panic!("step {}: reading the change feed {when} failed: {e:?}", self.step),
        };
        let shows = |candidate: &Candidate| {
            candidate.current().observation(now) == seen && feed_shows(candidate.current(), &feed)
        };
        if !self.worlds.iter().any(shows) {
            let expected: Vec<String> = self
                .worlds
                .iter()
                .map(|c| {
                    format!(
                        "{}\n   shows {}",
                        c.current().summary(),
                        c.current().observation(now).brief()
                    )
                })
                .collect();
            panic!(
                "step {}: {when} the store shows {}\n the model expected one of {expected:#?}",
                self.step,
                seen.brief()
            );
        }
        self.worlds.retain(shows);
    }

    fn op(&mut self, op: &Op) {
        let now = self.clock.now();
        let step = self.step;
        match op {
            Op::Add { view, items } => self.add(*view, items),
            Op::Delete(id) => {
                let actual = self.store().delete(id);
                self.settle("delete", actual, true, |c| {
                    let state = c.current_mut();
                    let scope = state.model.latest_scope(id);
                    let deleted = state.model.delete(id);
                    if let (true, Some(scope)) = (deleted, scope) {
                        state.record_delete(id, scope, 0, now);
                    }
                    deleted
                });
            }
            Op::Get { view, query } => {
                let store = self.store();
                let actual = match view {
                    None => store.get(&query.query()),
                    Some(session) => store.session(session).get(&query.query()),
                };
                self.settle("get", actual, false, |c| c.current().model.get(query, *view, now));
            }
            Op::Resolve { view, refs } => {
                let texts: Vec<String> = refs.iter().map(ref_text).collect();
                let store = self.store();
                let actual = match view {
                    None => store.resolve(&texts),
                    Some(session) => store.session(session).resolve(&texts),
                };
                self.settle("resolve", actual, false, |c| {
                    c.current().model.resolve(refs, *view, now)
                });
            }
            Op::Snapshot { view } => {
                let store = self.store();
                let snapshot = match view {
                    None => store.snapshot(),
                    Some(session) => store.session(session).snapshot(),
                };
                assert_eq!(snapshot.taken_at(), now, "step {step}: taken_at");
                assert_eq!(snapshot.session(), *view, "step {step}: snapshot session");
                self.keep_snapshot(snapshot, |c| View {
                    model: c.current().model.clone(),
                    taken_at: now,
                    session: *view,
                    step,
                });
            }
            Op::ReadSnap { snap, query, refs } => self.read_snapshot(*snap, query, refs),
            Op::Advance(secs) => self.clock.advance(*secs),
            Op::Compact => {
                self.compacted = true;
                self.compact(now);
            }
            Op::PastAt { pick, query, refs } => self.past(true, *pick, query, refs),
            Op::PastAsOf { pick, query, refs } => self.past(false, *pick, query, refs),
            Op::Pin { name, view } => self.pin(name, *view, now),
            Op::Unpin(name) => {
                let store = self.store();
                let actual = store.unpin_snapshot(name).map(|existed| (existed, listed_pins(store)));
                self.settle("unpin", actual, true, |c| {
                    let state = c.current_mut();
                    (state.unpin(name), state.pin_list())
                });
            }
            Op::OpenPinned { name, query, refs } => self.open_pinned(name, query, refs),
            Op::Flush => {
                let actual = self.store().flush();
                self.settle("flush", actual, false, |_| ());
                for candidate in &mut self.worlds {
                    candidate.make_durable();
                }
            }
            Op::Reopen => self.reopen(),
            Op::Crash { seed, recovery_cut } => self.crash(*seed, *recovery_cut),
            Op::CutPower { after, seed } => {
                if self.armed.is_none() {
                    self.disk.cut_power_after(*after);
                    self.armed = Some(*seed);
                }
            }
        }
    }

    fn add(&mut self, view: Option<&'static str>, items: &[ItemSpec]) {
        let step = self.step;
        let batch: Vec<ContextItem> = items.iter().map(ItemSpec::item).collect();
        let store = self.store();
        let result = match view {
            None => store.add(batch.clone()),
            Some(session) => store.session(session).add(batch.clone()),
        };
        let actual = StoreAdd::read(result).map(|added| {
            match added.batch_seq(self.last_seq) {
                Ok(seq) => self.last_seq = seq.unwrap_or(self.last_seq),
                Err(wrong) => panic!("step {step}: {wrong}"),
            }
            added.answer
        });
        let denied = actual.as_ref().ok().and_then(denied_at);
        let now = self.clock.now();
        self.settle("add", actual, true, |c| {
            let state = c.current_mut();
            let answer = state.model.add(&batch, view, step, denied);
            if let Ok(expects) = &answer {
                // The feed is compared without sequence numbers (see `feed_shows`).
                state.record_add(&batch, expects, 0, now);
            }
            answer
        });
    }

    /// Reads the live snapshot `snap % count` with `get` and `resolve` (nothing when there is none).
    fn read_snapshot(&mut self, snap: usize, query: &QuerySpec, refs: &[Ref]) {
        if self.handles.is_empty() {
            return;
        }
        let at = snap % self.handles.len();
        let Some(handle) = self.handles.get(at) else { return };
        let texts: Vec<String> = refs.iter().map(ref_text).collect();
        let actual = handle
            .get(&query.query())
            .and_then(|items| Ok((items, handle.resolve(&texts)?)));
        self.settle("snapshot get and resolve", actual, false, |c| match c.snaps.get(at) {
            Some(view) => (view.get(query), view.resolve(refs)),
            None => panic!("a live snapshot the model does not have"),
        });
    }

    fn pin(&mut self, name: &'static str, view: Option<&'static str>, now: i64) {
        let step = self.step;
        let store = self.store();
        let seq_before = store.stats().seq;
        let actual = pin_in_store(store, name, view, seq_before, now, step).map(|answer| (answer, listed_pins(store)));
        self.settle("pin", actual, true, |c| {
            let state = c.current_mut();
            (state.pin(name, seq_before, now, view, step), state.pin_list())
        });
    }

    /// Closes the store and opens it again: a clean close syncs everything.
    fn reopen(&mut self) {
        self.handles.clear();
        drop(self.store.take());
        // A clean close makes everything the subscriber received durable.
        self.close_sub(true);
        match self.open(&self.disk) {
            Ok(store) => {
                for candidate in &mut self.worlds {
                    candidate.snaps.clear();
                    candidate.make_durable();
                }
                dedup(&mut self.worlds);
                self.check_current(&store, "after a clean reopen");
                self.last_seq = store.stats().seq;
                self.resume_sub(&store);
                self.check_sub(&store, "after a clean reopen");
                self.store = Some(store);
            }
            Err(e) if self.disk.is_powered_off() => {
                if trace_on() {
                    eprintln!("  reopen in flight at the power cut: {e}");
                }
                self.power_cut();
            }
            Err(e) => panic!("step {}: reopening failed with the power on: {e:?}", self.step),
        }
    }

    /// Keeps a live snapshot handle, with its model in every candidate (made by `model`).
    fn keep_snapshot(&mut self, snapshot: Snapshot, model: impl Fn(&Candidate) -> View) {
        if self.handles.len() >= SNAPS_MAX {
            self.handles.remove(0);
            for candidate in &mut self.worlds {
                if !candidate.snaps.is_empty() {
                    candidate.snaps.remove(0);
                }
            }
        }
        self.handles.push(snapshot);
        for candidate in &mut self.worlds {
            let snap = model(candidate);
            candidate.snaps.push(snap);
        }
    }

    fn compact(&mut self, now: i64) {
        let actual = self.store().compact();
        match actual {
            Ok(report) => {
                let reclaimed = (report.reclaimed_expired, report.reclaimed_superseded);
                self.settle(
                    "compact (expired, superseded versions reclaimed)",
                    Ok(reclaimed),
                    true,
                    |c| {
                        let views = c.views();
                        let expected = c.current_mut().model.compact(now, &views);
                        // Superseded versions a compaction cut short may have retired are counted
                        // or not: any count the model allows is the one expected.
                        if expected.allows(reclaimed.0, reclaimed.1) {
                            reclaimed
                        } else {
                            (expected.expired, expected.superseded)
                        }
                    },
                );
                if report.segments_rewritten > 0 {
                    // A compaction that rewrote segments synced the log first, and its rewrites are
                    // durable.
                    for candidate in &mut self.worlds {
                        candidate.make_durable();
                    }
                }
                // (Not while a cut is armed: it could fall inside `verify`.)
                if self.armed.is_none() {
                    let store = self.store().clone();
                    self.check_files(&store, "after compact");
                }
            }
            Err(e) if self.disk.is_powered_off() => {
                // Segments are rewritten one after the other: any part of the reclaims may be done.
                for candidate in &mut self.worlds {
                    let views = candidate.views();
                    let base = candidate.current().clone();
                    for model in base.model.compact_cut_short(now, &views) {
                        candidate.history.push(State {
                            model,
                            pins: base.pins.clone(),
                            feed: base.feed.clone(),
                        });
                    }
                }
                if trace_on() {
                    eprintln!("  compact in flight at the power cut: {e}");
                }
                self.power_cut();
            }
            Err(e) => panic!("step {}: compact failed with the power on: {e:?}", self.step),
        }
    }

    fn open_pinned(&mut self, name: &'static str, query: &QuerySpec, refs: &[Ref]) {
        let texts: Vec<String> = refs.iter().map(ref_text).collect();
        let cuts = self.cuts;
        let mut handle = None;
        let actual = match self.store().open_snapshot(name) {
            Err(Error::SnapshotNotFound { .. }) => Ok(None),
            Err(e) => Err(e),
            Ok(snapshot) => {
                let answer = snapshot.get(&query.query()).and_then(|items| {
                    Ok((
                        snapshot.seq(),
                        snapshot.taken_at(),
                        snapshot.session().map(str::to_owned),
                        items,
                        snapshot.resolve(&texts)?,
                        snapshot.digest()?,
                    ))
                });
                handle = Some(snapshot);
                answer.map(Some)
            }
        };
        self.settle("open_snapshot", actual, false, |c| {
            c.current().pins.get(name).map(|pin| {
                (
                    pin.seq,
                    pin.view.taken_at,
                    pin.view.session.map(str::to_owned),
                    pin.view.get(query),
                    pin.view.resolve(refs),
                    pin.view.digest(),
                )
            })
        });
        if let (Some(snapshot), true) = (handle, self.cuts == cuts) {
            self.keep_snapshot(snapshot, |c| match c.current().pins.get(name) {
                Some(pin) => pin.view.clone(),
                None => panic!("an opened pin the model does not have"),
            });
        }
    }

    /// The end of a run: the store shows a current state, closes cleanly into one checkpoint, and
    /// shows the same state when opened again.
    fn finish(&mut self) {
        if self.armed.take().is_some() {
            // Disarms a cut that was never reached.
            self.disk.cut_power_after(u64::MAX);
        }
        let store = self.store().clone();
        self.check_current(&store, "at the end");
        self.check_files(&store, "at the end");
        self.check_sub(&store, "at the end");
        drop(store);
        self.handles.clear();
        drop(self.store.take());
        let names = self.disk.file_names(Path::new(DIR));
        let checkpoints = names.iter().filter(|name| name.starts_with("checkpoint-")).count();
        assert!(
            checkpoints == 1 && !names.iter().any(|name| name.ends_with(".tmp")),
            "after a clean close the files are {names:?}"
        );
        let store = match self.open(&self.disk) {
            Ok(store) => store,
            Err(e) => panic!("reopening at the end failed: {e:?}"),
        };
        self.check_current(&store, "after the last reopen");
    }
}

/// Runs the operations `data` encodes (see the module documentation) on a fresh simulated disk and
/// on the model, and panics at the first answer or recovered state the model does not allow.
pub fn run(data: &[u8]) {
    run_on(data, SimDisk::new());
}

/// [`run`] on `disk`, an empty simulated disk set up by the caller (for instance with its syncs
/// switched off, to check that the target notices).
pub fn run_on(data: &[u8], disk: SimDisk) {
    let (durability, compress, subscribe, ops) = decode(data);
    let trace = trace_on();
    if trace {
        eprintln!("{durability:?}, compress {compress}, {} operations", ops.len());
    }
    // See the module documentation: unsynced writes may survive in any order.
    disk.set_reorder_unsynced(true);
    let mut run = Run {
        durability,
        compress,
        clock: Arc::new(ManualClock::new(START)),
        disk,
        store: None,
        handles: Vec::new(),
        worlds: vec![Candidate {
            history: vec![State::default()],
            snaps: Vec::new(),
            past: Vec::new(),
        }],
        last_seq: 0,
        compacted: false,
        noted_seq: 0,
        armed: None,
        cuts: 0,
        step: 0,
        sub: None,
    };
    let store = match run.open(&run.disk) {
        Ok(store) => store,
        Err(e) => panic!("opening a fresh store failed: {e:?}"),
    };
    if subscribe {
        match store.subscribe(ChangeFilter::new().after(0)) {
            Ok(subscription) => {
                run.sub = Some(Subscriber {
                    subscription: Some(subscription),
                    after: 0,
                    received: Vec::new(),
                    restart: false,
                });
            }
            Err(e) => panic!("subscribing to a fresh store failed: {e:?}"),
        }
    }
    run.store = Some(store);
    for (step, op) in ops.iter().enumerate() {
        run.step = step;
        if trace {
            eprintln!("{step}: {op:?}");
        }
        run.op(op);
        if run.disk.is_powered_off() {
            run.power_cut();
        } else {
            run.note_batch();
        }
    }
    run.finish();
}
