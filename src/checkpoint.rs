//! Index checkpoints: the whole in-memory index as of sequence number S, in one checksummed file,
//! so that opening loads it and replays only the log after S.
//!
//! A checkpoint is only ever a shortcut: it records the exact segment files it was taken over
//! (number, rewrite count, length); opening checks them and falls back to a full replay of the log
//! when anything disagrees or the file is damaged. docs/FORMAT.md gives the layout byte by byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::index::{
    key_of, ChunkVec, IdTable, Index, Interner, KeySet, Location, PinInfo, VersionEntry, VersionState, CHUNK, NO_SLOT,
    SEQ_OPEN,
};
use crate::item::{Scope, TypeSpec};
use crate::log::record::Cursor;
use crate::log::writer::sync_dir;
use crate::storage::Storage;
use crate::store::Shared;

/// The magic bytes that open every checkpoint file.
const CHECKPOINT_MAGIC: [u8; 8] = *b"CTXLOGCP";
/// Header flag: the body is stored LZ4-compressed, in independent blocks (see [`seal`]).
const FLAG_LZ4: u32 = 1;
/// The checkpoint format version this build writes and reads.
const CHECKPOINT_VERSION: u32 = 3;
/// Uncompressed bytes per LZ4 block of the body: every block but the last holds exactly this many.
/// Blocks are compressed and decompressed independently, on two threads.
const LZ4_BLOCK: usize = 1 << 20;
/// Bytes of the checkpoint header: magic, version, reserved, seq, body length.
const CHECKPOINT_HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8;
/// Bytes of one version in the version table.
const VERSION_BYTES: usize = 72;

/// The file name of a checkpoint as of `seq`; the digits sort like the numbers.
pub(crate) fn checkpoint_file_name(seq: u64) -> String {
    format!("checkpoint-{seq:020}.idx")
}

fn parse_checkpoint_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?.strip_suffix(".idx")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Checkpoint files in `dir`, newest first.
pub(crate) fn list(storage: &dyn Storage, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    let names = storage
        .list(dir)
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for name in names {
        if let Some(seq) = parse_checkpoint_file_name(&name) {
            found.push((seq, dir.join(name)));
        }
    }
    found.sort_unstable_by_key(|(seq, _)| std::cmp::Reverse(*seq));
    Ok(found)
}

/// One segment file as a checkpoint saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentMark {
    pub(crate) number: u32,
    pub(crate) rewrites: u32,
    /// Bytes of the file covered by the checkpoint; for the last (active) one, replay goes on here.
    pub(crate) len: u64,
}

/// A decoded checkpoint.
pub(crate) struct Loaded {
    pub(crate) seq: u64,
    pub(crate) segments: Vec<SegmentMark>,
    pub(crate) index: Index,
}

