//! The context item: its fields, its JSON shape, its canonical content and hash, the type registry,
//! and the validation every item passes before it is stored.

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::limits;

/// Bytes of a type name, at the most.
const TYPE_NAME_BYTES_MAX: usize = 64;

/// The size limit, in bytes, of a compiled id pattern.
const ID_PATTERN_COMPILED_BYTES_MAX: usize = 1 << 20;

/// The prefix of every hash string.
const HASH_PREFIX: &str = "sha256:";

/// The characters an id, a session id or a snapshot name may hold, as said in error messages.
const NAME_CHARS: &str = "[A-Za-z0-9._:-]";

/// The characters a version may hold, as said in error messages.
const VERSION_CHARS: &str = "[A-Za-z0-9._-]";

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
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Session(_) => "session",
            Scope::GlobalReadonly => "global_readonly",
            Scope::GlobalWritable => "global_writable",
        }
    }

    /// The session id of a [`Scope::Session`], `None` for the global scopes.
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

    /// When the item expires: `timestamp + ttl_seconds` (saturating), or `None` without a TTL.
    #[must_use]
    pub fn expires_at(&self) -> Option<i64> {
        self.ttl_seconds
            .map(|ttl| self.timestamp.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX)))
    }
}

// ---------------------------------------------------------------------------------------------
// JSON shape
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Canonical content and hashes
// ---------------------------------------------------------------------------------------------

/// One step of the canonical writer.
enum Step<'a> {
    Value(&'a Value),
    Key(&'a str),
    Raw(&'static [u8]),
}

/// The canonical bytes of a JSON value: compact JSON with every object's keys sorted by their UTF-8
/// bytes (at every depth), no whitespace, non-ASCII characters not escaped, strings and numbers
/// exactly as `serde_json` writes them.
///
/// The result does not depend on `serde_json`'s `preserve_order` feature. Nesting depth is not
/// limited by the call stack.
#[must_use]
pub fn canonical_json(value: &Value) -> Vec<u8> {
    // Sized for a typical item's content: growing from empty took a handful of reallocations.
    let mut out = Vec::with_capacity(512);
    let mut stack = Vec::with_capacity(32);
    stack.push(Step::Value(value));
    while let Some(step) = stack.pop() {
        match step {
            Step::Raw(bytes) => out.extend_from_slice(bytes),
            Step::Key(key) => write_json_str(&mut out, key),
            Step::Value(Value::Null) => out.extend_from_slice(b"null"),
            Step::Value(Value::Bool(true)) => out.extend_from_slice(b"true"),
            Step::Value(Value::Bool(false)) => out.extend_from_slice(b"false"),
            Step::Value(Value::Number(n)) => write_scalar(&mut out, n),
            Step::Value(Value::String(s)) => write_json_str(&mut out, s),
            Step::Value(Value::Array(items)) => {
                out.push(b'[');
                stack.push(Step::Raw(b"]"));
                for (i, item) in items.iter().enumerate().rev() {
                    stack.push(Step::Value(item));
                    if i > 0 {
                        stack.push(Step::Raw(b","));
                    }
                }
            }
            Step::Value(Value::Object(map)) => {
                out.push(b'{');
                stack.push(Step::Raw(b"}"));
                // Without serde_json's `preserve_order` the map iterates in key order already (a
                // `BTreeMap` of `String`s orders them by their bytes): no copy to sort then.
                if map.keys().is_sorted_by(|a, b| a.as_bytes() < b.as_bytes()) {
                    push_entries(&mut stack, map.iter());
                } else {
                    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                    entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                    push_entries(&mut stack, entries.into_iter());
                }
            }
        }
    }
    out
}

/// Pushes an object's `entries`, given in key order, so that they pop in that order with their
/// separators.
fn push_entries<'a>(
    stack: &mut Vec<Step<'a>>,
    entries: impl DoubleEndedIterator<Item = (&'a String, &'a Value)> + ExactSizeIterator,
) {
    for (i, (key, item)) in entries.enumerate().rev() {
        stack.push(Step::Value(item));
        stack.push(Step::Raw(b":"));
        stack.push(Step::Key(key));
        if i > 0 {
            stack.push(Step::Raw(b","));
        }
    }
}

/// Writes a string or a number as `serde_json` writes it.
pub(crate) fn write_scalar<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing a string or a number into a Vec cannot fail; nothing to handle.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// What `serde_json` writes after a backslash for `byte`: a letter for the bytes below 0x20 with a
/// short escape, `u` for the other bytes below 0x20 (the `\u00XX` form), the byte itself for `"`
/// and `\`; 0 for a byte written as it is.
fn json_escape(byte: u8) -> u8 {
    match byte {
        0x08 => b'b',
        0x09 => b't',
        0x0a => b'n',
        0x0c => b'f',
        0x0d => b'r',
        0x00..=0x1f => b'u',
        b'"' | b'\\' => byte,
        _ => 0,
    }
}

/// Whether any of the 8 bytes of `word` is below 0x20, a `"` or a `\`. Each test is the exact
/// "some byte is zero / below n" test on a whole word: a clean word costs a few instructions
/// instead of eight table lookups.
fn word_needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH != 0;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGH != 0;
    below_space || has_zero_byte(word ^ (ONES * u64::from(b'"'))) || has_zero_byte(word ^ (ONES * u64::from(b'\\')))
}

