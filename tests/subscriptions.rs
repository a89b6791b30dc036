//! Live subscriptions: delivery in order and exactly once beside concurrent writers, the meeting of
//! the replayed history and the live changes, filters, session isolation, lag, restarts, and a
//! blocked `recv` woken by a change or by the store closing.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::feed;
use ctxlog::{
    Change, ChangeFilter, Clock, ContextItem, Durability, Error, ManualClock, Options, Scope, Store, Subscription,
};
use serde_json::json;

/// 2024-05-10T10:00:00Z.
const NOW: i64 = 1_715_335_200;
/// How long a test waits for a change it expects.
const PATIENCE: Duration = Duration::from_secs(20);

fn open(dir: &Path, durability: Durability) -> Store {
    Options::new()
        .durability(durability)
        .auto_compact(false)
        .open(dir)
        .expect("open")
}

fn item(id: &str, kind: &str, version: &str, scope: Scope) -> ContextItem {
    ContextItem::new(id, kind, json!({"id": id, "v": version}), "tests", NOW, version, scope)
}

/// Waits until the dispatcher has found `subscription` lagging (at most `PATIENCE`).
fn wait_lagged(subscription: &Subscription) {
    let until = Instant::now() + PATIENCE;
    while !subscription.is_lagged() {
        assert!(Instant::now() < until, "the subscription never lagged");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Exactly `count` changes from `subscription`, then nothing more for a moment.
fn take_exactly(subscription: &mut Subscription, count: usize) -> Vec<Change> {
    let mut got = Vec::with_capacity(count);
    while got.len() < count {
        match subscription.recv_timeout(PATIENCE).expect("recv") {
            Some(change) => got.push(change),
            None => panic!("only {} of {count} changes came: {got:?}", got.len()),
        }
    }
    let extra = subscription.recv_timeout(Duration::from_millis(100)).expect("recv");
    assert_eq!(extra, None, "a change beyond the {count} expected");
    got
}

fn scope_of(change: &Change) -> Option<&Scope> {
    match change {
        Change::Added { scope, .. } | Change::Deleted { scope, .. } => Some(scope),
        _ => None,
    }
}

/// `threads` threads each adding `per_thread` items (one batch each, some of two items) and
/// deleting every third id it added.
fn write_from_threads(store: &Store, threads: usize, per_thread: usize, tag: &str) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            let store = store.clone();
            scope.spawn(move || {
                for i in 0..per_thread {
                    let id = format!("{tag}-{t}-{i}");
                    if i % 4 == 0 {
                        store
                            .add([
                                item(&id, "message", "1", Scope::GlobalWritable),
                                item(&format!("{id}-pair"), "message", "1", Scope::GlobalWritable),
                            ])
                            .expect("add");
                    } else {
                        store
                            .add([item(&id, "message", "1", Scope::GlobalWritable)])
                            .expect("add");
                    }
                    if i % 3 == 2 {
                        assert!(store.delete(&id).expect("delete"));
                    }
                }
            });
        }
    });
}

#[test]
fn live_changes_come_in_order_exactly_once_under_every_durability() {
    for durability in [
        Durability::Immediate,
        Durability::Periodic(Duration::from_millis(20)),
        Durability::Never,
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path(), durability);
        let mut subscription = store.subscribe(ChangeFilter::new()).expect("subscribe");
        write_from_threads(&store, 4, 30, "live");
        let expected = feed(&store, 0);
        assert!(expected.iter().any(|c| matches!(c, Change::Deleted { .. })));
        let got = take_exactly(&mut subscription, expected.len());
        assert_eq!(got, expected, "under {durability:?}");
        assert!(got.windows(2).all(|w| w[0].seq() <= w[1].seq()));
    }
}

