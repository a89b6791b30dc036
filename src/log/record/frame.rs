//! Frames: reading one (header, length and CRC checked), checking that its records are of its
//! segment's format, and completing one when it is written (its sequence number and sync mark
//! set, its CRCs computed).

use crate::limits::FRAME_PAYLOAD_BYTES_MAX;
use crate::num;

use super::cursor::Cursor;
use super::decode::decode_record;
use super::kinds::{RecordTag, RecordView, SYNC_MARK_V3_BYTES};
use super::{bad, DecodeError, FRAME_HEADER_BYTES, FRAME_KIND_BATCH, RECORD_HEADER_BYTES, SYNC_MARK_AT};

/// Sets a whole frame's sequence number and sync mark (`synced`, and in a format 3 frame
/// `committed_at`; its flags are left as they are), and recomputes the mark's and the frame's
/// CRCs. A frame from [`BatchEncoder::finish`](super::BatchEncoder::finish) always starts with its
/// sync mark.
pub(crate) fn set_frame_header(frame: &mut [u8], seq: u64, synced: u64, committed_at: i64) {
    let mark_len = frame
        .get(SYNC_MARK_AT - 8..SYNC_MARK_AT - 4)
        .and_then(|len| len.try_into().ok())
        .map_or(0, |len| num::usize_from_u32(u32::from_le_bytes(len)));
    if let Some(slot) = frame.get_mut(SYNC_MARK_AT..SYNC_MARK_AT + 8) {
        slot.copy_from_slice(&synced.to_le_bytes());
    }
    if mark_len == SYNC_MARK_V3_BYTES {
        if let Some(slot) = frame.get_mut(SYNC_MARK_AT + 8..SYNC_MARK_AT + 16) {
            slot.copy_from_slice(&committed_at.to_le_bytes());
        }
    }
    let mark_crc = crc32fast::hash(frame.get(SYNC_MARK_AT..SYNC_MARK_AT + mark_len).unwrap_or_default());
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

/// The `synced` field of the sync mark of a frame's payload (CRC already checked), if its first
/// record is one (of format 2 or 3): frames of segment format 1 have none.
pub(crate) fn frame_sync_mark(payload: &[u8]) -> Option<u64> {
    let mut header = Cursor::new(payload.get(4..4 + RECORD_HEADER_BYTES)?);
    if header.u8("record tag").ok()? != RecordTag::SyncMark as u8 {
        return None;
    }
    let body_len = num::usize_from_u32(header.u32("record length").ok()?);
    let record = payload.get(4..4 + RECORD_HEADER_BYTES + body_len.min(SYNC_MARK_V3_BYTES))?;
    match decode_record(record) {
        Ok(RecordView::SyncMark { synced, .. }) => Some(synced),
        _ => None,
    }
}

/// Checks that a frame's decoded records (each with its offset and length, header included) are of
/// the format of the segment holding them, `version`: a frame of format 3 starts with a format 3
/// sync mark (which has a commit time), and its deletes and retired records have their format 3
/// bodies (with a type and scope); a frame of format 1 or 2 holds none of these.
pub(crate) fn check_frame_format(version: u32, records: &[(usize, usize, RecordView<'_>)]) -> Result<(), DecodeError> {
    let format_3 = version >= 3;
    if format_3 && !records.first().is_some_and(|(_, _, record)| has_time(record)) {
        return Err(bad(format!(
            "a frame of segment format {version} does not start with a sync mark of its format"
        )));
    }
    for (_, len, record) in records {
        let (what, of_format_3) = match record {
            RecordView::SyncMark { .. } if !format_3 => ("sync mark", has_time(record)),
            // A format 3 delete whose scope is unknown decodes as the old form does: its length
            // tells them apart (the old body ends after the id).
            RecordView::Delete { id, .. } => ("delete", *len > RECORD_HEADER_BYTES + 1 + id.len()),
            RecordView::Retired { kind, .. } => ("retired record", kind.is_some()),
            _ => continue,
        };
        if of_format_3 != format_3 {
            let of = if of_format_3 { "3" } else { "1 or 2" };
            return Err(bad(format!(
                "a frame of segment format {version} holds a {what} of format {of}"
            )));
        }
    }
    Ok(())
}

/// Whether `record` is a sync mark of format 3 (which has a commit time).
fn has_time(record: &RecordView<'_>) -> bool {
    matches!(
        record,
        RecordView::SyncMark {
            committed_at: Some(_),
            ..
        }
    )
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
