//! The in-memory index: every stored version of every id, with the sequence range in which it is the
//! id's visible version, and ordered sets on (type, timestamp), (scope, timestamp) and (timestamp).
//! Low-cardinality strings (type, scope, source) are interned to small integers.
//!
//! MVCC: a view at sequence number `S` sees, for each id, the version whose
//! `seq_created <= S < seq_ended`. A newer version or a tombstone sets `seq_ended` of the one it ends.
//!
//! Memory is flat: versions and ids are fixed-size records in chunked arrays (appending never moves
//! them), id names live in a chunked arena, the name lookup is a table of 4-byte id numbers, and each
//! ordered set is mostly a sorted array of 4-byte slot numbers. Nothing is allocated per item, which
//! is also what lets a checkpoint load in one pass. A version's string and content hash stay in its
//! log record; the index keeps a 16-bit tag of the version string so that almost every lookup by
//! version is answered without reading the log.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use hashbrown::HashTable;

use crate::item::{Scope, TypeRegistry};
use crate::log::record::{PutView, ScopeView};
use crate::log::segment::Segment;

/// The hash maps of the index: ids and interned strings come from users, so the hasher is seeded
/// at random (foldhash resists simple flooding) while staying several times faster than SipHash.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// `seq_ended` of a version nothing has ended yet.
pub(crate) const SEQ_OPEN: u64 = u64::MAX;
/// `expires_at` of a version without a TTL.
pub(crate) const NEVER_EXPIRES: i64 = i64::MAX;
/// "No version": the end of an id's chain of versions.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// The 16-bit tag of a version string kept in the index: the low half of its CRC-32. Equal strings
/// have equal tags; equal tags are confirmed against the log record (two different strings share a
/// tag about once in 65,536 comparisons, which then costs one record read).
pub(crate) fn version_tag(version: &str) -> u16 {
    crc32fast::hash(version.as_bytes()) as u16
}

/// [`VersionEntry`]'s `ended` while the version is open.
const ENDED_OPEN: u32 = u32::MAX;

/// Where a record is stored: segment number, byte offset and length of the whole record, and the
/// CRC of its body (from its header), which tells it from any other record that could be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Location {
    pub(crate) segment: u32,
    pub(crate) offset: u32,
    pub(crate) len: u32,
    pub(crate) crc: u32,
}

/// The body CRC in the header of the record that starts at `at` in `bytes` (0 if out of bounds).
pub(crate) fn record_crc_at(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at + 5..at + 9)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// Bits of [`VersionEntry`]'s `meta` word: the timestamp in the low 40 (validated timestamps,
/// `0..=TIMESTAMP_MAX`, need 38), the type number in the next 16, the [`VersionState`] in 2, then
/// the overflow bit and 5 bits of generation.
const META_TIMESTAMP_MASK: u64 = (1 << 40) - 1;
const META_KIND_SHIFT: u32 = 40;
const META_STATE_SHIFT: u32 = 56;
/// The timestamp, type number and state: what [`VersionEntry::with_meta`] sets.
const META_MAIN_MASK: u64 = (1 << 58) - 1;
/// Set when the version's expiry, generation, source and end are in the index's overflow table
/// ([`Rare`]).
const META_OVERFLOW: u64 = 1 << 58;
const META_GENERATION_SHIFT: u32 = 59;
/// The largest generation kept in the entry itself (5 bits); an id deleted more often has the
/// versions of its later histories in the overflow table.
const GENERATION_INLINE_MAX: u32 = 31;
/// The largest source number kept in the entry itself (16 bits, beside the version tag).
const SOURCE_INLINE_MAX: u32 = u16::MAX as u32;

/// The `meta` word of a version: its timestamp, type number and state in one `u64`.
fn meta_word(timestamp: i64, kind: u16, state: VersionState) -> u64 {
    debug_assert!(
        (0..=crate::limits::TIMESTAMP_MAX).contains(&timestamp),
        "timestamp {timestamp} out of range"
    );
    // Every timestamp that reaches the index was validated (adds) or checked where it was decoded
    // (log records, checkpoints); the clamp only keeps the other fields intact if one was not.
    let timestamp = timestamp.clamp(0, crate::limits::TIMESTAMP_MAX) as u64;
    timestamp | (u64::from(kind) << META_KIND_SHIFT) | ((state as u64) << META_STATE_SHIFT)
}

/// A version's expiry, generation, source and end when they do not all fit in its entry: an expiry
/// more than `u32::MAX` seconds (136 years) after its timestamp, a generation above
/// [`GENERATION_INLINE_MAX`], a source number above [`SOURCE_INLINE_MAX`], or an end `u32::MAX` or
/// more sequence numbers after the version's creation. Rare by design: W1 has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rare {
    pub(crate) expires_at: i64,
    pub(crate) seq_ended: u64,
    pub(crate) generation: u32,
    pub(crate) source: u32,
}

impl Rare {
    /// A version's rare fields as it is added: open, expiring at `expires_at`.
    pub(crate) fn open(expires_at: i64, generation: u32, source: u32) -> Rare {
        Rare {
            expires_at,
            seq_ended: SEQ_OPEN,
            generation,
            source,
        }
    }
}

/// One stored version of an id, as the index's users read and write it (56 bytes, no heap); the
/// [`VersionTable`] keeps it in 44 (see [`StoredEntry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VersionEntry {
    pub(crate) seq_created: u64,
    /// The item's timestamp (with the slot, the key of its entries in the ordered sets), its type
    /// number and state, and where its expiry, generation, source and end are: see [`meta_word`]
    /// and [`Index::expires_at`].
    meta: u64,
    pub(crate) location: Location,
    /// Position of the id in the index's id table.
    pub(crate) id: u32,
    /// The id's previous (older) version still in the index, or [`NO_SLOT`].
    pub(crate) prev: u32,
    pub(crate) scope: u32,
    /// [`version_tag`] of the version string in the low 16 bits; without the overflow bit, the
    /// source number in the high 16.
    tag_source: u32,
    /// Without the overflow bit: `seq_ended - seq_created`, or [`ENDED_OPEN`] while the version is
    /// open.
    ended: u32,
    /// Without the overflow bit: 0 if the version never expires, else how many seconds after its
    /// timestamp it does. With it: the position of its [`Rare`] in the index's overflow table.
    expiry: u32,
}

impl Default for VersionEntry {
    fn default() -> Self {
        VersionEntry {
            seq_created: 0,
            meta: meta_word(0, 0, VersionState::Forgotten),
            location: Location::default(),
            id: 0,
            prev: NO_SLOT,
            scope: 0,
            tag_source: 0,
            ended: ENDED_OPEN,
            expiry: 0,
        }
    }
}

/// What is stored of a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum VersionState {
    /// Its whole record, content included.
    Stored,
    /// Compaction reclaimed its content; its (id, version, hash) is remembered in a retired record.
    Retired,
    /// Compaction dropped it entirely (a deleted history); the slot is unused.
    Forgotten,
}

impl VersionEntry {
    /// This version with the timestamp (in `0..=TIMESTAMP_MAX`), type number and state given.
    pub(crate) fn with_meta(self, timestamp: i64, kind: u16, state: VersionState) -> Self {
        VersionEntry {
            meta: (self.meta & !META_MAIN_MASK) | meta_word(timestamp, kind, state),
            ..self
        }
    }

    /// This version with the tag of version string `version`.
    pub(crate) fn with_version(self, version: &str) -> Self {
        self.with_tag(version_tag(version))
    }

    /// This version with version tag `tag`.
    pub(crate) fn with_tag(self, tag: u16) -> Self {
        VersionEntry {
            tag_source: (self.tag_source & !0xFFFF) | u32::from(tag),
            ..self
        }
    }

    /// The [`version_tag`] of the version string.
    pub(crate) fn version_tag(&self) -> u16 {
        self.tag_source as u16
    }

    /// Keeps the version's expiry, generation, source and end in the entry if they all fit there
    /// (an expiry at most `u32::MAX` seconds after the timestamp, or never; a generation up to
    /// [`GENERATION_INLINE_MAX`]; a source number up to [`SOURCE_INLINE_MAX`]; open, or ended less
    /// than `u32::MAX` sequence numbers after its creation); otherwise returns them, for the overflow
    /// table (then [`VersionEntry::set_overflow`]). Set the timestamp and `seq_created` first: the
    /// expiry and the end are kept relative to them.
    #[must_use]
    pub(crate) fn set_rare_inline(&mut self, rare: Rare) -> Option<Rare> {
        let expiry = if rare.expires_at == NEVER_EXPIRES {
            Some(0)
        } else {
            rare.expires_at
                .checked_sub(self.timestamp())
                .and_then(|after| u32::try_from(after).ok())
                .filter(|after| *after > 0)
        };
        let ended = if rare.seq_ended == SEQ_OPEN {
            Some(ENDED_OPEN)
        } else {
            rare.seq_ended
                .checked_sub(self.seq_created)
                .and_then(|after| u32::try_from(after).ok())
                .filter(|after| *after != ENDED_OPEN)
        };
        match (expiry, ended) {
            (Some(expiry), Some(ended))
                if rare.generation <= GENERATION_INLINE_MAX && rare.source <= SOURCE_INLINE_MAX =>
            {
                self.meta = (self.meta & META_MAIN_MASK) | (u64::from(rare.generation) << META_GENERATION_SHIFT);
                self.expiry = expiry;
                self.ended = ended;
                self.tag_source = (rare.source << 16) | (self.tag_source & 0xFFFF);
                None
            }
            _ => Some(rare),
        }
    }

    /// Points the entry at its [`Rare`], at position `at` of the index's overflow table.
    pub(crate) fn set_overflow(&mut self, at: u32) {
        self.meta = (self.meta & META_MAIN_MASK) | META_OVERFLOW;
        self.expiry = at;
        self.ended = 0;
        self.tag_source &= 0xFFFF;
    }

    /// The entry's expiry, generation, source and end, `Err` with the position of its [`Rare`] when
    /// they are in the overflow table.
    fn rare_inline(&self) -> Result<Rare, usize> {
        if self.meta & META_OVERFLOW != 0 {
            return Err(usize::try_from(self.expiry).unwrap_or(usize::MAX));
        }
        let expires_at = match self.expiry {
            0 => NEVER_EXPIRES,
            after => self.timestamp().saturating_add(i64::from(after)),
        };
        let seq_ended = match self.ended {
            ENDED_OPEN => SEQ_OPEN,
            after => self.seq_created.saturating_add(u64::from(after)),
        };
        Ok(Rare {
            expires_at,
            seq_ended,
            generation: (self.meta >> META_GENERATION_SHIFT) as u32,
            source: self.tag_source >> 16,
        })
    }

    /// The item's timestamp.
    pub(crate) fn timestamp(&self) -> i64 {
        // At most 40 bits: the conversion is exact.
        (self.meta & META_TIMESTAMP_MASK) as i64
    }

    /// The item's type number.
    pub(crate) fn kind(&self) -> u16 {
        (self.meta >> META_KIND_SHIFT) as u16
    }

    /// What is stored of the version.
    pub(crate) fn state(&self) -> VersionState {
        match (self.meta >> META_STATE_SHIFT) & 3 {
            0 => VersionState::Stored,
            1 => VersionState::Retired,
            _ => VersionState::Forgotten,
        }
    }

    fn set_state(&mut self, state: VersionState) {
        self.meta = (self.meta & !(3 << META_STATE_SHIFT)) | ((state as u64) << META_STATE_SHIFT);
    }

    /// Whether compaction reclaimed this version's content.
    pub(crate) fn is_retired(&self) -> bool {
        self.state() == VersionState::Retired
    }

    /// Whether the version's record, content included, is stored.
    pub(crate) fn is_stored(&self) -> bool {
        self.state() == VersionState::Stored
    }

    /// Whether a view at `seq` sees this version, when its end is in the entry (`None` when it is
    /// in the overflow table).
    #[inline]
    fn visible_inline(&self, seq: u64) -> Option<bool> {
        if self.meta & META_OVERFLOW != 0 {
            return None;
        }
        let Some(after) = seq.checked_sub(self.seq_created) else {
            return Some(false);
        };
        Some(if self.ended == ENDED_OPEN {
            seq < SEQ_OPEN
        } else {
            after < u64::from(self.ended)
        })
    }
}

/// Marks a value of the id lookup that is an id number (an id with no version in the index) rather
/// than the slot of the id's newest version. Slots and id numbers stay below it.
const ID_TAG: u32 = 1 << 31;

/// The most ids and versions the index holds: below [`ID_TAG`].
pub(crate) const IDS_AND_SLOTS_MAX: usize = ID_TAG as usize - 1;

/// Entries per chunk of a [`ChunkVec`].
pub(crate) const CHUNK: usize = 4096;

/// A growable array in fixed chunks: pushing never moves what is stored (no copy of the whole array
/// under the index lock), and at most one partly filled chunk is allocated beyond the length.
#[derive(Debug, Clone)]
pub(crate) struct ChunkVec<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for ChunkVec<T> {
    fn default() -> Self {
        ChunkVec {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> ChunkVec<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, position: usize) -> Option<&T> {
        self.chunks.get(position / CHUNK)?.get(position % CHUNK)
    }

    pub(crate) fn get_mut(&mut self, position: usize) -> Option<&mut T> {
        self.chunks.get_mut(position / CHUNK)?.get_mut(position % CHUNK)
    }

    /// An array of full chunks of [`CHUNK`] entries but the last.
    pub(crate) fn from_chunks(chunks: Vec<Vec<T>>) -> Self {
        let len = chunks.iter().map(Vec::len).sum();
        ChunkVec { chunks, len }
    }

    /// Appends the chunks of `other` after this array's, which must end with a full chunk (or be
    /// empty); `false`, and nothing appended, otherwise.
    fn append(&mut self, other: ChunkVec<T>) -> bool {
        if !self.len.is_multiple_of(CHUNK) {
            return false;
        }
        self.chunks.extend(other.chunks);
        self.len += other.len;
        true
    }

    pub(crate) fn push(&mut self, value: T) {
        if self.chunks.last().is_none_or(|chunk| chunk.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push(value);
            self.len += 1;
        }
    }

    /// The entries at `range`, which must lie in one chunk (empty otherwise).
    fn run(&self, range: std::ops::Range<usize>) -> &[T] {
        let chunk = range.start / CHUNK;
        let within = range.start % CHUNK..range.end.saturating_sub(chunk * CHUNK);
        self.chunks.get(chunk).and_then(|c| c.get(within)).unwrap_or_default()
    }

    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        self.chunks.iter().flatten()
    }

    /// Heap bytes held, allocated capacity included.
    fn heap_bytes(&self) -> u64 {
        (self.chunks.iter().map(Vec::capacity).sum::<usize>() * std::mem::size_of::<T>()
            + self.chunks.capacity() * std::mem::size_of::<Vec<T>>()) as u64
    }
}

/// Slots per block of the [`VersionTable`]: an entry keeps its creation sequence number and
/// segment over its block's first entry's.
const BASE_BLOCK: usize = 256;
const _: () = assert!(CHUNK.is_multiple_of(BASE_BLOCK));
/// A [`StoredEntry`]'s `place` word: the creation sequence number over the block's first (high 12
/// bits), the segment over the block's first (next 4) and the record length (low 16).
const PLACE_SEQ_SHIFT: u32 = 20;
const PLACE_SEGMENT_SHIFT: u32 = 16;
const PLACE_SEQ_DELTA_MAX: u64 = (1 << 12) - 1;
const PLACE_SEGMENT_DELTA_MAX: u32 = (1 << 4) - 1;
const PLACE_LEN_MASK: u32 = (1 << 16) - 1;
/// `place` of an entry whose creation sequence number, segment and length are in
/// [`VersionTable::wide`]. No entry that keeps them itself has it: its length would be
/// [`PLACE_LEN_MASK`], which is kept wide.
const PLACE_WIDE: u32 = u32::MAX;

/// A [`VersionEntry`] as the [`VersionTable`] keeps it: 44 bytes instead of 56, in 4-byte words.
/// Versions are created in sequence order and a version's record never leaves its segment
/// (compaction rewrites a segment under its own number), so the slots of one block of
/// [`BASE_BLOCK`] have close creation sequence numbers and segments: each entry keeps them over the
/// block's first entry's, in 12 and 4 bits, beside a 16-bit record length. An entry where one of
/// them does not fit (a block spanning 4,096 batches or 16 segments, a record of 64 KiB or more, or
/// a slot created out of order) keeps all three in [`VersionTable::wide`].
#[derive(Debug, Clone, Copy)]
struct StoredEntry {
    meta_low: u32,
    meta_high: u32,
    place: u32,
    offset: u32,
    crc: u32,
    id: u32,
    prev: u32,
    scope: u32,
    tag_source: u32,
    ended: u32,
    expiry: u32,
}

const _: () = assert!(std::mem::size_of::<StoredEntry>() == 44);

impl StoredEntry {
    fn meta(&self) -> u64 {
        (u64::from(self.meta_high) << 32) | u64::from(self.meta_low)
    }

    /// Whether the version's whole record, content included, is stored ([`VersionState::Stored`]).
    fn is_stored(&self) -> bool {
        (self.meta() >> META_STATE_SHIFT) & 3 == VersionState::Stored as u64
    }
}

/// The creation sequence number, segment and record length of an entry that cannot keep them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wide {
    seq_created: u64,
    segment: u32,
    len: u32,
}

/// Every version entry, by slot, in chunks of [`CHUNK`] that never move (see [`StoredEntry`]).
/// Entries are read and written whole, as [`VersionEntry`] values.
#[derive(Debug, Clone, Default)]
pub(crate) struct VersionTable {
    entries: ChunkVec<StoredEntry>,
    /// Per block of [`BASE_BLOCK`] slots: the creation sequence number and segment of its first entry.
    bases: Vec<(u64, u32)>,
    /// The entries that do not fit, by slot position.
    wide: FastMap<usize, Wide>,
}

impl VersionTable {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry at `position` as it is kept.
    #[inline]
    fn stored_at(&self, position: usize) -> Option<&StoredEntry> {
        self.entries.get(position)
    }

