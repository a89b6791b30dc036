//! Session isolation: a session view reads only its own session's items and the global ones, whatever
//! the query asks; another session's item resolves `NotFound` exactly like an id that does not exist;
//! a session may write its own scope and `GlobalWritable` only (anything else is `PermissionDenied` with
//! the item's index, and nothing of the batch is written); session snapshots keep that visibility; the
//! `Store` handle itself sees everything.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use ctxlog::*;
use serde_json::json;

const TS: i64 = 1_715_299_200;

fn scoped(id: &str, offset: i64, kind: &str, scope: Scope) -> ContextItem {
    ContextItem::new(
        id,
        kind,
        json!({"id": id, "secret": id.starts_with("s2")}),
        "sessions",
        TS + offset,
        "1",
        scope,
    )
}

fn s(id: &str) -> Scope {
    Scope::Session(id.into())
}

/// A store with global items and items of sessions s1 and s2, all interleaved in time and type.
fn populated() -> (tempfile::TempDir, Store, Vec<ContextItem>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let mut items = Vec::new();
    for n in 0..30 {
        let kind = BUILTIN_TYPES[n % 7];
        let (id, scope) = match n % 4 {
            0 => (format!("g_ro{n}"), Scope::GlobalReadonly),
            1 => (format!("g_rw{n}"), Scope::GlobalWritable),
            2 => (format!("s1_{n}"), s("s1")),
            _ => (format!("s2_{n}"), s("s2")),
        };
        items.push(scoped(&id, (n as i64) / 2, kind, scope));
    }
    store.add(items.clone()).expect("add");
    (dir, store, items)
}

fn id_set(items: &[ContextItem]) -> BTreeSet<String> {
    items.iter().map(|it| it.id.clone()).collect()
}

fn visible_to(items: &[ContextItem], session: &str) -> BTreeSet<String> {
    items
        .iter()
        .filter(|it| match &it.scope {
            Scope::Session(owner) => owner == session,
            _ => true,
        })
        .map(|it| it.id.clone())
        .collect()
}

fn queries() -> Vec<ContextQuery> {
    vec![
        ContextQuery::new(),
        ContextQuery::new().newest_first(),
        ContextQuery::new().scopes([s("s2")]),
        ContextQuery::new().scopes([s("s2"), s("s1")]),
        ContextQuery::new().scopes([s("s2"), Scope::GlobalReadonly]),
        ContextQuery::new().types(BUILTIN_TYPES),
        ContextQuery::new().types(["document_chunk"]).scopes([s("s2")]),
        ContextQuery::new().time_range(TimeRange::new(TS, TS + 100).expect("range")),
        ContextQuery::new().content_eq("secret", json!(true)),
        ContextQuery::new().sources(["sessions"]).limit(1000),
    ]
}

#[test]
fn a_session_never_reads_another_sessions_items() {
    let (_dir, store, items) = populated();
    let s1 = store.session("s1");
    let allowed = visible_to(&items, "s1");
    let s2_ids: BTreeSet<String> = items
        .iter()
        .filter(|it| it.scope == s("s2"))
        .map(|it| it.id.clone())
        .collect();
    assert!(!s2_ids.is_empty());
    for query in queries() {
        let got = s1.get(&query).expect("get");
        let got_ids = id_set(&got);
        assert!(
            got_ids.is_subset(&allowed),
            "{query:?} leaked {:?}",
            got_ids.difference(&allowed)
        );
        assert!(got_ids.is_disjoint(&s2_ids), "{query:?}");
        // Whatever s1 gets is exactly what the store gets for the same query restricted to s1's view.
        let unrestricted = store.get(&query).expect("get");
        let expected: Vec<ContextItem> = unrestricted.into_iter().filter(|it| allowed.contains(&it.id)).collect();
        assert_eq!(got, expected, "{query:?}");
    }
    assert_eq!(id_set(&s1.get(&ContextQuery::new()).expect("get")), allowed);
    assert!(s1.get(&ContextQuery::new().scopes([s("s2")])).expect("get").is_empty());
    assert!(s1
        .get(&ContextQuery::new().content_eq("secret", json!(true)))
        .expect("get")
        .is_empty());
    let only_global = s1
        .get(&ContextQuery::new().scopes([s("s2"), Scope::GlobalReadonly]))
        .expect("get");
    assert!(!only_global.is_empty());
    assert!(only_global.iter().all(|it| it.scope == Scope::GlobalReadonly));
}

