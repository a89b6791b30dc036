//! Index checkpoints: the whole in-memory index as of sequence number S, in one checksummed file,
//! so that opening loads it and replays only the log after S.
//!
//! A checkpoint is only ever a shortcut: it records the exact segment files it was taken over
//! (number, rewrite count, length); opening checks them and falls back to a full replay of the log
//! when anything disagrees or the file is damaged. docs/FORMAT.md gives the layout byte by byte.
//!
//! This file holds the files' naming and listing, and the writing of one under the index's read
//! lock; [`encode`](mod@encode) and [`stream`](mod@stream) put the index into bytes (buffered, or
//! streamed to the file), [`decode`](mod@decode) and [`versions`] take them back. It stands in the
//! engine because it reads the index through the store's shared state and syncs the log first.

mod decode;
mod encode;
mod stream;
#[cfg(test)]
mod tests;
mod versions;

use std::path::{Path, PathBuf};

use crate::engine::shared::Shared;
use crate::error::{Error, Result};
use crate::index::Index;
use crate::storage::{append_prepared, sync_dir, Storage};

pub(crate) use decode::{decode, is_older_format};
use encode::{body_capacity, check_counts, encode_body_into, seal_in_place};
use stream::{stream, STREAM_STEP};

/// The magic bytes that open every checkpoint file.
const CHECKPOINT_MAGIC: [u8; 8] = *b"CTXLOGCP";
/// The checkpoint format version this build writes and reads.
const CHECKPOINT_VERSION: u32 = 7;
/// Bytes of the checkpoint header: magic, version, reserved, seq, the commit time of the batch at
/// seq, body length.
const CHECKPOINT_HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8 + 8;
/// Bytes of one version in the version table.
const VERSION_BYTES: usize = 72;

/// State byte of a version in the version table.
const STATE_STORED: u8 = 0;
const STATE_RETIRED: u8 = 1;

/// How long a checkpoint waits for a group applied to the index during its fsync to be published.
const UNPUBLISHED_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The file name of a checkpoint as of `seq`; the digits sort like the numbers.
pub(crate) fn checkpoint_file_name(seq: u64) -> String {
    format!("checkpoint-{seq:020}.idx")
}

/// The temporary file a checkpoint as of `seq` is written to before it is renamed into place.
fn checkpoint_tmp_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{}.tmp", checkpoint_file_name(seq)))
}

fn parse_checkpoint_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?.strip_suffix(".idx")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Checkpoint files in `dir`, newest first.
pub(crate) fn list(storage: &dyn Storage, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    let names = storage
        .list(dir)
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for name in names {
        if let Some(seq) = parse_checkpoint_file_name(&name) {
            found.push((seq, dir.join(name)));
        }
    }
    found.sort_unstable_by_key(|(seq, _)| std::cmp::Reverse(*seq));
    Ok(found)
}

/// One segment file as a checkpoint saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentMark {
    pub(crate) number: u32,
    pub(crate) rewrites: u32,
    /// Bytes of the file covered by the checkpoint; for the last (active) one, replay goes on here.
    pub(crate) len: u64,
}

/// A decoded checkpoint.
pub(crate) struct Loaded {
    pub(crate) seq: u64,
    pub(crate) segments: Vec<SegmentMark>,
    pub(crate) index: Index,
}

