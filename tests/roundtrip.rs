//! What goes in comes back out: thousands of varied items over many small segments read back identical
//! (hash filled in) through `resolve` and `get`, before and after a reopen; versioning (Unchanged,
//! VersionConflict, latest-wins whatever the timestamp, Superseded, NotFound), deletes and fresh
//! histories, snapshots that do not move, the `(timestamp, id)` order and its reverse, limits and filters.

mod common;

use std::collections::BTreeMap;

use common::*;
use ctxlog::*;
use serde_json::{json, Value};

const T0: i64 = 1_715_299_200;

/// Item `n` of the big varied set: every type, every scope, some TTLs and confidences, nested and
/// unicode content of several JSON kinds.
fn varied(n: usize) -> ContextItem {
    let i = n as i64;
    let content = match n % 6 {
        0 => json!({
            "n": n,
            "text": format!("héllo 世界 {n} 🚀 \"quoted\" back\\slash\nnewline\ttab"),
            "nested": {"a": [1, 2.5, null, true, {"z": "ß", "y": [[], {}]}], "b": {"c": n % 7}},
            "neg": -i,
            "big": u64::MAX,
            "small": i64::MIN,
            "float": 0.1 + 0.2,
            "exp": 1.5e300,
            "zkey": "sorted?",
            "Akey": "upper",
        }),
        1 => json!(format!("plain string {n} — ünïcödé")),
        2 => json!([n, "x", {"k": [n, n + 1]}, null]),
        3 => Value::Null,
        4 => json!(n as f64 / 7.0),
        _ => json!({"deep": {"deeper": {"deepest": {"n": n, "emoji": "👩‍💻"}}}, "": "empty key"}),
    };
    let scope = match n % 4 {
        0 => Scope::GlobalReadonly,
        1 => Scope::GlobalWritable,
        2 => Scope::Session(format!("s{}", n % 3)),
        _ => Scope::Session("sess:x.y-z_1".into()),
    };
    let mut item = ContextItem::new(
        format!("item-{n:05}"),
        BUILTIN_TYPES[n % 7],
        content,
        format!("source-{}", n % 5),
        T0 + (i * 37) % 100_000,
        format!("v{}.{}", n % 3, n % 11),
        scope,
    );
    if n.is_multiple_of(3) {
        item = item.with_ttl(4_000_000_000 + n as u64); // far beyond the clock: never expires here
    }
    if !n.is_multiple_of(5) {
        item = item.with_confidence((n % 101) as f64 / 100.0);
    }
    item
}

fn check_all_read_back(store: &Store, expected: &BTreeMap<String, ContextItem>) {
    let refs: Vec<&str> = expected.keys().map(String::as_str).collect();
    for chunk in refs.chunks(500) {
        let resolved = store.resolve(chunk).expect("resolve");
        assert_eq!(resolved.len(), chunk.len());
        for (reference, resolution) in chunk.iter().zip(&resolved) {
            assert_eq!(found(resolution), &expected[*reference], "resolve {reference}");
        }
    }
    let got = everything(store);
    assert_eq!(got.len(), expected.len());
    for item in &got {
        assert_eq!(item, &expected[&item.id], "get {}", item.id);
    }
    // Every id once, in (timestamp, id) order.
    let keys: Vec<(i64, &str)> = got.iter().map(|it| (it.timestamp, it.id.as_str())).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(keys, sorted);
}

