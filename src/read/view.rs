//! Visibility: what a reader sees. A view is a sequence number (MVCC: which versions exist for it),
//! a clock time (TTL: which of them have expired) and, for a session view, a session (scope: which
//! scopes it may see, and write). TTL and scope are judged here and nowhere else: every layer that
//! asks whether a version is live or expired, or whether a scope is one a session may see or
//! write, calls these functions. (Which version of an id a sequence number sees is the index's
//! MVCC, below.)
//!
//! - A [`View`] (seq, now, session): [`View::sees_live`] (seq and TTL), [`View::judge`] (all three,
//!   as a resolve answers), [`View::expired`], [`View::has_seen`], [`View::may_see`],
//!   [`View::scope_ids`] and [`View::counted_scope_ids`] (a query's scopes).
//! - Scope: [`scope_visible`], [`stored_scope_visible`], [`session_scopes`]; writes:
//!   [`scope_writable`], [`may_write_over`], [`check_scope_writable`].
//! - TTL: [`is_expired`], [`expiry_of`], [`version_expired`], [`expiry_or_never`].

use crate::error::{Error, Result};
use crate::index::{Index, VersionEntry, NEVER_EXPIRES};
use crate::item::Scope;

/// A reader's restrictions: the sequence number it reads at, the clock time it judges TTL at, and
/// the session it is restricted to, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct View<'a> {
    /// The sequence number: the view sees the versions with `seq_created <= seq < seq_ended`.
    pub(crate) seq: u64,
    /// The clock time, UTC seconds: a version whose expiry is at or before it has expired.
    pub(crate) now: i64,
    /// The session the view is restricted to: it never sees another session's scope.
    pub(crate) session: Option<&'a str>,
}

/// How a view sees one version of an id ([`View::judge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sight {
    /// The view does not see it: not visible at its sequence number, its record reclaimed, or in a
    /// scope it may not see.
    Hidden,
    /// The view would see it, but it has expired at the view's time (at `expired_at`).
    Expired {
        /// When it expired, UTC seconds.
        expired_at: i64,
    },
    /// The view sees it.
    Live,
}