#[test]
fn a_replay_meets_the_live_changes_with_no_gap_and_no_duplicate_while_writers_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), Durability::Immediate);
    write_from_threads(&store, 2, 20, "before");
    let after = store.last_seq() / 2;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(4));
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let (store, stop, start) = (store.clone(), Arc::clone(&stop), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) || i < 20 {
                    let id = format!("during-{t}-{i}");
                    store
                        .add([item(&id, "message", "1", Scope::GlobalWritable)])
                        .expect("add");
                    if i % 5 == 4 {
                        store.delete(&id).expect("delete");
                    }
                    i += 1;
                }
            })
        })
        .collect();
    start.wait();
    std::thread::sleep(Duration::from_millis(20));
    let before = store.last_seq();
    let mut subscription = store.subscribe(ChangeFilter::new().after(after)).expect("subscribe");
    let since = store.last_seq();
    let mut got = Vec::new();
    // Read while the writers go on, across the end of the replay.
    let reading_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < reading_until {
        if let Some(change) = subscription.recv_timeout(Duration::from_millis(10)).expect("recv") {
            got.push(change);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().expect("writer");
    }
    let expected = feed(&store, after);
    let rest = take_exactly(&mut subscription, expected.len() - got.len());
    got.extend(rest);
    assert_eq!(got, expected);
    // Both sides of the meeting point were crossed: replayed changes and live ones.
    assert!(got.iter().any(|c| c.seq() <= Some(before)) && got.iter().any(|c| c.seq() > Some(since)));
}

#[test]
fn under_periodic_durability_a_change_waits_for_the_sync_that_covers_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), Durability::Periodic(Duration::from_secs(3600)));
    store
        .add([item("old", "message", "1", Scope::GlobalWritable)])
        .expect("add");
    store.flush().expect("flush");
    let mut live = store.subscribe(ChangeFilter::new()).expect("subscribe");
    store
        .add([item("new", "message", "1", Scope::GlobalWritable)])
        .expect("add");
    let mut replayed = store.subscribe(ChangeFilter::new().after(0)).expect("subscribe");
    let first = replayed
        .recv_timeout(PATIENCE)
        .expect("recv")
        .expect("the durable change");
    assert_eq!(first.id(), Some("old"));
    // Visible, not durable yet: neither the live nor the replaying subscription delivers it.
    assert_eq!(live.recv_timeout(Duration::from_millis(100)).expect("recv"), None);
    assert_eq!(replayed.recv_timeout(Duration::from_millis(100)).expect("recv"), None);
    assert_eq!(replayed.try_recv().expect("try_recv"), None);
    store.flush().expect("flush");
    let expected = feed(&store, 1);
    assert_eq!(take_exactly(&mut live, 1), expected);
    assert_eq!(take_exactly(&mut replayed, 1), expected);
}

