//! The public answers of a read: [`Resolution`] (one reference of a `resolve`), [`RawItem`] (an
//! item as its JSON, read without parsing its content) and [`RawResolution`]. They sit in the read
//! layer, below the snapshot facade that returns them, since the read layer builds them.

use serde::Serialize;

use crate::error::Result;
use crate::item::ContextItem;

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

/// An item as its JSON shape (see [`ContextItem`]), read without parsing its content: what a server
/// that forwards JSON unchanged sends on.
///
/// The bytes are exactly those `serde_json::to_vec(&item)` gives for the [`ContextItem`] the parsed
/// read ([`Snapshot::resolve`], [`Snapshot::get`]) returns: the store writes the envelope field by
/// field and splices in the content's stored canonical JSON, which it checked against the record's
/// CRC and the content's SHA-256 as the parsed read does. [`RawItem::to_item`] parses it.
///
/// [`Snapshot::resolve`]: crate::Snapshot::resolve
/// [`Snapshot::get`]: crate::Snapshot::get
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RawItem {
    json: String,
}

impl RawItem {
    /// The item whose JSON is `json`, which the caller wrote from a checked record.
    #[inline]
    pub(crate) fn from_checked_json(json: String) -> RawItem {
        RawItem { json }
    }

    /// The JSON, as bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        self.json.as_bytes()
    }

    /// The JSON, as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.json
    }

    /// The JSON's length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// Always false: an item's JSON is never empty. (For symmetry with [`RawItem::len`].)
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }

    /// The JSON, as owned bytes.
    #[must_use]
    pub fn into_bytes(self) -> Vec<u8> {
        self.json.into_bytes()
    }

    /// The JSON, as an owned string.
    #[must_use]
    pub fn into_string(self) -> String {
        self.json
    }

    /// Parses the JSON into the item (what the parsed read returns).
    ///
    /// # Errors
    /// As [`ContextItem::from_json`]; never for bytes the store returned.
    pub fn to_item(&self) -> Result<ContextItem> {
        ContextItem::from_json(&self.json)
    }
}

impl std::fmt::Debug for RawItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RawItem").field(&self.json).finish()
    }
}

impl std::fmt::Display for RawItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.json)
    }
}

impl AsRef<[u8]> for RawItem {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<str> for RawItem {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<RawItem> for Vec<u8> {
    fn from(item: RawItem) -> Vec<u8> {
        item.into_bytes()
    }
}

impl From<RawItem> for String {
    fn from(item: RawItem) -> String {
        item.into_string()
    }
}

/// The answer for one reference of a `resolve_raw`: a [`Resolution`] whose items are [`RawItem`]s.
/// Each reference gets the answer `resolve` gives it, variant for variant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawResolution {
    /// The reference names the id's latest version (or just the id): here is its JSON.
    Found(RawItem),
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
    /// `id@version` names an earlier version of a live id; `latest` is the current item's JSON.
    Superseded {
        /// The id.
        id: String,
        /// The version that was asked for.
        requested_version: String,
        /// The id's latest version.
        latest: RawItem,
    },
    /// The stored bytes no longer match their checksum or hash: damage is reported, never returned.
    HashMismatch {
        /// The id whose record is damaged.
        id: String,
    },
}
