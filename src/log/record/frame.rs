//! Frames: reading one (header, length and CRC checked), and completing one when it is written
//! (its sequence number and sync mark set, its CRCs computed).

use crate::limits::FRAME_PAYLOAD_BYTES_MAX;
use crate::num;

use super::cursor::Cursor;
use super::decode::decode_record;
use super::kinds::{RecordTag, RecordView};
use super::{FRAME_HEADER_BYTES, FRAME_KIND_BATCH, RECORD_HEADER_BYTES};

/// Where the sync mark's value sits in a frame: after the frame header, the record count and the
/// mark's record header.
const SYNC_MARK_AT: usize = FRAME_HEADER_BYTES + 4 + RECORD_HEADER_BYTES;

/// Sets a whole frame's sequence number and sync mark, and recomputes the mark's and the frame's
/// CRCs. A frame from [`BatchEncoder::finish`](super::BatchEncoder::finish) always starts with its
/// sync mark.
pub(crate) fn set_frame_header(frame: &mut [u8], seq: u64, synced: u64) {
    if let Some(slot) = frame.get_mut(SYNC_MARK_AT..SYNC_MARK_AT + 8) {
        slot.copy_from_slice(&synced.to_le_bytes());
    }
    let mark_crc = crc32fast::hash(frame.get(SYNC_MARK_AT..SYNC_MARK_AT + 8).unwrap_or_default());
    if let Some(slot) = frame.get_mut(SYNC_MARK_AT - 4..SYNC_MARK_AT) {
        slot.copy_from_slice(&mark_crc.to_le_bytes());
    }
    if let Some(slot) = frame.get_mut(9..17) {
        slot.copy_from_slice(&seq.to_le_bytes());
    }
    let crc = crc32fast::hash(frame.get(8..).unwrap_or_default());
    if let Some(slot) = frame.get_mut(4..8) {
        slot.copy_from_slice(&crc.to_le_bytes());
    }
}

/// The sync mark of a frame's payload (CRC already checked), if its first record is one: frames of
/// segment format 1 have none.
pub(crate) fn frame_sync_mark(payload: &[u8]) -> Option<u64> {
    let record = payload.get(4..4 + RECORD_HEADER_BYTES + 8)?;
    if record.first() != Some(&(RecordTag::SyncMark as u8)) {
        return None;
    }
    match decode_record(record) {
        Ok(RecordView::SyncMark { synced }) => Some(synced),
        _ => None,
    }
}

/// A frame header as read from disk, before its CRC is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub(crate) len: u32,
    pub(crate) crc: u32,
    pub(crate) kind: u8,
    pub(crate) seq: u64,
}

/// How a frame at some offset failed to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// The bytes end before the frame does: the header or the payload is cut short.
    Short,
    /// The frame is whole but wrong: bad CRC, unknown kind, oversized length.
    Bad(String),
}

/// Reads the frame that starts at the beginning of `bytes`: its header and payload, CRC checked.
pub(crate) fn read_frame(bytes: &[u8]) -> Result<(FrameHeader, &[u8]), FrameError> {
    let mut cursor = Cursor::new(bytes);
    let (Ok(len), Ok(crc), Ok(kind), Ok(seq)) = (cursor.u32(""), cursor.u32(""), cursor.u8(""), cursor.u64("")) else {
        return Err(FrameError::Short);
    };
    let header = FrameHeader { len, crc, kind, seq };
    let len_usize = num::usize_from_u32(len);
    if len_usize > FRAME_PAYLOAD_BYTES_MAX {
        return Err(FrameError::Bad(format!(
            "frame length {len} is over the limit {FRAME_PAYLOAD_BYTES_MAX}"
        )));
    }
    let Some(payload) = bytes.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len_usize) else {
        return Err(FrameError::Short);
    };
    let covered = bytes.get(8..FRAME_HEADER_BYTES + len_usize).unwrap_or_default();
    let actual = crc32fast::hash(covered);
    if actual != crc {
        return Err(FrameError::Bad(format!(
            "frame CRC mismatch: stored {crc:#010x}, computed {actual:#010x}"
        )));
    }
    if kind != FRAME_KIND_BATCH {
        return Err(FrameError::Bad(format!("unknown frame kind {kind}")));
    }
    Ok((header, payload))
}