#[test]
fn filters_deliver_what_the_feed_filtered_alike_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), Durability::Immediate);
    let filters = [
        ChangeFilter::new().types(["tool_result"]),
        ChangeFilter::new().ids(["a", "c"]),
        ChangeFilter::new().scopes([Scope::Session("s1".into()), Scope::GlobalReadonly]),
        ChangeFilter::new().types(["message"]).scopes([Scope::GlobalWritable]),
    ];
    let mut live: Vec<Subscription> = filters
        .iter()
        .map(|filter| store.subscribe(filter.clone()).expect("subscribe"))
        .collect();
    let kinds = ["message", "tool_result"];
    let scopes = [
        Scope::GlobalWritable,
        Scope::GlobalReadonly,
        Scope::Session("s1".into()),
    ];
    let ids = ["a", "b", "c", "d", "e", "f"];
    for (i, id) in ids.iter().enumerate() {
        for v in 1..=2 {
            store
                .add([item(id, kinds[i % 2], &v.to_string(), scopes[(i + v) % 3].clone())])
                .expect("add");
        }
    }
    store.delete("a").expect("delete");
    store.delete("d").expect("delete");
    let all = feed(&store, 0);
    for (filter, subscription) in filters.iter().zip(&mut live) {
        let expected: Vec<Change> = all
            .iter()
            .filter(|change| {
                let (id, kind) = match change {
                    Change::Added { id, kind, .. } => (id, Some(kind.as_str())),
                    // A delete is of the type of the version it ended.
                    Change::Deleted { id, .. } => {
                        let at = ids.iter().position(|known| known == id).expect("a known id");
                        (id, Some(kinds[at % 2]))
                    }
                    other => panic!("unexpected {other:?}"),
                };
                let types_ok = match filter {
                    f if f == &filters[0] => kind == Some("tool_result"),
                    f if f == &filters[3] => kind == Some("message"),
                    _ => true,
                };
                let ids_ok = filter != &filters[1] || id == "a" || id == "c";
                let scopes_ok = match filter {
                    f if f == &filters[2] => {
                        matches!(scope_of(change), Some(Scope::Session(s)) if s == "s1")
                            || scope_of(change) == Some(&Scope::GlobalReadonly)
                    }
                    f if f == &filters[3] => scope_of(change) == Some(&Scope::GlobalWritable),
                    _ => true,
                };
                types_ok && ids_ok && scopes_ok
            })
            .cloned()
            .collect();
        assert!(!expected.is_empty(), "{filter:?}");
        assert_eq!(take_exactly(subscription, expected.len()), expected, "live, {filter:?}");
        let mut replayed = store.subscribe(filter.clone().after(0)).expect("subscribe");
        assert_eq!(
            take_exactly(&mut replayed, expected.len()),
            expected,
            "replayed, {filter:?}"
        );
    }
}

#[test]
fn a_session_receives_its_own_and_the_global_changes_and_never_another_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), Durability::Immediate);
    store
        .add([item("early", "message", "1", Scope::Session("s2".into()))])
        .expect("add");
    let mut live = store.session("s1").subscribe(ChangeFilter::new()).expect("subscribe");
    std::thread::scope(|scope| {
        for s in ["s1", "s2", "s3"] {
            let view = store.session(s);
            scope.spawn(move || {
                for i in 0..15 {
                    let own = format!("{s}-{i}");
                    view.add([item(&own, "message", "1", Scope::Session(s.into()))])
                        .expect("add");
                    view.add([item(&format!("{s}-g{i}"), "message", "1", Scope::GlobalWritable)])
                        .expect("add");
                }
            });
        }
        let store = store.clone();
        scope.spawn(move || {
            for i in 0..10 {
                store
                    .add([item(&format!("ro-{i}"), "message", "1", Scope::GlobalReadonly)])
                    .expect("add");
            }
        });
    });
    for s in ["s1", "s2", "s3"] {
        store.delete(&format!("{s}-3")).expect("delete");
    }
    let visible = |change: &&Change| match scope_of(change) {
        Some(Scope::Session(owner)) => owner == "s1",
        _ => true,
    };
    let all = feed(&store, 0);
    let expected: Vec<Change> = all.iter().skip(1).filter(visible).cloned().collect();
    assert!(expected
        .iter()
        .any(|c| matches!(c, Change::Deleted { scope: Scope::Session(s), .. } if s == "s1")));
    let got = take_exactly(&mut live, expected.len());
    assert_eq!(got, expected);
    let mut replayed = store
        .session("s1")
        .subscribe(ChangeFilter::new().after(0))
        .expect("subscribe");
    let expected: Vec<Change> = all.iter().filter(visible).cloned().collect();
    let got = take_exactly(&mut replayed, expected.len());
    assert_eq!(got, expected);
    assert!(got
        .iter()
        .all(|c| !matches!(scope_of(c), Some(Scope::Session(owner)) if owner != "s1")));
}

