//! Encoding: put records (content LZ4-compressed when that pays), the other records, and a batch's
//! frame built record by record ([`BatchEncoder`]).

use crate::error::{Error, Result};
use crate::item::TypeSpec;
use crate::limits::FRAME_PAYLOAD_BYTES_MAX;
use crate::num;

use super::kinds::{
    PutRef, RecordTag, ScopeTag, ScopeView, FLAG_CONFIDENCE, FLAG_LZ4, FLAG_TTL, MARK_ALTERED, SCOPE_UNKNOWN,
    SYNC_MARK_V2_BYTES, SYNC_MARK_V3_BYTES,
};
use super::{FRAME_HEADER_BYTES, FRAME_KIND_BATCH, RECORD_HEADER_BYTES, SYNC_MARK_AT};

/// Content shorter than this is stored as it is: compressing it saves too little.
const COMPRESS_BYTES_MIN: usize = 128;

/// Appends `s` after its length in one byte: an id, a type, a version, a session id or a snapshot
/// name, which validation keeps within [`crate::limits::ID_BYTES_MAX`] (128) bytes.
fn put_len_prefixed_u8(out: &mut Vec<u8>, s: &str) {
    out.push(num::bounded(s.len(), "name length"));
    out.extend_from_slice(s.as_bytes());
}

/// Appends `s` after its length in two bytes: a source or an id pattern, which validation keeps
/// within [`crate::limits::SOURCE_BYTES_MAX`] and [`crate::limits::ID_PATTERN_BYTES_MAX`] bytes.
fn put_len_prefixed_u16(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&num::bounded::<u16, _>(s.len(), "source or id pattern length").to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Writes a record header and body to `out`, returning the record's offset in `out`.
fn push_record(out: &mut Vec<u8>, tag: RecordTag, body: impl FnOnce(&mut Vec<u8>)) -> usize {
    let start = out.len();
    out.push(tag as u8);
    out.extend_from_slice(&[0u8; 8]);
    let body_start = out.len();
    body(out);
    let body_len = out.len() - body_start;
    let crc = crc32fast::hash(out.get(body_start..).unwrap_or_default());
    // A body is at most a put's fields and its content, within `limits::CONTENT_BYTES_MAX`.
    let len_bytes = num::bounded::<u32, _>(body_len, "record body length").to_le_bytes();
    if let Some(slot) = out.get_mut(start + 1..start + 5) {
        slot.copy_from_slice(&len_bytes);
    }
    if let Some(slot) = out.get_mut(start + 5..start + 9) {
        slot.copy_from_slice(&crc.to_le_bytes());
    }
    start
}

/// Appends the compressed content field (field length, content length, LZ4 block) straight into
/// `out` when `content` is long enough and compresses by at least an eighth; otherwise leaves `out`
/// as it was and returns false.
fn compress_into(out: &mut Vec<u8>, content: &[u8]) -> bool {
    if content.len() < COMPRESS_BYTES_MIN {
        return false;
    }
    let field_at = out.len();
    let block_at = field_at + 8;
    out.resize(block_at + lz4_flex::block::get_maximum_output_size(content.len()), 0);
    let written = out
        .get_mut(block_at..)
        .and_then(|space| lz4_flex::block::compress_into(content, space).ok());
    match written {
        Some(block_len) if block_len + 4 <= content.len() - content.len() / 8 => {
            out.truncate(block_at + block_len);
            let field_len = num::bounded::<u32, _>(block_len + 4, "compressed content length").to_le_bytes();
            let content_len = num::bounded::<u32, _>(content.len(), "content length").to_le_bytes();
            if let Some(slot) = out.get_mut(field_at..field_at + 4) {
                slot.copy_from_slice(&field_len);
            }
            if let Some(slot) = out.get_mut(field_at + 4..block_at) {
                slot.copy_from_slice(&content_len);
            }
            true
        }
        _ => {
            out.truncate(field_at);
            false
        }
    }
}

/// One put record, header and CRC included, as `BatchEncoder::put` (tests only) appends it. Writers
/// encode (and compress) their items on their own threads with this, so that the writer thread
/// only copies the bytes into the frame.
pub(crate) fn encode_put(put: &PutRef<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + put.content.len() + 128);
    push_record(&mut out, RecordTag::Put, |out| put_body(out, put));
    out
}

/// A scope's tag and session id (empty for a global scope), as records store them.
fn scope_parts(scope: ScopeView<'_>) -> (ScopeTag, &str) {
    match scope {
        ScopeView::Session(id) => (ScopeTag::Session, id),
        ScopeView::GlobalReadonly => (ScopeTag::GlobalReadonly, ""),
        ScopeView::GlobalWritable => (ScopeTag::GlobalWritable, ""),
    }
}

/// Appends a scope as records store it: its tag, then the session id (u8 length).
fn put_scope(out: &mut Vec<u8>, scope: ScopeView<'_>) {
    let (tag, session) = scope_parts(scope);
    out.push(tag as u8);
    put_len_prefixed_u8(out, session);
}

