//! Reads of the past: when each batch committed ([`commit_time`], [`seq_as_of`], read from the
//! frames' sync marks), and the [`Floor`] below which compaction has reclaimed something a view of
//! the past would show, kept in the store's `history.floor` file (docs/FORMAT.md).
//!
//! A view of the past is a sequence number `s` and a time `c` that judges TTL. Compaction reclaims
//! a version only once no view it must keep can see it: the current state, the live and pinned
//! snapshots, and every moment within `Options::history_retention`. A reclaimed version is unseen
//! by every view with `s` at or past the batch that ended it (superseded or deleted), or by every
//! view with `c` at or past its expiry: compaction raises the floor's `seq` or `time` to whichever
//! of the two lies within what it keeps, before the rewrite that reclaims it is installed. A view
//! at or past both is answered exactly; one below either is `HistoryCompacted`.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::log::record::FRAME_HEADER_BYTES;
use crate::log::segment::SEGMENT_HEADER_BYTES;
use crate::storage::{sync_dir, Storage};

use super::feed::{frame_len_and_seq, LogPart, FRAME_HEADER_LEN};
use super::start::{frame_mark, HISTORY_FORMAT_MIN};

/// The file that keeps the floor.
pub(crate) const FLOOR_FILE: &str = "history.floor";
const FLOOR_MAGIC: &[u8; 8] = b"CTXFLOOR";
const FLOOR_VERSION: u32 = 1;
/// magic 8, version 4, seq 8, time 8, CRC 4.
const FLOOR_BYTES: usize = 32;

/// The oldest view of the past that is answered exactly: at or past `seq`, judging TTL at or past
/// `time`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Floor {
    pub(crate) seq: u64,
    pub(crate) time: i64,
}

impl Floor {
    /// Whether the view at `seq`, judging TTL at `time`, is answered exactly.
    pub(crate) fn admits(&self, seq: u64, time: i64) -> bool {
        seq >= self.seq && time >= self.time
    }

    /// The floor raised to `other` where it is higher.
    #[must_use]
    pub(crate) fn max(self, other: Floor) -> Floor {
        Floor {
            seq: self.seq.max(other.seq),
            time: self.time.max(other.time),
        }
    }

    fn encode(&self) -> [u8; FLOOR_BYTES] {
        let mut bytes = [0u8; FLOOR_BYTES];
        bytes[0..8].copy_from_slice(FLOOR_MAGIC);
        bytes[8..12].copy_from_slice(&FLOOR_VERSION.to_le_bytes());
        bytes[12..20].copy_from_slice(&self.seq.to_le_bytes());
        bytes[20..28].copy_from_slice(&self.time.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..28]);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8]) -> std::result::Result<Floor, String> {
        if bytes.len() != FLOOR_BYTES {
            return Err(format!("{} bytes, not {FLOOR_BYTES}", bytes.len()));
        }
        let word = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes.get(at..at + 8).unwrap_or(&[0; 8]));
            word
        };
        let mut crc = [0u8; 4];
        crc.copy_from_slice(bytes.get(28..32).unwrap_or(&[0; 4]));
        if crc32fast::hash(bytes.get(..28).unwrap_or_default()) != u32::from_le_bytes(crc) {
            return Err("its CRC does not match".into());
        }
        if bytes.get(..8) != Some(FLOOR_MAGIC.as_slice()) {
            return Err("it does not start with CTXFLOOR".into());
        }
        let mut version = [0u8; 4];
        version.copy_from_slice(bytes.get(8..12).unwrap_or(&[0; 4]));
        let version = u32::from_le_bytes(version);
        if version != FLOOR_VERSION {
            return Err(format!("version {version}, not {FLOOR_VERSION}"));
        }
        Ok(Floor {
            seq: u64::from_le_bytes(word(12)),
            time: i64::from_le_bytes(word(20)),
        })
    }
}

fn floor_path(dir: &Path) -> PathBuf {
    dir.join(FLOOR_FILE)
}

