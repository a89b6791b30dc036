//! The raw read path (`resolve_raw`, `get_raw` on `Store`, `SessionView` and `Snapshot`) gives, for
//! every reference and query, the answer of the parsed path, variant for variant, with each item's
//! JSON byte-identical to `serde_json::to_vec` of the parsed item: over varied content (stored
//! LZ4-compressed and as it is, unicode, escapes, numbers of every kind), optional fields present and
//! absent, session and global scopes; NotFound, Expired, Superseded and HashMismatch; session
//! isolation; pinned snapshots after compaction; and damaged records, which are never returned.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{clock_at, incompressible, NOW};
use ctxlog::*;
use proptest::prelude::*;
use serde_json::{json, Value};

/// A store that compresses content, so that reads meet both storage forms (short and
/// incompressible content is stored as it is).
fn open(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .auto_compact(false)
        .compress_content(true)
        .open(dir)
        .expect("open store")
}

fn json_bytes(item: &ContextItem) -> Vec<u8> {
    serde_json::to_vec(item).expect("serializing an item")
}

/// Asserts that a raw answer is the parsed answer, variant for variant, with byte-identical JSON.
fn assert_same_answer(raw: &RawResolution, parsed: &Resolution, context: &str) {
    match (raw, parsed) {
        (RawResolution::Found(raw), Resolution::Found(item)) => {
            assert_eq!(
                raw.as_str(),
                String::from_utf8(json_bytes(item)).expect("UTF-8"),
                "{context}: Found differs"
            );
            assert_eq!(raw.as_bytes(), json_bytes(item).as_slice(), "{context}");
            assert_eq!(&raw.to_item().expect("raw JSON parses"), item, "{context}");
        }
        (RawResolution::NotFound { reference: a }, Resolution::NotFound { reference: b }) => {
            assert_eq!(a, b, "{context}");
        }
        (RawResolution::Expired { id: a, expired_at: x }, Resolution::Expired { id: b, expired_at: y }) => {
            assert_eq!((a, x), (b, y), "{context}")
        }
        (
            RawResolution::Superseded {
                id: a,
                requested_version: va,
                latest: raw,
            },
            Resolution::Superseded {
                id: b,
                requested_version: vb,
                latest: item,
            },
        ) => {
            assert_eq!((a, va), (b, vb), "{context}");
            assert_eq!(
                raw.as_bytes(),
                json_bytes(item).as_slice(),
                "{context}: Superseded latest differs"
            );
        }
        (RawResolution::HashMismatch { id: a }, Resolution::HashMismatch { id: b }) => assert_eq!(a, b, "{context}"),
        (raw, parsed) => panic!("{context}: raw answered {raw:?}, parsed {parsed:?}"),
    }
}

fn assert_same_resolves(raw: &[RawResolution], parsed: &[Resolution], context: &str) {
    assert_eq!(raw.len(), parsed.len(), "{context}: answer counts differ");
    for (position, (raw, parsed)) in raw.iter().zip(parsed).enumerate() {
        assert_same_answer(raw, parsed, &format!("{context}, reference {position}"));
    }
}

fn assert_same_items(raw: &[RawItem], parsed: &[ContextItem], context: &str) {
    let raw: Vec<&str> = raw.iter().map(RawItem::as_str).collect();
    let parsed: Vec<String> = parsed
        .iter()
        .map(|item| String::from_utf8(json_bytes(item)).expect("UTF-8"))
        .collect();
    assert_eq!(raw, parsed, "{context}: get_raw and get differ");
}

