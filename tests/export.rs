//! `Snapshot::export` and `Snapshot::export_all_versions`: what a snapshot shows (or every stored
//! version of the ids it shows), in commit order, read lazily; an export imported into an empty store
//! gives the same items, hashes and versions.

mod common;

use std::collections::BTreeMap;

use common::*;
use ctxlog::*;
use serde_json::json;

/// The seq of each (id, version) added, from the change feed.
fn added_seqs(store: &Store) -> BTreeMap<(String, String), u64> {
    feed(store, 0)
        .into_iter()
        .filter_map(|change| match change {
            Change::Added { seq, id, version, .. } => Some(((id, version), seq)),
            _ => None,
        })
        .collect()
}

fn exported(export: Export) -> Vec<ContextItem> {
    export
        .collect::<Result<Vec<_>, _>>()
        .expect("every exported item reads back")
}

/// A store with supersedes, a delete and a re-add, expiries and two sessions, over several chunks.
fn busy_store(store: &Store, clock: &ManualClock) {
    for round in 0..3 {
        let items: Vec<ContextItem> = (0..700)
            .map(|i| {
                let id = format!("c{}", (i * 7 + round * 300) % 1000);
                item(
                    &id,
                    NOW - 5000 + i,
                    &format!("{round}.{i}"),
                    json!({"text": id, "round": round}),
                )
            })
            .collect();
        store.add(items).expect("add");
    }
    for s in ["s1", "s2"] {
        let items: Vec<ContextItem> = (0..20)
            .map(|i| {
                ContextItem::new(
                    format!("{s}-m{i}"),
                    "message",
                    json!({"text": i}),
                    "tests",
                    NOW - 100 + i,
                    "1",
                    Scope::Session(s.into()),
                )
            })
            .collect();
        store.session(s).add(items).expect("session add");
    }
    for i in 0..50 {
        store.delete(&format!("c{i}")).expect("delete");
    }
    store
        .add([item("c3", NOW, "fresh", json!({"text": "after the delete"}))])
        .expect("re-add");
    store
        .add((0..10).map(|i| item(&format!("ttl{i}"), NOW - 30, "1", json!({"i": i})).with_ttl(10 + i * 5)))
        .expect("expiring");
    clock.advance(20);
}

#[test]
fn an_export_is_what_get_shows_in_commit_order() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), &clock);
    busy_store(&store, &clock);
    let seqs = added_seqs(&store);

    let snapshot = store.snapshot();
    let export = snapshot.export();
    let total = export.total();
    let items = exported(export);
    assert_eq!(items.len(), total);
    let mut expected = snapshot.get(&ContextQuery::new()).expect("get");
    assert!(expected.len() > 800, "{}", expected.len());
    assert!(expected.iter().any(|i| i.id == "c3" && i.version == "fresh"));
    let order = |item: &ContextItem| seqs[&(item.id.clone(), item.version.clone())];
    expected.sort_by_key(order);
    assert_eq!(items, expected);
    assert!(items.windows(2).all(|pair| order(&pair[0]) <= order(&pair[1])));
    // The raw export gives each of them as its JSON, in the same order.
    let raw: Vec<String> = snapshot
        .export_raw()
        .map(|item| item.map(|raw| raw.as_str().to_owned()))
        .collect::<Result<_, _>>()
        .expect("raw export");
    let as_json: Vec<String> = items.iter().map(|i| serde_json::to_string(i).expect("json")).collect();
    assert_eq!(raw, as_json);

    // A session's snapshot exports what that session sees.
    let session = store.session("s1").snapshot();
    let items = exported(session.export());
    assert!(items.iter().any(|i| i.id == "s1-m0"));
    assert!(!items.iter().any(|i| i.id.starts_with("s2-")));
    let mut expected = session.get(&ContextQuery::new()).expect("session get");
    expected.sort_by_key(order);
    assert_eq!(items, expected);
}