#[test]
fn another_sessions_item_resolves_like_a_nonexistent_id() {
    let (_dir, store, items) = populated();
    let s1 = store.session("s1");
    let theirs = items
        .iter()
        .find(|it| it.scope == s("s2"))
        .expect("an s2 item")
        .id
        .clone();
    let mine = items.iter().find(|it| it.scope == s("s1")).expect("an s1 item").clone();
    let global = items
        .iter()
        .find(|it| it.scope == Scope::GlobalReadonly)
        .expect("global")
        .clone();
    let theirs_v = format!("{theirs}@1");
    let theirs_other = format!("{theirs}@2");
    let refs = [
        theirs.as_str(),
        "no_such_id",
        theirs_v.as_str(),
        "no_such_id@1",
        theirs_other.as_str(),
        mine.id.as_str(),
        global.id.as_str(),
    ];
    let resolved = s1.resolve(refs).expect("resolve");
    for (reference, resolution) in refs.iter().zip(&resolved).take(5) {
        assert_eq!(
            resolution,
            &Resolution::NotFound {
                reference: (*reference).to_owned()
            }
        );
    }
    // Byte for byte the same shape as a missing id.
    let hidden = serde_json::to_string(&resolved[0]).expect("json");
    let missing = serde_json::to_string(&resolved[1]).expect("json");
    assert_eq!(hidden.replace(&theirs, "X"), missing.replace("no_such_id", "X"));
    assert_eq!(resolved[5], Resolution::Found(stored_form(&mine)));
    assert_eq!(resolved[6], Resolution::Found(stored_form(&global)));
    // The store itself finds it.
    assert!(matches!(
        &store.resolve([theirs.as_str()]).expect("resolve")[0],
        Resolution::Found(_)
    ));
    // And s2 finds it, but not s1's item.
    let s2 = store.session("s2");
    let from_s2 = s2.resolve([theirs.as_str(), mine.id.as_str()]).expect("resolve");
    assert!(matches!(from_s2[0], Resolution::Found(_)));
    assert_eq!(
        from_s2[1],
        Resolution::NotFound {
            reference: mine.id.clone()
        }
    );
}

#[test]
fn writing_another_sessions_scope_or_global_readonly_is_denied_and_writes_nothing() {
    let (_dir, store, items) = populated();
    let s1 = store.session("s1");
    for (position, forbidden) in [(2usize, s("s2")), (0, Scope::GlobalReadonly), (3, s("S1"))] {
        let seq = store.stats().seq;
        let versions = store.stats().versions;
        let mut batch: Vec<ContextItem> = (0..4)
            .map(|n| scoped(&format!("new{n}"), 500 + n, "message", s("s1")))
            .collect();
        batch[1].scope = Scope::GlobalWritable;
        batch[position].scope = forbidden.clone();
        let err = s1.add(batch).expect_err("denied");
        match &err {
            Error::PermissionDenied { index, reason } => {
                assert_eq!(*index, Some(position), "{reason}");
            }
            other => panic!("expected PermissionDenied for {forbidden:?}, got {other:?}"),
        }
        assert_eq!(err.index(), Some(position));
        assert!(err.to_string().starts_with(&format!("item {position}:")), "{err}");
        assert_eq!(store.stats().seq, seq);
        assert_eq!(store.stats().versions, versions);
        assert_eq!(everything(&store).len(), items.len());
        let resolved = store.resolve(["new0", "new1", "new2", "new3"]).expect("resolve");
        assert!(
            resolved.iter().all(|r| matches!(r, Resolution::NotFound { .. })),
            "{resolved:?}"
        );
    }
}

#[test]
fn a_session_writes_its_own_scope_and_global_writable() {
    let (_dir, store, items) = populated();
    let s1 = store.session("s1");
    let own = scoped("s1_new", 900, "tool_result", s("s1"));
    let shared = scoped("shared_new", 901, "tool_result", Scope::GlobalWritable);
    let outcomes = s1.add([own.clone(), shared.clone()]).expect("allowed writes");
    assert!(
        outcomes.iter().all(|o| matches!(o, AddOutcome::Added { .. })),
        "{outcomes:?}"
    );
    let recent = ContextQuery::new().time_range(TimeRange::new(TS + 900, TS + 901).expect("range"));
    assert_eq!(
        s1.get(&recent).expect("get"),
        vec![stored_form(&own), stored_form(&shared)]
    );
    let s2 = store.session("s2");
    assert_eq!(s2.get(&recent).expect("get"), vec![stored_form(&shared)]);
    assert_eq!(
        store.get(&recent).expect("get"),
        vec![stored_form(&own), stored_form(&shared)]
    );
    assert_eq!(everything(&store).len(), items.len() + 2);
}