fn put_u8_str(out: &mut Vec<u8>, s: &str) {
    out.push(u8::try_from(s.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(s.as_bytes());
}

fn put_u16_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&u16::try_from(s.len()).unwrap_or(u16::MAX).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

/// State byte of a version in the version table.
const STATE_STORED: u8 = 0;
const STATE_RETIRED: u8 = 1;

/// Encodes the index, as of its sequence number, with the segments it points into.
#[cfg(test)]
pub(crate) fn encode(index: &Index, segments: &[SegmentMark]) -> Vec<u8> {
    seal(index.seq, &encode_body(index, segments))
}

/// The uncompressed body of a checkpoint of `index`: the part that needs the index (and its lock).
fn encode_body(index: &Index, segments: &[SegmentMark]) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + index.slots.len() * (VERSION_BYTES + 32) + index.id_count() * 16);
    put_count(&mut body, segments.len());
    for mark in segments {
        body.extend_from_slice(&mark.number.to_le_bytes());
        body.extend_from_slice(&mark.rewrites.to_le_bytes());
        body.extend_from_slice(&mark.len.to_le_bytes());
    }
    let types = index.registry.custom();
    put_count(&mut body, types.len());
    for spec in &types {
        put_u8_str(&mut body, spec.name());
        match spec.pattern() {
            Some(pattern) => {
                body.push(1);
                put_u16_str(&mut body, pattern);
            }
            None => body.push(0),
        }
    }
    put_count(&mut body, index.pins.len());
    for (name, pin) in &index.pins {
        put_u8_str(&mut body, name);
        body.extend_from_slice(&pin.seq.to_le_bytes());
        body.extend_from_slice(&pin.taken_at.to_le_bytes());
        put_u8_str(&mut body, pin.session.as_deref().unwrap_or(""));
    }
    put_count(&mut body, index.kinds.len());
    for kind in index.kinds.values() {
        put_u8_str(&mut body, kind);
    }
    put_count(&mut body, index.scopes.len());
    for scope in index.scopes.values() {
        match scope {
            Scope::Session(id) => {
                body.push(0);
                put_u8_str(&mut body, id);
            }
            Scope::GlobalReadonly => body.push(1),
            Scope::GlobalWritable => body.push(2),
        }
    }
    put_count(&mut body, index.sources.len());
    for source in index.sources.values() {
        put_u16_str(&mut body, source);
    }
    put_count(&mut body, index.id_count());
    let ids = u32::try_from(index.id_count()).unwrap_or(u32::MAX);
    for id in 0..ids {
        put_u8_str(&mut body, index.id_name(id));
    }
    let deleted: Vec<(u32, u32)> = (0..ids)
        .filter_map(|id| index.id_at(id).filter(|e| e.deletes > 0).map(|e| (id, e.deletes)))
        .collect();
    put_count(&mut body, deleted.len());
    for (id, deletes) in deleted {
        body.extend_from_slice(&id.to_le_bytes());
        body.extend_from_slice(&deletes.to_le_bytes());
    }
    // Forgotten slots are left out: the numbers written are the kept slots' ranks.
    let mut renumber = Vec::with_capacity(index.slots.len());
    let mut kept = 0u32;
    for version in index.slots.iter() {
        if version.state == VersionState::Forgotten {
            renumber.push(NO_SLOT);
        } else {
            renumber.push(kept);
            kept += 1;
        }
    }
    body.extend_from_slice(&kept.to_le_bytes());
    for version in index.slots.iter().filter(|v| v.state != VersionState::Forgotten) {
        encode_version(&mut body, version);
    }
    let put_set = |body: &mut Vec<u8>, set: &KeySet| {
        let slots = set.sorted_slots(&index.slots);
        put_count(body, slots.len());
        for slot in slots {
            let number = renumber.get(usize::try_from(slot).unwrap_or(usize::MAX)).copied();
            body.extend_from_slice(&number.unwrap_or(NO_SLOT).to_le_bytes());
        }
    };
    put_set(&mut body, &index.by_time);
    put_count(&mut body, index.by_type.len());
    for set in &index.by_type {
        put_set(&mut body, set);
    }
    put_count(&mut body, index.by_scope.len());
    for set in &index.by_scope {
        put_set(&mut body, set);
    }
    body
}

