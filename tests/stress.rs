//! Everything at once on one store: writers that add new versions, re-add, delete and add again
//! (through the store and through session views), readers that hold snapshots (store-wide and
//! session-restricted, some of them pinned) across compactions, and a thread that moves the clock
//! so that items expire under them, and compacts without pause (or leaves compaction and
//! checkpoints to the store's maintenance thread). The single-threaded suites (`tests/model.rs`, the
//! `stateful` fuzz target) check each answer against a model; this one checks what can be judged
//! while the threads race:
//!
//! - a snapshot's answers (`get` of everything and `resolve` of every id) are the same before and
//!   after compactions, and a pinned one opened by name answers the same again;
//! - within one snapshot, `get` and `resolve` agree: an id is in `get` exactly when it resolves as
//!   `Found`, with the same item;
//! - every item returned is one a writer tried to add (its content names its writer, id, history
//!   and version), is not expired at the snapshot's `taken_at`, and is visible to the reader's session;
//! - each writer's own adds and deletes answer as its model of its own ids says, and the final state
//!   matches every writer's model, before and after reopening, with `verify` clean.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ctxlog::{
    AddOutcome, Clock, CompactionReport, ContextItem, ContextQuery, Durability, ManualClock, Options, RawResolution,
    Resolution, Scope, Snapshot, Store,
};
use serde_json::json;

mod common;
use common::{clock_at, stored_form};

const T0: i64 = 1_700_000_000;
const WRITERS: u64 = 3;
const IDS: u64 = 12;
/// Operations per writer: 400, or `CTXLOG_STRESS_OPS` for a longer run.
fn ops() -> u64 {
    std::env::var("CTXLOG_STRESS_OPS")
        .ok()
        .and_then(|ops| ops.parse().ok())
        .unwrap_or(400)
}

/// Who compacts: a thread of the test calling `compact()` without pause, or the store's own
/// maintenance thread (background compaction, and a checkpoint every 64 KiB of log).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Maintenance {
    Explicit,
    Background,
}

fn open(dir: &std::path::Path, clock: &Arc<ManualClock>, maintenance: Maintenance) -> Store {
    let options = Options::new()
        .durability(Durability::Immediate)
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(32 << 10);
    match maintenance {
        Maintenance::Explicit => options.auto_compact(false),
        Maintenance::Background => options.auto_compact(true).checkpoint_every(64 << 10),
    }
    .open(dir)
    .expect("open")
}

/// A small deterministic generator (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn id_of(w: u64, k: u64) -> String {
    format!("w{w}-k{k:02}")
}

/// Id `k` of every writer always has the same scope: global writable, global read-only, or the
/// writer's own session (written through its session view).
fn scope_of(w: u64, k: u64) -> Scope {
    match k % 3 {
        0 => Scope::GlobalWritable,
        1 => Scope::GlobalReadonly,
        _ => Scope::Session(format!("s{w}")),
    }
}

/// Version `v` of history `g` (the number of deletes before it) of writer `w`'s id `k`.
fn item_of(w: u64, k: u64, g: u64, v: u64, timestamp: i64, ttl: Option<u64>) -> ContextItem {
    let words = ["alpha", "beta", "gamma", "delta", "omega"];
    let pad: Vec<&str> = (0..(20 + (w * 7 + k * 13 + g * 5 + v * 3) % 90))
        .map(|i| words[usize::try_from((i + k + v) % 5).unwrap_or(0)])
        .collect();
    let item = ContextItem::new(
        id_of(w, k),
        "message",
        json!({"w": w, "k": k, "g": g, "v": v, "pad": pad.join(" ")}),
        format!("src{w}"),
        timestamp,
        v.to_string(),
        scope_of(w, k),
    );
    match ttl {
        Some(ttl) => item.with_ttl(ttl),
        None => item,
    }
}

/// What writer `w` knows of its id `k`.
#[derive(Clone, Debug, Default)]
struct IdState {
    /// The history (deletes so far) and the next version number in it.
    generation: u64,
    next_version: u64,
    /// The latest version as written, while the id is not deleted.
    latest: Option<ContextItem>,
    /// Whether any version was added since the last delete.
    added_since_delete: bool,
}

/// Everything any writer tried to add, as (writer, id, history, version): added before the add is
/// sent, so that a reader may see an item whose add has not answered yet.
type Tried = Mutex<HashSet<(u64, u64, u64, u64)>>;

fn expired(item: &ContextItem, now: i64) -> bool {
    item.ttl_seconds
        .is_some_and(|ttl| item.timestamp + i64::try_from(ttl).unwrap_or(i64::MAX) <= now)
}