#[test]
fn a_stalled_subscriber_lags_without_slowing_writers_and_resumes_losing_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new()
        .auto_compact(false)
        .subscription_buffer(100)
        .open(dir.path())
        .expect("open");
    let mut stalled = store.subscribe(ChangeFilter::new()).expect("subscribe");
    let first = store
        .add([
            item("x1", "message", "1", Scope::GlobalWritable),
            item("x2", "message", "1", Scope::GlobalWritable),
            item("x3", "message", "1", Scope::GlobalWritable),
        ])
        .expect("add");
    let Some(ctxlog::AddOutcome::Added { seq: first_seq, .. }) = first.first().cloned() else {
        panic!("added: {first:?}");
    };
    // The subscriber takes one change of the batch, then stalls.
    let one = stalled.recv_timeout(PATIENCE).expect("recv").expect("a change");
    assert_eq!(one.seq(), Some(first_seq));
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let store = store.clone();
            scope.spawn(move || {
                for i in 0..40 {
                    store
                        .add([item(&format!("w{t}-{i}"), "message", "1", Scope::GlobalWritable)])
                        .expect("add");
                }
            });
        }
    });
    assert!(started.elapsed() < Duration::from_secs(60), "writers were held up");
    // The dispatcher queues apart from the writers: wait for it to find the queue full.
    wait_lagged(&stalled);
    // The rest of its batch, then Lagged.
    for _ in 0..2 {
        let change = stalled.try_recv().expect("the rest of the batch").expect("a change");
        assert_eq!(change.seq(), Some(first_seq));
    }
    let resume_after = match stalled.try_recv() {
        Err(Error::Lagged { resume_after }) => resume_after,
        other => panic!("expected Lagged, got {other:?}"),
    };
    assert_eq!(resume_after, first_seq);
    assert!(matches!(stalled.recv(), Err(Error::Lagged { resume_after: r }) if r == resume_after));
    drop(stalled);
    let mut resumed = store
        .subscribe(ChangeFilter::new().after(resume_after))
        .expect("resubscribe");
    let expected = feed(&store, resume_after);
    assert_eq!(expected.len(), 8 * 40);
    assert_eq!(take_exactly(&mut resumed, expected.len()), expected);
}

#[test]
fn after_a_restart_a_subscriber_resumes_with_exactly_what_it_missed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let last_seen = {
        let store = open(dir.path(), Durability::Immediate);
        let mut subscription = store.subscribe(ChangeFilter::new().after(0)).expect("subscribe");
        for i in 0..10 {
            store
                .add([item(&format!("a{i}"), "message", "1", Scope::GlobalWritable)])
                .expect("add");
        }
        let seen = take_exactly(&mut subscription, 10);
        for i in 0..5 {
            store
                .add([item(&format!("b{i}"), "message", "1", Scope::GlobalWritable)])
                .expect("add");
        }
        store.delete("a1").expect("delete");
        drop(store);
        // What was queued, then Closed.
        let mut queued = 0;
        loop {
            match subscription.recv() {
                Ok(_) => queued += 1,
                Err(Error::Closed) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(queued, 6);
        seen.last().and_then(Change::seq).expect("a seq")
    };
    let store = open(dir.path(), Durability::Immediate);
    let mut resumed = store
        .subscribe(ChangeFilter::new().after(last_seen))
        .expect("subscribe");
    store
        .add([item("c", "message", "1", Scope::GlobalWritable)])
        .expect("add");
    let expected = feed(&store, last_seen);
    assert_eq!(expected.len(), 7);
    assert_eq!(take_exactly(&mut resumed, expected.len()), expected);
    assert!(matches!(
        store.subscribe(ChangeFilter::new().after(store.last_seq() + 1)),
        Err(Error::Invalid { field, .. }) if field == "after"
    ));
}

#[test]
fn recv_waits_for_a_change_and_wakes_closed_when_the_store_closes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), Durability::Immediate);
    let mut subscription = store.subscribe(ChangeFilter::new()).expect("subscribe");
    assert_eq!(subscription.try_recv().expect("try_recv"), None);
    assert_eq!(
        subscription
            .recv_timeout(Duration::from_millis(50))
            .expect("recv_timeout"),
        None
    );
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            store
                .add([item("late", "message", "1", Scope::GlobalWritable)])
                .expect("add");
        })
    };
    let change = subscription.recv_timeout(PATIENCE).expect("recv").expect("a change");
    assert_eq!(change.id(), Some("late"));
    writer.join().expect("writer");
    let waiting = std::thread::spawn(move || subscription.recv());
    std::thread::sleep(Duration::from_millis(50));
    drop(store);
    assert!(matches!(waiting.join().expect("waiter"), Err(Error::Closed)));
    assert!(matches!(
        Options::new().subscription_buffer(0).open(dir.path()),
        Err(Error::Invalid { field, .. }) if field == "subscription_buffer"
    ));
}