#[test]
fn thousands_of_varied_items_read_back_identical_across_segments_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = clock_at(NOW + 10_000_000);
    let total = 3000;
    let items: Vec<ContextItem> = (0..total).map(varied).collect();
    let expected: BTreeMap<String, ContextItem> = items.iter().map(|it| (it.id.clone(), stored_form(it))).collect();
    {
        let store = Options::new()
            .clock(clock.clone())
            .segment_size(4096)
            .open(dir.path())
            .expect("open");
        let mut start = 0;
        let mut batch_size = 1;
        let mut batches = 0;
        while start < total {
            let end = (start + batch_size).min(total);
            let outcomes = store.add(items[start..end].iter().cloned()).expect("add batch");
            assert_eq!(outcomes.len(), end - start);
            for (outcome, item) in outcomes.iter().zip(&items[start..end]) {
                match outcome {
                    AddOutcome::Added { id, version, .. } => {
                        assert_eq!((id, version), (&item.id, &item.version));
                    }
                    other => panic!("expected Added, got {other:?}"),
                }
            }
            start = end;
            batch_size = batch_size % 40 + 1;
            batches += 1;
        }
        assert!(batches > 100, "{batches} batches");
        let stats = store.stats();
        assert!(stats.segments > 3, "only {} segments", stats.segments);
        assert_eq!(stats.items, total as u64);
        assert_eq!(stats.versions, total as u64);
        check_all_read_back(&store, &expected);
        assert!(store.verify().expect("verify").is_ok());
    }
    let store = Options::new()
        .clock(clock.clone())
        .segment_size(4096)
        .open(dir.path())
        .expect("reopen");
    assert!(store.stats().segments > 3);
    assert_eq!(store.stats().items, total as u64);
    check_all_read_back(&store, &expected);
    let report = store.verify().expect("verify");
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.records_checked >= total as u64);
}

#[test]
fn adding_the_same_item_again_is_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let it = item("a", T0, "1", json!({"x": 1, "y": [1, 2]}));
    assert!(matches!(
        store.add([it.clone()]).expect("add")[0],
        AddOutcome::Added { .. }
    ));
    let seq = store.stats().seq;
    // Same content with keys in another order and the hash declared: still the same canonical content.
    let again = item(
        "a",
        T0,
        "1",
        serde_json::from_str(r#"{"y":[1,2],"x":1}"#).expect("json"),
    )
    .with_hash(expected_hash(&it.content));
    let outcomes = store.add([again]).expect("add again");
    assert_eq!(
        outcomes,
        vec![AddOutcome::Unchanged {
            id: "a".into(),
            version: "1".into()
        }]
    );
    assert_eq!(store.stats().seq, seq, "an unchanged add must write nothing");
    assert_eq!(store.stats().versions, 1);
    assert_eq!(everything(&store), vec![stored_form(&it)]);
}

#[test]
fn a_batch_mixing_unchanged_and_new_items_stores_the_new_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = item("a", T0, "1", json!("A"));
    let b = item("b", T0 + 1, "1", json!("B"));
    let c = item("c", T0 + 2, "1", json!("C"));
    {
        let store = Store::open(dir.path()).expect("open");
        store.add([a.clone()]).expect("a");
        let outcomes = store.add([a.clone(), b.clone(), c.clone()]).expect("mixed batch");
        assert!(matches!(outcomes[0], AddOutcome::Unchanged { .. }), "{outcomes:?}");
        assert!(matches!(outcomes[1], AddOutcome::Added { .. }), "{outcomes:?}");
        assert!(matches!(outcomes[2], AddOutcome::Added { .. }), "{outcomes:?}");
        let resolved = store.resolve(["a", "b", "c"]).expect("resolve");
        assert_eq!(
            resolved,
            vec![
                Resolution::Found(stored_form(&a)),
                Resolution::Found(stored_form(&b)),
                Resolution::Found(stored_form(&c)),
            ]
        );
        assert_eq!(
            everything(&store),
            vec![stored_form(&a), stored_form(&b), stored_form(&c)]
        );
        assert_eq!(store.stats().versions, 3);
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(
        everything(&store),
        vec![stored_form(&a), stored_form(&b), stored_form(&c)]
    );
}