#[test]
fn session_snapshots_keep_their_sessions_visibility() {
    let (_dir, store, items) = populated();
    let s1 = store.session("s1");
    let snap = s1.snapshot();
    assert_eq!(snap.session(), Some("s1"));
    let theirs = items.iter().find(|it| it.scope == s("s2")).expect("s2 item").id.clone();
    // Later writes by s2 and the store do not show up, and s2's items never do.
    store
        .session("s2")
        .add([scoped("s2_late", 999, "message", s("s2"))])
        .expect("s2 writes");
    store
        .add([scoped("g_late", 999, "message", Scope::GlobalReadonly)])
        .expect("store writes");
    let allowed = visible_to(&items, "s1");
    for query in queries() {
        let got = id_set(&snap.get(&query).expect("get"));
        assert!(got.is_subset(&allowed), "{query:?}");
    }
    assert_eq!(id_set(&snap.get(&ContextQuery::new()).expect("get")), allowed);
    assert_eq!(
        snap.resolve([theirs.as_str(), "s2_late", "g_late"]).expect("resolve"),
        vec![
            Resolution::NotFound { reference: theirs },
            Resolution::NotFound {
                reference: "s2_late".into()
            },
            Resolution::NotFound {
                reference: "g_late".into()
            },
        ]
    );
    // A new s1 snapshot sees the new global item but still not s2's.
    let now = id_set(&s1.snapshot().get(&ContextQuery::new()).expect("get"));
    assert!(now.contains("g_late") && !now.contains("s2_late"));
}

#[test]
fn the_store_handle_sees_every_scope() {
    let (_dir, store, items) = populated();
    assert_eq!(id_set(&everything(&store)), id_set(&items));
    let snap = store.snapshot();
    assert_eq!(snap.session(), None);
    assert_eq!(id_set(&snap.get(&ContextQuery::new()).expect("get")), id_set(&items));
    let s2_only = store.get(&ContextQuery::new().scopes([s("s2")])).expect("get");
    assert!(!s2_only.is_empty());
    assert!(s2_only.iter().all(|it| it.scope == s("s2")));
    let refs: Vec<&str> = items.iter().map(|it| it.id.as_str()).collect();
    let resolved = store.resolve(&refs).expect("resolve");
    for (item, resolution) in items.iter().zip(&resolved) {
        assert_eq!(found(resolution), &stored_form(item));
    }
}

#[test]
fn a_session_id_that_breaks_the_id_rules_owns_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let bad = store.session("bad id");
    let own = ContextItem::new(
        "b1",
        "message",
        serde_json::json!(1),
        "src",
        1,
        "1",
        Scope::Session("bad id".into()),
    );
    match bad.add([own]) {
        Err(Error::Invalid { field, index, .. }) => {
            assert_eq!(field, "session_id");
            assert_eq!(index, Some(0));
        }
        other => panic!("expected Invalid session_id, got {other:?}"),
    }
    let global = ContextItem::new(
        "g1",
        "message",
        serde_json::json!(2),
        "src",
        1,
        "1",
        Scope::GlobalWritable,
    );
    bad.add([global]).expect("a global write is allowed");
    let seen = bad.get(&ContextQuery::new()).expect("get");
    assert_eq!(seen.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["g1"]);
    assert_eq!(store.stats().items, 1, "nothing of the refused batch was written");
}

// ---- Writes to ids held by a scope the session may not write, and what reads and errors reveal ----

fn plain(id: &str, version: &str, content: serde_json::Value, scope: Scope) -> ContextItem {
    ContextItem::new(id, "message", content, "sessions", TS, version, scope)
}