/// The body of a put record.
fn put_body(out: &mut Vec<u8>, put: &PutRef<'_>) {
    let mut flags = 0u8;
    if put.ttl_seconds.is_some() {
        flags |= FLAG_TTL;
    }
    if put.confidence.is_some() {
        flags |= FLAG_CONFIDENCE;
    }
    let flags_at = out.len();
    out.push(flags);
    let (scope_tag, session) = scope_parts(ScopeView::from(put.scope));
    out.push(scope_tag as u8);
    out.extend_from_slice(&put.timestamp.to_le_bytes());
    out.extend_from_slice(&put.ttl_seconds.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&put.confidence.unwrap_or(0.0).to_bits().to_le_bytes());
    out.extend_from_slice(put.hash);
    put_len_prefixed_u8(out, put.id);
    put_len_prefixed_u8(out, put.kind);
    put_len_prefixed_u8(out, put.version);
    put_len_prefixed_u8(out, session);
    put_len_prefixed_u16(out, put.source);
    if put.compress && compress_into(out, put.content) {
        if let Some(stored) = out.get_mut(flags_at) {
            *stored |= FLAG_LZ4;
        }
    } else {
        out.extend_from_slice(&num::bounded::<u32, _>(put.content.len(), "content length").to_le_bytes());
        out.extend_from_slice(put.content);
    }
}

/// Builds the payload of one batch frame, record by record.
pub(crate) struct BatchEncoder {
    buf: Vec<u8>,
    count: u32,
    /// Whether the frame is of segment format 3 (its sync mark 17 bytes, its deletes and retired
    /// records with a type and scope) or of format 2.
    format_3: bool,
}

