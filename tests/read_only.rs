//! `Options::read_only`: a store opened to look inside answers as a writer's handle would, refuses
//! every write by name, and leaves every byte of its directory as it found it: no lock file, no
//! truncated tail, no checkpoint, no store made out of a directory that holds none.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use ctxlog::*;
use serde_json::json;

fn read_only_at(dir: &Path, clock: &Arc<ManualClock>) -> Result<Store, Error> {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .read_only(true)
        .open(dir)
}

/// A store with a little of everything: items in two scopes, a superseded version, an expired
/// item, a delete, a pin and a registered type. Closed when this returns.
fn write_store(dir: &Path, clock: &Arc<ManualClock>) {
    let store = open_at(dir, clock);
    store
        .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9a-z]+$"))
        .expect("register");
    let items: Vec<ContextItem> = (0..50)
        .map(|i| {
            item(
                &format!("c{i}"),
                NOW - 100 + i,
                "1",
                json!({"text": format!("chunk {i}")}),
            )
        })
        .collect();
    store.add(items).expect("add");
    store
        .session("s1")
        .add([ContextItem::new(
            "prefs",
            "user_profile",
            json!({"lang": "fr"}),
            "tests",
            NOW,
            "1",
            Scope::Session("s1".into()),
        )])
        .expect("session add");
    store
        .add([item("c3", NOW, "2", json!({"text": "revised"}))])
        .expect("revise");
    store
        .add([item("brief", NOW - 10, "1", json!({"text": "short-lived"})).with_ttl(5)])
        .expect("add expiring");
    store.delete("c7").expect("delete");
    store.pin_snapshot("audit").expect("pin");
    store
        .add([ContextItem::new(
            "cl_1",
            "legal_clause",
            json!({"text": "clause"}),
            "tests",
            NOW,
            "1",
            Scope::GlobalReadonly,
        )])
        .expect("add clause");
}

/// What a handle answers, serialised: everything, a few resolves, a session's view, the pin's view
/// and digest, and the change feed.
fn answers(store: &Store) -> String {
    let refs = ["c3", "c3@1", "c7", "brief", "cl_1", "prefs", "nope"];
    let pinned = store.open_snapshot("audit").expect("open the pin");
    let mut pins: Vec<(String, u64, i64)> = store
        .snapshots()
        .into_iter()
        .map(|info| (info.name, info.seq, info.taken_at))
        .collect();
    pins.sort();
    serde_json::to_string(&json!({
        "everything": everything(store),
        "resolve": store.resolve(refs).expect("resolve"),
        "session": store.session("s1").get(&ContextQuery::new()).expect("session get"),
        "pinned": pinned.get(&ContextQuery::new()).expect("pinned get"),
        "digest": pinned.digest().expect("digest"),
        "pins": pins,
        "feed": feed(store, 0),
        "last_seq": store.last_seq(),
        "past": store.snapshot_at(2).expect("snapshot_at").get(&ContextQuery::new()).expect("past get"),
    }))
    .expect("serialise")
}

#[test]
fn a_read_only_handle_answers_as_a_writer_does_and_changes_no_byte() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let expected = {
        let copy = tempfile::tempdir().expect("tempdir");
        copy_store(dir.path(), copy.path());
        answers(&open_at(copy.path(), &clock))
    };
    let before = dir_contents(dir.path());

    let store = read_only_at(dir.path(), &clock).expect("read-only open");
    assert_eq!(answers(&store), expected);
    let stats = store.stats();
    assert_eq!(
        stats.items, 52,
        "50 chunks less one deleted, the expired one, a clause and a session's item"
    );
    assert_eq!((stats.sessions, stats.pins), (1, 1), "{stats:?}");
    let report = store.verify().expect("verify");
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.records_checked > 0);
    // A subscription replays the durable history like the feed.
    let mut subscription = store.subscribe(ChangeFilter::new().after(0)).expect("subscribe");
    let mut replayed = Vec::new();
    while let Some(change) = subscription
        .recv_timeout(std::time::Duration::from_millis(200))
        .expect("recv")
    {
        replayed.push(change);
    }
    assert_eq!(replayed, feed(&store, 0));
    drop(subscription);
    assert_eq!(store.flush().map_err(|e| e.to_string()), Ok(()));
    drop(store);

    assert_eq!(
        dir_contents(dir.path()),
        before,
        "a read-only open changed the directory"
    );
}

