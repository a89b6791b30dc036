//! Reads split over threads (`Options::read_threads`): a query or a resolve with many items finds and
//! checks their records, and reads them, on several threads. Whatever the number of threads, every
//! answer is the same, item for item and in the same order: over queries of every filter, session
//! views, pinned snapshots, resolves of every kind of reference, content stored compressed and as it
//! is; and damage is reported at the same item, never returned.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{clock_at, NOW};
use ctxlog::limits::PARALLEL_READ_ITEMS_MIN;
use ctxlog::*;
use serde_json::json;

const TYPES: [&str; 3] = ["document_chunk", "message", "tool_result"];

fn open(dir: &Path, clock: &Arc<ManualClock>, read_threads: usize, compress: bool) -> Store {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .auto_compact(false)
        .compress_content(compress)
        .read_threads(read_threads)
        .open(dir)
        .expect("open store")
}

/// Item `n` of the test store: three types, three sessions and both global scopes, a confidence on
/// some, a TTL on others, content long enough to be compressed on every third item.
fn item(n: usize, version: &str) -> ContextItem {
    let scope = match n % 5 {
        0 => Scope::GlobalReadonly,
        1 => Scope::GlobalWritable,
        k => Scope::Session(format!("s{k}")),
    };
    let text = if n.is_multiple_of(3) {
        format!("item {n} version {version} ").repeat(20)
    } else {
        format!("item {n} version {version}")
    };
    let mut item = ContextItem::new(
        format!("item-{n:05}"),
        TYPES[n % 3],
        json!({"n": n, "group": n % 4, "text": text}),
        format!("source-{}", n % 6),
        NOW + (n as i64 / 3),
        version,
        scope,
    );
    if n.is_multiple_of(7) {
        item.confidence = Some((n % 10) as f64 / 10.0);
    }
    if n.is_multiple_of(11) {
        item.ttl_seconds = Some(60);
    }
    item
}

const ITEMS: usize = 3_000;

/// Writes the test store: 3,000 items, a second version of every tenth, every 50th deleted, a
/// snapshot pinned before the changes; half the batches with compression on. The clock then moves
/// past the TTL of the items that have one.
fn write_store(dir: &Path, clock: &Arc<ManualClock>) {
    for (part, compress) in [(0..ITEMS / 2, true), (ITEMS / 2..ITEMS, false)] {
        let store = open(dir, clock, 1, compress);
        let batch: Vec<ContextItem> = part.map(|n| item(n, "1")).collect();
        store.add(batch).expect("add");
    }
    let store = open(dir, clock, 1, false);
    store.snapshot().pin("before").expect("pin");
    store
        .add((0..ITEMS).step_by(10).map(|n| item(n, "2")))
        .expect("add second versions");
    for n in (0..ITEMS).step_by(50) {
        store.delete(&format!("item-{n:05}")).expect("delete");
    }
    clock.set(NOW + 600);
}

/// Each answer as its `Debug` text, in order.
fn lines<T: std::fmt::Debug>(answers: &[T]) -> Vec<String> {
    answers.iter().map(|answer| format!("{answer:?}")).collect()
}

/// Each raw item as its JSON, in order.
fn json_lines(items: Vec<RawItem>) -> Vec<String> {
    items.into_iter().map(RawItem::into_string).collect()
}

