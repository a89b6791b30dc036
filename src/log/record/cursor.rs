//! The byte cursor every decoder of the store's files reads with: little-endian integers and
//! strings, each bounds-checked, a short read a [`DecodeError`] naming the field.

use super::{bad, DecodeError};

/// A bounds-checked little-endian reader over a byte slice.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| bad(format!("{what} runs past the end ({n} bytes at {})", self.pos)))?;
        let slice = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| bad(format!("{what} out of range")))?;
        self.pos = end;
        Ok(slice)
    }

    pub(super) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], DecodeError> {
        let slice = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i64(&mut self, what: &str) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    pub(super) fn str(&mut self, n: usize, what: &str) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.take(n, what)?).map_err(|_| bad(format!("{what} is not UTF-8")))
    }
    pub(crate) fn position(&self) -> usize {
        self.pos
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }
}