#[test]
fn every_write_is_refused_by_name_and_writes_nothing() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let before = dir_contents(dir.path());
    let store = read_only_at(dir.path(), &clock).expect("read-only open");
    let last = store.last_seq();

    let refused = |result: Result<(), Error>, operation: &str| match result {
        Err(Error::ReadOnly { operation: named }) => {
            assert_eq!(named, operation);
            let message = Error::ReadOnly { operation: named }.to_string();
            assert!(
                message.contains("read-only") && message.contains(operation),
                "{message}"
            );
        }
        other => panic!("{operation}: expected ReadOnly, got {other:?}"),
    };
    refused(store.add([item("new", NOW, "1", json!({}))]).map(drop), "add");
    refused(
        store
            .session("s1")
            .add([ContextItem::new(
                "p2",
                "user_profile",
                json!({}),
                "tests",
                NOW,
                "1",
                Scope::Session("s1".into()),
            )])
            .map(drop),
        "add",
    );
    refused(store.delete("c1").map(drop), "delete");
    refused(store.register_type(TypeSpec::new("other_type")), "register_type");
    refused(store.pin_snapshot("second").map(drop), "pin_snapshot");
    refused(store.snapshot().pin("third").map(drop), "pin_snapshot");
    refused(store.unpin_snapshot("audit").map(drop), "unpin_snapshot");
    refused(store.compact().map(drop), "compact");

    // Bad input is still judged first: a refusal for the item, not for the handle.
    assert!(matches!(
        store.add([item("bad id!", NOW, "1", json!({}))]),
        Err(Error::Invalid { .. })
    ));
    // Advancing the clock past an expiry commits nothing either.
    clock.advance(3600);
    assert_eq!(store.expire_due().expect("expire_due"), 0);
    assert_eq!(store.last_seq(), last);
    assert_eq!(store.snapshots().len(), 1);
    drop(store);
    assert_eq!(dir_contents(dir.path()), before);

    // A writer's handle afterwards finds the store as it was, and writes.
    let store = open_at(dir.path(), &clock);
    assert_eq!(store.last_seq(), last);
    store.add([item("new", NOW, "1", json!({}))]).expect("a writer adds");
}

#[test]
fn a_directory_without_a_store_is_not_a_store_and_stays_as_it_was() {
    let clock = clock_at(NOW);
    let parent = tempfile::tempdir().expect("tempdir");

    let missing = parent.path().join("missing");
    match read_only_at(&missing, &clock) {
        Err(Error::NotAStore { path }) => assert_eq!(path, missing),
        other => panic!("expected NotAStore, got {:?}", other.map(|_| ())),
    }
    assert!(!missing.exists(), "a read-only open created the directory");

    let empty = parent.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let unrelated = parent.path().join("unrelated");
    std::fs::create_dir(&unrelated).expect("mkdir");
    std::fs::write(unrelated.join("notes.txt"), b"not a store").expect("write");
    // A checkpoint-like name alone is no store either: a store has segments.
    std::fs::write(unrelated.join("LOCK"), b"").expect("write");
    for dir in [&empty, &unrelated] {
        let before = dir_contents(dir);
        let Err(error) = read_only_at(dir, &clock) else {
            panic!("{} opened as a store", dir.display())
        };
        assert!(matches!(&error, Error::NotAStore { path } if path == dir), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains("not a ctxlog store") && message.contains(&dir.display().to_string()),
            "{message}"
        );
        assert_eq!(dir_contents(dir), before);
    }
}

