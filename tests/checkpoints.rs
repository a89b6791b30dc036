//! Checkpoints are only ever a shortcut: after a clean close, opening starts from the checkpoint
//! (`recovery.checkpoint_seq` is Some, no frame replayed) and reaches exactly the state a full replay
//! of the log reaches (every item, every resolve, stats, pins and what they answer, registered types);
//! writes made after a checkpoint are replayed on top of it; a checkpoint that is damaged (flipped
//! bytes, truncated), misnamed (another seq), stale (an older checkpoint under the newest name) or
//! taken over segments that compaction rewrote since is refused with a reason
//! (`recovery.checkpoint_rejected`) and the whole log is replayed to the same state; and `verify()`
//! reports a damaged checkpoint file as a problem.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use ctxlog::storage::{CallKind, SimDisk};
use ctxlog::*;
use serde_json::json;

const SEGMENT: u64 = 16 << 10;

fn open_manual(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(SEGMENT)
        .auto_compact(false)
        .open(dir)
        .expect("open store")
}

fn checkpoint_files(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list store")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            name.starts_with("checkpoint-") && name.ends_with(".idx")
        })
        .collect();
    found.sort();
    found
}

/// The single checkpoint file of a closed store, with the seq its name gives.
fn the_checkpoint(dir: &Path) -> (u64, PathBuf) {
    let files = checkpoint_files(dir);
    assert_eq!(files.len(), 1, "one checkpoint expected: {files:?}");
    let path = files[0].clone();
    let name = path.file_name().expect("name").to_string_lossy().into_owned();
    assert_eq!(name.len(), "checkpoint-".len() + 20 + ".idx".len(), "{name}");
    let seq = name["checkpoint-".len()..name.len() - 4].parse().expect("seq digits");
    (seq, path)
}

fn checkpoint_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("checkpoint-{seq:020}.idx"))
}

fn remove_checkpoints(dir: &Path) {
    for path in checkpoint_files(dir) {
        std::fs::remove_file(path).expect("remove checkpoint");
    }
}

/// Everything observable about a store's state, serialized.
#[derive(Debug, PartialEq)]
struct State {
    seq: u64,
    items: u64,
    versions: u64,
    all: String,
    typed: String,
    resolved: String,
    sessions: String,
    pins: Vec<(String, u64, i64, Option<String>, u64)>,
    pinned: Vec<(String, String, String)>,
    known_types: String,
    pattern_check: String,
}

fn state(store: &Store, ids: &[String]) -> State {
    let stats = store.stats();
    let refs: Vec<String> = ids
        .iter()
        .flat_map(|id| [id.clone(), format!("{id}@1"), format!("{id}@2"), format!("{id}@3")])
        .collect();
    let all = serde_json::to_string(&everything(store)).expect("json");
    let typed_query = ContextQuery::new()
        .types(["tool_result", "legal_clause"])
        .time_range(TimeRange::new(NOW - 1_000, NOW + 1_000).expect("range"))
        .newest_first();
    let typed = serde_json::to_string(&store.get(&typed_query).expect("typed get")).expect("json");
    let resolved = serde_json::to_string(&store.resolve(&refs).expect("resolve")).expect("json");
    let session = store.session("s1");
    let sessions = serde_json::to_string(&(
        session.get(&ContextQuery::new()).expect("session get"),
        session.resolve(&refs).expect("session resolve"),
    ))
    .expect("json");
    let list = store.snapshots();
    let pins = list
        .iter()
        .map(|p| (p.name.clone(), p.seq, p.taken_at, p.session.clone(), p.bytes_kept))
        .collect();
    let pinned = list
        .iter()
        .map(|p| {
            let snap = store.open_snapshot(&p.name).expect("open pin");
            (
                serde_json::to_string(&snap.get(&ContextQuery::new()).expect("pin get")).expect("json"),
                serde_json::to_string(&snap.resolve(&refs).expect("pin resolve")).expect("json"),
                snap.digest().expect("digest"),
            )
        })
        .collect();
    // Refused adds write nothing: they show the registered types and their id patterns.
    let known_types = match store.add([ContextItem::new(
        "probe",
        "no_such_type",
        json!(1),
        "probe",
        NOW,
        "1",
        Scope::GlobalReadonly,
    )]) {
        Err(e @ Error::UnknownType { .. }) => e.to_string(),
        other => panic!("an unknown type was not refused: {other:?}"),
    };
    let pattern_check = match store.add([ContextItem::new(
        "not-a-clause",
        "legal_clause",
        json!(1),
        "probe",
        NOW,
        "1",
        Scope::GlobalReadonly,
    )]) {
        Err(e) => e.to_string(),
        Ok(outcome) => panic!("the legal_clause id pattern was not applied: {outcome:?}"),
    };
    State {
        seq: stats.seq,
        items: stats.items,
        versions: stats.versions,
        all,
        typed,
        resolved,
        sessions,
        pins,
        pinned,
        known_types,
        pattern_check,
    }
}

fn varied(n: usize, version: &str) -> ContextItem {
    let kind = ["document_chunk", "tool_result", "message"][n % 3];
    let scope = match n % 4 {
        0 => Scope::GlobalReadonly,
        1 => Scope::GlobalWritable,
        2 => Scope::Session("s1".into()),
        _ => Scope::Session("s2".into()),
    };
    let content = json!({"n": n, "v": version, "pad": "p".repeat(200 + n % 50)});
    let item = ContextItem::new(
        format!("w-{n:03}"),
        kind,
        content,
        format!("src{}", n % 5),
        NOW - 500 + n as i64,
        version,
        scope,
    );
    match n % 3 {
        // Expires at NOW - 50 + 4n: some before the first session, most during the later ones.
        0 => item.with_ttl(450 + 3 * n as u64),
        1 => item.with_confidence(0.25),
        _ => item,
    }
}