/// Writer `w`'s run, for as long as `more(op)` says.
fn writer(
    store: &Store,
    clock: &ManualClock,
    tried: &Tried,
    (w, seed): (u64, u64),
    more: impl Fn(u64) -> bool,
) -> Vec<IdState> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut ids = vec![IdState::default(); usize::try_from(IDS).unwrap_or(0)];
    let session = store.session(&format!("s{w}"));
    for op in (0..).take_while(|&op| more(op)) {
        // Ids 0..6 take four ops in five and see new versions often; the others are left alone
        // long enough for their TTLs to run out.
        let k = if rng.next().is_multiple_of(5) {
            IDS / 2 + rng.next() % (IDS / 2)
        } else {
            rng.next() % (IDS / 2)
        };
        let state = &mut ids[usize::try_from(k).unwrap_or(0)];
        let id = id_of(w, k);
        let roll = rng.next() % 100;
        if roll < 15 {
            let deleted = store.delete(&id).expect("delete");
            assert_eq!(deleted, state.added_since_delete, "writer {w} op {op}: delete({id})");
            state.generation += 1;
            state.next_version = 0;
            state.latest = None;
            state.added_since_delete = false;
            continue;
        }
        let (item, unchanged) = match (&state.latest, roll < 25) {
            (Some(latest), true) => (latest.clone(), true),
            _ => {
                let ttl = rng.next().is_multiple_of(3).then(|| 2 + rng.next() % 12);
                let v = state.next_version + 1;
                let item = item_of(w, k, state.generation, v, clock.now(), ttl);
                tried.lock().expect("tried").insert((w, k, state.generation, v));
                (item, false)
            }
        };
        let via_session = matches!(item.scope, Scope::Session(_));
        let outcome = if via_session {
            session.add([item.clone()])
        } else {
            store.add([item.clone()])
        };
        match (outcome, unchanged) {
            (Ok(outcome), _)
                if matches!(
                    (&outcome[..], unchanged),
                    ([AddOutcome::Unchanged { .. }], true) | ([AddOutcome::Added { .. }], false)
                ) => {}
            // The same version again, through the session view, after compaction reclaimed it
            // (it had expired): no session may compare with a reclaimed version, whatever its scope
            // (docs/TESTING.md, "Session isolation"). The store still knows the version.
            (Err(ctxlog::Error::PermissionDenied { .. }), true) if via_session && expired(&item, clock.now()) => {}
            (outcome, _) => panic!(
                "writer {w} op {op}: add {id}@{} (again: {unchanged}) gave {outcome:?}",
                item.version
            ),
        }
        if !unchanged {
            state.next_version += 1;
            state.latest = Some(item.clone());
            state.added_since_delete = true;
        }
        // Read your own write: the item, or, if the clock has passed its TTL meanwhile, expired
        // (or not found, once compaction has reclaimed it).
        let answer = store.resolve([&id]).expect("resolve own write").remove(0);
        match &answer {
            Resolution::Found(got) => assert_eq!(got, &stored_form(&item), "writer {w} op {op}"),
            Resolution::Expired { .. } | Resolution::NotFound { .. } if expired(&item, clock.now()) => {}
            other => panic!("writer {w} op {op}: {id} resolves to {other:?} right after its add"),
        }
    }
    ids
}

/// A snapshot's answers: every item `get` returns, and `resolve` of every id of every writer.
type Answers = (Vec<ContextItem>, Vec<Resolution>);

fn all_ids() -> Vec<String> {
    (0..WRITERS).flat_map(|w| (0..IDS).map(move |k| id_of(w, k))).collect()
}

fn answers(snap: &Snapshot) -> Answers {
    let items = snap.get(&ContextQuery::new()).expect("snapshot get");
    let resolved = snap.resolve(all_ids()).expect("snapshot resolve");
    // The raw path answers the same, each item as the bytes serde_json writes for it.
    let raw = snap.resolve_raw(all_ids()).expect("snapshot resolve_raw");
    for (parsed, raw) in resolved.iter().zip(&raw) {
        match (parsed, raw) {
            (Resolution::Found(item), RawResolution::Found(raw)) => {
                assert_eq!(raw.as_bytes(), serde_json::to_vec(item).expect("JSON"), "resolve_raw");
            }
            (Resolution::NotFound { .. }, RawResolution::NotFound { .. })
            | (Resolution::Expired { .. }, RawResolution::Expired { .. }) => {}
            (parsed, raw) => panic!("resolve gave {parsed:?}, resolve_raw {raw:?}"),
        }
    }
    (items, resolved)
}

