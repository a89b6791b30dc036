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

use crate::error::{Error, Result};
use crate::item::{ContextItem, Scope, TypeSpec};
use crate::limits::FRAME_PAYLOAD_BYTES_MAX;

/// Bytes of a frame header.
pub(crate) const FRAME_HEADER_BYTES: usize = 4 + 4 + 1 + 8;
/// Bytes of a record header.
pub(crate) const RECORD_HEADER_BYTES: usize = 1 + 4 + 4;
/// The frame kind of a batch.
pub(crate) const FRAME_KIND_BATCH: u8 = 1;

/// A record's tag: what its body holds. Stored as one byte; [`RecordTag::try_from`] refuses any
/// other value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecordTag {
    Put = 1,
    Delete = 2,
    RegisterType = 3,
    /// A version whose content compaction dropped: its identity and hash only.
    Retired = 4,
    Pin = 5,
    Unpin = 6,
    /// The first record of every frame this build writes: how many bytes of the segment were durable
    /// (fsynced) when the frame was written. Recovery uses it to tell unsynced holes from damage.
    SyncMark = 7,
}

impl TryFrom<u8> for RecordTag {
    type Error = DecodeError;

    fn try_from(byte: u8) -> Result<RecordTag, DecodeError> {
        Ok(match byte {
            1 => RecordTag::Put,
            2 => RecordTag::Delete,
            3 => RecordTag::RegisterType,
            4 => RecordTag::Retired,
            5 => RecordTag::Pin,
            6 => RecordTag::Unpin,
            7 => RecordTag::SyncMark,
            other => return Err(bad(format!("unknown record tag {other}"))),
        })
    }
}

/// A put record's scope byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum ScopeTag {
    Session = 0,
    GlobalReadonly = 1,
    GlobalWritable = 2,
}

impl TryFrom<u8> for ScopeTag {
    type Error = DecodeError;

    fn try_from(byte: u8) -> Result<ScopeTag, DecodeError> {
        Ok(match byte {
            0 => ScopeTag::Session,
            1 => ScopeTag::GlobalReadonly,
            2 => ScopeTag::GlobalWritable,
            other => return Err(bad(format!("unknown scope tag {other}"))),
        })
    }
}

/// Where the sync mark's value sits in a frame: after the frame header, the record count and the
/// mark's record header.
const SYNC_MARK_AT: usize = FRAME_HEADER_BYTES + 4 + RECORD_HEADER_BYTES;

const FLAG_TTL: u8 = 1;
const FLAG_CONFIDENCE: u8 = 2;
/// The content field holds `[u32 canonical length][LZ4 block]` instead of the canonical bytes.
const FLAG_LZ4: u8 = 4;
/// Content shorter than this is stored as it is: compressing it saves too little.
const COMPRESS_BYTES_MIN: usize = 128;

/// Why bytes could not be decoded; the caller turns it into `Error::Corrupt` with file and offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) String);

fn bad(reason: impl Into<String>) -> DecodeError {
    DecodeError(reason.into())
}

/// A bounds-checked little-endian reader over a byte slice.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| bad(format!("{what} runs past the end ({n} bytes at {})", self.pos)))?;
        let slice = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| bad(format!("{what} out of range")))?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], DecodeError> {
        let slice = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i64(&mut self, what: &str) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    fn str(&mut self, n: usize, what: &str) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.take(n, what)?).map_err(|_| bad(format!("{what} is not UTF-8")))
    }
    pub(crate) fn position(&self) -> usize {
        self.pos
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }
}

/// A put record as it is encoded: borrowed parts of a validated item.
pub(crate) struct PutRef<'a> {
    pub(crate) id: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) version: &'a str,
    pub(crate) scope: &'a Scope,
    pub(crate) source: &'a str,
    pub(crate) timestamp: i64,
    pub(crate) ttl_seconds: Option<u64>,
    pub(crate) confidence: Option<f64>,
    pub(crate) hash: &'a [u8; 32],
    pub(crate) content: &'a [u8],
    /// Whether to store the content LZ4-compressed when that pays (the store's
    /// `Options::compress_content`); otherwise it is stored as it is.
    pub(crate) compress: bool,
}

