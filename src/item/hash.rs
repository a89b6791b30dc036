//! Content hashes: the SHA-256 of canonical content bytes and its text form, `"sha256:"` + 64
//! lowercase hex digits: formatted, written as JSON, and parsed back with errors that say what is
//! wrong.

use sha2::{Digest, Sha256};

use super::describe::{describe_char, short};
use crate::error::{Error, Result};

/// The prefix of every hash string.
const HASH_PREFIX: &str = "sha256:";

/// The SHA-256 of canonical content bytes.
#[inline]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::canonical::canonical_json;
    use crate::item::test_support::{invalid_field, reason};
    use serde_json::json;

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
            core::array::from_fn(|i| u8::try_from(i * 37 % 256).unwrap()),
        ] {
            let naive: String = h.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(format_hash(&h), format!("sha256:{naive}"));
            let mut json = Vec::new();
            write_hash_json(&mut json, &h);
            assert_eq!(json, serde_json::to_vec(&format_hash(&h)).unwrap());
        }
    }

    #[test]
    fn parse_hash_roundtrip_and_refusals() {
        let h: [u8; 32] = core::array::from_fn(|i| u8::try_from(i * 8).unwrap());
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

    #[test]
    fn hex_digits_decode_only_when_all_are_lowercase_hex() {
        let h: [u8; 32] = core::array::from_fn(|i| u8::try_from(i * 8 + 3).unwrap());
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
}