#[test]
fn a_subscriber_lags_in_its_replay_too_and_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new()
        .auto_compact(false)
        .subscription_buffer(5)
        .open(dir.path())
        .expect("open");
    for i in 0..10 {
        store
            .add([item(&format!("h{i}"), "message", "1", Scope::GlobalWritable)])
            .expect("add");
    }
    let mut subscription = store.subscribe(ChangeFilter::new().after(0)).expect("subscribe");
    let read: Vec<Change> = (0..3)
        .map(|_| subscription.recv().expect("a replayed change"))
        .collect();
    assert_eq!(read, feed(&store, 0)[..3]);
    // Live changes beyond the buffer while the replay is not done: the replay does not count, the
    // live queue does.
    for i in 0..6 {
        store
            .add([item(&format!("l{i}"), "message", "1", Scope::GlobalWritable)])
            .expect("add");
    }
    // The dispatcher queues apart from the writers: wait for it to find the queue full.
    wait_lagged(&subscription);
    let resume_after = match subscription.try_recv() {
        Err(Error::Lagged { resume_after }) => resume_after,
        other => panic!("expected Lagged, got {other:?}"),
    };
    assert_eq!(resume_after, 3);
    let mut resumed = store
        .subscribe(ChangeFilter::new().after(resume_after))
        .expect("subscribe");
    let expected = feed(&store, resume_after);
    assert_eq!(take_exactly(&mut resumed, expected.len()), expected);
}

fn open_at(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    Options::new()
        .durability(Durability::Immediate)
        .auto_compact(false)
        .clock(Arc::clone(clock) as Arc<dyn ctxlog::Clock>)
        .open(dir)
        .expect("open")
}

fn expired(id: &str, version: &str, at: i64) -> Change {
    Change::Expired {
        id: id.into(),
        version: version.into(),
        expired_at: at,
    }
}

