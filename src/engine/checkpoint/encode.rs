//! Encoding a checkpoint: the index's tables and version rows into a body, through a [`Sink`] (a
//! buffer, a byte counter, or a file in steps), and the header and checksum around it.

use crate::error::Result;
use crate::index::{Index, VersionEntry, VersionState, NO_SLOT};
use crate::item::Scope;
use crate::num::{bounded, checked, u64_from_usize, usize_from_u32, usize_from_u64};

use super::{
    SegmentMark, CHECKPOINT_HEADER_BYTES, CHECKPOINT_MAGIC, CHECKPOINT_VERSION, STATE_RETIRED, STATE_STORED,
    VERSION_BYTES,
};

/// Where an encoded checkpoint body goes: a buffer ([`Vec`]), a byte counter ([`Count`]), or a file
/// in bounded steps ([`Stream`](super::stream::Stream)). The method names are `Vec`'s, so the
/// encoder reads as if it wrote into one.
pub(super) trait Sink {
    fn extend_from_slice(&mut self, bytes: &[u8]);
    fn push(&mut self, byte: u8) {
        self.extend_from_slice(&[byte]);
    }
    /// Bytes put so far.
    fn position(&self) -> u64;
    /// Writes `bytes` over those put at `at`, which a [`Stream`](super::stream::Stream) can do only
    /// while they are still in its buffer.
    fn patch(&mut self, at: u64, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    #[inline]
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
    #[inline]
    fn push(&mut self, byte: u8) {
        Vec::push(self, byte);
    }
    #[inline]
    fn position(&self) -> u64 {
        u64_from_usize(self.len())
    }
    fn patch(&mut self, at: u64, bytes: &[u8]) {
        let at = usize_from_u64(at);
        if let Some(slot) = self.get_mut(at..at + bytes.len()) {
            slot.copy_from_slice(bytes);
        }
    }
}

/// Counts the bytes of a body without keeping them: the length a streamed checkpoint's header
/// needs before its body is written.
#[derive(Default)]
pub(super) struct Count(pub(super) u64);

impl Sink for Count {
    #[inline]
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0 += u64_from_usize(bytes.len());
    }
    #[inline]
    fn position(&self) -> u64 {
        self.0
    }
    fn patch(&mut self, _at: u64, _bytes: &[u8]) {}
}

/// A string with its length in one byte: `what` is no longer than that where it enters the index
/// (validated, or read from a log record or a checkpoint that gives its length in one byte too).
fn put_u8_str(out: &mut impl Sink, s: &str, what: &str) {
    out.push(bounded(s.len(), what));
    out.extend_from_slice(s.as_bytes());
}

