//! The in-memory index: every stored version of every id, with the sequence range in which it is the
//! id's visible version, and ordered secondary sets on (type, timestamp), (scope, timestamp) and
//! (timestamp). Low-cardinality strings (type, scope, source) are interned to small integers.
//!
//! MVCC: a view at sequence number `S` sees, for each id, the version whose
//! `seq_created <= S < seq_ended`. A newer version or a tombstone sets `seq_ended` of the one it ends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use smallvec::SmallVec;

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

/// Where a record is stored: segment number, byte offset and length of the whole record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) segment: u32,
    pub(crate) offset: u32,
    pub(crate) len: u32,
}

/// One stored version of an id.
#[derive(Debug, Clone)]
pub(crate) struct VersionEntry {
    pub(crate) seq_created: u64,
    pub(crate) seq_ended: u64,
    /// The item's timestamp: with the slot, the key of its entries in the ordered sets.
    pub(crate) timestamp: i64,
    pub(crate) expires_at: i64,
    pub(crate) hash: [u8; 32],
    pub(crate) version: Box<str>,
    pub(crate) location: Location,
    /// Position of the id in [`Index::ids`].
    pub(crate) id: u32,
    /// How many deletes of the id came before this version: versions of one history share it.
    pub(crate) generation: u32,
    pub(crate) kind: u16,
    pub(crate) scope: u32,
    pub(crate) source: u32,
    pub(crate) state: VersionState,
}

/// What is stored of a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionState {
    /// Its whole record, content included.
    Stored,
    /// Compaction reclaimed its content; its (id, version, hash) is remembered in a retired record.
    Retired,
    /// Compaction dropped it entirely (a deleted history); the slot is unused.
    Forgotten,
}

impl VersionEntry {
    /// Whether compaction reclaimed this version's content.
    pub(crate) fn is_retired(&self) -> bool {
        self.state == VersionState::Retired
    }

    /// Whether the version's record, content included, is stored.
    pub(crate) fn is_stored(&self) -> bool {
        self.state == VersionState::Stored
    }

    /// Whether a view at `seq` sees this version.
    pub(crate) fn visible_at(&self, seq: u64) -> bool {
        self.seq_created <= seq && seq < self.seq_ended
    }

    /// Whether the version has expired at time `now`.
    pub(crate) fn expired_at(&self, now: i64) -> bool {
        self.expires_at <= now
    }
}

/// Everything the index keeps per id.
#[derive(Debug, Clone)]
pub(crate) struct IdEntry {
    pub(crate) name: Arc<str>,
    /// Slots of every stored version, oldest first.
    /// Most ids have one or two versions: those live inline, without an allocation.
    pub(crate) versions: SmallVec<[u32; 2]>,
    /// How many times the id was deleted; the current history is generation `deletes`.
    pub(crate) deletes: u32,
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

/// The whole in-memory state of a store: index, type registry and the segments readers use.
#[derive(Debug, Default)]
pub(crate) struct Index {
    pub(crate) ids: Vec<IdEntry>,
    pub(crate) by_name: FastMap<Arc<str>, u32>,
    pub(crate) slots: Vec<VersionEntry>,
    pub(crate) by_type: Vec<BTreeSet<(i64, u32)>>,
    pub(crate) by_scope: Vec<BTreeSet<(i64, u32)>>,
    pub(crate) by_time: BTreeSet<(i64, u32)>,
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
    /// Heap bytes of version strings, for the memory estimate.
    version_string_bytes: u64,
    /// Heap bytes of id strings, for the memory estimate.
    id_string_bytes: u64,
}

/// A pinned snapshot as the log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PinInfo {
    pub(crate) seq: u64,
    pub(crate) taken_at: i64,
    pub(crate) session: Option<Arc<str>>,
}

/// What a view at some sequence number sees of one id.
pub(crate) struct Visible<'a> {
    pub(crate) entry: &'a IdEntry,
    pub(crate) version: &'a VersionEntry,
}

impl Index {
    pub(crate) fn slot(&self, slot: u32) -> Option<&VersionEntry> {
        self.slots.get(usize::try_from(slot).ok()?)
    }

    pub(crate) fn id_entry(&self, name: &str) -> Option<&IdEntry> {
        let position = *self.by_name.get(name)?;
        self.ids.get(usize::try_from(position).ok()?)
    }

    pub(crate) fn id_name(&self, id: u32) -> &str {
        self.ids
            .get(usize::try_from(id).unwrap_or(usize::MAX))
            .map_or("", |entry| &entry.name)
    }

