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
//!
//! Layer 3: the index reads put records (`log`) and items (`item`), and nothing above it. This file
//! holds [`Index`] and its reads (ids by number, versions by id, MVCC visibility); the parts it is
//! built of are beside it: `entry` (one version), `chunks`, `versions` (the version table), `names`
//! (the name arena), `ids` (the id lookup), `interner`, `packed` and `slots` (the sorted arrays of
//! the ordered sets), `keys` (the ordered sets), and `apply` (every change to the index).

mod apply;
mod chunks;
mod entry;
mod ids;
mod interner;
mod keys;
mod names;
mod packed;
mod slots;
#[cfg(test)]
pub(crate) mod tests;
mod versions;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hashbrown::HashTable;

use crate::item::{Scope, TypeRegistry};
use crate::log::segment::Segment;

pub(crate) use apply::PurgeCursor;
pub(crate) use chunks::CHUNK;
pub(crate) use entry::{
    record_crc_at, version_tag, Location, Rare, VersionEntry, VersionState, NEVER_EXPIRES, NO_SLOT, SCOPE_UNKNOWN,
    SEQ_OPEN,
};
pub(crate) use ids::IdTable;
pub(crate) use interner::Interner;
pub(crate) use keys::{KeySet, Keys};
pub(crate) use names::{NameArena, NameBuf, NAME_CHUNK};
pub(crate) use versions::VersionTable;

/// The hash maps of the index: ids and interned strings come from users, so the hasher is seeded
/// at random (foldhash resists simple flooding) while staying several times faster than SipHash.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The whole in-memory state of a store: index, type registry and the segments readers use.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// Id names, by id number.
    names: NameArena,
    /// Per id, found by the hash of its name: the slot of its newest version still in the index
    /// (older ones follow `prev`, and the entry names the id's number), or, for an id with none,
    /// [`ID_TAG`](ids::ID_TAG) | its number.
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
    /// The commit time of the log's last batch that records one (segment format 3: its sync mark's
    /// `committed_at`), as of `seq`; 0 when none does. A checkpoint keeps it, and the writer
    /// starts from it.
    pub(crate) committed_at: i64,
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

/// A pinned snapshot as the log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PinInfo {
    pub(crate) seq: u64,
    pub(crate) taken_at: i64,
    pub(crate) session: Option<Arc<str>>,
}

/// What a view at some sequence number sees of one id.
pub(crate) struct Visible {
    pub(crate) slot: u32,
    pub(crate) version: VersionEntry,
}

/// A slot or id number as a position in the index's arrays.
#[inline]
fn position(value: u32) -> usize {
    crate::num::usize_from_u32(value)
}

/// How many versions, ids, scopes and sources the index holds: the counts its 32-bit numbers for
/// them are bounded by (see [`crate::limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) versions: usize,
    pub(crate) ids: usize,
    pub(crate) scopes: usize,
    pub(crate) sources: usize,
}

impl Counts {
    /// Refuses `puts` more versions when they could take the index past one of its limits
    /// ([`Error::Full`](crate::Error::Full) naming it): each adds a version (a put or a retired
    /// record) and may add an id, a scope and a source. Counting each as new is conservative only
    /// within `puts` of a limit. Types are bounded where they are registered
    /// ([`crate::limits::TYPES_MAX`]).
    pub(crate) fn check_room(&self, puts: usize) -> crate::error::Result<()> {
        use crate::limits::{check_room, IDS_MAX, SCOPES_MAX, SOURCES_MAX, VERSIONS_MAX};
        check_room(self.versions, puts, VERSIONS_MAX, "versions")?;
        check_room(self.ids, puts, IDS_MAX, "ids")?;
        check_room(self.scopes, puts, SCOPES_MAX, "scopes")?;
        check_room(self.sources, puts, SOURCES_MAX, "sources")
    }
}

impl Index {
    /// How many versions, ids, scopes and sources the index holds.
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            versions: self.slots.len(),
            ids: self.id_count(),
            scopes: self.scopes.len(),
            sources: self.sources.len(),
        }
    }

    /// Refuses a replayed record that would take the index past one of its limits, as the writer
    /// refuses a batch that could ([`Counts::check_room`]); for a put or a retired record of segment
    /// format 3 (`kind`: the type it names), also one of a type the index has no room for (the
    /// writer bounds types where they are registered, but a record's type is not checked against
    /// the registry when it is replayed).
    pub(crate) fn check_room_to_replay(&self, kind: Option<&str>) -> crate::error::Result<()> {
        self.counts().check_room(1)?;
        match kind {
            Some(kind) if self.kinds.get(kind).is_none() => {
                crate::limits::check_room(self.kinds.len(), 1, crate::limits::TYPES_MAX, "types")
            }
            _ => Ok(()),
        }
    }

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
    #[inline]
    pub(crate) fn id_count(&self) -> usize {
        self.names.len()
    }

    /// Whether the index knows id number `id`.
    #[inline]
    pub(crate) fn has_id(&self, id: u32) -> bool {
        position(id) < self.id_count()
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

    /// Every id deleted at least once, with how many times, in no order.
    pub(crate) fn deleted_ids(&self) -> Vec<(u32, u32)> {
        self.deletes.iter().map(|(id, deletes)| (*id, *deletes)).collect()
    }

    /// How many times id number `id` was deleted.
    pub(crate) fn deletes_of(&self, id: u32) -> u32 {
        self.deletes.get(&id).copied().unwrap_or(0)
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
