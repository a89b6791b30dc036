//! The frame and record codec: how one batch is laid out in a segment. docs/FORMAT.md is the
//! normative description; the tables below repeat it beside the code.
//!
//! Frame (all integers little-endian):
//!
//! | offset | width | field                                              |
//! |--------|-------|----------------------------------------------------|
//! | 0      | 4     | `len`: payload bytes (u32)                         |
//! | 4      | 4     | `crc`: CRC-32 (IEEE) of bytes 8..17+len            |
//! | 8      | 1     | `kind`: 1 = batch                                  |
//! | 9      | 8     | `seq`: sequence number of the batch (u64)          |
//! | 17     | len   | payload: `count` u32, then `count` records         |
//!
//! Record:
//!
//! | offset | width | field                                   |
//! |--------|-------|-----------------------------------------|
//! | 0      | 1     | `tag`: 1 = put, 2 = delete, 3 = register type, 4 = retired version, 5 = pin, 6 = unpin, 7 = sync mark |
//! | 1      | 4     | `body_len` (u32)                         |
//! | 5      | 4     | `crc`: CRC-32 of the body                |
//! | 9      | body_len | body                                 |
//!
//! The codec's parts: [`cursor`](mod@cursor) reads bytes, [`kinds`] holds the record tags and the
//! records as they are encoded ([`PutRef`]) and decoded ([`RecordView`], [`PutView`]),
//! [`encode`](mod@encode) builds a batch's frame record by record ([`BatchEncoder`]),
//! [`decode`](mod@decode) takes a batch payload apart into its records, and [`frame`] reads a
//! frame's header and sets its sequence number and sync mark. Each looks only at those listed
//! before it.
//!
//! Segment format 3 (docs/FORMAT.md) differs from format 2 in three record bodies: a frame's sync
//! mark adds the batch's commit time and a flags byte (17 bytes instead of 8), a delete adds the
//! scope and type of the version it ended, and a retired record the type and scope of the version
//! it replaces. Both forms decode, told apart by the body's length, and
//! [`check_frame_format`] checks that a frame holds those of its segment's format.

mod cursor;
mod decode;
mod encode;
mod frame;
mod kinds;

pub(crate) use cursor::Cursor;
pub(crate) use decode::{decode_batch, decode_checked_record, decode_record, split_batch};
pub(crate) use encode::{encode_put, BatchEncoder};
pub(crate) use frame::{check_frame_format, frame_sync_mark, read_frame, set_frame_header, FrameError};
pub(crate) use kinds::{PutRef, PutView, RecordTag, RecordView, ScopeView};

/// Bytes of a frame header.
pub(crate) const FRAME_HEADER_BYTES: usize = 4 + 4 + 1 + 8;
/// Bytes of a record header.
pub(crate) const RECORD_HEADER_BYTES: usize = 1 + 4 + 4;
/// The frame kind of a batch.
pub(crate) const FRAME_KIND_BATCH: u8 = 1;
/// Where the body of a frame's sync mark starts: after the frame header, the record count and the
/// mark's record header.
const SYNC_MARK_AT: usize = FRAME_HEADER_BYTES + 4 + RECORD_HEADER_BYTES;

/// Why bytes could not be decoded; the caller turns it into `Error::Corrupt` with file and offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) String);

/// A [`DecodeError`] giving `reason`.
fn bad(reason: impl Into<String>) -> DecodeError {
    DecodeError(reason.into())
}

#[cfg(test)]
mod tests;
