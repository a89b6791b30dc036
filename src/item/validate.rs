//! The field rules every item passes before it is stored: names (ids, session ids), versions,
//! sources, and [`check_item`], which checks every field and returns the item's canonical content
//! and its hash.

use super::canonical::canonical_json;
use super::describe::{describe_char, short};
use super::hash::{content_hash, format_hash, parse_hash};
use super::types::TypeRegistry;
use super::{ContextItem, Scope};
use crate::error::{Error, Result};
use crate::limits;

/// The characters an id, a session id or a snapshot name may hold, as said in error messages.
const NAME_CHARS: &str = "[A-Za-z0-9._:-]";

/// The characters a version may hold, as said in error messages.
const VERSION_CHARS: &str = "[A-Za-z0-9._-]";

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
            len: crate::num::u64_from_usize(canonical.len()),
            max: crate::num::u64_from_usize(max_content_bytes),
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
    use crate::item::test_support::{invalid_field, item, reason};
    use crate::item::types::{TypeSpec, BUILTIN_TYPES};

    fn validate(item: ContextItem) -> Result<(Vec<u8>, [u8; 32])> {
        check_item(&item, &TypeRegistry::default(), limits::CONTENT_BYTES_DEFAULT)
    }

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

    #[test]
    fn errors_carry_no_index() {
        let mut it = item();
        it.id = String::new();
        assert_eq!(validate(it).err().and_then(|e| e.index()), None);
    }
}
