//! [`Change`]: one entry of the change feed, and its JSON shape.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::item::Scope;

/// One change of the store, as the change feed ([`crate::Store::changes`]) and subscriptions
/// deliver it.
///
/// Every change but [`Change::Expired`] was committed by a batch: `seq` is that batch's sequence
/// number and `committed_at` the store's clock when it committed (UTC seconds; commit times never
/// decrease along the log). A batch of several items gives several changes with one `seq`, in the
/// batch's order.
///
/// JSON (`serde`): an object with `"change"` (`"added"`, `"deleted"`, `"expired"`,
/// `"session_closed"`) and the variant's fields; `kind` is written `"type"` and a scope as
/// `"scope"` with `"session_id"` for a session's scope, as in an item's JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// A new version of an id was added.
    Added {
        /// The committing batch's sequence number.
        seq: u64,
        /// When it committed, by the store's clock (UTC seconds).
        committed_at: i64,
        /// The item's id.
        id: String,
        /// The new version.
        version: String,
        /// `"sha256:"` and the hash of its canonical content.
        hash: String,
        /// Its type.
        kind: String,
        /// Its scope.
        scope: Scope,
        /// Its timestamp (UTC seconds).
        timestamp: i64,
    },
    /// An id was deleted.
    Deleted {
        /// The committing batch's sequence number.
        seq: u64,
        /// When it committed, by the store's clock (UTC seconds).
        committed_at: i64,
        /// The deleted id (for a session's item, the bare id; `scope` says whose it was).
        id: String,
        /// The scope of the version the delete ended.
        scope: Scope,
    },
    /// An id's latest version expired. Delivered to live subscriptions only: it is no commit and
    /// has no sequence number.
    Expired {
        /// The id.
        id: String,
        /// The version that expired.
        version: String,
        /// When it expired (its timestamp plus its TTL, UTC seconds).
        expired_at: i64,
    },
    /// A managed session was closed.
    SessionClosed {
        /// The committing batch's sequence number.
        seq: u64,
        /// When it committed, by the store's clock (UTC seconds).
        committed_at: i64,
        /// The session's id.
        session: String,
    },
}

impl Change {
    /// The committing batch's sequence number; `None` for [`Change::Expired`].
    #[must_use]
    pub fn seq(&self) -> Option<u64> {
        match self {
            Change::Added { seq, .. } | Change::Deleted { seq, .. } | Change::SessionClosed { seq, .. } => Some(*seq),
            Change::Expired { .. } => None,
        }
    }

    /// The id the change concerns; `None` for [`Change::SessionClosed`].
    #[must_use]
    pub fn id(&self) -> Option<&str> {
        match self {
            Change::Added { id, .. } | Change::Deleted { id, .. } | Change::Expired { id, .. } => Some(id),
            Change::SessionClosed { .. } => None,
        }
    }

