//! One version of an id as the index's users read and write it ([`VersionEntry`]): its timestamp,
//! type number and state bit-packed in one word, the fields that overflow the entry ([`Rare`]),
//! where its record is ([`Location`]) and the 16-bit tag of its version string. The bottom of the
//! index: every other part of it keeps or reads these.

/// `seq_ended` of a version nothing has ended yet.
pub(crate) const SEQ_OPEN: u64 = u64::MAX;
/// `expires_at` of a version without a TTL (or whose expiry is past the last `i64` second).
pub(crate) use crate::item::NEVER_EXPIRES;
/// "No version": the end of an id's chain of versions.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// The 16-bit tag of a version string kept in the index: the low half of its CRC-32. Equal strings
/// have equal tags; equal tags are confirmed against the log record (two different strings share a
/// tag about once in 65,536 comparisons, which then costs one record read).
pub(crate) fn version_tag(version: &str) -> u16 {
    crate::num::low_u16(u64::from(crc32fast::hash(version.as_bytes())))
}

/// The scope number of a retired version whose type and scope are unknown: one replayed from a
/// retired record of segment format 1 or 2, which keeps neither (its type number is then 0). No
/// scope is interned under it: the index holds at most [`SCOPES_MAX`](crate::limits::SCOPES_MAX)
/// scopes, numbered below it. Every other version, stored or retired, keeps its type and scope
/// numbers.
pub(crate) const SCOPE_UNKNOWN: u32 = u32::MAX;
const _: () = assert!(crate::limits::SCOPES_MAX < SCOPE_UNKNOWN as usize);

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
pub(super) const META_TIMESTAMP_MASK: u64 = (1 << 40) - 1;
pub(super) const META_KIND_SHIFT: u32 = 40;
pub(super) const META_STATE_SHIFT: u32 = 56;
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
/// [`VersionTable`](super::VersionTable) keeps it in 44 (see
/// [`StoredEntry`](super::versions::StoredEntry)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VersionEntry {
    pub(crate) seq_created: u64,
    /// The item's timestamp (with the slot, the key of its entries in the ordered sets), its type
    /// number and state, and where its expiry, generation, source and end are: see [`meta_word`]
    /// and [`Index::expires_at`](super::Index::expires_at).
    pub(super) meta: u64,
    pub(crate) location: Location,
    /// Position of the id in the index's id table.
    pub(crate) id: u32,
    /// The id's previous (older) version still in the index, or [`NO_SLOT`].
    pub(crate) prev: u32,
    /// The scope number, kept when the version is retired; [`SCOPE_UNKNOWN`] for a retired version
    /// whose scope (and type) is unknown.
    pub(crate) scope: u32,
    /// [`version_tag`] of the version string in the low 16 bits; without the overflow bit, the
    /// source number in the high 16.
    pub(super) tag_source: u32,
    /// Without the overflow bit: `seq_ended - seq_created`, or [`ENDED_OPEN`] while the version is
    /// open.
    pub(super) ended: u32,
    /// Without the overflow bit: 0 if the version never expires, else how many seconds after its
    /// timestamp it does. With it: the position of its [`Rare`] in the index's overflow table.
    pub(super) expiry: u32,
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
    /// Compaction reclaimed its content; its (id, version, hash) is remembered in a retired record,
    /// and the index keeps its type and scope numbers (unless they are unknown: [`SCOPE_UNKNOWN`]).
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
        crate::num::low_u16(u64::from(self.tag_source))
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
    #[inline]
    pub(super) fn rare_inline(&self) -> Result<Rare, usize> {
        if self.meta & META_OVERFLOW != 0 {
            return Err(crate::num::usize_from_u32(self.expiry));
        }
        // Exact: `after` was taken from these sums by `set_rare_inline` (and a timestamp has 40 bits).
        let expires_at = match self.expiry {
            0 => NEVER_EXPIRES,
            after => self.timestamp() + i64::from(after),
        };
        let seq_ended = match self.ended {
            ENDED_OPEN => SEQ_OPEN,
            after => self.seq_created + u64::from(after),
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
        crate::num::low_u16(self.meta >> META_KIND_SHIFT)
    }

    /// What is stored of the version.
    pub(crate) fn state(&self) -> VersionState {
        match (self.meta >> META_STATE_SHIFT) & 3 {
            0 => VersionState::Stored,
            1 => VersionState::Retired,
            _ => VersionState::Forgotten,
        }
    }

    #[inline]
    pub(super) fn set_state(&mut self, state: VersionState) {
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

    /// Whether the version's type and scope numbers are known: always but for a retired version
    /// replayed from a record of segment format 1 or 2 ([`SCOPE_UNKNOWN`]).
    pub(crate) fn kind_and_scope_known(&self) -> bool {
        self.scope != SCOPE_UNKNOWN
    }

    /// Whether a view at `seq` sees this version, when its end is in the entry (`None` when it is
    /// in the overflow table).
    #[inline]
    pub(super) fn visible_inline(&self, seq: u64) -> Option<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::tests::{put, HERE};
    use crate::index::Index;

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
                        let tag = u16::try_from(n).unwrap().wrapping_mul(0x9E37);
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
}
