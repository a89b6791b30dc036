//! The planner walks the most selective index: over ~20,000 items of 7 types spread over a long time
//! span, a one-type narrow-window query uses `IndexUsed::Type` and examines about as many entries as
//! it returns (not the store size); a session view without types uses `IndexUsed::Scope` when that is
//! smaller; a time-range-only query uses `IndexUsed::Time` and examines about the window; answers are
//! exactly the matching items; `stats().entries_examined` and `queries` accumulate.

mod common;

use common::*;
use ctxlog::*;
use serde_json::json;

const T0: i64 = 1_600_000_000;
const STEP: i64 = 60;
const TOTAL: usize = 20_000;

/// Item `n`: type `n % 7`, timestamp `T0 + n * STEP` (about two weeks in all), scope mostly spread over
/// eight sessions with a few global items.
fn nth(n: usize) -> ContextItem {
    let scope = match n % 50 {
        0 => Scope::GlobalReadonly,
        1 => Scope::GlobalWritable,
        _ => Scope::Session(format!("s{}", n % 8)),
    };
    ContextItem::new(
        format!("q{n:05}"),
        BUILTIN_TYPES[n % 7],
        json!({"n": n}),
        "plan",
        T0 + n as i64 * STEP,
        "1",
        scope,
    )
}

fn build() -> (tempfile::TempDir, Store, Vec<ContextItem>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new()
        .durability(Durability::Never)
        .open(dir.path())
        .expect("open");
    let items: Vec<ContextItem> = (0..TOTAL).map(nth).collect();
    for chunk in items.chunks(1000) {
        store.add(chunk.to_vec()).expect("add");
    }
    assert_eq!(store.stats().items, TOTAL as u64);
    (dir, store, items)
}

fn expected(items: &[ContextItem], pred: impl Fn(&ContextItem) -> bool) -> Vec<ContextItem> {
    items.iter().filter(|it| pred(it)).map(stored_form).collect()
}

#[test]
fn one_type_in_a_narrow_window_walks_the_type_index() {
    let (_dir, store, items) = build();
    // A two-hour window in the middle: 120 items of all types, about 17 of this one.
    let start = T0 + 10_000 * STEP;
    let end = start + 2 * 3600;
    let query = ContextQuery::new()
        .types(["tool_result"])
        .time_range(TimeRange::new(start, end).expect("range"));
    let (got, stats) = store.get_with_stats(&query).expect("get");
    let want = expected(&items, |it| {
        it.kind == "tool_result" && (start..=end).contains(&it.timestamp)
    });
    assert_eq!(got, want);
    let r = got.len() as u64;
    assert!(r >= 10, "the window should hold a few items, got {r}");
    assert_eq!(stats.index, IndexUsed::Type);
    assert_eq!(stats.returned, r);
    assert!(stats.examined >= r);
    assert!(
        stats.examined <= 2 * r + 10,
        "examined {} to return {r}",
        stats.examined
    );
    assert!(
        stats.examined * 100 < TOTAL as u64,
        "examined {} of {TOTAL}",
        stats.examined
    );

    // Two types: still the type index, still about what it returns.
    let two = query.clone().types(["tool_result", "message"]).newest_first();
    let (got, stats) = store.get_with_stats(&two).expect("get");
    let mut want = expected(&items, |it| {
        (it.kind == "tool_result" || it.kind == "message") && (start..=end).contains(&it.timestamp)
    });
    want.reverse();
    assert_eq!(got, want);
    assert_eq!(stats.index, IndexUsed::Type);
    assert!(stats.examined <= 2 * stats.returned + 10, "{stats:?}");

    // A limit stops the walk early.
    let (got, stats) = store.get_with_stats(&query.clone().limit(3)).expect("get");
    assert_eq!(got.len(), 3);
    assert!(stats.examined <= 3 + 10, "{stats:?}");
}