    /// The id number of the entry at `position`.
    #[inline]
    fn id_at(&self, position: usize) -> Option<u32> {
        self.stored_at(position).map(|stored| stored.id)
    }

    /// The entry at `position`.
    #[inline]
    pub(crate) fn get(&self, position: usize) -> Option<VersionEntry> {
        let stored = self.stored_at(position)?;
        let (seq_created, segment, len) = if stored.place == PLACE_WIDE {
            self.wide_at(position)
        } else {
            let (seq_base, segment_base) = self.bases.get(position / BASE_BLOCK).copied().unwrap_or_default();
            (
                seq_base.wrapping_add(u64::from(stored.place >> PLACE_SEQ_SHIFT)),
                segment_base.wrapping_add((stored.place >> PLACE_SEGMENT_SHIFT) & PLACE_SEGMENT_DELTA_MAX),
                stored.place & PLACE_LEN_MASK,
            )
        };
        Some(VersionEntry {
            seq_created,
            meta: stored.meta(),
            location: Location {
                segment,
                offset: stored.offset,
                len,
                crc: stored.crc,
            },
            id: stored.id,
            prev: stored.prev,
            scope: stored.scope,
            tag_source: stored.tag_source,
            ended: stored.ended,
            expiry: stored.expiry,
        })
    }

    #[cold]
    fn wide_at(&self, position: usize) -> (u64, u32, u32) {
        self.wide
            .get(&position)
            .map_or((0, 0, 0), |wide| (wide.seq_created, wide.segment, wide.len))
    }

    /// The timestamp of the entry at `position` (the key of its set entries), without the rest.
    #[inline]
    pub(crate) fn timestamp(&self, position: usize) -> Option<i64> {
        let stored = self.stored_at(position)?;
        // At most 40 bits: the conversion is exact.
        Some((stored.meta() & META_TIMESTAMP_MASK) as i64)
    }

    /// The timestamp, type number and scope number of the entry at `position` if it is stored: its
    /// keys in the ordered sets, without the rest.
    pub(crate) fn set_keys(&self, position: usize) -> Option<(i64, u16, u32)> {
        let stored = self.stored_at(position)?;
        let meta = stored.meta();
        // The timestamp has at most 40 bits and the type number 16: the conversions are exact.
        stored.is_stored().then_some((
            (meta & META_TIMESTAMP_MASK) as i64,
            (meta >> META_KIND_SHIFT) as u16,
            stored.scope,
        ))
    }

    /// Whether the entry at `position` is stored (content included).
    pub(crate) fn is_stored(&self, position: usize) -> bool {
        self.stored_at(position).is_some_and(StoredEntry::is_stored)
    }

    /// `version` as it is kept at `position`, and its [`Wide`] if it needs one.
    fn pack(&self, position: usize, version: &VersionEntry) -> (StoredEntry, Option<Wide>) {
        let (seq_base, segment_base) = self.bases.get(position / BASE_BLOCK).copied().unwrap_or_default();
        let Location {
            segment,
            offset,
            len,
            crc,
        } = version.location;
        let seq_delta = version
            .seq_created
            .checked_sub(seq_base)
            .filter(|delta| *delta <= PLACE_SEQ_DELTA_MAX)
            .and_then(|delta| u32::try_from(delta).ok());
        let segment_delta = segment
            .checked_sub(segment_base)
            .filter(|delta| *delta <= PLACE_SEGMENT_DELTA_MAX);
        let (place, wide) = match (seq_delta, segment_delta) {
            (Some(seq_delta), Some(segment_delta)) if len < PLACE_LEN_MASK => (
                (seq_delta << PLACE_SEQ_SHIFT) | (segment_delta << PLACE_SEGMENT_SHIFT) | len,
                None,
            ),
            _ => (
                PLACE_WIDE,
                Some(Wide {
                    seq_created: version.seq_created,
                    segment,
                    len,
                }),
            ),
        };
        let stored = StoredEntry {
            // The low and high halves of the word.
            meta_low: version.meta as u32,
            meta_high: (version.meta >> 32) as u32,
            place,
            offset,
            crc,
            id: version.id,
            prev: version.prev,
            scope: version.scope,
            tag_source: version.tag_source,
            ended: version.ended,
            expiry: version.expiry,
        };
        (stored, wide)
    }

    /// Replaces the entry at `position` (nothing if there is none).
    pub(crate) fn set(&mut self, position: usize, version: &VersionEntry) {
        let (stored, wide) = self.pack(position, version);
        let Some(place) = self.entries.get_mut(position) else {
            return;
        };
        *place = stored;
        match wide {
            Some(wide) => {
                self.wide.insert(position, wide);
            }
            None => {
                if !self.wide.is_empty() {
                    self.wide.remove(&position);
                }
            }
        }
    }

    /// Sets the `prev` of the entry at `position` (nothing if there is none).
    pub(crate) fn set_prev(&mut self, position: usize, prev: u32) {
        if let Some(stored) = self.entries.get_mut(position) {
            stored.prev = prev;
        }
    }

    /// Changes the entry at `position` with `change` (nothing if there is none); returns whether
    /// there was one.
    pub(crate) fn update(&mut self, position: usize, change: impl FnOnce(&mut VersionEntry)) -> bool {
        let Some(mut version) = self.get(position) else {
            return false;
        };
        change(&mut version);
        self.set(position, &version);
        true
    }

    /// Appends an entry; the first of a block sets the block's bases.
    pub(crate) fn push(&mut self, version: &VersionEntry) {
        let position = self.entries.len();
        if position.is_multiple_of(BASE_BLOCK) {
            self.bases.push((version.seq_created, version.location.segment));
        }
        let (stored, wide) = self.pack(position, version);
        self.entries.push(stored);
        if let Some(wide) = wide {
            self.wide.insert(position, wide);
        }
    }

    /// A table of the entries of `chunks`, each of [`CHUNK`] entries but the last.
    #[cfg(test)]
    pub(crate) fn from_chunks(chunks: Vec<Vec<VersionEntry>>) -> Self {
        let mut table = VersionTable::default();
        for chunk in chunks {
            for version in &chunk {
                table.push(version);
            }
        }
        table
    }

    /// Appends the entries of `other` after a whole number of chunks (the entries of a table built
    /// from the chunks that follow this one's); `Err` if this table ends within a chunk.
    pub(crate) fn append(&mut self, other: VersionTable) -> Result<(), String> {
        let offset = self.entries.len();
        if !self.entries.append(other.entries) {
            return Err("a version table appended after a partial chunk".into());
        }
        self.bases.extend(other.bases);
        self.wide
            .extend(other.wide.into_iter().map(|(position, wide)| (position + offset, wide)));
        Ok(())
    }

    /// Every entry, in slot order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = VersionEntry> + '_ {
        (0..self.entries.len()).filter_map(|position| self.get(position))
    }

    /// Entries that keep their sequence number, segment and length in the side table.
    #[cfg(test)]
    pub(crate) fn wide_count(&self) -> usize {
        self.wide.len()
    }

    /// Heap bytes held, allocated capacity included (a side table entry: slot, value and a
    /// control byte, at the table's usual fill).
    fn heap_bytes(&self) -> u64 {
        let wide = self.wide.capacity() * (std::mem::size_of::<(usize, Wide)>() + 1);
        self.entries.heap_bytes() + (self.bases.capacity() * std::mem::size_of::<(u64, u32)>() + wide) as u64
    }
}

/// Bytes per chunk of the name arena; a stored name part (at most 255 bytes) never spans two.
pub(crate) const NAME_CHUNK: usize = 1 << 16;

/// Ids per mark of the name arena: a name is rebuilt from the mark before it, through at most this
/// many names. A divisor of [`CHUNK`], so that the parts from a mark to any name are in one chunk.
const NAME_MARK: usize = 16;
const _: () = assert!(CHUNK.is_multiple_of(NAME_MARK));

/// The longest id name the arena holds (a put's id is at most 128 bytes).
const NAME_MAX: usize = 255;

/// Id names, front-coded. In id order, each name is stored as the bytes it does not share with the
/// previous id's name (at least one), back to back in chunks that never move; a chunk holds whole
/// parts only, and a part that does not fit in the chunk being filled starts the next one (so a
/// part ends its chunk exactly when it ends where the chunk does). Every [`NAME_MARK`]-th name is
/// stored whole, and where it starts is kept. Per id: two bytes (shared and stored lengths) and
/// the stored part, so that sequential and structured ids (`item-00000017`, `s4/chunk-9`) take a
/// few bytes each, and random ones two bytes more than their length.
#[derive(Debug, Clone, Default)]
pub(crate) struct NameArena {
    chunks: Vec<String>,
    /// Per id: bytes its name shares with the previous id's, and bytes stored.
    parts: ChunkVec<[u8; 2]>,
    /// Where the part of id `k * NAME_MARK` starts: chunk << 32 | offset.
    marks: Vec<u64>,
    /// The last id's name, which the next one is coded against.
    last: String,
}

/// A name rebuilt from the arena, on the stack.
pub(crate) struct NameBuf {
    bytes: [u8; NAME_MAX],
    len: usize,
}

impl NameBuf {
    pub(crate) fn new() -> NameBuf {
        NameBuf {
            bytes: [0; NAME_MAX],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Parts are cut at character boundaries, so a rebuilt name is UTF-8.
        std::str::from_utf8(self.bytes.get(..self.len).unwrap_or_default()).unwrap_or("")
    }

    /// Puts `part` after the first `shared` bytes of the name held; false if it cannot be there.
    fn extend(&mut self, shared: usize, part: &[u8]) -> bool {
        if shared > self.len {
            return false;
        }
        let Some(place) = self.bytes.get_mut(shared..shared + part.len()) else {
            return false;
        };
        place.copy_from_slice(part);
        self.len = shared + part.len();
        true
    }
}

/// Bytes `name` shares with `last` at its start, cut at a character boundary and leaving at least
/// one byte of `name`.
fn shared_prefix(last: &str, name: &str) -> usize {
    let mut shared = last
        .bytes()
        .zip(name.bytes())
        .take_while(|(a, b)| a == b)
        .count()
        .min(name.len().saturating_sub(1));
    while !name.is_char_boundary(shared) {
        shared -= 1;
    }
    shared
}

/// A mark of the name arena: where a part starts, as chunk << 32 | offset.
fn mark_of((chunk, offset): (usize, usize)) -> u64 {
    ((chunk as u64) << 32) | offset as u64
}

/// The (chunk, offset) a mark holds.
fn mark_place(mark: u64) -> (usize, usize) {
    (
        usize::try_from(mark >> 32).unwrap_or(usize::MAX),
        (mark & 0xffff_ffff) as usize,
    )
}

/// Where each of consecutive parts, of the stored lengths `lens`, starts in `chunks`, the first at
/// `(chunk, offset)`: a part that ends its chunk is followed by the next chunk's first part. The one
/// statement of the rule the arena fills its chunks by, for everything that reads them.
fn part_places<'a, S: AsRef<str>>(
    chunks: &'a [S],
    (mut chunk, mut offset): (usize, usize),
    lens: impl Iterator<Item = usize> + 'a,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let chunk_len = move |chunk: usize| chunks.get(chunk).map_or(0, |c| c.as_ref().len());
    let mut len_here = chunk_len(chunk);
    lens.map(move |len| {
        if offset == len_here {
            chunk += 1;
            offset = 0;
            len_here = chunk_len(chunk);
        }
        let place = (chunk, offset);
        offset += len;
        place
    })
}

/// The stored length of each of `parts`.
fn stored_lens<'a>(parts: impl Iterator<Item = &'a [u8; 2]> + 'a) -> impl Iterator<Item = usize> + 'a {
    parts.map(|[_, len]| usize::from(*len))
}

/// Rebuilds in `buf` the name whose parts are `parts` (from a mark to it), the first at `mark` in
/// `chunks` (see [`name_pieces`]); empty if they do not fit.
fn rebuild_name<'b, S: AsRef<str>>(chunks: &[S], parts: &[[u8; 2]], mark: u64, buf: &'b mut NameBuf) -> &'b str {
    let bytes = &mut buf.bytes;
    let len = name_pieces(chunks, parts, mark, |at, piece| {
        bytes
            .get_mut(at..at + piece.len())
            .map(|place| place.copy_from_slice(piece))
            .is_some()
    });
    buf.len = len.unwrap_or(0);
    buf.as_str()
}

/// Hands `piece` the parts that the bytes of a name come from, last first: each as the position in
/// the name where it goes and its bytes, until the whole name is covered. `parts` are those of the
/// ids from a mark to the name's, and `mark` where the first of them is in `chunks`. Returns the
/// name's length, or `None` (having stopped) if `piece` says no or the parts do not fit.
fn name_pieces<S: AsRef<str>>(
    chunks: &[S],
    parts: &[[u8; 2]],
    mark: u64,
    mut piece: impl FnMut(usize, &[u8]) -> bool,
) -> Option<usize> {
    if parts.is_empty() || parts.len() > NAME_MARK {
        return None;
    }
    let mut places = [(0usize, 0usize); NAME_MARK];
    for (place, found) in places
        .iter_mut()
        .zip(part_places(chunks, mark_place(mark), stored_lens(parts.iter())))
    {
        *place = found;
    }
    // Backwards, each part gives the bytes from where it starts in its name up to where a later
    // part took over: for sequential names, a few parts give all.
    let &[shared, len] = parts.last()?;
    let total = usize::from(shared) + usize::from(len);
    let mut needed = total;
    for ([shared, _], (chunk, offset)) in parts.iter().zip(places).rev() {
        let shared = usize::from(*shared);
        if shared < needed {
            let bytes = chunks
                .get(chunk)
                .and_then(|c| c.as_ref().as_bytes().get(offset..offset + (needed - shared)))?;
            if !piece(shared, bytes) {
                return None;
            }
            needed = shared;
        }
        if needed == 0 {
            return Some(total);
        }
    }
    None
}

impl NameArena {
    /// Stores the name of the next id (at most [`NAME_MAX`] bytes, cut at a character boundary).
    fn push(&mut self, name: &str) {
        let mut len = name.len().min(NAME_MAX);
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        let name = name.get(..len).unwrap_or("");
        let marked = self.parts.len().is_multiple_of(NAME_MARK);
        let shared = if marked { 0 } else { shared_prefix(&self.last, name) };
        let part = name.get(shared..).unwrap_or("");
        if self
            .chunks
            .last()
            .is_none_or(|chunk| chunk.len() + part.len() > NAME_CHUNK)
        {
            self.chunks.push(String::with_capacity(NAME_CHUNK));
        }
        let chunk = self.chunks.len() - 1;
        let Some(last) = self.chunks.last_mut() else { return };
        let offset = last.len();
        last.push_str(part);
        if marked {
            self.marks.push(mark_of((chunk, offset)));
        }
        self.parts.push([
            u8::try_from(shared).unwrap_or(u8::MAX),
            u8::try_from(part.len()).unwrap_or(u8::MAX),
        ]);
        self.last.clear();
        self.last.push_str(name);
    }

    /// The parts of id number `id`'s name from the mark before it, and that mark.
    fn block(&self, id: u32) -> Option<(&[[u8; 2]], u64)> {
        let id = position(id);
        let &mark = self.marks.get(id / NAME_MARK)?;
        Some((self.parts.run(id - id % NAME_MARK..id + 1), mark))
    }

    /// [`name_pieces`] of id number `id`.
    fn pieces(&self, id: u32, piece: impl FnMut(usize, &[u8]) -> bool) -> Option<usize> {
        let (parts, mark) = self.block(id)?;
        name_pieces(&self.chunks, parts, mark, piece)
    }

    /// Rebuilds the name of id number `id` in `buf`; empty if out of bounds.
    fn name_into<'b>(&self, id: u32, buf: &'b mut NameBuf) -> &'b str {
        match self.block(id) {
            Some((parts, mark)) => rebuild_name(&self.chunks, parts, mark, buf),
            None => {
                buf.len = 0;
                ""
            }
        }
    }

    /// Whether id number `id` is named `name`, compared piece by piece without rebuilding it.
    fn is(&self, id: u32, name: &str) -> bool {
        let name = name.as_bytes();
        let fits = self
            .parts
            .get(position(id))
            .is_some_and(|[shared, len]| usize::from(*shared) + usize::from(*len) == name.len());
        fits && self
            .pieces(id, |at, piece| name.get(at..at + piece.len()) == Some(piece))
            .is_some()
    }

    /// How many names the arena holds.
    fn len(&self) -> usize {
        self.parts.len()
    }

    /// The length of id number `id`'s name.
    fn name_len(&self, id: u32) -> usize {
        self.parts
            .get(position(id))
            .map_or(0, |[shared, len]| usize::from(*shared) + usize::from(*len))
    }

    /// Calls `each` with every id's number and name, in id order.
    fn for_each(&self, mut each: impl FnMut(u32, &str)) {
        let mut buf = NameBuf::new();
        let places = part_places(&self.chunks, (0, 0), stored_lens(self.parts.iter()));
        for (id, ([shared, len], (chunk, offset))) in self.parts.iter().zip(places).enumerate() {
            let part = self
                .chunks
                .get(chunk)
                .and_then(|c| c.as_bytes().get(offset..offset + usize::from(*len)));
            if !part.is_some_and(|part| buf.extend(usize::from(*shared), part)) {
                buf.len = 0;
            }
            each(u32::try_from(id).unwrap_or(u32::MAX), buf.as_str());
        }
    }

    /// A copy of the names a checkpoint stores as the arena holds them: `parts` has the shared and
    /// stored lengths of each id, and the parts are back to back in `chunks`. The layout is checked
    /// by [`IdTable::from_name_parts`] (on another thread, from the same bytes); this only copies it.
    pub(crate) fn from_parts(chunks: &[&str], parts: &[[u8; 2]]) -> NameArena {
        let mut arena = NameArena {
            chunks: chunks
                .iter()
                .map(|text| {
                    let mut chunk = String::with_capacity(NAME_CHUNK);
                    chunk.push_str(text);
                    chunk
                })
                .collect(),
            // Each chunk with room for CHUNK entries, as pushing allocates them.
            parts: ChunkVec::from_chunks(
                parts
                    .chunks(CHUNK)
                    .map(|run| {
                        let mut chunk = Vec::with_capacity(CHUNK);
                        chunk.extend_from_slice(run);
                        chunk
                    })
                    .collect(),
            ),
            marks: Vec::with_capacity(parts.len().div_ceil(NAME_MARK)),
            last: String::new(),
        };
        arena.marks = part_places(chunks, (0, 0), stored_lens(parts.iter()))
            .step_by(NAME_MARK)
            .map(mark_of)
            .collect();
        if let Some(last) = parts.len().checked_sub(1).and_then(|id| u32::try_from(id).ok()) {
            arena.last = arena.name_into(last, &mut NameBuf::new()).to_owned();
        }
        arena
    }

    /// The shared and stored lengths of each id's name, in id order, and the chunks of parts.
    pub(crate) fn parts_and_chunks(&self) -> (impl Iterator<Item = &[u8; 2]> + '_, &[String]) {
        (self.parts.iter(), &self.chunks)
    }

    fn heap_bytes(&self) -> u64 {
        (self.chunks.iter().map(String::capacity).sum::<usize>()
            + self.chunks.capacity() * 24
            + self.parts.heap_bytes() as usize
            + self.marks.capacity() * 8
            + self.last.capacity()) as u64
    }
}

