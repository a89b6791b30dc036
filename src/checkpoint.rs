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
    IdTable, Index, Interner, KeySet, Location, NameArena, PinInfo, Rare, VersionEntry, VersionState, VersionTable,
    CHUNK, NO_SLOT, SEQ_OPEN,
};
use crate::item::{Scope, TypeSpec};
use crate::log::record::Cursor;
use crate::storage::{append_prepared, sync_dir, Allocation, Storage, StorageFile};
use crate::store::Shared;

/// The magic bytes that open every checkpoint file.
const CHECKPOINT_MAGIC: [u8; 8] = *b"CTXLOGCP";
/// The checkpoint format version this build writes and reads.
const CHECKPOINT_VERSION: u32 = 6;
/// Bytes of the checkpoint header: magic, version, reserved, seq, body length.
const CHECKPOINT_HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8;
/// Bytes of one version in the version table.
const VERSION_BYTES: usize = 72;

/// The file name of a checkpoint as of `seq`; the digits sort like the numbers.
pub(crate) fn checkpoint_file_name(seq: u64) -> String {
    format!("checkpoint-{seq:020}.idx")
}

/// The temporary file a checkpoint as of `seq` is written to before it is renamed into place.
fn checkpoint_tmp_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{}.tmp", checkpoint_file_name(seq)))
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

/// Where an encoded checkpoint body goes: a buffer ([`Vec`]), a byte counter ([`Count`]), or a file
/// in bounded steps ([`Stream`]). The method names are `Vec`'s, so the encoder reads as if it wrote
/// into one.
trait Sink {
    fn extend_from_slice(&mut self, bytes: &[u8]);
    fn push(&mut self, byte: u8) {
        self.extend_from_slice(&[byte]);
    }
    /// Bytes put so far.
    fn position(&self) -> u64;
    /// Writes `bytes` over those put at `at`, which a [`Stream`] can do only while they are still
    /// in its buffer.
    fn patch(&mut self, at: u64, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
    fn push(&mut self, byte: u8) {
        Vec::push(self, byte);
    }
    fn position(&self) -> u64 {
        self.len() as u64
    }
    fn patch(&mut self, at: u64, bytes: &[u8]) {
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        if let Some(slot) = self.get_mut(at..at.saturating_add(bytes.len())) {
            slot.copy_from_slice(bytes);
        }
    }
}

/// Counts the bytes of a body without keeping them: the length a streamed checkpoint's header
/// needs before its body is written.
#[derive(Default)]
struct Count(u64);

impl Sink for Count {
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0 += bytes.len() as u64;
    }
    fn position(&self) -> u64 {
        self.0
    }
    fn patch(&mut self, _at: u64, _bytes: &[u8]) {}
}