#[test]
fn a_batch_mixing_unchanged_and_new_items_reads_back_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = item("a", T0, "1", json!("A"));
    let b = item("b", T0 + 1, "1", json!("B"));
    let c = item("c", T0 + 2, "1", json!("C"));
    {
        let store = Store::open(dir.path()).expect("open");
        store.add([a.clone()]).expect("a");
        store.add([a.clone(), b.clone(), c.clone()]).expect("mixed batch");
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(
        store.resolve(["a", "b", "c"]).expect("resolve"),
        vec![
            Resolution::Found(stored_form(&a)),
            Resolution::Found(stored_form(&b)),
            Resolution::Found(stored_form(&c)),
        ]
    );
    assert_eq!(
        everything(&store),
        vec![stored_form(&a), stored_form(&b), stored_form(&c)]
    );
    assert_eq!(store.stats().versions, 3);
}

#[test]
fn same_version_with_other_content_is_a_version_conflict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let original = item("a", T0, "1", json!({"x": 1}));
    store.add([original.clone()]).expect("add");
    let err = store.add([item("a", T0, "1", json!({"x": 2}))]).expect_err("conflict");
    match &err {
        Error::VersionConflict {
            id,
            version,
            existing,
            attempted,
            index,
        } => {
            assert_eq!((id.as_str(), version.as_str(), *index), ("a", "1", Some(0)));
            assert_eq!(existing, &expected_hash(&json!({"x": 1})));
            assert_eq!(attempted, &expected_hash(&json!({"x": 2})));
        }
        other => panic!("expected VersionConflict, got {other:?}"),
    }
    assert_eq!(
        found(&store.resolve(["a"]).expect("resolve")[0]),
        &stored_form(&original)
    );
}

#[test]
fn new_version_becomes_latest_even_with_an_older_timestamp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v1 = item("doc", T0 + 1000, "1", json!("first"));
    let v2 = item("doc", T0, "2", json!("second"));
    {
        let store = Store::open(dir.path()).expect("open");
        store.add([v1.clone()]).expect("v1");
        match &store.add([v2.clone()]).expect("v2")[0] {
            AddOutcome::Added { id, version, seq } => {
                assert_eq!((id.as_str(), version.as_str()), ("doc", "2"));
                assert_eq!(*seq, store.stats().seq);
            }
            other => panic!("expected Added, got {other:?}"),
        }
    }
    let store = Store::open(dir.path()).expect("reopen");
    for _ in 0..2 {
        let resolved = store
            .resolve(["doc", "doc@2", "doc@1", "doc@9", "nope", "nope@1"])
            .expect("resolve");
        assert_eq!(resolved[0], Resolution::Found(stored_form(&v2)));
        assert_eq!(resolved[1], Resolution::Found(stored_form(&v2)));
        assert_eq!(
            resolved[2],
            Resolution::Superseded {
                id: "doc".into(),
                requested_version: "1".into(),
                latest: stored_form(&v2),
            }
        );
        assert_eq!(
            resolved[3],
            Resolution::NotFound {
                reference: "doc@9".into()
            }
        );
        assert_eq!(
            resolved[4],
            Resolution::NotFound {
                reference: "nope".into()
            }
        );
        assert_eq!(
            resolved[5],
            Resolution::NotFound {
                reference: "nope@1".into()
            }
        );
        assert_eq!(everything(&store), vec![stored_form(&v2)]);
        let window = TimeRange::new(T0 + 500, T0 + 2000).expect("range");
        assert!(store
            .get(&ContextQuery::new().time_range(window))
            .expect("get")
            .is_empty());
    }
}