/// Ids per group when a checkpoint's id table is filled in the order of its buckets.
const INSERT_GROUPS: usize = 1 << 8;

/// Fills `by_name` (empty, with its capacity reserved) with the numbers of the ids whose name
/// hashes are `hashes`, in id order; `same_name` tells whether two ids have the same name. The ids
/// are inserted grouped by where their hashes fall in the table, so that the inserts walk the table
/// front to back instead of jumping all over it. Returns the number of an id whose name an earlier
/// id has, if any.
fn fill_lookup(by_name: &mut HashTable<u32>, hashes: &[u64], same_name: impl Fn(u32, u32) -> bool) -> Result<(), u32> {
    // The table's bucket count is a power of two and an id's bucket is its hash's low bits; a
    // wrong guess only costs speed.
    let buckets = (by_name.capacity() / 7 * 8).max(1).next_power_of_two();
    let bits = buckets.trailing_zeros();
    let shift = bits.saturating_sub(INSERT_GROUPS.trailing_zeros());
    let group_of = |hash: u64| ((hash & (buckets as u64 - 1)) >> shift) as usize;
    let mut starts = vec![0u32; INSERT_GROUPS + 1];
    for hash in hashes {
        if let Some(count) = starts.get_mut(group_of(*hash) + 1) {
            *count += 1;
        }
    }
    let mut sum = 0;
    for start in &mut starts {
        sum += *start;
        *start = sum;
    }
    let mut order = vec![(0u64, 0u32); hashes.len()];
    for (id, hash) in hashes.iter().enumerate() {
        if let Some(next) = starts.get_mut(group_of(*hash)) {
            if let Some(place) = order.get_mut(*next as usize) {
                *place = (*hash, u32::try_from(id).unwrap_or(NO_SLOT));
            }
            *next += 1;
        }
    }
    for &(hash, id) in &order {
        // Only ids of the same full hash have their names compared.
        let slot = by_name.entry(
            hash,
            |known| hashes.get(position(*known)) == Some(&hash) && same_name(*known, id),
            |known| hashes.get(position(*known)).copied().unwrap_or(0),
        );
        match slot {
            hashbrown::hash_table::Entry::Occupied(_) => return Err(id),
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                vacant.insert(id);
            }
        }
    }
    crate::parallel::drop_in_background(order);
    Ok(())
}

/// The id half of an index, built from a checkpoint's id names (on its own thread, while the
/// versions are decoded): the id count, the name arena and the lookup table.
pub(crate) struct IdTable {
    /// How many ids the checkpoint names; the lookup's values are their numbers until
    /// [`Index::from_checkpoint`] knows their newest versions.
    count: usize,
    names: NameArena,
    by_name: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    deletes: FastMap<u32, u32>,
}

impl IdTable {
    /// The name chunks of a checkpoint as text: each at most [`NAME_CHUNK`] bytes of UTF-8.
    pub(crate) fn name_chunks_as_text<'a>(chunks: &[&'a [u8]]) -> Result<Vec<&'a str>, String> {
        chunks
            .iter()
            .enumerate()
            .map(|(number, chunk)| {
                if chunk.len() > NAME_CHUNK {
                    return Err(format!(
                        "name chunk {number} holds {} bytes, more than {NAME_CHUNK}",
                        chunk.len()
                    ));
                }
                std::str::from_utf8(chunk).map_err(|_| format!("name chunk {number} is not UTF-8"))
            })
            .collect()
    }

    /// The table of the ids whose names a checkpoint stores as the name arena holds them: `parts`
    /// has, per id in the order of their numbers, the bytes its name shares with the previous id's
    /// name and the bytes stored, and the stored parts are back to back in `chunks` (each filled with
    /// whole parts up to its exact length). An empty part, a part that spans two chunks or splits a
    /// character, a shared length past the previous name or inside a character, a marked id's
    /// name not stored whole, a name longer than 255 bytes and a name listed twice are errors. The
    /// table reads the names from `chunks`; its own copy of them ([`NameArena::from_parts`], made on
    /// another thread meanwhile) is put in with [`IdTable::with_names`].
    pub(crate) fn from_name_parts(chunks: &[&str], parts: &[[u8; 2]]) -> Result<IdTable, String> {
        if parts.len() > IDS_AND_SLOTS_MAX {
            return Err(format!(
                "{} ids, more than the {IDS_AND_SLOTS_MAX} an index holds",
                parts.len()
            ));
        }
        let hasher = foldhash::fast::RandomState::default();
        let mut hashes = Vec::with_capacity(parts.len());
        let mut marks = Vec::with_capacity(parts.len().div_ceil(NAME_MARK));
        let mut name = NameBuf::new();
        let mut end = (0usize, 0usize);
        let places = part_places(chunks, (0, 0), stored_lens(parts.iter()));
        for (id, ([shared, len], (chunk, offset))) in parts.iter().zip(places).enumerate() {
            let (shared, len) = (usize::from(*shared), usize::from(*len));
            if len == 0 {
                return Err(format!("id number {id} has an empty name part"));
            }
            if id.is_multiple_of(NAME_MARK) && shared != 0 {
                return Err(format!("the name of id number {id} is not stored whole"));
            }
            if !name.as_str().is_char_boundary(shared) {
                return Err(format!(
                    "the name of id number {id} shares {shared} bytes of a previous name of {}",
                    name.len
                ));
            }
            let Some(part) = chunks.get(chunk).and_then(|c| c.get(offset..offset + len)) else {
                return Err(format!("the name of id number {id} does not fit its chunk"));
            };
            if !name.extend(shared, part.as_bytes()) {
                return Err(format!("the name of id number {id} is longer than {NAME_MAX} bytes"));
            }
            if id.is_multiple_of(NAME_MARK) {
                marks.push(mark_of((chunk, offset)));
            }
            hashes.push(hasher.hash_one(name.as_str()));
            end = (chunk, offset + len);
        }
        let all_used = match chunks.len().checked_sub(1) {
            None => true,
            Some(last) => end.0 == last && chunks.get(last).is_some_and(|c| end.1 == c.len()),
        };
        if !all_used {
            return Err("the name chunks hold bytes after the last id's name".into());
        }
        let mut table = IdTable {
            count: parts.len(),
            names: NameArena::default(),
            by_name: HashTable::with_capacity(parts.len()),
            hasher,
            deletes: FastMap::default(),
        };
        let name_of = |id: u32, buf: &mut NameBuf| {
            let id = position(id);
            let block = parts.get(id - id % NAME_MARK..=id).zip(marks.get(id / NAME_MARK));
            block.map_or_else(String::new, |(block, mark)| {
                rebuild_name(chunks, block, *mark, buf).to_owned()
            })
        };
        let same_name = |a: u32, b: u32| name_of(a, &mut NameBuf::new()) == name_of(b, &mut NameBuf::new());
        fill_lookup(&mut table.by_name, &hashes, same_name)
            .map_err(|id| format!("id {:?} is listed twice", name_of(id, &mut NameBuf::new())))?;
        crate::parallel::drop_in_background(hashes);
        Ok(table)
    }

    /// The table with its name arena (made from the same chunks it was built from).
    pub(crate) fn with_names(mut self, names: NameArena) -> IdTable {
        self.names = names;
        self
    }

    /// All of [`IdTable::name_chunks_as_text`], [`IdTable::from_name_parts`] and
    /// [`NameArena::from_parts`] on one thread.
    #[cfg(test)]
    pub(crate) fn from_name_chunk_bytes(chunks: &[&[u8]], parts: &[[u8; 2]]) -> Result<IdTable, String> {
        let text = IdTable::name_chunks_as_text(chunks)?;
        Ok(IdTable::from_name_parts(&text, parts)?.with_names(NameArena::from_parts(&text, parts)))
    }

    /// Sets the delete count of id number `id`.
    pub(crate) fn set_deletes(&mut self, id: u32, deletes: u32) -> Result<(), String> {
        if position(id) >= self.count {
            return Err(format!("deleted id number {id} is out of range"));
        }
        if deletes > 0 {
            self.deletes.insert(id, deletes);
        } else {
            self.deletes.remove(&id);
        }
        Ok(())
    }
}

/// Maps values to dense small integers and back.
#[derive(Debug, Clone)]
pub(crate) struct Interner<T> {
    // Rebuilt from `values` when a checkpoint is loaded.
    ids: FastMap<T, u32>,
    values: Vec<T>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            ids: FastMap::default(),
            values: Vec::new(),
        }
    }
}

impl<T: Hash + Eq + Clone> Interner<T> {
    pub(crate) fn intern(&mut self, value: &T) -> u32 {
        self.intern_by(value, || value.clone())
    }

    /// The number of the value equal to `key`, interning `make()` when there is none: nothing is
    /// allocated for a value already interned.
    pub(crate) fn intern_by<Q>(&mut self, key: &Q, make: impl FnOnce() -> T) -> u32
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(id) = self.ids.get(key) {
            return *id;
        }
        let value = make();
        let id = u32::try_from(self.values.len()).unwrap_or(u32::MAX);
        self.ids.insert(value.clone(), id);
        self.values.push(value);
        id
    }

    pub(crate) fn get<Q>(&self, value: &Q) -> Option<u32>
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.ids.get(value).copied()
    }

    pub(crate) fn value(&self, id: u32) -> Option<&T> {
        self.values.get(usize::try_from(id).ok()?)
    }

    /// Every value, in the order of their ids.
    pub(crate) fn values(&self) -> &[T] {
        &self.values
    }

    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }
}

/// The key of a slot in the ordered sets.
pub(crate) fn key_of(slots: &VersionTable, slot: u32) -> (i64, u32) {
    let timestamp = slots
        .timestamp(usize::try_from(slot).unwrap_or(usize::MAX))
        .map_or(i64::MAX, |timestamp| timestamp);
    (timestamp, slot)
}

/// Set entries inserted out of order that are merged into the sorted array at the latest once
/// there are this many (or an eighth of the array, if more).
const DELTA_MERGE_AT: usize = 4096;

/// A run of consecutive slot numbers in a [`SortedSlots`]: its first slot, and the position in the
/// array just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first: u32,
    end: usize,
}

/// Runs per entry, at most, for an array to be kept as runs: from an eighth on, plain slots take
/// less room (a run takes 8 or 16 bytes, a plain slot 4).
const RUNS_PER_ENTRY_MAX: usize = 8;

/// Entries per block of a [`Packed`] array.
const PACK_BLOCK: usize = 64;

/// A full block of a [`Packed`] array: its first slot, and where the gaps to its other 63 slots are.
#[derive(Debug, Clone, Copy)]
struct PackedBlock {
    first: u32,
    /// Position of the block's first word in [`Packed::words`].
    word: u32,
    /// Bits per gap, 0 to 33.
    width: u8,
    /// Whether the gaps are zigzag-coded (some slot of the block is below the one before it).
    signed: bool,
}

/// Slots in blocks of [`PACK_BLOCK`]: each full block is its first slot and the gaps to the next 63
/// (`slot - previous - 1`), bit-packed at the width of the block's largest gap; a block where some
/// slot is below the one before it (keys that arrived out of order) has its gaps zigzag-coded
/// (0, -1, 1, -2, ... as 0, 1, 2, 3, ...). The last block (1 to 64 slots, none only when the array is
/// empty) is kept as plain slots until it is full and another slot comes.
#[derive(Debug, Clone, Default)]
struct Packed {
    blocks: Vec<PackedBlock>,
    words: Vec<u64>,
    tail: Vec<u32>,
}

impl Packed {
    /// `slots` packed.
    fn from_vec(slots: &[u32]) -> Packed {
        let full = slots.len().saturating_sub(1) / PACK_BLOCK;
        let mut packed = Packed {
            blocks: Vec::with_capacity(full),
            ..Packed::default()
        };
        let mut blocks = slots.chunks(PACK_BLOCK);
        for block in blocks.by_ref().take(full) {
            packed.pack(block);
        }
        packed.tail = blocks.next().unwrap_or_default().to_vec();
        packed
    }

    /// Bytes the array needs, without allocation slack.
    fn bytes(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<PackedBlock>() + self.words.len() * 8 + self.tail.len() * 4
    }

    fn len(&self) -> usize {
        self.blocks.len() * PACK_BLOCK + self.tail.len()
    }

    fn last(&self) -> Option<u32> {
        self.tail.last().copied()
    }

    fn push(&mut self, slot: u32) {
        if self.tail.len() == PACK_BLOCK {
            let tail = std::mem::take(&mut self.tail);
            self.pack(&tail);
            self.tail = tail;
            self.tail.clear();
        }
        self.tail.push(slot);
    }

    /// Appends a full block of `slots`.
    fn pack(&mut self, slots: &[u32]) {
        let signed = slots.windows(2).any(|w| w.first() >= w.get(1));
        let gaps = || {
            slots.windows(2).map(move |w| {
                let gap = w
                    .get(1)
                    .zip(w.first())
                    .map_or(0, |(b, a)| i64::from(*b) - i64::from(*a) - 1);
                if signed {
                    ((gap << 1) ^ (gap >> 63)) as u64
                } else {
                    gap as u64
                }
            })
        };
        let width = gaps().map(|gap| 64 - gap.leading_zeros()).max().unwrap_or(0);
        let start = self.words.len();
        let bits = slots.len().saturating_sub(1) * width as usize;
        self.words.resize(start + bits.div_ceil(64), 0);
        for (j, gap) in gaps().enumerate() {
            let at = j * width as usize;
            let (word, shift) = (start + at / 64, at % 64);
            if let Some(low) = self.words.get_mut(word) {
                *low |= gap << shift;
            }
            if shift + width as usize > 64 {
                if let Some(high) = self.words.get_mut(word + 1) {
                    *high |= gap >> (64 - shift);
                }
            }
        }
        self.blocks.push(PackedBlock {
            first: slots.first().copied().unwrap_or(0),
            word: u32::try_from(start).unwrap_or(u32::MAX),
            width: width as u8,
            signed,
        });
    }

    /// The slot after `slot` in `block`, its gap `j` (the one between its slots `j` and `j + 1`)
    /// further.
    fn step(&self, block: &PackedBlock, j: usize, slot: u32) -> u32 {
        let coded = self.gap(block, j);
        let gap = if block.signed {
            ((coded >> 1) as i64) ^ -((coded & 1) as i64)
        } else {
            coded as i64
        };
        (i64::from(slot) + 1 + gap) as u32
    }

    /// Coded gap `j` of `block`.
    fn gap(&self, block: &PackedBlock, j: usize) -> u64 {
        let width = usize::from(block.width);
        if width == 0 {
            return 0;
        }
        let at = j * width;
        let word = block.word as usize + at / 64;
        let shift = at % 64;
        let mut value = self.words.get(word).map_or(0, |w| w >> shift);
        if shift + width > 64 {
            value |= self.words.get(word + 1).map_or(0, |w| w << (64 - shift));
        }
        value & ((1u64 << width) - 1)
    }

    /// The slots of block `number` (the tail after the full blocks) into `out`; returns how many.
    fn decode(&self, number: usize, out: &mut [u32; PACK_BLOCK]) -> usize {
        let Some(block) = self.blocks.get(number) else {
            let count = self.tail.len().min(PACK_BLOCK);
            if let (Some(to), Some(from)) = (out.get_mut(..count), self.tail.get(..count)) {
                to.copy_from_slice(from);
            }
            return count;
        };
        let mut slot = block.first;
        for (j, to) in out.iter_mut().enumerate() {
            if j > 0 {
                slot = self.step(block, j - 1, slot);
            }
            *to = slot;
        }
        PACK_BLOCK
    }

    fn get(&self, position: usize) -> Option<u32> {
        let (number, offset) = (position / PACK_BLOCK, position % PACK_BLOCK);
        let Some(block) = self.blocks.get(number) else {
            return self.tail.get(position - self.blocks.len() * PACK_BLOCK).copied();
        };
        let mut slot = block.first;
        for j in 0..offset {
            slot = self.step(block, j, slot);
        }
        Some(slot)
    }

    /// The first position whose slot `pred` says no to: the blocks by their first slots, then
    /// within the one block where the answer is.
    fn partition_point(&self, mut pred: impl FnMut(u32) -> bool) -> usize {
        let firsts = self.blocks.partition_point(|block| pred(block.first));
        // The tail counts as one more block after the full ones.
        let in_tail = firsts == self.blocks.len() && self.tail.first().is_some_and(|first| pred(*first));
        let Some(number) = (if in_tail { Some(firsts) } else { firsts.checked_sub(1) }) else {
            return 0;
        };
        let mut out = [0u32; PACK_BLOCK];
        let count = self.decode(number, &mut out);
        number * PACK_BLOCK + out.get(..count).unwrap_or_default().partition_point(|slot| pred(*slot))
    }

    fn heap_bytes(&self) -> u64 {
        (self.blocks.capacity() * std::mem::size_of::<PackedBlock>()
            + self.words.capacity() * 8
            + self.tail.capacity() * 4) as u64
    }
}

