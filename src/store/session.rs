//! [`SessionView`]: a store seen from one session, which reads its own scope and the global ones
//! and writes its own scope and `GlobalWritable`; and the scope check of its writes.

use std::sync::Arc;

use crate::engine::history::filter::ChangeFilter;
use crate::engine::history::subscription::Subscription;
use crate::error::Result;
use crate::item::ContextItem;
use crate::read::answer::{RawItem, RawResolution, Resolution};
use crate::read::query::{ContextQuery, QueryStats};
use crate::snapshot::Snapshot;
use crate::store::{AddOutcome, Store};

/// A store seen from one session: it reads its own session's scope and the global ones, and writes
/// its own scope and `GlobalWritable`. Another session's items resolve as `NotFound`.
#[derive(Clone, Debug)]
pub struct SessionView {
    store: Store,
    session: Arc<str>,
}

impl SessionView {
    /// `store` seen from session `session_id`.
    pub(super) fn new(store: Store, session_id: &str) -> SessionView {
        SessionView {
            store,
            session: Arc::from(session_id),
        }
    }

    /// The session id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.session
    }

    /// Adds items as one batch, as [`Store::add`]; each must be scoped to this session or
    /// `GlobalWritable`, and may be a new version only of an id whose latest version (while its
    /// record is stored) is in one of those scopes too: a session can neither replace a
    /// `GlobalReadonly` item nor another session's. Ids are one namespace for the whole store: such
    /// a refusal tells the session that the id is taken, and nothing else about it.
    ///
    /// # Errors
    /// `PermissionDenied` (with `index`) for another session's scope or `GlobalReadonly`, or for a
    /// version of an id whose latest version is in such a scope (refused before any version is
    /// compared: no `VersionConflict` or `Unchanged` answer tells another session's hash), and for
    /// a version number already stored in a scope this session may not see, or whose record
    /// compaction reclaimed (whatever its scope was), whatever its content; otherwise as
    /// [`Store::add`].
    pub fn add<I: IntoIterator<Item = ContextItem>>(&self, items: I) -> Result<Vec<AddOutcome>> {
        self.store.add_checked(items, Some(&self.session))
    }

    /// As [`Store::get`], restricted to this session and the global scopes.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get(&self, query: &ContextQuery) -> Result<Vec<ContextItem>> {
        self.store.view(Some(Arc::clone(&self.session)), false).get(query)
    }

    /// As [`Store::get_with_stats`], restricted to this session and the global scopes.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_with_stats(&self, query: &ContextQuery) -> Result<(Vec<ContextItem>, QueryStats)> {
        self.store
            .view(Some(Arc::clone(&self.session)), false)
            .get_with_stats(query)
    }

    /// As [`Store::resolve`]; another session's items are `NotFound`.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve<I, R>(&self, refs: I) -> Result<Vec<Resolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.store.view(Some(Arc::clone(&self.session)), false).resolve(refs)
    }

    /// As [`Store::get_raw`], restricted to this session and the global scopes.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_raw(&self, query: &ContextQuery) -> Result<Vec<RawItem>> {
        self.store.view(Some(Arc::clone(&self.session)), false).get_raw(query)
    }

    /// As [`Store::resolve_raw`]; another session's items are `NotFound`.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve_raw<I, R>(&self, refs: I) -> Result<Vec<RawResolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.store
            .view(Some(Arc::clone(&self.session)), false)
            .resolve_raw(refs)
    }

    /// A snapshot of now that keeps this session's visibility.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        self.store.view(Some(Arc::clone(&self.session)), true)
    }

    /// As [`Store::subscribe`], with only the changes this session may read: those of its own
    /// session's scope and of the global scopes, never another session's (in the replayed history
    /// too).
    ///
    /// # Errors
    /// As [`Store::subscribe`].
    pub fn subscribe(&self, filter: ChangeFilter) -> Result<Subscription> {
        self.store.subscribe_as(filter, Some(Arc::clone(&self.session)))
    }
}