fn denied_at(outcome: &Result<Vec<AddOutcome>, Error>, position: usize) -> String {
    match outcome {
        Err(Error::PermissionDenied { reason, index }) => {
            assert_eq!(*index, Some(position), "{reason}");
            reason.clone()
        }
        other => panic!("expected PermissionDenied at item {position}, got {other:?}"),
    }
}

/// Adding a new version of a `global_readonly` id, in a scope the session may write, would replace
/// the item for every reader: it is refused, and the item stays as it was.
#[test]
fn a_session_cannot_replace_a_global_readonly_item_by_adding_a_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let official = plain("policy", "1", json!({"rule": "official"}), Scope::GlobalReadonly);
    store.add([official.clone()]).expect("the store writes global_readonly");
    let s2 = store.session("s2");
    let forged = s2.add([
        plain("s2_note", "1", json!("fine on its own"), s("s2")),
        plain("policy", "2", json!({"rule": "forged by s2"}), Scope::GlobalWritable),
    ]);
    denied_at(&forged, 1);
    assert_eq!(
        found(&store.resolve(["policy"]).expect("resolve")[0]).content,
        official.content
    );
    assert_eq!(
        found(&store.session("s1").resolve(["policy"]).expect("resolve")[0]).content,
        official.content
    );
    assert_eq!(
        ids(&everything(&store)),
        ["policy"],
        "nothing of the refused batch was written"
    );
    // The same version again is refused the same way, not answered Unchanged.
    denied_at(&s2.add([official]), 0);
}

/// Another session's id can be neither taken over (a new version in `GlobalWritable` would be what
/// its owner resolves) nor hidden (a new version in the writer's own scope would hide it from its
/// owner); the refusal reveals no content, hash or version of it.
#[test]
fn a_session_cannot_supersede_or_probe_another_sessions_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (s1, s2) = (store.session("s1"), store.session("s2"));
    let secret = json!({"pin": "4711"});
    s1.add([plain("card", "1", secret.clone(), s("s1"))])
        .expect("s1 writes");
    s1.add([plain("plan", "1", json!("mine"), s("s1"))]).expect("s1 writes");
    let attempts = [
        s2.add([plain("card", "2", json!("injected by s2"), Scope::GlobalWritable)]),
        s2.add([plain("plan", "2", json!("hidden by s2"), s("s2"))]),
        // A wrong guess of the stored content, and the right one.
        s2.add([plain("card", "1", json!({"pin": "0000"}), s("s2"))]),
        s2.add([plain("card", "1", secret.clone(), s("s2"))]),
    ];
    for attempt in &attempts {
        let reason = denied_at(attempt, 0);
        assert!(
            !reason.contains(&expected_hash(&secret)) && !reason.contains("4711"),
            "{reason}"
        );
        assert!(!reason.contains("s1"), "the refusal does not name the owner: {reason}");
    }
    let mine = s1.resolve(["card", "plan"]).expect("resolve");
    assert_eq!(found(&mine[0]).content, secret);
    assert_eq!(found(&mine[1]).content, json!("mine"));
    assert_eq!(everything(&store).len(), 2, "no refused version was written");
    // The owner itself still adds versions of its ids, and the store handle may write any scope.
    s1.add([plain("card", "2", json!({"pin": "1234"}), s("s1"))])
        .expect("the owner adds a version");
    store
        .add([plain("plan", "2", json!("moved by the store"), Scope::GlobalWritable)])
        .expect("the store handle is not restricted");
}

/// An id whose every version is in `GlobalWritable` (or the session's own scope) takes new versions
/// from any session: what any session may write, it may also supersede.
#[test]
fn global_writable_ids_take_versions_from_every_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let (s1, s2) = (store.session("s1"), store.session("s2"));
    s1.add([plain("board", "1", json!("from s1"), Scope::GlobalWritable)])
        .expect("s1");
    s2.add([plain("board", "2", json!("from s2"), Scope::GlobalWritable)])
        .expect("s2 adds a version");
    match &s2.add([plain("board", "1", json!("other"), Scope::GlobalWritable)]) {
        // s2 can read version 1: a conflict may name its hash.
        Err(Error::VersionConflict { existing, .. }) => assert_eq!(*existing, expected_hash(&json!("from s1"))),
        other => panic!("expected VersionConflict, got {other:?}"),
    }
    assert_eq!(
        found(&s1.resolve(["board"]).expect("resolve")[0]).content,
        json!("from s2")
    );
    // A delete starts a fresh history: a readonly id deleted by the store may be reused.
    store
        .add([plain("notice", "1", json!("ro"), Scope::GlobalReadonly)])
        .expect("ro");
    denied_at(&s2.add([plain("notice", "2", json!("rw"), Scope::GlobalWritable)]), 0);
    assert!(store.delete("notice").expect("delete"));
    s2.add([plain("notice", "1", json!("rw"), Scope::GlobalWritable)])
        .expect("a fresh history");
}

