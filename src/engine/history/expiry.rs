//! [`Expiries`]: the ids whose latest version will expire, ordered by expiry, so that the hub can
//! announce [`Change::Expired`] as the clock passes each one without scanning every item.
//!
//! Kept only while someone subscribes: the first subscriber builds it from the index (one pass over
//! the version table, under the index lock the subscription takes anyway), the dispatcher then adds
//! the expiring versions of every batch it delivers, and drops it once the last subscriber leaves.
//! A store without subscribers pays nothing for it. Entries are checked against the index when they
//! fall due, not kept in step with it: a version superseded or deleted before its expiry leaves a
//! stale entry that is dropped then, unannounced.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::change::{Change, LiveChange};
use crate::error::Error;
use crate::index::{Index, NEVER_EXPIRES};
use crate::read::record::read_identity;

/// Expiries to announce, by time, then id.
#[derive(Debug, Default)]
pub(crate) struct Expiries {
    due: BTreeSet<(i64, Box<str>)>,
}

impl Expiries {
    /// The expiries after `now` of the versions visible in the index at its sequence number.
    pub(crate) fn build(index: &Index, now: i64) -> Expiries {
        let mut due = BTreeSet::new();
        for version in index.slots.iter() {
            if !version.is_stored() || !index.visible_at(&version, index.seq) {
                continue;
            }
            let at = index.expires_at(&version);
            if at != NEVER_EXPIRES && at > now {
                due.insert((at, index.id_name(version.id).into_boxed_str()));
            }
        }
        Expiries { due }
    }

    /// How many expiries are waiting.
    pub(crate) fn len(&self) -> usize {
        self.due.len()
    }

    /// Adds the expiry of an added version.
    pub(crate) fn note(&mut self, at: i64, id: &str) {
        if at != NEVER_EXPIRES {
            self.due.insert((at, id.into()));
        }
    }

    /// Takes every expiry at or before `now` and gives the [`Change::Expired`] of each that still
    /// holds: the id's visible version still expires then. An entry whose version cannot be read
    /// is dropped with a warning (reads of it report the damage).
    pub(crate) fn take_due(&mut self, index: &Index, now: i64) -> Vec<LiveChange> {
        let mut expired = Vec::new();
        while let Some((at, _)) = self.due.first() {
            if *at > now {
                break;
            }
            let Some((at, id)) = self.due.pop_first() else {
                break;
            };
            let Some(visible) = index.visible(&id, index.seq) else {
                continue;
            };
            let version = visible.version;
            if !version.is_stored() || index.expires_at(&version) != at {
                continue;
            }
            let (version_string, _hash) = match read_identity(index, &version) {
                Ok(identity) => identity,
                Err(e) => {
                    tracing::warn!("an expiring version of {id} cannot be read: {}", Error::from(e));
                    continue;
                }
            };
            let kind = index
                .kinds
                .value(u32::from(version.kind()))
                .map(|kind| kind.to_string());
            let scope = index.scopes.value(version.scope).cloned();
            expired.push(LiveChange {
                change: Arc::new(Change::Expired {
                    id: id.into_string(),
                    version: version_string,
                    expired_at: at,
                }),
                kind,
                scope,
            });
        }
        expired
    }

    /// The earliest expiry waiting, if any.
    pub(crate) fn next(&self) -> Option<i64> {
        self.due.first().map(|(at, _)| *at)
    }
}