/// Under a manual clock, `expire_due` announces each id's expiry once the clock reaches it, after
/// the changes committed before, to the subscriptions whose filters and sessions let it through:
/// only the latest version's expiry, none for a deleted id or a superseded version, none twice,
/// none that fell due before the first subscription, and none while nobody subscribes.
#[test]
fn expire_due_announces_each_latest_expiry_once_the_clock_reaches_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(NOW));
    let store = open_at(dir.path(), &clock);
    let ttl =
        |id: &str, kind: &str, version: &str, scope: Scope, secs: u64| item(id, kind, version, scope).with_ttl(secs);
    // Fell due before anyone subscribed: never announced.
    store
        .add([ttl("early", "message", "1", Scope::GlobalWritable, 5)])
        .expect("add");
    clock.advance(10);
    assert_eq!(store.expire_due().expect("expire_due"), 0, "nobody subscribes");
    store
        .add([
            ttl("a", "message", "1", Scope::GlobalWritable, 20),
            ttl("b", "tool_result", "1", Scope::Session("s1".into()), 30),
            ttl("c", "message", "1", Scope::Session("s2".into()), 30),
            ttl("gone", "message", "1", Scope::GlobalWritable, 20),
            ttl("renewed", "message", "1", Scope::GlobalWritable, 20),
            item("forever", "message", "1", Scope::GlobalWritable),
        ])
        .expect("add");
    let mut all = store.subscribe(ChangeFilter::new()).expect("subscribe");
    let mut of_t2 = store
        .subscribe(ChangeFilter::new().types(["tool_result"]))
        .expect("subscribe");
    let mut s1 = store.session("s1").subscribe(ChangeFilter::new()).expect("subscribe");
    // Before its expiry, a new version and a delete: the old expiries do not hold any more.
    store
        .add([ttl("renewed", "message", "2", Scope::GlobalWritable, 100)])
        .expect("add");
    assert!(store.delete("gone").expect("delete"));
    assert_eq!(take_exactly(&mut all, 2).len(), 2);
    assert_eq!(store.expire_due().expect("expire_due"), 0, "nothing is due yet");
    // Items are stamped NOW: NOW + 20 is the expiry of a, gone and renewed's first version.
    clock.set(NOW + 25);
    assert_eq!(store.expire_due().expect("expire_due"), 1);
    assert_eq!(take_exactly(&mut all, 1), vec![expired("a", "1", NOW + 20)]);
    assert_eq!(store.expire_due().expect("expire_due"), 0, "announced once");
    clock.set(NOW + 45);
    assert_eq!(store.expire_due().expect("expire_due"), 2);
    let got = take_exactly(&mut all, 2);
    assert_eq!(got, vec![expired("b", "1", NOW + 30), expired("c", "1", NOW + 30)]);
    assert_eq!(take_exactly(&mut of_t2, 1), vec![expired("b", "1", NOW + 30)]);
    // s1 heard of its own expiry only (and of its own and the global changes before).
    let own: Vec<Change> = std::iter::from_fn(|| s1.try_recv().expect("recv")).collect();
    assert_eq!(own.last(), Some(&expired("b", "1", NOW + 30)), "{own:?}");
    assert!(
        !own.iter().any(|change| change.id() == Some("c")),
        "s1 heard of s2's item: {own:?}"
    );
    clock.set(NOW + 1_000_000);
    assert_eq!(store.expire_due().expect("expire_due"), 1);
    assert_eq!(take_exactly(&mut all, 1), vec![expired("renewed", "2", NOW + 100)]);
    // Once the last subscriber leaves, nothing is watched; a new first subscriber starts afresh
    // from the index (expiries already past are not announced).
    drop((all, of_t2, s1));
    store
        .add([ttl("later", "message", "1", Scope::GlobalWritable, 5)])
        .expect("add");
    let mut again = store.subscribe(ChangeFilter::new()).expect("subscribe");
    assert_eq!(
        store.expire_due().expect("expire_due"),
        0,
        "`later` (due at NOW + 5) was past before"
    );
    store
        .add([ttl("fresh", "message", "1", Scope::GlobalWritable, 2_000_000)])
        .expect("add");
    assert_eq!(take_exactly(&mut again, 1).len(), 1);
    clock.set(NOW + 2_000_000);
    assert_eq!(store.expire_due().expect("expire_due"), 1);
    assert_eq!(
        take_exactly(&mut again, 1),
        vec![expired("fresh", "1", NOW + 2_000_000)]
    );
}

/// Under the system clock, the background thread announces an expiry within about a second of
/// the clock reaching it, with nobody calling `expire_due`.
#[test]
fn the_background_thread_announces_an_expiry_within_about_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), Durability::Immediate);
    let mut subscription = store.subscribe(ChangeFilter::new().ids(["soon"])).expect("subscribe");
    let now = ctxlog::SystemClock.now();
    let soon = ContextItem::new(
        "soon",
        "message",
        json!({"v": 1}),
        "tests",
        now,
        "1",
        Scope::GlobalWritable,
    )
    .with_ttl(2);
    store.add([soon]).expect("add");
    assert!(matches!(
        subscription.recv_timeout(PATIENCE),
        Ok(Some(Change::Added { .. }))
    ));
    let change = subscription.recv_timeout(PATIENCE).expect("recv").expect("an expiry");
    let heard = ctxlog::SystemClock.now();
    assert_eq!(change, expired("soon", "1", now + 2));
    assert!(heard >= now + 2, "announced before its time");
    assert!(heard <= now + 3, "announced {} s after its time", heard - now - 2);
}
