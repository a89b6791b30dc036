//! The mutations of the index: versions put, retired and deleted as the log records them, the index
//! built from a checkpoint's tables, and what compaction changes (records relocated, versions
//! retired or forgotten, the ordered sets purged of them).

use crate::item::Scope;
use crate::limits::{SCOPES_MAX, VERSIONS_MAX};
use crate::log::record::{PutView, ScopeView};
use crate::num::bounded;

use super::entry::{Location, Rare, VersionEntry, VersionState, NEVER_EXPIRES, NO_SLOT, SCOPE_UNKNOWN, SEQ_OPEN};
use super::ids::{numbers_to_values, IdTable};
use super::interner::Interner;
use super::keys::KeySet;
use super::versions::VersionTable;
use super::{position, Index};

/// Where a stepwise purge of the ordered sets has got to ([`Index::purge_sets_step`]): the set (the
/// time set, then the type sets, then the scope sets) and the position in its array.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PurgeCursor {
    set: usize,
    at: usize,
}

impl Index {
    /// Sets the version's expiry, generation, source and end, in the entry or, if they do not all
    /// fit, in the overflow table.
    fn set_rare(&mut self, version: &mut VersionEntry, rare: Rare) {
        if let Some(rare) = version.set_rare_inline(rare) {
            // A version gets an overflow entry once at most, and slots are never reused.
            version.set_overflow(bounded(
                self.rare.len(),
                "overflow entry number (one per version at most)",
            ));
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
        // The writer (planning a batch) and replay (before each record) check room first.
        let slot = bounded(self.slots.len(), "slot number (limits::VERSIONS_MAX)");
        // The entry is pushed below, before anything reads the lookup again.
        let (id, head) = self.push_head(name, slot);
        version.id = id;
        version.prev = head;
        let generation = self.deletes.get(&id).copied().unwrap_or(0);
        self.set_rare(&mut version, Rare::open(expires_at, generation, source));
        let ended_live = self.end_version(version.prev, seq).is_some_and(|retired| !retired);
        match (ended_live, version.is_retired()) {
            (false, false) => self.live_ids += 1,
            // The version ended was stored and open: it counted.
            (true, true) => self.live_ids -= 1,
            _ => {}
        }
        self.slots.push(&version);
        slot
    }

    /// Records a new version stored at `location` by the batch with sequence number `seq`.
    pub(crate) fn apply_put(&mut self, seq: u64, put: &PutView<'_>, location: Location) {
        // Types are registered before a put of them (and limited there), and replay checks room.
        let kind = bounded(
            self.kinds.intern_by(put.kind, || Box::from(put.kind)),
            "type number (limits::TYPES_MAX)",
        );
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

    /// Records a retired version (content reclaimed, identity remembered) replayed from the log, with
    /// the type and scope its record keeps (`ended`; `None` for a record of segment format 1 or 2,
    /// which keeps neither: the version's scope number is then [`SCOPE_UNKNOWN`]).
    pub(crate) fn apply_retired(
        &mut self,
        seq: u64,
        id: &str,
        version: &str,
        ended: Option<(&str, ScopeView<'_>)>,
        location: Location,
    ) {
        let (kind, scope) = match ended {
            Some((kind, scope)) => (
                // As for a put: replay checks room for the type first.
                bounded(
                    self.kinds.intern_by(kind, || Box::from(kind)),
                    "type number (limits::TYPES_MAX)",
                ),
                self.intern_scope(scope),
            ),
            None => (0, SCOPE_UNKNOWN),
        };
        self.push_version(
            seq,
            id,
            VersionEntry {
                seq_created: seq,
                location,
                scope,
                ..VersionEntry::default()
            }
            .with_meta(0, kind, VersionState::Retired)
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
            // It was stored and open: it counted.
            self.live_ids -= 1;
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
        if slots.len() > VERSIONS_MAX {
            return Err(format!(
                "{} versions, more than the {VERSIONS_MAX} an index holds",
                slots.len()
            ));
        }
        if tables.1.len() > SCOPES_MAX {
            return Err(format!(
                "{} scopes, more than the {SCOPES_MAX} an index holds",
                tables.1.len()
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
            *head = bounded(at, "slot number (checked against limits::VERSIONS_MAX above)");
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
            .filter_map(|(number, scope)| {
                let number = bounded(number, "scope number (checked against limits::SCOPES_MAX above)");
                Some((Box::from(scope.session_id()?), number))
            })
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
    /// retired record is at `location`. The version keeps its type and scope numbers (a retired
    /// record of segment format 3 keeps them too; one of format 1 or 2 does not, and its replay
    /// knows neither).
    /// Its entries stay in the ordered sets (readers skip versions that are not stored) until
    /// [`Index::unlink_from_sets`]; returns whether it was stored (so has entries there).
    pub(crate) fn retire(&mut self, slot: u32, location: Location) -> bool {
        let Some(mut version) = self.slots.get(position(slot)) else {
            return false;
        };
        let was_stored = version.is_stored();
        if was_stored && self.is_open(&version) {
            // It counted.
            self.live_ids -= 1;
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
}

#[cfg(test)]
mod tests {
    use crate::index::tests::{put, HERE};
    use crate::index::{version_tag, Index};

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
    fn same_batch_versions_leave_only_the_last_visible() {
        let mut index = Index::default();
        index.apply_put(1, &put("a", "1", 10), HERE);
        index.apply_put(1, &put("a", "2", 10), HERE);
        assert_eq!(visible_tag(&index, "a", 1), Some(version_tag("2")));
        assert!(index.estimated_bytes() > 0);
    }

    #[test]
    fn a_replayed_put_of_a_type_past_the_limit_is_refused_and_one_of_a_known_type_is_not() {
        let mut index = Index::default();
        index.apply_put(1, &put("a", "1", 10), HERE);
        assert!(index.check_room_to_replay(Some("message")).is_ok());
        assert!(index.check_room_to_replay(Some("other")).is_ok());
        assert!(index.check_room_to_replay(None).is_ok());
        let mut n = 0;
        while index.kinds.len() < crate::limits::TYPES_MAX {
            index.kinds.intern(&Box::from(format!("t{n}")));
            n += 1;
        }
        assert!(
            index.check_room_to_replay(Some("message")).is_ok(),
            "a known type takes no room"
        );
        assert!(
            index.check_room_to_replay(None).is_ok(),
            "a retired record of format 1 or 2 names no type"
        );
        let refused = index.check_room_to_replay(Some("other"));
        assert!(
            matches!(&refused, Err(crate::Error::Full { what, .. }) if what == "types"),
            "{refused:?}"
        );
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
