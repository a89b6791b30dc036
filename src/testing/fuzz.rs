//! Entry points for the decoder fuzz targets in `fuzz/` and for `tests/fuzz_regressions.rs`, which
//! replays their seeds and past crash inputs, and the check every store a fuzz target or test opens
//! goes through ([`opened_store_problem`]). Not part of the API: hidden from the docs, and free to
//! change.
//!
//! Each function runs crate-internal decoders over arbitrary bytes and returns something cheap. None
//! of them may panic, whatever the bytes: a panic here is a bug in the decoder it calls.
//!
//! The decoders check CRCs before they look at anything else, so random bytes seldom get past them.
//! The `seal_*` helpers recompute every checksum an input's own length fields let them find, so that
//! a fuzz target can try each input as it is and once more with valid checksums, and reach the code
//! behind them.

use crate::engine::checkpoint;
use crate::engine::recovery::{scan_frames, ScanEnd};
use crate::log::record::{
    decode_batch, decode_record, read_frame, RecordView, FRAME_HEADER_BYTES, RECORD_HEADER_BYTES,
};
use crate::log::segment::{SegmentHeader, SEGMENT_HEADER_BYTES};

fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let end = at.checked_add(4)?;
    bytes.get(at..end)?.try_into().ok().map(u32::from_le_bytes)
}

fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let end = at.checked_add(8)?;
    bytes.get(at..end)?.try_into().ok().map(u64::from_le_bytes)
}

fn put_crc(bytes: &mut [u8], at: usize, covered: std::ops::Range<usize>) {
    let crc = crc32fast::hash(bytes.get(covered).unwrap_or_default());
    if let Some(slot) = bytes.get_mut(at..at + 4) {
        slot.copy_from_slice(&crc.to_le_bytes());
    }
}

/// What is wrong with a store just opened, if anything: the next batch's seq (the index's seq + 1)
/// must be at or past the newest segment's first. A store behind it would write seqs below its
/// segment's first, and every checkpoint would wait for a group that never comes.
#[must_use]
pub fn opened_store_problem(store: &crate::Store) -> Option<String> {
    let index = store.shared().read_index();
    let (number, base_seq) = index.newest_segment_ahead()?;
    Some(format!(
        "opened at seq {}, but its newest segment {number} starts at seq {base_seq}",
        index.seq
    ))
}

/// Decodes the frame at the start of `bytes`: `read_frame`, then `decode_batch` on its payload,
/// then `decode_record` on every record at its location and `to_item` on every put. Returns the
/// number of records decoded, 0 when the frame or batch is refused.
pub fn decode_frame(bytes: &[u8]) -> usize {
    let Ok((_, payload)) = read_frame(bytes) else {
        return 0;
    };
    let Ok(records) = decode_batch(payload) else {
        return 0;
    };
    let mut decoded = 0;
    for (start, len, record) in &records {
        let Some(at) = start.checked_add(*len).and_then(|end| payload.get(*start..end)) else {
            continue;
        };
        if decode_record(at).as_ref() == Ok(record) {
            decoded += 1;
        }
        if let RecordView::Put(put) = record {
            let _ = put.to_item();
            let _ = put.expires_at();
        }
    }
    decoded
}

/// Decodes a segment's header and scans its frames from offset 32, as opening does, once as the
/// newest segment (a bad tail may be torn) and once as a sealed one, decoding every batch. When the
/// header is refused, the frames are still scanned from the base seq the bytes hold. Returns the
/// number of frames visited by both scans.
pub fn scan_segment(bytes: &[u8]) -> usize {
    let (base_seq, allow_gaps) = match SegmentHeader::decode(bytes) {
        Ok(header) => (header.base_seq, header.rewrites > 0),
        Err(_) => (le_u64(bytes, 16).unwrap_or(1), false),
    };
    let mut frames = 0;
    for newest in [true, false] {
        let mut next_seq = base_seq;
        let mut visit = |_seq: u64, _offset: usize, payload: &[u8]| -> Result<(), String> {
            frames += 1;
            decode_batch(payload).map(|_| ()).map_err(|e| e.0)
        };
        match scan_frames(
            bytes,
            SEGMENT_HEADER_BYTES,
            &mut next_seq,
            newest,
            allow_gaps,
            &mut visit,
        ) {
            ScanEnd::Clean { end } => debug_assert!(end >= SEGMENT_HEADER_BYTES),
            ScanEnd::Bad { offset, .. } => debug_assert!(offset < bytes.len()),
        }
    }
    frames
}