    /// The change's compact JSON.
    #[must_use]
    pub fn to_json(&self) -> String {
        // Serializing plain strings and numbers into a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The JSON shape of a scope, as in an item: `"scope"` and, for a session's, `"session_id"`.
#[derive(Serialize, Deserialize)]
struct ScopeShape {
    scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
}

impl From<&Scope> for ScopeShape {
    fn from(scope: &Scope) -> Self {
        ScopeShape {
            scope: scope.as_str().to_owned(),
            session_id: scope.session_id().map(str::to_owned),
        }
    }
}

impl ScopeShape {
    fn into_scope<E: serde::de::Error>(self) -> Result<Scope, E> {
        match (self.scope.as_str(), self.session_id) {
            ("session", Some(id)) => Ok(Scope::Session(id)),
            ("global_readonly", None) => Ok(Scope::GlobalReadonly),
            ("global_writable", None) => Ok(Scope::GlobalWritable),
            ("session", None) => Err(E::custom("scope \"session\" needs a session_id")),
            (other, Some(_)) if other != "session" => {
                Err(E::custom("session_id is only allowed with scope \"session\""))
            }
            (other, _) => Err(E::custom(format!("unknown scope {other:?}"))),
        }
    }
}

/// The JSON shape of a change.
#[derive(Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
enum Shape {
    Added {
        seq: u64,
        committed_at: i64,
        id: String,
        version: String,
        hash: String,
        #[serde(rename = "type")]
        kind: String,
        #[serde(flatten)]
        scope: ScopeShape,
        timestamp: i64,
    },
    Deleted {
        seq: u64,
        committed_at: i64,
        id: String,
        #[serde(flatten)]
        scope: ScopeShape,
    },
    Expired {
        id: String,
        version: String,
        expired_at: i64,
    },
    SessionClosed {
        seq: u64,
        committed_at: i64,
        session: String,
    },
}

impl Serialize for Change {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let shape = match self.clone() {
            Change::Added {
                seq,
                committed_at,
                id,
                version,
                hash,
                kind,
                scope,
                timestamp,
            } => Shape::Added {
                seq,
                committed_at,
                id,
                version,
                hash,
                kind,
                scope: ScopeShape::from(&scope),
                timestamp,
            },
            Change::Deleted {
                seq,
                committed_at,
                id,
                scope,
            } => Shape::Deleted {
                seq,
                committed_at,
                id,
                scope: ScopeShape::from(&scope),
            },
            Change::Expired {
                id,
                version,
                expired_at,
            } => Shape::Expired {
                id,
                version,
                expired_at,
            },
            Change::SessionClosed {
                seq,
                committed_at,
                session,
            } => Shape::SessionClosed {
                seq,
                committed_at,
                session,
            },
        };
        shape.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Change {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match Shape::deserialize(deserializer)? {
            Shape::Added {
                seq,
                committed_at,
                id,
                version,
                hash,
                kind,
                scope,
                timestamp,
            } => Change::Added {
                seq,
                committed_at,
                id,
                version,
                hash,
                kind,
                scope: scope.into_scope()?,
                timestamp,
            },
            Shape::Deleted {
                seq,
                committed_at,
                id,
                scope,
            } => Change::Deleted {
                seq,
                committed_at,
                id,
                scope: scope.into_scope()?,
            },
            Shape::Expired {
                id,
                version,
                expired_at,
            } => Change::Expired {
                id,
                version,
                expired_at,
            },
            Shape::SessionClosed {
                seq,
                committed_at,
                session,
            } => Change::SessionClosed {
                seq,
                committed_at,
                session,
            },
        })
    }
}

/// One change of a published batch (or an expiry), with what a filter needs that the change does
/// not say.
#[derive(Debug, Clone)]
pub(crate) struct LiveChange {
    /// Shared by every subscriber it is queued to (each receives its own copy).
    pub(crate) change: Arc<Change>,
    /// The type of its item where the change does not carry it (`None`: not known).
    pub(crate) kind: Option<String>,
    /// The scope of an expired item (the other changes carry theirs).
    pub(crate) scope: Option<Scope>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(scope: Scope) -> Change {
        Change::Added {
            seq: 7,
            committed_at: 1_700_000_000,
            id: "prefs".into(),
            version: "v1".into(),
            hash: format!("sha256:{}", "ab".repeat(32)),
            kind: "user_preferences".into(),
            scope,
            timestamp: 1_699_999_999,
        }
    }

    #[test]
    fn json_names_the_change_and_writes_scope_as_items_do() {
        let json = added(Scope::Session("s1".into())).to_json();
        assert!(
            json.starts_with(r#"{"change":"added","seq":7,"committed_at":1700000000,"id":"prefs""#),
            "{json}"
        );
        assert!(
            json.contains(r#""type":"user_preferences","scope":"session","session_id":"s1","timestamp""#),
            "{json}"
        );
        let global = added(Scope::GlobalReadonly).to_json();
        assert!(
            global.contains(r#""scope":"global_readonly","timestamp""#) && !global.contains("session_id"),
            "{global}"
        );
        let expired = Change::Expired {
            id: "a".into(),
            version: "1".into(),
            expired_at: 5,
        };
        assert_eq!(
            expired.to_json(),
            r#"{"change":"expired","id":"a","version":"1","expired_at":5}"#
        );
        assert_eq!(expired.seq(), None);
    }

    #[test]
    fn every_variant_reads_back_from_its_json() {
        let changes = [
            added(Scope::Session("s1".into())),
            added(Scope::GlobalWritable),
            Change::Deleted {
                seq: 9,
                committed_at: 3,
                id: "x".into(),
                scope: Scope::Session("s2".into()),
            },
            Change::Expired {
                id: "a".into(),
                version: "1".into(),
                expired_at: 5,
            },
            Change::SessionClosed {
                seq: 10,
                committed_at: 4,
                session: "s2".into(),
            },
        ];
        for change in changes {
            let back: Change = serde_json::from_str(&change.to_json()).unwrap();
            assert_eq!(back, change);
        }
    }

    #[test]
    fn a_scope_without_its_session_is_refused() {
        let text = r#"{"change":"deleted","seq":1,"committed_at":0,"id":"x","scope":"session"}"#;
        let err = serde_json::from_str::<Change>(text).unwrap_err().to_string();
        assert!(err.contains("session_id"), "{err}");
        let text =
            r#"{"change":"deleted","seq":1,"committed_at":0,"id":"x","scope":"global_readonly","session_id":"s"}"#;
        assert!(serde_json::from_str::<Change>(text).is_err());
    }
}