/// Every answer the reads below give, as text, in order.
fn answers(store: &Store) -> Vec<String> {
    let mut out = Vec::new();
    let queries = [
        ContextQuery::new(),
        ContextQuery::new().types(["message"]),
        ContextQuery::new()
            .types(["document_chunk", "tool_result"])
            .time_range(TimeRange::new(NOW + 100, NOW + 900).expect("range")),
        ContextQuery::new().scopes([Scope::GlobalReadonly, Scope::Session("s2".into())]),
        ContextQuery::new().min_confidence(0.5),
        ContextQuery::new().limit(700),
        ContextQuery::new().min_confidence(0.3).limit(50),
        ContextQuery::new().content_eq("group", json!(1)),
        ContextQuery::new().content_eq("group", json!(2)).limit(300),
        ContextQuery::new().sources(["source-1", "source-4"]),
        ContextQuery::new().newest_first(),
        ContextQuery::new().types(["tool_result"]).newest_first().limit(400),
        ContextQuery::new().min_confidence(0.2).newest_first(),
    ];
    let mut record = |label: String, answers: Vec<String>| {
        out.push(format!("{label}: {} items", answers.len()));
        out.extend(answers);
    };
    let snapshot = store.open_snapshot("before").expect("pinned snapshot");
    let session = store.session("s3");
    for (k, query) in queries.iter().enumerate() {
        let (items, stats) = store.get_with_stats(query).expect("get");
        record(format!("get {k} {stats:?}"), lines(&items));
        record(
            format!("get_raw {k}"),
            json_lines(store.get_raw(query).expect("get_raw")),
        );
        record(
            format!("session get {k}"),
            lines(&session.get(query).expect("session get")),
        );
        record(
            format!("snapshot get_raw {k}"),
            json_lines(snapshot.get_raw(query).expect("snapshot get_raw")),
        );
    }
    // Every id, an earlier version of some, versions and ids that do not exist.
    let mut refs: Vec<String> = (0..ITEMS).map(|n| format!("item-{n:05}")).collect();
    refs.extend((0..ITEMS).step_by(7).map(|n| format!("item-{n:05}@1")));
    refs.extend((0..ITEMS).step_by(13).map(|n| format!("item-{n:05}@9")));
    refs.extend((0..40).map(|n| format!("missing-{n}")));
    record("resolve".into(), lines(&store.resolve(&refs).expect("resolve")));
    record(
        "resolve_raw".into(),
        lines(&store.resolve_raw(&refs).expect("resolve_raw")),
    );
    record(
        "session resolve_raw".into(),
        lines(&session.resolve_raw(&refs).expect("session resolve_raw")),
    );
    record(
        "snapshot resolve".into(),
        lines(&snapshot.resolve(&refs).expect("snapshot resolve")),
    );
    out
}

#[test]
fn large_reads_answer_the_same_on_one_read_thread_and_on_four() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    write_store(dir.path(), &clock);
    let one = answers(&open(dir.path(), &clock, 1, false));
    let four = answers(&open(dir.path(), &clock, 4, false));
    assert_eq!(one.len(), four.len());
    for (a, b) in one.iter().zip(&four) {
        assert_eq!(a, b);
    }
    // The reads are large enough to be split over four threads (at least PARALLEL_READ_ITEMS_MIN
    // items for each), and they returned items of every kind.
    let everything = open(dir.path(), &clock, 1, false)
        .get(&ContextQuery::new())
        .expect("get");
    assert!(
        everything.len() >= 4 * PARALLEL_READ_ITEMS_MIN,
        "{} items",
        everything.len()
    );
    for expected in ["Found", "Expired", "Superseded", "NotFound"] {
        assert!(
            one.iter().any(|line| line.starts_with(expected)),
            "no {expected} answer"
        );
    }
    assert!(one.iter().any(|line| line.contains("\"version\":\"2\"")));
}

