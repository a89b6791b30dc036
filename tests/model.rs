//! Model-based property test: random sequences of operations run against a real [`Store`] (in a
//! temp dir, `ManualClock`, 4 KiB segments so the log rotates, `Durability::Never`, no
//! auto-compaction) and against the reference model `ctxlog::testing::model` (the one the
//! `stateful` fuzz target drives too, written from the documented API), and every answer must
//! agree. This file holds the proptest strategies and the driver; the rules are the model's.
//!
//! Operations: `add` batches (through the store or a session view, with known and new
//! (id, version) pairs, same or other content, TTLs, confidences, every scope), `delete`, `get`
//! with random filters (types, time range, scopes, min_confidence, sources, content_eq,
//! newest_first, limit), `resolve` of `id` / `id@version` refs, snapshots (store or session
//! views) read later with `get` and `resolve`, clock advances, close-and-reopen, `compact()`,
//! `pin_snapshot` (through the store or a session view's snapshot), `unpin_snapshot`, and
//! `open_snapshot` followed by `get`, `resolve` and `digest` through the pinned view (the handle
//! is then kept as a live snapshot until the next reopen).
//!
//! What it proves, for every generated sequence: add outcomes (Added / Unchanged, one seq per
//! batch, seqs increasing) and errors (VersionConflict / PermissionDenied with the item's index)
//! match the model; a refused batch changes nothing; a delete answers whether the id had a history
//! and starts a fresh one; `get` returns exactly the latest version of each live, unexpired,
//! visible id that passes the filters, in `(timestamp, id)` order or its exact reverse, truncated to
//! the limit, with the full item (hash included) equal to what was added; `resolve` answers Found /
//! NotFound / Expired / Superseded as the API docs say, with another session's ids NotFound;
//! snapshots keep answering as of their sequence number and `taken_at`; `compact()` reports exactly
//! the model's newly retired expired and superseded versions, and `verify()` is clean after it; a
//! session may no longer compare with a superseded version compaction retired; pins:
//! `pin_snapshot` answers the current seq and clock (a name already pinned is `Invalid` and writes
//! nothing), `snapshots()` always lists exactly the model's pins, `unpin_snapshot` answers whether
//! the pin existed, `open_snapshot` of an unknown name is `SnapshotNotFound`, and a pin answers
//! `get`, `resolve` and `digest` as the model did when it was pinned, across compactions and
//! reopens. After every reopen, and at the end before and after a last reopen, the store shows
//! exactly the model's state (every item, every reference, `stats().items`, every pin and what it
//! shows, its digest included); every store opened passes `opened_store_problem`; `verify()` is
//! clean after every reopen and compaction and at the end; no `.tmp` file is left after a
//! compaction; and a clean close leaves exactly one checkpoint.
//!
//! Runs 256 cases by default; set `PROPTEST_CASES` for more.

use std::path::Path;
use std::sync::Arc;