#[test]
fn delete_tombstones_survive_reopen_and_readding_starts_a_fresh_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let keep = item("keep", T0, "1", json!("kept"));
    let gone_v1 = item("gone", T0 + 1, "1", json!("old one"));
    let gone_v2 = item("gone", T0 + 2, "2", json!("old two"));
    {
        let store = Store::open(dir.path()).expect("open");
        store.add([keep.clone(), gone_v1.clone()]).expect("add");
        store.add([gone_v2]).expect("add v2");
        assert!(!store.delete("never-there").expect("delete unknown"));
        assert!(store.delete("gone").expect("delete"));
        assert!(!store.delete("gone").expect("delete again"));
        assert_eq!(
            store.resolve(["gone", "gone@1", "gone@2"]).expect("resolve"),
            vec![
                Resolution::NotFound {
                    reference: "gone".into()
                },
                Resolution::NotFound {
                    reference: "gone@1".into()
                },
                Resolution::NotFound {
                    reference: "gone@2".into()
                },
            ]
        );
        assert_eq!(everything(&store), vec![stored_form(&keep)]);
        assert_eq!(store.stats().items, 1);
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(everything(&store), vec![stored_form(&keep)]);
    assert!(matches!(
        &store.resolve(["gone"]).expect("resolve")[0],
        Resolution::NotFound { .. }
    ));
    assert!(!store.delete("gone").expect("the tombstone survived the reopen"));

    // A fresh history: version 1 again with other content is not a conflict.
    let fresh_v1 = item("gone", T0 + 3, "1", json!("new one"));
    assert!(matches!(
        store.add([fresh_v1.clone()]).expect("re-add")[0],
        AddOutcome::Added { .. }
    ));
    assert_eq!(
        found(&store.resolve(["gone"]).expect("resolve")[0]),
        &stored_form(&fresh_v1)
    );
    // Version 2 of the old history is unknown to the new one.
    assert!(matches!(
        &store.resolve(["gone@2"]).expect("resolve")[0],
        Resolution::NotFound { .. }
    ));
    let fresh_v2 = item("gone", T0 + 4, "2", json!("new two"));
    store
        .add([fresh_v2.clone()])
        .expect("v2 of the fresh history (old v2 content differs)");
    drop(store);
    let store = Store::open(dir.path()).expect("reopen again");
    assert_eq!(
        store.resolve(["gone@1", "gone"]).expect("resolve"),
        vec![
            Resolution::Superseded {
                id: "gone".into(),
                requested_version: "1".into(),
                latest: stored_form(&fresh_v2),
            },
            Resolution::Found(stored_form(&fresh_v2)),
        ]
    );
    assert_eq!(everything(&store), vec![stored_form(&keep), stored_form(&fresh_v2)]);
    assert!(store.delete("gone").expect("delete the fresh history"));
}

#[test]
fn a_snapshot_keeps_answering_the_same_after_later_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let initial: Vec<ContextItem> = (0..50).map(varied).collect();
    store.add(initial.clone()).expect("add");
    let queries = [
        ContextQuery::new(),
        ContextQuery::new().types(["tool_result", "message"]).newest_first(),
        ContextQuery::new()
            .time_range(TimeRange::new(T0, T0 + 900).expect("range"))
            .limit(7),
        ContextQuery::new().scopes([Scope::GlobalReadonly]),
    ];
    let refs = [
        "item-00000",
        "item-00001",
        "item-00002@v2.2",
        "item-00003",
        "item-00049",
        "later",
    ];
    let snap = store.snapshot();
    let answers = |view: &Snapshot| -> Vec<String> {
        let mut out: Vec<String> = queries
            .iter()
            .map(|q| serde_json::to_string(&view.get(q).expect("get")).expect("json"))
            .collect();
        out.push(serde_json::to_string(&view.resolve(refs).expect("resolve")).expect("json"));
        out
    };
    let before = answers(&snap);
    assert_eq!(before, answers(&store.snapshot()));

    // Later writes: new ids, new versions (one with an older timestamp), deletes, a re-add.
    store.add((50..80).map(varied)).expect("more");
    let mut newer = varied(1);
    newer.version = "later.1".into();
    newer.content = json!("changed");
    newer.timestamp = T0 - 5;
    store
        .add([newer, item("later", T0 + 1, "1", json!(1))])
        .expect("new versions");
    assert!(store.delete("item-00000").expect("delete"));
    assert!(store.delete("item-00003").expect("delete"));
    store
        .add([item("item-00003", T0 + 3, "x", json!("reborn"))])
        .expect("re-add");
    assert!(store.stats().seq > snap.seq());

    let after = answers(&snap);
    assert_eq!(before, after, "a snapshot's answers changed after later writes");
    assert_ne!(
        before,
        answers(&store.snapshot()),
        "the later writes should be visible to a new snapshot"
    );
    let resolved = snap.resolve(refs).expect("resolve");
    assert_eq!(resolved[0], Resolution::Found(stored_form(&initial[0])));
    assert_eq!(
        resolved[5],
        Resolution::NotFound {
            reference: "later".into()
        }
    );
}