/// Damaged records early and late in a large read (a flipped content byte, with the record's CRC
/// left as it was or recomputed, so that it no longer matches the index's): one thread and four
/// report the first damaged item of the read, and a resolve answers `HashMismatch` for exactly the
/// damaged ids.
#[test]
fn damage_in_a_large_read_is_reported_at_the_same_item_on_one_thread_and_on_four() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    {
        let store = open(dir.path(), &clock, 1, false);
        store
            .add((0..2_000).map(|n| {
                let mut item = item(n, "1");
                item.ttl_seconds = None;
                item
            }))
            .expect("add");
    }
    let path = common::segment_files(dir.path()).pop().expect("a segment");
    let pristine = std::fs::read(&path).expect("read segment");
    let refs: Vec<String> = (0..2_000).map(|n| format!("item-{n:05}")).collect();
    // Flips a content byte of `id`'s record; with `fix_crc`, the record's CRC is recomputed.
    let damage = |id: &str, fix_crc: bool| {
        let (record, body, body_len) = common::locate_record(&pristine, id);
        let at = body + body_len - 4;
        let mut forged = pristine[body..body + body_len].to_vec();
        forged[at - body] ^= 0x01;
        common::write_at(&path, at, &[forged[at - body]]);
        if fix_crc {
            common::write_at(&path, record + 5, &crc32fast::hash(&forged).to_le_bytes());
        }
        record
    };
    let cases: [(&[(&str, bool)], &str); 4] = [
        (&[("item-00100", false), ("item-01900", false)], "item-00100"),
        (&[("item-00100", true), ("item-01900", false)], "item-00100"),
        (&[("item-01900", true), ("item-01999", false)], "item-01900"),
        (&[("item-01999", true)], "item-01999"),
    ];
    for (damaged, reported) in cases {
        let records: Vec<(&str, usize)> = damaged.iter().map(|&(id, fix)| (id, damage(id, fix))).collect();
        let context = format!("{damaged:?}");
        let mut errors = Vec::new();
        for threads in [1, 4] {
            let store = open(dir.path(), &clock, threads, false);
            for raw in [false, true] {
                let err = if raw {
                    store.get_raw(&ContextQuery::new()).expect_err("damage is reported")
                } else {
                    store.get(&ContextQuery::new()).expect_err("damage is reported")
                };
                let Error::Corrupt { offset, .. } = &err else {
                    panic!("{context}: {err:?}");
                };
                let expected = records.iter().find(|(id, _)| *id == reported).expect("reported").1;
                assert_eq!(*offset, expected as u64, "{context} threads {threads} raw {raw}: {err}");
                errors.push(err.to_string());
            }
            let answers = store.resolve(&refs).expect("resolve");
            let raw_answers = store.resolve_raw(&refs).expect("resolve_raw");
            for ((reference, answer), raw) in refs.iter().zip(&answers).zip(&raw_answers) {
                let is_damaged = damaged.iter().any(|(id, _)| id == reference);
                assert_eq!(
                    matches!(answer, Resolution::HashMismatch { .. }),
                    is_damaged,
                    "{context} threads {threads}: {reference} {answer:?}"
                );
                assert_eq!(
                    matches!(raw, RawResolution::HashMismatch { .. }),
                    is_damaged,
                    "{context}"
                );
                assert!(is_damaged || matches!(answer, Resolution::Found(_)), "{context}");
            }
        }
        assert_eq!(errors[..2], errors[2..], "{context}: one thread and four differ");
        common::write_at(&path, 0, &pristine);
    }
}

