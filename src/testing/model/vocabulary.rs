//! The vocabulary the model's drivers draw their operations from: few ids, versions, types,
//! sources, scopes, contents, query filters and references, so that re-adds, conflicts, new
//! versions of known ids and every kind of answer happen. `tests/model.rs` generates them with
//! proptest strategies, the `stateful` fuzz target decodes them from fuzz bytes.

use serde_json::{json, Value};

use crate::{ContextItem, ContextQuery, Scope, TimeRange};

/// The clock's start; item timestamps lie around it.
pub const START: i64 = 1_000;
/// Few ids, so that re-adds, conflicts and new versions of known ids happen.
pub const IDS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
/// The versions of every id.
pub const VERSIONS: [&str; 3] = ["1", "2", "3"];
/// The types items are stored under.
pub const KINDS: [&str; 3] = ["message", "tool_result", "document_chunk"];
/// Query types: the kinds used plus a registered type nothing is stored under.
pub const QUERY_KINDS: [&str; 4] = ["message", "tool_result", "document_chunk", "user_profile"];
/// Item sources.
pub const SOURCES: [&str; 2] = ["src1", "src2"];
/// Sessions readers may take; "s3" owns nothing.
pub const VIEWS: [&str; 3] = ["s1", "s2", "s3"];
/// Item confidences.
pub const CONFIDENCES: [f64; 4] = [0.1, 0.5, 0.9, 1.0];
/// Query minimum confidences.
pub const MIN_CONFIDENCES: [f64; 3] = [0.0, 0.5, 0.9];
/// Content paths a query compares (`content_eq`).
pub const PATHS: [&str; 2] = ["k", "n.x"];
/// Pin names.
pub const PIN_NAMES: [&str; 3] = ["p1", "p2", "p3"];

/// Scope `i` of four: session s1's, session s2's, `GlobalReadonly`, `GlobalWritable`.
#[must_use]
pub fn scope_of(i: usize) -> Scope {
    match i {
        0 => Scope::Session("s1".into()),
        1 => Scope::Session("s2".into()),
        2 => Scope::GlobalReadonly,
        _ => Scope::GlobalWritable,
    }
}

/// `len` hex characters determined by `seed`: text that LZ4 cannot shrink, so that a few dozen
/// records fill a 4 KiB segment.
fn noise(seed: &str, len: usize) -> String {
    let mut state = seed.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from_digit(crate::num::bounded(state >> 60, "a 4-bit digit"), 16).unwrap_or('0')
        })
        .collect()
}

/// The content of an item: `None` is the usual content of its (id, version), so that most re-adds
/// are `Unchanged`; `Some(i)` picks from a small pool, so that conflicts happen too.
#[must_use]
pub fn content_of(id: &str, version: &str, pick: Option<usize>) -> Value {
    match pick {
        None => {
            let k = if version == "2" { 2 } else { 1 };
            let x = if id < "d" { "y" } else { "z" };
            json!({"id": id, "v": version, "k": k, "n": {"x": x}, "pad": noise(&format!("{id}@{version}"), 240)})
        }
        Some(0) => json!({"k": 1}),
        Some(1) => json!({"k": 2, "n": {"x": "y"}}),
        Some(2) => json!({"t": "é", "n": {"x": "z"}, "k": 1}),
        Some(3) => json!("plain"),
        // Long and repetitive: stored LZ4-compressed when the store compresses content.
        Some(4) => json!([1, 2, 3, "context window ".repeat(40)]),
        // Half a segment.
        Some(_) => json!({"big": noise("big", 2000), "k": 2}),
    }
}

/// The value `i` of four a query's `content_eq` compares with.
#[must_use]
pub fn eq_value_of(i: usize) -> Value {
    match i % 4 {
        0 => json!(1),
        1 => json!(2),
        2 => json!("y"),
        _ => json!("z"),
    }
}

/// One item to add, drawn from the vocabulary above.
#[derive(Clone, Debug)]
pub struct ItemSpec {
    /// One of [`IDS`].
    pub id: &'static str,
    /// One of [`VERSIONS`].
    pub version: &'static str,
    /// The content (see [`content_of`]).
    pub content: Option<usize>,
    /// One of [`KINDS`].
    pub kind: &'static str,
    /// One of [`SOURCES`].
    pub source: &'static str,
    /// UTC seconds.
    pub timestamp: i64,
    /// The scope (see [`scope_of`]).
    pub scope: usize,
    /// Seconds to live, if any.
    pub ttl: Option<u64>,
    /// One of [`CONFIDENCES`], if any.
    pub confidence: Option<f64>,
}

