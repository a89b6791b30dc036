//! Segment files: `NNNNNNNN.seg`, a 32-byte header and then frames, append-only.
//!
//! Header (little-endian):
//!
//! | offset | width | field                                           |
//! |--------|-------|-------------------------------------------------|
//! | 0      | 8     | magic `CTXLOGSG`                                |
//! | 8      | 4     | format version (u32): [`FORMAT_VERSION`] when created; older ones are read |
//! | 12     | 4     | segment number (u32), as in the file name       |
//! | 16     | 8     | base seq (u64): the seq of the segment's first frame |
//! | 24     | 4     | rewrites (u32): how many times compaction rewrote it; 0 as first written |
//! | 28     | 4     | CRC-32 of bytes 0..28                           |
//!
//! Every byte comes through the [`Storage`] seam; sealed segments are read as [`SharedBytes`] (a
//! mapping of the file with the file backend). The segment being appended to is an
//! [`ActiveSegment`], made by [`create_segment`] (or by recovery, from the newest segment found).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::num::{usize_from_u32, usize_from_u64};
use crate::storage::{sync_dir, SharedBytes, Storage, StorageFile};

/// The magic bytes that open every segment.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"CTXLOGSG";
/// The segment format version this build creates segments in, and the newest it reads: format 3
/// adds the batch's commit time to each frame's sync mark, and a delete's scope.
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The oldest segment format version this build still reads: version 1 differs from 2 only in
/// having no sync marks. Every segment holds frames of its own format only.
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
    /// The segment's format version, which all its frames follow.
    pub(crate) version: u32,
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
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
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
            version,
            number,
            base_seq,
            rewrites,
        })
    }
}

/// The bytes of one record read from a segment ([`Segment::read`]).
pub(crate) enum RecordBytes<'a> {
    /// Borrowed from a sealed segment's map.
    Mapped(&'a [u8]),
    /// A range of the active segment's read window, shared with it (checked to lie inside it).
    Window(SharedBytes, std::ops::Range<usize>),
    /// Read with a positioned read (past the window, or where there is none).
    Read(Vec<u8>),
}

impl RecordBytes<'_> {
    /// The bytes in a form that outlives the segment's borrow, or `None` for bytes borrowed from a
    /// sealed segment's map (a reader that keeps the segment reads them again there).
    pub(crate) fn detached(self) -> Option<RecordBytes<'static>> {
        match self {
            RecordBytes::Mapped(_) => None,
            RecordBytes::Window(window, range) => Some(RecordBytes::Window(window, range)),
            RecordBytes::Read(bytes) => Some(RecordBytes::Read(bytes)),
        }
    }
}

impl std::ops::Deref for RecordBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            RecordBytes::Mapped(bytes) => bytes,
            // The range was checked against the window when it was read: the fallback is never
            // taken.
            RecordBytes::Window(window, range) => window.get(range.clone()).unwrap_or_default(),
            RecordBytes::Read(bytes) => bytes,
        }
    }
}

/// The active segment's read window grows once the published bytes outgrow it by this much, or by a
/// quarter of it if that is more: a handful of mappings per segment, each a few microseconds.
const WINDOW_STEP_MIN: u64 = 64 << 10;

/// A segment as readers see it: the file, a map once it is sealed, and how many bytes of it are
/// published (records past that may still be being written).
///
/// The active segment is also mapped, up to a published length and remapped as it grows (a
/// *window*), so that most reads of recent items copy bytes out of memory instead of making a
/// positioned-read call each; the newest records, past the window, are read with one.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    file: Box<dyn StorageFile>,
    map: Option<SharedBytes>,
    window: std::sync::RwLock<Option<SharedBytes>>,
    published_len: AtomicU64,
    /// How many times compaction rewrote the file (from its header).
    pub(crate) rewrites: u32,
    /// The segment's format version (from its header): what its frames' sync marks and deletes
    /// hold.
    pub(crate) version: u32,
    /// The sequence number of the segment's first frame when it was created (from its header).
    pub(crate) base_seq: u64,
}