/// Content of every JSON kind, with keys whose byte order differs from their char order, escapes,
/// unicode, and numbers that are easy to print differently.
fn varied_contents() -> Vec<(&'static str, Value)> {
    let long_text = "the same words again and again, compressible ".repeat(30);
    vec![
        ("short", json!({"a": 1})),
        ("null", Value::Null),
        ("bool", json!(true)),
        (
            "string",
            json!("a \"quoted\" \\ back\tslash\nnewline \u{1} \u{7f} é 中文 🦀"),
        ),
        (
            "numbers",
            json!([
                0,
                -0.0,
                0.1,
                1e-7,
                1.5e300,
                -2.5e-300,
                123_456_789.125,
                u64::MAX,
                i64::MIN,
                3.0,
                1e21,
                4e-5
            ]),
        ),
        (
            "keys",
            json!({"z": 1, "Z": 2, "é": 3, "e": 4, "中": 5, "🦀": 6, "": 7, "a b": 8, "\"q\"": 9, "\\": 10}),
        ),
        (
            "nested",
            json!({"b": {"d": [1, {"y": null, "x": []}], "c": {}}, "a": [[[]]]}),
        ),
        ("empty", json!({})),
        ("long_repetitive", json!({"text": long_text, "lang": "en", "n": 7})),
        ("long_random", json!({"text": incompressible("long_random", 600)})),
        (
            "long_unicode",
            json!({"text": "Größe 中文字符 🦀 ümlaut ".repeat(20), "escapes": "\u{0}\u{1f}\"\\/"}),
        ),
    ]
}

/// One item per content, cycling through scopes and optional fields.
fn varied_items() -> Vec<ContextItem> {
    let sources = ["crm", "source with \"quotes\" and \\ and é", "中文来源", "s"];
    varied_contents()
        .into_iter()
        .enumerate()
        .map(|(n, (name, content))| {
            let scope = match n % 4 {
                0 => Scope::Session("s1".into()),
                1 => Scope::GlobalReadonly,
                2 => Scope::GlobalWritable,
                _ => Scope::Session("s2".into()),
            };
            let timestamp = if n == 0 { 0 } else { NOW - 1000 + n as i64 };
            let mut item = ContextItem::new(
                format!("raw:{name}"),
                common::BUILTIN_TYPES[n % 7],
                content,
                sources[n % sources.len()],
                timestamp,
                format!("v{n}.1"),
                scope,
            );
            if n % 2 == 0 {
                item = item.with_ttl(u64::MAX - n as u64);
            }
            match n % 3 {
                0 => item = item.with_confidence([0.0, 1.0, 1.0 / 3.0, 1e-10][n % 4]),
                1 => {
                    let hash = common::expected_hash(&item.content);
                    item = item.with_hash(hash);
                }
                _ => {}
            }
            item
        })
        .collect()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// Whether the segment files in `dir` hold `content`'s canonical JSON as it is (not compressed).
fn stored_as_is(dir: &Path, content: &Value) -> bool {
    let segments: Vec<u8> = common::segment_files(dir)
        .iter()
        .flat_map(|p| std::fs::read(p).expect("read"))
        .collect();
    find(&segments, &canonical_json(content)).is_some()
}

#[test]
fn raw_reads_are_byte_identical_to_the_parsed_items() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    let store = open(dir.path(), &clock);
    let items = varied_items();
    store.add(items.clone()).expect("add");

    // Both storage forms are exercised: short or incompressible content is stored as it is,
    // repetitive content LZ4-compressed (so its canonical bytes are not in the file).
    let as_is = |name: &str| {
        let item = items.iter().find(|it| it.id == format!("raw:{name}")).expect("item");
        stored_as_is(dir.path(), &item.content)
    };
    assert!(as_is("long_random"), "incompressible content stored as it is");
    assert!(as_is("keys"), "short content stored as it is");
    assert!(!as_is("long_repetitive"), "repetitive content stored compressed");
    assert!(!as_is("long_unicode"), "repetitive unicode stored compressed");

    let refs: Vec<String> = items.iter().map(|it| it.id.clone()).collect();
    let parsed = store.resolve(&refs).expect("resolve");
    let raw = store.resolve_raw(&refs).expect("resolve_raw");
    assert_same_resolves(&raw, &parsed, "store");
    for (item, answer) in items.iter().zip(&parsed) {
        assert_eq!(
            common::found(answer),
            &common::stored_form(item),
            "{} comes back as added",
            item.id
        );
    }
    // `id@version` of the latest version is Found too.
    let versioned: Vec<String> = items.iter().map(|it| format!("{}@{}", it.id, it.version)).collect();
    assert_same_resolves(
        &store.resolve_raw(&versioned).expect("resolve_raw"),
        &store.resolve(&versioned).expect("resolve"),
        "id@version",
    );

    let queries = [
        ContextQuery::new(),
        ContextQuery::new().newest_first(),
        ContextQuery::new().types(["document_chunk", "message", "tool_result"]),
        ContextQuery::new().scopes([Scope::GlobalReadonly, Scope::Session("s2".into())]),
        ContextQuery::new().min_confidence(0.5),
        ContextQuery::new().sources(["中文来源"]),
        ContextQuery::new().content_eq("lang", json!("en")),
        ContextQuery::new().content_eq("b.c", json!({})),
        ContextQuery::new()
            .time_range(TimeRange::new(NOW - 995, NOW).expect("range"))
            .limit(3),
        ContextQuery::new().newest_first().limit(1),
    ];
    for (n, query) in queries.iter().enumerate() {
        let parsed = store.get(query).expect("get");
        let raw = store.get_raw(query).expect("get_raw");
        assert_same_items(&raw, &parsed, &format!("query {n}"));
    }
    assert_eq!(store.get_raw(&ContextQuery::new()).expect("get_raw").len(), items.len());
    assert_eq!(
        store.get_raw(&queries[6]).expect("get_raw").len(),
        1,
        "content_eq matches one item"
    );
    assert_eq!(
        store.get_raw(&queries[7]).expect("get_raw").len(),
        1,
        "dotted content_eq matches one item"
    );

    // After a restart (the index from a checkpoint) the answers are the same bytes.
    let before: Vec<Vec<u8>> = store
        .get_raw(&ContextQuery::new())
        .expect("get_raw")
        .into_iter()
        .map(RawItem::into_bytes)
        .collect();
    drop(store);
    let store = open(dir.path(), &clock);
    let after: Vec<Vec<u8>> = store
        .get_raw(&ContextQuery::new())
        .expect("get_raw")
        .into_iter()
        .map(Vec::from)
        .collect();
    assert_eq!(before, after, "raw answers changed across a reopen");
}