/// A store written in three sessions, each closed cleanly. Returns the ids used, the checkpoint
/// (seq, bytes) left by each close, and the state just before the last close.
struct Built {
    ids: Vec<String>,
    /// Taken before the compaction of session B.
    cp_a: (u64, Vec<u8>),
    /// Taken after it.
    cp_b: (u64, Vec<u8>),
    /// The last close's.
    cp_c: (u64, Vec<u8>),
    /// Batches written in session C (after cp_b).
    frames_c: u64,
    before_close: State,
}

fn build(dir: &Path, clock: &Arc<ManualClock>) -> Built {
    let mut ids: Vec<String> = (0..120).map(|n| format!("w-{n:03}")).collect();
    ids.extend((0..10).map(|n| format!("cl_{n}")));
    ids.push("never".into());

    // Session A: types, items, versions, deletes, pins.
    let store = open_manual(dir, clock);
    store
        .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9]+$"))
        .expect("register");
    for n in 0..80 {
        store.add([varied(n, "1")]).expect("add");
    }
    store
        .add((0..10).map(|n| {
            ContextItem::new(
                format!("cl_{n}"),
                "legal_clause",
                json!({"clause": n}),
                "contracts",
                NOW - 100 + n,
                "1",
                Scope::GlobalReadonly,
            )
        }))
        .expect("add clauses");
    store.pin_snapshot("early").expect("pin early");
    store.session("s1").snapshot().pin("s1-early").expect("pin s1");
    for n in (0..80).step_by(4) {
        store.add([varied(n, "2")]).expect("add v2");
    }
    for n in (0..80).step_by(7) {
        store.delete(&format!("w-{n:03}")).expect("delete");
    }
    store.pin_snapshot("dropped").expect("pin");
    assert!(store.unpin_snapshot("dropped").expect("unpin"));
    drop(store);
    let (seq, path) = the_checkpoint(dir);
    let cp_a = (seq, std::fs::read(path).expect("read cp a"));

    // Session B: expiry, compaction (retired and dropped versions), more writes.
    clock.set(NOW + 200);
    let store = open_manual(dir, clock);
    for n in (1..80).step_by(4) {
        store.add([varied(n, "2")]).expect("add v2");
    }
    assert!(store.unpin_snapshot("early").expect("unpin early"));
    let report = store.compact().expect("compact");
    assert!(report.segments_rewritten > 0, "{report:?}");
    assert!(report.retired > 0 && report.reclaimed_deleted > 0, "{report:?}");
    for n in 80..100 {
        store.add([varied(n, "1")]).expect("add");
    }
    drop(store);
    let (seq, path) = the_checkpoint(dir);
    let cp_b = (seq, std::fs::read(path).expect("read cp b"));
    assert!(cp_b.0 > cp_a.0);

    // Session C: more writes, enough to seal segments past cp_b's.
    clock.set(NOW + 400);
    let store = open_manual(dir, clock);
    let mut frames_c = 0;
    for n in 100..120 {
        store.add([varied(n, "1")]).expect("add");
        frames_c += 1;
    }
    for n in (2..60).step_by(9) {
        store.add([varied(n, "3")]).expect("add v3");
        frames_c += 1;
    }
    store.delete("w-101").expect("delete");
    frames_c += 1;
    store.pin_snapshot("late").expect("pin late");
    frames_c += 1;
    store.add([varied(102, "2")]).expect("add v2");
    frames_c += 1;
    let before_close = state(&store, &ids);
    drop(store);
    let (seq, path) = the_checkpoint(dir);
    let cp_c = (seq, std::fs::read(path).expect("read cp c"));
    assert_eq!(cp_c.0, before_close.seq, "the close checkpoints the last seq");
    Built {
        ids,
        cp_a,
        cp_b,
        cp_c,
        frames_c,
        before_close,
    }
}

/// Opens a copy of `pristine` with its checkpoints removed: the full-replay state.
fn full_replay_state(pristine: &Path, clock: &Arc<ManualClock>, ids: &[String]) -> (State, RecoveryStats) {
    let copy = tempfile::tempdir().expect("tempdir");
    copy_store(pristine, copy.path());
    remove_checkpoints(copy.path());
    let store = open_manual(copy.path(), clock);
    let recovery = store.stats().recovery;
    assert_eq!(recovery.checkpoint_seq, None, "{recovery:?}");
    assert_eq!(recovery.checkpoint_rejected, None, "{recovery:?}");
    (state(&store, ids), recovery)
}

fn assert_same(got: &State, want: &State, what: &str) {
    assert_eq!(
        (got.seq, got.items, got.versions),
        (want.seq, want.items, want.versions),
        "{what}: stats"
    );
    assert_eq!(got.pins, want.pins, "{what}: pins");
    assert_eq!(got.known_types, want.known_types, "{what}: registered types");
    assert_eq!(got.pattern_check, want.pattern_check, "{what}: type patterns");
    assert!(got.all == want.all, "{what}: get of everything differs");
    assert!(got.typed == want.typed, "{what}: typed get differs");
    assert!(got.resolved == want.resolved, "{what}: resolves differ");
    assert!(got.sessions == want.sessions, "{what}: session reads differ");
    assert!(got.pinned == want.pinned, "{what}: pinned snapshots answer differently");
}