fn put_u8_str(out: &mut impl Sink, s: &str) {
    out.push(u8::try_from(s.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(s.as_bytes());
}

fn put_u16_str(out: &mut impl Sink, s: &str) {
    out.extend_from_slice(&u16::try_from(s.len()).unwrap_or(u16::MAX).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_count(out: &mut impl Sink, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

/// How long a checkpoint waits for a group applied to the index during its fsync to be published.
const UNPUBLISHED_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// State byte of a version in the version table.
const STATE_STORED: u8 = 0;
const STATE_RETIRED: u8 = 1;

/// Encodes the index, as of its sequence number, with the segments it points into.
#[cfg(test)]
pub(crate) fn encode(index: &Index, segments: &[SegmentMark]) -> Vec<u8> {
    seal(index.seq, &encode_body(index, segments))
}

/// Bytes the body of a checkpoint of `index` needs, about: a row and a time set entry per version,
/// and about 16 per id for its front-coded name (two length bytes and the part stored).
fn body_capacity(index: &Index) -> usize {
    64 + index.slots.len() * (VERSION_BYTES + 4) + index.id_count() * 16
}

/// The uncompressed body of a checkpoint of `index` (see [`encode_body_into`]).
#[cfg(test)]
fn encode_body(index: &Index, segments: &[SegmentMark]) -> Vec<u8> {
    let mut body = Vec::with_capacity(body_capacity(index));
    encode_body_into(&mut body, index, segments, None);
    body
}

/// The uncompressed body of a checkpoint of `index`: the part that needs the index (and its lock).
/// The number of versions kept (not forgotten) comes before their rows: given as `kept_known`, it
/// is written as it is; otherwise it is counted along the rows and patched in, which a sink that
/// has written the rows on already (a [`Stream`]) cannot take. Returns the number counted.
fn encode_body_into(body: &mut impl Sink, index: &Index, segments: &[SegmentMark], kept_known: Option<u32>) -> u32 {
    put_count(body, segments.len());
    for mark in segments {
        body.extend_from_slice(&mark.number.to_le_bytes());
        body.extend_from_slice(&mark.rewrites.to_le_bytes());
        body.extend_from_slice(&mark.len.to_le_bytes());
    }
    let types = index.registry.custom();
    put_count(body, types.len());
    for spec in &types {
        put_u8_str(body, spec.name());
        match spec.pattern() {
            Some(pattern) => {
                body.push(1);
                put_u16_str(body, pattern);
            }
            None => body.push(0),
        }
    }
    put_count(body, index.pins.len());
    for (name, pin) in &index.pins {
        put_u8_str(body, name);
        body.extend_from_slice(&pin.seq.to_le_bytes());
        body.extend_from_slice(&pin.taken_at.to_le_bytes());
        put_u8_str(body, pin.session.as_deref().unwrap_or(""));
    }
    put_count(body, index.kinds.len());
    for kind in index.kinds.values() {
        put_u8_str(body, kind);
    }
    put_count(body, index.scopes.len());
    for scope in index.scopes.values() {
        match scope {
            Scope::Session(id) => {
                body.push(0);
                put_u8_str(body, id);
            }
            Scope::GlobalReadonly => body.push(1),
            Scope::GlobalWritable => body.push(2),
        }
    }
    put_count(body, index.sources.len());
    for source in index.sources.values() {
        put_u16_str(body, source);
    }
    put_count(body, index.id_count());
    put_names(body, index);
    let mut deleted = index.deleted_ids();
    deleted.sort_unstable();
    put_count(body, deleted.len());
    for (id, deletes) in deleted {
        body.extend_from_slice(&id.to_le_bytes());
        body.extend_from_slice(&deletes.to_le_bytes());
    }
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
            if let Some(count) = per_scope.get_mut(usize::try_from(version.scope).unwrap_or(usize::MAX)) {
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
    put_count(body, slots.len());
    for slot in slots {
        let number = renumber.get(usize::try_from(slot).unwrap_or(usize::MAX)).copied();
        body.extend_from_slice(&number.unwrap_or(NO_SLOT).to_le_bytes());
    }
    for counts in [per_type, per_scope] {
        put_count(body, counts.len());
        for count in counts {
            body.extend_from_slice(&count.to_le_bytes());
        }
    }
    kept
}

/// The id names as the name arena holds them (front-coded, see [`NameArena`]): the shared and
/// stored lengths of each id's name, then the chunks of stored parts (each at most
/// [`crate::index::NAME_CHUNK`] bytes), copied whole.
fn put_names(body: &mut impl Sink, index: &Index) {
    let (parts, chunks) = index.name_arena().parts_and_chunks();
    for part in parts {
        body.extend_from_slice(part);
    }
    put_count(body, chunks.len());
    for chunk in chunks {
        put_count(body, chunk.len());
        body.extend_from_slice(chunk.as_bytes());
    }
}

/// The checkpoint file for `seq` around `body`: header, body, CRC. Needs no lock.
#[cfg(test)]
fn seal(seq: u64, body: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(CHECKPOINT_HEADER_BYTES + body.len() + 4);
    file.extend_from_slice(&[0; CHECKPOINT_HEADER_BYTES]);
    file.extend_from_slice(body);
    seal_in_place(seq, &mut file);
    file
}

/// Turns `file`, a header's worth of space followed by a body, into the checkpoint file for `seq`:
/// fills in the header and appends the CRC. Needs no lock, and copies nothing.
fn seal_in_place(seq: u64, file: &mut Vec<u8>) {
    let header = header(seq, file.len().saturating_sub(CHECKPOINT_HEADER_BYTES) as u64);
    if let Some(slot) = file.get_mut(..CHECKPOINT_HEADER_BYTES) {
        slot.copy_from_slice(&header);
    }
    let crc = crc32fast::hash(file);
    file.extend_from_slice(&crc.to_le_bytes());
}

/// The header of the checkpoint for `seq` whose body is `body_len` bytes.
fn header(seq: u64, body_len: u64) -> [u8; CHECKPOINT_HEADER_BYTES] {
    let mut header = [0u8; CHECKPOINT_HEADER_BYTES];
    for (at, field) in [
        (0, &CHECKPOINT_MAGIC[..]),
        (8, &CHECKPOINT_VERSION.to_le_bytes()[..]),
        (12, &0u32.to_le_bytes()[..]),
        (16, &seq.to_le_bytes()[..]),
        (24, &body_len.to_le_bytes()[..]),
    ] {
        if let Some(slot) = header.get_mut(at..at + field.len()) {
            slot.copy_from_slice(field);
        }
    }
    header
}

/// Bytes a streamed checkpoint gathers before each write to its file.
const STREAM_STEP: usize = 1 << 20;

/// A checkpoint on its way to its file in steps of about `step` bytes, with the CRC of all it
/// wrote. The first failed write is kept, and nothing is written after it.
struct Stream<'a> {
    file: &'a mut dyn StorageFile,
    step: usize,
    buffer: Vec<u8>,
    crc: crc32fast::Hasher,
    written: u64,
    /// The longest write so far: about `step`, the bound on the stream's memory.
    largest: usize,
    failed: Option<std::io::Error>,
}

impl Stream<'_> {
    fn flush(&mut self) {
        if self.failed.is_none() && !self.buffer.is_empty() {
            self.crc.update(&self.buffer);
            match self.file.append(&self.buffer) {
                Ok(()) => {
                    self.written += self.buffer.len() as u64;
                    self.largest = self.largest.max(self.buffer.len());
                }
                Err(e) => self.failed = Some(e),
            }
        }
        self.buffer.clear();
    }
}

impl Sink for Stream<'_> {
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= self.step {
            self.flush();
        }
    }
    fn position(&self) -> u64 {
        self.written + self.buffer.len() as u64
    }
    fn patch(&mut self, at: u64, bytes: &[u8]) {
        let slot = at
            .checked_sub(self.written)
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| self.buffer.get_mut(at..at.saturating_add(bytes.len())));
        match slot {
            Some(slot) => slot.copy_from_slice(bytes),
            None if self.failed.is_none() => {
                self.failed = Some(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bytes at {at} patched after they were written"),
                ));
            }
            None => {}
        }
    }
}

/// Writes the checkpoint of `index` over `segments` to a new file at `tmp`, synced, in steps of
/// `step` bytes: the same bytes as [`encode`] without a buffer of the checkpoint's size (tens of
/// megabytes for a store of a few hundred thousand items). The body is encoded twice, first only
/// to count its bytes, which the header gives before it. Returns the file's length and its longest
/// write.
fn stream(
    storage: &dyn Storage,
    tmp: &Path,
    index: &Index,
    segments: &[SegmentMark],
    step: usize,
) -> Result<(u64, usize)> {
    let writing = |e| Error::io(format!("writing {}", tmp.display()), e);
    let mut count = Count::default();
    let kept = encode_body_into(&mut count, index, segments, None);
    let body_end = CHECKPOINT_HEADER_BYTES as u64 + count.0;
    let mut file = storage
        .create(tmp)
        .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
    file.allocate(body_end + 4, Allocation::Reserved).map_err(writing)?;
    file.prepare(0, body_end + 4);
    let mut stream = Stream {
        file: file.as_mut(),
        step,
        buffer: Vec::with_capacity(step + VERSION_BYTES),
        crc: crc32fast::Hasher::new(),
        written: 0,
        largest: 0,
        failed: None,
    };
    stream.extend_from_slice(&header(index.seq, count.0));
    let rows = encode_body_into(&mut stream, index, segments, Some(kept));
    stream.flush();
    let (written, largest, crc) = (stream.written, stream.largest, stream.crc.clone().finalize());
    if let Some(e) = stream.failed.take() {
        return Err(writing(e));
    }
    if written != body_end || rows != kept {
        return Err(writing(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the body came to {written} bytes and {rows} versions where counting it gave {body_end} and {kept}"
            ),
        )));
    }
    file.append(&crc.to_le_bytes()).map_err(writing)?;
    file.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", tmp.display()), e))?;
    Ok((body_end + 4, largest))
}