/// Compression is the store's choice at open (`Options::compress_content`, off by default), made
/// per item as it is added: a store holds both forms after being reopened with the other setting,
/// reads every item back the same either way, and keeps both through compaction and reopening.
#[test]
fn compression_is_chosen_per_open_and_both_forms_read_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    let open_with = |compress: Option<bool>| {
        let options = Options::new()
            .clock(Arc::clone(&clock) as Arc<dyn Clock>)
            .auto_compact(false);
        match compress {
            Some(on) => options.compress_content(on),
            None => options,
        }
        .open(dir.path())
        .expect("open")
    };
    let item = |id: &str, words: &str| {
        ContextItem::new(
            id,
            "document_chunk",
            json!({"id": id, "text": words.repeat(40)}),
            "crm",
            NOW - 10,
            "1",
            Scope::Session("s1".into()),
        )
    };
    let stored_plain = |item: &ContextItem| stored_as_is(dir.path(), &item.content);
    let plain_default = item("plain:default", "words that repeat and repeat ");
    let packed = item("packed:on", "other words that repeat again ");
    let plain_off = item("plain:off", "a third run of repeating words ");
    let all = [plain_default.clone(), packed.clone(), plain_off.clone()];
    let refs: Vec<&str> = all.iter().map(|it| it.id.as_str()).collect();
    let check = |store: &Store, round: &str| {
        let parsed = store.resolve(&refs).expect("resolve");
        let raw = store.resolve_raw(&refs).expect("resolve_raw");
        assert_same_resolves(&raw, &parsed, round);
        for (answer, expected) in parsed.iter().zip(&all) {
            match answer {
                Resolution::Found(found) => {
                    let mut expected = expected.clone();
                    expected.hash = found.hash.clone();
                    assert_eq!(found, &expected, "{round}: {}", expected.id);
                    assert_eq!(found.hash, Some(common::expected_hash(&expected.content)), "{round}");
                }
                other => panic!("{round}: {} answered {other:?}", expected.id),
            }
        }
        let report = store.verify().expect("verify");
        assert!(report.is_ok() && report.records_checked >= 3, "{round}: {report:?}");
    };

    let store = open_with(None);
    store.add([plain_default.clone()]).expect("add");
    drop(store);
    assert!(stored_plain(&plain_default), "the default stores content as it is");

    let store = open_with(Some(true));
    store.add([packed.clone()]).expect("add");
    drop(store);
    assert!(
        !stored_plain(&packed),
        "compress_content(true) stores repetitive content compressed"
    );

    let store = open_with(Some(false));
    store.add([plain_off.clone()]).expect("add");
    check(&store, "both forms, reopened without compression");
    // Compaction copies records as they are stored: each keeps its form.
    store.compact().expect("compact");
    check(&store, "after compaction");
    drop(store);
    assert!(
        stored_plain(&plain_default) && stored_plain(&plain_off),
        "plain records stay plain"
    );
    assert!(!stored_plain(&packed), "a compressed record stays compressed");
    let store = open_with(Some(true));
    check(&store, "reopened with compression");
}

