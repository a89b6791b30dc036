//! Decoding a checkpoint: its checksum and header checked, its tables read in file order (segments,
//! types, pins, interned values, id names, versions, ordered sets), each count bounded by the bytes
//! left, and the index rebuilt from them ([`super::versions`] decodes the version rows).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::index::{IdTable, Index, Interner, KeySet, NameArena, PinInfo};
use crate::item::{Scope, TypeRegistry, TypeSpec};
use crate::limits::{SCOPES_MAX, SOURCES_MAX, TYPES_MAX};
use crate::log::record::{Cursor, DecodeError};
use crate::num::usize_from_u32;

use super::versions::{assemble, derive_sets, join, le_u32, Bounds, VersionRows};
use super::{Loaded, SegmentMark, CHECKPOINT_HEADER_BYTES, CHECKPOINT_MAGIC, CHECKPOINT_VERSION, VERSION_BYTES};

/// The interned types, scopes and sources, in their numbers' order.
type Tables = (Interner<Box<str>>, Interner<Scope>, Interner<Box<str>>);

/// What a cursor's error says.
#[inline]
fn reason(e: DecodeError) -> String {
    e.0
}

/// Checks that `count` items of at least `each` bytes fit in what is left.
fn bounded(count: u32, each: usize, cursor: &Cursor<'_>, total: usize, what: &str) -> Result<usize, String> {
    let count = usize_from_u32(count);
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

/// A u32 count and that many u32 numbers.
fn read_u32s(c: &mut Cursor<'_>, total: usize, what: &str) -> Result<Vec<u32>, String> {
    let count = c.u32(what).map_err(|e| e.0)?;
    let count = bounded(count, 4, c, total, what)?;
    let bytes = c.take(count * 4, what).map_err(|e| e.0)?;
    Ok(bytes.chunks_exact(4).map(|raw| le_u32(raw, 0)).collect())
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
    let (seq, committed_at, body) = open(bytes)?;
    let total = body.len();
    let mut c = Cursor::new(body);
    let segments = read_segments(&mut c, total)?;
    let registry = read_types(&mut c, total)?;
    let pins = read_pins(&mut c, total)?;
    let tables = read_tables(&mut c, total)?;
    let names = read_names(&mut c, total)?;
    let versions = read_versions(&mut c, total)?;
    if !c.is_empty() {
        return Err("bytes after the last table".into());
    }
    let (kinds, scopes, _) = &tables;
    if versions.type_sizes.len() != kinds.len() || versions.scope_sizes.len() != scopes.len() {
        return Err("the set sizes do not match the type and scope tables".into());
    }
    let mut index = build_index(seq, &segments, names, versions, tables)?;
    index.registry = registry;
    index.pins = pins;
    index.committed_at = committed_at;
    Ok(Loaded { seq, segments, index })
}

/// The checkpoint's sequence number, the commit time of its batch, and its body, once its checksum,
/// magic, format version, flags and body length are checked.
fn open(bytes: &[u8]) -> Result<(u64, i64, &[u8]), String> {
    let crc_at = bytes.len().checked_sub(4).ok_or("shorter than its checksum")?;
    let (covered, stored_crc) = bytes.split_at(crc_at);
    let stored_crc = u32::from_le_bytes(stored_crc.try_into().map_err(|_| "checksum")?);
    if crc32fast::hash(covered) != stored_crc {
        return Err("checksum mismatch".into());
    }
    let total = covered.len();
    let mut c = Cursor::new(covered);
    if c.take(8, "magic").map_err(reason)? != CHECKPOINT_MAGIC {
        return Err("not a ctxlog checkpoint (bad magic)".into());
    }
    let version = c.u32("version").map_err(reason)?;
    if version != CHECKPOINT_VERSION {
        return Err(format!(
            "checkpoint format version {version} is not supported (this build reads {CHECKPOINT_VERSION})"
        ));
    }
    let flags = c.u32("flags").map_err(reason)?;
    if flags != 0 {
        return Err(format!("unknown checkpoint flags {flags:#x}"));
    }
    let seq = c.u64("seq").map_err(reason)?;
    let committed_at = c.i64("committed_at").map_err(reason)?;
    let body_len = c.u64("body length").map_err(reason)?;
    if usize::try_from(body_len).ok() != Some(total - CHECKPOINT_HEADER_BYTES) {
        return Err("body length does not match the file".into());
    }
    let body = covered.get(CHECKPOINT_HEADER_BYTES..).unwrap_or_default();
    Ok((seq, committed_at, body))
}

/// The segment files the checkpoint was taken over.
fn read_segments(c: &mut Cursor<'_>, total: usize) -> Result<Vec<SegmentMark>, String> {
    let count = c.u32("segment count").map_err(reason)?;
    let mut segments = Vec::with_capacity(bounded(count, 16, c, total, "segment")?);
    for _ in 0..count {
        let number = c.u32("segment number").map_err(reason)?;
        let rewrites = c.u32("rewrites").map_err(reason)?;
        let len = c.u64("segment length").map_err(reason)?;
        segments.push(SegmentMark { number, rewrites, len });
    }
    Ok(segments)
}

/// The registered types.
fn read_types(c: &mut Cursor<'_>, total: usize) -> Result<TypeRegistry, String> {
    let mut registry = TypeRegistry::default();
    let count = c.u32("type count").map_err(reason)?;
    for _ in 0..bounded(count, 2, c, total, "type")? {
        let len = usize::from(c.u8("type length").map_err(reason)?);
        let name = get_str(c, len, "type")?;
        let mut spec = TypeSpec::new(name);
        if c.u8("pattern flag").map_err(reason)? == 1 {
            let len = usize::from(c.u16("pattern length").map_err(reason)?);
            spec = spec.id_pattern(get_str(c, len, "pattern")?);
        }
        registry
            .insert(spec)
            .map_err(|e| format!("stored type is invalid: {e}"))?;
    }
    Ok(registry)
}

/// The pinned snapshots, by name.
fn read_pins(c: &mut Cursor<'_>, total: usize) -> Result<BTreeMap<String, PinInfo>, String> {
    let mut pins = BTreeMap::new();
    let count = c.u32("pin count").map_err(reason)?;
    for _ in 0..bounded(count, 18, c, total, "pin")? {
        let len = usize::from(c.u8("name length").map_err(reason)?);
        let name = get_str(c, len, "pin name")?.to_owned();
        let pin_seq = c.u64("pin seq").map_err(reason)?;
        let taken_at = c.i64("taken_at").map_err(reason)?;
        let len = usize::from(c.u8("session length").map_err(reason)?);
        let session = get_str(c, len, "session")?;
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
    Ok(pins)
}

/// A table's count, refused past `limit`.
fn within(count: u32, limit: usize, what: &str) -> Result<u32, String> {
    if usize_from_u32(count) > limit {
        return Err(format!("{count} {what}, more than the {limit} a store holds"));
    }
    Ok(count)
}

/// The interned types, scopes and sources the version rows number.
fn read_tables(c: &mut Cursor<'_>, total: usize) -> Result<Tables, String> {
    let count = within(c.u32("type table count").map_err(reason)?, TYPES_MAX, "types")?;
    let mut kinds = Interner::default();
    for _ in 0..bounded(count, 1, c, total, "type table")? {
        let len = usize::from(c.u8("type length").map_err(reason)?);
        kinds.intern(&Box::from(get_str(c, len, "type")?));
    }
    let count = within(c.u32("scope count").map_err(reason)?, SCOPES_MAX, "scopes")?;
    let mut scopes = Interner::default();
    for _ in 0..bounded(count, 1, c, total, "scope")? {
        let scope = match c.u8("scope tag").map_err(reason)? {
            0 => {
                let len = usize::from(c.u8("session length").map_err(reason)?);
                Scope::Session(get_str(c, len, "session")?.to_owned())
            }
            1 => Scope::GlobalReadonly,
            2 => Scope::GlobalWritable,
            other => return Err(format!("unknown scope tag {other}")),
        };
        scopes.intern(&scope);
    }
    let count = within(c.u32("source count").map_err(reason)?, SOURCES_MAX, "sources")?;
    let mut sources = Interner::default();
    for _ in 0..bounded(count, 2, c, total, "source")? {
        let len = usize::from(c.u16("source length").map_err(reason)?);
        sources.intern(&Box::from(get_str(c, len, "source")?));
    }
    Ok((kinds, scopes, sources))
}

/// The id names, front-coded as the name arena holds them (see [`NameArena`]), and the delete
/// counts of the ids that have any.
struct Names<'a> {
    /// How many ids there are.
    count: usize,
    /// The shared and stored lengths of each id's name.
    parts: &'a [[u8; 2]],
    /// The chunks of stored name parts.
    chunks: Vec<&'a [u8]>,
    /// (id number, deletes).
    deletes: Vec<(u32, u32)>,
}

fn read_names<'a>(c: &mut Cursor<'a>, total: usize) -> Result<Names<'a>, String> {
    let count = c.u32("id count").map_err(reason)?;
    let id_count = bounded(count, 2, c, total, "id")?;
    let (parts, _) = c.take(id_count * 2, "id name parts").map_err(reason)?.as_chunks::<2>();
    let count = c.u32("name chunk count").map_err(reason)?;
    let mut chunks = Vec::with_capacity(bounded(count, 4, c, total, "name chunk")?);
    for _ in 0..count {
        let len = usize_from_u32(c.u32("name chunk length").map_err(reason)?);
        chunks.push(c.take(len, "name chunk").map_err(reason)?);
    }
    let count = c.u32("deleted id count").map_err(reason)?;
    let count = bounded(count, 8, c, total, "deleted id")?;
    let mut deletes = Vec::with_capacity(count);
    for _ in 0..count {
        let id = c.u32("deleted id").map_err(reason)?;
        let times = c.u32("deletes").map_err(reason)?;
        if usize_from_u32(id) >= id_count {
            return Err(format!("deleted id number {id} is out of range"));
        }
        deletes.push((id, times));
    }
    Ok(Names {
        count: id_count,
        parts,
        chunks,
        deletes,
    })
}