/// Writes `text` as a JSON string, byte for byte as `serde_json` does (see [`json_escape`]; other
/// bytes, 0x7f and non-ASCII included, as they are), skipping runs that need no escape 8 bytes at
/// a time. Strings are most of a content's bytes, and `serde_json` looks at them one by one.
pub(crate) fn write_json_str(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let (mut run, mut at) = (0, 0);
    while at < bytes.len() {
        if let Some(word) = bytes.get(at..at + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
            if !word_needs_escape(u64::from_le_bytes(word)) {
                at += 8;
                continue;
            }
        }
        let byte = bytes.get(at).copied().unwrap_or(0);
        let escape = json_escape(byte);
        if escape != 0 {
            out.extend_from_slice(bytes.get(run..at).unwrap_or_default());
            if escape == b'u' {
                let (high, low) = (usize::from(byte >> 4), usize::from(byte & 0x0f));
                out.extend_from_slice(b"\\u00");
                out.push(HEX.get(high).copied().unwrap_or(b'0'));
                out.push(HEX.get(low).copied().unwrap_or(b'0'));
            } else {
                out.extend_from_slice(&[b'\\', escape]);
            }
            run = at + 1;
        }
        at += 1;
    }
    out.extend_from_slice(bytes.get(run..).unwrap_or_default());
    out.push(b'"');
}

/// The SHA-256 of canonical content bytes.
pub(crate) fn content_hash(canonical: &[u8]) -> [u8; 32] {
    Sha256::digest(canonical).into()
}

/// The lowercase hex digit of a nibble (a value below 16).
fn hex_digit(nibble: u8) -> u8 {
    if nibble < 10 {
        b'0' + nibble
    } else {
        b'a' - 10 + nibble
    }
}

/// The 64 lowercase hex digits of a hash.
fn hex_digits(hash: &[u8; 32]) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (pair, byte) in out.chunks_exact_mut(2).zip(hash) {
        pair.copy_from_slice(&[hex_digit(byte >> 4), hex_digit(byte & 0x0f)]);
    }
    out
}

/// A hash as written in items: `"sha256:"` + 64 lowercase hex digits.
pub(crate) fn format_hash(hash: &[u8; 32]) -> String {
    let mut text = String::with_capacity(HASH_PREFIX.len() + 64);
    text.push_str(HASH_PREFIX);
    // Hex digits are ASCII: the conversion cannot fail, and the fallback is never taken.
    text.push_str(std::str::from_utf8(&hex_digits(hash)).unwrap_or_default());
    text
}

/// Appends a hash as a JSON string, `"sha256:<64 hex>"`, exactly as `serde_json` writes
/// [`format_hash`]'s text (nothing in it needs escaping).
pub(crate) fn write_hash_json(out: &mut Vec<u8>, hash: &[u8; 32]) {
    out.push(b'"');
    out.extend_from_slice(HASH_PREFIX.as_bytes());
    out.extend_from_slice(&hex_digits(hash));
    out.push(b'"');
}

/// The value of a lowercase hex digit; 0xff for any other byte.
fn hex_value(byte: u8) -> u8 {
    match byte {
        b'0'..=b'9' => byte - b'0',
        b'a'..=b'f' => byte - b'a' + 10,
        _ => 0xff,
    }
}

/// The 32 bytes written by 64 lowercase hex digits, or `None` if any byte is not one.
fn decode_hex_digits(hex: &[u8]) -> Option<[u8; 32]> {
    let mut hash = [0u8; 32];
    let mut bad = hex.len() != 64;
    for (byte, pair) in hash.iter_mut().zip(hex.chunks_exact(2)) {
        let value = |at: usize| hex_value(pair.get(at).copied().unwrap_or(0));
        let (high, low) = (value(0), value(1));
        bad |= (high | low) > 0x0f;
        *byte = (high << 4) | (low & 0x0f);
    }
    (!bad).then_some(hash)
}

/// Reads a hash written as `"sha256:"` + exactly 64 lowercase hex digits.
///
/// # Errors
///
/// [`Error::Invalid`] with field `"hash"` for anything else.
pub(crate) fn parse_hash(text: &str) -> Result<[u8; 32]> {
    let refuse = |found: String| {
        Error::invalid(
            "hash",
            format!("must be \"sha256:\" followed by exactly 64 lowercase hex digits [0-9a-f]; {found}"),
        )
    };
    let Some(hex) = text.strip_prefix(HASH_PREFIX) else {
        return Err(refuse(format!(
            "found {:?}, which does not start with \"sha256:\"",
            short(text)
        )));
    };
    if hex.len() != 64 {
        return Err(refuse(format!("found {} bytes after \"sha256:\"", hex.len())));
    }
    if let Some(hash) = decode_hex_digits(hex.as_bytes()) {
        return Ok(hash);
    }
    // Not all lowercase hex digits: find the first bad one for the message.
    let mut hash = [0u8; 32];
    let mut nibbles = hex.bytes().enumerate().map(|(i, b)| match b {
        b'0'..=b'9' => Ok(b - b'0'),
        b'a'..=b'f' => Ok(b - b'a' + 10),
        _ => Err(i),
    });
    for byte in &mut hash {
        let (Some(high), Some(low)) = (nibbles.next(), nibbles.next()) else {
            return Err(refuse("found too few hex digits".to_owned()));
        };
        match (high, low) {
            (Ok(high), Ok(low)) => *byte = (high << 4) | low,
            (Err(i), _) | (_, Err(i)) => {
                let c = hex.get(i..).and_then(|s| s.chars().next()).unwrap_or('?');
                return Err(refuse(format!(
                    "found {} at byte {} of the hex digits",
                    describe_char(c),
                    i
                )));
            }
        }
    }
    Ok(hash)
}