/// The checkpoint file for `seq` around `body`: header, LZ4-compressed body, CRC. Needs no lock.
///
/// The stored body is the body's length (u64), the number of blocks (u32), then for each block of
/// [`LZ4_BLOCK`] bytes of the body (the last may be shorter) its length (u32), the length of its LZ4
/// block (u32) and that block.
fn seal(seq: u64, body: &[u8]) -> Vec<u8> {
    let blocks: Vec<&[u8]> = body.chunks(LZ4_BLOCK).collect();
    let count = u32::try_from(blocks.len()).unwrap_or(u32::MAX);
    // Fixed-width tables are mostly small numbers: LZ4 roughly halves them.
    let compressed = on_two_threads(blocks, |raw| (raw.len(), lz4_flex::block::compress(raw)));
    let stored_len = 8 + 4 + compressed.iter().map(|(_, block)| 8 + block.len()).sum::<usize>();
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_BYTES + stored_len + 4);
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&FLAG_LZ4.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(stored_len as u64).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    for (raw_len, block) in &compressed {
        out.extend_from_slice(&u32::try_from(*raw_len).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&u32::try_from(block.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(block);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The body of a stored LZ4 body (see [`seal`]), its blocks decompressed on two threads.
fn unseal(stored: &[u8]) -> Result<Vec<u8>, String> {
    let mut c = Cursor::new(stored);
    let e = |e: crate::log::record::DecodeError| e.0;
    let raw_len = c.u64("body length").map_err(e)?;
    let count = c.u32("block count").map_err(e)?;
    let raw_len = usize::try_from(raw_len)
        .ok()
        .filter(|len| len.div_ceil(LZ4_BLOCK) == usize::try_from(count).unwrap_or(usize::MAX))
        .ok_or_else(|| format!("a body of {raw_len} bytes cannot be {count} blocks"))?;
    let mut blocks = Vec::with_capacity(bounded(count, 8, &c, stored.len(), "block")?);
    let mut left = raw_len;
    for number in 0..count {
        let len = usize::try_from(c.u32("block length").map_err(e)?).unwrap_or(usize::MAX);
        let block_len = usize::try_from(c.u32("LZ4 block length").map_err(e)?).unwrap_or(usize::MAX);
        if len != left.min(LZ4_BLOCK) {
            return Err(format!("block {number} holds {len} bytes, not {}", left.min(LZ4_BLOCK)));
        }
        left -= len;
        blocks.push(c.take(block_len, "LZ4 block").map_err(e)?);
    }
    if !c.is_empty() {
        return Err("bytes after the last block".into());
    }
    // Every block's length was checked against the body's, which the file's size bounds: LZ4
    // expands a block at most 255 times.
    if raw_len as u64 > (stored.len() as u64).saturating_mul(255) {
        return Err(format!(
            "the body claims {raw_len} bytes, more than its blocks can hold"
        ));
    }
    // Zeroed memory comes from the system untouched: each page is written once, by its block.
    let mut body = vec![0u8; raw_len];
    let jobs: Vec<(&[u8], &mut [u8])> = blocks.into_iter().zip(body.chunks_mut(LZ4_BLOCK)).collect();
    let results = on_two_threads(jobs, |(block, out)| {
        match lz4_flex::block::decompress_into(block, out) {
            Ok(len) if len == out.len() => Ok(()),
            Ok(len) => Err(format!("a block decompresses to {len} bytes, not {}", out.len())),
            Err(e) => Err(format!("the body does not decompress: {e}")),
        }
    });
    results.into_iter().collect::<Result<(), String>>()?;
    Ok(body)
}

/// Runs `work` on every item, in order, the second half of them on another thread when one can be
/// started (on this one otherwise).
fn on_two_threads<T: Send, R: Send>(mut items: Vec<T>, work: impl Fn(T) -> R + Sync) -> Vec<R> {
    if items.len() < 2 {
        return items.into_iter().map(work).collect();
    }
    let rest = std::sync::Mutex::new(items.split_off(items.len() / 2));
    let run_rest = || {
        let items = std::mem::take(&mut *rest.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        items.into_iter().map(&work).collect::<Vec<R>>()
    };
    std::thread::scope(|scope| {
        let other = std::thread::Builder::new()
            .name("ctxlog-checkpoint".into())
            .spawn_scoped(scope, run_rest);
        let mut out: Vec<R> = items.into_iter().map(&work).collect();
        let rest = match other {
            Ok(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => run_rest(),
        };
        out.extend(rest);
        out
    })
}

/// One version, 72 bytes: seq_created u64, seq_ended u64 (u64::MAX while open), timestamp i64,
/// expires_at i64 (i64::MAX for never), segment, offset, length, id, generation, version tag, scope,
/// source (u32 each), type u16, state u8, a zero byte, and the record's body CRC (u32).
fn encode_version(body: &mut Vec<u8>, version: &VersionEntry) {
    body.extend_from_slice(&version.seq_created.to_le_bytes());
    body.extend_from_slice(&version.seq_ended.to_le_bytes());
    body.extend_from_slice(&version.timestamp.to_le_bytes());
    body.extend_from_slice(&version.expires_at.to_le_bytes());
    for field in [
        version.location.segment,
        version.location.offset,
        version.location.len,
        version.id,
        version.generation,
        version.version_tag,
        version.scope,
        version.source,
    ] {
        body.extend_from_slice(&field.to_le_bytes());
    }
    body.extend_from_slice(&version.kind.to_le_bytes());
    body.push(if version.is_stored() {
        STATE_STORED
    } else {
        STATE_RETIRED
    });
    body.push(0);
    body.extend_from_slice(&version.location.crc.to_le_bytes());
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// What a version table entry must agree with.
struct Bounds<'a> {
    seq: u64,
    ids: usize,
    segment_lens: &'a BTreeMap<u32, u64>,
    tables: (usize, usize, usize),
}

fn decode_version(bytes: &[u8], bounds: &Bounds<'_>) -> Result<VersionEntry, String> {
    let seq_created = le_u64(bytes, 0);
    let seq_ended = le_u64(bytes, 8);
    let timestamp = le_u64(bytes, 16) as i64;
    let expires_at = le_u64(bytes, 24) as i64;
    let location = Location {
        segment: le_u32(bytes, 32),
        offset: le_u32(bytes, 36),
        len: le_u32(bytes, 40),
        crc: le_u32(bytes, 68),
    };
    let id = le_u32(bytes, 44);
    let generation = le_u32(bytes, 48);
    let version_tag = le_u32(bytes, 52);
    let scope = le_u32(bytes, 56);
    let source = le_u32(bytes, 60);
    let kind = u16::from_le_bytes([bytes.get(64).copied().unwrap_or(0), bytes.get(65).copied().unwrap_or(0)]);
    let state = match (bytes.get(66).copied(), bytes.get(67).copied()) {
        (Some(STATE_STORED), Some(0)) => VersionState::Stored,
        (Some(STATE_RETIRED), Some(0)) => VersionState::Retired,
        (state, _) => return Err(format!("unknown version state {state:?}")),
    };
    if usize::try_from(id).map_or(true, |id| id >= bounds.ids) {
        return Err(format!("id number {id} is out of range"));
    }
    if state == VersionState::Stored {
        let (kinds, scopes, sources) = bounds.tables;
        let tables_hold = usize::from(kind) < kinds
            && usize::try_from(scope).is_ok_and(|s| s < scopes)
            && usize::try_from(source).is_ok_and(|s| s < sources);
        if !tables_hold {
            return Err("a table number is out of range".into());
        }
    }
    let fits = bounds
        .segment_lens
        .get(&location.segment)
        .is_some_and(|len| u64::from(location.offset) + u64::from(location.len) <= *len);
    if !fits {
        return Err("it points outside the recorded segments".into());
    }
    if seq_created > bounds.seq || (seq_ended != SEQ_OPEN && (seq_ended > bounds.seq || seq_ended < seq_created)) {
        return Err("its sequence numbers are after the checkpoint or out of order".into());
    }
    Ok(VersionEntry {
        seq_created,
        seq_ended,
        timestamp,
        expires_at,
        location,
        id,
        generation,
        version_tag,
        scope,
        source,
        kind,
        state,
        ..VersionEntry::default()
    })
}

/// Checks that `count` items of at least `each` bytes fit in what is left.
fn bounded(count: u32, each: usize, cursor: &Cursor<'_>, total: usize, what: &str) -> Result<usize, String> {
    let count = usize::try_from(count).map_err(|_| format!("{what} count overflow"))?;
    let left = total.saturating_sub(cursor.position());
    if count.saturating_mul(each) > left {
        return Err(format!("{what} count {count} cannot fit in the {left} bytes left"));
    }
    Ok(count)
}

fn get_str<'a>(cursor: &mut Cursor<'a>, len: usize, what: &str) -> Result<&'a str, String> {
    let bytes = cursor.take(len, what).map_err(|e| e.0)?;
    std::str::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))
}

/// Which ordered set a run of slot numbers belongs to.
#[derive(Clone, Copy)]
enum SetOf {
    Time,
    Type(u32),
    Scope(u32),
}

impl SetOf {
    fn name(self) -> &'static str {
        match self {
            SetOf::Time => "time set",
            SetOf::Type(_) => "type set",
            SetOf::Scope(_) => "scope set",
        }
    }

    fn holds(self, version: &VersionEntry) -> bool {
        version.is_stored()
            && match self {
                SetOf::Time => true,
                SetOf::Type(kind) => u32::from(version.kind) == kind,
                SetOf::Scope(scope) => version.scope == scope,
            }
    }
}