#[test]
fn a_session_view_without_types_walks_the_scope_index() {
    let (_dir, store, items) = build();
    let s1 = store.session("s1");
    let visible = |it: &ContextItem| match &it.scope {
        Scope::Session(owner) => owner == "s1",
        _ => true,
    };
    let (got, stats) = s1.get_with_stats(&ContextQuery::new()).expect("get");
    let want = expected(&items, visible);
    assert_eq!(got, want);
    let r = want.len() as u64;
    assert!(r * 4 < TOTAL as u64, "s1 should see a small share, sees {r}");
    assert_eq!(stats.index, IndexUsed::Scope);
    assert_eq!(stats.returned, r);
    assert!(stats.examined <= 2 * r + 10, "{stats:?}");

    // With a time window the scope index still beats the time index and examines about the window's share.
    let start = T0 + 5_000 * STEP;
    let end = start + 12 * 3600;
    let windowed = ContextQuery::new().time_range(TimeRange::new(start, end).expect("range"));
    let (got, stats) = s1.get_with_stats(&windowed).expect("get");
    let want = expected(&items, |it| visible(it) && (start..=end).contains(&it.timestamp));
    assert_eq!(got, want);
    assert!(!want.is_empty());
    assert_eq!(stats.index, IndexUsed::Scope);
    assert!(stats.examined <= 2 * stats.returned + 10, "{stats:?}");

    // The store handle, with no restriction, has no smaller set than everything: time index.
    let (_, stats) = store.get_with_stats(&windowed).expect("get");
    assert_eq!(stats.index, IndexUsed::Time);
}

#[test]
fn a_time_range_only_query_walks_the_time_index() {
    let (_dir, store, items) = build();
    let start = T0 + 15_000 * STEP + 30; // between two items
    let end = start + 3 * 3600;
    let query = ContextQuery::new().time_range(TimeRange::new(start, end).expect("range"));
    let (got, stats) = store.get_with_stats(&query).expect("get");
    let want = expected(&items, |it| (start..=end).contains(&it.timestamp));
    assert_eq!(got, want);
    let window = want.len() as u64;
    assert_eq!(window, 180);
    assert_eq!(stats.index, IndexUsed::Time);
    assert_eq!(stats.returned, window);
    assert!(stats.examined >= window && stats.examined <= window + 10, "{stats:?}");

    // The reverse order walks the same window.
    let (got, stats) = store.get_with_stats(&query.clone().newest_first()).expect("get");
    assert_eq!(got.len() as u64, window);
    assert_eq!(stats.index, IndexUsed::Time);
    assert!(stats.examined <= window + 10, "{stats:?}");

    // An empty window examines (almost) nothing.
    let gap = ContextQuery::new().time_range(TimeRange::new(T0 + 1, T0 + STEP - 1).expect("range"));
    let (got, stats) = store.get_with_stats(&gap).expect("get");
    assert!(got.is_empty());
    assert!(stats.examined <= 10, "{stats:?}");
}

#[test]
fn entries_examined_accumulates_over_queries() {
    let (_dir, store, _items) = build();
    let before = store.stats();
    let queries = [
        ContextQuery::new()
            .types(["message"])
            .time_range(TimeRange::new(T0, T0 + 3600).expect("range")),
        ContextQuery::new().time_range(TimeRange::new(T0 + 100_000, T0 + 110_000).expect("range")),
        ContextQuery::new().types(["user_profile"]).limit(5),
    ];
    let mut examined = 0;
    for query in &queries {
        let (_, stats) = store.get_with_stats(query).expect("get");
        assert!(stats.examined > 0);
        examined += stats.examined;
    }
    let session_stats = store.session("s3").get_with_stats(&queries[1]).expect("get").1;
    examined += session_stats.examined;
    // get (without stats) counts too.
    let plain = store.get(&queries[0]).expect("get");
    examined += store.get_with_stats(&queries[0]).expect("get").1.examined;
    assert!(!plain.is_empty());
    let after = store.stats();
    assert_eq!(after.queries, before.queries + 6);
    let plain_examined = after.entries_examined - before.entries_examined - examined;
    assert_eq!(
        plain_examined,
        store.get_with_stats(&queries[0]).expect("get").1.examined,
        "the plain get must add what the same query examines"
    );
    assert!(after.entries_examined - before.entries_examined < TOTAL as u64 / 10);
}