/// The floor kept in `dir`: `None` if the file is not there, `Some(Err(reason))` if it does not
/// decode (the caller falls back to a floor that refuses every earlier view).
///
/// # Errors
/// `Io` if the directory or the file cannot be read.
pub(crate) fn load_floor(storage: &dyn Storage, dir: &Path) -> Result<Option<std::result::Result<Floor, String>>> {
    let path = floor_path(dir);
    let names = storage
        .list(dir)
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    if !names.iter().any(|name| name == FLOOR_FILE) {
        return Ok(None);
    }
    let bytes = storage
        .read(&path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    Ok(Some(Floor::decode(&bytes)))
}

/// Makes `floor` the one kept in `dir`, durably: written whole to a temporary file, synced, and
/// renamed over the old one (a crash leaves the old floor or the new, and a stray `.tmp` that
/// opening removes).
///
/// # Errors
/// `Io` if a step fails.
pub(crate) fn store_floor(storage: &dyn Storage, dir: &Path, floor: Floor) -> Result<()> {
    let path = floor_path(dir);
    let tmp = dir.join(format!("{FLOOR_FILE}.tmp"));
    let io = |what: &str, e| Error::io(format!("{what} {}", tmp.display()), e);
    let mut file = storage.create(&tmp).map_err(|e| io("creating", e))?;
    file.append(&floor.encode()).map_err(|e| io("writing", e))?;
    file.sync_all().map_err(|e| io("syncing", e))?;
    drop(file);
    storage
        .rename(&tmp, &path)
        .map_err(|e| Error::io(format!("renaming {} to {}", tmp.display(), path.display()), e))?;
    sync_dir(storage, dir)
}

/// Calls `each(seq, committed_at)` for every frame of `part` from its start, in order, until it
/// breaks; `committed_at` is `None` for a frame of a format older than 3.
fn frames(part: &LogPart, mut each: impl FnMut(u64, Option<i64>) -> bool) -> Result<()> {
    let segment = &part.segment;
    let mut at = SEGMENT_HEADER_BYTES as u64;
    while at + FRAME_HEADER_BYTES as u64 <= part.end {
        let head = segment.read(at, FRAME_HEADER_LEN)?;
        let (len, seq) = frame_len_and_seq(&head);
        let committed_at = if segment.version >= HISTORY_FORMAT_MIN {
            frame_mark(segment, at, len)?.0
        } else {
            None
        };
        if !each(seq, committed_at) {
            break;
        }
        at += FRAME_HEADER_BYTES as u64 + u64::from(len);
    }
    Ok(())
}

/// The commit time of batch `seq` (0 for seq 0, before every batch), read from its frame in
/// `parts` (every segment in number order); `None` when the log no longer holds the frame or its
/// format records no commit time.
///
/// # Errors
/// `Corrupt` if a frame's header or sync mark cannot be read.
pub(crate) fn commit_time(parts: &[LogPart], seq: u64) -> Result<Option<i64>> {
    if seq == 0 {
        return Ok(Some(0));
    }
    let Some(part) = parts.iter().rev().find(|part| part.segment.base_seq <= seq) else {
        return Ok(None);
    };
    let mut found = None;
    frames(part, |at, committed_at| {
        if at == seq {
            found = committed_at;
        }
        at < seq
    })?;
    Ok(found)
}

/// The last sequence number committed at or before `t` over `parts` (every segment in number
/// order, up to `last`): `Ok(Ok(seq))` when the log shows it, `Ok(Err(bound))` when it cannot tell
/// (frames with no commit time, or frames left out around `t`), `bound` being the last seq it can
/// tell committed at or before `t` (0 if none), which is no later than the answer.
///
/// # Errors
/// `Corrupt` if a frame's header or sync mark cannot be read.
pub(crate) fn seq_as_of(parts: &[LogPart], last: u64, t: i64) -> Result<std::result::Result<u64, u64>> {
    // The segment to start from: the last whose first frame committed at or before `t`.
    let mut start = 0;
    for (i, part) in parts.iter().enumerate() {
        let mut first = None;
        frames(part, |seq, committed_at| {
            first = Some((seq, committed_at));
            false
        })?;
        match first {
            Some((_, Some(at))) if at <= t => start = i,
            Some((_, Some(_))) => break,
            _ => {}
        }
    }
    // The frame before the one being read, and the last one known to have committed at or
    // before `t`.
    let mut previous: Option<(u64, Option<i64>)> = None;
    let mut before = 0;
    let mut answer = None;
    for part in parts.iter().skip(start) {
        frames(part, |seq, committed_at| {
            if seq > last {
                return false;
            }
            match committed_at {
                Some(at) if at > t => {
                    // The answer is the frame just before this one, if the log shows it.
                    answer = Some(match previous {
                        None if seq == 1 => Ok(0),
                        Some((prev, Some(_))) if prev + 1 == seq => Ok(prev),
                        _ => Err(before),
                    });
                    return false;
                }
                Some(_) => before = seq,
                None => {}
            }
            previous = Some((seq, committed_at));
            true
        })?;
        if answer.is_some() {
            break;
        }
    }
    Ok(answer.unwrap_or(match previous {
        // Every frame up to `last` committed at or before `t`.
        Some((seq, Some(_))) if seq == last => Ok(last),
        None if last == 0 => Ok(0),
        _ => Err(before),
    }))
}

/// The floor of the views of the past, as the store in `dir` keeps it, and whether it still has to
/// be written. A store compacted by a build that kept none (a segment was rewritten, and no
/// `history.floor` is there), or whose floor file is damaged, gets one at its last seq and the
/// clock's `now`, written by the first commit (opening changes nothing): what compaction reclaimed
/// is not known, so no earlier view is answered.
pub(crate) fn open_floor(
    storage: &dyn crate::storage::Storage,
    dir: &Path,
    index: &crate::index::Index,
    now: i64,
) -> Result<(Floor, bool)> {
    match load_floor(storage, dir)? {
        Some(Ok(floor)) => return Ok((floor, false)),
        Some(Err(reason)) => {
            // Damaged: as if compacted by a build that kept none, which is always safe.
            tracing::warn!("{FLOOR_FILE} is damaged ({reason}): views of the past start from now");
        }
        None if !index.segments.values().any(|segment| segment.rewrites > 0) => {
            return Ok((Floor::default(), false));
        }
        None => {}
    }
    Ok((
        Floor {
            seq: index.seq,
            time: now,
        },
        true,
    ))
}
