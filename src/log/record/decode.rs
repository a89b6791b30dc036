//! Decoding: a batch payload taken apart into its records, and each record's body read into a
//! [`RecordView`] borrowing the bytes.

use crate::num;

use super::cursor::Cursor;
use super::kinds::{
    PutView, RecordTag, RecordView, ScopeTag, ScopeView, FLAG_CONFIDENCE, FLAG_LZ4, FLAG_TTL, MARK_ALTERED,
    SCOPE_UNKNOWN, SYNC_MARK_V2_BYTES, SYNC_MARK_V3_BYTES,
};
use super::{bad, DecodeError, RECORD_HEADER_BYTES};

/// Decodes the records of a batch payload, with each record's offset from the payload start.
pub(crate) fn decode_batch(payload: &[u8]) -> Result<Vec<(usize, usize, RecordView<'_>)>, DecodeError> {
    split_batch(payload)?
        .into_iter()
        .map(|record| Ok((record.start, record.len, record.decode()?)))
        .collect()
}

/// One record of a batch payload, framed but neither its CRC nor its body checked yet.
pub(crate) struct RawRecord<'a> {
    /// Where the record (its header) starts in the payload.
    pub(crate) start: usize,
    /// Its length, header included.
    pub(crate) len: usize,
    pub(crate) tag: u8,
    crc: u32,
    body: &'a [u8],
}

impl<'a> RawRecord<'a> {
    /// The record's tag, parsed.
    ///
    /// # Errors
    /// A byte that is no [`RecordTag`].
    pub(crate) fn kind(&self) -> Result<RecordTag, DecodeError> {
        RecordTag::try_from(self.tag)
    }

    /// Decodes the record's body without its CRC: for a record this process encoded itself and
    /// still holds in memory (a frame the writer has just written), which no disk has touched.
    pub(crate) fn decode_encoded(&self) -> Result<RecordView<'a>, DecodeError> {
        decode_body(self.tag, self.body)
    }

    /// Checks the record's CRC and decodes its body.
    pub(crate) fn decode(&self) -> Result<RecordView<'a>, DecodeError> {
        if crc32fast::hash(self.body) != self.crc {
            return Err(bad("record CRC mismatch"));
        }
        decode_body(self.tag, self.body)
    }
}

/// The records of a batch payload, each one's header read and its length checked against the
/// payload, for a caller that checks and decodes only the records it needs (the frame's CRC,
/// checked already, covers them all).
pub(crate) fn split_batch(payload: &[u8]) -> Result<Vec<RawRecord<'_>>, DecodeError> {
    let mut cursor = Cursor::new(payload);
    let count = cursor.u32("record count")?;
    // Each record takes at least a header: never trust the count for an allocation.
    let max_records = payload.len() / RECORD_HEADER_BYTES;
    if num::usize_from_u32(count) > max_records {
        return Err(bad(format!(
            "record count {count} cannot fit in {} bytes",
            payload.len()
        )));
    }
    let mut records = Vec::with_capacity(num::usize_from_u32(count));
    for _ in 0..count {
        let start = cursor.position();
        let (tag, crc, body) = next_record(&mut cursor)?;
        records.push(RawRecord {
            start,
            len: cursor.position() - start,
            tag,
            crc,
            body,
        });
    }
    if !cursor.is_empty() {
        return Err(bad("bytes after the last record of a batch"));
    }
    Ok(records)
}

/// The next record's header at `cursor` (tag and stored body CRC) and its body, not yet checked.
fn next_record<'a>(cursor: &mut Cursor<'a>) -> Result<(u8, u32, &'a [u8]), DecodeError> {
    let tag = cursor.u8("record tag")?;
    let body_len = num::usize_from_u32(cursor.u32("record length")?);
    let crc = cursor.u32("record crc")?;
    let body = cursor.take(body_len, "record body")?;
    Ok((tag, crc, body))
}

/// Decodes one record (header and body) stored at a known location, checking its CRC.
pub(crate) fn decode_record(bytes: &[u8]) -> Result<RecordView<'_>, DecodeError> {
    decode_one_record(bytes, true)
}

/// [`decode_record`] without the body's CRC, for bytes whose CRC a [`decode_record`] of the same
/// unchanging bytes (a mapped segment's, or a copy) already checked: a read that checks a record
/// under the index lock and decodes it again after.
pub(crate) fn decode_checked_record(bytes: &[u8]) -> Result<RecordView<'_>, DecodeError> {
    decode_one_record(bytes, false)
}

