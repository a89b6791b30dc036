//! Queries: the public [`ContextQuery`] builder, [`IndexUsed`] and [`QueryStats`], and the filters
//! on what only a record holds (confidence, content). Planning a query is `read::plan`; running
//! the plan is `read::walk`.

use std::cmp::Ordering;

use serde_json::Value;

use crate::item::Scope;
use crate::time::TimeRange;

/// What to read: every filter is optional and they all must hold. Built with chained setters.
///
/// ```
/// use ctxlog::{ContextQuery, Scope, TimeRange};
/// let q = ContextQuery::new()
///     .types(["document_chunk"])
///     .time_range(TimeRange::parse("2024-05-10T00:00:00Z", "2024-05-12T23:59:59Z").unwrap())
///     .scopes([Scope::GlobalReadonly])
///     .newest_first()
///     .limit(10);
/// # let _ = q;
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContextQuery {
    pub(crate) types: Option<Vec<String>>,
    pub(crate) time_range: Option<TimeRange>,
    pub(crate) scopes: Option<Vec<Scope>>,
    pub(crate) min_confidence: Option<f64>,
    pub(crate) sources: Option<Vec<String>>,
    pub(crate) content_eq: Vec<(String, Value)>,
    pub(crate) newest_first: bool,
    pub(crate) limit: Option<usize>,
}

impl ContextQuery {
    /// A query for everything visible, oldest first, without a limit.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Only items of these types (an empty list matches nothing, as for scopes and sources).
    /// Default: every type. Naming an unregistered type is an
    /// `Error::UnknownType` when the query runs.
    #[must_use]
    pub fn types<I, S>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.types = Some(types.into_iter().map(Into::into).collect());
        self
    }

    /// Only items whose timestamp lies in `range` (inclusive at both ends). Default: any time.
    #[must_use]
    pub fn time_range(mut self, range: TimeRange) -> Self {
        self.time_range = Some(range);
        self
    }

    /// Only items in these scopes. Default: every scope the reader may see. A session view never
    /// sees another session's scope, whatever is asked here.
    #[must_use]
    pub fn scopes<I: IntoIterator<Item = Scope>>(mut self, scopes: I) -> Self {
        self.scopes = Some(scopes.into_iter().collect());
        self
    }

    /// Excludes items whose confidence is below `min`; items without a confidence pass.
    /// Default: no bound. A NaN bound is an `Error::Invalid` when the query runs.
    #[must_use]
    pub fn min_confidence(mut self, min: f64) -> Self {
        self.min_confidence = Some(min);
        self
    }

    /// Only items from these sources. Default: every source.
    #[must_use]
    pub fn sources<I, S>(mut self, sources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sources = Some(sources.into_iter().map(Into::into).collect());
        self
    }

    /// Only items whose content has `value` at `path`: a top-level key, or a dotted path (`"a.b"`)
    /// through nested objects. May be called several times; all must hold.
    #[must_use]
    pub fn content_eq(mut self, path: impl Into<String>, value: Value) -> Self {
        self.content_eq.push((path.into(), value));
        self
    }

    /// Newest first: the exact reverse of the default order, oldest first by `(timestamp, id)`.
    #[must_use]
    pub fn newest_first(mut self) -> Self {
        self.newest_first = true;
        self
    }

    /// At most `n` items. Default: no limit.
    #[must_use]
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }
}

/// Which index a query walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexUsed {
    /// The (type, timestamp) sets of the asked types.
    Type,
    /// The (scope, timestamp) sets of the visible scopes.
    Scope,
    /// The (timestamp) set of everything.
    Time,
}

/// How a query ran: which index it walked and how many index entries it examined to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryStats {
    /// The index the planner chose.
    pub index: IndexUsed,
    /// Index entries looked at (each a stored version, visible or not). A session view counts only
    /// the entries of its own session's scope and the global ones: another session's items are not
    /// counted, though the walk passes them. (Which index the planner chooses still depends on the
    /// sizes of whole sets, every session's entries in them.)
    pub examined: u64,
    /// Items returned.
    pub returned: u64,
}

fn lookup<'v>(content: &'v Value, path: &str) -> Option<&'v Value> {
    if let Some(value) = content.get(path) {
        return Some(value);
    }
    path.split('.').try_fold(content, |value, key| value.get(key))
}

/// Whether an item with `confidence` passes the query's `min_confidence` (items without one pass).
#[inline]
pub(crate) fn confidence_passes(query: &ContextQuery, confidence: Option<f64>) -> bool {
    match (query.min_confidence, confidence) {
        (Some(min), Some(confidence)) => confidence.partial_cmp(&min) != Some(Ordering::Less),
        _ => true,
    }
}

/// Whether the query has filters on content (`content_eq`).
#[inline]
pub(crate) fn filters_content(query: &ContextQuery) -> bool {
    !query.content_eq.is_empty()
}

/// Whether `content` passes every `content_eq` filter of the query.
pub(crate) fn content_passes(query: &ContextQuery, content: &Value) -> bool {
    query
        .content_eq
        .iter()
        .all(|(path, value)| lookup(content, path) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dotted_paths_and_top_level_dots() {
        let content = json!({"a": {"b": 1}, "x.y": 2});
        assert_eq!(lookup(&content, "a.b"), Some(&json!(1)));
        assert_eq!(lookup(&content, "x.y"), Some(&json!(2)));
        assert_eq!(lookup(&content, "a.c"), None);
        assert_eq!(lookup(&json!(3), "a"), None);
    }
}