impl Segment {
    /// Makes `len` bytes at `offset` ready for appends ([`StorageFile::prepare`]) through the
    /// segment's own handle, so that a thread other than the writer's can do it.
    pub(crate) fn prepare(&self, offset: u64, len: u64) {
        self.file.prepare(offset, len);
    }

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
            window: std::sync::RwLock::new(None),
            published_len: AtomicU64::new(published_len),
            rewrites: header.rewrites,
            version: header.version,
            base_seq: header.base_seq,
        })
    }

    /// The whole mapped file of a sealed segment; `None` for the active one.
    pub(crate) fn mapped(&self) -> Option<&[u8]> {
        self.map.as_deref()
    }

    /// The segment's bytes as mapped already, without a call to the storage: a sealed segment's
    /// map, or the active segment's read window (published bytes up to a frame's end; `None`
    /// before the writer has mapped one). This file's bytes even if compaction has since put a
    /// rewrite under its name.
    pub(crate) fn mapped_bytes(&self) -> Option<SharedBytes> {
        match &self.map {
            Some(map) => Some(map.clone()),
            None => self
                .window
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    /// The bytes of the file up to its published length.
    pub(crate) fn published_len(&self) -> u64 {
        self.published_len.load(Ordering::Acquire)
    }

    pub(crate) fn set_published_len(&self, len: u64) {
        self.published_len.store(len, Ordering::Release);
    }

    /// Maps the active segment again when its published bytes have outgrown the read window by a
    /// step (see [`WINDOW_STEP_MIN`]). Called by the writer thread after it has answered a group;
    /// a mapping that fails leaves reads to positioned reads, which are always correct.
    pub(crate) fn extend_window(&self) {
        if self.map.is_some() {
            return;
        }
        let published = self.published_len();
        let mapped = self.window_len();
        if published < mapped.saturating_add(WINDOW_STEP_MIN.max(mapped / 4)) {
            return;
        }
        // The writer only writes past the published bytes while the store is open (see
        // `StorageFile::map_prefix`): mapped, they never change.
        match self.file.map_prefix(published) {
            Ok(bytes) => {
                let mut window = self.window.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                let old = window.replace(bytes);
                drop(window);
                // Outside the lock: the old window is unmapped here, or by the last reader still
                // holding a record of it.
                drop(old);
            }
            Err(e) => tracing::debug!("{}: mapping the active segment failed: {e}", self.path.display()),
        }
    }

    /// Bytes covered by the active segment's read window (0 without one).
    fn window_len(&self) -> u64 {
        let window = self.window.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        window.as_ref().map_or(0, |bytes| bytes.len() as u64)
    }

    /// Loads the byte at each of `offsets` that its map (or the active segment's read window)
    /// holds, and returns them XORed, only so that the loads are made. The loads depend on nothing
    /// but the offsets, so a processor makes many at once: a read of many records that touches each
    /// first this way waits for their cache and TLB misses together, not one record after another.
    pub(crate) fn touch(&self, offsets: &mut dyn Iterator<Item = (u32, u32)>) -> u8 {
        let touch = |bytes: &[u8], offsets: &mut dyn Iterator<Item = (u32, u32)>| {
            offsets.fold(0u8, |sum, (offset, len)| {
                let start = usize_from_u32(offset);
                let end = (start + usize_from_u32(len)).min(bytes.len());
                let mut sum = sum;
                let mut at = start;
                while at < end {
                    sum ^= bytes.get(at).copied().unwrap_or(0);
                    at += 64;
                }
                sum
            })
        };
        if let Some(map) = &self.map {
            return touch(map, offsets);
        }
        let window = self.window.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match window.as_ref() {
            Some(bytes) => touch(bytes, offsets),
            // Nothing to load, but the offsets are still taken: a caller that groups its
            // locations by segment moves on only once this segment's are consumed.
            None => {
                offsets.for_each(drop);
                0
            }
        }
    }

    /// Reads `len` bytes at `offset`, never past the published length.
    pub(crate) fn read(&self, offset: u64, len: u32) -> Result<RecordBytes<'_>> {
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
            return map
                .get(usize_from_u64(offset)..usize_from_u64(end))
                .map(RecordBytes::Mapped)
                .ok_or_else(|| corrupt("record past the map"));
        }
        {
            // The window is shared, not copied: a reader keeps the mapping it read from alive
            // (one reference count) even if the writer maps a longer window meanwhile.
            let window = self.window.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            let (start, stop) = (usize_from_u64(offset), usize_from_u64(end));
            if let Some(window) = window.as_ref().filter(|w| w.get(start..stop).is_some()) {
                return Ok(RecordBytes::Window(window.clone(), start..stop));
            }
        }
        let mut buf = vec![0u8; usize_from_u32(len)];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io(format!("reading {} at {offset}", self.path.display()), e))?;
        Ok(RecordBytes::Read(buf))
    }
}