#[test]
fn an_export_imported_into_an_empty_store_gives_the_same_items_hashes_and_versions() {
    let clock = clock_at(NOW);
    let (from, to) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let store = open_at(from.path(), &clock);
    busy_store(&store, &clock);
    let copy = open_at(to.path(), &clock);
    let items = exported(store.snapshot().export());
    for batch in items.chunks(333) {
        copy.add(batch.to_vec()).expect("import");
    }
    assert_eq!(everything(&copy), everything(&store));
    let refs: Vec<String> = items.iter().map(|i| format!("{}@{}", i.id, i.version)).collect();
    assert_eq!(
        copy.resolve(refs.iter().map(String::as_str)).expect("resolve"),
        store.resolve(refs.iter().map(String::as_str)).expect("resolve")
    );
}

#[test]
fn every_version_is_the_history_of_each_id_since_its_last_delete() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), &clock);
    busy_store(&store, &clock);
    let seqs = added_seqs(&store);
    let snapshot = store.snapshot();
    let versions = exported(snapshot.export_all_versions());
    let raw: Vec<String> = snapshot
        .export_all_versions_raw()
        .map(|item| item.map(|raw| raw.as_str().to_owned()))
        .collect::<Result<_, _>>()
        .expect("raw export");
    let as_json: Vec<String> = versions
        .iter()
        .map(|i| serde_json::to_string(i).expect("json"))
        .collect();
    assert_eq!(raw, as_json);

    // In commit order, each (id, version) once.
    let order = |item: &ContextItem| seqs[&(item.id.clone(), item.version.clone())];
    assert!(versions
        .windows(2)
        .all(|pair| order(&pair[0]) < order(&pair[1]) || pair[0].id != pair[1].id));
    let mut keys: Vec<(String, String)> = versions.iter().map(|i| (i.id.clone(), i.version.clone())).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), versions.len());
    // Every version of a live id is there, the expired ones' too; a deleted id's old history is not.
    let by_id = |id: &str| -> Vec<String> {
        versions
            .iter()
            .filter(|i| i.id == id)
            .map(|i| i.version.clone())
            .collect()
    };
    assert_eq!(by_id("c3"), ["fresh"], "c3's history before its delete is gone");
    assert!(by_id("c10").is_empty(), "a deleted id");
    assert_eq!(by_id("c300"), ["1.0", "2.100"], "{:?}", by_id("c300"));
    assert_eq!(by_id("ttl0"), ["1"], "an expired id's version");
    assert!(by_id("s2-m3") == ["1"]);
    // The latest of each id, expired ones aside, is what `get` shows.
    let mut latest: BTreeMap<String, ContextItem> = BTreeMap::new();
    for item in &versions {
        latest.insert(item.id.clone(), item.clone());
    }
    let shown: Vec<ContextItem> = snapshot.get(&ContextQuery::new()).expect("get");
    for item in &shown {
        assert_eq!(latest.get(&item.id), Some(item));
    }
    assert_eq!(
        latest.len(),
        shown.len() + 9,
        "the nine expired ids (ttl0..=ttl8) come on top"
    );

    // Imported in this order, they give the same latest versions and the same older ones.
    let to = tempfile::tempdir().expect("tempdir");
    let copy = open_at(to.path(), &clock);
    for batch in versions.chunks(500) {
        copy.add(batch.to_vec()).expect("import");
    }
    assert_eq!(everything(&copy), everything(&store));
    assert_eq!(
        copy.resolve(["c300@1.0", "c3", "ttl0"]).expect("resolve"),
        store.resolve(["c300@1.0", "c3", "ttl0"]).expect("resolve")
    );
}

#[test]
fn an_export_keeps_its_snapshot_through_writes_deletes_and_compaction() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new()
        .clock(clock.clone() as std::sync::Arc<dyn Clock>)
        .segment_size(1 << 20)
        .auto_compact(false)
        .open(dir.path())
        .expect("open");
    busy_store(&store, &clock);
    let snapshot = store.snapshot();
    let expected = exported(snapshot.export());
    let mut export = snapshot.export();
    drop(snapshot);
    let first: Vec<ContextItem> = export
        .by_ref()
        .take(100)
        .collect::<Result<_, _>>()
        .expect("first items");
    // The store moves on under the export: every id deleted, compacted away, new items added.
    for item in everything(&store) {
        store.delete(&item.id).expect("delete");
    }
    store.add([item("later", NOW, "1", json!({}))]).expect("add");
    let report = store.compact().expect("compact");
    assert!(report.reclaimed_deleted > 0, "{report:?}");
    let rest = exported(export);
    assert_eq!([first, rest].concat(), expected);
}
