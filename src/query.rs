//! Queries: the [`ContextQuery`] builder, the planner that picks the most selective index, and the
//! walk that checks visibility and filters in `(timestamp, id)` order.

use std::cmp::Ordering;
use std::iter::Peekable;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::index::{Index, KeySet, Keys, NameBuf, VersionEntry};
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

/// The reader's restrictions: which sequence number, what time, which session.
pub(crate) struct ViewBounds<'a> {
    pub(crate) seq: u64,
    pub(crate) now: i64,
    pub(crate) session: Option<&'a str>,
}

/// Whether a reader restricted to `session` may see `scope`.
pub(crate) fn scope_visible(scope: &Scope, session: Option<&str>) -> bool {
    match (scope, session) {
        (Scope::Session(owner), Some(reader)) => owner == reader,
        _ => true,
    }
}

/// Whether a session view of `session` may write `scope`: its own session's, or `GlobalWritable`.
pub(crate) fn scope_writable(scope: &Scope, session: &str) -> bool {
    match scope {
        Scope::Session(owner) => owner == session,
        Scope::GlobalWritable => true,
        Scope::GlobalReadonly => false,
    }
}

fn lookup<'v>(content: &'v Value, path: &str) -> Option<&'v Value> {
    if let Some(value) = content.get(path) {
        return Some(value);
    }
    path.split('.').try_fold(content, |value, key| value.get(key))
}

fn check_query(index: &Index, query: &ContextQuery) -> Result<()> {
    let known = index.registry.known();
    for kind in query.types.iter().flatten() {
        if !known.iter().any(|k| k == kind) {
            return Err(Error::UnknownType {
                kind: kind.clone(),
                known,
                index: None,
            });
        }
    }
    if let Some(min) = query.min_confidence {
        if min.is_nan() {
            return Err(Error::invalid("min_confidence", "must be a number, not NaN"));
        }
    }
    for (path, _) in &query.content_eq {
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(Error::invalid("content_eq", format!("path {path:?} has an empty key")));
        }
    }
    Ok(())
}

/// Walks several ordered sets as one, in timestamp order (or its reverse).
struct Merge<'a> {
    inputs: Vec<Peekable<Keys<'a>>>,
    reverse: bool,
}

impl Iterator for Merge<'_> {
    type Item = (i64, u32);

    fn next(&mut self) -> Option<(i64, u32)> {
        let mut best: Option<(usize, i64)> = None;
        for (position, input) in self.inputs.iter_mut().enumerate() {
            if let Some((timestamp, _)) = input.peek() {
                let better = match best {
                    None => true,
                    Some((_, best_timestamp)) => {
                        if self.reverse {
                            *timestamp > best_timestamp
                        } else {
                            *timestamp < best_timestamp
                        }
                    }
                };
                if better {
                    best = Some((position, *timestamp));
                }
            }
        }
        let (position, _) = best?;
        self.inputs.get_mut(position)?.next()
    }
}

fn range_of<'a>(index: &'a Index, set: &'a KeySet, range: Option<TimeRange>, reverse: bool) -> Keys<'a> {
    let (start, end) = range.map_or((i64::MIN, i64::MAX), |r| (r.start(), r.end()));
    set.range(&index.slots, start, end, reverse)
}

/// Whether an item with `confidence` passes the query's `min_confidence` (items without one pass).
pub(crate) fn confidence_passes(query: &ContextQuery, confidence: Option<f64>) -> bool {
    match (query.min_confidence, confidence) {
        (Some(min), Some(confidence)) => confidence.partial_cmp(&min) != Some(Ordering::Less),
        _ => true,
    }
}

/// Whether the query has filters on content (`content_eq`).
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