/// Decodes a checkpoint file's bytes. Returns whether they were accepted.
pub fn decode_checkpoint(bytes: &[u8]) -> bool {
    checkpoint::decode(bytes).is_ok()
}

/// Recomputes the CRCs of the frame at the start of `bytes` (each record's whose body is whole,
/// then the frame's when its payload is whole), in place. Returns the frame's length when its
/// payload is whole.
pub fn seal_frame_in_place(bytes: &mut [u8]) -> Option<usize> {
    let len = usize::try_from(le_u32(bytes, 0)?).ok()?;
    let frame_end = FRAME_HEADER_BYTES.checked_add(len)?;
    let payload_end = frame_end.min(bytes.len());
    // Records follow the 4-byte count.
    let mut at = FRAME_HEADER_BYTES + 4;
    while at + RECORD_HEADER_BYTES <= payload_end {
        let Some(body_len) = le_u32(bytes, at + 1).and_then(|n| usize::try_from(n).ok()) else {
            break;
        };
        let body_start = at + RECORD_HEADER_BYTES;
        let Some(body_end) = body_start.checked_add(body_len).filter(|end| *end <= payload_end) else {
            break;
        };
        put_crc(bytes, at + 5, body_start..body_end);
        at = body_end;
    }
    if frame_end > bytes.len() {
        return None;
    }
    put_crc(bytes, 4, 8..frame_end);
    Some(frame_end)
}

/// A copy of `bytes` with the frame at its start sealed (see [`seal_frame_in_place`]).
#[must_use]
pub fn seal_frame(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let _ = seal_frame_in_place(&mut out);
    out
}

/// A copy of segment bytes with the header CRC recomputed and every frame sealed, frame after
/// frame, as far as their length fields lead.
#[must_use]
pub fn seal_segment(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if out.len() >= SEGMENT_HEADER_BYTES {
        put_crc(&mut out, 28, 0..28);
    }
    let mut at = SEGMENT_HEADER_BYTES;
    while at < out.len() {
        match out.get_mut(at..).and_then(seal_frame_in_place) {
            Some(len) => at += len,
            None => break,
        }
    }
    out
}

/// A copy of checkpoint bytes whose last four bytes are the CRC of the others.
#[must_use]
pub fn seal_checkpoint(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if let Some(at) = out.len().checked_sub(4) {
        put_crc(&mut out, at, 0..at);
    }
    out
}

/// What the `decode_frame` fuzz target runs: [`decode_frame`] on the bytes as they are, then on
/// [`seal_frame`] of them when that differs.
pub fn fuzz_decode_frame(bytes: &[u8]) -> usize {
    let raw = decode_frame(bytes);
    let sealed = seal_frame(bytes);
    if sealed == bytes {
        raw
    } else {
        raw + decode_frame(&sealed)
    }
}

/// What the `scan_segment` fuzz target runs: [`scan_segment`] as is, then sealed.
pub fn fuzz_scan_segment(bytes: &[u8]) -> usize {
    let raw = scan_segment(bytes);
    let sealed = seal_segment(bytes);
    if sealed == bytes {
        raw
    } else {
        raw + scan_segment(&sealed)
    }
}

/// What the `decode_checkpoint` fuzz target runs: [`decode_checkpoint`] as is, then sealed.
pub fn fuzz_decode_checkpoint(bytes: &[u8]) -> usize {
    let raw = decode_checkpoint(bytes);
    let sealed = seal_checkpoint(bytes);
    let sealed_ok = sealed != bytes && decode_checkpoint(&sealed);
    usize::from(raw) + usize::from(sealed_ok)
}