#[test]
fn get_orders_oldest_first_by_timestamp_then_id_and_newest_first_is_the_exact_reverse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    // Many ids share timestamps; add them in an order unrelated to the expected one.
    let mut items: Vec<ContextItem> = (0..120)
        .map(|n| {
            let id = format!("{}-{}", ["zeta", "alpha", "Mid", "beta.2", "beta.10"][n % 5], n / 5);
            ContextItem::new(
                id,
                BUILTIN_TYPES[n % 7],
                json!(n),
                "src",
                T0 + ((n * 7919) % 13) as i64,
                "1",
                if n % 2 == 0 {
                    Scope::GlobalReadonly
                } else {
                    Scope::Session("s".into())
                },
            )
        })
        .collect();
    items.reverse();
    for chunk in items.chunks(17) {
        store.add(chunk.to_vec()).expect("add");
    }
    let mut expected: Vec<ContextItem> = items.iter().map(stored_form).collect();
    expected.sort_by(|a, b| (a.timestamp, a.id.as_bytes()).cmp(&(b.timestamp, b.id.as_bytes())));
    let oldest_first = everything(&store);
    assert_eq!(ids(&oldest_first), ids(&expected));
    assert_eq!(oldest_first, expected);
    let newest_first = store.get(&ContextQuery::new().newest_first()).expect("get");
    let mut reversed = expected.clone();
    reversed.reverse();
    assert_eq!(newest_first, reversed);

    // The same holds through each index: by type, by scope, and with a time range.
    for query in [
        ContextQuery::new().types(["document_chunk", "message", "tool_result"]),
        ContextQuery::new().scopes([Scope::GlobalReadonly, Scope::Session("s".into())]),
        ContextQuery::new().time_range(TimeRange::new(T0 + 3, T0 + 9).expect("range")),
    ] {
        let forward = store.get(&query).expect("get");
        assert!(!forward.is_empty());
        let mut backward = store.get(&query.clone().newest_first()).expect("get");
        backward.reverse();
        assert_eq!(forward, backward);
        let keys: Vec<(i64, &str)> = forward.iter().map(|it| (it.timestamp, it.id.as_str())).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
    }

    // Limits take a prefix of either order.
    for n in [0, 1, 5, 13, 119, 120, 500] {
        let limited = store.get(&ContextQuery::new().limit(n)).expect("get");
        assert_eq!(limited, expected[..n.min(expected.len())].to_vec(), "limit {n}");
        let limited = store.get(&ContextQuery::new().newest_first().limit(n)).expect("get");
        assert_eq!(
            limited,
            reversed[..n.min(reversed.len())].to_vec(),
            "newest_first limit {n}"
        );
    }
}