/// One version, 72 bytes: seq_created u64, seq_ended u64 (u64::MAX while open), timestamp i64,
/// expires_at i64 (i64::MAX for never), segment, offset, length, id, generation, version tag (16
/// bits, the high half zero), scope, source (u32 each), type u16, state u8, a zero byte, and the
/// record's body CRC (u32).
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

#[inline]
fn le_u64(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

#[inline]
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
    /// (number, length) of each recorded segment, by number.
    segment_lens: &'a [(u32, u64)],
    tables: (usize, usize, usize),
}

/// Decodes one row of the version table, and its expiry and generation if they do not fit in the
/// entry (for the index's overflow table). `segment` is the (number, length) of the segment the
/// previous row pointed into: rows mostly point into the same segment as the row before.
fn decode_version(
    bytes: &[u8; VERSION_BYTES],
    bounds: &Bounds<'_>,
    segment: &mut (u32, u64),
) -> Result<(VersionEntry, Option<Rare>), String> {
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
    if !(0..=crate::limits::TIMESTAMP_MAX).contains(&timestamp) {
        return Err(format!("timestamp {timestamp} is out of range"));
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
    if segment.0 != location.segment {
        *segment = bounds
            .segment_lens
            .binary_search_by_key(&location.segment, |(number, _)| *number)
            .ok()
            .and_then(|at| bounds.segment_lens.get(at))
            .map_or((location.segment, 0), |known| *known);
    }
    let fits = u64::from(location.offset) + u64::from(location.len) <= segment.1;
    if !fits {
        return Err("it points outside the recorded segments".into());
    }
    if seq_created > bounds.seq || (seq_ended != SEQ_OPEN && (seq_ended > bounds.seq || seq_ended < seq_created)) {
        return Err("its sequence numbers are after the checkpoint or out of order".into());
    }
    let mut version = VersionEntry::default().with_meta(timestamp, kind, state);
    version.seq_created = seq_created;
    version.location = location;
    version.id = id;
    version.scope = scope;
    let Ok(version_tag) = u16::try_from(version_tag) else {
        return Err(format!("version tag {version_tag:#x} is over 16 bits"));
    };
    version = version.with_tag(version_tag);
    let rare = version.set_rare_inline(Rare {
        expires_at,
        seq_ended,
        generation,
        source,
    });
    Ok((version, rare))
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

/// Runs `first` on another thread (on this one when no thread can be started) while this one runs
/// `second`. `first`'s result is always there unless its thread panicked, which is passed on.
fn join<A: Send, B>(first: impl FnOnce() -> A + Send, second: impl FnOnce() -> B) -> (Option<A>, B) {
    let first = std::sync::Mutex::new(Some(first));
    let take = || first.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    std::thread::scope(|scope| {
        let other = std::thread::Builder::new()
            .name("ctxlog-checkpoint".into())
            .spawn_scoped(scope, || take().map(|work| work()));
        let b = second();
        let a = match other {
            Ok(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => None,
        };
        // The other thread did not start (or found nothing to do): the work is done here.
        let a = a.or_else(|| take().map(|work| work()));
        (a, b)
    })
}

/// Version table rows decoded by the two threads, a chunk of the index at a time: whichever thread
/// is free takes the next chunk.
struct VersionRows<'a> {
    rows: &'a [u8],
    next: std::sync::atomic::AtomicUsize,
    bounds: Bounds<'a>,
}

/// A decoded chunk of the version table: its number, its versions, how many of them are stored,
/// and the expiries and generations that go to the overflow table (by position in the chunk).
struct DecodedChunk {
    number: usize,
    versions: VersionTable,
    stored: usize,
    rare: Vec<(usize, Rare)>,
}

type DecodedChunks = Vec<DecodedChunk>;

impl VersionRows<'_> {
    fn decode_chunks(&self) -> Result<DecodedChunks, String> {
        let mut done = Vec::new();
        loop {
            let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(rows) = self.rows.chunks(CHUNK * VERSION_BYTES).nth(number) else {
                return Ok(done);
            };
            let mut chunk = VersionTable::default();
            let mut stored = 0;
            let mut rare = Vec::new();
            // A segment number no row can have, so that the first row looks its segment up.
            let mut segment = (u32::MAX, 0);
            for raw in rows.chunks_exact(VERSION_BYTES) {
                let Ok(raw) = <&[u8; VERSION_BYTES]>::try_from(raw) else {
                    break;
                };
                let (version, overflow) = decode_version(raw, &self.bounds, &mut segment)
                    .map_err(|reason| format!("version {}: {reason}", number * CHUNK + chunk.len()))?;
                stored += usize::from(version.is_stored());
                if let Some(overflow) = overflow {
                    rare.push((chunk.len(), overflow));
                }
                chunk.push(&version);
            }
            done.push(DecodedChunk {
                number,
                versions: chunk,
                stored,
                rare,
            });
        }
    }
}

/// The type and scope sets from the time set (slot numbers sorted by (timestamp, slot)) and their
/// sizes: they hold the same slots in the same order. The time set must list only stored versions,
/// strictly in order, and the sizes must match.
fn derive_sets(
    time: &[u32],
    slots: &VersionTable,
    type_sizes: &[u32],
    scope_sizes: &[u32],
) -> Result<(Vec<KeySet>, Vec<KeySet>), String> {
    for (sizes, what) in [(type_sizes, "type"), (scope_sizes, "scope")] {
        if sizes.iter().map(|n| *n as usize).sum::<usize>() != time.len() {
            return Err(format!("the {what} set sizes do not add up to the time set's"));
        }
    }
    let stored = |slot: u32| slots.set_keys(usize::try_from(slot).unwrap_or(usize::MAX));
    // Each set is allocated for the size it announces (the sizes add up to the time set's, which
    // the file's length bounds) and may not go beyond it; as every slot of the time set goes to one
    // set of each kind, every set then ends up exactly full.
    let fill = |sizes: &[u32], pick: &dyn Fn((i64, u16, u32)) -> usize, what: &str| {
        let mut sets: Vec<(Vec<u32>, usize)> = sizes
            .iter()
            .map(|n| (Vec::with_capacity(*n as usize), *n as usize))
            .collect();
        for slot in time {
            if let Some(keys) = stored(*slot) {
                let (set, _) = sets
                    .get_mut(pick(keys))
                    .filter(|(set, size)| set.len() < *size)
                    .ok_or_else(|| format!("a {what} set holds more slots than its size"))?;
                set.push(*slot);
            }
        }
        Ok::<_, String>(
            sets.into_iter()
                .map(|(set, _)| KeySet::from_sorted(set))
                .collect::<Vec<KeySet>>(),
        )
    };
    let (by_scope, by_type) = join(
        || {
            fill(
                scope_sizes,
                &|(_, _, scope)| usize::try_from(scope).unwrap_or(usize::MAX),
                "scope",
            )
        },
        || {
            let mut last: Option<(i64, u32)> = None;
            for slot in time {
                let (timestamp, _, _) =
                    stored(*slot).ok_or_else(|| format!("the time set lists slot {slot}, which is not stored"))?;
                let key = (timestamp, *slot);
                if last.is_some_and(|last| last >= key) {
                    return Err("the time set is not in order".to_string());
                }
                last = Some(key);
            }
            fill(type_sizes, &|(_, kind, _)| usize::from(kind), "type")
        },
    );
    let by_type = by_type?;
    let by_scope = by_scope.ok_or("the scope sets were not built")??;
    Ok((by_type, by_scope))
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
    if flags != 0 {
        return Err(format!("unknown checkpoint flags {flags:#x}"));
    }
    let seq = c.u64("seq").map_err(e)?;
    let body_len = c.u64("body length").map_err(e)?;
    if usize::try_from(body_len).ok() != Some(total - CHECKPOINT_HEADER_BYTES) {
        return Err("body length does not match the file".into());
    }
    let body = covered.get(CHECKPOINT_HEADER_BYTES..).unwrap_or_default();
    let total = body.len();
    let mut c = Cursor::new(body);

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
    let id_count = bounded(count, 2, &c, total, "id")?;
    let (parts, _) = c.take(id_count * 2, "id name parts").map_err(e)?.as_chunks::<2>();
    let count = c.u32("name chunk count").map_err(e)?;
    let mut chunks = Vec::with_capacity(bounded(count, 4, &c, total, "name chunk")?);
    for _ in 0..count {
        let len = usize::try_from(c.u32("name chunk length").map_err(e)?).unwrap_or(usize::MAX);
        chunks.push(c.take(len, "name chunk").map_err(e)?);
    }
    let count = c.u32("deleted id count").map_err(e)?;
    let count = bounded(count, 8, &c, total, "deleted id")?;
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
    let count = bounded(count, VERSION_BYTES, &c, total, "version")?;
    let rows = c.take(count * VERSION_BYTES, "versions").map_err(e)?;
    let time = read_u32s(&mut c, total, "time set")?;
    let type_sizes = read_u32s(&mut c, total, "type set sizes")?;
    let scope_sizes = read_u32s(&mut c, total, "scope set sizes")?;
    if !c.is_empty() {
        return Err("bytes after the last table".into());
    }
    if type_sizes.len() != kinds.len() || scope_sizes.len() != scopes.len() {
        return Err("the set sizes do not match the type and scope tables".into());
    }
    let mut segment_lens: Vec<(u32, u64)> = segments.iter().map(|m| (m.number, m.len)).collect();
    segment_lens.sort_unstable();
    let versions = VersionRows {
        rows,
        next: std::sync::atomic::AtomicUsize::new(0),
        bounds: Bounds {
            seq,
            ids: id_count,
            segment_lens: &segment_lens,
            tables: (kinds.len(), scopes.len(), sources.len()),
        },
    };
    let names = IdTable::name_chunks_as_text(&chunks)?;
    // One thread builds the id table (reading the names in the mapped file), then helps with the
    // versions; the other copies the names and decodes versions.
    let (ids_and_versions, (arena, versions_here)) = join(
        || {
            let ids = IdTable::from_name_parts(&names, parts);
            (ids, versions.decode_chunks())
        },
        || (NameArena::from_parts(&names, parts), versions.decode_chunks()),
    );
    let (ids, versions_there) = ids_and_versions.ok_or("the id table was not built")?;
    let mut decoded = versions_here?;
    decoded.extend(versions_there?);
    decoded.sort_unstable_by_key(|chunk| chunk.number);
    let stored: usize = decoded.iter().map(|chunk| chunk.stored).sum();
    // The chunks in slot order, then the overflow table, in slot order: each entry that needs it
    // points at its place there.
    let mut slots = VersionTable::default();
    let mut overflowing = Vec::new();
    for chunk in decoded {
        let first = slots.len();
        overflowing.extend(chunk.rare.into_iter().map(|(at, overflow)| (first + at, overflow)));
        slots.append(chunk.versions)?;
    }
    let mut rare = Vec::with_capacity(overflowing.len());
    for (position, overflow) in overflowing {
        let at = u32::try_from(rare.len()).map_err(|_| "too many overflow entries")?;
        if slots.update(position, |version| version.set_overflow(at)) {
            rare.push(overflow);
        }
    }
    if slots.len() != count {
        return Err("the version table was not decoded whole".into());
    }
    if time.len() != stored {
        return Err("the time set does not list every stored version".into());
    }
    let (by_type, by_scope) = derive_sets(&time, &slots, &type_sizes, &scope_sizes)?;
    let sets = (by_type, by_scope, KeySet::from_sorted(time));
    let mut ids = ids?.with_names(arena);
    for (id, times) in deletes {
        ids.set_deletes(id, times)?;
    }
    let mut index = Index::from_checkpoint(seq, ids, slots, rare, sets, (kinds, scopes, sources))?;
    index.registry = registry;
    index.pins = pins;
    Ok(Loaded { seq, segments, index })
}

/// Runs `f` on the index once no group is half in it, waiting while one is:
/// - a group applied to the index ahead of its fsync and not yet published: a checkpoint taken
///   then would hold versions past its sequence number, which loading refuses;
/// - a group whose writer sealed a segment in the middle of it (the next frame did not fit), not
///   yet published: the sealed segment is in the index with its whole length, frames past the
///   index's sequence number included, and the new one starts past the sequence number after it.
///   A checkpoint taken then would mark the sealed segment as covered and resume in the new one at
///   a sequence number that is not there: the next open would refuse it and replay the whole log.
///
/// The wait is bounded (the maintenance thread tries again later).
fn with_published_index<T>(shared: &Shared, f: impl FnOnce(&Index, Vec<SegmentMark>) -> T) -> Result<T> {
    let waiting_since = std::time::Instant::now();
    loop {
        let index = shared.read_index();
        if !index.unpublished.is_none() || index.newest_segment_ahead().is_some() {
            if index.unpublished.failed {
                return Err(Error::Poisoned {
                    reason: "the index holds a group whose fsync failed".into(),
                });
            }
            drop(index);
            if waiting_since.elapsed() >= UNPUBLISHED_WAIT_MAX {
                return Err(Error::io(
                    "waiting for a group's fsync before a checkpoint",
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
            continue;
        }
        let marks: Vec<SegmentMark> = index
            .segments
            .iter()
            .map(|(number, segment)| SegmentMark {
                number: *number,
                rewrites: segment.rewrites,
                len: segment.published_len(),
            })
            .collect();
        return Ok(f(&index, marks));
    }
}

/// Writes a checkpoint of the index as it is now. With `sync_log`, the log is synced first up to
/// at least the checkpoint's sequence number, so that a checkpoint never gets ahead of the log.
///
/// The checkpoint is encoded into a buffer of its size under the index's read lock and written
/// after it, so that writers wait for the encoding only; [`write_streamed`] needs no such buffer.
pub(crate) fn write(shared: &Shared, sync_log: bool) -> Result<u64> {
    // The file's buffer is sized and its pages touched before the lock is taken for the encoding,
    // so that writers do not wait for the page faults of tens of megabytes of fresh memory. What
    // the log gains in between (a few batches) fits in the slack; more only grows the buffer.
    let capacity = {
        let index = shared.read_index();
        CHECKPOINT_HEADER_BYTES + body_capacity(&index) + 4
    };
    let capacity = capacity + capacity / 16;
    // Written, not just allocated: `vec![0; n]` would map zero pages that fault on first write.
    #[allow(clippy::slow_vector_initialization)]
    let mut file = {
        let mut file = Vec::with_capacity(capacity);
        file.resize(capacity, 0);
        file
    };
    file.clear();
    file.extend_from_slice(&[0; CHECKPOINT_HEADER_BYTES]);
    let seq = with_published_index(shared, |index, marks| {
        encode_body_into(&mut file, index, &marks, None);
        index.seq
    })?;
    // The header and the checksum are filled in after the lock is released.
    seal_in_place(seq, &mut file);
    let bytes = file;
    if sync_log {
        shared.flush()?;
    }
    install(&*shared.storage, &shared.dir, seq, &bytes)?;
    shared
        .last_checkpoint_bytes
        .store(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(seq)
}

/// Writes a checkpoint of the index as it is now, as [`write`] does but streamed to its file in
/// steps of [`STREAM_STEP`] bytes, under the index's read lock: for a store that is closing, whose
/// log is synced and which no writer uses any more. Its memory is bounded by the step instead of
/// the checkpoint's size.
pub(crate) fn write_streamed(shared: &Shared) -> Result<u64> {
    let storage = &*shared.storage;
    let (seq, len) = with_published_index(shared, |index, marks| {
        let tmp = checkpoint_tmp_path(&shared.dir, index.seq);
        stream(storage, &tmp, index, &marks, STREAM_STEP).map(|(len, _)| (index.seq, len))
    })??;
    publish(storage, &shared.dir, seq)?;
    shared
        .last_checkpoint_bytes
        .store(len, std::sync::atomic::Ordering::Relaxed);
    Ok(seq)
}

/// Writes `bytes` as the checkpoint for `seq`: temporary file, sync, rename, sync the directory;
/// then removes older checkpoints.
pub(crate) fn install(storage: &dyn Storage, dir: &Path, seq: u64, bytes: &[u8]) -> Result<()> {
    let tmp = checkpoint_tmp_path(dir, seq);
    let mut file = storage
        .create(&tmp)
        .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
    append_prepared(file.as_mut(), 0, bytes).map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    file.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", tmp.display()), e))?;
    drop(file);
    publish(storage, dir, seq)
}

/// Renames the synced temporary file of the checkpoint for `seq` into place, syncs the directory,
/// then removes older checkpoints.
fn publish(storage: &dyn Storage, dir: &Path, seq: u64) -> Result<()> {
    let path = dir.join(checkpoint_file_name(seq));
    let tmp = checkpoint_tmp_path(dir, seq);
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
    use crate::index::NAME_CHUNK;

    #[test]
    fn names_sort_like_numbers() {
        assert_eq!(checkpoint_file_name(42), "checkpoint-00000000000000000042.idx");
        assert_eq!(
            parse_checkpoint_file_name(&checkpoint_file_name(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(parse_checkpoint_file_name("checkpoint-42.idx"), None);
    }

    /// Where the test versions are: a record in segment 1.
    const HERE: Location = Location {
        segment: 1,
        offset: 32,
        len: 10,
        crc: 0,
    };

    /// A checkpoint of two ids, "aa" (two versions) and "ab", over segment 1.
    fn two_ids() -> (Index, Vec<SegmentMark>) {
        let mut index = Index::default();
        for (seq, id, version) in [(1, "aa", "1"), (2, "aa", "2"), (3, "ab", "1")] {
            index.apply_put(seq, &crate::index::tests::put(id, version, 10), HERE);
        }
        index.seq = 3;
        let marks = vec![SegmentMark {
            number: 1,
            rewrites: 0,
            len: 1000,
        }];
        (index, marks)
    }

    /// An index of 3,000 versions of 1,500 ids, with deletes and a forgotten version: a body of
    /// a few hundred kilobytes, across many name chunks.
    fn many_ids() -> (Index, Vec<SegmentMark>) {
        let name = |n: u64| {
            format!(
                "id-{:06}-{}",
                n * 7919 % 1500,
                "x".repeat(usize::try_from(n % 40).unwrap_or(0))
            )
        };
        let mut index = Index::default();
        let mut seq = 0;
        for n in 0..1500u64 {
            for version in ["1", "2"] {
                seq += 1;
                index.apply_put(seq, &crate::index::tests::put(&name(n), version, 10), HERE);
            }
        }
        for n in (0..1500u64).step_by(97) {
            seq += 1;
            assert!(index.apply_delete(seq, &name(n)));
        }
        assert!(index.forget(5));
        index.unlink_from_sets(5);
        index.purge_sets();
        index.seq = seq;
        let marks = (1..=3)
            .map(|number| SegmentMark {
                number,
                rewrites: number - 1,
                len: 1000 * u64::from(number),
            })
            .collect();
        (index, marks)
    }

    #[test]
    fn a_streamed_checkpoint_is_byte_for_byte_the_buffered_one_whatever_its_step() {
        let dir = Path::new("/store");
        for (index, marks) in [two_ids(), many_ids()] {
            let buffered = encode(&index, &marks);
            for step in [1, 7, 4096, STREAM_STEP] {
                let disk = crate::storage::SimDisk::new();
                disk.create_dir_all(dir).expect("dir");
                let tmp = dir.join("streamed.tmp");
                let (len, largest) = stream(&disk, &tmp, &index, &marks, step).expect("streamed");
                let streamed = disk.file_bytes(&tmp).expect("the file is there");
                assert_eq!(len, buffered.len() as u64, "step {step}");
                // A step ends at the first put that reaches it: a row, or at most a chunk of names.
                assert!(
                    largest <= step + NAME_CHUNK + 4,
                    "step {step}: a write of {largest} bytes"
                );
                if buffered.len() > 2 * (step + NAME_CHUNK + 4) {
                    assert!(largest < buffered.len() / 2, "step {step}: written in one piece");
                }
                assert!(
                    streamed == buffered,
                    "step {step}: the streamed bytes differ from the buffered ones"
                );
                let loaded = decode(&streamed).expect("the streamed checkpoint loads");
                assert_eq!(loaded.seq, index.seq);
                assert_eq!(loaded.segments, marks);
                assert_eq!(loaded.index.id_count(), index.id_count());
            }
        }
    }

    #[test]
    fn a_stream_patches_bytes_still_in_its_buffer_and_fails_on_bytes_written_already() {
        let disk = crate::storage::SimDisk::new();
        disk.create_dir_all(Path::new("/store")).expect("dir");
        let tmp = Path::new("/store/patched.tmp");
        let mut file = disk.create(tmp).expect("create");
        let mut stream = Stream {
            file: file.as_mut(),
            step: 4,
            buffer: Vec::new(),
            crc: crc32fast::Hasher::new(),
            written: 0,
            largest: 0,
            failed: None,
        };
        stream.extend_from_slice(b"abcd");
        stream.extend_from_slice(b"ef");
        assert_eq!(stream.position(), 6);
        stream.patch(4, b"EF");
        assert!(stream.failed.is_none(), "a patch of buffered bytes failed");
        stream.patch(0, b"A");
        assert!(stream.failed.is_some(), "a patch of written bytes was taken");
        stream.failed = None;
        stream.flush();
        drop(stream);
        assert_eq!(disk.file_bytes(tmp).expect("file"), b"abcdEF");
    }

    #[test]
    fn a_streamed_checkpoint_reports_a_failed_write_and_writes_nothing_after_it() {
        let (index, marks) = many_ids();
        let whole = encode(&index, &marks).len();
        for fault in [crate::storage::Fault::Io, crate::storage::Fault::ShortWrite] {
            let disk = crate::storage::SimDisk::new();
            disk.create_dir_all(Path::new("/store")).expect("dir");
            let tmp = Path::new("/store/streamed.tmp");
            disk.record_calls(true);
            // create, allocate, then the appends: the third of them fails.
            let first = disk.calls();
            disk.fail(first + 4, first + 4, fault);
            let error = stream(&disk, tmp, &index, &marks, 4096).expect_err("a write failed");
            assert!(
                error.to_string().contains("writing /store/streamed.tmp"),
                "{fault:?}: {error}"
            );
            let appends = disk
                .call_log()
                .iter()
                .filter(|call| call.kind == crate::storage::CallKind::Append)
                .count();
            assert_eq!(appends, 3, "{fault:?}: appends went on after the failed one");
            // The file holds the two steps written before the failure (and what a short write left),
            // then the zeros allocated ahead: it does not load.
            let left = disk.file_bytes(tmp).unwrap_or_default();
            assert_eq!(left.len(), whole, "{fault:?}: allocated as long as the checkpoint");
            assert!(whole > 64 * 4096, "the test index is too small: {whole} bytes");
            assert!(
                left[whole / 2..].iter().all(|byte| *byte == 0),
                "{fault:?}: bytes past the failure"
            );
            assert!(decode(&left).is_err(), "{fault:?}: a torn checkpoint loads");
        }
    }

    #[test]
    fn an_id_with_no_version_left_loads_with_its_number_and_deletes() {
        let (mut index, marks) = two_ids();
        assert!(index.apply_delete(4, "ab"));
        // Compaction dropped the only version of the deleted "ab" (slot 2).
        assert!(index.forget(2));
        index.unlink_from_sets(2);
        index.purge_sets();
        index.seq = 4;
        let loaded = decode(&seal(4, &encode_body(&index, &marks))).expect("intact").index;
        let ab = loaded.id_number("ab").expect("ab is still known");
        assert_eq!(Some(ab), index.id_number("ab"));
        assert_eq!(loaded.deletes_of(ab), 1);
        assert!(loaded.visible("ab", 4).is_none());
        let aa = loaded.id_number("aa").expect("aa");
        let chain: Vec<u32> = loaded.versions_of(aa).map(|(slot, _)| slot).collect();
        assert_eq!(chain, vec![1, 0]);
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
            loaded.index.visible("aa", 3).map(|v| v.version.version_tag()),
            Some(crate::index::version_tag("2"))
        );
        assert_eq!(loaded.index.versions_of(0).count(), 2);

        let mut twice = body.clone();
        // Front-coded, "aa" and "ab" are stored as "aa" and "b" after one shared byte.
        replace(&mut twice, b"aab", b"aaa");
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

        // A timestamp no add accepts (the index keeps 40 bits of it): aa's first version, at 10.
        let row: Vec<u8> = [1u64.to_le_bytes(), 2u64.to_le_bytes(), 10u64.to_le_bytes()].concat();
        for timestamp in [-1, crate::limits::TIMESTAMP_MAX + 1, i64::MIN] {
            let mut late = body.clone();
            let forged: Vec<u8> = [1u64.to_le_bytes(), 2u64.to_le_bytes(), timestamp.to_le_bytes()].concat();
            replace(&mut late, &row, &forged);
            let why = decode(&seal(3, &late)).err().expect("a timestamp out of range");
            assert!(why.contains("timestamp"), "{timestamp}: {why}");
        }
        // A version tag over 16 bits (the index keeps 16): aa's first version's, at byte 52 of its row.
        let mut wide = body.clone();
        let at = wide
            .windows(row.len())
            .position(|w| w == row.as_slice())
            .expect("aa's first row");
        wide[at + 54] = 1;
        let why = decode(&seal(3, &wide)).err().expect("a tag over 16 bits");
        assert!(why.contains("over 16 bits"), "{why}");
        let mut latest = Index::default();
        latest.apply_put(
            1,
            &crate::index::tests::put("aa", "1", crate::limits::TIMESTAMP_MAX),
            HERE,
        );
        latest.seq = 1;
        let loaded = decode(&seal(1, &encode_body(&latest, &marks))).expect("the largest timestamp is kept");
        let kept = loaded.index.visible("aa", 1).map(|v| v.version.timestamp());
        assert_eq!(kept, Some(crate::limits::TIMESTAMP_MAX));
    }

    #[test]
    fn overflowing_expiries_generations_sources_and_ends_round_trip_across_chunks() {
        // 70,000 versions (eighteen chunks of rows), each from its own source, so that the last
        // 4,464 have source numbers past what an entry holds; every 997th with an expiry past what
        // an entry holds; one id deleted and added again 40 times, whose later generations
        // overflow; and ends more sequence numbers after a creation than an entry holds.
        const N: u64 = 70_000;
        let mut index = Index::default();
        let name = |n: u64| format!("id{n}");
        let source = |n: u64| format!("s{n}");
        let expiry_of = |n: u64| {
            if n.is_multiple_of(997) {
                Some(u64::from(u32::MAX) + n)
            } else if n.is_multiple_of(2) {
                Some(60 + n)
            } else {
                None
            }
        };
        for n in 0..N {
            let (id, from) = (name(n), source(n));
            let mut put = crate::index::tests::put(&id, "1", 1_000 + n as i64);
            put.ttl_seconds = expiry_of(n);
            put.source = &from;
            index.apply_put(n + 1, &put, HERE);
        }
        let mut seq = N + 1;
        for _ in 0..40 {
            index.apply_put(seq, &crate::index::tests::put("churn", "1", 7), HERE);
            index.apply_delete(seq + 1, "churn");
            seq += 2;
        }
        index.apply_put(seq, &crate::index::tests::put("churn", "2", 7), HERE);
        // id1 (inline) ended u32::MAX - 1 after its creation, the most an entry holds; id2 (inline)
        // u32::MAX after, and id0 (already in the overflow table for its expiry) much later.
        let end_fits = 2 + u64::from(u32::MAX) - 1;
        let end_does_not = 3 + u64::from(u32::MAX);
        index.apply_delete(end_fits, "id1");
        index.apply_put(end_does_not, &crate::index::tests::put("id2", "2", 5), HERE);
        seq = end_does_not + 1_000;
        index.apply_put(seq, &crate::index::tests::put("id0", "2", 5), HERE);
        index.seq = seq;
        let ended = |index: &Index, n: u64| -> Vec<u64> {
            let id = index.id_number(&name(n)).expect("id");
            index.versions_of(id).map(|(_, v)| index.seq_ended(&v)).collect()
        };
        assert_eq!(ended(&index, 1), vec![end_fits]);
        assert_eq!(ended(&index, 2), vec![SEQ_OPEN, end_does_not]);
        assert_eq!(ended(&index, 0), vec![SEQ_OPEN, seq]);
        let marks = [SegmentMark {
            number: 1,
            rewrites: 0,
            len: 1000,
        }];
        let loaded = decode(&seal(seq, &encode_body(&index, &marks))).expect("intact").index;
        for n in 0..N {
            let expected = expiry_of(n).map_or(crate::index::NEVER_EXPIRES, |ttl| 1_000 + n as i64 + ttl as i64);
            let id = loaded.id_number(&name(n)).expect("id");
            let (_, first) = loaded.versions_of(id).last().expect("a version");
            assert_eq!(loaded.expires_at(&first), expected, "id {n}");
            let from = loaded.sources.value(loaded.source_of(&first)).map(|s| s.to_string());
            assert_eq!(from, Some(source(n)), "id {n}");
            assert!(loaded.visible_at(&first, n + 1), "id {n}");
        }
        for n in [0, 1, 2] {
            assert_eq!(ended(&loaded, n), ended(&index, n), "id {n}");
        }
        assert!(loaded.visible("id1", end_fits - 1).is_some() && loaded.visible("id1", end_fits).is_none());
        let tag_at = |seq: u64| loaded.visible("id2", seq).map(|v| v.version.version_tag());
        assert_eq!(tag_at(end_does_not - 1), Some(crate::index::version_tag("1")));
        assert_eq!(tag_at(end_does_not), Some(crate::index::version_tag("2")));
        let generations = |index: &Index| -> Vec<(u32, i64)> {
            let id = index.id_number("churn").expect("churn");
            index
                .versions_of(id)
                .map(|(_, v)| (index.generation(&v), index.expires_at(&v)))
                .collect()
        };
        assert_eq!(generations(&loaded), generations(&index));
        assert_eq!(generations(&loaded).first().map(|g| g.0), Some(40));
        assert_eq!(loaded.current_history("churn").count(), 1);
        // The same rows again, byte for byte.
        assert!(encode_body(&loaded, &marks) == encode_body(&index, &marks));
    }

    #[test]
    fn names_in_many_chunks_round_trip_and_bad_name_layouts_are_refused() {
        // 2,000 ids of 100-byte names: four chunks of whole names.
        let mut index = Index::default();
        let name = |n: u64| format!("{n:0>100}");
        for n in 0..2000u64 {
            index.apply_put(n + 1, &crate::index::tests::put(&name(n), "1", n as i64), HERE);
        }
        index.seq = 2000;
        let marks = [SegmentMark {
            number: 1,
            rewrites: 0,
            len: 1000,
        }];
        let loaded = decode(&seal(2000, &encode_body(&index, &marks))).expect("intact");
        assert_eq!(loaded.index.id_count(), 2000);
        for n in [0, 654, 655, 1999] {
            let found = loaded.index.visible(&name(n), 2000).map(|v| v.version.timestamp());
            assert_eq!(found, Some(n as i64), "id {n}");
            assert_eq!(loaded.index.id_name(u32::try_from(n).expect("small")), name(n));
        }
        assert!(loaded.index.visible(&name(2000), 2000).is_none());
        // The checkpoint stores the names as the arena holds them, front-coded: two bytes per id,
        // then one chunk (a mark's name whole every 16 ids, one to three bytes for the others).
        let mut names = Vec::new();
        put_names(&mut names, &index);
        assert_eq!(names.get(..2), Some(&[0u8, 100][..]));
        assert_eq!(names.get(2..4), Some(&[99u8, 1][..]));
        assert_eq!(names.get(4000..4004), Some(&1u32.to_le_bytes()[..]));
        let chunk = u32::from_le_bytes(names[4004..4008].try_into().expect("4 bytes")) as usize;
        assert_eq!(names.len(), 4008 + chunk);
        assert!(chunk < 2000 * 100 / 10, "{chunk} bytes for 2,000 names of 100");

        let table = |chunks: &[&[u8]], parts: &[[u8; 2]]| IdTable::from_name_chunk_bytes(chunks, parts).err();
        assert!(table(&[b"abcd"], &[[0, 2], [0, 2]]).is_none());
        assert!(table(&[b"abc"], &[[0, 2], [1, 1]]).is_none(), "ab, ac");
        assert!(table(&[], &[]).is_none());
        let seventeen = b"abcdefghijklmnopq";
        let mut marked = vec![[0, 1]; 17];
        marked[16] = [1, 1];
        let mut long = vec![b'a'; 255];
        long.push(b'b');
        let refused = [
            (table(&[b"abcd"], &[[0, 2], [0, 0], [0, 2]]), "empty name part"),
            (table(&[b"abcd"], &[[1, 2], [0, 2]]), "not stored whole"),
            (table(&[seventeen], &marked), "not stored whole"),
            (table(&[b"abcd"], &[[0, 2], [3, 2]]), "shares 3 bytes"),
            (table(&["éx".as_bytes()], &[[0, 2], [1, 1]]), "shares 1 bytes"),
            (table(&[b"abc", b"d"], &[[0, 2], [0, 2]]), "does not fit"),
            (table(&[b"abcd"], &[[0, 2], [0, 3]]), "does not fit"),
            (table(&["aé".as_bytes()], &[[0, 2], [0, 1]]), "does not fit"),
            (table(&[b"abcde"], &[[0, 2], [0, 2]]), "after the last id"),
            (table(&[b"ab", b""], &[[0, 2]]), "after the last id"),
            (table(&[b"abab"], &[[0, 2], [0, 2]]), "listed twice"),
            (table(&[b"abb"], &[[0, 2], [1, 1]]), "listed twice"),
            (table(&[&long], &[[0, 255], [255, 1]]), "longer than 255"),
            (table(&[b"a\xff"], &[[0, 1], [0, 1]]), "not UTF-8"),
            (table(&[&vec![b'a'; NAME_CHUNK + 1]], &[[0, 255]]), "more than"),
        ];
        for (why, expected) in refused {
            let why = why.unwrap_or_default();
            assert!(why.contains(expected), "{why:?} should say {expected:?}");
        }
    }

    #[test]
    fn ordered_sets_that_disagree_with_the_versions_are_refused() {
        let (index, marks) = two_ids();
        let body = encode_body(&index, &marks);
        // The body ends with the time set (all three versions are stored, all at timestamp 10:
        // slots 0, 1, 2), then the one type's set size and the one scope's.
        let tail = body.len() - 16;
        assert_eq!(&body[tail - 16..tail], [3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(&body[tail..], [1, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0]);
        let refused = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut damaged = body.clone();
            edit(&mut damaged);
            decode(&seal(3, &damaged)).err().unwrap_or_default()
        };
        let swapped = refused(&|b| b[tail - 8..tail].copy_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0]));
        assert!(swapped.contains("not in order"), "{swapped}");
        let unknown = refused(&|b| b[tail - 4..tail].copy_from_slice(&[5, 0, 0, 0]));
        assert!(unknown.contains("slot 5, which is not stored"), "{unknown}");
        let twice = refused(&|b| b[tail - 4..tail].copy_from_slice(&[1, 0, 0, 0]));
        assert!(twice.contains("not in order"), "{twice}");
        let sizes = refused(&|b| b[tail + 4..tail + 8].copy_from_slice(&[4, 0, 0, 0]));
        assert!(sizes.contains("do not add up"), "{sizes}");
        let short = refused(&|b| {
            b.truncate(tail - 4);
            b[tail - 16..tail - 12].copy_from_slice(&[2, 0, 0, 0]);
            b.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        });
        assert!(short.contains("every stored version"), "{short}");
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
