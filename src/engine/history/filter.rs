//! [`ChangeFilter`]: which changes a subscription delivers, and from where it starts.

use std::collections::BTreeSet;

use super::change::Change;
use crate::item::Scope;
use crate::read::view::scope_visible;

/// Which changes a subscription ([`crate::Store::subscribe`]) delivers, and whether it first replays
/// the durable history after a sequence number.
///
/// Each list left empty lets every change through. `types` is matched against an added item's
/// type, the type of the version a delete ended, and an expired item's type; `scopes` against the
/// scope of an added, deleted or expired item; `ids` against the id a change concerns. A `SessionClosed` change passes only a filter that sets none
/// of the three lists.
///
/// ```
/// use ctxlog::{ChangeFilter, Scope};
/// let filter = ChangeFilter::new()
///     .types(["tool_result"])
///     .scopes([Scope::GlobalWritable])
///     .after(41);
/// # let _ = filter;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeFilter {
    pub(crate) types: BTreeSet<String>,
    pub(crate) scopes: Vec<Scope>,
    pub(crate) ids: BTreeSet<String>,
    pub(crate) after: Option<u64>,
}

impl ChangeFilter {
    /// Every change, live only (from the next commit on).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Only changes of these item types (added to the types already given).
    #[must_use]
    pub fn types<I, S>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.types.extend(types.into_iter().map(Into::into));
        self
    }

    /// Only changes in these scopes (added to the scopes already given).
    #[must_use]
    pub fn scopes<I: IntoIterator<Item = Scope>>(mut self, scopes: I) -> Self {
        for scope in scopes {
            if !self.scopes.contains(&scope) {
                self.scopes.push(scope);
            }
        }
        self
    }

    /// Only changes of these ids (added to the ids already given).
    #[must_use]
    pub fn ids<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.ids.extend(ids.into_iter().map(Into::into));
        self
    }

    /// First deliver every durable change committed after `seq` (as [`crate::Store::changes`]
    /// would), then continue live, with no gap and no duplicate.
    #[must_use]
    pub fn after(mut self, seq: u64) -> Self {
        self.after = Some(seq);
        self
    }

    /// Whether `change` passes, for a reader restricted to `session` (`None`: the store itself).
    /// `kind`: the type of the item the change concerns where the change does not carry it
    /// (`None`: unknown, which lets a deletion through a type filter); `expired_scope`: the scope
    /// of an expired item (an expiry whose scope is unknown reaches no session and no scope
    /// filter).
    pub(crate) fn matches(
        &self,
        change: &Change,
        kind: Option<&str>,
        expired_scope: Option<&Scope>,
        session: Option<&str>,
    ) -> bool {
        let (id, kind, scope) = match change {
            Change::Added { id, kind, scope, .. } => (id, Some(kind.as_str()), Some(scope)),
            Change::Deleted { id, scope, .. } => (id, kind, Some(scope)),
            Change::Expired { id, .. } => (id, kind, expired_scope),
            Change::SessionClosed { session: closed, .. } => {
                let own = session.is_none_or(|reader| reader == closed.as_str());
                return own && self.types.is_empty() && self.scopes.is_empty() && self.ids.is_empty();
            }
        };
        let visible = match scope {
            Some(scope) => scope_visible(scope, session),
            None => session.is_none(),
        };
        visible
            && (self.ids.is_empty() || self.ids.contains(id.as_str()))
            && (self.types.is_empty() || kind.is_none_or(|kind| self.types.contains(kind)))
            && (self.scopes.is_empty() || scope.is_some_and(|scope| self.scopes.contains(scope)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(id: &str, kind: &str, scope: Scope) -> Change {
        Change::Added {
            seq: 1,
            committed_at: 0,
            id: id.into(),
            version: "1".into(),
            hash: String::new(),
            kind: kind.into(),
            scope,
            timestamp: 0,
        }
    }

    #[test]
    fn empty_lists_let_everything_through_and_each_list_narrows() {
        let a = added("a", "t1", Scope::GlobalWritable);
        let b = added("b", "t2", Scope::Session("s1".into()));
        let all = ChangeFilter::new();
        assert!(all.matches(&a, None, None, None) && all.matches(&b, None, None, None));
        let by_type = ChangeFilter::new().types(["t2"]);
        assert!(!by_type.matches(&a, None, None, None) && by_type.matches(&b, None, None, None));
        let by_id = ChangeFilter::new().ids(["a"]);
        assert!(by_id.matches(&a, None, None, None) && !by_id.matches(&b, None, None, None));
        let by_scope = ChangeFilter::new().scopes([Scope::Session("s1".into())]);
        assert!(!by_scope.matches(&a, None, None, None) && by_scope.matches(&b, None, None, None));
    }

    #[test]
    fn a_deletion_of_unknown_type_passes_a_type_filter_and_sessions_see_only_their_own() {
        let deleted = Change::Deleted {
            seq: 2,
            committed_at: 0,
            id: "x".into(),
            scope: Scope::Session("s1".into()),
        };
        let filter = ChangeFilter::new().types(["t1"]);
        assert!(filter.matches(&deleted, None, None, None));
        assert!(!filter.matches(&deleted, Some("t2"), None, None));
        assert!(filter.matches(&deleted, Some("t1"), None, Some("s1")));
        assert!(!ChangeFilter::new().matches(&deleted, None, None, Some("s2")));
        let closed = Change::SessionClosed {
            seq: 3,
            committed_at: 0,
            session: "s1".into(),
        };
        assert!(ChangeFilter::new().matches(&closed, None, None, None));
        assert!(!ChangeFilter::new().matches(&closed, None, None, Some("s2")));
        assert!(!ChangeFilter::new().ids(["x"]).matches(&closed, None, None, None));
    }

    #[test]
    fn an_expiry_reaches_the_sessions_that_may_read_its_item_and_passes_scope_filters_by_its_scope() {
        let expired = Change::Expired {
            id: "x".into(),
            version: "1".into(),
            expired_at: 5,
        };
        let own = Scope::Session("s1".into());
        let all = ChangeFilter::new();
        assert!(all.matches(&expired, Some("t1"), Some(&own), Some("s1")));
        assert!(!all.matches(&expired, Some("t1"), Some(&own), Some("s2")));
        assert!(all.matches(&expired, Some("t1"), Some(&Scope::GlobalReadonly), Some("s2")));
        // Unknown scope: the store itself only.
        assert!(all.matches(&expired, Some("t1"), None, None));
        assert!(!all.matches(&expired, Some("t1"), None, Some("s1")));
        let by_scope = ChangeFilter::new().scopes([own.clone()]);
        assert!(by_scope.matches(&expired, None, Some(&own), None));
        assert!(!by_scope.matches(&expired, None, Some(&Scope::GlobalWritable), None));
        assert!(!by_scope.matches(&expired, None, None, None));
        assert!(!ChangeFilter::new()
            .types(["t2"])
            .matches(&expired, Some("t1"), Some(&own), None));
    }
}
