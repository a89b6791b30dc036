//! The JSON shape of an item: how it is written ([`ContextItem::to_json`], `Serialize`) and read
//! ([`ContextItem::from_json`], `Deserialize`), with errors that name the field at fault. Only the
//! shape is checked here; the field rules are in `validate`.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::{ContextItem, Scope};
use crate::error::{Error, Result};
use crate::limits;

impl ContextItem {
    /// Reads an item from its JSON shape.
    ///
    /// Only the shape is checked here (fields, their JSON types, the scope and `session_id`
    /// combination, a non-negative timestamp); the store checks the rest when the item is added.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the text is not JSON, not an object, lacks a required field, has an
    /// unknown or duplicate field, a field of the wrong JSON type, an unknown scope, `session_id`
    /// missing with `"scope": "session"` or present with a global scope, or a negative timestamp.
    /// `field` names the field at fault (`"json"` when no one field is), `reason` says why.
    pub fn from_json(text: &str) -> Result<ContextItem> {
        match serde_json::from_str::<ItemIn>(text) {
            Ok(raw) => raw.into_item().map_err(|e| Error::invalid(e.field, e.reason)),
            Err(err) => {
                let reason = err.to_string();
                let field = named_field(&reason)
                    .or_else(|| mistyped_field(text))
                    .unwrap_or_else(|| "json".to_owned());
                Err(Error::invalid(field, reason))
            }
        }
    }

    /// The item's compact JSON shape; absent optional fields are omitted.
    ///
    /// A non-finite confidence (which validation refuses) is written as `null`, as `serde_json` does.
    #[must_use]
    pub fn to_json(&self) -> String {
        // Serializing borrowed strings, numbers and a `Value` into a String cannot fail; the empty
        // fallback is never taken.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The JSON shape of an item, borrowed for output.
#[derive(Serialize)]
struct ItemOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    content: &'a Value,
    source: &'a str,
    timestamp: i64,
    version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash: Option<&'a str>,
    scope: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence: Option<f64>,
}

impl Serialize for ContextItem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ItemOut {
            id: &self.id,
            kind: &self.kind,
            content: &self.content,
            source: &self.source,
            timestamp: self.timestamp,
            version: &self.version,
            hash: self.hash.as_deref(),
            scope: self.scope.as_str(),
            session_id: self.scope.session_id(),
            ttl_seconds: self.ttl_seconds,
            confidence: self.confidence,
        }
        .serialize(serializer)
    }
}

/// The scope names of the JSON shape, exact and lowercase.
#[derive(Deserialize, Clone, Copy)]
enum ScopeTag {
    #[serde(rename = "session")]
    Session,
    #[serde(rename = "global_readonly")]
    GlobalReadonly,
    #[serde(rename = "global_writable")]
    GlobalWritable,
}

/// The JSON shape of an item, as read.
#[derive(Deserialize)]
#[serde(rename = "ContextItem", deny_unknown_fields)]
struct ItemIn {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    /// `None` only when the field is absent: `"content": null` is `Some(Value::Null)`.
    #[serde(default, deserialize_with = "present")]
    content: Option<Value>,
    source: String,
    timestamp: i64,
    version: String,
    #[serde(default)]
    hash: Option<String>,
    scope: ScopeTag,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    ttl_seconds: Option<u64>,
    #[serde(default)]
    confidence: Option<f64>,
}

/// Deserializes a field that is present, whatever its value (`null` included).
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// A shape error serde cannot express, naming its field.
struct ShapeError {
    field: &'static str,
    reason: String,
}

impl ItemIn {
    fn into_item(self) -> Result<ContextItem, ShapeError> {
        let Some(content) = self.content else {
            return Err(ShapeError {
                field: "content",
                reason: "missing field `content` (use `\"content\": null` for null content)".to_owned(),
            });
        };
        if self.timestamp < 0 {
            return Err(ShapeError {
                field: "timestamp",
                reason: format!(
                    "must be 0..={} (UTC seconds since the Unix epoch); found {}",
                    limits::TIMESTAMP_MAX,
                    self.timestamp
                ),
            });
        }
        let scope = match (self.scope, self.session_id) {
            (ScopeTag::Session, Some(sid)) => Scope::Session(sid),
            (ScopeTag::Session, None) => {
                return Err(ShapeError {
                    field: "session_id",
                    reason: "is required when \"scope\" is \"session\"".to_owned(),
                })
            }
            (ScopeTag::GlobalReadonly, None) => Scope::GlobalReadonly,
            (ScopeTag::GlobalWritable, None) => Scope::GlobalWritable,
            (tag @ (ScopeTag::GlobalReadonly | ScopeTag::GlobalWritable), Some(_)) => {
                let name = match tag {
                    ScopeTag::GlobalReadonly => "global_readonly",
                    _ => "global_writable",
                };
                return Err(ShapeError {
                    field: "session_id",
                    reason: format!("is allowed only with \"scope\": \"session\"; found it with \"scope\": \"{name}\""),
                });
            }
        };
        Ok(ContextItem {
            id: self.id,
            kind: self.kind,
            content,
            source: self.source,
            timestamp: self.timestamp,
            version: self.version,
            hash: self.hash,
            scope,
            ttl_seconds: self.ttl_seconds,
            confidence: self.confidence,
        })
    }
}