#[test]
fn filters_select_exactly_the_matching_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let items: Vec<ContextItem> = (0..200)
        .map(|n| {
            let mut it = ContextItem::new(
                format!("f{n:03}"),
                BUILTIN_TYPES[n % 7],
                json!({
                    "jurisdiction": (["CN", "US", "DE"][n % 3]),
                    "meta": {"lang": (["en", "zh"][n % 2]), "page": n % 4},
                    "a.b": "top-level dotted key",
                }),
                ["crm_export", "wiki", "tickets", "mail"][n % 4],
                T0 + n as i64,
                "1",
                match n % 3 {
                    0 => Scope::GlobalReadonly,
                    1 => Scope::GlobalWritable,
                    _ => Scope::Session(format!("s{}", n % 2)),
                },
            );
            if n % 4 != 3 {
                it = it.with_confidence(((n * 13) % 11) as f64 / 10.0);
            }
            it
        })
        .collect();
    store.add(items.clone()).expect("add");
    let expect = |pred: &dyn Fn(&ContextItem) -> bool| -> Vec<ContextItem> {
        items.iter().filter(|it| pred(it)).map(stored_form).collect()
    };
    let check = |query: ContextQuery, want: Vec<ContextItem>| {
        assert!(!want.is_empty(), "a filter test with nothing to find proves little");
        assert!(want.len() < items.len());
        assert_eq!(store.get(&query).expect("get"), want, "{query:?}");
    };

    check(
        ContextQuery::new().sources(["wiki", "mail"]),
        expect(&|it| it.source == "wiki" || it.source == "mail"),
    );
    assert!(store
        .get(&ContextQuery::new().sources(["nowhere"]))
        .expect("get")
        .is_empty());
    check(
        ContextQuery::new().min_confidence(0.5),
        expect(&|it| it.confidence.is_none_or(|c| c >= 0.5)),
    );
    // Items without a confidence pass even the strictest bound; a confidence equal to the bound passes.
    let strict = store.get(&ContextQuery::new().min_confidence(1.0)).expect("get");
    assert!(strict.iter().any(|it| it.confidence.is_none()));
    assert!(strict.iter().any(|it| it.confidence == Some(1.0)));
    assert_eq!(strict, expect(&|it| it.confidence.is_none_or(|c| c >= 1.0)));
    check(
        ContextQuery::new().content_eq("jurisdiction", json!("CN")),
        expect(&|it| it.content["jurisdiction"] == "CN"),
    );
    check(
        ContextQuery::new().content_eq("meta.lang", json!("zh")),
        expect(&|it| it.content["meta"]["lang"] == "zh"),
    );
    check(
        ContextQuery::new()
            .content_eq("meta.page", json!(2))
            .content_eq("jurisdiction", json!("DE")),
        expect(&|it| it.content["meta"]["page"] == 2 && it.content["jurisdiction"] == "DE"),
    );
    assert!(store
        .get(&ContextQuery::new().content_eq("meta.page", json!("2")))
        .expect("get")
        .is_empty());
    assert_eq!(
        store
            .get(&ContextQuery::new().content_eq("a.b", json!("top-level dotted key")))
            .expect("get")
            .len(),
        items.len()
    );
    check(
        ContextQuery::new().scopes([Scope::GlobalWritable, Scope::Session("s1".into())]),
        expect(&|it| it.scope == Scope::GlobalWritable || it.scope == Scope::Session("s1".into())),
    );
    check(
        ContextQuery::new()
            .types(["message", "tool_result"])
            .sources(["crm_export", "tickets"])
            .min_confidence(0.3)
            .time_range(TimeRange::new(T0 + 20, T0 + 150).expect("range")),
        expect(&|it| {
            (it.kind == "message" || it.kind == "tool_result")
                && (it.source == "crm_export" || it.source == "tickets")
                && it.confidence.is_none_or(|c| c >= 0.3)
                && (T0 + 20..=T0 + 150).contains(&it.timestamp)
        }),
    );
}

#[test]
fn empty_filter_lists_match_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ctxlog::Store::open(dir.path()).expect("open");
    let item = ctxlog::ContextItem::new(
        "e1",
        "message",
        serde_json::json!({"a": 1}),
        "src",
        1_700_000_000,
        "1",
        ctxlog::Scope::GlobalWritable,
    );
    store.add([item]).expect("add");
    let everything = ctxlog::ContextQuery::new();
    assert_eq!(store.get(&everything).expect("get").len(), 1);
    let no_types = ctxlog::ContextQuery::new().types(Vec::<String>::new());
    let no_scopes = ctxlog::ContextQuery::new().scopes(Vec::new());
    let no_sources = ctxlog::ContextQuery::new().sources(Vec::<String>::new());
    for query in [no_types, no_scopes, no_sources] {
        assert!(store.get(&query).expect("get").is_empty(), "{query:?}");
    }
}