use ctxlog::testing::fuzz::opened_store_problem;
use ctxlog::testing::model::{
    denied_at, listed_pins, observe, pin_in_store, ref_text, snapshot_answers, ItemSpec, PinModel, QuerySpec, Ref,
    State, StoreAdd, View, CONFIDENCES, IDS, KINDS, MIN_CONFIDENCES, PATHS, PIN_NAMES, QUERY_KINDS, SOURCES, START,
    VERSIONS, VIEWS,
};
use ctxlog::{
    Change, ChangeFilter, Clock, ContextItem, Durability, Error, ManualClock, Options, Snapshot, Store, Subscription,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[derive(Clone, Debug)]
enum Op {
    /// `view`: `None` for the store, else a session view.
    Add {
        view: Option<&'static str>,
        items: Vec<ItemSpec>,
    },
    Delete(&'static str),
    /// `changes(after)` from an `after` picked between `history_start()` and `last_seq()`.
    Changes(usize),
    Get {
        view: Option<&'static str>,
        query: QuerySpec,
    },
    Resolve {
        view: Option<&'static str>,
        refs: Vec<Ref>,
    },
    Snapshot {
        view: Option<&'static str>,
    },
    /// Reads the snapshot `snap % count` (skipped when there is none).
    GetSnap {
        snap: usize,
        query: QuerySpec,
    },
    ResolveSnap {
        snap: usize,
        refs: Vec<Ref>,
    },
    Advance(i64),
    Reopen,
    /// `store.compact()`.
    Compact,
    /// `snapshot_at(seq)` of a batch picked among those committed so far (`pick % count`), read
    /// with `query` and `refs` and its digest: answered as the model was then, or (only once a
    /// compaction reclaimed something) `HistoryCompacted`.
    SnapshotAt {
        pick: usize,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    /// `snapshot_as_of(t)` for the time of a batch picked as above (TTL judged at `t`).
    SnapshotAsOf {
        pick: usize,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    /// `subscribe(ChangeFilter::new().after(a))` from an `a` picked as for `Changes`; the
    /// subscription lives until the next reopen, which closes it (and `ResumeSubs` takes over).
    Subscribe(usize),
    /// Every live subscription receives up to the last seq: exactly the model's changes after its
    /// start, in order, once each (expiries aside, which `expire_due` announces: each names an id
    /// whose latest version had expired by then).
    DrainSubs,
    /// `expire_due()`, then `DrainSubs`.
    ExpireDue,
    /// Pins a snapshot of now, through the store (`None`) or a session view's snapshot.
    Pin {
        name: &'static str,
        view: Option<&'static str>,
    },
    Unpin(&'static str),
    /// `open_snapshot(name)`, then `get`, `resolve` and `digest` through it; the handle is kept
    /// (as a live snapshot that `GetSnap` / `ResolveSnap` read later) until the next reopen.
    OpenPinned {
        name: &'static str,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
}

fn item_spec() -> impl Strategy<Value = ItemSpec> {
    (
        prop::sample::select(&IDS[..]),
        prop::sample::select(&VERSIONS[..]),
        prop::option::weighted(0.15, 0..6usize),
        prop::sample::select(&KINDS[..]),
        prop::sample::select(&SOURCES[..]),
        START - 6..=START + 8,
        0..4usize,
        prop::option::weighted(0.35, 1..=12u64),
        prop::option::of(prop::sample::select(&CONFIDENCES[..])),
    )
        .prop_map(
            |(id, version, content, kind, source, timestamp, scope, ttl, confidence)| ItemSpec {
                id,
                version,
                content,
                kind,
                source,
                timestamp,
                scope,
                ttl,
                confidence,
            },
        )
}

fn query_spec() -> impl Strategy<Value = QuerySpec> {
    (
        // At least one type: what `.types([])` means is not settled by API.md (the store reads it as
        // "every type", while `.scopes([])` and `.sources([])` match nothing).
        prop::option::weighted(0.3, prop::sample::subsequence(&QUERY_KINDS[..], 1..=3)),
        prop::option::weighted(0.3, (START - 7..=START + 9, 0..8i64).prop_map(|(s, len)| (s, s + len))),
        prop::option::weighted(0.3, prop::sample::subsequence(vec![0usize, 1, 2, 3], 0..=3)),
        prop::option::weighted(0.3, prop::sample::select(&MIN_CONFIDENCES[..])),
        prop::option::weighted(0.3, prop::sample::subsequence(&SOURCES[..], 0..=2)),
        prop::option::weighted(0.3, (prop::sample::select(&PATHS[..]), 0..4usize)),
        any::<bool>(),
        prop::option::weighted(0.3, 0..5usize),
    )
        .prop_map(
            |(types, range, scopes, min_confidence, sources, content_eq, newest_first, limit)| QuerySpec {
                types,
                range,
                scopes,
                min_confidence,
                sources,
                content_eq,
                newest_first,
                limit,
            },
        )
}

fn refs() -> impl Strategy<Value = Vec<Ref>> {
    prop::collection::vec(
        (
            prop::sample::select(&IDS[..]),
            prop::option::of(prop::sample::select(&VERSIONS[..])),
        ),
        1..5,
    )
}

fn read_view() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![3 => Just(None), 2 => prop::sample::select(&VIEWS[..]).prop_map(Some)]
}

fn write_view() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![4 => Just(None), 1 => Just(Some("s1")), 1 => Just(Some("s2"))]
}

fn pin_name() -> impl Strategy<Value = &'static str> {
    prop_oneof![3 => Just(PIN_NAMES[0]), 2 => Just(PIN_NAMES[1]), 1 => Just(PIN_NAMES[2])]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (write_view(), prop::collection::vec(item_spec(), 1..=5))
            .prop_map(|(view, items)| Op::Add { view, items }),
        1 => prop::sample::select(&IDS[..]).prop_map(Op::Delete),
        1 => any::<usize>().prop_map(Op::Changes),
        3 => (read_view(), query_spec()).prop_map(|(view, query)| Op::Get { view, query }),
        3 => (read_view(), refs()).prop_map(|(view, refs)| Op::Resolve { view, refs }),
        1 => read_view().prop_map(|view| Op::Snapshot { view }),
        2 => (any::<usize>(), query_spec()).prop_map(|(snap, query)| Op::GetSnap { snap, query }),
        2 => (any::<usize>(), refs()).prop_map(|(snap, refs)| Op::ResolveSnap { snap, refs }),
        2 => (0..=6i64).prop_map(Op::Advance),
        1 => Just(Op::Reopen),
        2 => Just(Op::Compact),
        2 => (any::<usize>(), query_spec(), refs()).prop_map(|(pick, query, refs)| Op::SnapshotAt { pick, query, refs }),
        1 => (any::<usize>(), query_spec(), refs()).prop_map(|(pick, query, refs)| Op::SnapshotAsOf { pick, query, refs }),
        1 => any::<usize>().prop_map(Op::Subscribe),
        1 => Just(Op::DrainSubs),
        1 => Just(Op::ExpireDue),
        1 => (pin_name(), read_view()).prop_map(|(name, view)| Op::Pin { name, view }),
        1 => pin_name().prop_map(Op::Unpin),
        2 => (pin_name(), query_spec(), refs()).prop_map(|(name, query, refs)| Op::OpenPinned { name, query, refs }),
    ]
}

/// Checks that `s` shows exactly what the model's `state` shows at `now`.
fn check_observation(s: &Store, state: &State, now: i64, what: &str) -> Result<(), TestCaseError> {
    let seen = observe(s).map_err(|e| fail(&format!("{what}: reading the store"), e))?;
    match seen.mismatch(&state.observation(now)) {
        None => Ok(()),
        Some(mismatch) => Err(TestCaseError::fail(format!("{what}: {mismatch}"))),
    }
}

/// Checks `snapshots()` against the model's pins.
fn check_pin_list(s: &Store, state: &State, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(listed_pins(s), state.pin_list(), "{}: snapshots()", what);
    Ok(())
}

/// Opens the pin `name` and checks that it answers `query`, `refs` and `digest` as the model of
/// the pin says; returns the handle.
fn check_pinned(
    s: &Store,
    name: &str,
    pin: &PinModel,
    query: &QuerySpec,
    refs: &[Ref],
    what: &str,
) -> Result<Snapshot, TestCaseError> {
    let snapshot = s.open_snapshot(name).map_err(|e| fail("open_snapshot", e))?;
    prop_assert_eq!(snapshot.seq(), pin.seq, "{}: pin {} seq", what, name);
    prop_assert_eq!(
        snapshot.taken_at(),
        pin.view.taken_at,
        "{}: pin {} taken_at",
        what,
        name
    );
    prop_assert_eq!(snapshot.session(), pin.view.session, "{}: pin {} session", what, name);
    let actual = snapshot.get(&query.query()).map_err(|e| fail("pinned get", e))?;
    prop_assert_eq!(actual, pin.view.get(query), "{}: pin {} get", what, name);
    let texts: Vec<String> = refs.iter().map(ref_text).collect();
    let actual = snapshot.resolve(&texts).map_err(|e| fail("pinned resolve", e))?;
    prop_assert_eq!(actual, pin.view.resolve(refs), "{}: pin {} resolve", what, name);
    let digest = snapshot.digest().map_err(|e| fail("pinned digest", e))?;
    prop_assert_eq!(digest, pin.view.digest(), "{}: pin {} digest", what, name);
    Ok(snapshot)
}

/// Checks that `changes(after)` lists exactly the model's changes after `after`, in order.
fn check_feed(s: &Store, state: &State, after: u64, what: &str) -> Result<(), TestCaseError> {
    let actual = s
        .changes(after)
        .map_err(|e| fail(what, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(what, e))?;
    prop_assert_eq!(actual, state.feed_after(after), "{}", what);
    Ok(())
}

/// Checks where the feed starts: 0 until a compaction removed a change, never past the last seq,
/// refused just below it; and the feed from there on is the model's.
fn check_feed_start(s: &Store, state: &State, what: &str) -> Result<(), TestCaseError> {
    let start = s.history_start().map_err(|e| fail(what, e))?;
    prop_assert!(
        start <= s.last_seq(),
        "{}: history_start {} past last_seq {}",
        what,
        start,
        s.last_seq()
    );
    if start > 0 {
        let below = s.changes(start - 1).map(|_| ());
        prop_assert!(
            matches!(below, Err(Error::HistoryCompacted { oldest_available }) if oldest_available == start),
            "{}: changes({}) below the start answered {:?}",
            what,
            start - 1,
            below
        );
    }
    check_feed(s, state, start, &format!("{what}: changes from the start {start}"))
}

fn fail(what: &str, e: Error) -> TestCaseError {
    TestCaseError::fail(format!("{what} failed: {e}"))
}

/// Opens the store, and checks it as every store a fuzz target opens is checked.
fn open(dir: &Path, clock: &Arc<ManualClock>) -> Result<Store, TestCaseError> {
    let store = Options::new()
        .durability(Durability::Never)
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(4096)
        .auto_compact(false)
        .open(dir)
        .map_err(|e| fail("open", e))?;
    if let Some(problem) = opened_store_problem(&store) {
        return Err(TestCaseError::fail(problem));
    }
    Ok(store)
}

/// `verify()` finds nothing.
fn check_verify(s: &Store, what: &str) -> Result<(), TestCaseError> {
    let report = s.verify().map_err(|e| fail(&format!("verify {what}"), e))?;
    prop_assert!(report.is_ok(), "verify {}: {:?}", what, report.problems);
    Ok(())
}

/// The names of the store's files.
fn file_names(dir: &Path) -> Result<Vec<String>, TestCaseError> {
    let entries = std::fs::read_dir(dir).map_err(|e| TestCaseError::fail(format!("listing the store: {e}")))?;
    Ok(entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect())
}

/// No `.tmp` file is left.
fn check_no_tmp(dir: &Path, what: &str) -> Result<(), TestCaseError> {
    let names = file_names(dir)?;
    prop_assert!(
        !names.iter().any(|name| name.ends_with(".tmp")),
        "{}: files left: {:?}",
        what,
        names
    );
    Ok(())
}

/// One case: a store in its directory, and the model beside it.
struct Case {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    /// The store, open between operations.
    store: Option<Store>,
    state: State,
    /// Live snapshot handles, each with its model.
    snaps: Vec<(Snapshot, View)>,
    last_seq: u64,
    /// Every batch committed, as (seq, commit time, the model right after it).
    moments: Vec<(u64, i64, ctxlog::testing::model::Model)>,
    /// Whether a compaction has reclaimed anything: until then every view of the past is answered.
    reclaimed: bool,
    /// Live subscriptions: each with the seq it started after and the changes it received.
    subs: Vec<(Subscription, u64, Vec<Change>)>,
    /// Subscriptions a reopen closed, to resume after the last seq each received.
    closed_subs: Vec<(u64, Vec<Change>)>,
}

impl Case {
    fn new() -> Result<Case, TestCaseError> {
        let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(format!("tempdir: {e}")))?;
        let clock = Arc::new(ManualClock::new(START));
        let store = Some(open(dir.path(), &clock)?);
        Ok(Case {
            dir,
            clock,
            store,
            state: State::default(),
            snaps: Vec::new(),
            last_seq: 0,
            moments: Vec::new(),
            reclaimed: false,
            subs: Vec::new(),
            closed_subs: Vec::new(),
        })
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("store is open between steps")
    }

    /// Runs `op` on the store and on the model, and compares their answers.
    fn op(&mut self, step: usize, op: &Op) -> Result<(), TestCaseError> {
        let now = self.clock.now();
        let (s, state) = (self.store(), &self.state);
        match op {
            Op::Add { view, items } => self.add(step, *view, items)?,
            Op::Delete(id) => {
                let scope = self.state.model.latest_scope(id);
                let actual = s.delete(id).map_err(|e| fail("delete", e))?;
                prop_assert_eq!(actual, self.state.model.delete(id), "step {}: delete({})", step, id);
                if let (true, Some(scope)) = (actual, scope) {
                    let seq = self.store().last_seq();
                    self.state.record_delete(id, scope, seq, now);
                }
                self.note_moment();
            }
            Op::SnapshotAt { pick, query, refs } => {
                if let Some((seq, time, model)) = self.moments.get(pick % self.moments.len().max(1)).cloned() {
                    let view = View {
                        model,
                        taken_at: time,
                        session: None,
                        step,
                    };
                    let what = format!("step {step}: snapshot_at({seq})");
                    self.check_past(s.snapshot_at(seq), &view, query, refs, &what)?;
                }
            }
            Op::SnapshotAsOf { pick, query, refs } => {
                if let Some((_, time, _)) = self.moments.get(pick % self.moments.len().max(1)) {
                    let time = *time;
                    // As of `time`: the last batch committed by then.
                    let model = self
                        .moments
                        .iter()
                        .rev()
                        .find(|(_, at, _)| *at <= time)
                        .map(|(_, _, model)| model.clone())
                        .unwrap_or_default();
                    let view = View {
                        model,
                        taken_at: time,
                        session: None,
                        step,
                    };
                    let what = format!("step {step}: snapshot_as_of({time})");
                    self.check_past(s.snapshot_as_of(time), &view, query, refs, &what)?;
                }
            }
            Op::Subscribe(pick) => {
                let (start, last) = (s.history_start().map_err(|e| fail("history_start", e))?, s.last_seq());
                let span = usize::try_from(last - start).unwrap_or(usize::MAX).saturating_add(1);
                let after = start + u64::try_from(pick % span).unwrap_or(0);
                let subscription = s
                    .subscribe(ChangeFilter::new().after(after))
                    .map_err(|e| fail("subscribe", e))?;
                self.subs.push((subscription, after, Vec::new()));
            }
            Op::DrainSubs => self.drain_subs(step)?,
            Op::ExpireDue => {
                s.expire_due().map_err(|e| fail("expire_due", e))?;
                self.drain_subs(step)?;
            }
            Op::Changes(pick) => {
                let (start, last) = (s.history_start().map_err(|e| fail("history_start", e))?, s.last_seq());
                let span = usize::try_from(last - start).unwrap_or(usize::MAX).saturating_add(1);
                let after = start + u64::try_from(pick % span).unwrap_or(0);
                check_feed(s, &self.state, after, &format!("step {step}: changes({after})"))?;
            }
            Op::Get { view, query } => {
                let actual = match view {
                    None => s.get(&query.query()),
                    Some(session) => s.session(session).get(&query.query()),
                }
                .map_err(|e| fail("get", e))?;
                prop_assert_eq!(actual, state.model.get(query, *view, now), "step {}: get", step);
            }
            Op::Resolve { view, refs } => {
                let texts: Vec<String> = refs.iter().map(ref_text).collect();
                let actual = match view {
                    None => s.resolve(&texts),
                    Some(session) => s.session(session).resolve(&texts),
                }
                .map_err(|e| fail("resolve", e))?;
                prop_assert_eq!(actual, state.model.resolve(refs, *view, now), "step {}: resolve", step);
            }
            Op::Snapshot { view } => {
                let snapshot = match view {
                    None => s.snapshot(),
                    Some(session) => s.session(session).snapshot(),
                };
                prop_assert_eq!(snapshot.taken_at(), now, "step {}: taken_at", step);
                prop_assert_eq!(snapshot.session(), *view, "step {}: snapshot session", step);
                let model = View {
                    model: state.model.clone(),
                    taken_at: now,
                    session: *view,
                    step,
                };
                self.snaps.push((snapshot, model));
            }
            Op::GetSnap { snap, query } => {
                if let Some((snapshot, model)) = self.snaps.get(snap % self.snaps.len().max(1)) {
                    let actual = snapshot.get(&query.query()).map_err(|e| fail("snapshot get", e))?;
                    prop_assert_eq!(actual, model.get(query), "step {}: snapshot get", step);
                }
            }
            Op::ResolveSnap { snap, refs } => {
                if let Some((snapshot, model)) = self.snaps.get(snap % self.snaps.len().max(1)) {
                    let texts: Vec<String> = refs.iter().map(ref_text).collect();
                    let actual = snapshot.resolve(&texts).map_err(|e| fail("snapshot resolve", e))?;
                    prop_assert_eq!(actual, model.resolve(refs), "step {}: snapshot resolve", step);
                }
            }
            Op::Advance(secs) => self.clock.advance(*secs),
            Op::Reopen => self.reopen(&format!("step {step}: after reopen"))?,
            Op::Compact => self.compact(step, now)?,
            Op::Pin { name, view } => {
                let seq_before = s.stats().seq;
                let actual = pin_in_store(s, name, *view, seq_before, now, step).map_err(|e| fail("pin", e))?;
                let expected = self.state.pin(name, seq_before, now, *view, step);
                prop_assert_eq!(actual, expected, "step {}: pin({})", step, name);
                check_pin_list(self.store(), &self.state, &format!("step {step}: after pin"))?;
                self.note_moment();
            }
            Op::Unpin(name) => {
                let actual = s.unpin_snapshot(name).map_err(|e| fail("unpin", e))?;
                prop_assert_eq!(actual, self.state.unpin(name), "step {}: unpin({})", step, name);
                check_pin_list(self.store(), &self.state, &format!("step {step}: after unpin"))?;
                self.note_moment();
            }
            Op::OpenPinned { name, query, refs } => match state.pins.get(name) {
                None => {
                    let result = s.open_snapshot(name);
                    prop_assert!(
                        matches!(result, Err(Error::SnapshotNotFound { .. })),
                        "step {step}: open_snapshot of the unknown {name} answered {result:?}"
                    );
                }
                Some(pin) => {
                    let snapshot = check_pinned(s, name, pin, query, refs, &format!("step {step}"))?;
                    self.snaps.push((snapshot, pin.view.clone()));
                }
            },
        }
        Ok(())
    }

    fn add(&mut self, step: usize, view: Option<&'static str>, items: &[ItemSpec]) -> Result<(), TestCaseError> {
        let items: Vec<ContextItem> = items.iter().map(ItemSpec::item).collect();
        let result = match view {
            None => self.store().add(items.clone()),
            Some(session) => self.store().session(session).add(items.clone()),
        };
        let actual =
            StoreAdd::read(result).map_err(|e| TestCaseError::fail(format!("step {step}: add error {e:?}")))?;
        match actual.batch_seq(self.last_seq) {
            Ok(seq) => self.last_seq = seq.unwrap_or(self.last_seq),
            Err(wrong) => return Err(TestCaseError::fail(format!("step {step}: {wrong}"))),
        }
        let expected = self.state.model.add(&items, view, step, denied_at(&actual.answer));
        prop_assert_eq!(&actual.answer, &expected, "step {}: add", step);
        if let (Ok(expects), Some(seq)) = (&expected, actual.batch_seq(0).ok().flatten()) {
            self.state.record_add(&items, expects, seq, self.clock.now());
        }
        self.note_moment();
        Ok(())
    }

    /// Records the batch just committed, if one was (a batch that wrote nothing has no seq).
    fn note_moment(&mut self) {
        let seq = self.store().last_seq();
        if seq > self.moments.last().map_or(0, |(last, ..)| *last) {
            self.moments.push((seq, self.clock.now(), self.state.model.clone()));
        }
    }

    /// Checks a view of the past against the model `view`: answered as it then was, or refused
    /// with `HistoryCompacted` once a compaction has reclaimed something.
    fn check_past(
        &self,
        result: Result<Snapshot, Error>,
        view: &View,
        query: &QuerySpec,
        refs: &[Ref],
        what: &str,
    ) -> Result<(), TestCaseError> {
        let snapshot = match result {
            Ok(snapshot) => snapshot,
            Err(Error::HistoryCompacted { .. }) if self.reclaimed => return Ok(()),
            Err(e) => return Err(fail(what, e)),
        };
        let seen = snapshot_answers(&snapshot, query, refs).map_err(|e| fail(what, e))?;
        prop_assert_eq!(seen, view.answers(query, refs), "{}", what);
        Ok(())
    }

    /// Lets every live subscription receive up to the last seq, and checks what each received.
    fn drain_subs(&mut self, step: usize) -> Result<(), TestCaseError> {
        let now = self.clock.now();
        for (subscription, after, received) in &mut self.subs {
            // The last batch with a change for it (a pin, say, commits a batch without one).
            let last = self
                .state
                .feed_after(*after)
                .iter()
                .rev()
                .find_map(Change::seq)
                .unwrap_or(*after);
            let reached = |received: &[Change]| received.iter().rev().find_map(Change::seq).unwrap_or(*after);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while reached(received) < last {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                prop_assert!(
                    !left.is_zero(),
                    "step {}: a subscription stopped at {} of {}",
                    step,
                    reached(received),
                    last
                );
                match subscription.recv_timeout(left) {
                    Ok(Some(change)) => received.push(change),
                    Ok(None) => {}
                    Err(e) => return Err(fail(&format!("step {step}: recv"), e)),
                }
            }
            // Expiries already announced come without waiting.
            while let Some(change) = subscription.try_recv().map_err(|e| fail("try_recv", e))? {
                received.push(change);
            }
            check_received(&self.state, *after, received, now, step)?;
        }
        Ok(())
    }

    /// Closes the store and opens it again: snapshots of the closed handle are not carried over, and
    /// everything acknowledged survives, pins included.
    fn reopen(&mut self, what: &str) -> Result<(), TestCaseError> {
        self.snaps.clear();
        // A subscription ends with the store (`Closed` after what it had queued); each resumes
        // after the last seq it received, on the new handle.
        drop(self.store.take());
        for (mut subscription, after, mut received) in self.subs.drain(..) {
            loop {
                match subscription.recv() {
                    Ok(change) => received.push(change),
                    Err(Error::Closed) => break,
                    Err(e) => return Err(fail(&format!("{what}: a closing subscription"), e)),
                }
            }
            self.closed_subs.push((after, received));
        }
        self.store = Some(open(self.dir.path(), &self.clock)?);
        for (after, received) in self.closed_subs.drain(..) {
            let resume = received.iter().rev().find_map(Change::seq).unwrap_or(after);
            let store = self.store.as_ref().expect("just opened");
            match store.subscribe(ChangeFilter::new().after(resume)) {
                Ok(subscription) => self.subs.push((subscription, after, received)),
                // Compaction took the history it would resume from: it may not resume.
                Err(Error::HistoryCompacted { .. }) if self.reclaimed => {}
                Err(e) => return Err(fail(&format!("{what}: resuming a subscription"), e)),
            }
        }
        check_observation(self.store(), &self.state, self.clock.now(), what)?;
        check_feed_start(self.store(), &self.state, what)?;
        check_verify(self.store(), what)
    }

    fn compact(&mut self, step: usize, now: i64) -> Result<(), TestCaseError> {
        let views = self.state.views(self.snaps.iter().map(|(_, model)| model));
        let expected = self.state.model.compact(now, &views);
        let report = self.store().compact().map_err(|e| fail("compact", e))?;
        self.reclaimed |= report.segments_rewritten > 0;
        prop_assert_eq!(
            (report.reclaimed_expired, report.reclaimed_superseded),
            (expected.expired, expected.superseded),
            "step {}: expired and superseded versions reclaimed ({:?})",
            step,
            report
        );
        check_verify(self.store(), &format!("step {step}: after compact"))?;
        check_feed_start(self.store(), &self.state, &format!("step {step}: after compact"))?;
        check_no_tmp(self.dir.path(), &format!("step {step}: after compact"))
    }

    /// The end of a case: the store shows the model's state and verifies clean; a clean close
    /// leaves exactly one checkpoint; and everything acknowledged (every pin, answering as when it
    /// was pinned, included) survives one more reopen.
    fn finish(mut self) -> Result<(), TestCaseError> {
        check_observation(self.store(), &self.state, self.clock.now(), "at the end")?;
        check_verify(self.store(), "at the end")?;
        self.snaps.clear();
        drop(self.store.take());
        let names = file_names(self.dir.path())?;
        let checkpoints = names.iter().filter(|name| name.starts_with("checkpoint-")).count();
        prop_assert!(
            checkpoints == 1 && !names.iter().any(|name| name.ends_with(".tmp")),
            "after a clean close the files are {:?}",
            names
        );
        let s = open(self.dir.path(), &self.clock)?;
        check_observation(&s, &self.state, self.clock.now(), "after the final reopen")?;
        check_feed_start(&s, &self.state, "after the final reopen")
    }
}

/// Checks what a subscription that started after `after` received: its changes with a seq are
/// exactly the model's feed after `after` (in order, once each, nothing past the last seq), and
/// each expiry is due by `now` and announced once for the version it ends.
fn check_received(state: &State, after: u64, received: &[Change], now: i64, step: usize) -> Result<(), TestCaseError> {
    let committed: Vec<Change> = received.iter().filter(|c| c.seq().is_some()).cloned().collect();
    let expected = state.feed_after(after);
    prop_assert_eq!(
        &committed,
        &expected,
        "step {}: a subscription after {} received",
        step,
        after
    );
    // An expiry is of one version as added: the same id and version added again (after a delete)
    // may expire again, so the adds of the id received before it tell the versions apart.
    let mut adds: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for change in received {
        match change {
            Change::Added { id, .. } => *adds.entry(id.as_str()).or_default() += 1,
            Change::Expired {
                id,
                version,
                expired_at,
            } => {
                prop_assert!(
                    *expired_at <= now,
                    "step {}: {} announced expired at {} before {}",
                    step,
                    id,
                    expired_at,
                    now
                );
                let added = adds.get(id.as_str()).copied().unwrap_or(0);
                prop_assert!(
                    seen.insert((id.clone(), version.clone(), *expired_at, added)),
                    "step {}: {}@{} (expiring at {}) announced twice",
                    step,
                    id,
                    version,
                    expired_at
                );
            }
            _ => {}
        }
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut case = Case::new()?;
    for (step, op) in ops.iter().enumerate() {
        case.op(step, op)?;
    }
    case.finish()
}

proptest! {
    #![proptest_config(ProptestConfig {
        // No regression files: this test may only touch tests/model.rs.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn store_matches_model(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }
}