impl<'de> Deserialize<'de> for ContextItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ItemIn::deserialize(deserializer)?
            .into_item()
            .map_err(|e| D::Error::custom(format!("invalid {}: {}", e.field, e.reason)))
    }
}

/// The field a serde message names (`unknown field `ttl``, `missing field `id``, ...), if any.
fn named_field(message: &str) -> Option<String> {
    ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split('`').next())
        .map(str::to_owned)
}

/// The first field of a JSON object whose value has the wrong JSON type for its field, if any:
/// serde's own message for such an error does not name the field.
fn mistyped_field(text: &str) -> Option<String> {
    type Check = (&'static str, fn(&Value) -> bool);
    fn fails<T: serde::de::DeserializeOwned>(value: &Value) -> bool {
        T::deserialize(value).is_err()
    }
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    let checks: [Check; 10] = [
        ("id", fails::<String>),
        ("type", fails::<String>),
        ("source", fails::<String>),
        ("timestamp", fails::<i64>),
        ("version", fails::<String>),
        ("hash", fails::<Option<String>>),
        ("scope", fails::<ScopeTag>),
        ("session_id", fails::<Option<String>>),
        ("ttl_seconds", fails::<Option<u64>>),
        ("confidence", fails::<Option<f64>>),
    ];
    checks.iter().find_map(|(field, check)| match map.get(*field) {
        Some(value) if check(value) => Some((*field).to_owned()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::hash::format_hash;
    use crate::item::test_support::{invalid_field, item, reason};
    use serde_json::json;

    fn json_field(text: &str) -> String {
        invalid_field(ContextItem::from_json(text))
    }

    const BASE: &str =
        r#""id":"ch3","type":"document_chunk","content":{"text":"hi"},"source":"s","timestamp":1,"version":"1""#;

    fn with(extra: &str) -> String {
        format!("{{{BASE},{extra}}}")
    }

    #[test]
    fn json_roundtrip() {
        let items = [
            item(),
            item()
                .with_ttl(60)
                .with_confidence(0.25)
                .with_hash(format_hash(&[1; 32])),
            {
                let mut i = item();
                i.scope = Scope::Session("s1".into());
                i.content = json!(null);
                i
            },
            {
                let mut i = item();
                i.scope = Scope::GlobalWritable;
                i.content = json!({"k": [1.5, "é", {"n": -3}]});
                i
            },
        ];
        for it in items {
            let text = it.to_json();
            assert_eq!(ContextItem::from_json(&text).expect("reads back"), it, "{text}");
            let via_serde: ContextItem = serde_json::from_str(&text).expect("serde reads back");
            assert_eq!(via_serde, it);
        }
    }

    #[test]
    fn to_json_shape_omits_absent_fields() {
        assert_eq!(
            item().to_json(),
            r#"{"id":"ch3","type":"document_chunk","content":{"text":"hello"},"source":"crm_export","timestamp":1715299200,"version":"20240510.1","scope":"global_readonly"}"#
        );
        let mut it = item().with_ttl(5).with_confidence(1.0).with_hash("sha256:00");
        it.scope = Scope::Session("s1".into());
        assert_eq!(
            it.to_json(),
            r#"{"id":"ch3","type":"document_chunk","content":{"text":"hello"},"source":"crm_export","timestamp":1715299200,"version":"20240510.1","hash":"sha256:00","scope":"session","session_id":"s1","ttl_seconds":5,"confidence":1.0}"#
        );
    }

    #[test]
    fn from_json_reads_every_field() {
        let it = ContextItem::from_json(&with(
            r#""hash":"sha256:ab","scope":"session","session_id":"s1","ttl_seconds":7,"confidence":0.9"#,
        ))
        .expect("valid");
        assert_eq!(it.id, "ch3");
        assert_eq!(it.kind, "document_chunk");
        assert_eq!(it.content, json!({"text": "hi"}));
        assert_eq!(it.source, "s");
        assert_eq!(it.timestamp, 1);
        assert_eq!(it.version, "1");
        assert_eq!(it.hash.as_deref(), Some("sha256:ab"));
        assert_eq!(it.scope, Scope::Session("s1".into()));
        assert_eq!(it.ttl_seconds, Some(7));
        assert_eq!(it.confidence, Some(0.9));
    }

    #[test]
    fn unknown_field_is_named() {
        let text = with(r#""scope":"global_readonly","ttl":5"#);
        assert_eq!(json_field(&text), "ttl");
        assert!(reason(ContextItem::from_json(&text)).contains("unknown field `ttl`"));
    }

    #[test]
    fn missing_field_is_named() {
        let text = r#"{"type":"document_chunk","content":1,"source":"s","timestamp":1,"version":"1","scope":"global_readonly"}"#;
        assert_eq!(json_field(text), "id");
        assert_eq!(json_field(&format!("{{{BASE}}}")), "scope");
    }

    #[test]
    fn duplicate_field_is_named() {
        assert_eq!(
            json_field(&with(r#""scope":"global_readonly","version":"2""#)),
            "version"
        );
    }

    #[test]
    fn scope_strings_are_exact() {
        assert_eq!(json_field(&with(r#""scope":"Session","session_id":"s1""#)), "scope");
        assert_eq!(json_field(&with(r#""scope":"global""#)), "scope");
        assert_eq!(json_field(&with(r#""scope":"GLOBAL_READONLY""#)), "scope");
        assert!(ContextItem::from_json(&with(r#""scope":"global_writable""#)).is_ok());
    }

    #[test]
    fn session_id_rules_in_json() {
        assert_eq!(json_field(&with(r#""scope":"session""#)), "session_id");
        assert_eq!(
            json_field(&with(r#""scope":"session","session_id":null"#)),
            "session_id"
        );
        assert_eq!(
            json_field(&with(r#""scope":"global_readonly","session_id":"s1""#)),
            "session_id"
        );
        assert_eq!(
            json_field(&with(r#""scope":"global_writable","session_id":"s1""#)),
            "session_id"
        );
        let it = ContextItem::from_json(&with(r#""scope":"global_readonly","session_id":null"#))
            .expect("null session_id counts as absent");
        assert_eq!(it.scope, Scope::GlobalReadonly);
    }

    #[test]
    fn content_missing_vs_null() {
        let missing =
            r#"{"id":"a","type":"message","source":"s","timestamp":1,"version":"1","scope":"global_readonly"}"#;
        assert_eq!(json_field(missing), "content");
        let null = r#"{"id":"a","type":"message","content":null,"source":"s","timestamp":1,"version":"1","scope":"global_readonly"}"#;
        assert_eq!(ContextItem::from_json(null).expect("null content").content, Value::Null);
    }

    #[test]
    fn negative_numbers_refused_in_json() {
        assert_eq!(
            json_field(&with(r#""scope":"global_readonly","ttl_seconds":-1"#)),
            "ttl_seconds"
        );
        let neg_ts = r#"{"id":"a","type":"message","content":1,"source":"s","timestamp":-1,"version":"1","scope":"global_readonly"}"#;
        assert_eq!(json_field(neg_ts), "timestamp");
    }

    #[test]
    fn wrong_types_are_named() {
        assert_eq!(
            json_field(&with(r#""scope":"global_readonly","confidence":"high""#)),
            "confidence"
        );
        assert_eq!(
            json_field(&with(r#""scope":"global_readonly","ttl_seconds":1.5"#)),
            "ttl_seconds"
        );
        let text = r#"{"id":5,"type":"message","content":1,"source":"s","timestamp":1,"version":"1","scope":"global_readonly"}"#;
        assert_eq!(json_field(text), "id");
        let text = r#"{"id":"a","type":"message","content":1,"source":"s","timestamp":"now","version":"1","scope":"global_readonly"}"#;
        assert_eq!(json_field(text), "timestamp");
    }

    #[test]
    fn malformed_json_is_field_json() {
        for text in ["", "{", "[]", "5", "null", "{\"id\":}", "not json"] {
            assert_eq!(json_field(text), "json", "{text:?}");
        }
    }

    #[test]
    fn serde_deserialize_reports_shape_errors() {
        let err = serde_json::from_str::<ContextItem>(&with(r#""scope":"session""#)).expect_err("session without id");
        assert!(err.to_string().contains("session_id"), "{err}");
    }
}