#[test]
fn raw_item_accessors_agree() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(dir.path(), &clock_at(NOW));
    let item = common::item("acc", NOW, "1", json!({"k": "v"}));
    store.add([item.clone()]).expect("add");
    let raw = store.get_raw(&ContextQuery::new()).expect("get_raw").remove(0);
    let expected = String::from_utf8(json_bytes(&common::stored_form(&item))).expect("UTF-8");
    assert_eq!(raw.as_str(), expected);
    assert_eq!(raw.to_string(), expected);
    assert_eq!(raw.len(), expected.len());
    assert!(!raw.is_empty());
    assert_eq!(AsRef::<[u8]>::as_ref(&raw), expected.as_bytes());
    assert_eq!(AsRef::<str>::as_ref(&raw), expected);
    assert_eq!(String::from(raw.clone()), expected);
    assert_eq!(raw.clone().into_string(), expected);
    assert_eq!(raw.to_item().expect("parses"), common::stored_form(&item));
    assert!(format!("{raw:?}").starts_with("RawItem("));
}

#[test]
fn not_found_expired_superseded_answer_as_resolve_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    let store = open(dir.path(), &clock);
    let content = |n: u32| json!({"n": n, "text": "words words words words ".repeat(10)});
    store
        .add([
            common::item("doc", NOW, "1", content(1)),
            common::item("ttl", NOW, "1", content(2)).with_ttl(60),
            common::item("ttl2", NOW, "a", content(3)).with_ttl(60),
            common::item("gone", NOW, "1", content(4)),
        ])
        .expect("add");
    store
        .add([common::item("doc", NOW - 5, "2", content(5))])
        .expect("add v2");
    store
        .add([common::item("ttl2", NOW, "b", content(6)).with_ttl(60)])
        .expect("add ttl2 b");
    assert!(store.delete("gone").expect("delete"));
    clock.advance(61);
    let refs = [
        "doc",     // Found (v2, the latest although older)
        "doc@2",   // Found
        "doc@1",   // Superseded
        "doc@9",   // NotFound: no such version
        "nothing", // NotFound: no such id
        "ttl",     // Expired
        "ttl@1",   // Expired
        "ttl2@a",  // Expired: the id's latest has expired
        "gone",    // NotFound: deleted
        "gone@1",  // NotFound
    ];
    let parsed = store.resolve(refs).expect("resolve");
    let raw = store.resolve_raw(refs).expect("resolve_raw");
    assert_same_resolves(&raw, &parsed, "store");
    assert!(matches!(&raw[0], RawResolution::Found(_)));
    assert!(matches!(&raw[2], RawResolution::Superseded { requested_version, .. } if requested_version == "1"));
    assert!(matches!(&raw[3], RawResolution::NotFound { reference } if reference == "doc@9"));
    assert!(matches!(&raw[4], RawResolution::NotFound { .. }));
    assert!(matches!(&raw[5], RawResolution::Expired { expired_at, .. } if *expired_at == NOW + 60));
    assert!(matches!(&raw[6], RawResolution::Expired { .. }));
    assert!(matches!(&raw[7], RawResolution::Expired { id, .. } if id == "ttl2"));
    assert!(matches!(&raw[8], RawResolution::NotFound { .. }));
    assert!(matches!(&raw[9], RawResolution::NotFound { .. }));
    // Expired and deleted items are not in get_raw either.
    assert_same_items(
        &store.get_raw(&ContextQuery::new()).expect("get_raw"),
        &store.get(&ContextQuery::new()).expect("get"),
        "get after expiry",
    );
    assert_eq!(store.get_raw(&ContextQuery::new()).expect("get_raw").len(), 1);
    // Bad references are refused the same way, with their position.
    for bad in [vec!["ok", "bad id"], vec!["a@"]] {
        let raw = store.resolve_raw(&bad).expect_err("bad reference");
        let parsed = store.resolve(&bad).expect_err("bad reference");
        assert_eq!(raw.to_string(), parsed.to_string());
    }
    // Queries refused alike.
    let bad_query = ContextQuery::new().types(["no_such_type"]);
    assert!(matches!(store.get_raw(&bad_query), Err(Error::UnknownType { .. })));
}

