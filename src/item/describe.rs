//! How values are quoted in error messages: shortened strings and named characters, shared by the
//! field rules, the hash reader and the type registry.

/// The first 40 characters of a string, for error messages.
pub(super) fn short(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(40).collect();
    if chars.next().is_some() {
        format!("{head}...")
    } else {
        head
    }
}

/// A character as named in error messages.
pub(super) fn describe_char(c: char) -> String {
    if c == ' ' {
        "a space".to_owned()
    } else if c.is_control() || c.is_whitespace() {
        format!("the control or space character U+{:04X}", u32::from(c))
    } else {
        format!("{c:?}")
    }
}