#[test]
fn a_clean_close_reopens_from_its_checkpoint_to_the_full_replay_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);
    let (full, full_recovery) = full_replay_state(dir.path(), &clock, &built.ids);
    assert!(full_recovery.frames > 100, "{full_recovery:?}");

    let store = open_manual(dir.path(), &clock);
    let recovery = store.stats().recovery;
    println!("from checkpoint: {recovery:?}; full replay: {full_recovery:?}");
    assert_eq!(recovery.checkpoint_seq, Some(built.cp_c.0), "{recovery:?}");
    assert_eq!(recovery.checkpoint_rejected, None, "{recovery:?}");
    assert_eq!(
        recovery.frames, 0,
        "nothing after a clean close's checkpoint: {recovery:?}"
    );
    let from_checkpoint = state(&store, &built.ids);
    assert_same(&from_checkpoint, &full, "checkpoint vs full replay");
    assert_same(&from_checkpoint, &built.before_close, "checkpoint vs before close");
    assert_eq!(full.pins.len(), 2, "{:?}", full.pins);
    assert!(
        full.typed.contains("legal_clause") && full.typed.contains("tool_result"),
        "{}",
        full.typed
    );
    assert!(full.sessions.contains("\"session_id\":\"s1\"") && !full.sessions.contains("\"session_id\":\"s2\""));
    assert!(
        full.pinned.iter().all(|(all, _, _)| all.len() > 1_000),
        "the pins show items"
    );
    assert!(full.items > 50 && full.versions > full.items, "{full:?}");

    // The store opened from a checkpoint keeps working and compacts like any other.
    clock.set(NOW + 2_000);
    store.add([varied(7, "9")]).expect("add after reopen");
    assert!(store.unpin_snapshot("late").expect("unpin"));
    assert!(store.unpin_snapshot("s1-early").expect("unpin"));
    let report = store.compact().expect("compact");
    assert!(report.reclaimed_expired > 0, "{report:?}");
    let verify = store.verify().expect("verify");
    assert!(verify.is_ok(), "{:?}", verify.problems);
}

#[test]
fn writes_after_a_checkpoint_are_replayed_on_top_of_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);

    // An older checkpoint under its own name (the newest removed): the log after it is replayed.
    let older = tempfile::tempdir().expect("tempdir");
    copy_store(dir.path(), older.path());
    remove_checkpoints(older.path());
    std::fs::write(checkpoint_path(older.path(), built.cp_b.0), &built.cp_b.1).expect("write cp b");
    let store = open_manual(older.path(), &clock);
    let recovery = store.stats().recovery;
    assert_eq!(recovery.checkpoint_seq, Some(built.cp_b.0), "{recovery:?}");
    assert_eq!(recovery.checkpoint_rejected, None, "{recovery:?}");
    assert_eq!(recovery.frames, built.frames_c, "the batches after it: {recovery:?}");
    assert_same(
        &state(&store, &built.ids),
        &built.before_close,
        "older checkpoint + log",
    );
    drop(store);

    // A copy taken while the store is open, after flush(): the old checkpoint plus newer log.
    let store = open_manual(dir.path(), &clock);
    assert_eq!(store.stats().recovery.checkpoint_seq, Some(built.cp_c.0));
    let mut frames = 0u64;
    store
        .register_type(TypeSpec::new("audit_note"))
        .expect("register while open");
    frames += 1;
    for n in 120..140 {
        store.add([varied(n, "1")]).expect("add");
        frames += 1;
    }
    store
        .add([ContextItem::new(
            "never",
            "audit_note",
            json!("x"),
            "a",
            NOW,
            "1",
            Scope::GlobalReadonly,
        )])
        .expect("add note");
    frames += 1;
    store.add([varied(0, "5"), varied(1, "5")]).expect("add v5");
    frames += 1;
    assert!(store.delete("w-005").expect("delete"));
    frames += 1;
    store.pin_snapshot("while-open").expect("pin");
    frames += 1;
    assert!(store.unpin_snapshot("late").expect("unpin"));
    frames += 1;
    store.flush().expect("flush");
    let mut ids = built.ids.clone();
    ids.extend((120..140).map(|n| format!("w-{n:03}")));
    let live = state(&store, &ids);
    let copy = tempfile::tempdir().expect("tempdir");
    copy_store(dir.path(), copy.path());
    drop(store);
    assert_eq!(
        checkpoint_files(copy.path()),
        vec![checkpoint_path(copy.path(), built.cp_c.0)]
    );

    let (full, _) = full_replay_state(copy.path(), &clock, &ids);
    let reopened = open_manual(copy.path(), &clock);
    let recovery = reopened.stats().recovery;
    println!("copy taken while open: {recovery:?}");
    assert_eq!(recovery.checkpoint_seq, Some(built.cp_c.0), "{recovery:?}");
    assert_eq!(recovery.checkpoint_rejected, None, "{recovery:?}");
    assert_eq!(recovery.frames, frames, "{recovery:?}");
    let got = state(&reopened, &ids);
    assert_same(&got, &live, "checkpoint + newer log vs the live store");
    assert_same(&got, &full, "checkpoint + newer log vs full replay");
    assert!(got.known_types.contains("audit_note"), "{}", got.known_types);
}