fn decode_one_record(bytes: &[u8], check_crc: bool) -> Result<RecordView<'_>, DecodeError> {
    let mut cursor = Cursor::new(bytes);
    let (tag, crc, body) = next_record(&mut cursor)?;
    if check_crc && crc32fast::hash(body) != crc {
        return Err(bad("record CRC mismatch"));
    }
    if !cursor.is_empty() {
        return Err(bad("record length does not match its location"));
    }
    decode_body(tag, body)
}

/// Decodes a record's body, given its tag byte; every byte of the body must be read.
fn decode_body(tag: u8, body: &[u8]) -> Result<RecordView<'_>, DecodeError> {
    let mut c = Cursor::new(body);
    let record = match RecordTag::try_from(tag)? {
        RecordTag::Put => RecordView::Put(decode_put(&mut c)?),
        RecordTag::Delete => decode_delete(&mut c)?,
        RecordTag::RegisterType => {
            let name_len = usize::from(c.u8("type length")?);
            let name = c.str(name_len, "type")?;
            let pattern = match c.u8("pattern flag")? {
                0 => None,
                1 => {
                    let len = usize::from(c.u16("pattern length")?);
                    Some(c.str(len, "id_pattern")?)
                }
                other => return Err(bad(format!("unknown pattern flag {other}"))),
            };
            RecordView::RegisterType { name, pattern }
        }
        RecordTag::Retired => {
            let hash = c.array::<32>("hash")?;
            let id_len = usize::from(c.u8("id length")?);
            let id = c.str(id_len, "id")?;
            let version_len = usize::from(c.u8("version length")?);
            let version = c.str(version_len, "version")?;
            // Formats 1 and 2 end after the version; format 3 adds the version's type and scope.
            let (kind, scope) = if c.is_empty() {
                (None, None)
            } else {
                let kind_len = usize::from(c.u8("type length")?);
                let kind = c.str(kind_len, "type")?;
                (Some(kind), Some(decode_scope(&mut c)?))
            };
            RecordView::Retired {
                hash,
                id,
                version,
                kind,
                scope,
            }
        }
        RecordTag::Pin => {
            let seq = c.u64("seq")?;
            let taken_at = c.i64("taken_at")?;
            let name_len = usize::from(c.u8("name length")?);
            let name = c.str(name_len, "name")?;
            let session_len = usize::from(c.u8("session length")?);
            let session = c.str(session_len, "session_id")?;
            RecordView::Pin {
                name,
                seq,
                taken_at,
                session: (!session.is_empty()).then_some(session),
            }
        }
        RecordTag::Unpin => {
            let name_len = usize::from(c.u8("name length")?);
            RecordView::Unpin {
                name: c.str(name_len, "name")?,
            }
        }
        RecordTag::SyncMark => decode_sync_mark(&mut c, body.len())?,
    };
    if !c.is_empty() {
        return Err(bad("bytes after the end of a record body"));
    }
    Ok(record)
}

/// The body of a delete record, after its tag: the id, and in format 3 the scope (its byte, then
/// the session id) and the type of the version it ended, or the scope byte [`SCOPE_UNKNOWN`] with an
/// empty session id and type when those are unknown.
fn decode_delete<'a>(c: &mut Cursor<'a>) -> Result<RecordView<'a>, DecodeError> {
    let id_len = usize::from(c.u8("id length")?);
    let id = c.str(id_len, "id")?;
    // Formats 1 and 2 end after the id.
    if c.is_empty() {
        return Ok(RecordView::Delete {
            id,
            scope: None,
            kind: None,
        });
    }
    let scope_byte = c.u8("scope")?;
    let session_len = usize::from(c.u8("session length")?);
    let session = c.str(session_len, "session_id")?;
    let kind_len = usize::from(c.u8("type length")?);
    let kind = c.str(kind_len, "type")?;
    if scope_byte == SCOPE_UNKNOWN {
        if !session.is_empty() || !kind.is_empty() {
            return Err(bad("a delete of an unknown scope names a session or a type"));
        }
        return Ok(RecordView::Delete {
            id,
            scope: None,
            kind: None,
        });
    }
    let scope = scope_view(ScopeTag::try_from(scope_byte)?, session)?;
    Ok(RecordView::Delete {
        id,
        scope: Some(scope),
        kind: Some(kind),
    })
}