impl BatchEncoder {
    /// Starts a frame of the current segment format (3): the header is filled in by
    /// [`BatchEncoder::finish`]. The frame's first record is its sync mark, filled in by
    /// [`set_frame_header`](super::set_frame_header).
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::with_capacity(0)
    }

    /// [`BatchEncoder::new`] with room for `records` bytes of records, so that a large batch's
    /// frame is not copied again each time it outgrows its buffer.
    pub(crate) fn with_capacity(records: usize) -> Self {
        Self::start(records, true)
    }

    /// Starts a frame for a segment of format `version`, as compaction rewrites it: a format 3
    /// frame for format 3, otherwise a format 2 frame (8-byte sync mark, deletes and retired records
    /// without a type and scope), which is also what a rewritten format 1 segment holds.
    pub(crate) fn for_format(version: u32) -> Self {
        Self::start(0, version >= 3)
    }

    fn start(records: usize, format_3: bool) -> Self {
        let mut buf = Vec::with_capacity(256 + records);
        buf.extend_from_slice(&[0u8; FRAME_HEADER_BYTES + 4]);
        let mark_bytes = if format_3 {
            SYNC_MARK_V3_BYTES
        } else {
            SYNC_MARK_V2_BYTES
        };
        push_record(&mut buf, RecordTag::SyncMark, |out| {
            out.resize(out.len() + mark_bytes, 0)
        });
        BatchEncoder {
            buf,
            count: 1,
            format_3,
        }
    }

    /// Sets a format 3 frame's `committed_at` and `altered` flag in its sync mark (compaction keeps
    /// a frame's time and says whether it left out or retired a record of it); a format 2 frame has
    /// neither, and is left as it is.
    pub(crate) fn set_mark(&mut self, committed_at: i64, altered: bool) {
        if !self.format_3 {
            return;
        }
        let body = SYNC_MARK_AT..SYNC_MARK_AT + SYNC_MARK_V3_BYTES;
        if let Some(slot) = self.buf.get_mut(body.start + 8..body.start + 16) {
            slot.copy_from_slice(&committed_at.to_le_bytes());
        }
        if let Some(flags) = self.buf.get_mut(body.start + 16) {
            *flags = if altered { MARK_ALTERED } else { 0 };
        }
        let crc = crc32fast::hash(self.buf.get(body).unwrap_or_default());
        if let Some(slot) = self.buf.get_mut(SYNC_MARK_AT - 4..SYNC_MARK_AT) {
            slot.copy_from_slice(&crc.to_le_bytes());
        }
    }

    /// Bytes encoded so far, header included.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Appends a put record; returns its offset from the frame start.
    #[cfg(test)]
    pub(crate) fn put(&mut self, put: &PutRef<'_>) -> usize {
        self.push_encoded(&encode_put(put))
    }

    /// Appends a whole record made by [`encode_put`]; returns its offset from the frame start.
    pub(crate) fn push_encoded(&mut self, record: &[u8]) -> usize {
        self.count += 1;
        let start = self.buf.len();
        self.buf.extend_from_slice(record);
        start
    }

    /// Appends a tombstone for `id`, which ends a version of type and scope `ended`. A format 3
    /// frame records the scope and the type after the id, or, when they are unknown (`None`: the
    /// version was retired by a record of format 1 or 2, which keeps neither), the scope byte
    /// "unknown" with an empty session id and type; a format 2 frame gives the id alone.
    pub(crate) fn delete(&mut self, id: &str, ended: Option<(&str, ScopeView<'_>)>) -> usize {
        self.count += 1;
        let format_3 = self.format_3;
        push_record(&mut self.buf, RecordTag::Delete, |out| {
            put_len_prefixed_u8(out, id);
            if !format_3 {
                return;
            }
            match ended {
                Some((kind, scope)) => {
                    put_scope(out, scope);
                    put_len_prefixed_u8(out, kind);
                }
                None => out.extend_from_slice(&[SCOPE_UNKNOWN, 0, 0]),
            }
        })
    }

    /// Appends a type registration.
    pub(crate) fn register_type(&mut self, spec: &TypeSpec) -> usize {
        self.count += 1;
        push_record(&mut self.buf, RecordTag::RegisterType, |out| {
            put_len_prefixed_u8(out, spec.name());
            match spec.pattern() {
                Some(pattern) => {
                    out.push(1);
                    put_len_prefixed_u16(out, pattern);
                }
                None => out.push(0),
            }
        })
    }

    /// Appends the record of a version whose content was reclaimed: its identity and hash, and in
    /// a format 3 frame its type `kind` and its `scope` (a format 2 frame keeps neither).
    pub(crate) fn retired(
        &mut self,
        id: &str,
        version: &str,
        hash: &[u8; 32],
        kind: &str,
        scope: ScopeView<'_>,
    ) -> usize {
        self.count += 1;
        let format_3 = self.format_3;
        push_record(&mut self.buf, RecordTag::Retired, |out| {
            out.extend_from_slice(hash);
            put_len_prefixed_u8(out, id);
            put_len_prefixed_u8(out, version);
            if format_3 {
                put_len_prefixed_u8(out, kind);
                put_scope(out, scope);
            }
        })
    }

    /// Appends a pin of a snapshot.
    pub(crate) fn pin(&mut self, name: &str, seq: u64, taken_at: i64, session: Option<&str>) -> usize {
        self.count += 1;
        push_record(&mut self.buf, RecordTag::Pin, |out| {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&taken_at.to_le_bytes());
            put_len_prefixed_u8(out, name);
            put_len_prefixed_u8(out, session.unwrap_or(""));
        })
    }

    /// Appends the end of a pin.
    pub(crate) fn unpin(&mut self, name: &str) -> usize {
        self.count += 1;
        push_record(&mut self.buf, RecordTag::Unpin, |out| put_len_prefixed_u8(out, name))
    }

    /// Appends a record copied whole (header, CRC and body) from another frame.
    pub(crate) fn raw(&mut self, record: &[u8]) -> usize {
        self.count += 1;
        let start = self.buf.len();
        self.buf.extend_from_slice(record);
        start
    }

    /// Whether nothing but the sync mark was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.count <= 1
    }

    /// Fills in the header for sequence number `seq` and returns the whole frame.
    ///
    /// # Errors
    /// `TooLarge` when the payload is over [`FRAME_PAYLOAD_BYTES_MAX`].
    pub(crate) fn finish(self, seq: u64) -> Result<Vec<u8>> {
        let mut frame = self.finish_unsealed()?;
        if let Some(slot) = frame.get_mut(9..17) {
            slot.copy_from_slice(&seq.to_le_bytes());
        }
        let crc = crc32fast::hash(frame.get(8..).unwrap_or_default());
        if let Some(slot) = frame.get_mut(4..8) {
            slot.copy_from_slice(&crc.to_le_bytes());
        }
        Ok(frame)
    }

    /// [`BatchEncoder::finish`] without the sequence number and the CRC, for a frame that
    /// [`set_frame_header`](super::set_frame_header) completes when it is written (the CRC of a
    /// bulk batch's frame is computed once, not twice).
    ///
    /// # Errors
    /// `TooLarge` when the payload is over [`FRAME_PAYLOAD_BYTES_MAX`].
    pub(crate) fn finish_unsealed(mut self) -> Result<Vec<u8>> {
        let payload_len = self.buf.len() - FRAME_HEADER_BYTES;
        if payload_len > FRAME_PAYLOAD_BYTES_MAX {
            return Err(Error::TooLarge {
                what: "batch".into(),
                len: num::u64_from_usize(payload_len),
                max: num::u64_from_usize(FRAME_PAYLOAD_BYTES_MAX),
                index: None,
            });
        }
        let len: u32 = num::bounded(payload_len, "frame payload length");
        let count = self.count.to_le_bytes();
        let header = {
            let mut h = [0u8; FRAME_HEADER_BYTES];
            h[0..4].copy_from_slice(&len.to_le_bytes());
            h[8] = FRAME_KIND_BATCH;
            h
        };
        if let Some(slot) = self.buf.get_mut(0..FRAME_HEADER_BYTES) {
            slot.copy_from_slice(&header);
        }
        if let Some(slot) = self.buf.get_mut(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + 4) {
            slot.copy_from_slice(&count);
        }
        Ok(self.buf)
    }
}