/// Opens a damaged copy of `pristine` and checks that it fell back to the full-replay state.
fn assert_falls_back(
    pristine: &Path,
    clock: &Arc<ManualClock>,
    ids: &[String],
    full: &State,
    what: &str,
    damage: &dyn Fn(&Path),
) {
    let copy = tempfile::tempdir().expect("tempdir");
    copy_store(pristine, copy.path());
    damage(copy.path());
    let store = Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(SEGMENT)
        .auto_compact(false)
        .open(copy.path())
        .unwrap_or_else(|e| panic!("{what}: a bad checkpoint must not keep the store from opening: {e}"));
    let recovery = store.stats().recovery;
    println!("{what}: {:?}", recovery.checkpoint_rejected);
    // The state first: whatever the reason, it must be the full replay's.
    assert_same(&state(&store, ids), full, what);
    assert!(
        recovery.checkpoint_rejected.is_some(),
        "{what}: the checkpoint was used ({recovery:?})"
    );
    assert_eq!(recovery.checkpoint_seq, None, "{what}: {recovery:?}");
    let verify = store.verify().expect("verify");
    assert!(
        verify
            .problems
            .iter()
            .all(|p| !p.file.to_string_lossy().ends_with(".seg")),
        "{what}: the segments are sound: {:?}",
        verify.problems
    );
}

#[test]
fn a_damaged_checkpoint_falls_back_to_a_full_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);
    let (full, _) = full_replay_state(dir.path(), &clock, &built.ids);
    let (seq, _) = the_checkpoint(dir.path());
    let len = built.cp_c.1.len();
    assert!(len > 1_000, "checkpoint of {len} bytes");

    let mut positions = vec![0, 8, 16, 24, 32, 36, 40, 100, len / 3, len / 2, len - 5, len - 1];
    positions.dedup();
    for at in positions {
        assert_falls_back(
            dir.path(),
            &clock,
            &built.ids,
            &full,
            &format!("byte {at} of {len} flipped"),
            &|d| {
                let path = checkpoint_path(d, seq);
                let mut bytes = std::fs::read(&path).expect("read");
                bytes[at] ^= 0x41;
                std::fs::write(&path, bytes).expect("write");
            },
        );
    }
    for keep in [len - 1, len - 4, len / 2, 40, 3, 0] {
        assert_falls_back(
            dir.path(),
            &clock,
            &built.ids,
            &full,
            &format!("truncated to {keep} of {len} bytes"),
            &|d| {
                let path = checkpoint_path(d, seq);
                let bytes = std::fs::read(&path).expect("read");
                std::fs::write(&path, &bytes[..keep]).expect("write");
            },
        );
    }
}

#[test]
fn a_checkpoint_from_before_a_compaction_falls_back_to_a_full_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);
    let (full, _) = full_replay_state(dir.path(), &clock, &built.ids);
    // Taken over segments that compaction rewrote since (the newest checkpoint removed).
    assert_falls_back(
        dir.path(),
        &clock,
        &built.ids,
        &full,
        "a checkpoint from before a compaction",
        &|d| {
            remove_checkpoints(d);
            std::fs::write(checkpoint_path(d, built.cp_a.0), &built.cp_a.1).expect("write cp a");
        },
    );
}

#[test]
fn an_older_checkpoint_copied_over_the_newest_falls_back_to_a_full_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);
    let (full, _) = full_replay_state(dir.path(), &clock, &built.ids);
    // The newest file's name with an older checkpoint's bytes: stale, the log changed after it.
    assert_falls_back(
        dir.path(),
        &clock,
        &built.ids,
        &full,
        "an older checkpoint copied over the newest",
        &|d| std::fs::write(checkpoint_path(d, built.cp_c.0), &built.cp_b.1).expect("write cp b"),
    );
}

#[test]
fn a_checkpoint_renamed_to_another_seq_falls_back_to_a_full_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);
    let (full, _) = full_replay_state(dir.path(), &clock, &built.ids);
    let seq = built.cp_c.0;
    for wrong in [seq + 1, seq - 1, seq + 1_000_000] {
        assert_falls_back(
            dir.path(),
            &clock,
            &built.ids,
            &full,
            &format!("checkpoint of seq {seq} renamed to seq {wrong}"),
            &|d| std::fs::rename(checkpoint_path(d, seq), checkpoint_path(d, wrong)).expect("rename"),
        );
    }
}

#[test]
fn verify_reports_a_damaged_checkpoint_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);
    let store = open_manual(dir.path(), &clock);
    assert_eq!(store.stats().recovery.checkpoint_seq, Some(built.cp_c.0));
    let clean = store.verify().expect("verify");
    assert!(clean.is_ok(), "a sound store: {:?}", clean.problems);

    let path = checkpoint_path(dir.path(), built.cp_c.0);
    let mut bytes = std::fs::read(&path).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&path, bytes).expect("write");
    let report = store.verify().expect("verify");
    println!("verify with a damaged checkpoint: {:?}", report.problems);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.file.to_string_lossy().ends_with(".idx")),
        "verify must report the damaged checkpoint {}: {:?}",
        path.display(),
        report.problems
    );
    assert!(!report.is_ok());
}

