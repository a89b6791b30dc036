//! TTL, judged by a `ManualClock`: an item is visible up to the second before `timestamp + ttl`, and
//! from that exact second on it is left out of `get` and resolves `Expired { id, expired_at }` (also
//! for `id@version` refs, and after a reopen); the latest version expiring does not bring back an older
//! one; a snapshot judges TTL at its `taken_at`, so it keeps returning an item the clock has passed.

mod common;

use common::*;
use ctxlog::*;
use serde_json::json;

const TS: i64 = 1_715_299_200;
const TTL: u64 = 3_600;
const EXPIRES_AT: i64 = TS + TTL as i64;

fn expiring() -> ContextItem {
    item("temp", TS, "1", json!({"token": "abc"})).with_ttl(TTL)
}

fn forever() -> ContextItem {
    item("perm", TS + 10, "1", json!("stays"))
}

fn expired(id: &str) -> Resolution {
    Resolution::Expired {
        id: id.into(),
        expired_at: EXPIRES_AT,
    }
}

/// The store at the clock's current time sees `temp` as visible (true) or expired (false).
fn assert_visible(store: &Store, visible: bool) {
    let all = everything(store);
    let window = ContextQuery::new()
        .types(["document_chunk"])
        .time_range(TimeRange::new(TS, TS).expect("range"));
    let in_window = store.get(&window).expect("get");
    let resolved = store.resolve(["temp", "temp@1", "perm"]).expect("resolve");
    assert_eq!(resolved[2], Resolution::Found(stored_form(&forever())));
    if visible {
        assert_eq!(all, vec![stored_form(&expiring()), stored_form(&forever())]);
        assert_eq!(in_window, vec![stored_form(&expiring())]);
        assert_eq!(resolved[0], Resolution::Found(stored_form(&expiring())));
        assert_eq!(resolved[1], Resolution::Found(stored_form(&expiring())));
    } else {
        assert_eq!(all, vec![stored_form(&forever())]);
        assert!(in_window.is_empty(), "{in_window:?}");
        assert_eq!(resolved[0], expired("temp"));
        assert_eq!(resolved[1], expired("temp"), "id@version of an expired id");
    }
}

#[test]
fn expiry_starts_at_exactly_timestamp_plus_ttl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(TS);
    let store = open_at(dir.path(), &clock);
    store.add([expiring(), forever()]).expect("add");
    assert_eq!(expiring().expires_at(), Some(EXPIRES_AT));

    assert_visible(&store, true);
    clock.set(EXPIRES_AT - 1);
    assert_visible(&store, true);
    clock.set(EXPIRES_AT);
    assert_visible(&store, false);
    clock.set(EXPIRES_AT + 1_000_000);
    assert_visible(&store, false);
    // Moving the clock back makes it visible again: expiry is judged at read time, not stored.
    clock.set(EXPIRES_AT - 1);
    assert_visible(&store, true);
}

#[test]
fn expiry_is_judged_the_same_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(TS);
    {
        let store = open_at(dir.path(), &clock);
        store.add([expiring(), forever()]).expect("add");
    }
    clock.set(EXPIRES_AT - 1);
    {
        let store = open_at(dir.path(), &clock);
        assert_visible(&store, true);
    }
    clock.set(EXPIRES_AT);
    let store = open_at(dir.path(), &clock);
    assert_visible(&store, false);
    // An expired item still counts as added: a delete reports it.
    assert!(store.delete("temp").expect("delete"));
    assert!(matches!(
        &store.resolve(["temp"]).expect("resolve")[0],
        Resolution::NotFound { .. }
    ));
}

#[test]
fn version_refs_of_an_expired_id_answer_expired_and_older_versions_do_not_come_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(TS);
    let store = open_at(dir.path(), &clock);
    // v1 never expires; v2 (the latest) expires at EXPIRES_AT.
    let v1 = item("temp", TS - 100, "1", json!("old, permanent"));
    let v2 = item("temp", TS, "2", json!("new, expiring")).with_ttl(TTL);
    store.add([v1]).expect("v1");
    store.add([v2.clone()]).expect("v2");
    clock.set(EXPIRES_AT - 1);
    assert_eq!(
        store.resolve(["temp@1"]).expect("resolve"),
        vec![Resolution::Superseded {
            id: "temp".into(),
            requested_version: "1".into(),
            latest: stored_form(&v2),
        }]
    );
    clock.set(EXPIRES_AT);
    assert_eq!(
        store.resolve(["temp", "temp@1", "temp@2"]).expect("resolve"),
        vec![expired("temp"), expired("temp"), expired("temp")]
    );
    assert!(
        everything(&store).is_empty(),
        "the older, unexpired version must not reappear"
    );
    let all_time = ContextQuery::new().time_range(TimeRange::new(0, EXPIRES_AT * 2).expect("range"));
    assert!(store.get(&all_time).expect("get").is_empty());
}

#[test]
fn a_snapshot_judges_ttl_at_its_taken_at() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(TS);
    let store = open_at(dir.path(), &clock);
    store.add([expiring(), forever()]).expect("add");
    clock.set(EXPIRES_AT - 1);
    let snap = store.snapshot();
    assert_eq!(snap.taken_at(), EXPIRES_AT - 1);
    let session_snap = store.session("s1").snapshot();

    clock.set(EXPIRES_AT + 86_400);
    assert_visible(&store, false);
    for view in [&snap, &session_snap] {
        assert_eq!(
            view.get(&ContextQuery::new()).expect("get"),
            vec![stored_form(&expiring()), stored_form(&forever())]
        );
        assert_eq!(
            view.resolve(["temp", "temp@1"]).expect("resolve"),
            vec![
                Resolution::Found(stored_form(&expiring())),
                Resolution::Found(stored_form(&expiring()))
            ]
        );
    }
    // A snapshot taken now sees it expired.
    let late = store.snapshot();
    assert_eq!(late.taken_at(), EXPIRES_AT + 86_400);
    assert_eq!(late.resolve(["temp"]).expect("resolve"), vec![expired("temp")]);
    assert_eq!(
        late.get(&ContextQuery::new()).expect("get"),
        vec![stored_form(&forever())]
    );
}