#[test]
fn a_read_only_handle_and_a_writer_never_share_a_store() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);

    let writer = open_at(dir.path(), &clock);
    assert!(matches!(read_only_at(dir.path(), &clock), Err(Error::Locked { .. })));
    drop(writer);

    let reader = read_only_at(dir.path(), &clock).expect("read-only open");
    assert!(matches!(
        Options::new().open(dir.path()).map(|_| ()),
        Err(Error::Locked { .. })
    ));
    assert!(matches!(read_only_at(dir.path(), &clock), Err(Error::Locked { .. })));
    drop(reader);
    open_at(dir.path(), &clock);
}

#[test]
fn a_torn_tail_is_read_up_to_and_left_for_the_writer_to_cut() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let expected = {
        let store = read_only_at(dir.path(), &clock).expect("read-only open");
        answers(&store)
    };
    // A batch torn by a crash: a frame header promising more bytes than follow.
    let newest = segment_files(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&newest).expect("read");
    let end = frames_end(&bytes);
    bytes.truncate(end);
    bytes.extend_from_slice(&[200, 0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 1, 2, 3]);
    std::fs::write(&newest, &bytes).expect("tear");
    let before = dir_contents(dir.path());

    let store = read_only_at(dir.path(), &clock).expect("read-only open of a torn store");
    assert_eq!(answers(&store), expected);
    assert!(store.stats().recovery.truncated_bytes > 0, "the torn tail is reported");
    drop(store);
    assert_eq!(dir_contents(dir.path()), before, "the torn tail is left in place");

    // The writer cuts it, as it always did.
    let store = open_at(dir.path(), &clock);
    assert_eq!(answers(&store), expected);
    drop(store);
    assert!(std::fs::read(&newest).expect("read").len() < bytes.len());
}

#[test]
fn a_store_copied_without_its_lock_file_opens_without_one() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let copy = tempfile::tempdir().expect("tempdir");
    copy_store(dir.path(), copy.path());
    std::fs::remove_file(copy.path().join("LOCK")).expect("remove the copied lock file");
    let before = dir_contents(copy.path());

    let store = read_only_at(copy.path(), &clock).expect("read-only open");
    assert_eq!(store.stats().items, 52);
    drop(store);
    assert_eq!(dir_contents(copy.path()), before, "no LOCK file was created");
}

#[test]
fn every_older_format_opens_read_only_and_stays_as_it_was() {
    let clock = clock_at(NOW);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut opened = 0;
    for entry in std::fs::read_dir(&fixtures).expect("listing the fixtures") {
        let fixture = entry.expect("dir entry").path();
        if !fixture
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("format-"))
        {
            continue;
        }
        let (looked, written) = (
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        );
        copy_store(&fixture, looked.path());
        copy_store(&fixture, written.path());
        let before = dir_contents(looked.path());
        let store = read_only_at(looked.path(), &clock).expect("read-only open of a fixture");
        let writer = open_at(written.path(), &clock);
        assert_eq!(everything(&store), everything(&writer), "{}", fixture.display());
        assert_eq!(store.last_seq(), writer.last_seq(), "{}", fixture.display());
        assert_eq!(store.snapshots(), writer.snapshots(), "{}", fixture.display());
        drop(store);
        assert_eq!(dir_contents(looked.path()), before, "{}", fixture.display());
        opened += 1;
    }
    assert!(opened >= 7, "only {opened} format fixtures found");
}

/// A process started by another thread holds a copy of the store's lock until it executes its
/// program: a store dropped and reopened meanwhile waits for it rather than fail as `Locked`.
#[test]
fn a_process_starting_beside_a_reopen_never_makes_it_locked() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spawner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut started = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::process::Command::new("true").status().expect("run true");
                started += 1;
            }
            started
        })
    };
    for round in 0..200 {
        let store = if round % 2 == 0 {
            Options::new()
                .clock(Arc::clone(&clock) as Arc<dyn Clock>)
                .open(dir.path())
        } else {
            read_only_at(dir.path(), &clock)
        };
        match store {
            Ok(store) => drop(store),
            Err(e) => panic!("round {round}: {e}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        spawner.join().expect("spawner") > 10,
        "processes were started meanwhile"
    );
}