/// The sorted array of an ordered set: while its slots come in long runs of consecutive numbers (the
/// time set of items added in time order, whose slots are numbered in the order they were added),
/// those runs; else, while that takes less room, packed as gaps between slots ([`Packed`]; the sets
/// of items added in time order, where the slots increase along the array, take a few bits per
/// entry); else the plain slots, which is also the form a purge edits. The positions are the same in
/// every form.
#[derive(Debug, Clone)]
enum SortedSlots {
    Plain(Vec<u32>),
    Runs(Vec<Run>),
    Packed(Packed),
}

impl Default for SortedSlots {
    fn default() -> Self {
        SortedSlots::Runs(Vec::new())
    }
}

impl SortedSlots {
    /// The array of `slots`: as runs if they come in long enough ones, else packed if they increase.
    fn from_vec(slots: Vec<u32>) -> SortedSlots {
        // Counting the runs stops as soon as there are too many (at once for most type sets).
        let most = slots.len() / RUNS_PER_ENTRY_MAX;
        let mut runs = 1;
        for (a, b) in slots.iter().zip(slots.iter().skip(1)) {
            if a.checked_add(1) != Some(*b) {
                runs += 1;
                if runs > most {
                    break;
                }
            }
        }
        if slots.is_empty() || runs > most {
            let packed = Packed::from_vec(&slots);
            return if packed.bytes() <= slots.len() * 4 {
                SortedSlots::Packed(packed)
            } else {
                SortedSlots::Plain(slots)
            };
        }
        let mut list: Vec<Run> = Vec::with_capacity(runs);
        let mut last = None;
        for (at, slot) in slots.into_iter().enumerate() {
            match list.last_mut() {
                Some(run) if last.and_then(|last: u32| last.checked_add(1)) == Some(slot) => run.end = at + 1,
                _ => list.push(Run {
                    first: slot,
                    end: at + 1,
                }),
            }
            last = Some(slot);
        }
        SortedSlots::Runs(list)
    }

    fn len(&self) -> usize {
        match self {
            SortedSlots::Plain(slots) => slots.len(),
            SortedSlots::Runs(runs) => runs.last().map_or(0, |run| run.end),
            SortedSlots::Packed(packed) => packed.len(),
        }
    }

    /// Where run `at` starts.
    fn run_start(runs: &[Run], at: usize) -> usize {
        at.checked_sub(1)
            .and_then(|before| runs.get(before))
            .map_or(0, |run| run.end)
    }

    /// The slot at `position`, which run `at` holds.
    fn slot_in(runs: &[Run], at: usize, position: usize) -> Option<u32> {
        let offset = position.checked_sub(SortedSlots::run_start(runs, at))?;
        runs.get(at)?.first.checked_add(u32::try_from(offset).ok()?)
    }

    fn last(&self) -> Option<u32> {
        match self {
            SortedSlots::Plain(slots) => slots.last().copied(),
            SortedSlots::Runs(runs) => {
                let last = runs.len().checked_sub(1)?;
                let run = runs.get(last)?;
                let count = run.end - SortedSlots::run_start(runs, last);
                Some(run.first + u32::try_from(count - 1).unwrap_or(u32::MAX))
            }
            SortedSlots::Packed(packed) => packed.last(),
        }
    }

    /// The slot at `position`.
    fn get(&self, position: usize) -> Option<u32> {
        match self {
            SortedSlots::Plain(slots) => slots.get(position).copied(),
            SortedSlots::Runs(runs) => {
                SortedSlots::slot_in(runs, runs.partition_point(|run| run.end <= position), position)
            }
            SortedSlots::Packed(packed) => packed.get(position),
        }
    }

    /// Appends `slot`; runs that grow too many per entry are packed (or become plain slots if packing
    /// does not pay).
    fn push(&mut self, slot: u32) {
        let follows = self.last().and_then(|last| last.checked_add(1)) == Some(slot);
        let len = self.len();
        let too_many = match self {
            SortedSlots::Plain(slots) => {
                slots.push(slot);
                false
            }
            SortedSlots::Packed(packed) => {
                packed.push(slot);
                // A block was just packed: it may have been one of wide gaps.
                if packed.tail.len() == 1 && packed.bytes() > packed.len() * 4 {
                    *self = SortedSlots::Plain(self.to_vec());
                }
                false
            }
            SortedSlots::Runs(runs) => {
                match runs.last_mut() {
                    Some(run) if follows => run.end += 1,
                    _ => runs.push(Run {
                        first: slot,
                        end: len + 1,
                    }),
                }
                // Some slack, so that a short array does not turn plain at its first gaps.
                runs.len().saturating_mul(RUNS_PER_ENTRY_MAX) > len + 1 + 64
            }
        };
        if too_many {
            *self = SortedSlots::from_vec(self.to_vec());
        }
    }

    /// The first position whose slot `pred` says no to (`pred` says yes, then no, along the array).
    fn partition_point(&self, mut pred: impl FnMut(u32) -> bool) -> usize {
        match self {
            SortedSlots::Plain(slots) => slots.partition_point(|slot| pred(*slot)),
            SortedSlots::Packed(packed) => packed.partition_point(pred),
            SortedSlots::Runs(_) => {
                let (mut low, mut high) = (0usize, self.len());
                while low < high {
                    let middle = low + (high - low) / 2;
                    if self.get(middle).is_some_and(&mut pred) {
                        low = middle + 1;
                    } else {
                        high = middle;
                    }
                }
                low
            }
        }
    }

    /// The slots at positions `from..to`, in order (or reversed).
    fn iter(&self, from: usize, to: usize) -> SlotIter<'_> {
        let to = to.min(self.len());
        let from = from.min(to);
        match self {
            SortedSlots::Plain(slots) => SlotIter::Plain(slots.get(from..to).unwrap_or_default().iter()),
            SortedSlots::Runs(runs) => SlotIter::Runs {
                runs,
                front: from,
                back: to,
                front_run: runs.partition_point(|run| run.end <= from),
                back_run: runs.partition_point(|run| run.end < to),
            },
            SortedSlots::Packed(packed) => SlotIter::Packed(Box::new(PackedIter {
                packed,
                front: from,
                back: to,
                front_block: (usize::MAX, [0; PACK_BLOCK]),
                back_block: (usize::MAX, [0; PACK_BLOCK]),
            })),
        }
    }

    /// Every slot, in order.
    fn to_vec(&self) -> Vec<u32> {
        match self {
            SortedSlots::Plain(slots) => slots.clone(),
            SortedSlots::Runs(_) | SortedSlots::Packed(_) => self.iter(0, self.len()).collect(),
        }
    }

    /// Keeps the array as plain slots, for editing in place.
    fn make_plain(&mut self) {
        if !matches!(self, SortedSlots::Plain(_)) {
            *self = SortedSlots::Plain(self.to_vec());
        }
    }

    /// The slots, in order, as a vector (the array is left empty).
    fn take_vec(&mut self) -> Vec<u32> {
        match std::mem::take(self) {
            SortedSlots::Plain(slots) => slots,
            other @ (SortedSlots::Runs(_) | SortedSlots::Packed(_)) => other.to_vec(),
        }
    }

    fn heap_bytes(&self) -> u64 {
        match self {
            SortedSlots::Plain(slots) => (slots.capacity() * 4) as u64,
            SortedSlots::Runs(runs) => (runs.capacity() * std::mem::size_of::<Run>()) as u64,
            SortedSlots::Packed(packed) => packed.heap_bytes(),
        }
    }
}

/// Positions `front..back` of a [`Packed`] array, with the last block decoded at either end.
struct PackedIter<'a> {
    packed: &'a Packed,
    front: usize,
    back: usize,
    front_block: (usize, [u32; PACK_BLOCK]),
    back_block: (usize, [u32; PACK_BLOCK]),
}

impl PackedIter<'_> {
    /// The slot at `position`, decoding its block into `cache` unless it is there already.
    fn slot(packed: &Packed, cache: &mut (usize, [u32; PACK_BLOCK]), position: usize) -> Option<u32> {
        let number = position / PACK_BLOCK;
        if cache.0 != number {
            packed.decode(number, &mut cache.1);
            cache.0 = number;
        }
        cache.1.get(position % PACK_BLOCK).copied()
    }
}

/// The slots of a [`SortedSlots`] between two positions, from either end.
enum SlotIter<'a> {
    Plain(std::slice::Iter<'a, u32>),
    Packed(Box<PackedIter<'a>>),
    Runs {
        runs: &'a [Run],
        front: usize,
        back: usize,
        /// The runs holding positions `front` and `back - 1`.
        front_run: usize,
        back_run: usize,
    },
}

impl Iterator for SlotIter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        match self {
            SlotIter::Plain(slots) => slots.next().copied(),
            SlotIter::Runs {
                runs,
                front,
                back,
                front_run,
                ..
            } => {
                if *front >= *back {
                    return None;
                }
                while runs.get(*front_run).is_some_and(|run| run.end <= *front) {
                    *front_run += 1;
                }
                *front += 1;
                SortedSlots::slot_in(runs, *front_run, *front - 1)
            }
            SlotIter::Packed(it) => {
                if it.front >= it.back {
                    return None;
                }
                it.front += 1;
                PackedIter::slot(it.packed, &mut it.front_block, it.front - 1)
            }
        }
    }
}

impl DoubleEndedIterator for SlotIter<'_> {
    fn next_back(&mut self) -> Option<u32> {
        match self {
            SlotIter::Plain(slots) => slots.next_back().copied(),
            SlotIter::Runs {
                runs,
                front,
                back,
                back_run,
                ..
            } => {
                if *front >= *back {
                    return None;
                }
                *back -= 1;
                while *back_run > 0 && SortedSlots::run_start(runs, *back_run) > *back {
                    *back_run -= 1;
                }
                SortedSlots::slot_in(runs, *back_run, *back)
            }
            SlotIter::Packed(it) => {
                if it.front >= it.back {
                    return None;
                }
                it.back -= 1;
                PackedIter::slot(it.packed, &mut it.back_block, it.back)
            }
        }
    }
}

/// An ordered set of (timestamp, slot) keys: a sorted array of slots (their timestamps are read
/// from the slots, which never change; kept as runs of consecutive slots while they come in long
/// ones, see [`SortedSlots`]) plus a small B-tree of keys that arrived out of order. Slots that stop
/// being stored are skipped by readers and purged in bulk.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeySet {
    base: SortedSlots,
    delta: BTreeSet<(i64, u32)>,
    /// Entries of `base` whose slot is no longer stored.
    dead: usize,
}

/// Keys of an ordered set in order, or in reverse.
pub(crate) type Keys<'a> = Box<dyn Iterator<Item = (i64, u32)> + 'a>;

impl KeySet {
    /// Entries, counting those of reclaimed versions not purged yet.
    pub(crate) fn len(&self) -> usize {
        self.base.len() + self.delta.len()
    }

    fn insert(&mut self, slots: &VersionTable, key: (i64, u32)) {
        if self.base.last().is_none_or(|last| key_of(slots, last) < key) {
            self.base.push(key.1);
            return;
        }
        self.delta.insert(key);
        if self.delta.len() >= DELTA_MERGE_AT.max(self.base.len() / 8) {
            self.merge(slots);
        }
    }

    /// Merges the out-of-order keys into the array, dropping slots no longer stored.
    fn merge(&mut self, slots: &VersionTable) {
        let stored = |slot: &u32| slots.is_stored(usize::try_from(*slot).unwrap_or(usize::MAX));
        let mut merged = Vec::with_capacity(self.base.len() + self.delta.len());
        let mut delta = std::mem::take(&mut self.delta).into_iter().peekable();
        for slot in self.base.iter(0, self.base.len()) {
            let key = key_of(slots, slot);
            while let Some(next) = delta.next_if(|next| *next < key) {
                merged.push(next.1);
            }
            merged.push(slot);
        }
        merged.extend(delta.map(|(_, slot)| slot));
        merged.retain(stored);
        self.base = SortedSlots::from_vec(merged);
        self.dead = 0;
    }

    /// Removes a key whose slot is no longer stored (in bulk later, if it is in the array).
    fn remove(&mut self, key: (i64, u32)) {
        if !self.delta.remove(&key) {
            self.dead += 1;
        }
    }

    /// Drops the entries of slots no longer stored among `base[from..from + max]`. Returns how many
    /// entries it looked at and where to go on, or `None` when the array holds no more of them.
    fn purge_step(&mut self, slots: &VersionTable, from: usize, max: usize) -> (usize, Option<usize>) {
        if from >= self.base.len() {
            self.dead = 0;
            return (0, None);
        }
        if self.dead == 0 {
            return (0, None);
        }
        // Edited in place as plain slots; made runs again, if they pay, once the purge is done.
        self.base.make_plain();
        let SortedSlots::Plain(base) = &mut self.base else {
            return (0, None);
        };
        let end = from.saturating_add(max).min(base.len());
        let mut kept = from;
        for at in from..end {
            let Some(&slot) = base.get(at) else { break };
            let stored = slots.is_stored(usize::try_from(slot).unwrap_or(usize::MAX));
            if stored {
                if let Some(place) = base.get_mut(kept) {
                    *place = slot;
                }
                kept += 1;
            }
        }
        base.drain(kept..end);
        self.dead = self.dead.saturating_sub(end - kept);
        if kept >= base.len() {
            self.dead = 0;
            let done = self.base.take_vec();
            self.base = SortedSlots::from_vec(done);
            return (end - from, None);
        }
        (end - from, Some(kept))
    }

    /// The keys with a timestamp in `start..=end`, ascending or (with `reverse`) descending.
    pub(crate) fn range<'a>(&'a self, slots: &'a VersionTable, start: i64, end: i64, reverse: bool) -> Keys<'a> {
        let ts = |slot: u32| key_of(slots, slot).0;
        let from = self.base.partition_point(|slot| ts(slot) < start);
        let to = self.base.partition_point(|slot| ts(slot) <= end).max(from);
        let keys = self.base.iter(from, to).map(move |slot| key_of(slots, slot));
        if self.delta.is_empty() {
            return if reverse { Box::new(keys.rev()) } else { Box::new(keys) };
        }
        let delta = self.delta.range((start, 0)..=(end, u32::MAX)).copied();
        if reverse {
            Box::new(MergeTwo::new(keys.rev(), delta.rev(), true))
        } else {
            Box::new(MergeTwo::new(keys, delta, false))
        }
    }

    /// Every key in order (for checkpoints): the array and the B-tree merged, reclaimed slots left out.
    pub(crate) fn sorted_slots(&self, slots: &VersionTable) -> Vec<u32> {
        if self.delta.is_empty() && self.dead == 0 {
            return self.base.to_vec();
        }
        let mut copy = self.clone();
        copy.merge(slots);
        copy.base.take_vec()
    }

    /// A set from slots already sorted by key (a checkpoint's).
    pub(crate) fn from_sorted(base: Vec<u32>) -> KeySet {
        KeySet {
            base: SortedSlots::from_vec(base),
            delta: BTreeSet::new(),
            dead: 0,
        }
    }

    fn heap_bytes(&self) -> u64 {
        // A B-tree node holds up to 11 keys; at the usual two-thirds fill a key costs its size plus
        // about half again.
        self.base.heap_bytes() + self.delta.len() as u64 * 18
    }
}

/// Two ordered key streams as one.
struct MergeTwo<A: Iterator, B: Iterator> {
    a: std::iter::Peekable<A>,
    b: std::iter::Peekable<B>,
    reverse: bool,
}

impl<A: Iterator<Item = (i64, u32)>, B: Iterator<Item = (i64, u32)>> MergeTwo<A, B> {
    fn new(a: A, b: B, reverse: bool) -> Self {
        MergeTwo {
            a: a.peekable(),
            b: b.peekable(),
            reverse,
        }
    }
}

impl<A: Iterator<Item = (i64, u32)>, B: Iterator<Item = (i64, u32)>> Iterator for MergeTwo<A, B> {
    type Item = (i64, u32);

    fn next(&mut self) -> Option<(i64, u32)> {
        let take_a = match (self.a.peek(), self.b.peek()) {
            (Some(a), Some(b)) => (a < b) != self.reverse,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if take_a {
            self.a.next()
        } else {
            self.b.next()
        }
    }
}

/// The whole in-memory state of a store: index, type registry and the segments readers use.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// Id names, by id number.
    names: NameArena,
    /// Per id, found by the hash of its name: the slot of its newest version still in the index
    /// (older ones follow `prev`, and the entry names the id's number), or, for an id with none,
    /// [`ID_TAG`] | its number.
    by_name: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// How many times each id deleted at least once was deleted: its current history is that
    /// generation (ids not here: generation 0).
    deletes: FastMap<u32, u32>,
    pub(crate) slots: VersionTable,
    pub(crate) by_type: Vec<KeySet>,
    pub(crate) by_scope: Vec<KeySet>,
    pub(crate) by_time: KeySet,
    pub(crate) kinds: Interner<Box<str>>,
    pub(crate) scopes: Interner<Scope>,
    /// Session scopes by session id, to find a scope's number without allocating.
    session_scopes: FastMap<Box<str>, u32>,
    pub(crate) sources: Interner<Box<str>>,
    pub(crate) registry: TypeRegistry,
    pub(crate) segments: BTreeMap<u32, Arc<Segment>>,
    /// The last published sequence number: views at or below it are consistent.
    pub(crate) seq: u64,
    /// Ids with a version that is visible now (ignoring expiry).
    pub(crate) live_ids: u64,
    /// Pinned snapshots by name.
    pub(crate) pins: BTreeMap<String, PinInfo>,
    /// Slots compaction emptied.
    pub(crate) forgotten: u64,
    /// How many times [`Index::forget`] ran: a lookup grown off the lock before one is stale.
    head_changes: u64,
    /// The expiries and generations that do not fit in their version entries (see [`Rare`]).
    rare: Vec<Rare>,
    /// What the writer applied ahead of `seq` (see [`Unpublished`]).
    pub(crate) unpublished: Unpublished,
}