/// A put record decoded from bytes, borrowing them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PutView<'a> {
    pub(crate) id: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) version: &'a str,
    pub(crate) scope: ScopeView<'a>,
    pub(crate) source: &'a str,
    pub(crate) timestamp: i64,
    pub(crate) ttl_seconds: Option<u64>,
    pub(crate) confidence: Option<f64>,
    pub(crate) hash: [u8; 32],
    /// The content field as stored: canonical JSON, or compressed when `compressed`.
    pub(crate) content: &'a [u8],
    pub(crate) compressed: bool,
}

/// A scope decoded without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScopeView<'a> {
    Session(&'a str),
    GlobalReadonly,
    GlobalWritable,
}

impl<'a> From<&'a Scope> for ScopeView<'a> {
    fn from(scope: &'a Scope) -> Self {
        match scope {
            Scope::Session(id) => ScopeView::Session(id),
            Scope::GlobalReadonly => ScopeView::GlobalReadonly,
            Scope::GlobalWritable => ScopeView::GlobalWritable,
        }
    }
}

impl ScopeView<'_> {
    pub(crate) fn to_scope(self) -> Scope {
        match self {
            ScopeView::Session(id) => Scope::Session(id.to_owned()),
            ScopeView::GlobalReadonly => Scope::GlobalReadonly,
            ScopeView::GlobalWritable => Scope::GlobalWritable,
        }
    }
}

impl<'a> PutView<'a> {
    /// The canonical length and the LZ4 block of compressed content, the length bounded.
    fn compressed_parts(&self) -> Result<(usize, &'a [u8]), DecodeError> {
        let mut c = Cursor::new(self.content);
        let len = usize::try_from(c.u32("canonical content length")?).unwrap_or(usize::MAX);
        // Never allocate what a length field claims before bounding it.
        if len > crate::limits::CONTENT_BYTES_MAX {
            return Err(bad(format!("compressed content claims {len} bytes, over the limit")));
        }
        Ok((len, self.content.get(4..).unwrap_or_default()))
    }

    /// The length of the canonical content (as recorded, for compressed content), or 0 when the
    /// recorded length is unreadable: a size hint, checked when the content is read.
    pub(crate) fn content_len(&self) -> usize {
        if self.compressed {
            self.compressed_parts().map_or(0, |(len, _)| len)
        } else {
            self.content.len()
        }
    }

    /// Appends the canonical JSON of the content to `out`, decompressing it straight there when it
    /// is stored compressed. On error `out` is left as it was.
    pub(crate) fn append_content(&self, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        if !self.compressed {
            out.extend_from_slice(self.content);
            return Ok(());
        }
        let (len, block) = self.compressed_parts()?;
        let start = out.len();
        out.resize(start + len, 0);
        let written = lz4_flex::block::decompress_into(block, out.get_mut(start..).unwrap_or_default());
        let failure = match written {
            Ok(n) if n == len => return Ok(()),
            Ok(_) => bad("compressed content has another length than recorded"),
            Err(e) => bad(format!("compressed content: {e}")),
        };
        out.truncate(start);
        Err(failure)
    }

    /// The canonical JSON of the content: the stored bytes, or, when they are compressed, `scratch`
    /// holding them decompressed (its earlier contents are dropped).
    pub(crate) fn content_in<'s>(&'s self, scratch: &'s mut Vec<u8>) -> Result<&'s [u8], DecodeError> {
        if !self.compressed {
            return Ok(self.content);
        }
        scratch.clear();
        self.append_content(scratch)?;
        Ok(scratch)
    }