/// Runs `query` against `index` as a view with `bounds` sees it. `fetch` reads a version's item and
/// applies the filters on what only the record holds (`min_confidence`, `content_eq`: see
/// [`confidence_passes`], [`content_passes`]); `None` leaves the item out.
pub(crate) fn run<T>(
    index: &Index,
    query: &ContextQuery,
    bounds: &ViewBounds<'_>,
    fetch: &dyn Fn(&VersionEntry) -> Result<Option<T>>,
) -> Result<(Vec<T>, QueryStats)> {
    check_query(index, query)?;
    let empty = |index_used| {
        Ok((
            Vec::new(),
            QueryStats {
                index: index_used,
                examined: 0,
                returned: 0,
            },
        ))
    };

    // Interned filters. A value never interned matches nothing.
    let kinds: Option<Vec<u16>> = query.types.as_ref().map(|types| {
        types
            .iter()
            .filter_map(|kind| index.kinds.get(kind.as_str()))
            .filter_map(|id| u16::try_from(id).ok())
            .collect()
    });
    let allowed_scopes: Option<Vec<u32>> = match (&query.scopes, bounds.session) {
        (None, None) => None,
        (asked, session) => {
            let candidates: Vec<Scope> = match asked {
                Some(scopes) => scopes.clone(),
                None => session
                    .map(|id| {
                        vec![
                            Scope::Session(id.to_owned()),
                            Scope::GlobalReadonly,
                            Scope::GlobalWritable,
                        ]
                    })
                    .unwrap_or_default(),
            };
            let mut ids: Vec<u32> = candidates
                .iter()
                .filter(|scope| scope_visible(scope, session))
                .filter_map(|scope| index.scopes.get(scope))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            Some(ids)
        }
    };
    let sources: Option<Vec<u32>> = query.sources.as_ref().map(|sources| {
        sources
            .iter()
            .filter_map(|source| index.sources.get(source.as_str()))
            .collect()
    });
    if query.limit == Some(0) {
        return empty(IndexUsed::Time);
    }

    // Plan: the candidate set with the fewest entries. With a time range every option shrinks by
    // about the same share, so total sizes rank them.
    let set_len = |sets: &[&KeySet]| sets.iter().map(|set| set.len()).sum::<usize>();
    let mut plans: Vec<(IndexUsed, Vec<&KeySet>)> = Vec::new();
    if let Some(kinds) = &kinds {
        plans.push((
            IndexUsed::Type,
            kinds
                .iter()
                .filter_map(|k| index.by_type.get(usize::from(*k)))
                .collect(),
        ));
    }
    if let Some(scopes) = &allowed_scopes {
        let sets = scopes
            .iter()
            .filter_map(|s| index.by_scope.get(usize::try_from(*s).ok()?))
            .collect();
        plans.push((IndexUsed::Scope, sets));
    }
    plans.push((IndexUsed::Time, vec![&index.by_time]));
    let Some((index_used, sets)) = plans.into_iter().min_by_key(|(_, sets)| set_len(sets)) else {
        return empty(IndexUsed::Time);
    };

    let reverse = query.newest_first;
    let merged = Merge {
        inputs: sets
            .iter()
            .map(|set| range_of(index, set, query.time_range, reverse).peekable())
            .collect(),
        reverse,
    };

    let limit = query.limit.unwrap_or(usize::MAX);
    // A session view counts only the entries of the scopes it may see: its stats must not tell it
    // how many items other sessions hold in the sets it walks.
    let counted_scopes: Option<Vec<u32>> = bounds.session.map(|session| {
        [
            Scope::Session(session.to_owned()),
            Scope::GlobalReadonly,
            Scope::GlobalWritable,
        ]
        .iter()
        .filter_map(|scope| index.scopes.get(scope))
        .collect()
    });
    let mut out = Vec::new();
    let mut examined = 0u64;
    let mut group: Vec<VersionEntry> = Vec::new();
    let mut group_timestamp = None;
    let mut merged = merged.peekable();
    loop {
        let next = merged.next();
        if let Some((timestamp, slot)) = next {
            let version = index.slot(slot);
            if counted_scopes
                .as_ref()
                .is_none_or(|counted| version.is_some_and(|version| counted.contains(&version.scope)))
            {
                examined += 1;
            }
            if group_timestamp.is_some_and(|t| t != timestamp) {
                emit(index, query, &mut group, fetch, &mut out, limit)?;
                if out.len() >= limit {
                    break;
                }
            }
            group_timestamp = Some(timestamp);
            let Some(version) = version else {
                continue;
            };
            // Compaction unlinks reclaimed versions from the sets a little after reclaiming them.
            let passes = version.is_stored()
                && index.visible_at(&version, bounds.seq)
                && !index.expired_at(&version, bounds.now)
                && kinds.as_ref().is_none_or(|kinds| kinds.contains(&version.kind()))
                && allowed_scopes
                    .as_ref()
                    .is_none_or(|scopes| scopes.contains(&version.scope))
                && sources
                    .as_ref()
                    .is_none_or(|sources| sources.contains(&index.source_of(&version)));
            if passes {
                group.push(version);
            }
        } else {
            emit(index, query, &mut group, fetch, &mut out, limit)?;
            break;
        }
    }
    let returned = out.len() as u64;
    Ok((
        out,
        QueryStats {
            index: index_used,
            examined,
            returned,
        },
    ))
}