/// The version table, its rows still undecoded, and the ordered sets: the time set in full, the
/// type and scope sets by their sizes.
struct Versions<'a> {
    /// How many rows there are.
    count: usize,
    rows: &'a [u8],
    time: Vec<u32>,
    type_sizes: Vec<u32>,
    scope_sizes: Vec<u32>,
}

fn read_versions<'a>(c: &mut Cursor<'a>, total: usize) -> Result<Versions<'a>, String> {
    let count = c.u32("version count").map_err(reason)?;
    let count = bounded(count, VERSION_BYTES, c, total, "version")?;
    let rows = c.take(count * VERSION_BYTES, "versions").map_err(reason)?;
    let time = read_u32s(c, total, "time set")?;
    let type_sizes = read_u32s(c, total, "type set sizes")?;
    let scope_sizes = read_u32s(c, total, "scope set sizes")?;
    Ok(Versions {
        count,
        rows,
        time,
        type_sizes,
        scope_sizes,
    })
}

/// The index from the checkpoint's tables: the id table built and the version rows decoded (on two
/// threads), the ordered sets derived, each checked against the others and against the segments.
fn build_index(
    seq: u64,
    segments: &[SegmentMark],
    names: Names<'_>,
    versions: Versions<'_>,
    tables: Tables,
) -> Result<Index, String> {
    let mut segment_lens: Vec<(u32, u64)> = segments.iter().map(|m| (m.number, m.len)).collect();
    segment_lens.sort_unstable();
    let (kinds, scopes, sources) = &tables;
    let rows = VersionRows {
        rows: versions.rows,
        next: std::sync::atomic::AtomicUsize::new(0),
        bounds: Bounds {
            seq,
            ids: names.count,
            segment_lens: &segment_lens,
            tables: (kinds.len(), scopes.len(), sources.len()),
        },
    };
    let text = IdTable::name_chunks_as_text(&names.chunks)?;
    let parts = names.parts;
    // One thread builds the id table (reading the names in the mapped file), then helps with the
    // versions; the other copies the names and decodes versions.
    let (ids_and_versions, (arena, versions_here)) = join(
        || {
            let ids = IdTable::from_name_parts(&text, parts);
            (ids, rows.decode_chunks())
        },
        || (NameArena::from_parts(&text, parts), rows.decode_chunks()),
    );
    let (ids, versions_there) = ids_and_versions.ok_or("the id table was not built")?;
    let (slots, rare, stored) = assemble(versions_here?, versions_there?)?;
    if slots.len() != versions.count {
        return Err("the version table was not decoded whole".into());
    }
    if versions.time.len() != stored {
        return Err("the time set does not list every stored version".into());
    }
    let (by_type, by_scope) = derive_sets(&versions.time, &slots, &versions.type_sizes, &versions.scope_sizes)?;
    let sets = (by_type, by_scope, KeySet::from_sorted(versions.time));
    let mut ids = ids?.with_names(arena);
    for (id, times) in names.deletes {
        ids.set_deletes(id, times)?;
    }
    Index::from_checkpoint(seq, ids, slots, rare, sets, tables)
}
