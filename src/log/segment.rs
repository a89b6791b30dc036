//! Segment files: `NNNNNNNN.seg`, a 32-byte header and then frames, append-only.
//!
//! Header (little-endian):
//!
//! | offset | width | field                                           |
//! |--------|-------|-------------------------------------------------|
//! | 0      | 8     | magic `CTXLOGSG`                                |
//! | 8      | 4     | format version (u32) = [`FORMAT_VERSION`]       |
//! | 12     | 4     | segment number (u32), as in the file name       |
//! | 16     | 8     | base seq (u64): the seq of the segment's first frame |
//! | 24     | 4     | rewrites (u32): how many times compaction rewrote it; 0 as first written |
//! | 28     | 4     | CRC-32 of bytes 0..28                           |
//!
//! Every byte comes through the [`Storage`] seam; sealed segments are read as [`SharedBytes`] (a
//! mapping of the file with the file backend).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::storage::{SharedBytes, Storage, StorageFile};

/// The magic bytes that open every segment.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"CTXLOGSG";
/// The on-disk format version this build writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The oldest segment format version this build still reads: version 1 differs only in having no
/// sync marks.
pub(crate) const FORMAT_VERSION_MIN: u32 = 1;
/// Bytes of a segment header.
pub(crate) const SEGMENT_HEADER_BYTES: usize = 32;

/// The file name of segment `number`.
pub(crate) fn segment_file_name(number: u32) -> String {
    format!("{number:08}.seg")
}

/// The segment number in a file name such as `00000012.seg`, if it is one.
pub(crate) fn parse_segment_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub(crate) number: u32,
    pub(crate) base_seq: u64,
    /// How many times compaction rewrote the segment. A rewritten segment may skip sequence numbers
    /// (frames whose every record was reclaimed are gone).
    pub(crate) rewrites: u32,
}

impl SegmentHeader {
    pub(crate) fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut out = [0u8; SEGMENT_HEADER_BYTES];
        out[0..8].copy_from_slice(&SEGMENT_MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&self.number.to_le_bytes());
        out[16..24].copy_from_slice(&self.base_seq.to_le_bytes());
        out[24..28].copy_from_slice(&self.rewrites.to_le_bytes());
        let crc = crc32fast::hash(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a header; the error says what is wrong with it.
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<SegmentHeader, String> {
        let Some(header) = bytes.get(..SEGMENT_HEADER_BYTES) else {
            return Err(format!(
                "segment header is {} bytes, needs {SEGMENT_HEADER_BYTES}",
                bytes.len()
            ));
        };
        let field = |range: std::ops::Range<usize>| header.get(range).unwrap_or_default();
        if field(0..8) != SEGMENT_MAGIC {
            return Err("not a ctxlog segment (bad magic)".into());
        }
        let le_u32 = |range| u32::from_le_bytes(field(range).try_into().unwrap_or([0; 4]));
        let stored_crc = le_u32(28..32);
        let crc = crc32fast::hash(field(0..28));
        if stored_crc != crc {
            return Err(format!(
                "segment header CRC mismatch: stored {stored_crc:#010x}, computed {crc:#010x}"
            ));
        }
        let version = le_u32(8..12);
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
            return Err(format!(
                "segment format version {version} is not supported by this build (it reads versions {FORMAT_VERSION_MIN} to {FORMAT_VERSION})"
            ));
        }
        let number = le_u32(12..16);
        let base_seq = u64::from_le_bytes(field(16..24).try_into().unwrap_or([0; 8]));
        let rewrites = le_u32(24..28);
        Ok(SegmentHeader {
            number,
            base_seq,
            rewrites,
        })
    }
}

/// A segment as readers see it: the file, a map once it is sealed, and how many bytes of it are
/// published (records past that may still be being written).
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    file: Box<dyn StorageFile>,
    map: Option<SharedBytes>,
    published_len: AtomicU64,
    /// How many times compaction rewrote the file (from its header).
    pub(crate) rewrites: u32,
}

impl Segment {
    /// Opens segment `path` for reading; `sealed` segments are mapped.
    pub(crate) fn open(storage: &dyn Storage, path: &Path, sealed: bool, published_len: u64) -> Result<Segment> {
        let file = storage
            .open_read(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let mut header = [0u8; SEGMENT_HEADER_BYTES];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| Error::io(format!("reading the header of {}", path.display()), e))?;
        let header = SegmentHeader::decode(&header).map_err(|reason| Error::Corrupt {
            file: path.to_path_buf(),
            offset: 0,
            reason,
        })?;
        let map = if sealed {
            Some(
                file.map()
                    .map_err(|e| Error::io(format!("mapping {}", path.display()), e))?,
            )
        } else {
            None
        };
        Ok(Segment {
            path: path.to_path_buf(),
            file,
            map,
            published_len: AtomicU64::new(published_len),
            rewrites: header.rewrites,
        })
    }

    /// The whole mapped file of a sealed segment; `None` for the active one.
    pub(crate) fn mapped(&self) -> Option<&[u8]> {
        self.map.as_deref()
    }

    /// The bytes of the file up to its published length.
    pub(crate) fn published_len(&self) -> u64 {
        self.published_len.load(Ordering::Acquire)
    }

    pub(crate) fn set_published_len(&self, len: u64) {
        self.published_len.store(len, Ordering::Release);
    }

    /// Reads `len` bytes at `offset`, never past the published length.
    pub(crate) fn read(&self, offset: u64, len: u32) -> Result<std::borrow::Cow<'_, [u8]>> {
        let end = offset.saturating_add(u64::from(len));
        let corrupt = |reason: &str| Error::Corrupt {
            file: self.path.clone(),
            offset,
            reason: reason.into(),
        };
        if end > self.published_len() {
            return Err(corrupt("record location is past the end of the segment"));
        }
        if let Some(map) = &self.map {
            let start = usize::try_from(offset).map_err(|_| corrupt("offset overflow"))?;
            let stop = usize::try_from(end).map_err(|_| corrupt("offset overflow"))?;
            return map
                .get(start..stop)
                .map(std::borrow::Cow::Borrowed)
                .ok_or_else(|| corrupt("record past the map"));
        }
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io(format!("reading {} at {offset}", self.path.display()), e))?;
        Ok(std::borrow::Cow::Owned(buf))
    }
}

/// Reads a whole segment for recovery or verification.
pub(crate) fn read_whole(storage: &dyn Storage, path: &Path) -> Result<Vec<u8>> {
    storage
        .read(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrips_and_refuses_damage() {
        let header = SegmentHeader {
            number: 3,
            base_seq: 77,
            rewrites: 2,
        };
        let bytes = header.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
        for bit in 0..SEGMENT_HEADER_BYTES * 8 {
            let mut damaged = bytes;
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(SegmentHeader::decode(&damaged).is_err(), "bit {bit}");
        }
        assert!(SegmentHeader::decode(&bytes[..31]).is_err());
    }

    #[test]
    fn file_names() {
        assert_eq!(segment_file_name(12), "00000012.seg");
        assert_eq!(parse_segment_file_name("00000012.seg"), Some(12));
        assert_eq!(parse_segment_file_name("0000012.seg"), None);
        assert_eq!(parse_segment_file_name("0000001a.seg"), None);
        assert_eq!(parse_segment_file_name("00000012.seg.tmp"), None);
    }
}