/// The segment being appended to.
pub(crate) struct ActiveSegment {
    pub(crate) file: Box<dyn StorageFile>,
    pub(crate) number: u32,
    /// Bytes written (and, once published, readable).
    pub(crate) len: u64,
    /// The file's length: `len` plus the zeros allocated ahead of the appends.
    pub(crate) allocated: u64,
    /// Where the written part of the file ends: the appended bytes, and the zeros written ahead of
    /// them ([`Allocation::Zeroed`](crate::storage::Allocation::Zeroed)); past it, up to
    /// `allocated`, blocks are only reserved.
    pub(crate) zeroed: u64,
    /// Where the space made ready for the next appends ([`StorageFile::prepare`]) ends.
    pub(crate) prepared: u64,
    pub(crate) segment: Arc<Segment>,
}

/// Creates segment `number` whose first frame will carry `base_seq`: header written and synced, and
/// the directory synced so that the file survives a crash.
pub(crate) fn create_segment(storage: &dyn Storage, dir: &Path, number: u32, base_seq: u64) -> Result<ActiveSegment> {
    let path = dir.join(segment_file_name(number));
    let mut file = storage
        .create_new(&path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    let header = SegmentHeader {
        version: FORMAT_VERSION,
        number,
        base_seq,
        rewrites: 0,
    }
    .encode();
    file.append(&header)
        .map_err(|e| Error::io(format!("writing the header of {}", path.display()), e))?;
    file.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", path.display()), e))?;
    sync_dir(storage, dir)?;
    let segment = Arc::new(Segment::open(storage, &path, false, SEGMENT_HEADER_BYTES as u64)?);
    Ok(ActiveSegment {
        file,
        number,
        len: SEGMENT_HEADER_BYTES as u64,
        allocated: SEGMENT_HEADER_BYTES as u64,
        zeroed: SEGMENT_HEADER_BYTES as u64,
        prepared: SEGMENT_HEADER_BYTES as u64,
        segment,
    })
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
        for version in FORMAT_VERSION_MIN..=FORMAT_VERSION {
            let header = SegmentHeader {
                version,
                number: 3,
                base_seq: 77,
                rewrites: 2,
            };
            assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header));
        }
        for version in [0, FORMAT_VERSION + 1] {
            let header = SegmentHeader {
                version,
                number: 3,
                base_seq: 77,
                rewrites: 2,
            };
            let refused = SegmentHeader::decode(&header.encode()).expect_err("an unknown version");
            assert!(
                refused.contains(&format!("version {version} is not supported")),
                "{refused}"
            );
        }
        let header = SegmentHeader {
            version: FORMAT_VERSION,
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

    use crate::storage::{FileStorage, SimDisk};

    /// Appends `bytes` to the active segment and publishes them, as the writer thread does.
    fn publish(active: &mut ActiveSegment, bytes: &[u8]) -> u64 {
        active.file.append(bytes).expect("append");
        active.len += bytes.len() as u64;
        active.segment.set_published_len(active.len);
        active.segment.extend_window();
        active.len
    }

    fn check_window(storage: &dyn Storage, dir: &Path) {
        let mut active = create_segment(storage, dir, 1, 0).expect("segment");
        let segment = Arc::clone(&active.segment);
        let pattern = |at: u64| u8::try_from(at % 251).unwrap();
        let mut written: Vec<u8> = vec![0; SEGMENT_HEADER_BYTES];
        let mut windows = Vec::new();
        // A record read from each window, kept across the remappings that follow it.
        let mut kept: Vec<(RecordBytes<'_>, Vec<u8>)> = Vec::new();
        // Published in uneven pieces up to ~1 MiB: the window must grow in steps, never cover more
        // than is published when it is taken, and every read must give the written bytes whether it
        // falls inside the window or past it.
        for piece in 0..300u64 {
            let bytes: Vec<u8> = (0..1000 + piece * 17)
                .map(|i| pattern(written.len() as u64 + i))
                .collect();
            written.extend_from_slice(&bytes);
            let published = publish(&mut active, &bytes);
            let mapped = segment.window_len();
            assert!(mapped <= published, "window {mapped} past the published {published}");
            if windows.last() != Some(&mapped) && mapped > 0 {
                windows.push(mapped);
                // A read inside the window shares it rather than copying; what it read stays
                // readable when the writer maps a longer window.
                let read = segment.read(mapped - 200, 200).expect("read in the window");
                assert!(
                    matches!(read, RecordBytes::Window(..)),
                    "a read inside the window of {mapped} bytes was not served from it"
                );
                let start = usize::try_from(mapped - 200).expect("offset");
                kept.push((read, written.get(start..start + 200).expect("written").to_vec()));
            }
            // The first bytes, the last ones, the middle, and a read across the window's end.
            for (offset, len) in [
                (32, 100),
                (published - 700, 700),
                (published / 2, 333),
                (mapped.saturating_sub(50), 100),
            ] {
                let offset = offset.clamp(32, published - u64::from(len));
                let start = usize::try_from(offset).expect("offset");
                let want = written.get(start..start + len as usize).expect("written");
                let got = segment.read(offset, len).expect("read");
                assert_eq!(
                    &*got, want,
                    "read of {len} at {offset} with {published} published, {mapped} mapped"
                );
            }
            // Never past the published length, mapped or not.
            assert!(segment.read(published - 10, 11).is_err());
            // `touch` loads a byte of every 64 of each range that the window holds, and nothing
            // past it (a range across its end, one past the file, one that would overflow u32).
            let ranges = [
                (32u32, 700u32),
                (u32::try_from(mapped.saturating_sub(100)).expect("offset"), 300),
                (u32::try_from(published).expect("offset") + 4096, 64),
                (u32::MAX - 10, u32::MAX),
            ];
            let want = ranges.iter().fold(0u8, |sum, &(offset, len)| {
                (u64::from(offset)..(u64::from(offset) + u64::from(len)).min(mapped))
                    .step_by(64)
                    .fold(sum, |sum, at| sum ^ written[usize::try_from(at).expect("offset")])
            });
            // Every range is taken, with a window or without one (before the first): a caller
            // grouping its ranges by segment waits for them to be consumed.
            let mut given = ranges.iter().copied();
            assert_eq!(segment.touch(&mut given), want, "touch with {mapped} mapped");
            assert_eq!(given.next(), None, "touch left ranges untaken with {mapped} mapped");
        }
        assert!(windows.len() >= 5, "the window grew only through {windows:?}");
        assert_eq!(kept.len(), windows.len());
        for (at, (read, want)) in kept.iter().enumerate() {
            assert_eq!(
                &**read,
                &want[..],
                "the read from window {at} changed after the remappings"
            );
        }
        assert!(
            windows.windows(2).all(|w| w[1] >= w[0] + WINDOW_STEP_MIN),
            "the window was remapped before a step: {windows:?}"
        );
    }

    #[test]
    fn active_segment_reads_the_same_bytes_through_its_window_and_past_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        check_window(&FileStorage, dir.path());
        let disk = SimDisk::new();
        disk.create_dir_all(Path::new("/sim")).expect("directory");
        check_window(&disk, Path::new("/sim"));
    }
}