    /// The version of `name` a view at `seq` sees, if any.
    pub(crate) fn visible(&self, name: &str, seq: u64) -> Option<Visible<'_>> {
        let entry = self.id_entry(name)?;
        entry.versions.iter().rev().find_map(|slot| {
            let version = self.slot(*slot)?;
            version.visible_at(seq).then_some(Visible { entry, version })
        })
    }

    /// The versions of the id's current history (since its last delete), oldest first.
    pub(crate) fn current_history<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a VersionEntry> + 'a {
        let entry = self.id_entry(name);
        let generation = entry.map_or(0, |entry| entry.deletes);
        entry
            .into_iter()
            .flat_map(|entry| entry.versions.iter())
            .filter_map(move |slot| self.slot(*slot))
            .filter(move |version| version.generation == generation)
    }

    /// Makes room for `ids` more ids and as many versions, so that loading a checkpoint never rehashes.
    pub(crate) fn reserve(&mut self, ids: usize) {
        self.by_name.reserve(ids);
        self.ids.reserve(ids);
        self.slots.reserve(ids);
    }

    /// The position of id `name`, creating its entry if it is new.
    fn id_position(&mut self, name: &str) -> u32 {
        if let Some(id) = self.by_name.get(name) {
            return *id;
        }
        let id = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
        let name: Arc<str> = Arc::from(name);
        self.id_string_bytes += name.len() as u64;
        self.by_name.insert(Arc::clone(&name), id);
        self.ids.push(IdEntry {
            name,
            versions: SmallVec::new(),
            deletes: 0,
        });
        id
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

    /// Appends a version of id `name` created by batch `seq`; it ends the id's open version.
    fn push_version(&mut self, seq: u64, name: &str, mut version: VersionEntry) -> u32 {
        let slot = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        let id = self.id_position(name);
        let Some(entry) = self.ids.get_mut(usize::try_from(id).unwrap_or(usize::MAX)) else {
            return slot;
        };
        version.id = id;
        version.generation = entry.deletes;
        let mut ended_live = false;
        if let Some(last) = entry.versions.last() {
            if let Some(previous) = self.slots.get_mut(usize::try_from(*last).unwrap_or(usize::MAX)) {
                if previous.seq_ended == SEQ_OPEN {
                    previous.seq_ended = seq;
                    ended_live = !previous.is_retired();
                }
            }
        }
        entry.versions.push(slot);
        match (ended_live, version.is_retired()) {
            (false, false) => self.live_ids += 1,
            (true, true) => self.live_ids = self.live_ids.saturating_sub(1),
            _ => {}
        }
        self.version_string_bytes += version.version.len() as u64;
        self.slots.push(version);
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
                seq_ended: SEQ_OPEN,
                timestamp: put.timestamp,
                expires_at: put.expires_at().unwrap_or(NEVER_EXPIRES),
                hash: put.hash,
                version: Box::from(put.version),
                location,
                id: 0,
                generation: 0,
                kind,
                scope,
                source,
                state: VersionState::Stored,
            },
        );
        let key = (put.timestamp, slot);
        let kind_index = usize::from(kind);
        if self.by_type.len() <= kind_index {
            self.by_type.resize_with(kind_index + 1, BTreeSet::new);
        }
        if let Some(set) = self.by_type.get_mut(kind_index) {
            set.insert(key);
        }
        let scope_index = usize::try_from(scope).unwrap_or(usize::MAX);
        if self.by_scope.len() <= scope_index {
            self.by_scope.resize_with(scope_index + 1, BTreeSet::new);
        }
        if let Some(set) = self.by_scope.get_mut(scope_index) {
            set.insert(key);
        }
        self.by_time.insert(key);
    }

    /// Records a retired version (content reclaimed, identity remembered) replayed from the log.
    pub(crate) fn apply_retired(&mut self, seq: u64, id: &str, version: &str, hash: [u8; 32], location: Location) {
        self.push_version(
            seq,
            id,
            VersionEntry {
                seq_created: seq,
                seq_ended: SEQ_OPEN,
                timestamp: 0,
                expires_at: NEVER_EXPIRES,
                hash,
                version: Box::from(version),
                location,
                id: 0,
                generation: 0,
                kind: 0,
                scope: 0,
                source: 0,
                state: VersionState::Retired,
            },
        );
    }

    /// Records a tombstone of `name` by the batch `seq`; returns whether the id had a current history.
    pub(crate) fn apply_delete(&mut self, seq: u64, name: &str) -> bool {
        let had_history = self.current_history(name).next().is_some();
        let Some(id) = self.by_name.get(name).copied() else {
            return false;
        };
        let Some(entry) = self.ids.get_mut(usize::try_from(id).unwrap_or(usize::MAX)) else {
            return false;
        };
        if !had_history {
            return false;
        }
        entry.deletes += 1;
        if let Some(last) = entry.versions.last() {
            if let Some(previous) = self.slots.get_mut(usize::try_from(*last).unwrap_or(usize::MAX)) {
                if previous.seq_ended == SEQ_OPEN {
                    previous.seq_ended = seq;
                    if !previous.is_retired() {
                        self.live_ids = self.live_ids.saturating_sub(1);
                    }
                }
            }
        }
        true
    }

    /// Appends a version as a checkpoint recorded it; the ordered sets are built afterwards by
    /// [`Index::rebuild_sets`]. `version.id` is set here.
    pub(crate) fn restore_version(&mut self, name: &str, deletes: u32, mut version: VersionEntry) {
        let slot = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        let id = self.id_position(name);
        if let Some(entry) = self.ids.get_mut(usize::try_from(id).unwrap_or(usize::MAX)) {
            entry.deletes = deletes;
            entry.versions.push(slot);
        }
        version.id = id;
        if version.seq_ended == SEQ_OPEN && version.is_stored() {
            self.live_ids += 1;
        }
        self.version_string_bytes += version.version.len() as u64;
        self.slots.push(version);
    }

    /// Restores an id that a checkpoint recorded without versions (all dropped by compaction), so
    /// that its delete count is kept.
    pub(crate) fn restore_id(&mut self, name: &str, deletes: u32) {
        let id = self.id_position(name);
        if let Some(entry) = self.ids.get_mut(usize::try_from(id).unwrap_or(usize::MAX)) {
            entry.deletes = deletes;
        }
    }

    /// Installs the interned tables a checkpoint recorded.
    pub(crate) fn set_tables(
        &mut self,
        kinds: Interner<Box<str>>,
        scopes: Interner<Scope>,
        sources: Interner<Box<str>>,
    ) {
        self.session_scopes = scopes
            .values()
            .iter()
            .enumerate()
            .filter_map(|(number, scope)| Some((Box::from(scope.session_id()?), u32::try_from(number).ok()?)))
            .collect();
        self.kinds = kinds;
        self.scopes = scopes;
        self.sources = sources;
    }

    /// Builds the ordered sets from the stored versions, in bulk.
    pub(crate) fn rebuild_sets(&mut self) {
        let mut by_type: Vec<Vec<(i64, u32)>> = vec![Vec::new(); self.kinds.len()];
        let mut by_scope: Vec<Vec<(i64, u32)>> = vec![Vec::new(); self.scopes.len()];
        let mut by_time = Vec::with_capacity(self.slots.len());
        for (slot, version) in self.slots.iter().enumerate() {
            if !version.is_stored() {
                continue;
            }
            let key = (version.timestamp, u32::try_from(slot).unwrap_or(u32::MAX));
            if let Some(keys) = by_type.get_mut(usize::from(version.kind)) {
                keys.push(key);
            }
            if let Some(keys) = by_scope.get_mut(usize::try_from(version.scope).unwrap_or(usize::MAX)) {
                keys.push(key);
            }
            by_time.push(key);
        }
        self.by_type = by_type.into_iter().map(BTreeSet::from_iter).collect();
        self.by_scope = by_scope.into_iter().map(BTreeSet::from_iter).collect();
        self.by_time = BTreeSet::from_iter(by_time);
    }

    /// Removes a stored version's entries from the ordered sets.
    pub(crate) fn unlink_from_sets(&mut self, slot: u32) {
        let Some(version) = self.slot(slot) else { return };
        let key = (version.timestamp, slot);
        let (kind, scope) = (
            usize::from(version.kind),
            usize::try_from(version.scope).unwrap_or(usize::MAX),
        );
        if let Some(set) = self.by_type.get_mut(kind) {
            set.remove(&key);
        }
        if let Some(set) = self.by_scope.get_mut(scope) {
            set.remove(&key);
        }
        self.by_time.remove(&key);
    }

    /// Compaction moved a version's record (stored or retired) to `location`.
    pub(crate) fn relocate(&mut self, slot: u32, location: Location) {
        if let Some(version) = self.slots.get_mut(usize::try_from(slot).unwrap_or(usize::MAX)) {
            version.location = location;
        }
    }

    /// Compaction reclaimed a version's content but the store still remembers its identity; the
    /// retired record is at `location`.
    /// Its entries stay in the ordered sets (readers skip versions that are not stored) until
    /// [`Index::unlink_from_sets`]; returns whether it was stored (so has entries there).
    pub(crate) fn retire(&mut self, slot: u32, location: Location) -> bool {
        let Some(version) = self.slots.get_mut(usize::try_from(slot).unwrap_or(usize::MAX)) else {
            return false;
        };
        let was_stored = version.state == VersionState::Stored;
        if was_stored && version.seq_ended == SEQ_OPEN {
            self.live_ids = self.live_ids.saturating_sub(1);
        }
        version.state = VersionState::Retired;
        version.location = location;
        was_stored
    }

    /// Compaction dropped every trace of a version of a closed history.
    /// As with [`Index::retire`], its set entries are unlinked later; returns whether it was stored.
    pub(crate) fn forget(&mut self, slot: u32) -> bool {
        let Some(version) = self.slots.get_mut(usize::try_from(slot).unwrap_or(usize::MAX)) else {
            return false;
        };
        let was_stored = version.state == VersionState::Stored;
        version.state = VersionState::Forgotten;
        version.version = Box::from("");
        let id = version.id;
        if let Some(entry) = self.ids.get_mut(usize::try_from(id).unwrap_or(usize::MAX)) {
            entry.versions.retain(|s| *s != slot);
        }
        self.forgotten += 1;
        was_stored
    }

    /// An estimate of the heap and inline bytes the index uses, and the formula's parts.
    pub(crate) fn estimated_bytes(&self) -> u64 {
        // BTreeSet nodes hold up to 11 keys; at the usual two-thirds fill a key costs its size plus
        // about half again for node overhead.
        let set_key_bytes = (std::mem::size_of::<(i64, u32)>() as u64) * 3 / 2;
        let set_keys = self.by_time.len() as u64
            + self.by_type.iter().map(|set| set.len() as u64).sum::<u64>()
            + self.by_scope.iter().map(|set| set.len() as u64).sum::<u64>();
        // A hash map entry: key and value plus one control byte, at a load factor of 7/8.
        let map_entry_bytes = (std::mem::size_of::<(Arc<str>, u32)>() as u64 + 1) * 8 / 7;
        // Arc<str> heap: two counters and the bytes. Box<str>: the bytes (allocator rounding ignored).
        let id_heap = self.id_string_bytes + 16 * self.ids.len() as u64;
        let versions_vec = self
            .ids
            .iter()
            .filter(|entry| entry.versions.spilled())
            .map(|entry| entry.versions.capacity() as u64 * 4)
            .sum::<u64>();
        std::mem::size_of::<VersionEntry>() as u64 * self.slots.capacity() as u64
            + self.version_string_bytes
            + std::mem::size_of::<IdEntry>() as u64 * self.ids.capacity() as u64
            + versions_vec
            + id_heap
            + map_entry_bytes * self.by_name.len() as u64
            + set_key_bytes * set_keys
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
mod tests {
    use super::*;

    fn put<'a>(id: &'a str, version: &'a str, timestamp: i64) -> PutView<'a> {
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
    };

    #[test]
    fn versions_end_where_the_next_begins() {
        let mut index = Index::default();
        index.apply_put(1, &put("a", "1", 10), HERE);
        index.apply_put(2, &put("a", "2", 5), HERE);
        assert_eq!(index.visible("a", 1).map(|v| &*v.version.version), Some("1"));
        assert_eq!(index.visible("a", 2).map(|v| &*v.version.version), Some("2"));
        assert!(index.visible("a", 0).is_none());
        assert_eq!(index.live_ids, 1);
        assert!(index.apply_delete(3, "a"));
        assert!(index.visible("a", 3).is_none());
        assert_eq!(index.visible("a", 2).map(|v| &*v.version.version), Some("2"));
        assert_eq!(index.current_history("a").count(), 0);
        assert!(!index.apply_delete(4, "a"), "a second delete finds no history");
        index.apply_put(5, &put("a", "1", 1), HERE);
        assert_eq!(index.current_history("a").count(), 1);
        assert_eq!(index.live_ids, 1);
        assert_eq!(index.by_time.len(), 3);
    }

    #[test]
    fn same_batch_versions_leave_only_the_last_visible() {
        let mut index = Index::default();
        index.apply_put(1, &put("a", "1", 10), HERE);
        index.apply_put(1, &put("a", "2", 10), HERE);
        assert_eq!(index.visible("a", 1).map(|v| &*v.version.version), Some("2"));
        assert!(index.estimated_bytes() > 0);
    }
}