/// Slot numbers checked per piece of an ordered set; pieces are checked on two threads.
const SET_PIECE: usize = 1 << 16;

/// Checks a piece of an ordered set: its slots must be stored versions that belong to the set, in
/// strictly ascending (timestamp, slot) order.
fn check_set_piece(slots: &ChunkVec<VersionEntry>, set: SetOf, piece: &[u8]) -> Result<(), String> {
    let mut last: Option<(i64, u32)> = None;
    for raw in piece.chunks_exact(4) {
        let slot = le_u32(raw, 0);
        let version = slots
            .get(usize::try_from(slot).unwrap_or(usize::MAX))
            .filter(|v| set.holds(v))
            .ok_or_else(|| format!("{} lists slot {slot}, which does not belong there", set.name()))?;
        let key = (version.timestamp, slot);
        if last.is_some_and(|last| last >= key) {
            return Err(format!("{} is not in order", set.name()));
        }
        last = Some(key);
    }
    Ok(())
}

/// Reads the ordered sets: the time set, the type sets, the scope sets (see [`check_set_piece`]).
fn decode_sets(
    c: &mut Cursor<'_>,
    total: usize,
    slots: &ChunkVec<VersionEntry>,
) -> Result<(Vec<KeySet>, Vec<KeySet>, KeySet), String> {
    let e = |e: crate::log::record::DecodeError| e.0;
    fn read<'a>(c: &mut Cursor<'a>, total: usize, set: SetOf) -> Result<(SetOf, &'a [u8]), String> {
        let count = c.u32("set size").map_err(|e| e.0)?;
        let count = bounded(count, 4, c, total, set.name())?;
        Ok((set, c.take(count * 4, set.name()).map_err(|e| e.0)?))
    }
    let mut sets = vec![read(c, total, SetOf::Time)?];
    let types = c.u32("type set count").map_err(e)?;
    bounded(types, 4, c, total, "type set")?;
    for kind in 0..types {
        sets.push(read(c, total, SetOf::Type(kind))?);
    }
    let scopes = c.u32("scope set count").map_err(e)?;
    bounded(scopes, 4, c, total, "scope set")?;
    for scope in 0..scopes {
        sets.push(read(c, total, SetOf::Scope(scope))?);
    }
    let pieces: Vec<(SetOf, &[u8])> = sets
        .iter()
        .flat_map(|(set, bytes)| bytes.chunks(SET_PIECE * 4).map(|piece| (*set, piece)))
        .collect();
    on_two_threads(pieces, |(set, piece)| check_set_piece(slots, set, piece))
        .into_iter()
        .collect::<Result<(), String>>()?;
    let mut by_time = KeySet::default();
    let (mut by_type, mut by_scope) = (Vec::new(), Vec::new());
    for (set, bytes) in sets {
        let numbers: Vec<u32> = bytes.chunks_exact(4).map(|raw| le_u32(raw, 0)).collect();
        // Where one piece ends and the next begins, the order must hold too.
        for at in (SET_PIECE..numbers.len()).step_by(SET_PIECE) {
            let (before, after) = (numbers.get(at - 1), numbers.get(at));
            if let (Some(before), Some(after)) = (before, after) {
                if key_of(slots, *before) >= key_of(slots, *after) {
                    return Err(format!("{} is not in order", set.name()));
                }
            }
        }
        let keys = KeySet::from_sorted(numbers);
        match set {
            SetOf::Time => by_time = keys,
            SetOf::Type(_) => by_type.push(keys),
            SetOf::Scope(_) => by_scope.push(keys),
        }
    }
    Ok((by_type, by_scope, by_time))
}

