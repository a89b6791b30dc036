//! The context item: its fields, its scope and its builders. The files beside this one hold the
//! rest of what an item is (its JSON shape, canonical content, hashes, field rules and registered
//! types); this file re-exports what the layers above use, at the paths they always used.

use serde_json::Value;

mod canonical;
mod describe;
mod hash;
mod json;
#[cfg(test)]
pub(crate) mod test_support;
mod types;
mod validate;

pub use canonical::canonical_json;
pub(crate) use canonical::{write_json_str, write_scalar};
pub(crate) use hash::{content_hash, format_hash, write_hash_json};
pub(crate) use types::TypeRegistry;
pub use types::TypeSpec;
pub(crate) use validate::{check_item, validate_name, validate_version};

/// One piece of context: a document chunk, a tool result, a user profile, ...
///
/// Its JSON shape (see [`ContextItem::from_json`] and [`ContextItem::to_json`]) is
/// `{"id", "type", "content", "source", "timestamp", "version", "hash"?, "scope", "session_id"?,
/// "ttl_seconds"?, "confidence"?}`; absent optional fields are omitted on output.
#[derive(Clone, Debug, PartialEq)]
pub struct ContextItem {
    /// The item's id: 1..=128 bytes of `[A-Za-z0-9._:-]`.
    pub id: String,
    /// The item's type (JSON `"type"`); it must be a registered type.
    pub kind: String,
    /// Any JSON value; its canonical size must be at most `Options::max_content_bytes`.
    pub content: Value,
    /// Where the item comes from: 1..=256 bytes of UTF-8 without control characters.
    pub source: String,
    /// UTC seconds since the Unix epoch, `0..=253402300799` (9999-12-31T23:59:59Z).
    pub timestamp: i64,
    /// The item's version: 1..=64 bytes of `[A-Za-z0-9._-]`.
    pub version: String,
    /// `"sha256:"` + 64 lowercase hex digits of the SHA-256 of the canonical content
    /// (see [`canonical_json`]). Computed on add when absent.
    pub hash: Option<String>,
    /// Who may see the item.
    pub scope: Scope,
    /// The item expires `ttl_seconds` (at least 1) after its timestamp.
    pub ttl_seconds: Option<u64>,
    /// How sure the source is of the item: finite, `0.0..=1.0`.
    pub confidence: Option<f64>,
}

/// Who may see an item.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Visible to one session only; the session id follows the id rules (1..=128 bytes of
    /// `[A-Za-z0-9._:-]`). JSON: `"scope": "session", "session_id": "..."`.
    Session(String),
    /// Visible to everyone; sessions may not write it. JSON: `"scope": "global_readonly"`.
    GlobalReadonly,
    /// Visible to everyone; sessions may write it. JSON: `"scope": "global_writable"`.
    GlobalWritable,
}

impl Scope {
    /// The scope's JSON name: `"session"`, `"global_readonly"` or `"global_writable"`.
    #[inline]
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Session(_) => "session",
            Scope::GlobalReadonly => "global_readonly",
            Scope::GlobalWritable => "global_writable",
        }
    }

    /// The session id of a [`Scope::Session`], `None` for the global scopes.
    #[inline]
    #[must_use]
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Scope::Session(id) => Some(id),
            Scope::GlobalReadonly | Scope::GlobalWritable => None,
        }
    }
}

impl ContextItem {
    /// An item of empty strings and null content, which allocates nothing: what a batch keeps
    /// in the slot of an item taken out of it.
    pub(crate) fn vacant() -> Self {
        ContextItem {
            id: String::new(),
            kind: String::new(),
            content: Value::Null,
            source: String::new(),
            timestamp: 0,
            version: String::new(),
            hash: None,
            scope: Scope::GlobalReadonly,
            ttl_seconds: None,
            confidence: None,
        }
    }

    /// An item without hash, TTL or confidence. Nothing is checked here: the store validates
    /// every item when it is added.
    #[must_use]
    pub fn new(
        id: impl Into<String>,
        kind: impl Into<String>,
        content: Value,
        source: impl Into<String>,
        timestamp: i64,
        version: impl Into<String>,
        scope: Scope,
    ) -> Self {
        ContextItem {
            id: id.into(),
            kind: kind.into(),
            content,
            source: source.into(),
            timestamp,
            version: version.into(),
            hash: None,
            scope,
            ttl_seconds: None,
            confidence: None,
        }
    }