/// A string with its length in two bytes (as [`put_u8_str`]).
fn put_u16_str(out: &mut impl Sink, s: &str, what: &str) {
    out.extend_from_slice(&bounded::<u16, _>(s.len(), what).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A count in four bytes: `what` is bounded by a limit (see [`crate::limits`]), or checked by
/// [`check_counts`].
fn put_count(out: &mut impl Sink, n: usize, what: &str) {
    out.extend_from_slice(&bounded::<u32, _>(n, what).to_le_bytes());
}

/// Refuses, before anything is written, a checkpoint of an index whose counts that no limit bounds
/// do not fit in the format's four bytes: its pins and segments. The other counts are at most
/// [`crate::limits`]'s (types, versions, ids, scopes, sources) or follow from them.
pub(super) fn check_counts(index: &Index, segments: &[SegmentMark]) -> Result<()> {
    checked::<u32, _>(index.pins.len(), "checkpoint pin count")?;
    checked::<u32, _>(segments.len(), "checkpoint segment count")?;
    Ok(())
}

/// Encodes the index, as of its sequence number, with the segments it points into.
#[cfg(test)]
pub(super) fn encode(index: &Index, segments: &[SegmentMark]) -> Vec<u8> {
    seal((index.seq, index.committed_at), &encode_body(index, segments))
}

/// Bytes the body of a checkpoint of `index` needs, about: a row and a time set entry per version,
/// and about 16 per id for its front-coded name (two length bytes and the part stored).
pub(super) fn body_capacity(index: &Index) -> usize {
    64 + index.slots.len() * (VERSION_BYTES + 4) + index.id_count() * 16
}

/// The uncompressed body of a checkpoint of `index` (see [`encode_body_into`]).
#[cfg(test)]
pub(super) fn encode_body(index: &Index, segments: &[SegmentMark]) -> Vec<u8> {
    let mut body = Vec::with_capacity(body_capacity(index));
    encode_body_into(&mut body, index, segments, None);
    body
}

/// The uncompressed body of a checkpoint of `index`: the part that needs the index (and its lock).
/// The number of versions kept (not forgotten) comes before their rows: given as `kept_known`, it
/// is written as it is; otherwise it is counted along the rows and patched in, which a sink that
/// has written the rows on already (a [`Stream`](super::stream::Stream)) cannot take. Returns the
/// number counted.
pub(super) fn encode_body_into(
    body: &mut impl Sink,
    index: &Index,
    segments: &[SegmentMark],
    kept_known: Option<u32>,
) -> u32 {
    put_tables(body, index, segments);
    put_count(body, index.id_count(), "id count (limits::IDS_MAX)");
    put_names(body, index);
    let mut deleted = index.deleted_ids();
    deleted.sort_unstable();
    put_count(body, deleted.len(), "deleted id count (limits::IDS_MAX)");
    for (id, deletes) in deleted {
        body.extend_from_slice(&id.to_le_bytes());
        body.extend_from_slice(&deletes.to_le_bytes());
    }
    put_versions(body, index, kept_known)
}

/// The tables before the ids: the segments the checkpoint covers, the registered types, the pins,
/// and the interned types, scopes and sources.
fn put_tables(body: &mut impl Sink, index: &Index, segments: &[SegmentMark]) {
    put_count(body, segments.len(), "segment count (check_counts)");
    for mark in segments {
        body.extend_from_slice(&mark.number.to_le_bytes());
        body.extend_from_slice(&mark.rewrites.to_le_bytes());
        body.extend_from_slice(&mark.len.to_le_bytes());
    }
    let types = index.registry.custom();
    put_count(body, types.len(), "type count (limits::TYPES_MAX)");
    for spec in &types {
        put_u8_str(body, spec.name(), "type name (at most 64 bytes)");
        match spec.pattern() {
            Some(pattern) => {
                body.push(1);
                put_u16_str(body, pattern, "id pattern (limits::ID_PATTERN_BYTES_MAX)");
            }
            None => body.push(0),
        }
    }
    put_count(body, index.pins.len(), "pin count (check_counts)");
    for (name, pin) in &index.pins {
        put_u8_str(body, name, "pin name (limits::ID_BYTES_MAX)");
        body.extend_from_slice(&pin.seq.to_le_bytes());
        body.extend_from_slice(&pin.taken_at.to_le_bytes());
        put_u8_str(
            body,
            pin.session.as_deref().unwrap_or(""),
            "session id (limits::ID_BYTES_MAX)",
        );
    }
    put_count(body, index.kinds.len(), "type table count (limits::TYPES_MAX)");
    for kind in index.kinds.values() {
        put_u8_str(body, kind, "type name (a record's type length is one byte)");
    }
    put_count(body, index.scopes.len(), "scope count (limits::SCOPES_MAX)");
    for scope in index.scopes.values() {
        match scope {
            Scope::Session(id) => {
                body.push(0);
                put_u8_str(body, id, "session id (a record's session length is one byte)");
            }
            Scope::GlobalReadonly => body.push(1),
            Scope::GlobalWritable => body.push(2),
        }
    }
    put_count(body, index.sources.len(), "source count (limits::SOURCES_MAX)");
    for source in index.sources.values() {
        put_u16_str(body, source, "source (a record's source length is two bytes)");
    }
}

/// The version table and the ordered sets (see [`encode_body_into`] for `kept_known`); returns the
/// number of versions kept.
fn put_versions(body: &mut impl Sink, index: &Index, kept_known: Option<u32>) -> u32 {
    // One pass over the versions: forgotten slots are left out and the others renumbered by rank,
    // their rows written, and the type and scope sets' sizes counted.
    let kept_at = body.position();
    body.extend_from_slice(&kept_known.unwrap_or(0).to_le_bytes());
    let mut renumber = Vec::with_capacity(index.slots.len());
    let mut kept = 0u32;
    let mut per_type = vec![0u32; index.kinds.len()];
    let mut per_scope = vec![0u32; index.scopes.len()];
    for version in index.slots.iter() {
        if version.state() == VersionState::Forgotten {
            renumber.push(NO_SLOT);
            continue;
        }
        renumber.push(kept);
        kept += 1;
        encode_version(body, index, &version);
        if version.is_stored() {
            if let Some(count) = per_type.get_mut(usize::from(version.kind())) {
                *count += 1;
            }
            if let Some(count) = per_scope.get_mut(usize_from_u32(version.scope)) {
                *count += 1;
            }
        }
    }
    if kept_known.is_none() {
        body.patch(kept_at, &kept.to_le_bytes());
    }
    // The time set in full; the type and scope sets are the same order filtered, so only their
    // sizes are stored.
    let slots = index.by_time.sorted_slots(&index.slots);
    put_count(body, slots.len(), "time set size (limits::VERSIONS_MAX)");
    for slot in slots {
        // The time set holds slots of the index only, each renumbered above.
        let Some(number) = renumber.get(usize_from_u32(slot)).copied() else {
            panic!("the time set holds slot {slot}, past the {} versions", renumber.len());
        };
        body.extend_from_slice(&number.to_le_bytes());
    }
    for (counts, what) in [
        (per_type, "type set count (limits::TYPES_MAX)"),
        (per_scope, "scope set count (limits::SCOPES_MAX)"),
    ] {
        put_count(body, counts.len(), what);
        for count in counts {
            body.extend_from_slice(&count.to_le_bytes());
        }
    }
    kept
}

/// The id names as the name arena holds them (front-coded, see
/// [`NameArena`](crate::index::NameArena)): the shared and stored lengths of each id's name, then
/// the chunks of stored parts (each at most [`crate::index::NAME_CHUNK`] bytes), copied whole.
pub(super) fn put_names(body: &mut impl Sink, index: &Index) {
    let (parts, chunks) = index.name_arena().parts_and_chunks();
    for part in parts {
        body.extend_from_slice(part);
    }
    // A chunk holds one name part at least, and at most NAME_CHUNK bytes.
    put_count(body, chunks.len(), "name chunk count (limits::IDS_MAX)");
    for chunk in chunks {
        put_count(body, chunk.len(), "name chunk length (index::NAME_CHUNK)");
        body.extend_from_slice(chunk.as_bytes());
    }
}

/// The checkpoint file for `at` (the seq and the commit time of its batch) around `body`: header,
/// body, CRC. Needs no lock.
#[cfg(test)]
pub(super) fn seal(at: (u64, i64), body: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(CHECKPOINT_HEADER_BYTES + body.len() + 4);
    file.extend_from_slice(&[0; CHECKPOINT_HEADER_BYTES]);
    file.extend_from_slice(body);
    seal_in_place(at, &mut file);
    file
}

/// Turns `file`, a header's worth of space followed by a body, into the checkpoint file for `at`
/// (the seq and the commit time of its batch): fills in the header and appends the CRC. Needs no
/// lock, and copies nothing.
pub(super) fn seal_in_place(at: (u64, i64), file: &mut Vec<u8>) {
    // `file` starts with the header's space.
    let header = header(at, u64_from_usize(file.len() - CHECKPOINT_HEADER_BYTES));
    if let Some(slot) = file.get_mut(..CHECKPOINT_HEADER_BYTES) {
        slot.copy_from_slice(&header);
    }
    let crc = crc32fast::hash(file);
    file.extend_from_slice(&crc.to_le_bytes());
}

/// The header of the checkpoint for `seq`, whose batch committed at `committed_at` (0 when
/// unknown), and whose body is `body_len` bytes.
pub(super) fn header((seq, committed_at): (u64, i64), body_len: u64) -> [u8; CHECKPOINT_HEADER_BYTES] {
    let mut header = [0u8; CHECKPOINT_HEADER_BYTES];
    for (at, field) in [
        (0, &CHECKPOINT_MAGIC[..]),
        (8, &CHECKPOINT_VERSION.to_le_bytes()[..]),
        (12, &0u32.to_le_bytes()[..]),
        (16, &seq.to_le_bytes()[..]),
        (24, &committed_at.to_le_bytes()[..]),
        (32, &body_len.to_le_bytes()[..]),
    ] {
        if let Some(slot) = header.get_mut(at..at + field.len()) {
            slot.copy_from_slice(field);
        }
    }
    header
}

/// One version, 72 bytes: seq_created u64, seq_ended u64 (u64::MAX while open), timestamp i64,
/// expires_at i64 (i64::MAX for never), segment, offset, length, id, generation, version tag (16
/// bits, the high half zero), scope, source (u32 each), type u16, state u8, a zero byte, and the
/// record's body CRC (u32). A retired version keeps its type and scope there, or, when they are
/// unknown, the scope `SCOPE_UNKNOWN` (`u32::MAX`) and the type 0.
fn encode_version(body: &mut impl Sink, index: &Index, version: &VersionEntry) {
    // Built whole on the stack and appended with one copy: a million rows are encoded under the
    // index lock.
    let mut row = [0u8; VERSION_BYTES];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        if let Some(slot) = row.get_mut(at..at + bytes.len()) {
            slot.copy_from_slice(bytes);
        }
        at += bytes.len();
    };
    // The four fields that may be in the overflow table, looked up once.
    let rare = index.rare_of(version);
    put(&version.seq_created.to_le_bytes());
    put(&rare.seq_ended.to_le_bytes());
    put(&version.timestamp().to_le_bytes());
    put(&rare.expires_at.to_le_bytes());
    for field in [
        version.location.segment,
        version.location.offset,
        version.location.len,
        version.id,
        rare.generation,
        u32::from(version.version_tag()),
        version.scope,
        rare.source,
    ] {
        put(&field.to_le_bytes());
    }
    put(&version.kind().to_le_bytes());
    put(&[
        if version.is_stored() {
            STATE_STORED
        } else {
            STATE_RETIRED
        },
        0,
    ]);
    put(&version.location.crc.to_le_bytes());
    body.extend_from_slice(&row);
}