/// Runs `f` on the index once no group is half in it, waiting while one is:
/// - a group applied to the index ahead of its fsync and not yet published: a checkpoint taken
///   then would hold versions past its sequence number, which loading refuses;
/// - a group whose writer sealed a segment in the middle of it (the next frame did not fit), not
///   yet published: the sealed segment is in the index with its whole length, frames past the
///   index's sequence number included, and the new one starts past the sequence number after it.
///   A checkpoint taken then would mark the sealed segment as covered and resume in the new one at
///   a sequence number that is not there: the next open would refuse it and replay the whole log.
///
/// The wait is bounded (the maintenance thread tries again later).
fn with_published_index<T>(shared: &Shared, f: impl FnOnce(&Index, Vec<SegmentMark>) -> T) -> Result<T> {
    let waiting_since = std::time::Instant::now();
    loop {
        let index = shared.read_index();
        if !index.unpublished.is_none() || index.newest_segment_ahead().is_some() {
            if index.unpublished.failed {
                return Err(Error::Poisoned {
                    reason: "the index holds a group whose fsync failed".into(),
                });
            }
            drop(index);
            if waiting_since.elapsed() >= UNPUBLISHED_WAIT_MAX {
                return Err(Error::io(
                    "waiting for a group's fsync before a checkpoint",
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
            continue;
        }
        let marks: Vec<SegmentMark> = index
            .segments
            .iter()
            .map(|(number, segment)| SegmentMark {
                number: *number,
                rewrites: segment.rewrites,
                len: segment.published_len(),
            })
            .collect();
        return Ok(f(&index, marks));
    }
}

/// Writes a checkpoint of the index as it is now. With `sync_log`, the log is synced first up to
/// at least the checkpoint's sequence number, so that a checkpoint never gets ahead of the log.
///
/// The checkpoint is encoded into a buffer of its size under the index's read lock and written
/// after it, so that writers wait for the encoding only; [`write_streamed`] needs no such buffer.
pub(crate) fn write(shared: &Shared, sync_log: bool) -> Result<u64> {
    // The file's buffer is sized and its pages touched before the lock is taken for the encoding,
    // so that writers do not wait for the page faults of tens of megabytes of fresh memory. What
    // the log gains in between (a few batches) fits in the slack; more only grows the buffer.
    let capacity = {
        let index = shared.read_index();
        CHECKPOINT_HEADER_BYTES + body_capacity(&index) + 4
    };
    let capacity = capacity + capacity / 16;
    // Written, not just allocated: `vec![0; n]` would map zero pages that fault on first write.
    #[allow(clippy::slow_vector_initialization)]
    let mut file = {
        let mut file = Vec::with_capacity(capacity);
        file.resize(capacity, 0);
        file
    };
    file.clear();
    file.extend_from_slice(&[0; CHECKPOINT_HEADER_BYTES]);
    let (seq, committed_at) = with_published_index(shared, |index, marks| {
        check_counts(index, &marks)?;
        encode_body_into(&mut file, index, &marks, None);
        Ok::<_, Error>((index.seq, index.committed_at))
    })??;
    // The header and the checksum are filled in after the lock is released.
    seal_in_place((seq, committed_at), &mut file);
    let bytes = file;
    if sync_log {
        shared.flush()?;
    }
    install(&*shared.storage, &shared.dir, seq, &bytes)?;
    shared.last_checkpoint_bytes.store(
        crate::num::u64_from_usize(bytes.len()),
        std::sync::atomic::Ordering::Relaxed,
    );
    Ok(seq)
}

/// Writes a checkpoint of the index as it is now, as [`write`](fn@write) does but streamed to its
/// file in steps of [`STREAM_STEP`] bytes, under the index's read lock: for a store that is closing,
/// whose log is synced and which no writer uses any more. Its memory is bounded by the step instead
/// of the checkpoint's size.
pub(crate) fn write_streamed(shared: &Shared) -> Result<u64> {
    let storage = &*shared.storage;
    let (seq, len) = with_published_index(shared, |index, marks| {
        let tmp = checkpoint_tmp_path(&shared.dir, index.seq);
        stream(storage, &tmp, index, &marks, STREAM_STEP).map(|(len, _)| (index.seq, len))
    })??;
    publish(storage, &shared.dir, seq)?;
    shared
        .last_checkpoint_bytes
        .store(len, std::sync::atomic::Ordering::Relaxed);
    Ok(seq)
}

/// Writes `bytes` as the checkpoint for `seq`: temporary file, sync, rename, sync the directory;
/// then removes older checkpoints.
pub(crate) fn install(storage: &dyn Storage, dir: &Path, seq: u64, bytes: &[u8]) -> Result<()> {
    let tmp = checkpoint_tmp_path(dir, seq);
    let mut file = storage
        .create(&tmp)
        .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
    append_prepared(file.as_mut(), 0, bytes).map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    file.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", tmp.display()), e))?;
    drop(file);
    publish(storage, dir, seq)
}

/// Renames the synced temporary file of the checkpoint for `seq` into place, syncs the directory,
/// then removes older checkpoints.
fn publish(storage: &dyn Storage, dir: &Path, seq: u64) -> Result<()> {
    let path = dir.join(checkpoint_file_name(seq));
    let tmp = checkpoint_tmp_path(dir, seq);
    storage
        .rename(&tmp, &path)
        .map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))?;
    sync_dir(storage, dir)?;
    for (old_seq, old) in list(storage, dir)? {
        if old_seq != seq {
            storage
                .remove(&old)
                .map_err(|e| Error::io(format!("removing {}", old.display()), e))?;
        }
    }
    Ok(())
}