/// A sync mark's body of `len` bytes: its length tells its format (8 bytes: format 2, 17: format 3).
fn decode_sync_mark(c: &mut Cursor<'_>, len: usize) -> Result<RecordView<'static>, DecodeError> {
    let synced = c.u64("synced length")?;
    match len {
        SYNC_MARK_V2_BYTES => Ok(RecordView::SyncMark {
            synced,
            committed_at: None,
            altered: false,
        }),
        SYNC_MARK_V3_BYTES => {
            let committed_at = c.i64("committed_at")?;
            let flags = c.u8("sync mark flags")?;
            if flags & !MARK_ALTERED != 0 {
                return Err(bad(format!("unknown sync mark flags {flags:#04x}")));
            }
            Ok(RecordView::SyncMark {
                synced,
                committed_at: Some(committed_at),
                altered: flags & MARK_ALTERED != 0,
            })
        }
        other => Err(bad(format!(
            "a sync mark body is {SYNC_MARK_V2_BYTES} or {SYNC_MARK_V3_BYTES} bytes, not {other}"
        ))),
    }
}

/// A scope as a put stores it, and as a format 3 retired record does: the scope byte, then the
/// session id (u8 length; empty unless the scope is a session's).
fn decode_scope<'a>(c: &mut Cursor<'a>) -> Result<ScopeView<'a>, DecodeError> {
    let scope_tag = ScopeTag::try_from(c.u8("scope")?)?;
    let session_len = usize::from(c.u8("session length")?);
    let session = c.str(session_len, "session_id")?;
    scope_view(scope_tag, session)
}

/// The scope of `tag` and `session`, refused when a global scope carries a session id.
fn scope_view(tag: ScopeTag, session: &str) -> Result<ScopeView<'_>, DecodeError> {
    match tag {
        ScopeTag::Session => Ok(ScopeView::Session(session)),
        _ if !session.is_empty() => Err(bad("session id stored on a global scope")),
        ScopeTag::GlobalReadonly => Ok(ScopeView::GlobalReadonly),
        ScopeTag::GlobalWritable => Ok(ScopeView::GlobalWritable),
    }
}

/// The body of a put record, after its tag.
fn decode_put<'a>(c: &mut Cursor<'a>) -> Result<PutView<'a>, DecodeError> {
    let flags = c.u8("flags")?;
    if flags & !(FLAG_TTL | FLAG_CONFIDENCE | FLAG_LZ4) != 0 {
        return Err(bad(format!("unknown put flags {flags:#04x}")));
    }
    let scope_byte = c.u8("scope")?;
    let timestamp = c.i64("timestamp")?;
    let ttl = c.u64("ttl_seconds")?;
    let confidence = f64::from_bits(c.u64("confidence")?);
    let hash = c.array::<32>("hash")?;
    let id_len = usize::from(c.u8("id length")?);
    let id = c.str(id_len, "id")?;
    let kind_len = usize::from(c.u8("type length")?);
    let kind = c.str(kind_len, "type")?;
    let version_len = usize::from(c.u8("version length")?);
    let version = c.str(version_len, "version")?;
    let session_len = usize::from(c.u8("session length")?);
    let session = c.str(session_len, "session_id")?;
    let source_len = usize::from(c.u16("source length")?);
    let source = c.str(source_len, "source")?;
    let content_len = num::usize_from_u32(c.u32("content length")?);
    let content = c.take(content_len, "content")?;
    let scope = scope_view(ScopeTag::try_from(scope_byte)?, session)?;
    // Adds validate timestamps; the index keeps them in 40 bits.
    if !(0..=crate::limits::TIMESTAMP_MAX).contains(&timestamp) {
        return Err(bad(format!("timestamp {timestamp} out of range")));
    }
    Ok(PutView {
        id,
        kind,
        version,
        scope,
        source,
        timestamp,
        ttl_seconds: (flags & FLAG_TTL != 0).then_some(ttl),
        confidence: (flags & FLAG_CONFIDENCE != 0).then_some(confidence),
        hash,
        content,
        compressed: flags & FLAG_LZ4 != 0,
    })
}