    /// The same item, expiring `secs` seconds after its timestamp (`secs` must be at least 1).
    #[must_use]
    pub fn with_ttl(mut self, secs: u64) -> Self {
        self.ttl_seconds = Some(secs);
        self
    }

    /// The same item with a confidence (finite, `0.0..=1.0`).
    #[must_use]
    pub fn with_confidence(mut self, c: f64) -> Self {
        self.confidence = Some(c);
        self
    }

    /// The same item with a declared hash (`"sha256:"` + 64 lowercase hex digits), which must
    /// match the hash of its canonical content.
    #[must_use]
    pub fn with_hash(mut self, h: impl Into<String>) -> Self {
        self.hash = Some(h.into());
        self
    }

    /// When the item expires: `timestamp + ttl_seconds`, or `None` without a TTL. A sum past the
    /// last `i64` second (a TTL of more than 292 billion years) is `i64::MAX`, which means never.
    #[must_use]
    pub fn expires_at(&self) -> Option<i64> {
        expiry(self.timestamp, self.ttl_seconds)
    }
}

/// The expiry of an item that never expires, and of one whose expiry is past the last `i64`
/// second: the index keeps both as never, and no clock reaches either.
pub(crate) const NEVER_EXPIRES: i64 = i64::MAX;

/// When an item of `timestamp` and `ttl_seconds` expires, or `None` without a TTL: their exact sum,
/// or [`NEVER_EXPIRES`] when the sum is past the last `i64` second. Validation bounds the timestamp
/// (`0..=TIMESTAMP_MAX`) but not the TTL (any `u64` from 1 on): a TTL from `i64::MAX -
/// TIMESTAMP_MAX` seconds on (292 billion years) reaches it. The one place the expiry is computed,
/// for items and for stored records alike.
#[inline]
pub(crate) fn expiry(timestamp: i64, ttl_seconds: Option<u64>) -> Option<i64> {
    ttl_seconds.map(|ttl| {
        let at = i128::from(timestamp) + i128::from(ttl);
        i64::try_from(at).unwrap_or(NEVER_EXPIRES)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::test_support::item;

    #[test]
    fn scope_names_and_session_id() {
        assert_eq!(Scope::Session("s1".into()).as_str(), "session");
        assert_eq!(Scope::GlobalReadonly.as_str(), "global_readonly");
        assert_eq!(Scope::GlobalWritable.as_str(), "global_writable");
        assert_eq!(Scope::Session("s1".into()).session_id(), Some("s1"));
        assert_eq!(Scope::GlobalReadonly.session_id(), None);
        assert_eq!(Scope::GlobalWritable.session_id(), None);
    }

    #[test]
    fn builders_and_expiry() {
        let it = item().with_ttl(60).with_confidence(0.5).with_hash("sha256:x");
        assert_eq!(it.ttl_seconds, Some(60));
        assert_eq!(it.confidence, Some(0.5));
        assert_eq!(it.hash.as_deref(), Some("sha256:x"));
        assert_eq!(it.expires_at(), Some(1_715_299_260));
        assert_eq!(item().expires_at(), None);
        assert_eq!(item().with_ttl(u64::MAX).expires_at(), Some(i64::MAX));
        let mut late = item().with_ttl(10);
        late.timestamp = i64::MAX - 5;
        assert_eq!(late.expires_at(), Some(i64::MAX));
        // Exact whenever the sum is an i64, whatever the TTL.
        late.timestamp = i64::MIN;
        late.ttl_seconds = Some(u64::MAX);
        assert_eq!(late.expires_at(), Some(i64::MAX));
        late.timestamp = -10;
        assert_eq!(late.expires_at(), Some(i64::MAX), "past it: never");
        late.ttl_seconds = Some(1 << 63);
        assert_eq!(late.expires_at(), Some(i64::MAX - 9));
        late.timestamp = crate::limits::TIMESTAMP_MAX;
        late.ttl_seconds = Some(u64::try_from(i64::MAX - crate::limits::TIMESTAMP_MAX).unwrap());
        assert_eq!(late.expires_at(), Some(i64::MAX), "the first TTL that reaches it");
    }
}