// ---------------------------------------------------------------------------------------------
// Field rules
// ---------------------------------------------------------------------------------------------

/// The first 40 characters of a string, for error messages.
fn short(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(40).collect();
    if chars.next().is_some() {
        format!("{head}...")
    } else {
        head
    }
}

/// A character as named in error messages.
fn describe_char(c: char) -> String {
    if c == ' ' {
        "a space".to_owned()
    } else if c.is_control() || c.is_whitespace() {
        format!("the control or space character U+{:04X}", u32::from(c))
    } else {
        format!("{c:?}")
    }
}

/// Checks a string made of 1..=`max` bytes of ASCII characters accepted by `allowed`.
fn check_chars(field: &str, value: &str, max: usize, charset: &str, allowed: fn(u8) -> bool) -> Result<()> {
    // The common case, checked without building any message: ids are checked on every resolve.
    if !value.is_empty() && value.len() <= max && value.bytes().all(allowed) {
        return Ok(());
    }
    let rule = format!("must be 1..={max} bytes of {charset}");
    if value.is_empty() {
        return Err(Error::invalid(field, format!("{rule}; found an empty string")));
    }
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("{rule}; found {} bytes, starting {:?}", value.len(), short(value)),
        ));
    }
    if let Some((at, c)) = value.char_indices().find(|&(_, c)| !u8::try_from(c).is_ok_and(allowed)) {
        return Err(Error::invalid(
            field,
            format!("{rule}; found {} at byte {at}", describe_char(c)),
        ));
    }
    Ok(())
}

/// Checks a name by the id rules: 1..=128 bytes of `[A-Za-z0-9._:-]`. Errors name `field`
/// (`id`, `session_id`, a snapshot name, ...).
///
/// # Errors
///
/// [`Error::Invalid`] with `field` when the rules are not met.
pub(crate) fn validate_name(field: &str, value: &str) -> Result<()> {
    check_chars(field, value, limits::ID_BYTES_MAX, NAME_CHARS, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
    })
}

/// Checks a version: 1..=64 bytes of `[A-Za-z0-9._-]`.
///
/// # Errors
///
/// [`Error::Invalid`] with field `"version"` when the rules are not met.
pub(crate) fn validate_version(value: &str) -> Result<()> {
    check_chars("version", value, limits::VERSION_BYTES_MAX, VERSION_CHARS, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
    })
}

