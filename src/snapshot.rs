//! Read views: [`Snapshot`] (a view fixed at a sequence number and a clock time), [`Resolution`],
//! and reading a version's record back with every check on the way.

use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::index::{Index, VersionEntry};
use crate::item::{content_hash, validate_name, validate_version, ContextItem};
use crate::log::record::{decode_record, RecordView};
use crate::query::{self, scope_visible, ContextQuery, QueryStats, ViewBounds};
use crate::store::Shared;

/// The answer for one reference of a `resolve`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Resolution {
    /// The reference names the id's latest version (or just the id): here it is.
    Found(ContextItem),
    /// No such id, no such version, or an id the reader may not see.
    NotFound {
        /// The reference as it was given.
        reference: String,
    },
    /// The id's latest version has expired; `id@version` references of it answer the same.
    Expired {
        /// The id.
        id: String,
        /// When it expired, UTC seconds.
        expired_at: i64,
    },
    /// `id@version` names an earlier version of a live id; `latest` is the current item.
    Superseded {
        /// The id.
        id: String,
        /// The version that was asked for.
        requested_version: String,
        /// The id's latest version.
        latest: ContextItem,
    },
    /// The stored bytes no longer match their checksum or hash: damage is reported, never returned.
    HashMismatch {
        /// The id whose record is damaged.
        id: String,
    },
}

/// Why a stored record could not be returned.
pub(crate) enum ReadFailure {
    /// The record is damaged: CRC, hash, or identity does not match the index.
    Damaged(Error),
    /// Reading failed.
    Io(Error),
}

impl From<ReadFailure> for Error {
    fn from(failure: ReadFailure) -> Error {
        match failure {
            ReadFailure::Damaged(e) | ReadFailure::Io(e) => e,
        }
    }
}

/// Reads the item stored for `version`, checking the record's CRC, that it is the version the index
/// says it is, and the content's SHA-256.
pub(crate) fn read_item(index: &Index, version: &VersionEntry) -> Result<ContextItem, ReadFailure> {
    let location = version.location;
    let Some(segment) = index.segments.get(&location.segment) else {
        return Err(ReadFailure::Damaged(Error::Corrupt {
            file: format!("segment {}", location.segment).into(),
            offset: u64::from(location.offset),
            reason: "the segment holding this record is missing".into(),
        }));
    };
    let damaged = |reason: String| {
        ReadFailure::Damaged(Error::Corrupt {
            file: segment.path.clone(),
            offset: u64::from(location.offset),
            reason,
        })
    };
    let bytes = segment
        .read(u64::from(location.offset), location.len)
        .map_err(|e| match e {
            e @ Error::Corrupt { .. } => ReadFailure::Damaged(e),
            other => ReadFailure::Io(other),
        })?;
    let record = decode_record(&bytes).map_err(|e| damaged(e.0))?;
    let RecordView::Put(put) = record else {
        return Err(damaged("the index points at a record that is not an item".into()));
    };
    if put.id != index.id_name(version.id) || put.version != &*version.version || put.hash != version.hash {
        return Err(damaged("the stored record is not the version the index expects".into()));
    }
    if content_hash(put.content) != put.hash {
        return Err(damaged("content does not match its SHA-256".into()));
    }
    put.to_item().map_err(|e| damaged(e.0))
}