    /// The canonical JSON of the content, decompressed if it is stored compressed.
    pub(crate) fn content(&self) -> Result<std::borrow::Cow<'a, [u8]>, DecodeError> {
        if !self.compressed {
            return Ok(std::borrow::Cow::Borrowed(self.content));
        }
        let (len, block) = self.compressed_parts()?;
        let out = lz4_flex::block::decompress(block, len).map_err(|e| bad(format!("compressed content: {e}")))?;
        if out.len() != len {
            return Err(bad("compressed content has another length than recorded"));
        }
        Ok(std::borrow::Cow::Owned(out))
    }

    /// The item this record stores, with its content parsed from the canonical JSON.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn to_item(&self) -> Result<ContextItem, DecodeError> {
        self.to_item_from(&self.content()?)
    }

    /// The item this record stores, given its canonical content (from [`PutView::content`]).
    pub(crate) fn to_item_from(&self, canonical: &[u8]) -> Result<ContextItem, DecodeError> {
        let content: serde_json::Value =
            serde_json::from_slice(canonical).map_err(|e| bad(format!("stored content is not JSON: {e}")))?;
        Ok(ContextItem {
            id: self.id.to_owned(),
            kind: self.kind.to_owned(),
            content,
            source: self.source.to_owned(),
            timestamp: self.timestamp,
            version: self.version.to_owned(),
            hash: Some(crate::item::format_hash(&self.hash)),
            scope: self.scope.to_scope(),
            ttl_seconds: self.ttl_seconds,
            confidence: self.confidence,
        })
    }

    /// Bytes of the item's JSON shape besides the content, at most, unless a string needs escapes:
    /// the punctuation and names of every field, 20 digits per integer, 24 for the confidence, 73 for
    /// the hash, and the strings' own bytes.
    pub(crate) fn json_envelope_len(&self) -> usize {
        let session = match self.scope {
            ScopeView::Session(id) => id.len(),
            ScopeView::GlobalReadonly | ScopeView::GlobalWritable => 0,
        };
        300 + self.id.len() + self.kind.len() + self.source.len() + self.version.len() + session
    }

    /// Appends the item's JSON shape up to its content: `{"id":...,"type":...,"content":`.
    ///
    /// The canonical content, then [`PutView::write_json_tail`], complete it. The three together
    /// are, byte for byte, what `serde_json::to_vec` writes for [`PutView::to_item`]'s item: the
    /// fields in the order of `ItemOut` (src/item.rs), numbers written by `serde_json` itself,
    /// strings by `write_json_str` (tested byte for byte against `serde_json`), and the content as
    /// its canonical JSON, which is what `serde_json` prints for the parsed content (object keys
    /// sorted by their bytes, numbers as it parsed them).
    pub(crate) fn write_json_head(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"id\":");
        crate::item::write_json_str(out, self.id);
        out.extend_from_slice(b",\"type\":");
        crate::item::write_json_str(out, self.kind);
        out.extend_from_slice(b",\"content\":");
    }

    /// Appends the item's JSON shape after its content: `,"source":...}`. See
    /// [`PutView::write_json_head`].
    pub(crate) fn write_json_tail(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b",\"source\":");
        crate::item::write_json_str(out, self.source);
        out.extend_from_slice(b",\"timestamp\":");
        crate::item::write_scalar(out, &self.timestamp);
        out.extend_from_slice(b",\"version\":");
        crate::item::write_json_str(out, self.version);
        out.extend_from_slice(b",\"hash\":");
        crate::item::write_hash_json(out, &self.hash);
        match self.scope {
            ScopeView::Session(id) => {
                out.extend_from_slice(b",\"scope\":\"session\",\"session_id\":");
                crate::item::write_json_str(out, id);
            }
            ScopeView::GlobalReadonly => out.extend_from_slice(b",\"scope\":\"global_readonly\""),
            ScopeView::GlobalWritable => out.extend_from_slice(b",\"scope\":\"global_writable\""),
        }
        if let Some(ttl) = self.ttl_seconds {
            out.extend_from_slice(b",\"ttl_seconds\":");
            crate::item::write_scalar(out, &ttl);
        }
        if let Some(confidence) = self.confidence {
            out.extend_from_slice(b",\"confidence\":");
            crate::item::write_scalar(out, &confidence);
        }
        out.push(b'}');
    }

    /// When the item expires: `timestamp + ttl_seconds`, saturating.
    pub(crate) fn expires_at(&self) -> Option<i64> {
        crate::item::expiry(self.timestamp, self.ttl_seconds)
    }
}

/// One decoded record of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RecordView<'a> {
    Put(PutView<'a>),
    Delete {
        id: &'a str,
    },
    RegisterType {
        name: &'a str,
        pattern: Option<&'a str>,
    },
    /// A version whose content compaction reclaimed: the store still remembers its (id, version, hash).
    Retired {
        id: &'a str,
        version: &'a str,
        hash: [u8; 32],
    },
    /// A pinned snapshot: name, sequence number, clock time, and the session it is restricted to.
    Pin {
        name: &'a str,
        seq: u64,
        taken_at: i64,
        session: Option<&'a str>,
    },
    /// The end of a pin.
    Unpin {
        name: &'a str,
    },
    /// Bytes of the segment that were durable when the frame holding this record was written.
    SyncMark {
        synced: u64,
    },
}