/// What decides is the id's latest version: once its owner made an id global-writable, other
/// sessions add versions to it; once the latest version expired and compaction reclaimed it (its
/// content gone), the id takes versions from any session, as a new id would.
#[test]
fn the_latest_version_of_an_id_decides_who_may_add_to_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(TS));
    let store = Options::new().clock(clock.clone()).open(dir.path()).expect("open");
    let (s1, s2) = (store.session("s1"), store.session("s2"));
    s1.add([plain("draft", "1", json!("private"), s("s1"))])
        .expect("private");
    denied_at(&s2.add([plain("draft", "2", json!("s2"), Scope::GlobalWritable)]), 0);
    s1.add([plain("draft", "2", json!("published"), Scope::GlobalWritable)])
        .expect("published");
    s2.add([plain("draft", "3", json!("edited by s2"), Scope::GlobalWritable)])
        .expect("now global");
    assert_eq!(
        found(&s1.resolve(["draft"]).expect("resolve")[0]).content,
        json!("edited by s2")
    );
    // An item of s1 with a TTL: while it is stored, s2 may not add to its id; once reclaimed, it may.
    s1.add([plain("temp", "1", json!("short-lived"), s("s1")).with_ttl(60)])
        .expect("ttl");
    clock.advance(61);
    denied_at(&s2.add([plain("temp", "2", json!("s2"), Scope::GlobalWritable)]), 0);
    store.compact().expect("compact");
    s2.add([plain("temp", "2", json!("s2"), Scope::GlobalWritable)])
        .expect("the expired item was reclaimed");
    assert_eq!(found(&s1.resolve(["temp"]).expect("resolve")[0]).content, json!("s2"));
}

/// A session compares its versions only with versions it may see: an earlier version in another
/// session's scope, or one whose record compaction reclaimed (its scope is not kept), is refused
/// alike, whether the content is guessed right or not, and the refusal names no hash. The owner is
/// refused for a reclaimed version too (its scope is not known any more); the store handle is not.
#[test]
fn a_session_never_learns_the_hash_of_a_version_it_may_not_see() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(TS));
    let store = Options::new().clock(clock.clone()).open(dir.path()).expect("open");
    let (s1, s2) = (store.session("s1"), store.session("s2"));
    let secret = json!({"pin": "4711"});
    // s1's draft: private version 1, then published (global_writable) version 2.
    s1.add([plain("draft", "1", secret.clone(), s("s1"))]).expect("private");
    s1.add([plain("draft", "2", json!("published"), Scope::GlobalWritable)])
        .expect("published");
    // s1's note: a private version 1 with a TTL, then a global_writable version 2 with one.
    s1.add([plain("note", "1", secret.clone(), s("s1")).with_ttl(60)])
        .expect("note 1");
    s1.add([plain("note", "2", json!("public"), Scope::GlobalWritable).with_ttl(60)])
        .expect("note 2");
    let probes = |session: &SessionView, id: &str| {
        [
            session.add([plain(id, "1", secret.clone(), Scope::GlobalWritable)]),
            session.add([plain(id, "1", json!({"pin": "0000"}), Scope::GlobalWritable)]),
        ]
    };
    for attempt in probes(&s2, "draft") {
        let reason = denied_at(&attempt, 0);
        assert!(!reason.contains("sha256") && !reason.contains("4711"), "{reason}");
    }
    // Version 2 is global: s2 may compare with it.
    assert!(matches!(
        s2.add([plain("draft", "2", json!("published"), Scope::GlobalWritable)])
            .as_deref(),
        Ok([AddOutcome::Unchanged { .. }])
    ));
    assert!(matches!(
        s2.add([plain("draft", "2", json!("other"), Scope::GlobalWritable)]),
        Err(Error::VersionConflict { .. })
    ));
    // The owner compares with its own version.
    assert!(matches!(
        s1.add([plain("draft", "1", secret.clone(), s("s1"))]).as_deref(),
        Ok([AddOutcome::Unchanged { .. }])
    ));
    // Once both notes expired and were reclaimed, nobody's session compares with them.
    clock.advance(61);
    store.compact().expect("compact");
    for session in [&s2, &s1] {
        for attempt in probes(session, "note") {
            let reason = denied_at(&attempt, 0);
            assert!(!reason.contains("sha256") && !reason.contains("4711"), "{reason}");
        }
    }
    // The store handle still does, and a new version is taken from any session.
    assert!(matches!(
        store.add([plain("note", "1", secret.clone(), s("s1"))]).as_deref(),
        Ok([AddOutcome::Unchanged { .. }])
    ));
    s2.add([plain("note", "3", json!("s2"), Scope::GlobalWritable)])
        .expect("a new version of the reclaimed id");
    assert_eq!(everything(&store).len(), 2, "no refused version was written");
}

