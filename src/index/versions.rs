//! The version table: every version entry by slot, each kept in 44 bytes ([`StoredEntry`]) with its
//! creation sequence number and segment relative to its block's first entry, and the few that do not
//! fit in a side table ([`Wide`]).

use super::chunks::{ChunkVec, CHUNK};
use super::entry::{Location, VersionEntry, VersionState, META_KIND_SHIFT, META_STATE_SHIFT, META_TIMESTAMP_MASK};
use super::FastMap;

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
pub(super) struct StoredEntry {
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
    pub(super) fn id_at(&self, position: usize) -> Option<u32> {
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
            crate::num::low_u16(meta >> META_KIND_SHIFT),
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
            meta_low: crate::num::low_u32(version.meta),
            meta_high: crate::num::low_u32(version.meta >> 32),
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
    pub(super) fn heap_bytes(&self) -> u64 {
        let wide = self.wide.capacity() * (std::mem::size_of::<(usize, Wide)>() + 1);
        self.entries.heap_bytes() + (self.bases.capacity() * std::mem::size_of::<(u64, u32)>() + wide) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::entry::{Rare, NEVER_EXPIRES, SEQ_OPEN};

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
    }
}