/// Bytes a string of at most `max` bytes takes after its length prefix; the caller validated lengths.
fn put_len_prefixed_u8(out: &mut Vec<u8>, s: &str) {
    debug_assert!(s.len() <= usize::from(u8::MAX));
    out.push(u8::try_from(s.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(s.as_bytes());
}

fn put_len_prefixed_u16(out: &mut Vec<u8>, s: &str) {
    debug_assert!(s.len() <= usize::from(u16::MAX));
    out.extend_from_slice(&u16::try_from(s.len()).unwrap_or(u16::MAX).to_le_bytes());
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
    let len_bytes = u32::try_from(body_len).unwrap_or(u32::MAX).to_le_bytes();
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
            let field_len = u32::try_from(block_len + 4).unwrap_or(u32::MAX).to_le_bytes();
            let content_len = u32::try_from(content.len()).unwrap_or(u32::MAX).to_le_bytes();
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

/// One put record, header and CRC included, as [`BatchEncoder::put`] would append it. Writers
/// encode (and compress) their items on their own threads with this, so that the writer thread
/// only copies the bytes into the frame.
pub(crate) fn encode_put(put: &PutRef<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + put.content.len() + 128);
    push_record(&mut out, RecordTag::Put, |out| put_body(out, put));
    out
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
    let (scope_tag, session) = match put.scope {
        Scope::Session(id) => (ScopeTag::Session, id.as_str()),
        Scope::GlobalReadonly => (ScopeTag::GlobalReadonly, ""),
        Scope::GlobalWritable => (ScopeTag::GlobalWritable, ""),
    };
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
        out.extend_from_slice(&u32::try_from(put.content.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(put.content);
    }
}

/// Builds the payload of one batch frame, record by record.
pub(crate) struct BatchEncoder {
    buf: Vec<u8>,
    count: u32,
}

impl BatchEncoder {
    /// Starts a frame: the header is filled in by [`BatchEncoder::finish`].
    /// The frame's first record is its sync mark, filled in by [`set_frame_header`].
    pub(crate) fn new() -> Self {
        Self::with_capacity(0)
    }

    /// [`BatchEncoder::new`] with room for `records` bytes of records, so that a large batch's
    /// frame is not copied again each time it outgrows its buffer.
    pub(crate) fn with_capacity(records: usize) -> Self {
        let mut buf = Vec::with_capacity(256 + records);
        buf.extend_from_slice(&[0u8; FRAME_HEADER_BYTES + 4]);
        push_record(&mut buf, RecordTag::SyncMark, |out| out.extend_from_slice(&[0u8; 8]));
        BatchEncoder { buf, count: 1 }
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

    /// Appends a tombstone for `id`.
    pub(crate) fn delete(&mut self, id: &str) -> usize {
        self.count += 1;
        push_record(&mut self.buf, RecordTag::Delete, |out| put_len_prefixed_u8(out, id))
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

    /// Appends the record of a version whose content was reclaimed.
    pub(crate) fn retired(&mut self, id: &str, version: &str, hash: &[u8; 32]) -> usize {
        self.count += 1;
        push_record(&mut self.buf, RecordTag::Retired, |out| {
            out.extend_from_slice(hash);
            put_len_prefixed_u8(out, id);
            put_len_prefixed_u8(out, version);
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

    /// Whether no record was added.
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
    /// [`set_frame_header`] completes when it is written (the CRC of a bulk batch's frame is
    /// computed once, not twice).
    ///
    /// # Errors
    /// `TooLarge` when the payload is over [`FRAME_PAYLOAD_BYTES_MAX`].
    pub(crate) fn finish_unsealed(mut self) -> Result<Vec<u8>> {
        let payload_len = self.buf.len() - FRAME_HEADER_BYTES;
        if payload_len > FRAME_PAYLOAD_BYTES_MAX {
            return Err(Error::TooLarge {
                what: "batch".into(),
                len: payload_len as u64,
                max: FRAME_PAYLOAD_BYTES_MAX as u64,
                index: None,
            });
        }
        let len = u32::try_from(payload_len).unwrap_or(u32::MAX);
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

/// Sets a whole frame's sequence number and sync mark, and recomputes the mark's and the frame's
/// CRCs. A frame from [`BatchEncoder::finish`] always starts with its sync mark.
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
    let len_usize = usize::try_from(len).unwrap_or(usize::MAX);
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
    if usize::try_from(count).unwrap_or(usize::MAX) > max_records {
        return Err(bad(format!(
            "record count {count} cannot fit in {} bytes",
            payload.len()
        )));
    }
    let mut records = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
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
    let body_len = usize::try_from(cursor.u32("record length")?).unwrap_or(usize::MAX);
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

fn decode_body(tag: u8, body: &[u8]) -> Result<RecordView<'_>, DecodeError> {
    let mut c = Cursor::new(body);
    let record = match RecordTag::try_from(tag)? {
        RecordTag::Put => {
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
            let content_len = usize::try_from(c.u32("content length")?).unwrap_or(usize::MAX);
            let content = c.take(content_len, "content")?;
            let scope_tag = ScopeTag::try_from(scope_byte)?;
            let scope = match scope_tag {
                ScopeTag::Session => ScopeView::Session(session),
                ScopeTag::GlobalReadonly => ScopeView::GlobalReadonly,
                ScopeTag::GlobalWritable => ScopeView::GlobalWritable,
            };
            if scope_tag != ScopeTag::Session && !session.is_empty() {
                return Err(bad("session id stored on a global scope"));
            }
            // Adds validate timestamps; the index keeps them in 40 bits.
            if !(0..=crate::limits::TIMESTAMP_MAX).contains(&timestamp) {
                return Err(bad(format!("timestamp {timestamp} out of range")));
            }
            RecordView::Put(PutView {
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
        RecordTag::Delete => {
            let id_len = usize::from(c.u8("id length")?);
            RecordView::Delete {
                id: c.str(id_len, "id")?,
            }
        }
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
            RecordView::Retired { id, version, hash }
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
        RecordTag::SyncMark => RecordView::SyncMark {
            synced: c.u64("synced length")?,
        },
    };
    if !c.is_empty() {
        return Err(bad("bytes after the end of a record body"));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_parse_from_their_byte_and_nothing_else_does() {
        for byte in 0..=u8::MAX {
            match RecordTag::try_from(byte) {
                Ok(tag) => assert_eq!(tag as u8, byte),
                Err(e) => {
                    assert!(!(1..=7).contains(&byte), "{byte}");
                    assert_eq!(e.0, format!("unknown record tag {byte}"));
                }
            }
            match ScopeTag::try_from(byte) {
                Ok(tag) => assert_eq!(tag as u8, byte),
                Err(e) => assert!(byte > 2 && e.0 == format!("unknown scope tag {byte}"), "{byte}"),
            }
        }
    }

    fn sample_put<'a>(scope: &'a Scope, hash: &'a [u8; 32]) -> PutRef<'a> {
        PutRef {
            id: "ch3",
            kind: "document_chunk",
            version: "1",
            scope,
            source: "crm",
            timestamp: 1_700_000_000,
            ttl_seconds: Some(60),
            confidence: Some(0.5),
            hash,
            content: br#"{"a":1}"#,
            compress: true,
        }
    }

    #[test]
    fn the_sync_mark_is_set_with_the_sequence_number() {
        let scope = Scope::GlobalWritable;
        let hash = [1u8; 32];
        let mut enc = BatchEncoder::new();
        assert!(enc.is_empty(), "a sync mark alone is an empty batch");
        enc.put(&sample_put(&scope, &hash));
        assert!(!enc.is_empty());
        let mut frame = enc.finish(0).unwrap();
        set_frame_header(&mut frame, 77, 4_096);
        let (header, payload) = read_frame(&frame).unwrap();
        assert_eq!(header.seq, 77);
        assert_eq!(frame_sync_mark(payload), Some(4_096));
        let records = decode_batch(payload).unwrap();
        assert_eq!(records[0].2, RecordView::SyncMark { synced: 4_096 });
        assert!(matches!(records[1].2, RecordView::Put(_)));
        // A frame of segment format 1 starts with its first operation's record: no mark.
        let mut old = frame.clone();
        let count = u32::from_le_bytes(old[17..21].try_into().unwrap()) - 1;
        old.drain(21..21 + RECORD_HEADER_BYTES + 8);
        old[17..21].copy_from_slice(&count.to_le_bytes());
        let len = u32::try_from(old.len() - FRAME_HEADER_BYTES).unwrap();
        old[0..4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32fast::hash(&old[8..]);
        old[4..8].copy_from_slice(&crc.to_le_bytes());
        let (_, payload) = read_frame(&old).unwrap();
        assert_eq!(frame_sync_mark(payload), None);
        assert_eq!(decode_batch(payload).unwrap().len(), 1);
    }

    #[test]
    fn a_frame_finished_unsealed_is_the_same_frame_once_its_header_is_set() {
        let scope = Scope::Session("s1".into());
        let hash = [3u8; 32];
        let encoder = || {
            let mut enc = BatchEncoder::new();
            enc.put(&sample_put(&scope, &hash));
            enc.delete("gone");
            enc
        };
        let mut sealed = encoder().finish(5).unwrap();
        let mut unsealed = encoder().finish_unsealed().unwrap();
        assert_eq!(sealed.len(), unsealed.len());
        assert!(read_frame(&unsealed).is_err(), "no CRC yet: not a frame");
        set_frame_header(&mut sealed, 77, 4_096);
        set_frame_header(&mut unsealed, 77, 4_096);
        assert_eq!(sealed, unsealed);
        let (header, payload) = read_frame(&unsealed).unwrap();
        assert_eq!(header.seq, 77);
        assert_eq!(decode_batch(payload).unwrap().len(), 3);
    }

    #[test]
    fn a_put_whose_timestamp_is_out_of_range_is_refused() {
        // Adds never store such a timestamp: only damage or a forged record carries one, and the
        // index, which keeps timestamps in 40 bits, must never see it.
        let scope = Scope::GlobalWritable;
        let hash = [2u8; 32];
        for (timestamp, ok) in [
            (0, true),
            (crate::limits::TIMESTAMP_MAX, true),
            (-1, false),
            (crate::limits::TIMESTAMP_MAX + 1, false),
            (i64::MIN, false),
            (i64::MAX, false),
        ] {
            let mut put = sample_put(&scope, &hash);
            put.timestamp = timestamp;
            let mut enc = BatchEncoder::new();
            enc.put(&put);
            let frame = enc.finish(1).unwrap();
            let (_, payload) = read_frame(&frame).unwrap();
            match decode_batch(payload) {
                Ok(records) if ok => {
                    let RecordView::Put(view) = &records[1].2 else {
                        panic!("not a put")
                    };
                    assert_eq!(view.timestamp, timestamp);
                }
                Err(e) if !ok => assert!(e.0.contains("timestamp"), "{timestamp}: {e:?}"),
                other => panic!("timestamp {timestamp}: {other:?}"),
            }
        }
    }

    #[test]
    fn batch_roundtrips() {
        let scope = Scope::Session("s1".into());
        let hash = [7u8; 32];
        let mut enc = BatchEncoder::new();
        let put_at = enc.put(&sample_put(&scope, &hash));
        let del_at = enc.delete("old");
        let spec = TypeSpec::new("legal_clause").id_pattern("^cl_");
        enc.register_type(&spec);
        enc.retired("gone", "7", &[3u8; 32]);
        enc.pin("audit", 41, -5, Some("s1"));
        enc.pin("all", 40, 9, None);
        enc.unpin("audit");
        let frame = enc.finish(42).unwrap();
        let (header, payload) = read_frame(&frame).unwrap();
        assert_eq!(header.seq, 42);
        assert_eq!(header.len as usize, frame.len() - FRAME_HEADER_BYTES);
        let all = decode_batch(payload).unwrap();
        assert_eq!(all.len(), 8);
        assert_eq!(
            all[0].2,
            RecordView::SyncMark { synced: 0 },
            "every frame starts with its sync mark"
        );
        let records = &all[1..];
        assert_eq!(
            records[3].2,
            RecordView::Retired {
                id: "gone",
                version: "7",
                hash: [3u8; 32]
            }
        );
        assert_eq!(
            records[4].2,
            RecordView::Pin {
                name: "audit",
                seq: 41,
                taken_at: -5,
                session: Some("s1")
            }
        );
        assert_eq!(
            records[5].2,
            RecordView::Pin {
                name: "all",
                seq: 40,
                taken_at: 9,
                session: None
            }
        );
        assert_eq!(records[6].2, RecordView::Unpin { name: "audit" });
        // A record copied whole decodes the same in another frame.
        let (start, len, _) = records[3];
        let mut copy = BatchEncoder::new();
        copy.raw(&payload[start..start + len]);
        let copied = copy.finish(43).unwrap();
        let (_, copied_payload) = read_frame(&copied).unwrap();
        assert_eq!(decode_batch(copied_payload).unwrap()[1].2, records[3].2);
        assert_eq!(records[0].0 + FRAME_HEADER_BYTES, put_at);
        assert_eq!(records[1].0 + FRAME_HEADER_BYTES, del_at);
        match &records[0].2 {
            RecordView::Put(p) => {
                assert_eq!(p.id, "ch3");
                assert_eq!(p.scope, ScopeView::Session("s1"));
                assert_eq!(p.ttl_seconds, Some(60));
                assert_eq!(p.confidence, Some(0.5));
                assert_eq!(p.content, br#"{"a":1}"#);
                assert_eq!(p.expires_at(), Some(1_700_000_060));
            }
            other => panic!("expected a put, got {other:?}"),
        }
        assert_eq!(records[1].2, RecordView::Delete { id: "old" });
        assert_eq!(
            records[2].2,
            RecordView::RegisterType {
                name: "legal_clause",
                pattern: Some("^cl_")
            }
        );
        // The record at its location decodes alone too.
        let (start, len, _) = records[0];
        let at = FRAME_HEADER_BYTES + start;
        assert!(matches!(decode_record(&frame[at..at + len]), Ok(RecordView::Put(_))));
    }

    #[test]
    fn every_flipped_bit_of_a_frame_is_refused() {
        let scope = Scope::GlobalReadonly;
        let hash = [1u8; 32];
        let mut enc = BatchEncoder::new();
        enc.put(&sample_put(&scope, &hash));
        let frame = enc.finish(1).unwrap();
        for bit in 0..frame.len() * 8 {
            let mut damaged = frame.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(read_frame(&damaged).is_err(), "flip of bit {bit} went unnoticed");
        }
    }

    #[test]
    fn short_frames_are_short() {
        let mut enc = BatchEncoder::new();
        enc.delete("x");
        let frame = enc.finish(9).unwrap();
        for cut in 0..frame.len() {
            assert_eq!(read_frame(&frame[..cut]), Err(FrameError::Short), "cut at {cut}");
        }
    }

    #[test]
    fn long_repetitive_content_is_stored_compressed_and_reads_back() {
        let scope = Scope::GlobalWritable;
        let hash = [2u8; 32];
        let content = format!("{{\"text\":\"{}\"}}", "the same words again and again ".repeat(40));
        let mut put = sample_put(&scope, &hash);
        put.content = content.as_bytes();
        let mut enc = BatchEncoder::new();
        enc.put(&put);
        let frame = enc.finish(1).unwrap();
        assert!(
            frame.len() < content.len() / 2,
            "{} bytes for {} of content",
            frame.len(),
            content.len()
        );
        let (_, payload) = read_frame(&frame).unwrap();
        let records = decode_batch(payload).unwrap();
        let RecordView::Put(view) = &records[1].2 else {
            panic!("not a put")
        };
        assert!(view.compressed);
        assert_eq!(&*view.content().unwrap(), content.as_bytes());
        // Short content is stored as it is.
        let mut enc = BatchEncoder::new();
        enc.put(&sample_put(&scope, &hash));
        let frame = enc.finish(2).unwrap();
        let (_, payload) = read_frame(&frame).unwrap();
        let RecordView::Put(view) = &decode_batch(payload).unwrap()[1].2 else {
            panic!("not a put")
        };
        assert!(!view.compressed);
    }

    #[test]
    fn compressed_content_never_claims_more_than_the_limit() {
        let mut field = u32::MAX.to_le_bytes().to_vec();
        field.extend_from_slice(&[0x10, 0x61]);
        let scope = Scope::GlobalWritable;
        let hash = [0u8; 32];
        let put = sample_put(&scope, &hash);
        let view = PutView {
            id: put.id,
            kind: put.kind,
            version: put.version,
            scope: ScopeView::GlobalWritable,
            source: put.source,
            timestamp: 0,
            ttl_seconds: None,
            confidence: None,
            hash,
            content: &field,
            compressed: true,
        };
        assert!(view.content().is_err());
        assert!(view.to_item().is_err());
    }

    /// The JSON of a put record, written from its fields and its canonical content.
    fn raw_json(view: &PutView<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        view.write_json_head(&mut out);
        view.append_content(&mut out).unwrap();
        view.write_json_tail(&mut out);
        out
    }

    #[test]
    fn raw_json_is_what_serde_json_writes_for_the_item() {
        let long = format!("{{\"text\":\"{}\"}}", "words é 中 \\\" again ".repeat(20));
        let scopes = [
            Scope::Session("s\"1".into()),
            Scope::GlobalReadonly,
            Scope::GlobalWritable,
        ];
        for (n, scope) in scopes.iter().enumerate() {
            for content in [&br#"[1,-0.0,1e-7,"\u0001"]"#[..], long.as_bytes()] {
                let hash = [u8::try_from(n).unwrap(); 32];
                let mut put = sample_put(scope, &hash);
                put.content = content;
                put.source = "a \"source\" \\ é";
                if n == 1 {
                    put.ttl_seconds = None;
                    put.confidence = Some(1.0 / 3.0);
                }
                if n == 2 {
                    put.confidence = None;
                    put.timestamp = 0;
                }
                let mut enc = BatchEncoder::new();
                enc.put(&put);
                let frame = enc.finish(1).unwrap();
                let (_, payload) = read_frame(&frame).unwrap();
                let RecordView::Put(view) = &decode_batch(payload).unwrap()[1].2 else {
                    panic!("not a put")
                };
                assert_eq!(view.compressed, content.len() > 100, "{n}");
                let item = view.to_item().unwrap();
                assert_eq!(raw_json(view), serde_json::to_vec(&item).unwrap(), "scope {n}");
                assert!(raw_json(view).len() <= view.json_envelope_len() + view.content_len() + 16);
                assert_eq!(view.content_len(), content.len());
                let mut scratch = b"stale".to_vec();
                assert_eq!(view.content_in(&mut scratch).unwrap(), content);
            }
        }
    }

    #[test]
    fn appending_damaged_compressed_content_leaves_the_output_as_it_was() {
        let scope = Scope::GlobalWritable;
        let hash = [0u8; 32];
        let content = "the same words again and again ".repeat(40);
        let block = lz4_flex::block::compress(content.as_bytes());
        for field in [
            // A length over the limit, one shorter and one longer than the block gives, a cut block.
            [&u32::MAX.to_le_bytes()[..], &block].concat(),
            [&u32::try_from(content.len() - 1).unwrap().to_le_bytes()[..], &block].concat(),
            [&u32::try_from(content.len() + 1).unwrap().to_le_bytes()[..], &block].concat(),
            [
                &u32::try_from(content.len()).unwrap().to_le_bytes()[..],
                &block[..block.len() / 2],
            ]
            .concat(),
            vec![1, 2],
        ] {
            let put = sample_put(&scope, &hash);
            let view = PutView {
                id: put.id,
                kind: put.kind,
                version: put.version,
                scope: ScopeView::GlobalWritable,
                source: put.source,
                timestamp: 0,
                ttl_seconds: None,
                confidence: None,
                hash,
                content: &field,
                compressed: true,
            };
            let mut out = b"kept".to_vec();
            assert!(view.append_content(&mut out).is_err());
            assert_eq!(out, b"kept");
        }
    }

    #[test]
    fn absurd_counts_do_not_allocate() {
        let mut payload = u32::MAX.to_le_bytes().to_vec();
        payload.extend_from_slice(&[0; 16]);
        assert!(decode_batch(&payload).is_err());
    }
}