/// The checks one snapshot's answers must pass on their own (see the file's comment).
fn check_answers(answers: &Answers, taken_at: i64, session: Option<&str>, tried: &Tried, what: &str) {
    let (items, resolved) = answers;
    let mut by_id = BTreeMap::new();
    for item in items {
        let field = |name: &str| item.content.get(name).and_then(serde_json::Value::as_u64);
        let (Some(w), Some(k), Some(g), Some(v)) = (field("w"), field("k"), field("g"), field("v")) else {
            panic!("{what}: content not written by a writer: {item:?}");
        };
        assert_eq!(item.id, id_of(w, k), "{what}");
        assert_eq!(item.version, v.to_string(), "{what}");
        assert!(
            tried.lock().expect("tried").contains(&(w, k, g, v)),
            "{what}: never added: {item:?}"
        );
        let want = item_of(w, k, g, v, item.timestamp, item.ttl_seconds);
        assert_eq!(item, &stored_form(&want), "{what}: content differs");
        assert!(!expired(item, taken_at), "{what}: expired at {taken_at}: {item:?}");
        if let (Scope::Session(s), Some(session)) = (&item.scope, session) {
            assert_eq!(s, session, "{what}: another session's item: {item:?}");
        }
        assert!(
            by_id.insert(item.id.clone(), item).is_none(),
            "{what}: {} twice",
            item.id
        );
    }
    for (id, answer) in all_ids().iter().zip(resolved) {
        match (answer, by_id.get(id)) {
            (Resolution::Found(item), Some(listed)) => assert_eq!(&item, listed, "{what}: resolve({id})"),
            (Resolution::NotFound { .. } | Resolution::Expired { .. }, None) => {}
            (answer, listed) => panic!("{what}: resolve({id}) is {answer:?}, get lists {listed:?}"),
        }
    }
}

/// Sets its flag when dropped.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn writers_readers_pins_and_compaction_at_once() {
    run(Maintenance::Explicit);
}

/// The same with the store's maintenance thread compacting and writing checkpoints on its own (it
/// looks for work once a second, so the writers go on for three seconds and some snapshots are held
/// for over a second), and the store reopened from the checkpoint it wrote last.
#[test]
fn writers_readers_pins_and_background_maintenance_at_once() {
    run(Maintenance::Background);
}