/// Checks a source: 1..=256 bytes of UTF-8 without control characters.
fn validate_source(value: &str) -> Result<()> {
    if !value.is_empty() && value.len() <= limits::SOURCE_BYTES_MAX && !value.chars().any(char::is_control) {
        return Ok(());
    }
    let rule = format!(
        "must be 1..={} bytes of UTF-8 without control characters",
        limits::SOURCE_BYTES_MAX
    );
    if value.is_empty() {
        return Err(Error::invalid("source", format!("{rule}; found an empty string")));
    }
    if value.len() > limits::SOURCE_BYTES_MAX {
        return Err(Error::invalid(
            "source",
            format!("{rule}; found {} bytes, starting {:?}", value.len(), short(value)),
        ));
    }
    if let Some((at, c)) = value.char_indices().find(|&(_, c)| c.is_control()) {
        return Err(Error::invalid(
            "source",
            format!("{rule}; found {} at byte {at}", describe_char(c)),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

/// A type of item to register, with an optional pattern its ids must match.
///
/// ```
/// use ctxlog::TypeSpec;
///
/// let spec = TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9.a-z]+$");
/// assert_eq!(spec.name(), "legal_clause");
/// ```
///
/// A type name is 1..=64 bytes of `[a-z0-9_]` starting with a letter. The pattern is a
/// [`regex`](https://docs.rs/regex) expression of at most 1024 bytes; an id matches when the
/// pattern matches somewhere in it, so anchor it with `^...$` to match the whole id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeSpec {
    name: String,
    pattern: Option<String>,
}

impl TypeSpec {
    /// A type without an id pattern.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        TypeSpec {
            name: name.into(),
            pattern: None,
        }
    }

    /// The same type, whose ids must match `pattern`.
    #[must_use]
    pub fn id_pattern(mut self, pattern: impl Into<String>) -> Self {
        self.pattern = Some(pattern.into());
        self
    }

    /// The type's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The type's id pattern, if it has one.
    #[must_use]
    pub fn pattern(&self) -> Option<&str> {
        self.pattern.as_deref()
    }
}

/// The types that are always registered.
pub(crate) const BUILTIN_TYPES: [&str; 7] = [
    "document_chunk",
    "tool_result",
    "user_profile",
    "user_feedback",
    "product_document",
    "monitoring_metric",
    "message",
];

/// The registered types: the built-ins (always, implicitly) and the custom ones.
#[derive(Clone, Debug, Default)]
pub(crate) struct TypeRegistry {
    /// Custom types by name, with their compiled pattern.
    custom: BTreeMap<String, (TypeSpec, Option<regex::Regex>)>,
}

impl TypeRegistry {
    /// Checks a spec on its own (name and pattern) and compiles its pattern.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with field `"type"` for a bad name, `"id_pattern"` for a pattern that is
    /// too long or does not compile.
    pub(crate) fn validate_spec(spec: &TypeSpec) -> Result<Option<regex::Regex>> {
        let name = spec.name();
        let rule =
            format!("a type name must be 1..={TYPE_NAME_BYTES_MAX} bytes of [a-z0-9_] starting with a letter a-z");
        if name.is_empty() {
            return Err(Error::invalid("type", format!("{rule}; found an empty string")));
        }
        if name.len() > TYPE_NAME_BYTES_MAX {
            return Err(Error::invalid(
                "type",
                format!("{rule}; found {} bytes, starting {:?}", name.len(), short(name)),
            ));
        }
        if !name.as_bytes().first().is_some_and(u8::is_ascii_lowercase) {
            return Err(Error::invalid(
                "type",
                format!("{rule}; found {name:?}, which does not start with a letter a-z"),
            ));
        }
        if let Some((at, c)) = name
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        {
            return Err(Error::invalid(
                "type",
                format!("{rule}; found {} at byte {at}", describe_char(c)),
            ));
        }
        let Some(pattern) = spec.pattern() else {
            return Ok(None);
        };
        if pattern.len() > limits::ID_PATTERN_BYTES_MAX {
            return Err(Error::invalid(
                "id_pattern",
                format!(
                    "must be at most {} bytes; found {} bytes",
                    limits::ID_PATTERN_BYTES_MAX,
                    pattern.len()
                ),
            ));
        }
        regex::RegexBuilder::new(pattern)
            .size_limit(ID_PATTERN_COMPILED_BYTES_MAX)
            .build()
            .map(Some)
            .map_err(|e| {
                Error::invalid(
                    "id_pattern",
                    format!("must be a valid regular expression (regex crate syntax): {e}"),
                )
            })
    }

    /// Whether `spec` may be registered: `Ok(true)` if it is new, `Ok(false)` if the same spec is
    /// already registered (registering it again changes nothing).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the spec is malformed (see [`TypeRegistry::validate_spec`]), or with
    /// field `"type"` when it names a built-in type or a type registered with another pattern.
    pub(crate) fn check_register(&self, spec: &TypeSpec) -> Result<bool> {
        Self::validate_spec(spec)?;
        self.check_known(spec)
    }

    /// [`TypeRegistry::check_register`] once the spec itself is known to be valid.
    fn check_known(&self, spec: &TypeSpec) -> Result<bool> {
        let name = spec.name();
        if BUILTIN_TYPES.contains(&name) {
            return Err(Error::invalid(
                "type",
                format!("{name:?} is a built-in type; register a type under another name"),
            ));
        }
        match self.custom.get(name) {
            None => Ok(true),
            Some((existing, _)) if existing == spec => Ok(false),
            Some((existing, _)) => Err(Error::invalid(
                "type",
                format!(
                    "{name:?} is already registered with {}; a type's id pattern cannot change (asked for {})",
                    describe_pattern(existing.pattern()),
                    describe_pattern(spec.pattern())
                ),
            )),
        }
    }

    /// Registers `spec` (a no-op if the same spec is registered already).
    ///
    /// # Errors
    ///
    /// The errors of [`TypeRegistry::check_register`]; the registry is then unchanged.
    pub(crate) fn insert(&mut self, spec: TypeSpec) -> Result<()> {
        let regex = Self::validate_spec(&spec)?;
        if self.check_known(&spec)? {
            self.custom.insert(spec.name.clone(), (spec, regex));
        }
        Ok(())
    }

    /// Checks that `kind` is registered and that `id` matches its pattern, if it has one.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownType`] listing every known type, or [`Error::Invalid`] with field `"id"` when
    /// the id does not match the type's pattern.
    pub(crate) fn check_item(&self, kind: &str, id: &str) -> Result<()> {
        if BUILTIN_TYPES.contains(&kind) {
            return Ok(());
        }
        match self.custom.get(kind) {
            None => Err(Error::UnknownType {
                kind: kind.to_owned(),
                known: self.known(),
                index: None,
            }),
            Some((spec, Some(regex))) if !regex.is_match(id) => Err(Error::invalid(
                "id",
                format!(
                    "must match the id pattern {:?} of type {kind:?}; found {id:?}",
                    spec.pattern().unwrap_or_default()
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Every known type name (built-in and custom), sorted.
    pub(crate) fn known(&self) -> Vec<String> {
        let mut names: Vec<String> = BUILTIN_TYPES
            .iter()
            .map(|name| (*name).to_owned())
            .chain(self.custom.keys().cloned())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// The custom (registered, not built-in) types, sorted by name.
impl TypeRegistry {
    pub(crate) fn custom(&self) -> Vec<TypeSpec> {
        self.custom.values().map(|(spec, _)| spec.clone()).collect()
    }
}

/// A pattern as named in error messages.
fn describe_pattern(pattern: Option<&str>) -> String {
    match pattern {
        Some(p) => format!("id pattern {p:?}"),
        None => "no id pattern".to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// Checks every rule of an item's fields, computes its canonical content and the content's SHA-256,
/// and checks a declared hash against it. Returns the canonical bytes and the hash. Errors carry
/// `index: None`; the caller adds the batch position.
///
/// # Errors
///
/// [`Error::Invalid`] naming the field at fault, [`Error::UnknownType`], [`Error::TooLarge`] with
/// `what` = `"content"` when the canonical content exceeds `max_content_bytes`, or
/// [`Error::HashMismatch`] when a well-formed declared hash does not match the content.
pub(crate) fn check_item(
    item: &ContextItem,
    registry: &TypeRegistry,
    max_content_bytes: usize,
) -> Result<(Vec<u8>, [u8; 32])> {
    validate_name("id", &item.id)?;
    registry.check_item(&item.kind, &item.id)?;
    validate_source(&item.source)?;
    if !(0..=limits::TIMESTAMP_MAX).contains(&item.timestamp) {
        return Err(Error::invalid(
            "timestamp",
            format!(
                "must be 0..={} (UTC seconds since the Unix epoch, up to 9999-12-31T23:59:59Z); found {}",
                limits::TIMESTAMP_MAX,
                item.timestamp
            ),
        ));
    }
    validate_version(&item.version)?;
    if let Scope::Session(sid) = &item.scope {
        validate_name("session_id", sid)?;
    }
    if item.ttl_seconds == Some(0) {
        return Err(Error::invalid("ttl_seconds", "must be at least 1 when given; found 0"));
    }
    if let Some(c) = item.confidence {
        if !(c.is_finite() && (0.0..=1.0).contains(&c)) {
            return Err(Error::invalid(
                "confidence",
                format!("must be a finite number in 0.0..=1.0; found {c}"),
            ));
        }
    }
    let declared = match &item.hash {
        Some(text) => Some(parse_hash(text)?),
        None => None,
    };
    let canonical = canonical_json(&item.content);
    if canonical.len() > max_content_bytes {
        return Err(Error::TooLarge {
            what: "content".to_owned(),
            len: u64::try_from(canonical.len()).unwrap_or(u64::MAX),
            max: u64::try_from(max_content_bytes).unwrap_or(u64::MAX),
            index: None,
        });
    }
    let hash = content_hash(&canonical);
    // The record keeps the hash as bytes, and nothing reads the item's text form after this: the
    // text is built only for the error that shows it.
    if declared.is_some_and(|declared| declared != hash) {
        return Err(Error::HashMismatch {
            id: item.id.clone(),
            declared: item.hash.clone().unwrap_or_default(),
            computed: format_hash(&hash),
            index: None,
        });
    }
    Ok((canonical, hash))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item() -> ContextItem {
        ContextItem::new(
            "ch3",
            "document_chunk",
            json!({"text": "hello"}),
            "crm_export",
            1_715_299_200,
            "20240510.1",
            Scope::GlobalReadonly,
        )
    }

    fn validate(item: ContextItem) -> Result<(Vec<u8>, [u8; 32])> {
        check_item(&item, &TypeRegistry::default(), limits::CONTENT_BYTES_DEFAULT)
    }

    fn invalid_field(result: Result<impl std::fmt::Debug>) -> String {
        match result {
            Err(Error::Invalid { field, index: None, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn json_field(text: &str) -> String {
        invalid_field(ContextItem::from_json(text))
    }

    fn reason(result: Result<impl std::fmt::Debug>) -> String {
        match result {
            Err(Error::Invalid { reason, .. }) => reason,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    const BASE: &str =
        r#""id":"ch3","type":"document_chunk","content":{"text":"hi"},"source":"s","timestamp":1,"version":"1""#;

    fn with(extra: &str) -> String {
        format!("{{{BASE},{extra}}}")
    }

    // ---- scope ----

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
    }

    // ---- id, version, source ----

    #[test]
    fn id_length_bounds() {
        assert!(validate_name("id", &"a".repeat(128)).is_ok());
        let r = validate_name("id", &"a".repeat(129));
        assert!(reason(validate_name("id", &"a".repeat(129))).contains("found 129 bytes"));
        assert_eq!(invalid_field(r), "id");
        assert!(reason(validate_name("id", "")).contains("empty"));
        assert!(validate_name("id", "a").is_ok());
    }

    #[test]
    fn id_characters() {
        assert!(validate_name("id", "Az09._:-").is_ok());
        let r = reason(validate_name("id", "abc def"));
        assert_eq!(r, "must be 1..=128 bytes of [A-Za-z0-9._:-]; found a space at byte 3");
        for bad in ["a/b", "a@b", "é", "a\0", "a\n", "a+b", "a b"] {
            assert!(validate_name("id", bad).is_err(), "{bad:?} accepted");
        }
        assert!(reason(validate_name("id", "ab/")).contains("'/' at byte 2"));
        assert!(reason(validate_name("id", "a\n")).contains("U+000A at byte 1"));
        assert_eq!(invalid_field(validate_name("session_id", "x y")), "session_id");
    }

    #[test]
    fn version_rules() {
        assert!(validate_version("20240512.1_a-B").is_ok());
        assert!(validate_version(&"v".repeat(64)).is_ok());
        assert_eq!(invalid_field(validate_version(&"v".repeat(65))), "version");
        assert_eq!(invalid_field(validate_version("")), "version");
        let r = reason(validate_version("1:2"));
        assert!(r.contains("[A-Za-z0-9._-]") && r.contains("':' at byte 1"), "{r}");
    }

    #[test]
    fn source_rules() {
        let ok = |s: &str| {
            validate({
                let mut i = item();
                i.source = s.into();
                i
            })
        };
        assert!(ok("crm export é").is_ok());
        assert!(ok(&"s".repeat(256)).is_ok());
        assert_eq!(invalid_field(ok(&"s".repeat(257))), "source");
        assert_eq!(invalid_field(ok("")), "source");
        let r = reason(ok("a\tb"));
        assert!(r.contains("without control characters") && r.contains("byte 1"), "{r}");
    }

    // ---- item validation ----

    #[test]
    fn id_validated_in_items() {
        let mut it = item();
        it.id = "a".repeat(129);
        assert_eq!(invalid_field(validate(it)), "id");
        let mut it = item();
        it.id = "a".repeat(128);
        assert!(validate(it).is_ok());
    }

    #[test]
    fn timestamp_bounds() {
        let at = |t: i64| {
            validate({
                let mut i = item();
                i.timestamp = t;
                i
            })
        };
        assert!(at(0).is_ok());
        assert!(at(limits::TIMESTAMP_MAX).is_ok());
        assert_eq!(invalid_field(at(limits::TIMESTAMP_MAX + 1)), "timestamp");
        assert_eq!(invalid_field(at(-1)), "timestamp");
        assert_eq!(invalid_field(at(i64::MIN)), "timestamp");
    }

    #[test]
    fn version_validated_in_items() {
        let mut it = item();
        it.version = "1 2".into();
        assert_eq!(invalid_field(validate(it)), "version");
    }

    #[test]
    fn session_scope_rules() {
        let mut it = item();
        it.scope = Scope::Session("s1:a".into());
        assert!(validate(it.clone()).is_ok());
        it.scope = Scope::Session(String::new());
        assert_eq!(invalid_field(validate(it.clone())), "session_id");
        it.scope = Scope::Session("s 1".into());
        assert_eq!(invalid_field(validate(it.clone())), "session_id");
        it.scope = Scope::Session("s".repeat(129));
        assert_eq!(invalid_field(validate(it)), "session_id");
    }

    #[test]
    fn ttl_rules() {
        assert_eq!(invalid_field(validate(item().with_ttl(0))), "ttl_seconds");
        assert!(validate(item().with_ttl(1)).is_ok());
        assert!(validate(item().with_ttl(u64::MAX)).is_ok());
    }

    #[test]
    fn confidence_rules() {
        for ok in [0.0, 1.0, 0.5, -0.0] {
            assert!(validate(item().with_confidence(ok)).is_ok(), "{ok}");
        }
        for bad in [1.5, -0.1, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.000_000_1] {
            assert_eq!(
                invalid_field(validate(item().with_confidence(bad))),
                "confidence",
                "{bad}"
            );
        }
    }

    #[test]
    fn content_size_limit() {
        let it = item(); // canonical {"text":"hello"} is 16 bytes
        let reg = TypeRegistry::default();
        assert!(check_item(&it, &reg, 16).is_ok());
        match check_item(&it, &reg, 15) {
            Err(Error::TooLarge {
                what,
                len: 16,
                max: 15,
                index: None,
            }) => assert_eq!(what, "content"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hash_declared_matching_and_mismatching() {
        let good = format_hash(&content_hash(br#"{"text":"hello"}"#));
        let (_, hash) = validate(item().with_hash(good.clone())).expect("matching hash");
        assert_eq!(format_hash(&hash), good);
        let other = format_hash(&[7u8; 32]);
        match validate(item().with_hash(other.clone())) {
            Err(Error::HashMismatch {
                id,
                declared,
                computed,
                index: None,
            }) => {
                assert_eq!(id, "ch3");
                assert_eq!(declared, other);
                assert_eq!(computed, format_hash(&hash));
            }
            r => panic!("{r:?}"),
        }
        assert_eq!(invalid_field(validate(item().with_hash("sha256:ABC"))), "hash");
    }

    #[test]
    fn type_must_be_known() {
        let mut it = item();
        it.kind = "legal_clause".into();
        match validate(it) {
            Err(Error::UnknownType {
                kind,
                known,
                index: None,
            }) => {
                assert_eq!(kind, "legal_clause");
                let mut sorted: Vec<String> = BUILTIN_TYPES.iter().map(|s| s.to_string()).collect();
                sorted.sort();
                assert_eq!(known, sorted);
            }
            r => panic!("{r:?}"),
        }
        for kind in BUILTIN_TYPES {
            let mut it = item();
            it.kind = kind.into();
            assert!(validate(it).is_ok(), "{kind}");
        }
    }

    #[test]
    fn errors_carry_no_index() {
        let mut it = item();
        it.id = String::new();
        assert_eq!(validate(it).err().and_then(|e| e.index()), None);
    }

    // ---- hashes ----

    #[test]
    fn known_sha256_vector() {
        let canonical = canonical_json(&json!({"a": 1}));
        assert_eq!(canonical, br#"{"a":1}"#.to_vec());
        // printf '{"a":1}' | sha256sum
        assert_eq!(
            format_hash(&content_hash(&canonical)),
            "sha256:015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
        // printf '' | sha256sum
        assert_eq!(
            format_hash(&content_hash(b"")),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn hashes_format_as_lowercase_hex_and_as_json() {
        for h in [
            [0u8; 32],
            [0xffu8; 32],
            core::array::from_fn(|i| u8::try_from(i * 37 % 256).unwrap_or(0)),
        ] {
            let naive: String = h.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(format_hash(&h), format!("sha256:{naive}"));
            let mut json = Vec::new();
            write_hash_json(&mut json, &h);
            assert_eq!(json, serde_json::to_vec(&format_hash(&h)).unwrap());
        }
    }

    #[test]
    fn passing_names_and_failing_names_are_told_apart_as_before() {
        // The fast path must accept exactly what the checks with messages accept.
        for (value, ok) in [
            ("a", true),
            ("A-z_0.9:x", true),
            ("", false),
            ("a b", false),
            ("é", false),
        ] {
            assert_eq!(validate_name("id", value).is_ok(), ok, "{value:?}");
        }
        assert!(validate_name("id", &"x".repeat(129)).is_err());
        assert!(validate_version("1:2").is_err());
        assert!(validate_version("1.2-b_3").is_ok());
        assert!(validate_source("中文 \"quoted\"").is_ok());
        assert!(validate_source("tab\there").is_err());
        assert!(validate_source(&"s".repeat(257)).is_err());
    }

    #[test]
    fn parse_hash_roundtrip_and_refusals() {
        let h: [u8; 32] = core::array::from_fn(|i| u8::try_from(i * 8).unwrap_or(0));
        let text = format_hash(&h);
        assert_eq!(parse_hash(&text).expect("parses"), h);
        let hex = "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862";
        assert!(parse_hash(&format!("sha256:{hex}")).is_ok());
        for bad in [
            hex.to_owned(),
            format!("SHA256:{hex}"),
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha256:{}", &hex[..63]),
            format!("sha256:{hex}0"),
            format!("sha256:{}g", &hex[..63]),
            format!("sha256: {}", &hex[..63]),
            format!("sha256:{}é", &hex[..62]),
            String::new(),
        ] {
            assert_eq!(invalid_field(parse_hash(&bad)), "hash", "{bad:?}");
        }
        assert!(reason(parse_hash(&format!("sha256:{}g", &hex[..63]))).contains("'g' at byte 63"));
    }

    // ---- canonical JSON ----

    #[test]
    fn json_strings_are_written_byte_for_byte_as_serde_json_writes_them() {
        let serde = |text: &str| serde_json::to_vec(text).expect("a string serializes");
        let ours = |text: &str| {
            let mut out = b"x".to_vec();
            write_json_str(&mut out, text);
            out.split_off(1)
        };
        // Every ASCII byte and a few others, alone and at every position of a run longer than
        // two words (so that each lands in a word, at a word's edge and in the byte-by-byte tail).
        let specials: Vec<char> = (0u8..0x80)
            .map(char::from)
            .chain(['é', '\u{2028}', '\u{10ffff}'])
            .collect();
        for special in specials {
            assert_eq!(ours(&special.to_string()), serde(&special.to_string()), "{special:?}");
            for len in [7, 8, 9, 16, 23] {
                for at in 0..len {
                    let text: String = (0..len).map(|i| if i == at { special } else { 'a' }).collect();
                    assert_eq!(ours(&text), serde(&text), "{text:?}");
                }
            }
        }
        let mixed = "line 1\nline \"2\"\t\\ end\u{1}\u{1f}\u{7f} é \r\u{8}\u{c}";
        assert_eq!(ours(mixed), serde(mixed));
        assert_eq!(ours(""), b"\"\"");
        // Seeded pseudo-random strings over a small alphabet heavy in escapes.
        let alphabet = ['a', '"', '\\', '\n', '\u{0}', '\u{1f}', ' ', 'é', '\u{7f}', 'z'];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let len = usize::try_from(state >> 58).unwrap_or(0);
            let text: String = (0..len)
                .map(|i| {
                    let pick = (state >> (i % 48)) as usize % alphabet.len();
                    alphabet.get(pick).copied().unwrap_or('a')
                })
                .collect();
            assert_eq!(ours(&text), serde(&text), "{text:?}");
        }
    }

    #[test]
    fn hex_digits_decode_only_when_all_are_lowercase_hex() {
        let h: [u8; 32] = core::array::from_fn(|i| u8::try_from(i * 8 + 3).unwrap_or(0));
        let text = format_hash(&h);
        let hex = text.strip_prefix(HASH_PREFIX).expect("prefix").as_bytes().to_vec();
        assert_eq!(decode_hex_digits(&hex), Some(h));
        for at in 0..64 {
            for bad in [b'A', b'F', b'g', b'/', b':', b'`', b' ', 0, 0xc3] {
                let mut spoiled = hex.clone();
                if let Some(byte) = spoiled.get_mut(at) {
                    *byte = bad;
                }
                assert_eq!(decode_hex_digits(&spoiled), None, "byte {bad} at {at}");
            }
        }
        assert_eq!(decode_hex_digits(hex.get(..62).expect("62 digits")), None);
        assert_eq!(decode_hex_digits(&[hex.clone(), b"00".to_vec()].concat()), None);
    }

    #[test]
    fn canonical_sorts_keys_by_bytes_recursively() {
        let v = json!({
            "b": [3, {"z": 1, "a": {"é": "ü", "e": null, "Z": true}}],
            "a": "x\"y\n",
            "é": 1.5,
            "ab": [],
            "": {},
            "B": false
        });
        let expected = "{\"\":{},\"B\":false,\"a\":\"x\\\"y\\n\",\"ab\":[],\"b\":[3,{\"a\":{\"Z\":true,\"e\":null,\"é\":\"ü\"},\"z\":1}],\"é\":1.5}";
        assert_eq!(String::from_utf8(canonical_json(&v)).expect("utf-8"), expected);
    }

    #[test]
    fn canonical_sorts_by_bytes_not_chars() {
        // U+FFFD (EF BF BD) sorts before U+10000 (F0 90 80 80) by bytes, after it by UTF-16.
        let v = json!({"\u{10000}": 1, "\u{FFFD}": 2});
        assert_eq!(
            String::from_utf8(canonical_json(&v)).expect("utf-8"),
            "{\"\u{FFFD}\":2,\"\u{10000}\":1}"
        );
    }

    #[test]
    fn canonical_scalars_match_serde_json() {
        for v in [
            json!(null),
            json!(true),
            json!(-12),
            json!(u64::MAX),
            json!(0.1),
            json!(1e300),
            json!("\u{1}\t✓"),
            json!([1, [2, []], "x"]),
        ] {
            assert_eq!(canonical_json(&v), serde_json::to_vec(&v).expect("serializes"), "{v}");
        }
    }

    #[test]
    fn canonical_survives_deep_nesting() {
        let mut v = json!(1);
        for _ in 0..10_000 {
            v = Value::Array(vec![v]);
        }
        let bytes = canonical_json(&v);
        assert_eq!(bytes.len(), 20_001);
        // Take it apart iteratively: Value's own drop would recurse this deep.
        let mut cur = v;
        while let Value::Array(mut items) = cur {
            cur = items.pop().unwrap_or(Value::Null);
        }
    }

    // ---- JSON shape ----

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

    // ---- types ----

    #[test]
    fn type_spec_accessors() {
        let spec = TypeSpec::new("legal_clause").id_pattern("^cl_[0-9.a-z]+$");
        assert_eq!(spec.name(), "legal_clause");
        assert_eq!(spec.pattern(), Some("^cl_[0-9.a-z]+$"));
        assert_eq!(TypeSpec::new("x").pattern(), None);
    }

    #[test]
    fn type_name_rules() {
        let check = |n: &str| TypeRegistry::validate_spec(&TypeSpec::new(n));
        assert!(check("a").is_ok());
        assert!(check("legal_clause_2").is_ok());
        assert!(check(&"a".repeat(64)).is_ok());
        for bad in [
            String::new(),
            "a".repeat(65),
            "_a".into(),
            "1a".into(),
            "Legal".into(),
            "a-b".into(),
            "a b".into(),
        ] {
            assert_eq!(invalid_field(check(&bad)), "type", "{bad:?}");
        }
    }

    #[test]
    fn id_pattern_rules() {
        let check = |p: &str| TypeRegistry::validate_spec(&TypeSpec::new("t").id_pattern(p));
        assert!(check("^cl_[0-9.a-z]+$").expect("compiles").is_some());
        assert!(check(&"a".repeat(limits::ID_PATTERN_BYTES_MAX)).is_ok());
        assert_eq!(
            invalid_field(check(&"a".repeat(limits::ID_PATTERN_BYTES_MAX + 1))),
            "id_pattern"
        );
        assert_eq!(invalid_field(check("(")), "id_pattern");
        // Compiles to more than the size limit.
        assert_eq!(invalid_field(check(r"\w{1000}\w{1000}")), "id_pattern");
        assert!(TypeRegistry::validate_spec(&TypeSpec::new("t")).expect("ok").is_none());
    }

    #[test]
    fn register_is_idempotent_and_pattern_fixed() {
        let mut reg = TypeRegistry::default();
        let spec = TypeSpec::new("legal_clause").id_pattern("^cl_[0-9.a-z]+$");
        assert!(reg.check_register(&spec).expect("new"));
        reg.insert(spec.clone()).expect("inserted");
        assert!(!reg.check_register(&spec).expect("same"));
        reg.insert(spec.clone()).expect("idempotent");
        assert_eq!(reg.custom(), vec![spec]);
        let other = TypeSpec::new("legal_clause").id_pattern("^x$");
        assert_eq!(invalid_field(reg.check_register(&other)), "type");
        assert_eq!(
            invalid_field(reg.check_register(&TypeSpec::new("legal_clause"))),
            "type"
        );
        assert!(reg.insert(other).is_err());
        assert_eq!(reg.custom().len(), 1);
    }

    #[test]
    fn builtins_cannot_be_registered() {
        let mut reg = TypeRegistry::default();
        for name in BUILTIN_TYPES {
            assert_eq!(invalid_field(reg.check_register(&TypeSpec::new(name))), "type");
            assert!(reg.insert(TypeSpec::new(name)).is_err());
        }
        assert!(reg.custom().is_empty());
    }

    #[test]
    fn known_and_custom_are_sorted() {
        let mut reg = TypeRegistry::default();
        reg.insert(TypeSpec::new("zeta")).expect("ok");
        reg.insert(TypeSpec::new("alpha")).expect("ok");
        let known = reg.known();
        assert_eq!(known.len(), 9);
        let mut sorted = known.clone();
        sorted.sort();
        assert_eq!(known, sorted);
        assert_eq!(known.first().map(String::as_str), Some("alpha"));
        assert!(known.contains(&"message".to_owned()));
        let names: Vec<String> = reg.custom().iter().map(|s| s.name().to_owned()).collect();
        assert_eq!(names, ["alpha", "zeta"]);
    }

    #[test]
    fn check_item_pattern() {
        let mut reg = TypeRegistry::default();
        reg.insert(TypeSpec::new("legal_clause").id_pattern("^cl_[0-9.a-z]+$"))
            .expect("ok");
        reg.insert(TypeSpec::new("free")).expect("ok");
        assert!(reg.check_item("legal_clause", "cl_3.2a").is_ok());
        assert!(reg.check_item("free", "anything").is_ok());
        assert!(reg.check_item("message", "anything").is_ok());
        let r = reg.check_item("legal_clause", "ch3");
        let text = reason(reg.check_item("legal_clause", "ch3"));
        assert!(
            text.contains("legal_clause") && text.contains("^cl_[0-9.a-z]+$"),
            "{text}"
        );
        assert_eq!(invalid_field(r), "id");
        match reg.check_item("nope", "x") {
            Err(Error::UnknownType { known, .. }) => {
                assert!(known.contains(&"legal_clause".to_owned()) && known.len() == 9);
            }
            r => panic!("{r:?}"),
        }
        let mut it = item();
        it.kind = "legal_clause".into();
        assert_eq!(invalid_field(check_item(&it, &reg, 1000)), "id");
        it.id = "cl_1".into();
        assert!(check_item(&it, &reg, 1000).is_ok());
    }
}