/// What the store answers for the ids of `far_expiries_and_many_deletes_...`, in order.
fn rare_answers(store: &Store) -> Vec<String> {
    let refs = ["edge", "far", "endless", "churn", "churn@1", "churn@2"];
    store
        .resolve(refs)
        .expect("resolve")
        .iter()
        .map(|r| match r {
            Resolution::Found(item) => format!("found {}@{}", item.id, item.version),
            Resolution::Expired { id, expired_at } => format!("expired {id} at {expired_at}"),
            Resolution::Superseded {
                id, requested_version, ..
            } => format!("superseded {id}@{requested_version}"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// Expiries more than `u32::MAX` seconds after an item's timestamp, and generations past what a
/// version entry holds (an id deleted 40 times), live in the index's overflow table: they must answer
/// exactly as the small ones do, after a reopen from the checkpoint, after a full replay, and in a
/// pinned snapshot across a compaction.
#[test]
fn far_expiries_and_many_deletes_survive_reopen_replay_and_compaction() {
    const T0: i64 = 1_700_000_000;
    let edge_at = T0 + i64::from(u32::MAX);
    let far_at = T0 + i64::from(u32::MAX) + 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(T0);
    let store = open_manual(dir.path(), &clock);
    store
        .add([
            item("edge", T0, "1", json!({"n": 1})).with_ttl(u64::from(u32::MAX)),
            item("far", T0, "1", json!({"n": 2})).with_ttl(u64::from(u32::MAX) + 10),
            item("endless", T0, "1", json!({"n": 3})).with_ttl(u64::MAX),
        ])
        .expect("add");
    for round in 0..40 {
        store
            .add([item("churn", T0, "1", json!({"round": round}))])
            .expect("add churn");
        if round == 35 {
            // Pinned while generation 35 (in the overflow table) is the current history.
            store.pin_snapshot("round35").expect("pin");
        }
        assert!(store.delete("churn").expect("delete"));
    }
    store
        .add([item("churn", T0, "2", json!({"round": 40}))])
        .expect("add churn 2");

    let fresh = [
        "found edge@1",
        "found far@1",
        "found endless@1",
        "found churn@2",
        // v1 belongs to deleted histories only: the current history knows v2 alone.
        "NotFound { reference: \"churn@1\" }",
        "found churn@2",
    ];
    assert_eq!(rare_answers(&store), fresh);
    clock.set(edge_at);
    let at_edge = [
        format!("expired edge at {edge_at}"),
        "found far@1".into(),
        "found endless@1".into(),
        "found churn@2".into(),
        "NotFound { reference: \"churn@1\" }".into(),
        "found churn@2".into(),
    ];
    assert_eq!(rare_answers(&store), at_edge);
    let pinned = |store: &Store| -> Vec<String> {
        let snap = store.open_snapshot("round35").expect("open pin");
        snap.resolve(["churn", "churn@1"])
            .expect("resolve pinned")
            .iter()
            .map(|r| match r {
                Resolution::Found(item) => format!("found {}@{} {}", item.id, item.version, item.content),
                other => format!("{other:?}"),
            })
            .collect()
    };
    let pinned_answers = vec![
        "found churn@1 {\"round\":35}".to_string(),
        "found churn@1 {\"round\":35}".to_string(),
    ];
    assert_eq!(pinned(&store), pinned_answers);
    drop(store);

    // From the checkpoint, then by a full replay of the log.
    let store = open_manual(dir.path(), &clock);
    assert!(store.stats().recovery.checkpoint_seq.is_some());
    assert_eq!(rare_answers(&store), at_edge);
    assert_eq!(pinned(&store), pinned_answers);
    drop(store);
    for checkpoint in checkpoint_files(dir.path()) {
        std::fs::remove_file(checkpoint).expect("remove checkpoint");
    }
    let store = open_manual(dir.path(), &clock);
    assert!(store.stats().recovery.checkpoint_seq.is_none());
    assert_eq!(rare_answers(&store), at_edge);
    assert_eq!(pinned(&store), pinned_answers);

    // One second before far's expiry, then at it; a compaction keeps what the pin sees.
    clock.set(far_at - 1);
    assert_eq!(rare_answers(&store)[1], "found far@1");
    clock.set(far_at);
    assert_eq!(rare_answers(&store)[1], format!("expired far at {far_at}"));
    let expired = rare_answers(&store);
    // The pin keeps both expired items (it saw them live) and the deleted histories it sees.
    let report = store.compact().expect("compact");
    // The 39 deleted histories the pin does not see are forgotten; round 35's stays.
    assert_eq!(
        (report.reclaimed_expired, report.reclaimed_deleted),
        (0, 39),
        "{report:?}"
    );
    assert_eq!(rare_answers(&store), expired);
    assert_eq!(pinned(&store), pinned_answers);
    drop(store);
    let store = open_manual(dir.path(), &clock);
    assert_eq!(rare_answers(&store), expired);
    assert_eq!(pinned(&store), pinned_answers);
    // Without the pin, compaction reclaims them, and forgets the deleted histories.
    assert!(store.unpin_snapshot("round35").expect("unpin"));
    let report = store.compact().expect("compact");
    assert_eq!(
        (report.reclaimed_expired, report.reclaimed_deleted),
        (2, 1),
        "{report:?}"
    );
    let after = rare_answers(&store);
    assert_eq!(after[0], "NotFound { reference: \"edge\" }");
    assert_eq!(after[1], "NotFound { reference: \"far\" }");
    assert_eq!(after[2..], at_edge[2..]);
    drop(store);
    let store = open_manual(dir.path(), &clock);
    assert_eq!(rare_answers(&store), after);
}

/// What a query by source answers for the sources of `more_sources_than_...`: the ids found for
/// each, in order.
fn by_source(store: &Store, sources: &[String]) -> Vec<Vec<String>> {
    sources
        .iter()
        .map(|source| {
            let query = ContextQuery::new().sources([source.as_str()]);
            let mut ids: Vec<String> = store
                .get(&query)
                .expect("get")
                .into_iter()
                .map(|item| format!("{}@{} {}", item.id, item.version, item.source))
                .collect();
            ids.sort();
            ids
        })
        .collect()
}

/// Source numbers past what a version entry holds (65,535) live in the index's overflow table, as
/// do the versions of an id ended after one of them: a query by source, a resolve and the source of
/// what it returns must answer alike for them and for the small ones, in the store that added them,
/// after a reopen from the checkpoint and after a full replay.
#[test]
fn more_sources_than_an_entry_holds_answer_alike_from_the_checkpoint_and_by_replay() {
    const T0: i64 = 1_700_000_000;
    const N: usize = 65_600;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(T0);
    let open = || {
        Options::new()
            .clock(Arc::clone(&clock) as Arc<dyn Clock>)
            .auto_compact(false)
            .open(dir.path())
            .expect("open store")
    };
    let store = open();
    let source = |n: usize| format!("src-{n}");
    for start in (0..N).step_by(10_000) {
        let batch: Vec<ContextItem> = (start..N.min(start + 10_000))
            .map(|n| {
                let mut it = item(&format!("id-{n}"), T0 + n as i64, "1", json!({"n": n}));
                it.source = source(n);
                it
            })
            .collect();
        store.add(batch).expect("add");
    }
    // A second version of an item from an overflowing source and of one from a small one, each
    // from the other's source.
    let mut late = item("id-65590", T0, "2", json!({"n": "late"}));
    late.source = source(3);
    let mut early = item("id-3", T0, "2", json!({"n": "early"}));
    early.source = source(65_590);
    store.add([late, early]).expect("add second versions");

    let sources: Vec<String> = [0, 3, 65_534, 65_535, 65_536, 65_590, 65_599, N]
        .into_iter()
        .map(source)
        .collect();
    let expected: Vec<Vec<String>> = vec![
        vec!["id-0@1 src-0".into()],
        vec!["id-65590@2 src-3".into()],
        vec!["id-65534@1 src-65534".into()],
        vec!["id-65535@1 src-65535".into()],
        vec!["id-65536@1 src-65536".into()],
        vec!["id-3@2 src-65590".into()],
        vec!["id-65599@1 src-65599".into()],
        vec![],
    ];
    let resolved = |store: &Store| -> Vec<String> {
        store
            .resolve(["id-65599", "id-65590", "id-65590@1", "id-3@1"])
            .expect("resolve")
            .iter()
            .map(|r| match r {
                Resolution::Found(item) => format!("found {}@{} {}", item.id, item.version, item.source),
                Resolution::Superseded {
                    id, requested_version, ..
                } => format!("superseded {id}@{requested_version}"),
                other => format!("{other:?}"),
            })
            .collect()
    };
    let expected_resolves = [
        "found id-65599@1 src-65599",
        "found id-65590@2 src-3",
        "superseded id-65590@1",
        "superseded id-3@1",
    ];
    assert_eq!(by_source(&store, &sources), expected);
    assert_eq!(resolved(&store), expected_resolves);
    drop(store);

    let store = open();
    assert!(store.stats().recovery.checkpoint_seq.is_some());
    assert_eq!(by_source(&store, &sources), expected);
    assert_eq!(resolved(&store), expected_resolves);
    drop(store);
    for checkpoint in checkpoint_files(dir.path()) {
        std::fs::remove_file(checkpoint).expect("remove checkpoint");
    }
    let store = open();
    assert!(store.stats().recovery.checkpoint_seq.is_none());
    assert_eq!(by_source(&store, &sources), expected);
    assert_eq!(resolved(&store), expected_resolves);
}

/// Copies the files of a store that is open, as a crash would leave them: a file that goes away
/// meanwhile (a checkpoint's `.tmp` renamed) is left out.
fn copy_live_store(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("list store") {
        let entry = entry.expect("dir entry");
        match std::fs::copy(entry.path(), to.join(entry.file_name())) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("copying {}: {e}", entry.path().display()),
        }
    }
}

/// `compact()` leaves the last checkpoint stale (it was taken over the segments it rewrote) and
/// returns without writing one: the maintenance thread writes the next in a lull, although the log
/// has not grown by `checkpoint_every`, so that a crash after that reopens from a checkpoint. A
/// crash before it replays the whole log, to the same state.
#[test]
fn the_maintenance_thread_checkpoints_after_a_compaction_without_waiting_for_a_close() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let built = build(dir.path(), &clock);
    clock.set(NOW + 100_000);
    let store = open_manual(dir.path(), &clock);
    assert!(store.stats().recovery.checkpoint_seq.is_some());
    // Long enough for the maintenance thread to have seen the store idle: the compaction must be
    // what makes it write.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let report = store.compact().expect("compact");
    assert!(report.segments_rewritten > 0, "{report:?}");
    let want = state(&store, &built.ids);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut crashes = 0;
    loop {
        // A crash now: the files as they are, the store still open.
        let copy = tempfile::tempdir().expect("tempdir");
        copy_live_store(dir.path(), copy.path());
        let reopened = open_manual(copy.path(), &clock);
        let recovery = reopened.stats().recovery;
        crashes += 1;
        assert_same(
            &state(&reopened, &built.ids),
            &want,
            &format!("crash {crashes} after the compaction"),
        );
        if recovery.checkpoint_seq.is_some() {
            assert_eq!(recovery.checkpoint_rejected, None, "{recovery:?}");
            break;
        }
        assert!(
            recovery.checkpoint_rejected.is_some(),
            "the old checkpoint is there, stale: {recovery:?}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint 30 s after the compaction ({crashes} crashes tried)"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    println!("a checkpoint after {crashes} crashes");
    drop(store);
}

/// After a clean close, opening reads no segment whole: the ones the checkpoint covers are mapped,
/// and so is the one it resumes in, whose frames before the resume point are not copied (a read of
/// the whole newest segment took most of a reopen at 200,000 items). Writes after a reopen go on in
/// that segment and are replayed from the mapping after an unclean stop.
#[test]
fn a_reopen_after_a_clean_close_reads_no_segment_whole() {
    let disk = SimDisk::new();
    let clock = clock_at(NOW);
    let open = |disk: &SimDisk| {
        Options::new()
            .storage(Arc::new(disk.clone()))
            .clock(Arc::clone(&clock) as Arc<dyn Clock>)
            .segment_size(64 << 10)
            .auto_compact(false)
            .open("/store")
            .expect("open")
    };
    let store = open(&disk);
    store
        .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9]+$"))
        .expect("register");
    let ids: Vec<String> = (0..300).map(|n| format!("w-{n:03}")).collect();
    for n in 0..300 {
        store.add([varied(n, "1")]).expect("add");
    }
    let before = state(&store, &ids);
    drop(store);

    disk.record_calls(true);
    let store = open(&disk);
    let whole_reads: Vec<_> = disk
        .call_log()
        .into_iter()
        .filter(|call| call.kind == CallKind::Read && call.path.to_string_lossy().ends_with(".seg"))
        .collect();
    assert!(whole_reads.is_empty(), "segments read whole: {whole_reads:?}");
    let recovery = store.stats().recovery;
    assert!(
        recovery.checkpoint_seq.is_some() && recovery.segments >= 2,
        "{recovery:?}"
    );
    assert_same(&state(&store, &ids), &before, "reopened from the checkpoint");

    // Adds after the reopen land after the resume point; a power cut (everything was synced under
    // the default durability) then leaves them for the next open to replay from the mapping.
    for n in 300..320 {
        store.add([varied(n, "1")]).expect("add");
    }
    let mut more = ids.clone();
    more.extend((300..320).map(|n| format!("w-{n:03}")));
    let live = state(&store, &more);
    let after = disk.crash_losing_unsynced();
    drop(store);
    let store = open(&after);
    let recovery = store.stats().recovery;
    assert_eq!(recovery.frames, 20, "the adds after the checkpoint: {recovery:?}");
    assert_same(&state(&store, &more), &live, "checkpoint + replayed tail");
}

/// A close writes its checkpoint to the file in steps of 1 MiB (it is not built whole in memory). A
/// power cut after any call of that close, losing everything unsynced, leaves a store that opens
/// with every item: from the checkpoint once its rename is durable, by replaying the log before.
#[test]
fn a_power_cut_at_any_call_of_a_streamed_close_checkpoint_loses_nothing() {
    const ITEMS: usize = 45_000;
    let clock = clock_at(NOW);
    let open = |disk: &SimDisk| {
        Options::new()
            .storage(Arc::new(disk.clone()))
            .clock(Arc::clone(&clock) as Arc<dyn Clock>)
            .durability(Durability::Never)
            .auto_compact(false)
            .open("/store")
            .expect("open")
    };
    let loaded = || {
        let disk = SimDisk::new();
        let store = open(&disk);
        for first in (0..ITEMS).step_by(1000) {
            store
                .add((first..first + 1000).map(|n| item(&format!("doc-{n:05}"), NOW, "1", json!({ "n": n }))))
                .expect("add");
        }
        store.flush().expect("flush");
        (disk, store)
    };
    // The close's calls, counted once.
    let (disk, store) = loaded();
    disk.record_calls(true);
    let from = disk.calls();
    drop(store);
    let close: Vec<_> = disk.call_log().into_iter().filter(|call| call.index >= from).collect();
    let steps = close
        .iter()
        .filter(|call| call.kind == CallKind::Append && call.path.to_string_lossy().ends_with(".idx.tmp"))
        .count();
    let checkpoint_len = disk
        .file_names(Path::new("/store"))
        .iter()
        .find(|name| name.ends_with(".idx"))
        .and_then(|name| disk.file_bytes(&Path::new("/store").join(name)))
        .map_or(0, |bytes| bytes.len());
    assert!(
        checkpoint_len > 3 << 20 && steps >= 4,
        "a checkpoint of {checkpoint_len} bytes in {steps} appends"
    );
    println!(
        "a checkpoint of {checkpoint_len} bytes in {steps} appends; {} calls in the close",
        close.len()
    );
    for cut in 0..close.len() as u64 {
        let (disk, store) = loaded();
        disk.cut_power_after(cut);
        drop(store);
        let store = open(&disk.crash_losing_unsynced());
        let stats = store.stats();
        assert_eq!(
            stats.items,
            ITEMS as u64,
            "power cut after call {cut} of the close ({:?}): {:?}",
            close
                .get(usize::try_from(cut).unwrap_or(usize::MAX))
                .map(|call| call.kind),
            stats.recovery
        );
        let last = format!("doc-{:05}", ITEMS - 1);
        let found = store.resolve([last.as_str()]).expect("resolve");
        assert!(
            matches!(found.first(), Some(Resolution::Found(_))),
            "cut {cut}: {found:?}"
        );
        if cut + 1 == close.len() as u64 {
            assert!(
                stats.recovery.checkpoint_seq.is_some(),
                "the whole close gave no checkpoint"
            );
        }
    }
}

/// A checkpoint taken while the writer seals a segment in the middle of a group (the next frame did
/// not fit) must be usable after a crash. Until the group is published, the sealed segment is in the
/// index with frames past its sequence number, and the new one starts past the number after it: a
/// checkpoint taken then marked the sealed segment as covered and resumed in the new one at a
/// sequence number that is not there, so the next open refused it and replayed the whole log
/// (11-13% of the checkpoints below, before the checkpoint waited for such a group).
#[test]
fn a_checkpoint_taken_while_a_group_seals_its_segment_is_used_after_a_crash() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    let store = open_manual(dir.path(), &clock);
    let stop = Arc::new(AtomicBool::new(false));
    let added = Arc::new(AtomicU64::new(0));
    // Concurrent single adds of ~600-byte items make groups of several frames, and a 16 KiB segment
    // fills every few groups.
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let (store, stop, added) = (store.clone(), Arc::clone(&stop), Arc::clone(&added));
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let text = incompressible(&format!("{t}-{i}"), 600);
                    store
                        .add([item(&format!("w{t}-{i}"), NOW, "1", json!({ "text": text }))])
                        .expect("add");
                    added.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    let saved = tempfile::tempdir().expect("tempdir");
    let mut checkpoints = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && checkpoints.len() < 80 {
        let seq = ctxlog::testing::bench::checkpoint(&store).expect("checkpoint");
        let name = format!("checkpoint-{seq:020}.idx");
        // The next checkpoint may have replaced it already.
        if std::fs::copy(dir.path().join(&name), saved.path().join(&name)).is_ok() {
            checkpoints.push((seq, name));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().expect("writer");
    }
    let total = store.stats().items;
    assert_eq!(total, added.load(Ordering::Relaxed));
    assert!(checkpoints.len() >= 20, "only {} checkpoints taken", checkpoints.len());
    let mut refused = Vec::new();
    for (seq, name) in &checkpoints {
        // A crash now, with this checkpoint the newest: every segment as it is.
        let copy = tempfile::tempdir().expect("tempdir");
        for entry in std::fs::read_dir(dir.path()).expect("list the store") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|ext| ext == "seg") {
                std::fs::copy(&path, copy.path().join(path.file_name().expect("name"))).expect("copy segment");
            }
        }
        std::fs::copy(saved.path().join(name), copy.path().join(name)).expect("copy checkpoint");
        let reopened = open_manual(copy.path(), &clock);
        let stats = reopened.stats();
        assert_eq!(stats.items, total, "checkpoint {seq}: {:?}", stats.recovery);
        if stats.recovery.checkpoint_seq != Some(*seq) {
            refused.push((*seq, stats.recovery.checkpoint_rejected.clone()));
        }
    }
    assert!(
        refused.is_empty(),
        "{} of {} checkpoints ({} items, {} segments) were refused on open: {:#?}",
        refused.len(),
        checkpoints.len(),
        total,
        store.stats().segments,
        refused.iter().take(3).collect::<Vec<_>>()
    );
}

#[test]
fn a_checkpoint_whose_segment_starts_past_its_seq_is_refused_at_once() {
    // A checkpoint at seq S was taken over segments that all start at S + 1 at the latest. A pair
    // that says otherwise (CRCs intact: a crafted or mismatched pair) would leave the index behind
    // the segment the next batches go to: every later checkpoint would wait for a group that never
    // comes, and new frames would carry seqs below their segment's first. The checkpoint is
    // refused, and the full replay judges the log: here it refuses it too (segment 1 must start at
    // seq 1), at once.
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW);
    {
        let store = open_manual(dir.path(), &clock);
        for n in 0..5 {
            store.add([varied(n, "1")]).expect("add");
        }
    }
    let (seq, _) = the_checkpoint(dir.path());
    let segment = dir.path().join("00000001.seg");
    let mut bytes = std::fs::read(&segment).expect("read segment");
    bytes[16..24].copy_from_slice(&(seq + 10).to_le_bytes());
    std::fs::write(&segment, ctxlog::testing::fuzz::seal_segment(&bytes)).expect("write segment");

    let started = std::time::Instant::now();
    let opened = Options::new()
        .clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .segment_size(SEGMENT)
        .auto_compact(false)
        .open(dir.path());
    match &opened {
        Err(Error::Corrupt { file, offset, reason }) => {
            assert!(file.ends_with("00000001.seg"), "{file:?}");
            assert_eq!(*offset, 16, "{reason}");
            assert!(reason.contains("starts at seq"), "{reason}");
        }
        other => panic!("opened with a segment that starts past the checkpoint: {other:?}"),
    }
    drop(opened);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "refusing took {:?}",
        started.elapsed()
    );
}