fn run(maintenance: Maintenance) {
    let background = maintenance == Maintenance::Background;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(T0);
    let store = open(dir.path(), &clock, maintenance);
    let started = std::time::Instant::now();
    let tried = Tried::default();
    let done = AtomicBool::new(false);
    let compactions = AtomicU64::new(0);
    let reclaimed = Mutex::new([0u64; 3]);
    let (models, rounds) = std::thread::scope(|scope| {
        // Stops the compactor and the readers however this closure ends: a writer's panic, seen
        // when it is joined, must fail the test, not leave the other threads spinning.
        let _stop = Stop(&done);
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (store, clock, tried) = (&store, &clock, &tried);
                scope.spawn(move || {
                    writer(store, clock, tried, (w, w + 1), |op| {
                        if background {
                            op == 0 || started.elapsed() < std::time::Duration::from_secs(3)
                        } else {
                            op < ops()
                        }
                    })
                })
            })
            .collect();
        // The clock moves one second every 10 ms: TTLs of 2 to 13 s expire during the run. With
        // background maintenance this thread only moves the clock, and counts its steps instead.
        let compactor = scope.spawn(|| {
            let mut tick = std::time::Instant::now();
            while !done.load(Ordering::SeqCst) {
                if background {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    clock.advance(1);
                    compactions.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                let report: CompactionReport = store.compact().expect("compact");
                let mut sums = reclaimed.lock().expect("reclaimed");
                sums[0] += report.reclaimed_expired;
                sums[1] += report.reclaimed_superseded;
                sums[2] += report.reclaimed_deleted;
                drop(sums);
                compactions.fetch_add(1, Ordering::SeqCst);
                if tick.elapsed() >= std::time::Duration::from_millis(10) {
                    clock.advance(1);
                    tick = std::time::Instant::now();
                }
            }
        });
        // Reader 0 sees everything, reader 1 writer 1's session and the globals, reader 2 a
        // session nobody writes (the globals only).
        let readers: Vec<_> = (0..3u64)
            .map(|r| {
                let (store, tried, done, compactions) = (&store, &tried, &done, &compactions);
                scope.spawn(move || {
                    let session = (r > 0).then(|| format!("s{}", if r == 1 { 1 } else { 9 }));
                    let mut rounds = 0u64;
                    while !done.load(Ordering::SeqCst) || rounds == 0 {
                        let snap = match &session {
                            Some(s) => store.session(s).snapshot(),
                            None => store.snapshot(),
                        };
                        let what = format!("reader {r} round {rounds} at seq {}", snap.seq());
                        let first = answers(&snap);
                        check_answers(&first, snap.taken_at(), session.as_deref(), tried, &what);
                        // Every third round pins the snapshot and drops the handle, so that only
                        // the pin keeps what it sees; the others hold the handle.
                        let seen = compactions.load(Ordering::SeqCst);
                        // With background maintenance, a pinned round and one other round in
                        // four wait 1.2 s (120 steps of the clock), across a round of the
                        // maintenance thread.
                        let long = rounds.is_multiple_of(3) || rounds % 4 == 1;
                        let steps = if background && long { 120 } else { 2 };
                        let wait = || {
                            while compactions.load(Ordering::SeqCst) < seen + steps && !done.load(Ordering::SeqCst) {
                                std::thread::yield_now();
                            }
                        };
                        if rounds.is_multiple_of(3) {
                            let name = format!("r{r}-{rounds}");
                            let info = snap.pin(&name).expect("pin");
                            assert_eq!(info.seq, snap.seq(), "{what}");
                            drop(snap);
                            wait();
                            let reopened = store.open_snapshot(&name).expect("open_snapshot");
                            assert_eq!(reopened.seq(), info.seq, "{what}");
                            assert!(answers(&reopened) == first, "{what}: the pin answers otherwise");
                            assert!(store.unpin_snapshot(&name).expect("unpin"), "{what}");
                        } else {
                            wait();
                            assert!(answers(&snap) == first, "{what}: answers changed while held");
                        }
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        let models: Vec<Vec<IdState>> = writers.into_iter().map(|h| h.join().expect("writer")).collect();
        done.store(true, Ordering::SeqCst);
        compactor.join().expect("compactor");
        let rounds: Vec<u64> = readers.into_iter().map(|h| h.join().expect("reader")).collect();
        (models, rounds)
    });
    let reclaimed = *reclaimed.lock().expect("reclaimed");
    println!(
        "stress ({maintenance:?}): {} compactions (or clock steps) reclaiming {reclaimed:?} (expired, superseded, deleted), reader rounds {rounds:?}, clock +{} s",
        compactions.load(Ordering::SeqCst),
        clock.now() - T0
    );
    // The run did what it is for: compactions that reclaimed superseded and deleted versions while
    // the readers held their snapshots. An expired latest version is another matter: every
    // snapshot taken since it expired answers `Expired` for its id, which it must keep answering,
    // so the version stays while any of them lives (the readers always hold one); the compaction
    // after the run, with no snapshot left, reclaims those.
    if background {
        let checkpoints = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".idx"))
            .count();
        assert!(
            checkpoints > 0,
            "the maintenance thread wrote no checkpoint during the run"
        );
    } else {
        assert!(reclaimed[1] > 0 && reclaimed[2] > 0, "reclaimed {reclaimed:?}");
    }
    assert!(store.snapshots().is_empty(), "every pin was removed");

    let check_final = |store: &Store, when: &str| {
        let now = clock.now();
        let ids = all_ids();
        let answers = store.resolve(&ids).expect("final resolve");
        let mut live = 0;
        for (w, states) in models.iter().enumerate() {
            for (k, state) in states.iter().enumerate() {
                let answer = &answers[w * usize::try_from(IDS).unwrap_or(0) + k];
                let what = format!("{when}: {} ({state:?})", ids[w * states.len() + k]);
                match (&state.latest, answer) {
                    (Some(want), Resolution::Found(got)) if !expired(want, now) => {
                        assert_eq!(got, &stored_form(want), "{what}");
                        live += 1;
                    }
                    (Some(want), Resolution::Expired { .. } | Resolution::NotFound { .. }) if expired(want, now) => {}
                    (None, Resolution::NotFound { .. }) => {}
                    (_, other) => panic!("{what}: resolves to {other:?}"),
                }
            }
        }
        assert_eq!(
            store.get(&ContextQuery::new()).expect("final get").len(),
            live,
            "{when}"
        );
        assert!(store.verify().expect("verify").is_ok(), "{when}: verify");
    };
    check_final(&store, "at the end");
    // Past every TTL, with no snapshot left: the last compaction reclaims every expired latest
    // version, whose id then answers `NotFound` rather than `Expired`.
    clock.advance(20);
    let with_ttl: Vec<&ContextItem> = models
        .iter()
        .flatten()
        .filter_map(|state| state.latest.as_ref().filter(|item| item.ttl_seconds.is_some()))
        .collect();
    assert!(!with_ttl.is_empty(), "no latest version with a TTL");
    let last = store.compact().expect("last compaction");
    for (item, answer) in with_ttl
        .iter()
        .zip(store.resolve(with_ttl.iter().map(|i| &i.id)).expect("resolve"))
    {
        assert!(
            matches!(answer, Resolution::NotFound { .. }),
            "{} after the last compaction ({last:?}): {answer:?}",
            item.id
        );
    }
    check_final(&store, "after the last compaction");
    drop(store);
    let store = open(dir.path(), &clock, maintenance);
    check_final(&store, "after reopening");
}