/// A read view fixed at a sequence number and a clock time. Later adds, deletes and expiries never
/// change its answers; TTL is judged at [`Snapshot::taken_at`].
#[derive(Clone)]
pub struct Snapshot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) seq: u64,
    pub(crate) taken_at: i64,
    pub(crate) session: Option<Arc<str>>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("seq", &self.seq)
            .field("taken_at", &self.taken_at)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// The sequence number this view is fixed at.
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The clock time this view judges TTL at, UTC seconds.
    #[must_use]
    pub fn taken_at(&self) -> i64 {
        self.taken_at
    }

    /// The session this view is restricted to, if it was taken through a session view.
    #[must_use]
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// The latest visible version of each id that matches `query`, in `(timestamp, id)` order.
    ///
    /// # Errors
    /// `UnknownType` or `Invalid` for a malformed query; `Corrupt` if a matching record is damaged;
    /// `Io` if reading fails.
    pub fn get(&self, query: &ContextQuery) -> Result<Vec<ContextItem>> {
        self.get_with_stats(query).map(|(items, _)| items)
    }

    /// Like [`Snapshot::get`], and says which index the query walked and how many entries it examined.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_with_stats(&self, query: &ContextQuery) -> Result<(Vec<ContextItem>, QueryStats)> {
        let index = self.shared.read_index();
        let bounds = ViewBounds {
            seq: self.seq,
            now: self.taken_at,
            session: self.session.as_deref(),
        };
        let fetch = |version: &VersionEntry| read_item(&index, version).map_err(Error::from);
        let result = query::run(&index, query, &bounds, &fetch)?;
        self.shared.count_query(result.1.examined);
        Ok(result)
    }

    /// Resolves each reference (`id` or `id@version`), one [`Resolution`] per reference, in order.
    ///
    /// # Errors
    /// `Invalid` (with the reference's position as `index`) for a reference that is not a valid id,
    /// optionally followed by `@` and a valid version; `Io` if reading fails.
    pub fn resolve<I, R>(&self, refs: I) -> Result<Vec<Resolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        let refs: Vec<R> = refs.into_iter().collect();
        let mut parsed = Vec::with_capacity(refs.len());
        for (position, reference) in refs.iter().enumerate() {
            parsed.push(parse_reference(reference.as_ref()).map_err(|e| e.at(position))?);
        }
        let index = self.shared.read_index();
        parsed
            .into_iter()
            .zip(&refs)
            .map(|((id, version), reference)| self.resolve_one(&index, reference.as_ref(), id, version))
            .collect()
    }

    fn resolve_one(&self, index: &Index, reference: &str, id: &str, version: Option<&str>) -> Result<Resolution> {
        let not_found = || {
            Ok(Resolution::NotFound {
                reference: reference.to_owned(),
            })
        };
        let Some(visible) = index.visible(id, self.seq) else {
            return not_found();
        };
        let latest = visible.version;
        let scope_allowed = index
            .scopes
            .value(latest.scope)
            .is_some_and(|scope| scope_visible(scope, self.session.as_deref()));
        if !scope_allowed {
            return not_found();
        }
        if latest.expired_at(self.taken_at) {
            return Ok(Resolution::Expired {
                id: id.to_owned(),
                expired_at: latest.expires_at,
            });
        }
        let read = |entry: &VersionEntry| match read_item(index, entry) {
            Ok(item) => Ok(Ok(item)),
            Err(ReadFailure::Damaged(_)) => Ok(Err(Resolution::HashMismatch { id: id.to_owned() })),
            Err(ReadFailure::Io(e)) => Err(e),
        };
        match version {
            Some(asked) if asked != &*latest.version => {
                let earlier = visible
                    .entry
                    .versions
                    .iter()
                    .filter_map(|slot| index.slot(*slot))
                    .any(|entry| {
                        entry.generation == latest.generation
                            && entry.seq_created <= self.seq
                            && &*entry.version == asked
                    });
                if !earlier {
                    return not_found();
                }
                Ok(match read(latest)? {
                    Ok(item) => Resolution::Superseded {
                        id: id.to_owned(),
                        requested_version: asked.to_owned(),
                        latest: item,
                    },
                    Err(mismatch) => mismatch,
                })
            }
            _ => Ok(read(latest)?.map_or_else(|mismatch| mismatch, Resolution::Found)),
        }
    }
}

/// Splits `id@version`, validating both parts.
fn parse_reference(reference: &str) -> Result<(&str, Option<&str>)> {
    let (id, version) = match reference.split_once('@') {
        Some((id, version)) => (id, Some(version)),
        None => (reference, None),
    };
    let refuse = |e: Error| match e {
        Error::Invalid { reason, .. } => Error::invalid(
            "reference",
            format!("{reference:?} is not `id` or `id@version`: {reason}"),
        ),
        other => other,
    };
    validate_name("id", id).map_err(refuse)?;
    if let Some(version) = version {
        validate_version(version).map_err(refuse)?;
    }
    Ok((id, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        assert_eq!(parse_reference("ch3").unwrap(), ("ch3", None));
        assert_eq!(parse_reference("ch9@20240512.1").unwrap(), ("ch9", Some("20240512.1")));
        for bad in ["", "@1", "a@", "a b", "a@1@2", "a@x y"] {
            assert!(matches!(parse_reference(bad), Err(Error::Invalid { .. })), "{bad:?}");
        }
    }
}