/// A bulk group the writer applied to the index while its fsync runs, before publishing it.
///
/// Its versions have sequence numbers above [`Index::seq`], so no view sees them, and the versions
/// they supersede stay visible to every view: readers need nothing more. What counts the index as a
/// whole needs this: statistics leave these versions and ids out, and a checkpoint waits until the
/// group is published (or refuses, once its fsync failed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Unpublished {
    /// Versions appended.
    pub(crate) versions: u64,
    /// Ids that gained a live version.
    pub(crate) live_ids: u64,
    /// The group's fsync failed: it will never be published (the store is poisoned).
    pub(crate) failed: bool,
}

impl Unpublished {
    /// Whether the index holds nothing beyond its sequence number.
    pub(crate) fn is_none(&self) -> bool {
        *self == Unpublished::default()
    }
}

/// Where a stepwise purge of the ordered sets has got to ([`Index::purge_sets_step`]): the set (the
/// time set, then the type sets, then the scope sets) and the position in its array.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PurgeCursor {
    set: usize,
    at: usize,
}

/// A pinned snapshot as the log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PinInfo {
    pub(crate) seq: u64,
    pub(crate) taken_at: i64,
    pub(crate) session: Option<Arc<str>>,
}

/// A larger id lookup built off the index write lock ([`Index::grown_lookup`]).
pub(crate) struct GrownLookup {
    table: HashTable<u32>,
    /// [`Index::head_changes`] when it was built.
    head_changes: u64,
}

/// What a view at some sequence number sees of one id.
pub(crate) struct Visible {
    pub(crate) slot: u32,
    pub(crate) version: VersionEntry,
}