/// The parts of a checkpoint body after the id names: the deleted ids, the version table and the
/// ordered sets.
type Tables = (
    Vec<(u32, u32)>,
    ChunkVec<VersionEntry>,
    (Vec<KeySet>, Vec<KeySet>, KeySet),
    (Interner<Box<str>>, Interner<Scope>, Interner<Box<str>>),
);

/// Decodes what follows the id names (see [`Tables`]), checking it against the segments and tables
/// before it.
fn decode_tables(
    c: &mut Cursor<'_>,
    total: usize,
    seq: u64,
    id_count: usize,
    segments: &[SegmentMark],
    tables: (Interner<Box<str>>, Interner<Scope>, Interner<Box<str>>),
) -> Result<Tables, String> {
    let e = |e: crate::log::record::DecodeError| e.0;
    let segment_lens: BTreeMap<u32, u64> = segments.iter().map(|m| (m.number, m.len)).collect();
    let count = c.u32("deleted id count").map_err(e)?;
    let count = bounded(count, 8, c, total, "deleted id")?;
    let mut deletes = Vec::with_capacity(count);
    for _ in 0..count {
        let id = c.u32("deleted id").map_err(e)?;
        let times = c.u32("deletes").map_err(e)?;
        if usize::try_from(id).map_or(true, |id| id >= id_count) {
            return Err(format!("deleted id number {id} is out of range"));
        }
        deletes.push((id, times));
    }
    let count = c.u32("version count").map_err(e)?;
    let count = bounded(count, VERSION_BYTES, c, total, "version")?;
    let table = c.take(count * VERSION_BYTES, "versions").map_err(e)?;
    let bounds = Bounds {
        seq,
        ids: id_count,
        segment_lens: &segment_lens,
        tables: (tables.0.len(), tables.1.len(), tables.2.len()),
    };
    // Straight into chunks of the index's own size: no copy of the whole table.
    let mut chunks = Vec::with_capacity(count.div_ceil(CHUNK));
    for rows in table.chunks(CHUNK * VERSION_BYTES) {
        let mut chunk = Vec::with_capacity(CHUNK);
        for raw in rows.chunks_exact(VERSION_BYTES) {
            let version = decode_version(raw, &bounds)
                .map_err(|reason| format!("version {}: {reason}", chunks.len() * CHUNK + chunk.len()))?;
            chunk.push(version);
        }
        chunks.push(chunk);
    }
    let slots = ChunkVec::from_chunks(chunks);
    let (by_type, by_scope, by_time) = decode_sets(c, total, &slots)?;
    if !c.is_empty() {
        return Err("bytes after the last table".into());
    }
    // Every stored version must be in each kind of set once: the sets are strictly ordered and hold
    // only stored versions of their own type or scope, so equal counts mean none is missing.
    let stored = slots.iter().filter(|v| v.is_stored()).count();
    let complete = by_time.len() == stored
        && by_type.iter().map(KeySet::len).sum::<usize>() == stored
        && by_scope.iter().map(KeySet::len).sum::<usize>() == stored;
    if !complete {
        return Err("the ordered sets do not list every stored version".into());
    }
    Ok((deletes, slots, (by_type, by_scope, by_time), tables))
}

/// The id names of a checkpoint, each a u8 length and that many bytes of UTF-8.
fn names_in(bytes: &[u8]) -> impl Iterator<Item = Result<&str, String>> {
    let mut c = Cursor::new(bytes);
    std::iter::from_fn(move || {
        if c.is_empty() {
            return None;
        }
        Some(
            c.u8("id length")
                .map_err(|e| e.0)
                .and_then(|len| get_str(&mut c, usize::from(len), "id")),
        )
    })
}

