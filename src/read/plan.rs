//! The planner: from a query, the index and a view, a [`Plan`] — which index to walk (the candidate
//! set with the fewest entries), its sets, the timestamps to walk and in which order, and the
//! filters left to check on each candidate. Planning reads the index but no record; running the
//! plan is `read::query`'s.

use crate::error::{Error, Result};
use crate::index::{Index, KeySet, VersionEntry};
use crate::read::query::{ContextQuery, IndexUsed};
use crate::read::view::View;

/// What a query runs as: the sets to merge in timestamp order, and what each candidate they yield
/// must pass.
pub(crate) struct Plan<'a> {
    /// The index the sets belong to.
    pub(crate) index_used: IndexUsed,
    /// The sets walked, merged as one.
    pub(crate) sets: Vec<&'a KeySet>,
    /// The first timestamp walked (inclusive).
    pub(crate) start: i64,
    /// The last timestamp walked (inclusive).
    pub(crate) end: i64,
    /// Newest first: the walk goes from `end` down to `start`, ids in reverse order.
    pub(crate) reverse: bool,
    /// At most this many items.
    pub(crate) limit: usize,
    /// The checks on each candidate that the index answers.
    pub(crate) filters: Filters,
    /// The scopes whose entries count as examined (`None`: every entry counts).
    pub(crate) counted_scopes: Option<Vec<u32>>,
}

/// A query's filters on what the index keeps of each version, interned: a value never interned
/// matches nothing. `None`: no filter.
pub(crate) struct Filters {
    kinds: Option<Vec<u16>>,
    /// The scopes the query asks for that the view may see (see [`View::scope_ids`]).
    scopes: Option<Vec<u32>>,
    sources: Option<Vec<u32>>,
}

impl Filters {
    /// The query's filters on type, scope and source, interned.
    fn of(index: &Index, query: &ContextQuery, view: &View<'_>) -> Filters {
        let kinds = query.types.as_ref().map(|types| {
            types
                .iter()
                .filter_map(|kind| index.kinds.get(kind.as_str()))
                .filter_map(|id| u16::try_from(id).ok())
                .collect()
        });
        let scopes = view.scope_ids(index, query.scopes.as_deref());
        let sources = query.sources.as_ref().map(|sources| {
            sources
                .iter()
                .filter_map(|source| index.sources.get(source.as_str()))
                .collect()
        });
        Filters { kinds, scopes, sources }
    }

    /// Whether `version`'s type, scope and source pass.
    #[inline]
    pub(crate) fn pass(&self, index: &Index, version: &VersionEntry) -> bool {
        self.kinds.as_ref().is_none_or(|kinds| kinds.contains(&version.kind()))
            && self
                .scopes
                .as_ref()
                .is_none_or(|scopes| scopes.contains(&version.scope))
            && self
                .sources
                .as_ref()
                .is_none_or(|sources| sources.contains(&index.source_of(version)))
    }
}

/// Plans `query` against `index` as `view` sees it.
///
/// # Errors
/// `UnknownType` for an unregistered type; `Invalid` for a NaN `min_confidence` or a `content_eq`
/// path with an empty key.
pub(crate) fn plan<'a>(index: &'a Index, query: &ContextQuery, view: &View<'_>) -> Result<Plan<'a>> {
    check_query(index, query)?;
    let filters = Filters::of(index, query, view);
    let (start, end) = query
        .time_range
        .map_or((i64::MIN, i64::MAX), |range| (range.start(), range.end()));
    let reverse = query.newest_first;
    if query.limit == Some(0) {
        return Ok(Plan {
            index_used: IndexUsed::Time,
            sets: Vec::new(),
            start,
            end,
            reverse,
            limit: 0,
            filters,
            counted_scopes: None,
        });
    }
    let (index_used, sets) = fewest_entries(index, &filters);
    Ok(Plan {
        index_used,
        sets,
        start,
        end,
        reverse,
        limit: query.limit.unwrap_or(usize::MAX),
        filters,
        counted_scopes: view.counted_scope_ids(index),
    })
}

/// The candidate sets with the fewest entries: the asked types' (type, timestamp) sets, the
/// allowed scopes' (scope, timestamp) sets, or the (timestamp) set of everything. With a time range
/// every option shrinks by about the same share, so total sizes rank them.
fn fewest_entries<'a>(index: &'a Index, filters: &Filters) -> (IndexUsed, Vec<&'a KeySet>) {
    let set_len = |sets: &[&KeySet]| sets.iter().map(|set| set.len()).sum::<usize>();
    let mut plans: Vec<(IndexUsed, Vec<&KeySet>)> = Vec::new();
    if let Some(kinds) = &filters.kinds {
        plans.push((
            IndexUsed::Type,
            kinds
                .iter()
                .filter_map(|k| index.by_type.get(usize::from(*k)))
                .collect(),
        ));
    }
    if let Some(scopes) = &filters.scopes {
        let sets = scopes
            .iter()
            .filter_map(|s| index.by_scope.get(usize::try_from(*s).ok()?))
            .collect();
        plans.push((IndexUsed::Scope, sets));
    }
    plans.push((IndexUsed::Time, vec![&index.by_time]));
    plans
        .into_iter()
        .min_by_key(|(_, sets)| set_len(sets))
        .unwrap_or((IndexUsed::Time, Vec::new()))
}

/// Refuses a malformed query: an unregistered type, a NaN bound, an empty key in a path.
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