impl<'a> View<'a> {
    /// A view at `seq`, judging TTL at `now`, restricted to `session` if any.
    #[inline]
    pub(crate) fn new(seq: u64, now: i64, session: Option<&'a str>) -> View<'a> {
        View { seq, now, session }
    }

    /// Whether the view sees `version` live, scope aside: visible at its sequence number and not
    /// expired at its time. (The scope is judged apart, by [`View::may_see`], or once per query by
    /// [`View::scope_ids`].)
    #[inline]
    pub(crate) fn sees_live(&self, index: &Index, version: &VersionEntry) -> bool {
        index.visible_at(version, self.seq) && !version_expired(index, version, self.now)
    }

    /// Whether `version` has expired at the view's time.
    #[inline]
    pub(crate) fn expired(&self, index: &Index, version: &VersionEntry) -> bool {
        version_expired(index, version, self.now)
    }

    /// Whether the view has seen `version` created: at or before its sequence number (a version
    /// it has seen may since have been ended).
    #[inline]
    pub(crate) fn has_seen(&self, version: &VersionEntry) -> bool {
        version.seq_created <= self.seq
    }

    /// Whether the view may see `scope` ([`scope_visible`]).
    #[inline]
    pub(crate) fn may_see(&self, scope: &Scope) -> bool {
        scope_visible(scope, self.session)
    }

    /// Whether the view may see the scope numbered `scope` in `index` (an unknown number: no).
    #[inline]
    pub(crate) fn may_see_scope_id(&self, index: &Index, scope: u32) -> bool {
        index.scopes.value(scope).is_some_and(|scope| self.may_see(scope))
    }

    /// How the view sees `version`, judged in this order: a version not visible at its sequence
    /// number, whose record was reclaimed (nothing is stored to answer with), or in a scope the
    /// view may not see is [`Sight::Hidden`]; one expired at its time is [`Sight::Expired`]; else
    /// [`Sight::Live`].
    #[inline]
    pub(crate) fn judge(&self, index: &Index, version: &VersionEntry) -> Sight {
        if !index.visible_at(version, self.seq) || !version.is_stored() || !self.may_see_scope_id(index, version.scope)
        {
            return Sight::Hidden;
        }
        if self.expired(index, version) {
            return Sight::Expired {
                expired_at: expiry_of(index, version),
            };
        }
        Sight::Live
    }

    /// The numbers of the scopes a query may return, sorted: of the `asked` scopes (all when
    /// `None`) those the view may see. `None`: no restriction (no scopes asked, no session). A
    /// scope never interned has no number, and so matches nothing.
    pub(crate) fn scope_ids(&self, index: &Index, asked: Option<&[Scope]>) -> Option<Vec<u32>> {
        let mut ids: Vec<u32> = match (asked, self.session) {
            (None, None) => return None,
            (Some(asked), session) => asked
                .iter()
                .filter(|scope| scope_visible(scope, session))
                .filter_map(|scope| index.scopes.get(scope))
                .collect(),
            (None, Some(session)) => session_scopes(session)
                .iter()
                .filter_map(|scope| index.scopes.get(scope))
                .collect(),
        };
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }

    /// The numbers of the scopes whose entries a session view's query counts as examined (its own
    /// session's and the global ones): its stats must not tell it how many items other sessions
    /// hold in the sets it walks. `None`: every entry counts (no session).
    pub(crate) fn counted_scope_ids(&self, index: &Index) -> Option<Vec<u32>> {
        self.session.map(|session| {
            session_scopes(session)
                .iter()
                .filter_map(|scope| index.scopes.get(scope))
                .collect()
        })
    }
}

/// Whether a reader restricted to `session` may see `scope`: a session sees its own session's scope
/// and the global ones; a reader without a session sees every scope.
#[inline]
pub(crate) fn scope_visible(scope: &Scope, session: Option<&str>) -> bool {
    match (scope, session) {
        (Scope::Session(owner), Some(reader)) => owner == reader,
        _ => true,
    }
}

/// Whether a session view of `session` may write `scope`: its own session's, or `GlobalWritable`.
#[inline]
pub(crate) fn scope_writable(scope: &Scope, session: &str) -> bool {
    match scope {
        Scope::Session(owner) => owner == session,
        Scope::GlobalWritable => true,
        Scope::GlobalReadonly => false,
    }
}

/// Whether a reader restricted to `session` may see a version whose stored scope is `scope`:
/// `None` is a version whose record compaction reclaimed: only a reader without a session sees it,
/// whatever scope the index keeps for it (a store of segment format 1 or 2 kept none, so the rule
/// does not depend on it).
#[inline]
pub(crate) fn stored_scope_visible(scope: Option<&Scope>, session: Option<&str>) -> bool {
    session.is_none() || scope.is_some_and(|scope| scope_visible(scope, session))
}

/// Whether a session view of `session` may add a version over `latest`, an id's latest version in
/// `index`: if its record is still stored, its scope must be one the session may write
/// ([`scope_writable`]). A latest version whose record compaction reclaimed holds no content: it
/// does not count, whatever scope the index keeps for it (a store of segment format 1 or 2 kept
/// none, so the rule does not depend on it).
pub(crate) fn may_write_over(index: &Index, latest: &VersionEntry, session: &str) -> bool {
    !latest.is_stored()
        || index
            .scopes
            .value(latest.scope)
            .is_some_and(|scope| scope_writable(scope, session))
}

/// [`scope_writable`] as an add checks it: `PermissionDenied`, saying why, for a scope a session
/// view of `session` may not write.
///
/// # Errors
/// `PermissionDenied` for another session's scope or `GlobalReadonly`.
pub(crate) fn check_scope_writable(scope: &Scope, session: &str) -> Result<()> {
    if scope_writable(scope, session) {
        return Ok(());
    }
    match scope {
        Scope::Session(_) | Scope::GlobalWritable => Err(Error::PermissionDenied {
            reason: format!("session {session:?} may not write to another session's scope"),
            index: None,
        }),
        Scope::GlobalReadonly => Err(Error::PermissionDenied {
            reason: format!("session {session:?} may not write to the global_readonly scope"),
            index: None,
        }),
    }
}

/// Every scope a session view of `session` may see: its own session's and the global ones.
pub(crate) fn session_scopes(session: &str) -> [Scope; 3] {
    [
        Scope::Session(session.to_owned()),
        Scope::GlobalReadonly,
        Scope::GlobalWritable,
    ]
}

/// Whether something expiring at `expires_at` has expired at `now`: expiry is inclusive, an item
/// is gone at the second it expires. [`NEVER_EXPIRES`] never has.
#[inline]
pub(crate) fn is_expired(expires_at: i64, now: i64) -> bool {
    expires_at <= now
}

/// When `version` expires, UTC seconds ([`NEVER_EXPIRES`] for never).
#[inline]
pub(crate) fn expiry_of(index: &Index, version: &VersionEntry) -> i64 {
    index.expires_at(version)
}

/// Whether `version` has expired at `now`.
#[inline]
pub(crate) fn version_expired(index: &Index, version: &VersionEntry, now: i64) -> bool {
    is_expired(expiry_of(index, version), now)
}

/// The expiry the index keeps for an item whose record says `expires_at`: [`NEVER_EXPIRES`] for
/// an item without a TTL.
#[inline]
pub(crate) fn expiry_or_never(expires_at: Option<i64>) -> i64 {
    expires_at.unwrap_or(NEVER_EXPIRES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_see_only_their_own_session_scope() {
        assert!(scope_visible(&Scope::Session("a".into()), Some("a")));
        assert!(!scope_visible(&Scope::Session("b".into()), Some("a")));
        assert!(scope_visible(&Scope::GlobalReadonly, Some("a")));
        assert!(scope_visible(&Scope::Session("b".into()), None));
    }

    #[test]
    fn sessions_write_their_own_scope_and_the_global_writable_one() {
        assert!(scope_writable(&Scope::Session("a".into()), "a"));
        assert!(!scope_writable(&Scope::Session("b".into()), "a"));
        assert!(scope_writable(&Scope::GlobalWritable, "a"));
        assert!(!scope_writable(&Scope::GlobalReadonly, "a"));
    }

    #[test]
    fn a_retired_version_is_seen_only_without_a_session() {
        assert!(stored_scope_visible(None, None));
        assert!(!stored_scope_visible(None, Some("a")));
        assert!(stored_scope_visible(Some(&Scope::Session("a".into())), Some("a")));
        assert!(!stored_scope_visible(Some(&Scope::Session("b".into())), Some("a")));
    }

    #[test]
    fn refused_writes_say_why() {
        assert!(check_scope_writable(&Scope::Session("a".into()), "a").is_ok());
        assert!(check_scope_writable(&Scope::GlobalWritable, "a").is_ok());
        for (scope, says) in [
            (Scope::Session("b".into()), "another session's scope"),
            (Scope::GlobalReadonly, "the global_readonly scope"),
        ] {
            match check_scope_writable(&scope, "a") {
                Err(Error::PermissionDenied { reason, index: None }) => assert!(reason.contains(says), "{reason}"),
                other => panic!("{scope:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn expiry_is_inclusive_and_never_is_never() {
        assert!(!is_expired(10, 9));
        assert!(is_expired(10, 10));
        assert!(is_expired(10, 11));
        assert!(!is_expired(expiry_or_never(None), i64::MAX - 1));
        assert_eq!(expiry_or_never(Some(5)), 5);
    }

    #[test]
    fn a_view_judges_seq_scope_and_ttl() {
        let mut index = Index::default();
        let put = crate::log::record::PutView {
            scope: crate::log::record::ScopeView::Session("s"),
            ttl_seconds: Some(5),
            ..crate::index::tests::put("aa", "1", 10)
        };
        index.apply_put(1, &put, crate::index::Location::default());
        let version = index.slot(0).expect("aa's version");
        assert_eq!(expiry_of(&index, &version), 15);
        assert_eq!(View::new(0, 14, None).judge(&index, &version), Sight::Hidden);
        assert!(!View::new(0, 14, None).has_seen(&version));
        assert_eq!(View::new(1, 14, None).judge(&index, &version), Sight::Live);
        assert_eq!(View::new(1, 14, Some("s")).judge(&index, &version), Sight::Live);
        assert_eq!(View::new(1, 14, Some("t")).judge(&index, &version), Sight::Hidden);
        assert_eq!(
            View::new(1, 15, Some("s")).judge(&index, &version),
            Sight::Expired { expired_at: 15 }
        );
        assert!(View::new(1, 14, Some("t")).sees_live(&index, &version));
        assert!(!View::new(1, 15, None).sees_live(&index, &version));
        assert!(View::new(1, 15, None).has_seen(&version));
        assert!(may_write_over(&index, &version, "s"));
        assert!(!may_write_over(&index, &version, "t"));
    }
}