#[test]
fn read_threads_out_of_range_is_invalid() {
    for threads in [0, 65] {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Options::new()
            .read_threads(threads)
            .open(dir.path())
            .expect_err("refused");
        assert!(
            matches!(&err, Error::Invalid { field, reason, .. } if field == "read_threads" && reason.contains(&threads.to_string())),
            "{err:?}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
    }
}

/// Large reads on four threads while compaction rewrites every segment they lie in and a writer
/// adds more: every query returns each live item exactly as stored, raw and parsed alike, and a
/// resolve of a thousand ids finds every one. The records are found under the index lock on the
/// helper threads and read after it, while compaction renames new segments over the old ones.
#[test]
fn large_reads_on_four_threads_stay_exact_while_compaction_rewrites_their_segments() {
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const NEW_BATCHES: usize = 300;

    let dir = tempfile::tempdir().expect("temp dir");
    let clock = clock_at(NOW);
    let store = Options::new()
        .clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .auto_compact(false)
        .segment_size(64 << 10)
        .read_threads(4)
        .open(dir.path())
        .expect("open store");
    let kept = |n: usize| {
        let mut item = item(n, "1");
        item.ttl_seconds = None;
        item
    };
    let new_item = |n: usize, k: usize| kept(20_000 + n * 5 + k);
    for chunk in 0..20 {
        let mut batch = Vec::new();
        for n in chunk * 100..(chunk + 1) * 100 {
            batch.push(kept(n));
            let mut junk = item(10_000 + n, "1");
            junk.ttl_seconds = Some(60);
            batch.push(junk);
        }
        store.add(batch).expect("preload");
    }
    // Every item a read may return, as stored: the preloaded live ones and the ones added below.
    let all: HashMap<String, ContextItem> = (0..2_000)
        .map(kept)
        .chain(
            (0..NEW_BATCHES)
                .flat_map(|n| (0..5).map(move |k| (n, k)))
                .map(|(n, k)| new_item(n, k)),
        )
        .map(|item| (item.id.clone(), common::stored_form(&item)))
        .collect();
    // Past every junk item's expiry (its timestamp plus 60 s).
    clock.set(NOW + 5_000);
    // Batches added below and acknowledged.
    let acked = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let refs: Vec<String> = (0..2_000).step_by(2).map(|n| format!("item-{n:05}")).collect();
    std::thread::scope(|scope| {
        let compactor = scope.spawn(|| {
            let (mut compactions, mut reclaimed) = (0u64, 0u64);
            while compactions == 0 || !done.load(Ordering::SeqCst) {
                reclaimed += store.compact().expect("compact during reads").reclaimed_expired;
                compactions += 1;
            }
            (compactions, reclaimed)
        });
        let reader = scope.spawn(|| {
            let mut rounds = 0u64;
            while rounds < 3 || !done.load(Ordering::SeqCst) {
                // What was acknowledged before the read started must be there.
                let must: Vec<String> = (0..2_000)
                    .map(kept)
                    .chain((0..acked.load(Ordering::SeqCst)).flat_map(|n| (0..5).map(move |k| new_item(n, k))))
                    .map(|item| item.id)
                    .collect();
                let items = store.get(&ContextQuery::new()).expect("get during compaction");
                let raw = store.get_raw(&ContextQuery::new()).expect("get_raw during compaction");
                for item in &items {
                    assert_eq!(
                        Some(item),
                        all.get(&item.id),
                        "round {rounds}: {} is not as stored",
                        item.id
                    );
                }
                let got: HashSet<&str> = items.iter().map(|i| i.id.as_str()).collect();
                assert_eq!(got.len(), items.len(), "round {rounds}: an id twice");
                for id in &must {
                    assert!(got.contains(id.as_str()), "round {rounds}: {id} is missing");
                }
                for raw in &raw {
                    let item = raw.to_item().expect("raw JSON parses");
                    let stored = all.get(&item.id).expect("a stored id");
                    assert_eq!(
                        raw.as_bytes(),
                        serde_json::to_vec(stored).expect("JSON"),
                        "round {rounds}, raw"
                    );
                }
                assert!(raw.len() >= must.len(), "round {rounds}: get_raw lacks items");
                let answers = store.resolve(&refs).expect("resolve during compaction");
                for (reference, answer) in refs.iter().zip(&answers) {
                    let Resolution::Found(item) = answer else {
                        panic!("round {rounds}: {reference} resolves to {answer:?}");
                    };
                    assert_eq!(Some(item), all.get(reference), "round {rounds}");
                }
                rounds += 1;
            }
            rounds
        });
        for n in 0..NEW_BATCHES {
            store
                .add((0..5).map(|k| new_item(n, k)))
                .expect("add during compaction");
            acked.store(n + 1, Ordering::SeqCst);
        }
        done.store(true, Ordering::SeqCst);
        let (compactions, reclaimed) = compactor.join().expect("compactor");
        let rounds = reader.join().expect("reader");
        assert!(
            compactions >= 1 && rounds >= 3,
            "{compactions} compactions, {rounds} rounds"
        );
        assert_eq!(reclaimed, 2_000, "every junk item reclaimed once");
    });
    // Compaction reclaimed every expired item, and what is left is exactly the live set.
    let items = store.get(&ContextQuery::new()).expect("get");
    assert_eq!(items.len(), all.len());
    assert!(items.iter().all(|item| all.get(&item.id) == Some(item)));
    assert!(store.verify().expect("verify").is_ok());
}

/// A query shape drawn by the property test below.
#[derive(Debug, Clone)]
struct Shape {
    types: Option<Vec<usize>>,
    window: Option<(i64, i64)>,
    session: Option<usize>,
    min_confidence: Option<f64>,
    limit: Option<usize>,
    newest_first: bool,
}

fn shape() -> impl proptest::strategy::Strategy<Value = Shape> {
    use proptest::prelude::*;
    (
        proptest::option::of(proptest::collection::vec(0..3usize, 1..3)),
        proptest::option::of((0..400i64, 0..400i64)),
        proptest::option::of(2..5usize),
        proptest::option::of(0.0..1.0f64),
        proptest::option::of(1..900usize),
        any::<bool>(),
    )
        .prop_map(|(types, window, session, min_confidence, limit, newest_first)| Shape {
            types,
            window: window.map(|(a, b)| (a.min(b), a.max(b))),
            session,
            min_confidence,
            limit,
            newest_first,
        })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Over stores of 300 to 1,200 items and any query shape, a store reading on four threads
    /// answers `get`, `get_raw` and `resolve` exactly as one reading on one thread.
    #[test]
    fn any_query_answers_the_same_on_one_read_thread_and_on_four(
        len in 300..1_200usize,
        shapes in proptest::collection::vec(shape(), 1..6),
    ) {
        let clock = clock_at(NOW);
        let dirs = [tempfile::tempdir().expect("temp dir"), tempfile::tempdir().expect("temp dir")];
        let stores: Vec<Store> = dirs
            .iter()
            .zip([1, 4])
            .map(|(dir, threads)| {
                let store = Options::new()
                    .clock(Arc::clone(&clock) as Arc<dyn Clock>)
                    .durability(Durability::Never)
                    .auto_compact(false)
                    .read_threads(threads)
                    .open(dir.path())
                    .expect("open store");
                store.add((0..len).map(|n| item(n, "1"))).expect("add");
                store
            })
            .collect();
        clock.set(NOW + 200);
        for shape in &shapes {
            let mut query = ContextQuery::new();
            if let Some(types) = &shape.types {
                query = query.types(types.iter().map(|&t| TYPES[t]));
            }
            if let Some((start, end)) = shape.window {
                query = query.time_range(TimeRange::new(NOW + start, NOW + end).expect("range"));
            }
            if let Some(min) = shape.min_confidence {
                query = query.min_confidence(min);
            }
            if let Some(limit) = shape.limit {
                query = query.limit(limit);
            }
            if shape.newest_first {
                query = query.newest_first();
            }
            let answers: Vec<(Vec<ContextItem>, Vec<String>)> = stores
                .iter()
                .map(|store| match shape.session {
                    Some(s) => {
                        let view = store.session(&format!("s{s}"));
                        let raw = view.get_raw(&query).expect("get_raw");
                        (view.get(&query).expect("get"), raw.into_iter().map(RawItem::into_string).collect())
                    }
                    None => {
                        let raw = store.get_raw(&query).expect("get_raw");
                        (store.get(&query).expect("get"), raw.into_iter().map(RawItem::into_string).collect())
                    }
                })
                .collect();
            proptest::prop_assert_eq!(&answers[0], &answers[1], "{:?}", shape);
        }
        let refs: Vec<String> = (0..len + 20).map(|n| format!("item-{n:05}")).collect();
        let one = stores[0].resolve_raw(&refs).expect("resolve_raw");
        let four = stores[1].resolve_raw(&refs).expect("resolve_raw");
        proptest::prop_assert_eq!(format!("{one:?}"), format!("{four:?}"));
    }
}
