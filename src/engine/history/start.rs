//! Where the change feed starts: [`HistoryStart`], the smallest `after` from which the log still
//! holds every change.
//!
//! The log holds every change of a batch in its frame, from segment format 3 on (older segments
//! have no commit times and deletes without their scope). Compaction is what takes changes away: it
//! marks a rewritten frame it left records out of or retired records in (`altered`) and leaves out
//! frames it emptied, so that a rewritten segment skips their sequence numbers. So the feed can
//! start after the last sequence number of any segment older than format 3, of any altered frame,
//! and of any frame left out.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::log::record::{decode_record, RecordView, FRAME_HEADER_BYTES, RECORD_HEADER_BYTES};
use crate::log::segment::{Segment, SEGMENT_HEADER_BYTES};

use super::feed::{frame_len_and_seq, LogPart, FRAME_HEADER_LEN};

/// The first segment format whose frames hold every change they committed.
pub(crate) const HISTORY_FORMAT_MIN: u32 = 3;

/// The feed's start, kept per rewritten segment: a segment is read again only when compaction has
/// rewritten it since (its rewrite count changed).
#[derive(Debug, Default)]
pub(crate) struct HistoryStart {
    /// Segment number -> (its rewrite count when read, the last sequence number it took changes of).
    cuts: Mutex<HashMap<u32, (u32, u64)>>,
}

impl HistoryStart {
    /// The smallest `after` the feed accepts over `segments` (every segment of the store in number
    /// order, with the bytes of each to read) when the last sequence number is `last`.
    pub(crate) fn start(&self, segments: &[LogPart], last: u64) -> Result<u64> {
        let mut start = 0;
        for (i, part) in segments.iter().enumerate() {
            let segment = &part.segment;
            // The sequence number the next segment starts at, or the next one to be committed.
            let next_base = segments
                .get(i + 1)
                .map_or(last.saturating_add(1), |next| next.segment.base_seq);
            if segment.version < HISTORY_FORMAT_MIN {
                start = start.max(next_base.saturating_sub(1));
                continue;
            }
            if segment.rewrites == 0 {
                continue;
            }
            let number = part.number;
            let known = self.lock().get(&number).copied();
            let cut = match known {
                Some((rewrites, cut)) if rewrites == segment.rewrites => cut,
                _ => {
                    let cut = rewritten_cut(segment, part.end, next_base)?;
                    self.lock().insert(number, (segment.rewrites, cut));
                    cut
                }
            };
            start = start.max(cut);
        }
        Ok(start.min(last))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (u32, u64)>> {
        self.cuts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The last sequence number of a rewritten format-3 segment whose changes compaction took away
/// (0 if none): of an altered frame, or of a frame left out (a gap in the numbering, also before
/// `next_base`, where the next segment starts).
fn rewritten_cut(segment: &Segment, end: u64, next_base: u64) -> Result<u64> {
    let mut cut = 0;
    let mut expected = segment.base_seq;
    let mut at = SEGMENT_HEADER_BYTES as u64;
    while at + FRAME_HEADER_BYTES as u64 <= end {
        let head = segment.read(at, FRAME_HEADER_LEN)?;
        let (len, seq) = frame_len_and_seq(&head);
        if seq > expected {
            cut = cut.max(seq - 1);
        }
        if frame_mark(segment, at, len)?.1 {
            cut = cut.max(seq);
        }
        expected = seq + 1;
        at += FRAME_HEADER_BYTES as u64 + u64::from(len);
    }
    if next_base > expected {
        cut = cut.max(next_base - 1);
    }
    Ok(cut)
}

/// Bytes of a format-3 sync mark's body.
const SYNC_MARK_BODY_BYTES_V3: usize = 17;

/// The commit time and `altered` flag of the sync mark of the format-3 frame at `at` (payload
/// `len` bytes) of `segment`: its first record, read alone (its own CRC checks it).
pub(super) fn frame_mark(segment: &Segment, at: u64, len: u32) -> Result<(Option<i64>, bool)> {
    let mark_at = at + FRAME_HEADER_BYTES as u64 + 4;
    let mark_len = crate::num::low_u32(crate::num::u64_from_usize(
        RECORD_HEADER_BYTES + SYNC_MARK_BODY_BYTES_V3,
    ));
    let mark = segment.read(mark_at, mark_len.min(len.saturating_sub(4)))?;
    match decode_record(&mark) {
        Ok(RecordView::SyncMark {
            committed_at, altered, ..
        }) => Ok((committed_at, altered)),
        _ => Err(Error::Corrupt {
            file: segment.path.clone(),
            offset: at,
            reason: "a frame of a format-3 segment does not start with its sync mark".into(),
        }),
    }
}