fn position(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// The id number a value of the id lookup stands for (see [`Index::by_name`]).
#[inline]
fn id_of_value(slots: &VersionTable, value: u32) -> Option<u32> {
    if value & ID_TAG != 0 {
        Some(value & !ID_TAG)
    } else {
        slots.id_at(position(value))
    }
}

/// Whether a value of the id lookup stands for the id named `name`.
fn value_is_named(slots: &VersionTable, names: &NameArena, value: u32, name: &str) -> bool {
    id_of_value(slots, value).is_some_and(|id| names.is(id, name))
}

/// Turns a lookup that holds id numbers into one that holds each id's value, given each id's
/// newest version by number ([`NO_SLOT`] for none).
fn numbers_to_values(table: &mut HashTable<u32>, heads: &[u32]) {
    for value in table.iter_mut() {
        let id = *value;
        *value = value_of_head(id, heads.get(position(id)).copied().unwrap_or(NO_SLOT));
    }
}

/// The newest version slot a value of the id lookup gives ([`NO_SLOT`] for an id with none).
fn head_of_value(value: u32) -> u32 {
    if value & ID_TAG != 0 {
        NO_SLOT
    } else {
        value
    }
}

/// The value of the id lookup for id `id` whose newest version is `head` ([`NO_SLOT`] for none).
fn value_of_head(id: u32, head: u32) -> u32 {
    if head == NO_SLOT {
        ID_TAG | id
    } else {
        head
    }
}

impl Index {
    pub(crate) fn slot(&self, slot: u32) -> Option<VersionEntry> {
        self.slots.get(position(slot))
    }

    /// The newest segment's number and first seq, when it starts past the next batch's seq (the
    /// index's + 1): while a group that sealed a segment in its middle is not yet published, and
    /// never in a store at rest.
    pub(crate) fn newest_segment_ahead(&self) -> Option<(u32, u64)> {
        let (number, newest) = self.segments.iter().next_back()?;
        (newest.base_seq > self.seq.saturating_add(1)).then_some((*number, newest.base_seq))
    }

    /// The number of ids the index knows (deleted or not).
    pub(crate) fn id_count(&self) -> usize {
        self.names.len()
    }

    /// Whether the index knows id number `id`.
    pub(crate) fn has_id(&self, id: u32) -> bool {
        position(id) < self.id_count()
    }

    /// The number of id `name` and the slot of its newest version ([`NO_SLOT`] for none), if the
    /// index knows it. The lookup's value leads to the newest version's entry, which names the
    /// id: the name is compared while that entry is read.
    fn id_and_head(&self, name: &str) -> Option<(u32, u32)> {
        let hash = self.hasher.hash_one(name);
        let mut found = None;
        self.by_name.find(hash, |&value| {
            let id = id_of_value(&self.slots, value);
            found = id.map(|id| (id, head_of_value(value)));
            id.is_some_and(|id| self.names.is(id, name))
        })?;
        found
    }

    /// Whether the index knows id `name` (deleted or not).
    pub(crate) fn knows_id(&self, name: &str) -> bool {
        self.id_and_head(name).is_some()
    }

    /// The number of id `name`, if the index knows it.
    #[cfg(test)]
    pub(crate) fn id_number(&self, name: &str) -> Option<u32> {
        self.id_and_head(name).map(|(id, _)| id)
    }

    /// The hash of id number `id`'s name.
    fn id_hash(&self, id: u32) -> u64 {
        self.hasher.hash_one(self.names.name_into(id, &mut NameBuf::new()))
    }

    /// The slot of id number `id`'s newest version ([`NO_SLOT`] for none or an unknown id).
    fn head_of(&self, id: u32) -> u32 {
        if !self.has_id(id) {
            return NO_SLOT;
        }
        self.head_by_hash(id, self.id_hash(id))
    }

    /// The slot of id number `id`'s newest version, its name hashing to `hash`.
    fn head_by_hash(&self, id: u32, hash: u64) -> u32 {
        self.by_name
            .find(hash, |&value| id_of_value(&self.slots, value) == Some(id))
            .map_or(NO_SLOT, |&value| head_of_value(value))
    }

    /// Makes `head` ([`NO_SLOT`] for none) the newest version of id number `id`, whose name hashes
    /// to `hash`.
    fn set_head(&mut self, id: u32, hash: u64, head: u32) {
        let slots = &self.slots;
        if let Some(value) = self
            .by_name
            .find_mut(hash, |&value| id_of_value(slots, value) == Some(id))
        {
            *value = value_of_head(id, head);
        }
    }

    /// The length of id number `id`'s name.
    pub(crate) fn id_name_len(&self, id: u32) -> usize {
        self.names.name_len(id)
    }

    /// The name arena (for checkpoints, which store it as it is).
    pub(crate) fn name_arena(&self) -> &NameArena {
        &self.names
    }

    /// Calls `each` with every id's number and name, in id order.
    #[cfg(test)]
    pub(crate) fn for_each_id_name(&self, each: impl FnMut(u32, &str)) {
        self.names.for_each(each);
    }

    /// Whether id number `id` is named `name`.
    pub(crate) fn id_name_is(&self, id: u32, name: &str) -> bool {
        self.names.is(id, name)
    }

    /// The name of id number `id` rebuilt in `buf` (empty if there is no such id).
    pub(crate) fn id_name_into<'b>(&self, id: u32, buf: &'b mut NameBuf) -> &'b str {
        self.names.name_into(id, buf)
    }

    /// Whether every frame of sealed segment `number` is published. The writer seals a segment in
    /// the middle of a group when the group does not fit in it; until the group is published, the
    /// index does not know (or, for a bulk group being synced, does not yet publish) the versions
    /// in that segment's last frames, so a rewrite would move records the index cannot follow.
    pub(crate) fn segment_published(&self, number: u32) -> bool {
        // The segment's frames come before the next one's first frame.
        let Some(after) = number.checked_add(1) else {
            return false;
        };
        self.segments
            .range(after..)
            .next()
            .is_some_and(|(_, next)| next.base_seq <= self.seq.saturating_add(1))
    }

    /// The name of id number `id` (empty if there is no such id); [`Index::id_name_is`] and
    /// [`Index::id_name_into`] do not allocate.
    pub(crate) fn id_name(&self, id: u32) -> String {
        self.names.name_into(id, &mut NameBuf::new()).to_owned()
    }

    /// The versions of id number `id` still in the index, newest first.
    pub(crate) fn versions_of(&self, id: u32) -> impl Iterator<Item = (u32, VersionEntry)> + '_ {
        self.versions_from(self.head_of(id))
    }

    /// The versions from slot `head` down its chain, newest first.
    fn versions_from(&self, head: u32) -> impl Iterator<Item = (u32, VersionEntry)> + '_ {
        let mut next = head;
        std::iter::from_fn(move || {
            let slot = next;
            let version = self.slot(slot)?;
            next = version.prev;
            Some((slot, version))
        })
    }

    /// The version of `name` a view at `seq` sees, if any.
    pub(crate) fn visible(&self, name: &str, seq: u64) -> Option<Visible> {
        let (_, head) = self.id_and_head(name)?;
        self.versions_from(head)
            .find(|(_, version)| self.visible_at(version, seq))
            .map(|(slot, version)| Visible { slot, version })
    }

    /// The version's expiry, generation, source and end, from its entry or from the overflow table.
    pub(crate) fn rare_of(&self, version: &VersionEntry) -> Rare {
        version
            .rare_inline()
            .unwrap_or_else(|at| self.rare.get(at).copied().unwrap_or(Rare::open(NEVER_EXPIRES, 0, 0)))
    }

    /// When the version expires ([`NEVER_EXPIRES`] for never).
    pub(crate) fn expires_at(&self, version: &VersionEntry) -> i64 {
        self.rare_of(version).expires_at
    }

    /// Whether the version has expired at time `now`.
    pub(crate) fn expired_at(&self, version: &VersionEntry, now: i64) -> bool {
        self.expires_at(version) <= now
    }

    /// How many deletes of the version's id came before it: versions of one history share it.
    pub(crate) fn generation(&self, version: &VersionEntry) -> u32 {
        self.rare_of(version).generation
    }

    /// The version's source number.
    pub(crate) fn source_of(&self, version: &VersionEntry) -> u32 {
        self.rare_of(version).source
    }

    /// The sequence number of the batch that ended the version, [`SEQ_OPEN`] while it is open.
    pub(crate) fn seq_ended(&self, version: &VersionEntry) -> u64 {
        self.rare_of(version).seq_ended
    }

    /// Whether nothing has ended the version yet.
    pub(crate) fn is_open(&self, version: &VersionEntry) -> bool {
        self.seq_ended(version) == SEQ_OPEN
    }

    /// Whether a view at `seq` sees the version: `seq_created <= seq < seq_ended`.
    #[inline]
    pub(crate) fn visible_at(&self, version: &VersionEntry, seq: u64) -> bool {
        version
            .visible_inline(seq)
            .unwrap_or_else(|| version.seq_created <= seq && seq < self.seq_ended(version))
    }

    /// Sets the version's expiry, generation, source and end, in the entry or, if they do not all
    /// fit, in the overflow table.
    fn set_rare(&mut self, version: &mut VersionEntry, rare: Rare) {
        if let Some(rare) = version.set_rare_inline(rare) {
            version.set_overflow(u32::try_from(self.rare.len()).unwrap_or(u32::MAX));
            self.rare.push(rare);
        }
    }

    /// Ends the version in `slot` at `seq` if it is open; returns whether it was, and whether it is
    /// retired.
    fn end_version(&mut self, slot: u32, seq: u64) -> Option<bool> {
        let version = self.slots.get(position(slot))?;
        let mut rare = match version.rare_inline() {
            Ok(rare) => rare,
            Err(at) => {
                let rare = self.rare.get_mut(at)?;
                if rare.seq_ended != SEQ_OPEN {
                    return None;
                }
                rare.seq_ended = seq;
                return Some(version.is_retired());
            }
        };
        if rare.seq_ended != SEQ_OPEN {
            return None;
        }
        rare.seq_ended = seq;
        let mut ended = version;
        self.set_rare(&mut ended, rare);
        self.slots.set(position(slot), &ended);
        Some(version.is_retired())
    }

    /// The versions of the id's current history (since its last delete), newest first.
    pub(crate) fn current_history<'a>(&'a self, name: &str) -> impl Iterator<Item = VersionEntry> + 'a {
        let found = self.id_and_head(name);
        let generation = found.map_or(0, |(id, _)| self.deletes_of(id));
        found
            .into_iter()
            .flat_map(|(_, head)| self.versions_from(head))
            .map(|(_, version)| version)
            .filter(move |version| self.generation(version) == generation)
    }

    /// A new id lookup with room for `more` ids besides those known, when adding that many would
    /// make the lookup grow; `None` while there is room. Growing in place rehashes every id under the
    /// index write lock, with every reader waiting (81 ms at 917,504 ids here); this copy is built by
    /// the writer thread under a read lock, as a checkpoint's is loaded, and swapped in with
    /// [`Index::install_lookup`].
    pub(crate) fn grown_lookup(&self, more: usize) -> Option<GrownLookup> {
        let needed = self.by_name.len().saturating_add(more);
        if needed <= self.by_name.capacity() {
            return None;
        }
        let mut table = HashTable::new();
        // A size past what can be allocated gets no copy: the lookup then grows in place. The table
        // is empty, so reserving never rehashes.
        table
            .try_reserve(needed.max(self.by_name.capacity().saturating_mul(2)), |_: &u32| 0)
            .ok()?;
        let mut hashes = Vec::with_capacity(self.id_count());
        self.names.for_each(|_, name| hashes.push(self.hasher.hash_one(name)));
        let names = &self.names;
        let same_name = |a: u32, b: u32| {
            let mut buf = NameBuf::new();
            names.is(b, names.name_into(a, &mut buf))
        };
        fill_lookup(&mut table, &hashes, same_name).ok()?;
        crate::parallel::drop_in_background(hashes);
        // Filled with id numbers; each becomes the id's value in place.
        let heads = self.heads();
        numbers_to_values(&mut table, &heads);
        crate::parallel::drop_in_background(heads);
        Some(GrownLookup {
            table,
            head_changes: self.head_changes,
        })
    }

    /// Each id's newest version in the index ([`NO_SLOT`] for none), by id number, from one pass
    /// over the versions in slot order: a version is pushed as its id's newest, and only
    /// [`Index::forget`] takes one out of its chain.
    fn heads(&self) -> Vec<u32> {
        let mut heads = vec![NO_SLOT; self.id_count()];
        for (slot, version) in self.slots.iter().enumerate() {
            if version.state() != VersionState::Forgotten {
                if let Some(head) = heads.get_mut(position(version.id)) {
                    *head = u32::try_from(slot).unwrap_or(NO_SLOT);
                }
            }
        }
        heads
    }

    /// Puts in a lookup from [`Index::grown_lookup`], unless ids were added since it was built (then
    /// it would miss them) or compaction changed an id's newest version (then it would hold the
    /// old one); the lookup in place is kept then. Returns whether it was put in.
    pub(crate) fn install_lookup(&mut self, lookup: GrownLookup) -> bool {
        if lookup.table.len() != self.id_count() || lookup.head_changes != self.head_changes {
            return false;
        }
        let old = std::mem::replace(&mut self.by_name, lookup.table);
        crate::parallel::drop_in_background(old);
        true
    }

    /// Makes `slot` the newest version of id `name` (an id the index does not know gets the next
    /// number); returns the id's number and its newest version before ([`NO_SLOT`] for none).
    fn push_head(&mut self, name: &str, slot: u32) -> (u32, u32) {
        let hash = self.hasher.hash_one(name);
        let (names, slots) = (&self.names, &self.slots);
        let known = self
            .by_name
            .find_mut(hash, |&value| value_is_named(slots, names, value, name));
        if let Some(value) = known {
            let (id, head) = (id_of_value(slots, *value).unwrap_or(0), head_of_value(*value));
            *value = slot;
            return (id, head);
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(name);
        let (names, hasher, slots) = (&self.names, &self.hasher, &self.slots);
        // Growing in place (when no grown copy was put in first) rehashes the ids known before.
        self.by_name.insert_unique(hash, slot, |&value| {
            let id = id_of_value(slots, value).unwrap_or(0);
            hasher.hash_one(names.name_into(id, &mut NameBuf::new()))
        });
        (id, NO_SLOT)
    }

    /// Every id deleted at least once, with how many times, in no order.
    pub(crate) fn deleted_ids(&self) -> Vec<(u32, u32)> {
        self.deletes.iter().map(|(id, deletes)| (*id, *deletes)).collect()
    }

    /// How many times id number `id` was deleted.
    pub(crate) fn deletes_of(&self, id: u32) -> u32 {
        self.deletes.get(&id).copied().unwrap_or(0)
    }

    /// The number of a scope, interning it if new, without allocating for a known one.
    fn intern_scope(&mut self, scope: ScopeView<'_>) -> u32 {
        match scope {
            ScopeView::Session(id) => {
                if let Some(number) = self.session_scopes.get(id) {
                    return *number;
                }
                let number = self.scopes.intern(&Scope::Session(id.to_owned()));
                self.session_scopes.insert(Box::from(id), number);
                number
            }
            other => self.scopes.intern(&other.to_scope()),
        }
    }

    /// Appends a version of id `name` created by batch `seq`, expiring at `expires_at`, from source
    /// number `source`; it ends the id's open version.
    fn push_version(&mut self, seq: u64, name: &str, mut version: VersionEntry, expires_at: i64, source: u32) -> u32 {
        let slot = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        // The entry is pushed below, before anything reads the lookup again.
        let (id, head) = self.push_head(name, slot);
        version.id = id;
        version.prev = head;
        let generation = self.deletes.get(&id).copied().unwrap_or(0);
        self.set_rare(&mut version, Rare::open(expires_at, generation, source));
        let ended_live = self.end_version(version.prev, seq).is_some_and(|retired| !retired);
        match (ended_live, version.is_retired()) {
            (false, false) => self.live_ids += 1,
            (true, true) => self.live_ids = self.live_ids.saturating_sub(1),
            _ => {}
        }
        self.slots.push(&version);
        slot
    }

    /// Records a new version stored at `location` by the batch with sequence number `seq`.
    pub(crate) fn apply_put(&mut self, seq: u64, put: &PutView<'_>, location: Location) {
        let kind = u16::try_from(self.kinds.intern_by(put.kind, || Box::from(put.kind))).unwrap_or(u16::MAX);
        let scope = self.intern_scope(put.scope);
        let source = self.sources.intern_by(put.source, || Box::from(put.source));
        let slot = self.push_version(
            seq,
            put.id,
            VersionEntry {
                seq_created: seq,
                location,
                scope,
                ..VersionEntry::default()
            }
            .with_meta(put.timestamp, kind, VersionState::Stored)
            .with_version(put.version),
            put.expires_at().unwrap_or(NEVER_EXPIRES),
            source,
        );
        let key = (put.timestamp, slot);
        let kind_index = usize::from(kind);
        if self.by_type.len() <= kind_index {
            self.by_type.resize_with(kind_index + 1, KeySet::default);
        }
        if let Some(set) = self.by_type.get_mut(kind_index) {
            set.insert(&self.slots, key);
        }
        let scope_index = position(scope);
        if self.by_scope.len() <= scope_index {
            self.by_scope.resize_with(scope_index + 1, KeySet::default);
        }
        if let Some(set) = self.by_scope.get_mut(scope_index) {
            set.insert(&self.slots, key);
        }
        self.by_time.insert(&self.slots, key);
    }

    /// Records a retired version (content reclaimed, identity remembered) replayed from the log.
    pub(crate) fn apply_retired(&mut self, seq: u64, id: &str, version: &str, location: Location) {
        self.push_version(
            seq,
            id,
            VersionEntry {
                seq_created: seq,
                location,
                ..VersionEntry::default()
            }
            .with_meta(0, 0, VersionState::Retired)
            .with_version(version),
            NEVER_EXPIRES,
            0,
        );
    }

    /// Records a tombstone of `name` by the batch `seq`; returns whether the id had a current history.
    pub(crate) fn apply_delete(&mut self, seq: u64, name: &str) -> bool {
        if self.current_history(name).next().is_none() {
            return false;
        }
        let Some((id, latest)) = self.id_and_head(name) else {
            return false;
        };
        *self.deletes.entry(id).or_insert(0) += 1;
        if self.end_version(latest, seq) == Some(false) {
            self.live_ids = self.live_ids.saturating_sub(1);
        }
        true
    }

    /// An index from a checkpoint's tables: `ids` built from its id names (with their delete
    /// counts set), and its versions in slot order. Each id's chain of versions is rebuilt here, which
    /// also checks that every id's versions come in the order they were created.
    pub(crate) fn from_checkpoint(
        seq: u64,
        ids: IdTable,
        slots: VersionTable,
        rare: Vec<Rare>,
        sets: (Vec<KeySet>, Vec<KeySet>, KeySet),
        tables: (Interner<Box<str>>, Interner<Scope>, Interner<Box<str>>),
    ) -> Result<Index, String> {
        if slots.len() > IDS_AND_SLOTS_MAX {
            return Err(format!(
                "{} versions, more than the {IDS_AND_SLOTS_MAX} an index holds",
                slots.len()
            ));
        }
        if ids.names.len() != ids.count {
            return Err(format!("{} id names for {} ids", ids.names.len(), ids.count));
        }
        // Each id's newest version so far, while the chains are rebuilt.
        let mut heads = vec![NO_SLOT; ids.count];
        let mut index = Index {
            seq,
            names: ids.names,
            by_name: ids.by_name,
            hasher: ids.hasher,
            deletes: ids.deletes,
            rare,
            ..Index::default()
        };
        index.slots = slots;
        let mut live_ids = 0u64;
        for at in 0..index.slots.len() {
            let Some(version) = index.slots.get(at) else {
                break;
            };
            let head = heads
                .get_mut(position(version.id))
                .ok_or_else(|| format!("version {at}: id number {} is out of range", version.id))?;
            let prev = *head;
            if let Some(before) = index.slots.get(position(prev)) {
                if before.seq_created > version.seq_created {
                    return Err(format!("version {at}: its id's versions are out of order"));
                }
            }
            *head = u32::try_from(at).unwrap_or(NO_SLOT);
            index.slots.set_prev(at, prev);
            if version.is_stored() && index.is_open(&version) {
                live_ids += 1;
            }
        }
        // The lookup holds id numbers so far: each becomes the id's value.
        numbers_to_values(&mut index.by_name, &heads);
        crate::parallel::drop_in_background(heads);
        index.live_ids = live_ids;
        (index.by_type, index.by_scope, index.by_time) = sets;
        let (kinds, scopes, sources) = tables;
        index.session_scopes = scopes
            .values()
            .iter()
            .enumerate()
            .filter_map(|(number, scope)| Some((Box::from(scope.session_id()?), u32::try_from(number).ok()?)))
            .collect();
        index.kinds = kinds;
        index.scopes = scopes;
        index.sources = sources;
        Ok(index)
    }

    /// Removes a version no longer stored from the ordered sets (from their arrays in bulk, at the
    /// next [`Index::purge_sets`]).
    pub(crate) fn unlink_from_sets(&mut self, slot: u32) {
        let Some(version) = self.slot(slot) else { return };
        let key = (version.timestamp(), slot);
        let (kind, scope) = (usize::from(version.kind()), position(version.scope));
        if let Some(set) = self.by_type.get_mut(kind) {
            set.remove(key);
        }
        if let Some(set) = self.by_scope.get_mut(scope) {
            set.remove(key);
        }
        self.by_time.remove(key);
    }

    /// Drops from the sets' arrays every entry [`Index::unlink_from_sets`] marked, in one go.
    #[cfg(test)]
    pub(crate) fn purge_sets(&mut self) {
        let mut cursor = Some(PurgeCursor::default());
        while let Some(at) = cursor {
            cursor = self.purge_sets_step(at, usize::MAX);
        }
    }

    /// Purges the sets' arrays as [`Index::purge_sets`] does, but only about `max` entries from
    /// `cursor` on, so that a caller can release the index lock between steps (readers skip the
    /// entries of versions no longer stored meanwhile). Returns where to go on, or `None` when done.
    pub(crate) fn purge_sets_step(&mut self, mut cursor: PurgeCursor, max: usize) -> Option<PurgeCursor> {
        let slots = &self.slots;
        let types = self.by_type.len();
        let mut budget = max.max(1);
        while budget > 0 {
            let set = match cursor.set {
                0 => Some(&mut self.by_time),
                n if n <= types => self.by_type.get_mut(n - 1),
                n => self.by_scope.get_mut(n - 1 - types),
            }?;
            let (looked, next) = set.purge_step(slots, cursor.at, budget);
            // An untouched set still costs a little: count it as one entry.
            budget = budget.saturating_sub(looked.max(1));
            cursor = match next {
                Some(at) => PurgeCursor { set: cursor.set, at },
                None => PurgeCursor {
                    set: cursor.set + 1,
                    at: 0,
                },
            };
        }
        Some(cursor)
    }

    /// Compaction moved a version's record (stored or retired) to `location`.
    pub(crate) fn relocate(&mut self, slot: u32, location: Location) {
        self.slots.update(position(slot), |version| version.location = location);
    }

    /// Compaction reclaimed a version's content but the store still remembers its identity; the
    /// retired record is at `location`.
    /// Its entries stay in the ordered sets (readers skip versions that are not stored) until
    /// [`Index::unlink_from_sets`]; returns whether it was stored (so has entries there).
    pub(crate) fn retire(&mut self, slot: u32, location: Location) -> bool {
        let Some(mut version) = self.slots.get(position(slot)) else {
            return false;
        };
        let was_stored = version.is_stored();
        if was_stored && self.is_open(&version) {
            self.live_ids = self.live_ids.saturating_sub(1);
        }
        version.set_state(VersionState::Retired);
        version.location = location;
        self.slots.set(position(slot), &version);
        was_stored
    }

    /// Compaction dropped every trace of a version of a closed history.
    /// As with [`Index::retire`], its set entries are unlinked later; returns whether it was stored.
    pub(crate) fn forget(&mut self, slot: u32) -> bool {
        let Some(mut version) = self.slots.get(position(slot)) else {
            return false;
        };
        let was_stored = version.is_stored();
        version.set_state(VersionState::Forgotten);
        self.head_changes += 1;
        let (id, prev) = (version.id, version.prev);
        version.prev = NO_SLOT;
        self.slots.set(position(slot), &version);
        // Take the slot out of its id's chain.
        let mut newer = None;
        let hash = self.id_hash(id);
        let mut at = self.head_by_hash(id, hash);
        while at != NO_SLOT && at != slot {
            newer = Some(at);
            at = self.slot(at).map_or(NO_SLOT, |v| v.prev);
        }
        if at == slot {
            match newer {
                Some(newer) => {
                    self.slots.set_prev(position(newer), prev);
                }
                None => self.set_head(id, hash, prev),
            }
        }
        self.forgotten += 1;
        was_stored
    }

    /// The heap bytes the index uses (allocated capacity included), from its parts.
    pub(crate) fn estimated_bytes(&self) -> u64 {
        // A hash table entry: the 4-byte id plus one control byte, over the allocated buckets.
        let by_name = self.by_name.capacity() as u64 * 8 / 7 * 5;
        let sets = self.by_time.heap_bytes()
            + self
                .by_type
                .iter()
                .chain(self.by_scope.iter())
                .map(KeySet::heap_bytes)
                .sum::<u64>();
        let rare = (self.rare.capacity() * std::mem::size_of::<Rare>()) as u64;
        // A deleted id's count: key and value plus a control byte, at the table's usual fill.
        let deletes = self.deletes.capacity() as u64 * 9;
        self.slots.heap_bytes() + self.names.heap_bytes() + by_name + sets + rare + deletes
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn put<'a>(id: &'a str, version: &'a str, timestamp: i64) -> PutView<'a> {
        PutView {
            id,
            kind: "message",
            version,
            scope: ScopeView::GlobalWritable,
            source: "src",
            timestamp,
            ttl_seconds: None,
            confidence: None,
            hash: [0; 32],
            content: b"null",
            compressed: false,
        }
    }

    const HERE: Location = Location {
        segment: 1,
        offset: 32,
        len: 10,
        crc: 0,
    };

    #[test]
    fn a_sealed_segment_counts_as_published_once_the_frames_before_the_next_one_are() {
        let disk = crate::storage::SimDisk::new();
        let dir = std::path::Path::new("/sim/index");
        crate::storage::Storage::create_dir_all(&disk, dir).expect("dir");
        let mut index = Index::default();
        // Segment 1 holds frames 1..=4; segment 2 starts at frame 5 and is the active one.
        for (number, base_seq) in [(1, 1), (2, 5)] {
            let made = crate::log::writer::create_segment(&disk, dir, number, base_seq).expect("segment");
            index.segments.insert(number, Arc::clone(&made.segment));
        }
        index.seq = 3;
        assert!(!index.segment_published(1), "frame 4 is written but not published");
        index.seq = 4;
        assert!(index.segment_published(1));
        assert!(!index.segment_published(2), "the active segment has no next one");
        assert!(!index.segment_published(7), "no such segment");
    }

    fn visible_tag(index: &Index, name: &str, seq: u64) -> Option<u16> {
        index.visible(name, seq).map(|v| v.version.version_tag())
    }

    #[test]
    fn versions_end_where_the_next_begins() {
        let mut index = Index::default();
        index.apply_put(1, &put("a", "1", 10), HERE);
        index.apply_put(2, &put("a", "2", 5), HERE);
        assert_eq!(visible_tag(&index, "a", 1), Some(version_tag("1")));
        assert_eq!(visible_tag(&index, "a", 2), Some(version_tag("2")));
        assert!(index.visible("a", 0).is_none());
        assert_eq!(index.live_ids, 1);
        assert!(index.apply_delete(3, "a"));
        assert!(index.visible("a", 3).is_none());
        assert_eq!(visible_tag(&index, "a", 2), Some(version_tag("2")));
        assert_eq!(index.current_history("a").count(), 0);
        assert!(!index.apply_delete(4, "a"), "a second delete finds no history");
        index.apply_put(5, &put("a", "1", 1), HERE);
        assert_eq!(index.current_history("a").count(), 1);
        assert_eq!(index.live_ids, 1);
        assert_eq!(index.by_time.len(), 3);
    }

    #[test]
    fn a_lookup_grown_under_a_read_lock_replaces_the_full_one_and_finds_every_id() {
        let mut index = Index::default();
        let name = |n: usize| format!("id-{n}");
        let mut n = 0;
        // Fill the lookup to its capacity: the next id would make it grow in place.
        loop {
            index.apply_put(1 + n as u64, &put(&name(n), "1", 10), HERE);
            n += 1;
            if index.by_name.len() == index.by_name.capacity() {
                break;
            }
        }
        let capacity = index.by_name.capacity();
        assert!(index.grown_lookup(0).is_none(), "no room is needed for no new id");
        let grown = index.grown_lookup(100).expect("100 more ids need a larger lookup");
        assert!(grown.table.capacity() >= capacity + 100);
        // A lookup built before another id was added would miss it: it is not put in.
        let stale = index.grown_lookup(1).expect("larger");
        let mut other = Index::default();
        other.apply_put(1, &put("only", "1", 10), HERE);
        assert!(!other.install_lookup(stale), "a lookup of other ids was put in");
        assert!(index.install_lookup(grown));
        assert!(index.by_name.capacity() > capacity);
        let grown_capacity = index.by_name.capacity();
        for more in 0..100 {
            index.apply_put(1 + (n + more) as u64, &put(&name(n + more), "1", 10), HERE);
        }
        assert_eq!(
            index.by_name.capacity(),
            grown_capacity,
            "the 100 ids made the lookup grow again"
        );
        for k in 0..n + 100 {
            let id = index
                .id_number(&name(k))
                .unwrap_or_else(|| panic!("{} is not found", name(k)));
            assert_eq!(index.id_name(id), name(k));
        }
        assert_eq!(index.id_number("id-none"), None);
        let before = index.by_name.len();
        index.apply_put(9999, &put(&name(n + 100), "1", 10), HERE);
        assert!(
            index.grown_lookup(usize::MAX / 2).is_none(),
            "no lookup can be that large"
        );
        let stale = index.grown_lookup(index.by_name.capacity()).expect("larger");
        index.apply_put(10_000, &put(&name(n + 101), "1", 10), HERE);
        assert_eq!(index.by_name.len(), before + 2);
        assert!(
            !index.install_lookup(stale),
            "a lookup missing an id added since was put in"
        );
        assert!(index.id_number(&name(n + 101)).is_some());
    }

    #[test]
    fn a_version_keeps_its_timestamp_type_state_and_rare_fields_apart() {
        let states = [VersionState::Stored, VersionState::Retired, VersionState::Forgotten];
        let created = 3u64;
        let seq_ends_that_fit = [SEQ_OPEN, created, 9, created + u64::from(u32::MAX) - 1];
        let seq_ends_that_do_not = [created + u64::from(u32::MAX), u64::MAX - 1, created - 1];
        let sources_that_fit = [0, 7, SOURCE_INLINE_MAX];
        let sources_that_do_not = [SOURCE_INLINE_MAX + 1, u32::MAX];
        for timestamp in [0, 1, 1_700_000_000, crate::limits::TIMESTAMP_MAX] {
            let fits = [
                NEVER_EXPIRES,
                timestamp + 1,
                timestamp + 3_600,
                timestamp + i64::from(u32::MAX),
            ];
            let does_not = [
                timestamp + i64::from(u32::MAX) + 1,
                timestamp,
                timestamp - 1,
                i64::MIN,
                i64::MAX - 1,
            ];
            // Each field in and out of what the entry holds, the others holding a value that fits.
            let cases: Vec<Rare> = fits
                .iter()
                .map(|e| Rare::open(*e, 0, 0))
                .chain(fits.iter().map(|e| Rare::open(*e, GENERATION_INLINE_MAX, 1)))
                .chain(does_not.iter().map(|e| Rare::open(*e, 0, 2)))
                .chain(fits.iter().map(|e| Rare::open(*e, GENERATION_INLINE_MAX + 1, 3)))
                .chain([Rare::open(NEVER_EXPIRES, u32::MAX, 4)])
                .chain(
                    sources_that_fit
                        .iter()
                        .chain(&sources_that_do_not)
                        .map(|s| Rare::open(fits[2], 1, *s)),
                )
                .chain(seq_ends_that_fit.iter().chain(&seq_ends_that_do_not).map(|end| Rare {
                    seq_ended: *end,
                    ..Rare::open(fits[2], 2, 5)
                }))
                .collect();
            for kind in [0, 1, 0x8001, u16::MAX] {
                for state in states {
                    for (n, rare) in cases.iter().enumerate() {
                        let tag = (n as u16).wrapping_mul(0x9E37);
                        let mut version = VersionEntry {
                            seq_created: created,
                            ..VersionEntry::default()
                        }
                        .with_meta(timestamp, kind, state)
                        .with_tag(tag);
                        let overflow = version.set_rare_inline(*rare);
                        let inline = fits.contains(&rare.expires_at)
                            && rare.generation <= GENERATION_INLINE_MAX
                            && rare.source <= SOURCE_INLINE_MAX
                            && seq_ends_that_fit.contains(&rare.seq_ended);
                        let mut index = Index::default();
                        if inline {
                            assert_eq!(overflow, None, "{timestamp} {rare:?}");
                        } else {
                            assert_eq!(overflow, Some(*rare));
                            index.rare = vec![Rare::open(1, 2, 3); 7];
                            index.rare.push(*rare);
                            version.set_overflow(7);
                        }
                        let check = |version: &VersionEntry, index: &Index| {
                            assert_eq!(
                                (
                                    index.expires_at(version),
                                    index.generation(version),
                                    index.source_of(version),
                                    index.seq_ended(version)
                                ),
                                (rare.expires_at, rare.generation, rare.source, rare.seq_ended),
                                "{timestamp} {kind} {rare:?}"
                            );
                            assert_eq!((version.seq_created, version.version_tag()), (created, tag));
                            for seq in [0, created - 1, created, created + 1, rare.seq_ended.saturating_sub(1)]
                                .into_iter()
                                .chain([rare.seq_ended, rare.seq_ended.saturating_add(1), u64::MAX])
                            {
                                assert_eq!(
                                    index.visible_at(version, seq),
                                    created <= seq && seq < rare.seq_ended,
                                    "{rare:?} at {seq}"
                                );
                            }
                        };
                        for next in states {
                            version.set_state(next);
                            assert_eq!(
                                (version.timestamp(), version.kind(), version.state()),
                                (timestamp, kind, next)
                            );
                            check(&version, &index);
                        }
                        version = version.with_meta(timestamp, kind, VersionState::Stored);
                        check(&version, &index);
                    }
                }
            }
        }
        let fresh = VersionEntry::default();
        assert_eq!(
            (fresh.timestamp(), fresh.kind(), fresh.state()),
            (0, 0, VersionState::Forgotten)
        );
        assert_eq!(Index::default().expires_at(&fresh), NEVER_EXPIRES);
    }

    #[test]
    fn far_expiries_and_many_deletes_go_to_the_overflow_table() {
        let mut index = Index::default();
        // A TTL past what an entry holds (u32::MAX seconds), and one that saturates to never.
        let mut far = put("far", "1", 1_000);
        far.ttl_seconds = Some(u64::from(u32::MAX) + 5);
        index.apply_put(1, &far, HERE);
        let mut endless = put("endless", "1", 1_000);
        endless.ttl_seconds = Some(u64::MAX);
        index.apply_put(2, &endless, HERE);
        let mut soon = put("soon", "1", 1_000);
        soon.ttl_seconds = Some(60);
        index.apply_put(3, &soon, HERE);
        let expiry = |index: &Index, name: &str| index.visible(name, 100).map(|v| index.expires_at(&v.version));
        assert_eq!(expiry(&index, "far"), Some(1_000 + i64::from(u32::MAX) + 5));
        assert_eq!(expiry(&index, "endless"), Some(NEVER_EXPIRES));
        assert_eq!(expiry(&index, "soon"), Some(1_060));
        assert_eq!(index.rare.len(), 1, "only the far expiry overflows");
        // An id deleted more often than an entry counts: its later histories' generations overflow.
        let mut seq = 10;
        for round in 0..40u32 {
            index.apply_put(seq, &put("churn", "1", 5), HERE);
            assert_eq!(index.current_history("churn").count(), 1, "round {round}");
            let latest = index.current_history("churn").next().map(|v| index.generation(&v));
            assert_eq!(latest, Some(round));
            assert!(index.apply_delete(seq + 1, "churn"));
            seq += 2;
        }
        assert_eq!(index.rare.len(), 1 + 40 - 1 - GENERATION_INLINE_MAX as usize);
        let generations: Vec<u32> = index
            .versions_of(index.id_number("churn").unwrap())
            .map(|(_, v)| index.generation(&v))
            .collect();
        assert_eq!(generations, (0..40).rev().collect::<Vec<u32>>());
        assert!(index.estimated_bytes() >= (index.rare.len() * std::mem::size_of::<Rare>()) as u64);
    }

    /// Entries at the edges of what an entry keeps itself: 4,095 batches, 15 segments and 65,534
    /// bytes past its block's first are kept in the entry; one more of any goes to the side table,
    /// as does an entry created before its block's first; all come back as they were, and an entry
    /// set back within the limits leaves the side table.
    #[test]
    fn the_version_table_keeps_what_fits_in_the_entry() {
        let entry = |seq: u64, segment: u32, len: u32| VersionEntry {
            seq_created: seq,
            location: Location {
                segment,
                offset: 7,
                len,
                crc: 9,
            },
            ..VersionEntry::default()
        };
        let (seq, segment) = (1_000_000_u64, 70_000_u32);
        let entries = [
            (entry(seq, segment, 100), false),
            (entry(seq + 4095, segment + 15, 65_534), false),
            (entry(seq + 4096, segment, 100), true),
            (entry(seq, segment + 16, 100), true),
            (entry(seq, segment, 65_535), true),
            (entry(seq - 1, segment, 100), true),
            (entry(seq, segment - 1, 100), true),
            (entry(seq + u64::from(u32::MAX) * 2, segment, 100), true),
        ];
        let mut table = VersionTable::default();
        for (version, _) in &entries {
            table.push(version);
        }
        for (at, (version, wide)) in entries.iter().enumerate() {
            assert_eq!(table.get(at), Some(*version), "entry {at}");
            assert_eq!(table.wide.contains_key(&at), *wide, "entry {at}");
        }
        assert_eq!(table.wide_count(), 6);
        // The next block starts over from its own first entry.
        while table.len() < BASE_BLOCK {
            table.push(&entry(seq + 4000, segment + 15, 100));
        }
        for n in 0..BASE_BLOCK as u64 {
            table.push(&entry(
                seq + 10_000 + n * 16,
                segment + 100 + u32::from(n == 255) * 15,
                200,
            ));
        }
        assert_eq!(table.len(), 2 * BASE_BLOCK);
        assert_eq!(
            table.get(BASE_BLOCK + 255),
            Some(entry(seq + 10_000 + 255 * 16, segment + 115, 200))
        );
        assert_eq!(table.wide_count(), 6);
        table.set(2, &entry(seq + 1, segment + 1, 300));
        assert_eq!(table.get(2), Some(entry(seq + 1, segment + 1, 300)));
        assert_eq!(table.wide_count(), 5);
        table.set(1, &entry(seq + 1, segment + 1, 1 << 20));
        assert_eq!(table.get(1), Some(entry(seq + 1, segment + 1, 1 << 20)));
        assert_eq!(table.wide_count(), 6);
    }

    #[test]
    fn entries_stay_small() {
        assert_eq!(std::mem::size_of::<StoredEntry>(), 44);
        assert_eq!(std::mem::size_of::<Rare>(), 24);
    }

    #[test]
    fn names_are_found_by_number_and_by_name_across_chunks() {
        let mut index = Index::default();
        // Lengths 1 to 255 (multi-byte characters included) fill chunks to uneven ends, so that
        // names end chunks at every position relative to the layout's marks.
        let names: Vec<String> = (0..6000usize)
            .map(|n| {
                let len = 1 + (n * 7919) % 120;
                let mut name = format!("{n}-");
                while name.len() < len {
                    name.push(if n % 5 == 0 { 'é' } else { 'x' });
                }
                name
            })
            .collect();
        for (n, name) in names.iter().enumerate() {
            index.apply_put(1 + n as u64, &put(name, "1", 5), HERE);
        }
        assert!(index.names.chunks.len() > 5, "the names span several chunks");
        for (n, name) in names.iter().enumerate() {
            let id = u32::try_from(n).unwrap();
            assert_eq!(&index.id_name(id), name, "id {n}");
            assert_eq!(index.id_number(name), Some(id), "id {n}");
        }
        let mut in_order = Vec::new();
        index.for_each_id_name(|id, name| in_order.push((id, name.to_owned())));
        assert!(in_order.iter().map(|(_, name)| name).eq(names.iter()));
        assert!(in_order.iter().map(|(id, _)| *id).eq(0..6000));
        assert_eq!(index.id_name(6000), "");
        assert_eq!(index.id_number("6000-"), None);
        assert_eq!(index.id_number("1-"), None, "a prefix of a known name");
        // The arena copied from its parts and chunks (as a checkpoint loads it) holds the same
        // names, and the next name is coded against the last one, as in the original.
        let (parts, chunks) = index.names.parts_and_chunks();
        let parts: Vec<[u8; 2]> = parts.copied().collect();
        let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
        let mut rebuilt = NameArena::from_parts(&chunks, &parts);
        let mut buf = NameBuf::new();
        for (n, name) in names.iter().enumerate() {
            assert_eq!(rebuilt.name_into(u32::try_from(n).unwrap(), &mut buf), name);
        }
        let mut original = index.names.clone();
        for arena in [&mut rebuilt, &mut original] {
            arena.push("5999-y");
            assert_eq!(arena.name_into(6000, &mut buf), "5999-y");
        }
        assert_eq!(rebuilt.parts.iter().last(), original.parts.iter().last());
        assert!(IdTable::from_name_parts(&chunks, &parts).is_ok());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// The version table gives back every entry as it was pushed or last set, whether its
        /// sequence number, segment and length fit beside its chunk's first or go to the side table:
        /// sequence numbers and segments that grow by small or huge steps or go back, records of up
        /// to 2 MiB, and entries set again (moved, retired, ended) to values that fit or not.
        #[test]
        fn the_version_table_gives_back_what_was_stored(
            steps in proptest::collection::vec(
                (0u8..8, 0u64..1 << 40, 0u32..8, 0u32..(2 << 20), proptest::prelude::any::<u32>()),
                1..9000,
            ),
            sets in proptest::collection::vec((proptest::prelude::any::<usize>(), 0u32..(2 << 20), 0u32..8000, 0u8..3), 0..200),
        ) {
            let mut table = VersionTable::default();
            let mut model: Vec<VersionEntry> = Vec::new();
            let (mut seq, mut segment) = (1u64, 1u32);
            for (n, (shape, jump, segment_step, len, other)) in steps.iter().enumerate() {
                // Mostly small steps forward; now and then a huge one, or one back.
                seq = match shape {
                    0 => seq.saturating_add(*jump),
                    1 => seq.saturating_sub(jump % 1000),
                    _ => seq + jump % 24,
                };
                segment = match shape {
                    2 => segment.saturating_add(segment_step * 1000),
                    3 => segment.saturating_sub(*segment_step),
                    _ => segment + u32::from(*segment_step == 7),
                };
                // Mostly records under 64 KiB, some around the limit, some far over it.
                let len = if other % 4 == 0 { *len } else { len % 66_000 };
                let mut version = VersionEntry {
                    seq_created: seq,
                    location: Location { segment, offset: *other, len, crc: other.rotate_left(7) },
                    id: u32::try_from(n).unwrap(),
                    prev: other.wrapping_mul(3),
                    scope: other % 1000,
                    ..VersionEntry::default()
                }
                .with_meta(i64::from(*other), u16::try_from(n % 7).unwrap(), VersionState::Stored)
                .with_tag(u16::try_from(n % 65_536).unwrap());
                let rare = Rare {
                    expires_at: if n % 2 == 0 { NEVER_EXPIRES } else { i64::from(*other) + 3600 },
                    seq_ended: if n % 3 == 0 { SEQ_OPEN } else { seq + u64::from(*other % 5000) },
                    generation: u32::try_from(n % 40).unwrap(),
                    source: u32::try_from(n % 70_000).unwrap(),
                };
                if let Some(_rare) = version.set_rare_inline(rare) {
                    version.set_overflow(u32::try_from(n).unwrap());
                }
                table.push(&version);
                model.push(version);
            }
            for (at, len, segment_step, state) in &sets {
                let at = at % model.len();
                let mut version = model[at];
                version.location.len = *len;
                version.location.segment = version.location.segment.wrapping_add(*segment_step);
                version.location.offset ^= 0x55;
                version.prev = version.prev.wrapping_add(1);
                version.set_state(match state {
                    0 => VersionState::Stored,
                    1 => VersionState::Retired,
                    _ => VersionState::Forgotten,
                });
                table.set(at, &version);
                model[at] = version;
                if at.is_multiple_of(3) {
                    let prev = u32::try_from(at).unwrap();
                    table.set_prev(at, prev);
                    model[at].prev = prev;
                }
            }
            proptest::prop_assert_eq!(table.len(), model.len());
            for (at, want) in model.iter().enumerate() {
                proptest::prop_assert_eq!(table.get(at), Some(*want), "slot {}", at);
                proptest::prop_assert_eq!(
                    table.set_keys(at),
                    want.is_stored().then_some((want.timestamp(), want.kind(), want.scope))
                );
                proptest::prop_assert_eq!(table.timestamp(at), Some(want.timestamp()));
                proptest::prop_assert_eq!(table.is_stored(at), want.is_stored());
            }
            proptest::prop_assert!(table.iter().eq(model.iter().copied()));
            proptest::prop_assert_eq!(table.get(model.len()), None);
            // Wide entries are those that cannot be kept beside their chunk's first entry: a table
            // built again from the model's chunks has the same.
            let rebuilt = VersionTable::from_chunks(model.chunks(CHUNK).map(<[VersionEntry]>::to_vec).collect());
            proptest::prop_assert!(rebuilt.iter().eq(model.iter().copied()));
            // Built in two parts, a whole number of chunks first, as a checkpoint load does.
            let mut chunks: Vec<Vec<VersionEntry>> = model.chunks(CHUNK).map(<[VersionEntry]>::to_vec).collect();
            let second = chunks.split_off(chunks.len() / 2);
            let mut joined = VersionTable::from_chunks(chunks);
            joined.append(VersionTable::from_chunks(second)).expect("after whole chunks");
            proptest::prop_assert!(joined.iter().eq(model.iter().copied()));
            proptest::prop_assert_eq!(joined.wide_count(), rebuilt.wide_count());
            if model.len() > 1 {
                let mut partial = VersionTable::from_chunks(vec![model[..1].to_vec()]);
                proptest::prop_assert!(partial.append(VersionTable::default()).is_err());
            }
            let wide = model
                .chunks(BASE_BLOCK)
                .flat_map(|chunk| {
                    let first = chunk[0];
                    chunk.iter().map(move |v| {
                        let fits = v.seq_created >= first.seq_created
                            && v.seq_created - first.seq_created <= PLACE_SEQ_DELTA_MAX
                            && v.location.segment >= first.location.segment
                            && v.location.segment - first.location.segment <= PLACE_SEGMENT_DELTA_MAX
                            && v.location.len < PLACE_LEN_MASK;
                        usize::from(!fits)
                    })
                })
                .sum::<usize>();
            proptest::prop_assert_eq!(rebuilt.wide_count(), wide);
        }
        /// A sorted array built by pushes, as runs while they pay, packed while that pays and plain
        /// slots otherwise, against a plain vector: length, last slot, every position,
        /// ranges from either end, and the first position a predicate says no to. The same slots
        /// sorted (so packed once runs stop paying) go through the same checks.
        #[test]
        fn sorted_slots_hold_what_was_pushed(
            blocks in proptest::collection::vec((0u32..8, 1usize..200, 0u32..32), 0..40),
            cuts in proptest::collection::vec((0usize..5000, 0usize..5000), 1..8),
        ) {
            // Blocks of slots (consecutive half the time, else apart by gaps of up to 2^step), each
            // starting far from the others (so all are distinct), in an order that is not theirs: runs, jumps
            // back and forth, and single slots.
            let mut model = Vec::new();
            for (n, (place, len, step)) in blocks.iter().enumerate() {
                // 320 starting points 13,000,000 apart; a block spans at most 200 * 2^15.
                let mut slot = u64::from(*place * 40 + u32::try_from(n).unwrap()) * 13_000_000;
                for k in 0..*len as u64 {
                    model.push(u32::try_from(slot).unwrap());
                    slot += if *step >= 16 { 1 } else { 1 + (k * 7919) % (1u64 << step) };
                }
            }
            let mut sorted = model.clone();
            sorted.sort_unstable();
            sorted.dedup();
            // Sorted but for a few slots moved back a little: keys merged out of order.
            let mut nearly = sorted.clone();
            for at in (7..nearly.len()).step_by(97) {
                nearly.swap(at, at - 5);
            }
            for model in [model, sorted, nearly] {
                check_sorted_slots(&model, &cuts)?;
            }
        }
    }

    fn check_sorted_slots(model: &[u32], cuts: &[(usize, usize)]) -> Result<(), proptest::test_runner::TestCaseError> {
        let mut list = SortedSlots::default();
        for slot in model {
            list.push(*slot);
        }
        proptest::prop_assert_eq!(list.len(), model.len());
        proptest::prop_assert_eq!(list.last(), model.last().copied());
        proptest::prop_assert_eq!(list.to_vec(), model.to_vec());
        for (at, slot) in model.iter().enumerate() {
            proptest::prop_assert_eq!(list.get(at), Some(*slot));
        }
        proptest::prop_assert_eq!(list.get(model.len()), None);
        let position: HashMap<u32, usize> = model.iter().enumerate().map(|(at, slot)| (*slot, at)).collect();
        for (a, b) in cuts.iter().copied() {
            let (from, to) = (a.min(b), a.max(b));
            let expected: Vec<u32> = model
                .get(from.min(model.len())..to.min(model.len()))
                .unwrap_or_default()
                .to_vec();
            proptest::prop_assert_eq!(list.iter(from, to).collect::<Vec<_>>(), expected.clone());
            let mut reversed = expected.clone();
            reversed.reverse();
            proptest::prop_assert_eq!(list.iter(from, to).rev().collect::<Vec<_>>(), reversed);
            // Both ends at once meet in the middle.
            let mut both = list.iter(from, to);
            let (mut front, mut back) = (Vec::new(), Vec::new());
            while let Some(slot) = both.next() {
                front.push(slot);
                if let Some(slot) = both.next_back() {
                    back.push(slot);
                }
            }
            back.reverse();
            front.extend(back);
            proptest::prop_assert_eq!(front, expected);
            for cut in [a.min(model.len()), b.min(model.len())] {
                proptest::prop_assert_eq!(list.partition_point(|slot| position[&slot] < cut), cut);
            }
        }
        let packing_pays = Packed::from_vec(model).bytes() <= model.len() * 4;
        let rebuilt = SortedSlots::from_vec(model.to_vec());
        proptest::prop_assert_eq!(rebuilt.to_vec(), model.to_vec());
        let runs = 1 + model.windows(2).filter(|w| w[0] + 1 != w[1]).count();
        let as_runs = !model.is_empty() && runs * RUNS_PER_ENTRY_MAX <= model.len();
        let form = match rebuilt {
            SortedSlots::Runs(_) => "runs",
            SortedSlots::Packed(_) => "packed",
            SortedSlots::Plain(_) => "plain",
        };
        let expected_form = if as_runs {
            "runs"
        } else if packing_pays {
            "packed"
        } else {
            "plain"
        };
        proptest::prop_assert_eq!(form, expected_form);
        // Pushes keep an array packed only while that pays.
        if let SortedSlots::Packed(packed) = &list {
            proptest::prop_assert!(packed.bytes() <= model.len() * 4);
        }
        Ok(())
    }

    #[test]
    fn packed_slots_keep_gaps_of_every_width() {
        // Gaps of 0 to 32 bits, each width in a block of its own, and one block whose gaps straddle
        // the words they are packed in.
        let mut slots = vec![0u32];
        for width in 0..=32u32 {
            for k in 0..PACK_BLOCK as u64 {
                let gap = if width == 0 { 0 } else { (1u64 << (width - 1)) + k % 3 };
                let next = u64::from(*slots.last().unwrap()) + 1 + gap.min(u64::from(u32::MAX) / 4096);
                slots.push(u32::try_from(next).unwrap());
            }
        }
        slots.extend([u32::MAX - 2, u32::MAX - 1]);
        let packed = SortedSlots::from_vec(slots.clone());
        let SortedSlots::Packed(inner) = &packed else {
            panic!("increasing slots are packed");
        };
        assert!(inner.blocks.iter().any(|block| block.width >= 20));
        assert_eq!(packed.to_vec(), slots);
        for (at, slot) in slots.iter().enumerate() {
            assert_eq!(packed.get(at), Some(*slot));
            assert_eq!(packed.partition_point(|s| s < *slot), at);
        }
        // The widest increasing gap a block can hold: from slot 0 to u32::MAX - 1000, then every
        // other slot.
        let widest: Vec<u32> = [0].into_iter().chain((u32::MAX - 1000..u32::MAX).step_by(2)).collect();
        let SortedSlots::Packed(inner) = SortedSlots::from_vec(widest.clone()) else {
            panic!("packing pays");
        };
        assert_eq!(inner.blocks.first().map(|block| block.width), Some(32));
        let back = SortedSlots::Packed(inner);
        assert_eq!(back.to_vec(), widest);
        assert_eq!(
            back.iter(0, widest.len()).rev().collect::<Vec<_>>(),
            widest.iter().rev().copied().collect::<Vec<_>>()
        );
        // Slots that go back: a little (keys merged out of order), and from u32::MAX - 1 to 0 and
        // from 0 to u32::MAX - 1, the widest gaps either way (33 bits zigzag-coded).
        let mut back_and_forth: Vec<u32> = (0..1_000u32).map(|n| n * 3).collect();
        for at in (5..back_and_forth.len()).step_by(50) {
            back_and_forth.swap(at, at - 3);
        }
        back_and_forth.extend([u32::MAX - 1, 0, u32::MAX - 1, 5, 4, 3]);
        back_and_forth.extend((0..200u32).map(|n| 100 + n * 2));
        let SortedSlots::Packed(inner) = SortedSlots::from_vec(back_and_forth.clone()) else {
            panic!("packing pays");
        };
        assert!(inner.blocks.iter().any(|block| block.signed && block.width == 33));
        assert!(inner.blocks.iter().any(|block| !block.signed));
        let packed = SortedSlots::Packed(inner);
        assert_eq!(packed.to_vec(), back_and_forth);
        for (at, slot) in back_and_forth.iter().enumerate() {
            assert_eq!(packed.get(at), Some(*slot), "{at}");
        }
        assert_eq!(
            packed.iter(0, back_and_forth.len()).rev().collect::<Vec<_>>(),
            back_and_forth.iter().rev().copied().collect::<Vec<_>>()
        );
        // Wide gaps everywhere: packing does not pay, the slots stay plain, built whole or pushed.
        let scattered: Vec<u32> = (0..500u32).map(|n| if n % 2 == 0 { n } else { u32::MAX - n }).collect();
        assert!(matches!(
            SortedSlots::from_vec(scattered.clone()),
            SortedSlots::Plain(_)
        ));
        let mut pushed = SortedSlots::default();
        for slot in &scattered {
            pushed.push(*slot);
        }
        assert!(matches!(pushed, SortedSlots::Plain(_)));
        assert_eq!(pushed.to_vec(), scattered);
    }

    #[test]
    fn a_time_set_in_arrival_order_is_one_run() {
        let mut index = Index::default();
        for n in 0..10_000i64 {
            index.apply_put(1 + n as u64, &put(&format!("id-{n}"), "1", 100 + n), HERE);
        }
        assert!(matches!(&index.by_time.base, SortedSlots::Runs(runs) if runs.len() == 1));
        assert!(index.by_time.heap_bytes() <= 64, "{}", index.by_time.heap_bytes());
        let mut mixed = Index::default();
        for n in 0..10_000i64 {
            let name = format!("id-{n}");
            let mut item = put(&name, "1", 100 + n);
            item.kind = if n % 2 == 0 { "message" } else { "document" };
            mixed.apply_put(1 + n as u64, &item, HERE);
        }
        // The type set of one type of two, alternating, is packed: gaps of one slot, a bit each.
        assert!(mixed
            .by_type
            .iter()
            .filter(|set| set.len() > 0)
            .all(|set| matches!(set.base, SortedSlots::Packed(_)) && set.heap_bytes() < 5_000));
        let keys: Vec<(i64, u32)> = index.by_time.range(&index.slots, 150, 160, true).collect();
        assert_eq!(
            keys,
            (50..=60u32)
                .rev()
                .map(|slot| (100 + i64::from(slot), slot))
                .collect::<Vec<_>>()
        );
    }

    /// Names drawn from a few stems and alphabets (multi-byte characters included), so that
    /// neighbours often share prefixes of every length and sometimes share nothing.
    fn arb_names() -> impl proptest::strategy::Strategy<Value = Vec<String>> {
        use proptest::prelude::*;
        let piece = prop_oneof![
            Just("item-".to_owned()),
            Just("s/".to_owned()),
            Just("é".to_owned()),
            Just("日本".to_owned()),
            "[a-c0-2]{1,3}",
            "[x-zé]{0,40}",
        ];
        prop::collection::vec(prop::collection::vec(piece, 1..6), 0..400).prop_map(|names| {
            let mut seen = std::collections::HashSet::new();
            names
                .into_iter()
                .map(|pieces| {
                    let mut name = pieces.concat();
                    name.truncate(
                        name.char_indices()
                            .map(|(at, c)| at + c.len_utf8())
                            .take_while(|end| *end <= 128)
                            .last()
                            .unwrap_or(0),
                    );
                    name
                })
                .filter(|name| !name.is_empty() && seen.insert(name.clone()))
                .collect()
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// The front-coded arena against a plain list of the names: every name rebuilt, compared
        /// (with itself and its neighbours), measured and found; the copy a checkpoint loads
        /// (parts and chunks) holds the same and passes the loader's checks.
        #[test]
        fn the_name_arena_holds_exactly_the_names_pushed(filler in 520usize..560, drawn in arb_names()) {
            // 120-byte names that share nothing with their neighbours fill most of a chunk, so
            // that the first chunk ends among the drawn names or just before them.
            let mut names: Vec<String> = (0..filler)
                .map(|n| format!("{}{n:0>119}", char::from(b'A' + (n % 26) as u8)))
                .collect();
            names.extend(drawn);
            let mut index = Index::default();
            for (n, name) in names.iter().enumerate() {
                index.apply_put(1 + n as u64, &put(name, "1", 5), HERE);
            }
            let arena = &index.names;
            let mut buf = NameBuf::new();
            for (n, name) in names.iter().enumerate() {
                let id = u32::try_from(n).unwrap();
                proptest::prop_assert_eq!(arena.name_into(id, &mut buf), name.as_str());
                proptest::prop_assert!(arena.is(id, name));
                proptest::prop_assert_eq!(arena.name_len(id), name.len());
                proptest::prop_assert_eq!(index.id_number(name), Some(id));
                for other in [n.wrapping_sub(1), n + 1] {
                    if let Some(other) = names.get(other) {
                        proptest::prop_assert!(!arena.is(id, other));
                    }
                }
            }
            let mut all = Vec::new();
            arena.for_each(|_, name| all.push(name.to_owned()));
            proptest::prop_assert_eq!(&all, &names);
            let (parts, chunks) = arena.parts_and_chunks();
            proptest::prop_assert!(chunks.len() >= 2 || filler * 120 < NAME_CHUNK);
            let parts: Vec<[u8; 2]> = parts.copied().collect();
            let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
            let table = IdTable::from_name_parts(&chunks, &parts);
            proptest::prop_assert!(table.is_ok(), "{:?}", table.err());
            let copy = NameArena::from_parts(&chunks, &parts);
            for (n, name) in names.iter().enumerate() {
                proptest::prop_assert_eq!(copy.name_into(u32::try_from(n).unwrap(), &mut buf), name.as_str());
            }
            proptest::prop_assert_eq!(&copy.last, &arena.last);
        }
    }

    #[test]
    fn sequential_names_take_a_few_bytes_each() {
        let mut arena = NameArena::default();
        let names: Vec<String> = (0..100_000).map(|n| format!("item-{n:08}")).collect();
        for name in &names {
            arena.push(name);
        }
        let per_name = arena.heap_bytes() as f64 / 100_000.0;
        assert!(per_name < 5.0, "{per_name} bytes per 13-byte name");
        let mut buf = NameBuf::new();
        for n in [0, 1, 15, 16, 17, 99_999] {
            assert_eq!(arena.name_into(n, &mut buf), names[n as usize]);
            assert!(arena.is(n, &names[n as usize]));
            assert!(!arena.is(n, "item-1"));
            // Same length, one byte off: in the mark's name, then in the middle.
            let other = names[n as usize].replacen("item", "itex", 1);
            assert!(!arena.is(n, &other));
            let other = names[n as usize].replacen("-000", "-010", 1);
            assert!(!arena.is(n, &other));
        }
        // Shared prefixes stop at a character boundary and leave at least one byte.
        for (last, name, shared) in [("aé", "aè", 1), ("abc", "abc", 2), ("abc", "ab", 1), ("x", "y", 0)] {
            assert_eq!(shared_prefix(last, name), shared, "{last} {name}");
        }
    }

    #[test]
    fn same_batch_versions_leave_only_the_last_visible() {
        let mut index = Index::default();
        index.apply_put(1, &put("a", "1", 10), HERE);
        index.apply_put(1, &put("a", "2", 10), HERE);
        assert_eq!(visible_tag(&index, "a", 1), Some(version_tag("2")));
        assert!(index.estimated_bytes() > 0);
    }

    #[test]
    fn ordered_sets_stay_ordered_whatever_the_arrival_order() {
        let mut index = Index::default();
        let mut expected = Vec::new();
        // Mostly increasing timestamps with many out-of-order ones, enough to force merges.
        for n in 0..20_000i64 {
            let timestamp = if n % 3 == 0 { 40_000 - n } else { n };
            let name = format!("id-{n}");
            index.apply_put(1 + n as u64, &put(&name, "1", timestamp), HERE);
            expected.push((timestamp, u32::try_from(n).unwrap()));
        }
        expected.sort_unstable();
        let all: Vec<(i64, u32)> = index.by_time.range(&index.slots, i64::MIN, i64::MAX, false).collect();
        assert_eq!(all, expected);
        let window: Vec<(i64, u32)> = index.by_time.range(&index.slots, 100, 200, true).collect();
        let mut want: Vec<(i64, u32)> = expected
            .iter()
            .copied()
            .filter(|k| (100..=200).contains(&k.0))
            .collect();
        want.reverse();
        assert_eq!(window, want);
        // Forget every other version: after the purge the sets hold only what is stored.
        for slot in (0..20_000u32).step_by(2) {
            index.forget(slot);
            index.unlink_from_sets(slot);
        }
        index.purge_sets();
        let left: Vec<u32> = index
            .by_time
            .range(&index.slots, i64::MIN, i64::MAX, false)
            .map(|k| k.1)
            .collect();
        assert_eq!(left.len(), 10_000);
        assert!(left.iter().all(|slot| slot % 2 == 1));
        assert_eq!(index.by_time.sorted_slots(&index.slots), left);
    }

    #[test]
    fn a_purge_in_small_steps_with_writes_between_them_leaves_exactly_the_stored_versions() {
        let mut index = Index::default();
        let types = ["message", "tool_result", "document_chunk"];
        let put_n = |index: &mut Index, n: i64| {
            let name = format!("id-{n}");
            let mut view = put(&name, "1", if n % 5 == 0 { 100_000 - n } else { n });
            view.kind = types[(n % 3) as usize];
            view.scope = if n % 2 == 0 {
                ScopeView::GlobalWritable
            } else {
                ScopeView::Session("s1")
            };
            index.apply_put(1 + n as u64, &view, HERE);
        };
        for n in 0..30_000i64 {
            put_n(&mut index, n);
        }
        // Forget two slots in three, then purge 1,000 entries at a time while new versions arrive
        // (in and out of time order) between the steps.
        for slot in (0..30_000u32).filter(|slot| slot % 3 != 0) {
            index.forget(slot);
            index.unlink_from_sets(slot);
        }
        let mut cursor = Some(PurgeCursor::default());
        let mut n = 30_000i64;
        let mut steps = 0;
        while let Some(at) = cursor {
            cursor = index.purge_sets_step(at, 1_000);
            put_n(&mut index, n);
            n += 1;
            steps += 1;
        }
        assert!(steps > 20, "{steps} steps");
        let stored = |slot: &u32| index.slot(*slot).is_some_and(|v| v.is_stored());
        let check = |set: &KeySet, belongs: &dyn Fn(&VersionEntry) -> bool| {
            let keys: Vec<(i64, u32)> = set.range(&index.slots, i64::MIN, i64::MAX, false).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "in order");
            let mut want: Vec<(i64, u32)> = (0..u32::try_from(index.slots.len()).unwrap())
                .filter(|slot| stored(slot) && index.slot(*slot).is_some_and(|v| belongs(&v)))
                .map(|slot| (index.slot(slot).unwrap().timestamp(), slot))
                .collect();
            want.sort_unstable();
            assert_eq!(keys, want);
            assert_eq!(set.len(), want.len(), "nothing dead left in the array");
        };
        check(&index.by_time, &|_| true);
        for (kind, set) in index.by_type.iter().enumerate() {
            check(set, &|v| usize::from(v.kind()) == kind);
        }
        for (scope, set) in index.by_scope.iter().enumerate() {
            check(set, &|v| position(v.scope) == scope);
        }
    }

    #[test]
    fn an_id_whose_versions_are_all_forgotten_keeps_its_number_and_generation() {
        let mut index = Index::default();
        index.apply_put(1, &put("a", "1", 1), HERE);
        index.apply_put(2, &put("b", "1", 1), HERE);
        assert!(index.apply_delete(3, "a"));
        index.forget(0);
        let a = index.id_number("a").expect("a is still known");
        assert_eq!(index.versions_of(a).count(), 0);
        assert_eq!(index.deletes_of(a), 1);
        assert!(index.visible("a", 3).is_none() && index.current_history("a").next().is_none());
        // A larger lookup, built off the lock, keeps an id with no version and one with a version.
        let grown = index.grown_lookup(1000).expect("1,000 more ids need a larger lookup");
        assert!(index.install_lookup(grown));
        assert_eq!(index.id_number("a"), Some(a));
        let b = index.id_number("b").expect("b");
        let chain = |index: &Index, id: u32| -> Vec<u32> { index.versions_of(id).map(|(slot, _)| slot).collect() };
        assert_eq!(chain(&index, b), vec![1]);
        // A new put of "a" continues under its number, in a new generation.
        index.apply_put(4, &put("a", "2", 1), HERE);
        assert_eq!(index.id_number("a"), Some(a));
        assert_eq!(chain(&index, a), vec![2]);
        let newest = index.visible("a", 4).expect("a's new version");
        assert_eq!((newest.slot, index.generation(&newest.version)), (2, 1));
        // Enough new ids to make the lookup grow in place (no grown copy put in first).
        for n in 0..2000 {
            index.apply_put(5 + n, &put(&format!("n{n}"), "1", 1), HERE);
        }
        assert_eq!(index.id_number("a"), Some(a));
        assert_eq!(chain(&index, a), vec![2]);
        assert_eq!(chain(&index, b), vec![1]);
        for n in (0..2000).step_by(97) {
            let id = index.id_number(&format!("n{n}")).expect("a new id");
            assert_eq!(chain(&index, id), vec![u32::try_from(n).unwrap() + 3]);
        }
        index.forget(2);
        assert_eq!(chain(&index, a), Vec::<u32>::new());
        assert_eq!(index.id_number("a"), Some(a));
    }

    #[test]
    fn a_lookup_grown_before_compaction_changed_a_newest_version_is_not_put_in() {
        let mut index = Index::default();
        for (seq, version) in [(1, "1"), (2, "2"), (3, "3")] {
            index.apply_put(seq, &put("a", version, 1), HERE);
        }
        index.apply_put(4, &put("b", "1", 1), HERE);
        let chain = |index: &Index, name: &str| -> Vec<u32> {
            let id = index.id_number(name).expect("known");
            index.versions_of(id).map(|(slot, _)| slot).collect()
        };
        // Built under the read lock; compaction takes a's newest version before it is put in.
        let grown = index.grown_lookup(1000).expect("1,000 more ids need a larger lookup");
        assert!(index.forget(2));
        assert!(
            !index.install_lookup(grown),
            "a lookup holding a forgotten version was put in"
        );
        assert_eq!(chain(&index, "a"), vec![1, 0]);
        // Built after, it is put in, with every id's newest version.
        assert!(index.forget(0));
        let grown = index.grown_lookup(1000).expect("larger");
        assert!(index.install_lookup(grown));
        assert_eq!(chain(&index, "a"), vec![1]);
        assert_eq!(chain(&index, "b"), vec![3]);
        assert_eq!(index.visible("a", 2).map(|v| v.slot), Some(1));
    }

    #[test]
    fn forgetting_a_version_takes_it_out_of_its_chain() {
        let mut index = Index::default();
        for (seq, version) in [(1, "1"), (2, "2"), (3, "3")] {
            index.apply_put(seq, &put("a", version, 1), HERE);
        }
        index.forget(1);
        let id = index.id_number("a").unwrap();
        let chain: Vec<u32> = index.versions_of(id).map(|(slot, _)| slot).collect();
        assert_eq!(chain, vec![2, 0]);
        index.forget(2);
        let chain: Vec<u32> = index.versions_of(id).map(|(slot, _)| slot).collect();
        assert_eq!(chain, vec![0]);
        assert!(index.id_number("b").is_none());
        assert_eq!(index.id_name(id), "a");
    }
}