#[test]
fn sessions_never_see_other_sessions_items_through_raw_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    let store = open(dir.path(), &clock);
    let items = varied_items();
    store.add(items.clone()).expect("add");
    // A second version of an s2 item, so that `id@version` refs of it could answer Superseded.
    let s2_item = items
        .iter()
        .find(|it| it.scope == Scope::Session("s2".into()))
        .expect("an s2 item")
        .clone();
    let mut newer = s2_item.clone();
    newer.version = "v99".into();
    newer.hash = None;
    store.add([newer]).expect("add a newer s2 version");

    let mut refs: Vec<String> = items.iter().map(|it| it.id.clone()).collect();
    refs.push(format!("{}@{}", s2_item.id, s2_item.version));
    for session in ["s1", "s2", "s3", "bad id"] {
        let view = store.session(session);
        let raw = view.resolve_raw(&refs).expect("resolve_raw");
        assert_same_resolves(&raw, &view.resolve(&refs).expect("resolve"), session);
        for (item, answer) in items.iter().zip(&raw) {
            let visible = match &item.scope {
                Scope::Session(owner) => owner == session,
                _ => true,
            };
            match answer {
                RawResolution::Found(raw) => {
                    assert!(visible, "{session} sees {}", item.id);
                    assert!(
                        !raw.as_str().contains("\"session_id\"")
                            || raw.as_str().contains(&format!("\"session_id\":\"{session}\""))
                    );
                }
                RawResolution::NotFound { .. } => assert!(!visible, "{session} does not see {}", item.id),
                other => panic!("{session}: {} answered {other:?}", item.id),
            }
        }
        let superseded = raw.last().expect("the versioned ref");
        if session == "s2" {
            assert!(matches!(superseded, RawResolution::Superseded { .. }), "{superseded:?}");
        } else {
            assert!(
                matches!(superseded, RawResolution::NotFound { .. }),
                "{session}: {superseded:?}"
            );
        }
        // Whatever the query asks for, only the session's own and the global scopes come back.
        for query in [
            ContextQuery::new(),
            ContextQuery::new().scopes([Scope::Session("s1".into()), Scope::Session("s2".into())]),
            ContextQuery::new().scopes([Scope::Session("s2".into())]).newest_first(),
        ] {
            let raw = view.get_raw(&query).expect("get_raw");
            assert_same_items(&raw, &view.get(&query).expect("get"), session);
            for item in &raw {
                let parsed = item.to_item().expect("parses");
                assert!(
                    parsed.scope.session_id().is_none_or(|owner| owner == session),
                    "{session} got {} of {:?}",
                    parsed.id,
                    parsed.scope
                );
            }
        }
        // A session view's snapshot keeps its visibility.
        let snap = view.snapshot();
        let snap_raw = snap.resolve_raw(&refs).expect("snapshot resolve_raw");
        assert_eq!(snap_raw, raw, "{session}: the snapshot answers as the view");
        assert_same_resolves(
            &snap_raw,
            &snap.resolve(&refs).expect("resolve"),
            &format!("{session} snapshot"),
        );
        assert_same_items(
            &snap.get_raw(&ContextQuery::new()).expect("snapshot get_raw"),
            &view.get(&ContextQuery::new()).expect("get"),
            &format!("{session} snapshot get"),
        );
    }
    let s1_seen = store
        .session("s1")
        .get_raw(&ContextQuery::new())
        .expect("get_raw")
        .len();
    let all = store.get_raw(&ContextQuery::new()).expect("get_raw").len();
    assert!(s1_seen < all, "s1 sees {s1_seen} of {all} items");
}

/// What a pinned snapshot answered before compaction, to compare with later.
struct Pinned {
    refs: Vec<String>,
    query: ContextQuery,
    resolved: Vec<RawResolution>,
    got: Vec<RawItem>,
    session_got: Vec<RawItem>,
}

