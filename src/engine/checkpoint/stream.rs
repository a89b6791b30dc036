//! A checkpoint streamed to its file in bounded steps rather than encoded into a buffer of its
//! size: for the checkpoint of a closing store.

use std::path::Path;

use crate::error::{Error, Result};
use crate::index::Index;
use crate::storage::{Allocation, Storage, StorageFile};

use super::encode::{check_counts, encode_body_into, header, Count, Sink};
use super::{SegmentMark, CHECKPOINT_HEADER_BYTES, VERSION_BYTES};

/// Bytes a streamed checkpoint gathers before each write to its file.
pub(super) const STREAM_STEP: usize = 1 << 20;

/// A checkpoint on its way to its file in steps of about `step` bytes, with the CRC of all it
/// wrote. The first failed write is kept, and nothing is written after it.
pub(super) struct Stream<'a> {
    file: &'a mut dyn StorageFile,
    step: usize,
    buffer: Vec<u8>,
    crc: crc32fast::Hasher,
    written: u64,
    /// The longest write so far: about `step`, the bound on the stream's memory.
    largest: usize,
    failed: Option<std::io::Error>,
}

impl Stream<'_> {
    fn flush(&mut self) {
        if self.failed.is_none() && !self.buffer.is_empty() {
            self.crc.update(&self.buffer);
            match self.file.append(&self.buffer) {
                Ok(()) => {
                    self.written += self.buffer.len() as u64;
                    self.largest = self.largest.max(self.buffer.len());
                }
                Err(e) => self.failed = Some(e),
            }
        }
        self.buffer.clear();
    }
}

impl Sink for Stream<'_> {
    #[inline]
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= self.step {
            self.flush();
        }
    }
    fn position(&self) -> u64 {
        self.written + self.buffer.len() as u64
    }
    fn patch(&mut self, at: u64, bytes: &[u8]) {
        let slot = at
            .checked_sub(self.written)
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| self.buffer.get_mut(at..at.saturating_add(bytes.len())));
        match slot {
            Some(slot) => slot.copy_from_slice(bytes),
            None if self.failed.is_none() => {
                self.failed = Some(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bytes at {at} patched after they were written"),
                ));
            }
            None => {}
        }
    }
}

/// Writes the checkpoint of `index` over `segments` to a new file at `tmp`, synced, in steps of
/// `step` bytes: the same bytes as [`write`](fn@super::write) encodes into a buffer, without a
/// buffer of the checkpoint's size (tens of megabytes for a store of a few hundred thousand
/// items). The body is encoded twice, first only to count its bytes, which the header gives before
/// it. Returns the file's length and its longest write.
pub(super) fn stream(
    storage: &dyn Storage,
    tmp: &Path,
    index: &Index,
    segments: &[SegmentMark],
    step: usize,
) -> Result<(u64, usize)> {
    let writing = |e| Error::io(format!("writing {}", tmp.display()), e);
    check_counts(index, segments)?;
    let mut count = Count::default();
    let kept = encode_body_into(&mut count, index, segments, None);
    let body_end = CHECKPOINT_HEADER_BYTES as u64 + count.0;
    let mut file = storage
        .create(tmp)
        .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
    file.allocate(body_end + 4, Allocation::Reserved).map_err(writing)?;
    file.prepare(0, body_end + 4);
    let mut stream = Stream {
        file: file.as_mut(),
        step,
        buffer: Vec::with_capacity(step + VERSION_BYTES),
        crc: crc32fast::Hasher::new(),
        written: 0,
        largest: 0,
        failed: None,
    };
    stream.extend_from_slice(&header((index.seq, index.committed_at), count.0));
    let rows = encode_body_into(&mut stream, index, segments, Some(kept));
    stream.flush();
    let (written, largest, crc) = (stream.written, stream.largest, stream.crc.clone().finalize());
    if let Some(e) = stream.failed.take() {
        return Err(writing(e));
    }
    if written != body_end || rows != kept {
        return Err(writing(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the body came to {written} bytes and {rows} versions where counting it gave {body_end} and {kept}"
            ),
        )));
    }
    file.append(&crc.to_le_bytes()).map_err(writing)?;
    file.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", tmp.display()), e))?;
    Ok((body_end + 4, largest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_patches_bytes_still_in_its_buffer_and_fails_on_bytes_written_already() {
        let disk = crate::storage::SimDisk::new();
        disk.create_dir_all(Path::new("/store")).expect("dir");
        let tmp = Path::new("/store/patched.tmp");
        let mut file = disk.create(tmp).expect("create");
        let mut stream = Stream {
            file: file.as_mut(),
            step: 4,
            buffer: Vec::new(),
            crc: crc32fast::Hasher::new(),
            written: 0,
            largest: 0,
            failed: None,
        };
        stream.extend_from_slice(b"abcd");
        stream.extend_from_slice(b"ef");
        assert_eq!(stream.position(), 6);
        stream.patch(4, b"EF");
        assert!(stream.failed.is_none(), "a patch of buffered bytes failed");
        stream.patch(0, b"A");
        assert!(stream.failed.is_some(), "a patch of written bytes was taken");
        stream.failed = None;
        stream.flush();
        drop(stream);
        assert_eq!(disk.file_bytes(tmp).expect("file"), b"abcdEF");
    }
}