/// Frees a large buffer on another thread: unmapping a few hundred MiB takes tens of milliseconds
/// that opening need not wait for.
pub(crate) fn drop_in_background<T: Send + 'static>(value: T) {
    // When no thread can be started, the closure, and the value with it, is dropped right here.
    let _ = std::thread::Builder::new()
        .name("ctxlog-free".into())
        .spawn(move || drop(value));
}

/// Whether `bytes` are an intact checkpoint of an older format: not damage, just a shortcut this
/// build does not take (opening replays the log instead, and the next checkpoint replaces it).
pub(crate) fn is_older_format(bytes: &[u8]) -> bool {
    let Some(crc_at) = bytes.len().checked_sub(4) else {
        return false;
    };
    let (covered, stored_crc) = bytes.split_at(crc_at);
    let intact = stored_crc
        .try_into()
        .is_ok_and(|crc| crc32fast::hash(covered) == u32::from_le_bytes(crc));
    intact
        && covered.get(..8) == Some(&CHECKPOINT_MAGIC[..])
        && covered
            .get(8..12)
            .and_then(|v| v.try_into().ok())
            .is_some_and(|v| u32::from_le_bytes(v) < CHECKPOINT_VERSION)
}

/// Decodes a checkpoint file's bytes; the error says why it cannot be used.
pub(crate) fn decode(bytes: &[u8]) -> Result<Loaded, String> {
    let crc_at = bytes.len().checked_sub(4).ok_or("shorter than its checksum")?;
    let (covered, stored_crc) = bytes.split_at(crc_at);
    let stored_crc = u32::from_le_bytes(stored_crc.try_into().map_err(|_| "checksum")?);
    if crc32fast::hash(covered) != stored_crc {
        return Err("checksum mismatch".into());
    }
    let total = covered.len();
    let mut c = Cursor::new(covered);
    let e = |e: crate::log::record::DecodeError| e.0;
    if c.take(8, "magic").map_err(e)? != CHECKPOINT_MAGIC {
        return Err("not a ctxlog checkpoint (bad magic)".into());
    }
    let version = c.u32("version").map_err(e)?;
    if version != CHECKPOINT_VERSION {
        return Err(format!(
            "checkpoint format version {version} is not supported (this build reads {CHECKPOINT_VERSION})"
        ));
    }
    let flags = c.u32("flags").map_err(e)?;
    if flags & !FLAG_LZ4 != 0 {
        return Err(format!("unknown checkpoint flags {flags:#x}"));
    }
    let seq = c.u64("seq").map_err(e)?;
    let body_len = c.u64("body length").map_err(e)?;
    if usize::try_from(body_len).ok() != Some(total - CHECKPOINT_HEADER_BYTES) {
        return Err("body length does not match the file".into());
    }
    let stored = covered.get(CHECKPOINT_HEADER_BYTES..).unwrap_or_default();
    let body: std::borrow::Cow<'_, [u8]> = if flags & FLAG_LZ4 == 0 {
        std::borrow::Cow::Borrowed(stored)
    } else {
        std::borrow::Cow::Owned(unseal(stored)?)
    };
    let total = body.len();
    let mut c = Cursor::new(&body);

    let count = c.u32("segment count").map_err(e)?;
    let mut segments = Vec::with_capacity(bounded(count, 16, &c, total, "segment")?);
    for _ in 0..count {
        let number = c.u32("segment number").map_err(e)?;
        let rewrites = c.u32("rewrites").map_err(e)?;
        let len = c.u64("segment length").map_err(e)?;
        segments.push(SegmentMark { number, rewrites, len });
    }
    let mut registry = crate::item::TypeRegistry::default();
    let count = c.u32("type count").map_err(e)?;
    for _ in 0..bounded(count, 2, &c, total, "type")? {
        let len = usize::from(c.u8("type length").map_err(e)?);
        let name = get_str(&mut c, len, "type")?;
        let mut spec = TypeSpec::new(name);
        if c.u8("pattern flag").map_err(e)? == 1 {
            let len = usize::from(c.u16("pattern length").map_err(e)?);
            spec = spec.id_pattern(get_str(&mut c, len, "pattern")?);
        }
        registry
            .insert(spec)
            .map_err(|e| format!("stored type is invalid: {e}"))?;
    }
    let mut pins = BTreeMap::new();
    let count = c.u32("pin count").map_err(e)?;
    for _ in 0..bounded(count, 18, &c, total, "pin")? {
        let len = usize::from(c.u8("name length").map_err(e)?);
        let name = get_str(&mut c, len, "pin name")?.to_owned();
        let pin_seq = c.u64("pin seq").map_err(e)?;
        let taken_at = c.i64("taken_at").map_err(e)?;
        let len = usize::from(c.u8("session length").map_err(e)?);
        let session = get_str(&mut c, len, "session")?;
        let session = (!session.is_empty()).then(|| Arc::from(session));
        pins.insert(
            name,
            PinInfo {
                seq: pin_seq,
                taken_at,
                session,
            },
        );
    }
    let count = c.u32("type table count").map_err(e)?;
    let mut kinds = Interner::default();
    for _ in 0..bounded(count, 1, &c, total, "type table")? {
        let len = usize::from(c.u8("type length").map_err(e)?);
        kinds.intern(&Box::from(get_str(&mut c, len, "type")?));
    }
    let count = c.u32("scope count").map_err(e)?;
    let mut scopes = Interner::default();
    for _ in 0..bounded(count, 1, &c, total, "scope")? {
        let scope = match c.u8("scope tag").map_err(e)? {
            0 => {
                let len = usize::from(c.u8("session length").map_err(e)?);
                Scope::Session(get_str(&mut c, len, "session")?.to_owned())
            }
            1 => Scope::GlobalReadonly,
            2 => Scope::GlobalWritable,
            other => return Err(format!("unknown scope tag {other}")),
        };
        scopes.intern(&scope);
    }
    let count = c.u32("source count").map_err(e)?;
    let mut sources = Interner::default();
    for _ in 0..bounded(count, 2, &c, total, "source")? {
        let len = usize::from(c.u16("source length").map_err(e)?);
        sources.intern(&Box::from(get_str(&mut c, len, "source")?));
    }
    if kinds.len() > usize::from(u16::MAX) {
        return Err("too many types".into());
    }
    let count = c.u32("id count").map_err(e)?;
    let id_count = bounded(count, 1, &c, total, "id")?;
    // The names are only skipped here: another thread checks them and builds the id table while
    // this one decodes the versions and the ordered sets.
    let names_at = c.position();
    for _ in 0..id_count {
        let len = usize::from(c.u8("id length").map_err(e)?);
        c.take(len, "id").map_err(e)?;
    }
    let names = body.get(names_at..c.position()).unwrap_or_default();
    let build_ids = || IdTable::from_names(id_count, names_in(names));
    let mut index = std::thread::scope(|scope| {
        let ids = std::thread::Builder::new()
            .name("ctxlog-checkpoint".into())
            .spawn_scoped(scope, build_ids);
        let rest = decode_tables(&mut c, total, seq, id_count, &segments, (kinds, scopes, sources));
        let ids = match ids {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| Err("building the id table failed".into())),
            // No thread to be had: the same work here.
            Err(_) => build_ids(),
        };
        let (deletes, slots, sets, tables) = rest?;
        let mut ids = ids?;
        for (id, times) in deletes {
            ids.set_deletes(id, times)?;
        }
        Index::from_checkpoint(seq, ids, slots, sets, tables)
    })?;
    if let std::borrow::Cow::Owned(raw) = body {
        drop_in_background(raw);
    }
    index.registry = registry;
    index.pins = pins;
    Ok(Loaded { seq, segments, index })
}