fn check_pins(store: &Store, before: &Pinned, round: &str, moved_on: bool) {
    let pinned = store.open_snapshot("p").expect("open pin");
    let raw = pinned.resolve_raw(&before.refs).expect("resolve_raw");
    assert_eq!(raw, before.resolved, "{round}: pinned resolve_raw changed");
    assert_same_resolves(&raw, &pinned.resolve(&before.refs).expect("resolve"), round);
    let got = pinned.get_raw(&before.query).expect("get_raw");
    assert_eq!(got, before.got, "{round}: pinned get_raw changed");
    assert_same_items(&got, &pinned.get(&before.query).expect("get"), round);
    let session = store.open_snapshot("p-s1").expect("open session pin");
    let session_got = session.get_raw(&before.query).expect("get_raw");
    assert_eq!(session_got, before.session_got, "{round}: session pin changed");
    assert_same_items(&session_got, &session.get(&before.query).expect("get"), round);
    // The current state has moved on: newer versions, deletes, expiries.
    let current = store.get_raw(&before.query).expect("get_raw");
    assert_eq!(current != before.got, moved_on, "{round}");
    assert_same_items(
        &current,
        &store.get(&before.query).expect("get"),
        &format!("{round}, current"),
    );
}

#[test]
fn pinned_snapshots_give_the_same_raw_bytes_after_compaction_and_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    let open_small = || {
        Options::new()
            .clock(Arc::clone(&clock) as Arc<dyn Clock>)
            .auto_compact(false)
            .segment_size(4096)
            .open(dir.path())
            .expect("open")
    };
    let store = open_small();
    let mut items = varied_items();
    for (n, item) in items.iter_mut().enumerate() {
        item.timestamp = NOW + n as i64;
        item.ttl_seconds = (n % 3 == 0).then_some(100);
    }
    // Each item's draft version is added and superseded before the pin: compaction may reclaim the
    // drafts while the pin holds, and so rewrites the segments the pinned records share with them.
    let draft = |item: &ContextItem| {
        let mut draft = item.clone();
        draft.version = "draft".into();
        draft.content = json!({"draft": incompressible(&item.id, 400)});
        draft.hash = None;
        draft
    };
    store.add([draft(&items[0])]).expect("add a draft");
    for (n, item) in items.iter().enumerate() {
        let mut batch = vec![item.clone()];
        batch.extend(items.get(n + 1).map(draft));
        store.add(batch).expect("add");
    }
    store.pin_snapshot("p").expect("pin");
    store
        .session("s1")
        .snapshot()
        .pin("p-s1")
        .expect("pin a session snapshot");
    let refs: Vec<String> = items.iter().map(|it| it.id.clone()).collect();
    let query = ContextQuery::new().newest_first();
    let pinned = store.open_snapshot("p").expect("open pin");
    let before = Pinned {
        resolved: pinned.resolve_raw(&refs).expect("resolve_raw"),
        got: pinned.get_raw(&query).expect("get_raw"),
        session_got: store
            .open_snapshot("p-s1")
            .expect("open")
            .get_raw(&query)
            .expect("get_raw"),
        refs,
        query,
    };
    drop(pinned);
    assert_eq!(before.got.len(), items.len());
    assert!(before.session_got.len() < items.len());
    check_pins(&store, &before, "before compaction", false);

    // Churn after the pin: new versions of some, deletes of others, expiry of those with a TTL.
    for item in items.iter().step_by(2) {
        let mut newer = item.clone();
        newer.version = format!("{}-2", item.version);
        newer.content = json!({"replaced": item.id, "filler": incompressible(&item.id, 900)});
        newer.hash = None;
        store.add([newer]).expect("add a newer version");
    }
    for item in items.iter().skip(1).step_by(4) {
        store.delete(&item.id).expect("delete");
    }
    clock.advance(10_000);
    let report = store.compact().expect("compact");
    assert!(report.segments_rewritten > 0, "compaction rewrote nothing: {report:?}");
    // Reclaimed: every draft (superseded, or deleted with its id) and the newer versions that
    // expired (those with a TTL); nothing the pins see.
    let expired_newer = items
        .iter()
        .enumerate()
        .step_by(2)
        .filter(|(_, it)| it.ttl_seconds.is_some())
        .count();
    assert_eq!(
        report.reclaimed_superseded + report.reclaimed_deleted + report.reclaimed_expired,
        (items.len() + expired_newer) as u64,
        "{report:?}"
    );
    assert!(store.verify().expect("verify").is_ok());
    check_pins(&store, &before, "after compaction", true);
    drop(store);
    let store = open_small();
    check_pins(&store, &before, "after reopen", true);

    assert!(store.unpin_snapshot("p").expect("unpin"));
    assert!(store.unpin_snapshot("p-s1").expect("unpin"));
    let report = store.compact().expect("compact after unpin");
    assert!(report.reclaimed_superseded + report.reclaimed_deleted + report.reclaimed_expired > 0);
    let current = store.resolve_raw(&before.refs).expect("resolve_raw");
    assert_same_resolves(&current, &store.resolve(&before.refs).expect("resolve"), "after unpin");
}