/// A session's query stats count only the entries of the scopes it may see: another session's items
/// in the set walked do not change them.
#[test]
fn a_sessions_query_stats_do_not_count_another_sessions_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let globals: Vec<ContextItem> = (0..10)
        .map(|n| plain(&format!("g{n}"), "1", json!(n), Scope::GlobalReadonly))
        .collect();
    store.add(globals).expect("globals");
    let feedback = |id: String, scope: Scope| {
        let mut item = plain(&id, "1", json!(id), scope);
        item.kind = "user_feedback".into();
        item.timestamp = TS + 77;
        item
    };
    store
        .session("s1")
        .add([feedback("fb_s1".into(), s("s1"))])
        .expect("s1 writes");
    let q = ContextQuery::new()
        .types(["user_feedback"])
        .time_range(TimeRange::new(TS + 77, TS + 77).expect("range"));
    let (_, before) = store.session("s1").get_with_stats(&q).expect("get");
    let s2_items: Vec<ContextItem> = (0..3).map(|n| feedback(format!("fb{n}"), s("s2"))).collect();
    store.session("s2").add(s2_items).expect("s2 writes");
    let (items, after) = store.session("s1").get_with_stats(&q).expect("get");
    assert_eq!(ids(&items), ["fb_s1"]);
    assert_eq!(
        (before.index, before.examined, before.returned),
        (IndexUsed::Type, 1, 1)
    );
    assert_eq!(after, before, "s2's items changed s1's stats");
    // The store handle counts every entry it walks.
    let (_, all) = store.get_with_stats(&q).expect("get");
    assert_eq!((all.examined, all.returned), (4, 4));
}

/// A pin stores its session to restrict the snapshot again when it is opened: a session id that
/// breaks the id rules (empty, which would read back as no session, or over 255 bytes, which does not
/// fit the record) is refused with `Invalid` on `session_id`, and nothing is pinned.
#[test]
fn a_pin_from_a_session_id_that_breaks_the_id_rules_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("open");
        store
            .session("s1")
            .add([plain("s1_private", "1", json!("private"), s("s1"))])
            .expect("s1");
        store
            .add([plain("g", "1", json!("global"), Scope::GlobalReadonly)])
            .expect("global");
        for (session, name) in [("", "empty-pin"), (&*"a".repeat(300), "long-pin"), ("a b", "space-pin")] {
            let view = store.session(session);
            assert_eq!(ids(&view.get(&ContextQuery::new()).expect("get")), ["g"]);
            match view.snapshot().pin(name) {
                Err(Error::Invalid { field, .. }) => assert_eq!(field, "session_id"),
                other => panic!("pin from session {session:?}: expected Invalid session_id, got {other:?}"),
            }
            assert!(matches!(store.open_snapshot(name), Err(Error::SnapshotNotFound { .. })));
        }
        store
            .session("s1")
            .snapshot()
            .pin("s1-pin")
            .expect("a valid session pins");
        store
            .add([plain("after", "1", json!("after the pins"), Scope::GlobalReadonly)])
            .expect("add");
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(ids(&everything(&store)), ["after", "g", "s1_private"]);
    let pinned = store.open_snapshot("s1-pin").expect("open pin");
    assert_eq!(
        ids(&pinned.get(&ContextQuery::new()).expect("get")),
        ["g", "s1_private"]
    );
    assert_eq!(pinned.session(), Some("s1"));
}