impl ItemSpec {
    /// The item.
    #[must_use]
    pub fn item(&self) -> ContextItem {
        let mut item = ContextItem::new(
            self.id,
            self.kind,
            content_of(self.id, self.version, self.content),
            self.source,
            self.timestamp,
            self.version,
            scope_of(self.scope),
        );
        if let Some(ttl) = self.ttl {
            item = item.with_ttl(ttl);
        }
        if let Some(c) = self.confidence {
            item = item.with_confidence(c);
        }
        item
    }
}

/// A query: each filter is applied when set.
#[derive(Clone, Debug)]
pub struct QuerySpec {
    /// Types, at least one: what `.types([])` means is not settled by the API docs (the store
    /// reads it as "every type", while `.scopes([])` and `.sources([])` match nothing).
    pub types: Option<Vec<&'static str>>,
    /// An inclusive time range, start <= end.
    pub range: Option<(i64, i64)>,
    /// Scopes (see [`scope_of`]).
    pub scopes: Option<Vec<usize>>,
    /// The minimum confidence (items without one pass).
    pub min_confidence: Option<f64>,
    /// Sources.
    pub sources: Option<Vec<&'static str>>,
    /// A content path of [`PATHS`] and the value (see [`eq_value_of`]) it must hold.
    pub content_eq: Option<(&'static str, usize)>,
    /// Newest first instead of oldest first.
    pub newest_first: bool,
    /// At most this many items.
    pub limit: Option<usize>,
}

impl QuerySpec {
    /// No filter at all.
    #[must_use]
    pub fn everything() -> QuerySpec {
        QuerySpec {
            types: None,
            range: None,
            scopes: None,
            min_confidence: None,
            sources: None,
            content_eq: None,
            newest_first: false,
            limit: None,
        }
    }

    /// The store's query.
    #[must_use]
    pub fn query(&self) -> ContextQuery {
        let mut q = ContextQuery::new();
        if let Some(types) = &self.types {
            q = q.types(types.iter().copied());
        }
        if let Some((start, end)) = self.range {
            if let Ok(range) = TimeRange::new(start, end) {
                q = q.time_range(range);
            }
        }
        if let Some(scopes) = &self.scopes {
            q = q.scopes(scopes.iter().map(|s| scope_of(*s)));
        }
        if let Some(min) = self.min_confidence {
            q = q.min_confidence(min);
        }
        if let Some(sources) = &self.sources {
            q = q.sources(sources.iter().copied());
        }
        if let Some((path, value)) = self.content_eq {
            q = q.content_eq(path, eq_value_of(value));
        }
        if self.newest_first {
            q = q.newest_first();
        }
        if let Some(n) = self.limit {
            q = q.limit(n);
        }
        q
    }

    /// Whether `item` passes the filters.
    pub(super) fn matches(&self, item: &ContextItem) -> bool {
        self.types.as_ref().is_none_or(|t| t.contains(&item.kind.as_str()))
            && self
                .range
                .is_none_or(|(start, end)| start <= item.timestamp && item.timestamp <= end)
            && self
                .scopes
                .as_ref()
                .is_none_or(|s| s.iter().any(|s| scope_of(*s) == item.scope))
            && self
                .min_confidence
                .is_none_or(|min| item.confidence.is_none_or(|c| c >= min))
            && self.sources.as_ref().is_none_or(|s| s.contains(&item.source.as_str()))
            && self
                .content_eq
                .is_none_or(|(path, value)| lookup(&item.content, path) == Some(&eq_value_of(value)))
    }
}

/// Top-level key, else a dotted path through nested objects.
fn lookup<'v>(content: &'v Value, path: &str) -> Option<&'v Value> {
    content
        .get(path)
        .or_else(|| path.split('.').try_fold(content, |v, key| v.get(key)))
}

/// A reference: an id, and a version if it is `id@version`.
pub type Ref = (&'static str, Option<&'static str>);

/// The reference as `resolve` takes it.
#[must_use]
pub fn ref_text((id, version): &Ref) -> String {
    match version {
        Some(v) => format!("{id}@{v}"),
        None => (*id).to_owned(),
    }
}

/// Every reference there is: each id, and each `id@version`.
#[must_use]
pub fn all_refs() -> Vec<Ref> {
    IDS.iter()
        .flat_map(|id| std::iter::once((*id, None)).chain(VERSIONS.iter().map(move |v| (*id, Some(*v)))))
        .collect()
}