#[test]
fn damaged_records_are_reported_never_returned_through_raw_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    let store = open(dir.path(), &clock);
    let plain_text = incompressible("plain", 300);
    let plain = common::item("plain", NOW, "1", json!({"text": plain_text}));
    let packed = common::item("packed", NOW + 1, "1", json!({"text": "pack me ".repeat(60)}));
    let healthy = common::item("healthy", NOW + 2, "1", json!({"text": "fine"}));
    store
        .add([plain.clone(), packed.clone(), healthy.clone()])
        .expect("add");
    store.flush().expect("flush");
    let path = common::segment_files(dir.path()).pop().expect("a segment");
    let pristine = std::fs::read(&path).expect("read segment");
    let refs = ["plain", "packed", "healthy"];
    let query = ContextQuery::new();

    let check = |damaged: &str, context: &str| {
        let raw = store.resolve_raw(refs).expect("resolve_raw");
        assert_same_resolves(&raw, &store.resolve(refs).expect("resolve"), context);
        for (reference, answer) in refs.iter().zip(&raw) {
            match answer {
                RawResolution::HashMismatch { id } => {
                    assert_eq!((id.as_str(), *reference), (damaged, damaged), "{context}")
                }
                RawResolution::Found(item) => {
                    assert_ne!(*reference, damaged, "{context}: the damaged record was returned");
                    assert!(item.as_str().contains(&format!("\"id\":\"{reference}\"")));
                }
                other => panic!("{context}: {reference} answered {other:?}"),
            }
        }
        assert!(
            raw.iter().any(|a| matches!(a, RawResolution::HashMismatch { .. })),
            "{context}: nothing reported"
        );
        match store.get_raw(&query) {
            Err(Error::Corrupt { file, .. }) => assert_eq!(file, path, "{context}"),
            other => panic!("{context}: get_raw answered {other:?}"),
        }
        assert!(matches!(store.get(&query), Err(Error::Corrupt { .. })), "{context}");
        let snap = store.snapshot();
        assert!(matches!(snap.get_raw(&query), Err(Error::Corrupt { .. })), "{context}");
        assert!(
            matches!(
                &snap.resolve_raw([damaged]).expect("resolve_raw")[0],
                RawResolution::HashMismatch { .. }
            ),
            "{context}"
        );
        // A query that does not reach the damaged record still answers.
        let sound = if damaged == "healthy" { NOW } else { NOW + 2 };
        let others = ContextQuery::new().time_range(TimeRange::new(sound, sound).expect("range"));
        assert_eq!(store.get_raw(&others).expect("get_raw").len(), 1, "{context}");
        assert!(
            !store.verify().expect("verify").is_ok(),
            "{context}: verify saw nothing"
        );
    };

    // 1. A flipped content byte: the record CRC no longer matches.
    let (_, body, body_len) = common::locate_record(&pristine, "plain");
    let content_at = body + body_len - 20;
    common::write_at(&path, content_at, &[pristine[content_at] ^ 0x01]);
    check("plain", "flipped content byte, stored as it is");
    common::write_at(&path, content_at, &[pristine[content_at]]);
    assert_same_items(
        &store.get_raw(&query).expect("get_raw"),
        &store.get(&query).expect("get"),
        "repaired",
    );

    // 2. The same flip with the record CRC recomputed: only the content's SHA-256 can tell.
    let (record, body, body_len) = common::locate_record(&pristine, "plain");
    let at = find(&pristine[body..body + body_len], plain_text.as_bytes()).expect("plain text stored") + body + 10;
    let replacement = if pristine[at] == b'a' { b'b' } else { b'a' };
    let mut forged = pristine[body..body + body_len].to_vec();
    forged[at - body] = replacement;
    common::write_at(&path, at, &[replacement]);
    common::write_at(&path, record + 5, &crc32fast::hash(&forged).to_le_bytes());
    check("plain", "content changed under a valid record CRC");
    common::write_at(&path, record, &pristine[record..body + body_len]);

    // 3. The compressed record: a byte of its LZ4 block, CRC recomputed, and then not.
    let (record, body, body_len) = common::locate_record(&pristine, "packed");
    let at = body + body_len - 3;
    let mut forged = pristine[body..body + body_len].to_vec();
    forged[at - body] ^= 0x20;
    common::write_at(&path, at, &[forged[at - body]]);
    check("packed", "compressed content changed, CRC intact");
    common::write_at(&path, record + 5, &crc32fast::hash(&forged).to_le_bytes());
    check("packed", "compressed content changed under a valid record CRC");
    common::write_at(&path, record, &pristine[record..body + body_len]);

    // 4. A byte outside the content (the source): CRC.
    let (_, body, _) = common::locate_record(&pristine, "healthy");
    let source_at = find(&pristine[body..], b"unit_tests").expect("source stored") + body;
    common::write_at(&path, source_at, b"U");
    check("healthy", "damaged source");
    common::write_at(&path, source_at, &pristine[source_at..source_at + 1]);

    assert_eq!(std::fs::read(&path).expect("read"), pristine, "the file is whole again");
    assert_same_items(
        &store.get_raw(&query).expect("get_raw"),
        &store.get(&query).expect("get"),
        "repaired",
    );
    assert!(store.verify().expect("verify").is_ok());
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,40}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,12}", inner, 0..8)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