/// Writes a checkpoint of the index as it is now. With `sync_log`, the log is synced first up to
/// at least the checkpoint's sequence number, so that a checkpoint never gets ahead of the log.
pub(crate) fn write(shared: &Shared, sync_log: bool) -> Result<u64> {
    let (seq, bytes) = {
        let index = shared.read_index();
        let marks: Vec<SegmentMark> = index
            .segments
            .iter()
            .map(|(number, segment)| SegmentMark {
                number: *number,
                rewrites: segment.rewrites,
                len: segment.published_len(),
            })
            .collect();
        (index.seq, encode_body(&index, &marks))
    };
    // Compressing and checksumming happen after the lock is released: writers wait only for the copy.
    let bytes = seal(seq, &bytes);
    if sync_log {
        shared.flush()?;
    }
    install(&*shared.storage, &shared.dir, seq, &bytes)?;
    shared
        .last_checkpoint_bytes
        .store(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(seq)
}

/// Writes `bytes` as the checkpoint for `seq`: temporary file, sync, rename, sync the directory;
/// then removes older checkpoints.
pub(crate) fn install(storage: &dyn Storage, dir: &Path, seq: u64, bytes: &[u8]) -> Result<()> {
    let path = dir.join(checkpoint_file_name(seq));
    let tmp = dir.join(format!("{}.tmp", checkpoint_file_name(seq)));
    let mut file = storage
        .create(&tmp)
        .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
    file.append(bytes)
        .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    file.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", tmp.display()), e))?;
    drop(file);
    storage
        .rename(&tmp, &path)
        .map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))?;
    sync_dir(storage, dir)?;
    for (old_seq, old) in list(storage, dir)? {
        if old_seq != seq {
            storage
                .remove(&old)
                .map_err(|e| Error::io(format!("removing {}", old.display()), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_like_numbers() {
        assert_eq!(checkpoint_file_name(42), "checkpoint-00000000000000000042.idx");
        assert_eq!(
            parse_checkpoint_file_name(&checkpoint_file_name(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(parse_checkpoint_file_name("checkpoint-42.idx"), None);
    }

    /// A checkpoint of two ids, "aa" (two versions) and "ab", over segment 1.
    fn two_ids() -> (Index, Vec<SegmentMark>) {
        let mut index = Index::default();
        let here = Location {
            segment: 1,
            offset: 32,
            len: 10,
            crc: 0,
        };
        for (seq, id, version) in [(1, "aa", "1"), (2, "aa", "2"), (3, "ab", "1")] {
            index.apply_put(seq, &crate::index::tests::put(id, version, 10), here);
        }
        index.seq = 3;
        let marks = vec![SegmentMark {
            number: 1,
            rewrites: 0,
            len: 1000,
        }];
        (index, marks)
    }

    fn replace(body: &mut [u8], from: &[u8], to: &[u8]) {
        let at = body
            .windows(from.len())
            .position(|w| w == from)
            .expect("pattern in the body");
        body[at..at + to.len()].copy_from_slice(to);
    }

    #[test]
    fn checkpoints_with_checksums_but_inconsistent_tables_are_refused() {
        let (index, marks) = two_ids();
        let body = encode_body(&index, &marks);
        let loaded = decode(&seal(3, &body)).expect("intact");
        assert_eq!(loaded.index.id_count(), 2);
        assert_eq!(
            loaded.index.visible("aa", 3).map(|v| v.version.version_tag),
            Some(crate::index::version_tag("2"))
        );
        assert_eq!(loaded.index.versions_of(0).count(), 2);

        let mut twice = body.clone();
        replace(&mut twice, b"\x02ab", b"\x02aa");
        let why = decode(&seal(3, &twice)).err().expect("a name listed twice");
        assert!(why.contains("listed twice"), "{why}");

        // Swap the creation seqs of aa's versions: (1, ended 2) and (2, open) become (2, 2) and (1, open).
        let mut order = body.clone();
        let first: Vec<u8> = [1u64.to_le_bytes(), 2u64.to_le_bytes()].concat();
        let second: Vec<u8> = [2u64.to_le_bytes(), u64::MAX.to_le_bytes()].concat();
        replace(&mut order, &first, &2u64.to_le_bytes());
        replace(&mut order, &second, &1u64.to_le_bytes());
        let why = decode(&seal(3, &order)).err().expect("versions out of order");
        assert!(why.contains("id's versions are out of order"), "{why}");
    }

    #[test]
    fn bodies_of_many_blocks_round_trip_and_bad_block_tables_are_refused() {
        // Two and a half blocks of bytes that compress a little.
        let body: Vec<u8> = (0..LZ4_BLOCK * 5 / 2)
            .map(|n| (n % 251) as u8 ^ (n / 4096) as u8)
            .collect();
        let file = seal(7, &body);
        let stored = &file[CHECKPOINT_HEADER_BYTES..file.len() - 4];
        assert_eq!(unseal(stored).expect("unseal"), body);
        assert_eq!(
            u32::from_le_bytes(stored[8..12].try_into().expect("4 bytes")),
            3,
            "blocks"
        );

        // A block count that does not match the body's length.
        let mut wrong = stored.to_vec();
        wrong[8] = 2;
        assert!(unseal(&wrong).expect_err("count").contains("cannot be 2 blocks"));
        // A first block that claims fewer bytes than a whole block.
        let mut short = stored.to_vec();
        short[12..16].copy_from_slice(&1000u32.to_le_bytes());
        assert!(unseal(&short).expect_err("length").contains("holds 1000 bytes"));
        // A body length far beyond what the blocks could hold is refused before any allocation.
        let mut huge = stored.to_vec();
        let claimed = (LZ4_BLOCK as u64) * 1_000_000;
        huge[0..8].copy_from_slice(&claimed.to_le_bytes());
        huge[8..12].copy_from_slice(&1_000_000u32.to_le_bytes());
        assert!(unseal(&huge).is_err());
        // Trailing bytes.
        let mut longer = stored.to_vec();
        longer.push(0);
        assert!(unseal(&longer).is_err());
    }

    #[test]
    fn damaged_checkpoints_are_refused() {
        let index = Index::default();
        let bytes = encode(
            &index,
            &[SegmentMark {
                number: 1,
                rewrites: 0,
                len: 32,
            }],
        );
        assert!(decode(&bytes).is_ok());
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&damaged).is_err(), "bit {bit}");
        }
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