/// Orders one timestamp's candidates by id, reads them (`fetch` applies the content filters), and
/// appends them to `out` up to `limit`.
fn emit<T>(
    index: &Index,
    query: &ContextQuery,
    group: &mut Vec<VersionEntry>,
    fetch: &dyn Fn(&VersionEntry) -> Result<Option<T>>,
    out: &mut Vec<T>,
    limit: usize,
) -> Result<()> {
    if group.len() > 1 {
        // The names rebuilt once, back to back in one string, rather than at each comparison.
        let mut names = String::new();
        let mut buf = NameBuf::new();
        let mut keyed: Vec<(std::ops::Range<usize>, VersionEntry)> = group
            .drain(..)
            .map(|version| {
                let start = names.len();
                names.push_str(index.id_name_into(version.id, &mut buf));
                (start..names.len(), version)
            })
            .collect();
        keyed.sort_unstable_by(|(a, _), (b, _)| {
            let order = names.get(a.clone()).cmp(&names.get(b.clone()));
            if query.newest_first {
                order.reverse()
            } else {
                order
            }
        });
        group.extend(keyed.into_iter().map(|(_, version)| version));
    }
    for version in group.drain(..) {
        if out.len() >= limit {
            break;
        }
        if let Some(item) = fetch(&version)? {
            out.push(item);
        }
    }
    Ok(())
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

    #[test]
    fn merge_orders_by_timestamp_both_ways() {
        let a = [(1, 0), (5, 1), (9, 2)];
        let b = [(2, 3), (5, 4), (10, 5)];
        let keys = |set: [(i64, u32); 3], reverse: bool| -> Peekable<Keys<'static>> {
            let keys: Keys<'static> = if reverse {
                Box::new(set.into_iter().rev())
            } else {
                Box::new(set.into_iter())
            };
            keys.peekable()
        };
        let forward: Vec<i64> = Merge {
            inputs: vec![keys(a, false), keys(b, false)],
            reverse: false,
        }
        .map(|(t, _)| t)
        .collect();
        assert_eq!(forward, vec![1, 2, 5, 5, 9, 10]);
        let backward: Vec<i64> = Merge {
            inputs: vec![keys(a, true), keys(b, true)],
            reverse: true,
        }
        .map(|(t, _)| t)
        .collect();
        assert_eq!(backward, vec![10, 9, 5, 5, 2, 1]);
    }

    #[test]
    fn sessions_see_only_their_own_session_scope() {
        assert!(scope_visible(&Scope::Session("a".into()), Some("a")));
        assert!(!scope_visible(&Scope::Session("b".into()), Some("a")));
        assert!(scope_visible(&Scope::GlobalReadonly, Some("a")));
        assert!(scope_visible(&Scope::Session("b".into()), None));
    }
}