#[test]
fn raw_json_is_byte_identical_for_arbitrary_content() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(dir.path(), &clock_at(NOW));
    let next = std::cell::Cell::new(0u64);
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config::with_cases(96));
    let strategy = (
        json_value(),
        any::<bool>(),
        prop::option::of(1u64..u64::MAX),
        prop::option::of(0.0f64..=1.0),
        "[^\\p{Cc}]{1,30}",
        0i64..=253_402_300_799,
    );
    runner
        .run(&strategy, |(content, repeat, ttl, confidence, source, timestamp)| {
            next.set(next.get() + 1);
            let next = next.get();
            // Repeating the value makes long, compressible content as well.
            let content = if repeat {
                json!([content.clone(), content.clone(), content])
            } else {
                content
            };
            let mut item = ContextItem::new(
                format!("p{next}"),
                "tool_result",
                content,
                source,
                timestamp,
                "1",
                if next.is_multiple_of(2) {
                    Scope::Session(format!("s{}", next % 3))
                } else {
                    Scope::GlobalWritable
                },
            );
            item.ttl_seconds = ttl;
            item.confidence = confidence;
            store.add([item.clone()]).expect("add");
            let raw = store.resolve_raw([item.id.as_str()]).expect("resolve_raw");
            let parsed = store.resolve([item.id.as_str()]).expect("resolve");
            match (&raw[0], &parsed[0]) {
                (RawResolution::Found(raw), Resolution::Found(found)) => {
                    let expected = json_bytes(found);
                    prop_assert_eq!(raw.as_bytes(), expected.as_slice());
                    prop_assert_eq!(found, &common::stored_form(&item));
                }
                (RawResolution::Expired { .. }, Resolution::Expired { .. }) => {}
                other => prop_assert!(false, "unexpected answers {:?}", other),
            }
            Ok(())
        })
        .expect("raw JSON matches the parsed item's");
    let all = store.get(&ContextQuery::new()).expect("get");
    assert_same_items(
        &store.get_raw(&ContextQuery::new()).expect("get_raw"),
        &all,
        "every item",
    );
    assert!(all.len() > 48, "most items are live: {}", all.len());
}
