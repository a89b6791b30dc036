//! What records hold: the record and scope tags, the put flags, a put as it is encoded
//! ([`PutRef`]), and records as they are decoded, borrowing the bytes ([`RecordView`], [`PutView`]
//! with its content and JSON).

use crate::item::{ContextItem, Scope};
use crate::num;

use super::cursor::Cursor;
use super::{bad, DecodeError};

/// A record's tag: what its body holds. Stored as one byte; [`RecordTag::try_from`] refuses any
/// other value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecordTag {
    Put = 1,
    Delete = 2,
    RegisterType = 3,
    /// A version whose content compaction dropped: its identity and hash (and in segment format 3
    /// its type and scope).
    Retired = 4,
    Pin = 5,
    Unpin = 6,
    /// The first record of every frame of segment formats 2 and 3: how many bytes of the segment
    /// were durable (fsynced) when the frame was written, which recovery uses to tell unsynced holes
    /// from damage; in format 3 also when the batch committed, and whether compaction altered it.
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
pub(super) enum ScopeTag {
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

/// The scope byte of a format 3 delete whose ended version's type and scope nobody knows any more:
/// that version was retired by a record of segment format 1 or 2, which keeps neither. Such a
/// delete's session id and type are empty.
pub(super) const SCOPE_UNKNOWN: u8 = 3;

/// Bytes of a sync mark's body in segment format 2: `synced`.
pub(crate) const SYNC_MARK_V2_BYTES: usize = 8;
/// Bytes of a sync mark's body in segment format 3: `synced`, `committed_at` and `flags`.
pub(crate) const SYNC_MARK_V3_BYTES: usize = 8 + 8 + 1;
/// A format 3 sync mark's flags: compaction left out or retired at least one record of the frame.
pub(super) const MARK_ALTERED: u8 = 1;

/// A put record's flags: a TTL is stored.
pub(super) const FLAG_TTL: u8 = 1;
/// A put record's flags: a confidence is stored.
pub(super) const FLAG_CONFIDENCE: u8 = 2;
/// The content field holds `[u32 canonical length][LZ4 block]` instead of the canonical bytes.
pub(super) const FLAG_LZ4: u8 = 4;

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
        let len = num::usize_from_u32(c.u32("canonical content length")?);
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
    /// A tombstone: the end of the id's current history. `scope` and `kind` are the scope and type
    /// of the version it ended, as segment format 3 records them; both `None` for the body of
    /// formats 1 and 2 (the id alone), and for a format 3 delete whose scope byte says "unknown"
    /// (the version it ended was retired by a record of format 1 or 2, which keeps neither).
    Delete {
        id: &'a str,
        scope: Option<ScopeView<'a>>,
        kind: Option<&'a str>,
    },
    RegisterType {
        name: &'a str,
        pattern: Option<&'a str>,
    },
    /// A version whose content compaction reclaimed: the store still remembers its (id, version,
    /// hash), and, in segment format 3, the type and scope of the version (both `None` in the body
    /// of formats 1 and 2, which ends after the version).
    Retired {
        hash: [u8; 32],
        id: &'a str,
        version: &'a str,
        kind: Option<&'a str>,
        scope: Option<ScopeView<'a>>,
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
    /// The first record of a frame (segment formats 2 and 3): bytes of the segment that were durable
    /// when the frame was written; in format 3 (`committed_at` is `Some`) the store's clock when the
    /// batch committed, never less than the previous frame's, and whether compaction left out or
    /// retired a record of the frame (`altered`, always false in format 2).
    SyncMark {
        synced: u64,
        committed_at: Option<i64>,
        altered: bool,
    },
}
