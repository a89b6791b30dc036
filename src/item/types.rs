//! Item types: [`TypeSpec`] (a type to register, with an optional id pattern), the built-in types,
//! and the registry that knows every type and checks an item's type and id against it.

use std::collections::BTreeMap;

use super::describe::{describe_char, short};
use crate::error::{Error, Result};
use crate::limits;

/// Bytes of a type name, at the most.
const TYPE_NAME_BYTES_MAX: usize = 64;
// A type name's length is stored in one byte, a pattern's in two (log records, checkpoints).
const _: () = assert!(TYPE_NAME_BYTES_MAX <= u8::MAX as usize && limits::ID_PATTERN_BYTES_MAX <= u16::MAX as usize);

/// The size limit, in bytes, of a compiled id pattern.
const ID_PATTERN_COMPILED_BYTES_MAX: usize = 1 << 20;

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
    /// The errors of [`TypeRegistry::check_register`], and [`Error::Full`] for a new type when
    /// [`limits::TYPES_MAX`] are registered; the registry is then unchanged.
    pub(crate) fn insert(&mut self, spec: TypeSpec) -> Result<()> {
        let regex = Self::validate_spec(&spec)?;
        if self.check_known(&spec)? {
            limits::check_room(self.len(), 1, limits::TYPES_MAX, "types")?;
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

    /// How many types are registered, the built-in ones included.
    pub(crate) fn len(&self) -> usize {
        BUILTIN_TYPES.len() + self.custom.len()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::test_support::invalid_field;

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
}
