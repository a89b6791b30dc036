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
use crate::index::{Index, Interner, Location, PinInfo, VersionEntry, VersionState, NEVER_EXPIRES, SEQ_OPEN};
use crate::item::{Scope, TypeSpec};
use crate::log::record::Cursor;
use crate::log::writer::sync_dir;
use crate::storage::Storage;
use crate::store::Shared;

/// The magic bytes that open every checkpoint file.
const CHECKPOINT_MAGIC: [u8; 8] = *b"CTXLOGCP";
/// The checkpoint format version this build writes and reads.
const CHECKPOINT_VERSION: u32 = 1;
/// Bytes of the checkpoint header: magic, version, reserved, seq, body length.
const CHECKPOINT_HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8;
/// Bytes one version takes at the least (a retired one with one-byte varints), for bounding counts
/// before allocating.
const VERSION_BYTES_MIN: usize = 1 + 2 + 32 + 1 + 4;

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

/// Encodes the index, as of its sequence number, with the segments it points into.
pub(crate) fn encode(index: &Index, segments: &[SegmentMark]) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + index.slots.len() * (VERSION_BYTES_MIN + 8));
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
    put_count(&mut body, index.ids.len());
    for entry in &index.ids {
        put_u8_str(&mut body, &entry.name);
        body.extend_from_slice(&entry.deletes.to_le_bytes());
        let versions: Vec<&VersionEntry> = entry.versions.iter().filter_map(|slot| index.slot(*slot)).collect();
        put_count(&mut body, versions.len());
        for version in versions {
            encode_version(&mut body, version);
        }
    }
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_BYTES + body.len() + 4);
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&index.seq.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// State byte of a version: what is stored, and whether it expires.
const STATE_STORED: u8 = 0;
const STATE_RETIRED: u8 = 1;
const STATE_EXPIRES: u8 = 0x80;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn get_varint(c: &mut Cursor<'_>, what: &str) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = c.u8(what).map_err(|e| e.0)?;
        let low = u64::from(byte & 0x7f);
        if shift == 63 && low > 1 {
            return Err(format!("{what} overflows 64 bits"));
        }
        value |= low << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(format!("{what} is longer than 10 bytes"))
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// One version: state byte; seq_created; 0 (open) or seq_ended - seq_created + 1; hash; version;
/// segment, offset, length; generation; and for a stored version its timestamp (zigzag), its expiry
/// as a zigzag delta from the timestamp when the state byte says it expires, and its type, scope and
/// source numbers. Every integer but the hash and the state byte is a LEB128 varint.
fn encode_version(body: &mut Vec<u8>, version: &VersionEntry) {
    let stored = version.is_stored();
    let expires = stored && version.expires_at != NEVER_EXPIRES;
    body.push(if stored { STATE_STORED } else { STATE_RETIRED } | if expires { STATE_EXPIRES } else { 0 });
    put_varint(body, version.seq_created);
    put_varint(
        body,
        if version.seq_ended == SEQ_OPEN {
            0
        } else {
            version.seq_ended - version.seq_created + 1
        },
    );
    body.extend_from_slice(&version.hash);
    put_u8_str(body, &version.version);
    put_varint(body, u64::from(version.location.segment));
    put_varint(body, u64::from(version.location.offset));
    put_varint(body, u64::from(version.location.len));
    put_varint(body, u64::from(version.generation));
    if stored {
        put_varint(body, zigzag(version.timestamp));
        if expires {
            put_varint(body, zigzag(version.expires_at.wrapping_sub(version.timestamp)));
        }
        put_varint(body, u64::from(version.kind));
        put_varint(body, u64::from(version.scope));
        put_varint(body, u64::from(version.source));
    }
}

fn decode_version(
    c: &mut Cursor<'_>,
    segment_lens: &BTreeMap<u32, u64>,
    seq: u64,
    (kinds, scopes, sources): (usize, usize, usize),
) -> Result<VersionEntry, String> {
    let narrow = |value: u64, what: &str| u32::try_from(value).map_err(|_| format!("{what} out of range"));
    let state_byte = c.u8("state").map_err(|e| e.0)?;
    let state = match state_byte & !STATE_EXPIRES {
        STATE_STORED => VersionState::Stored,
        STATE_RETIRED if state_byte & STATE_EXPIRES == 0 => VersionState::Retired,
        _ => return Err(format!("unknown version state {state_byte:#04x}")),
    };
    let seq_created = get_varint(c, "seq_created")?;
    let seq_ended = match get_varint(c, "seq_ended")? {
        0 => SEQ_OPEN,
        span => seq_created.checked_add(span - 1).ok_or("seq_ended overflows")?,
    };
    let hash: [u8; 32] = c.take(32, "hash").map_err(|e| e.0)?.try_into().map_err(|_| "hash")?;
    let len = usize::from(c.u8("version length").map_err(|e| e.0)?);
    let version = get_str(c, len, "version")?;
    let location = Location {
        segment: narrow(get_varint(c, "segment")?, "segment")?,
        offset: narrow(get_varint(c, "offset")?, "offset")?,
        len: narrow(get_varint(c, "length")?, "length")?,
    };
    let generation = narrow(get_varint(c, "generation")?, "generation")?;
    let (mut timestamp, mut expires_at, mut kind, mut scope, mut source) = (0, NEVER_EXPIRES, 0u16, 0u32, 0u32);
    if state == VersionState::Stored {
        timestamp = unzigzag(get_varint(c, "timestamp")?);
        if state_byte & STATE_EXPIRES != 0 {
            expires_at = timestamp.wrapping_add(unzigzag(get_varint(c, "expiry")?));
        }
        kind = u16::try_from(get_varint(c, "type")?).map_err(|_| "type out of range")?;
        scope = narrow(get_varint(c, "scope")?, "scope")?;
        source = narrow(get_varint(c, "source")?, "source")?;
        let tables_hold = usize::from(kind) < kinds
            && usize::try_from(scope).is_ok_and(|s| s < scopes)
            && usize::try_from(source).is_ok_and(|s| s < sources);
        if !tables_hold {
            return Err("a table number is out of range".into());
        }
    }
    let fits = segment_lens
        .get(&location.segment)
        .is_some_and(|len| u64::from(location.offset) + u64::from(location.len) <= *len);
    if !fits {
        return Err("it points outside the recorded segments".into());
    }
    if seq_created > seq || (seq_ended != SEQ_OPEN && seq_ended > seq) {
        return Err("its sequence numbers are after the checkpoint".into());
    }
    Ok(VersionEntry {
        seq_created,
        seq_ended,
        timestamp,
        expires_at,
        hash,
        version: Box::from(version),
        location,
        id: 0,
        generation,
        kind,
        scope,
        source,
        state,
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
    let _reserved = c.u32("reserved").map_err(e)?;
    let seq = c.u64("seq").map_err(e)?;
    let body_len = c.u64("body length").map_err(e)?;
    if usize::try_from(body_len).ok() != Some(total - CHECKPOINT_HEADER_BYTES) {
        return Err("body length does not match the file".into());
    }
    let mut index = Index::default();
    index.seq = seq;

    let count = c.u32("segment count").map_err(e)?;
    let mut segments = Vec::with_capacity(bounded(count, 16, &c, total, "segment")?);
    for _ in 0..count {
        let number = c.u32("segment number").map_err(e)?;
        let rewrites = c.u32("rewrites").map_err(e)?;
        let len = c.u64("segment length").map_err(e)?;
        segments.push(SegmentMark { number, rewrites, len });
    }
    let count = c.u32("type count").map_err(e)?;
    for _ in 0..bounded(count, 2, &c, total, "type")? {
        let len = usize::from(c.u8("type length").map_err(e)?);
        let name = get_str(&mut c, len, "type")?;
        let mut spec = TypeSpec::new(name);
        if c.u8("pattern flag").map_err(e)? == 1 {
            let len = usize::from(c.u16("pattern length").map_err(e)?);
            spec = spec.id_pattern(get_str(&mut c, len, "pattern")?);
        }
        index
            .registry
            .insert(spec)
            .map_err(|e| format!("stored type is invalid: {e}"))?;
    }
    let count = c.u32("pin count").map_err(e)?;
    for _ in 0..bounded(count, 18, &c, total, "pin")? {
        let len = usize::from(c.u8("name length").map_err(e)?);
        let name = get_str(&mut c, len, "pin name")?.to_owned();
        let pin_seq = c.u64("pin seq").map_err(e)?;
        let taken_at = c.i64("taken_at").map_err(e)?;
        let len = usize::from(c.u8("session length").map_err(e)?);
        let session = get_str(&mut c, len, "session")?;
        let session = (!session.is_empty()).then(|| Arc::from(session));
        index.pins.insert(
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
    let segment_lens: BTreeMap<u32, u64> = segments.iter().map(|m| (m.number, m.len)).collect();
    let count = c.u32("id count").map_err(e)?;
    let count = bounded(count, 9, &c, total, "id")?;
    index.reserve(count);
    for _ in 0..count {
        let len = usize::from(c.u8("id length").map_err(e)?);
        let name = get_str(&mut c, len, "id")?;
        let deletes = c.u32("deletes").map_err(e)?;
        let versions = c.u32("version count").map_err(e)?;
        let versions = bounded(versions, VERSION_BYTES_MIN, &c, total, "version")?;
        if versions == 0 {
            index.restore_id(name, deletes);
        }
        for _ in 0..versions {
            let entry = decode_version(&mut c, &segment_lens, seq, (kinds.len(), scopes.len(), sources.len()))
                .map_err(|reason| format!("a version of {name:?}: {reason}"))?;
            index.restore_version(name, deletes, entry);
        }
    }
    if !c.is_empty() {
        return Err("bytes after the last id".into());
    }
    index.set_tables(kinds, scopes, sources);
    index.rebuild_sets();
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
        (index.seq, encode(&index, &marks))
    };
    if sync_log {
        shared.flush()?;
    }
    install(&*shared.storage, &shared.dir, seq, &bytes)?;
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
