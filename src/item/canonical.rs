//! Canonical JSON: the one byte form of a JSON value that content hashes are computed over and that
//! records store (perhaps compressed), and the JSON string and scalar writers the record codec also
//! uses to write items. Every byte written here is part of the on-disk format.

use serde::Serialize;
use serde_json::Value;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            let len = crate::num::usize_from_u64(state >> 58);
            let text: String = (0..len)
                .map(|i| {
                    let pick = crate::num::usize_from_u64(state >> (i % 48)) % alphabet.len();
                    alphabet.get(pick).copied().unwrap_or('a')
                })
                .collect();
            assert_eq!(ours(&text), serde(&text), "{text:?}");
        }
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
}
