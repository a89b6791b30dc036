//! The id lookup: each id's name, by its hash, to the slot of its newest version (or, for an id with
//! none, its number). The lookup's values and how they are read, the lookups of [`Index`] by name,
//! the table a checkpoint's id names are loaded into ([`IdTable`]), and a larger lookup built off the
//! index write lock ([`GrownLookup`]).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::limits::{IDS_MAX, VERSIONS_MAX};
use crate::num::{bounded, u64_from_usize, usize_from_u32, usize_from_u64};

use super::entry::{VersionState, NO_SLOT};
use super::names::{mark_of, part_places, rebuild_name, stored_lens, NameArena, NameBuf, NAME_MARK, NAME_MAX};
use super::versions::VersionTable;
use super::{position, FastMap, Index, NAME_CHUNK};

/// Marks a value of the id lookup that is an id number (an id with no version in the index) rather
/// than the slot of the id's newest version. Slots and id numbers stay below it.
pub(super) const ID_TAG: u32 = 1 << 31;

// Slot and id numbers are below their counts' limits, and so below the tag.
const _: () = assert!(VERSIONS_MAX <= ID_TAG as usize && IDS_MAX <= ID_TAG as usize);

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
pub(super) fn numbers_to_values(table: &mut HashTable<u32>, heads: &[u32]) {
    for value in table.iter_mut() {
        let id = *value;
        // The table holds the numbers of the ids `heads` has one entry for each of.
        let Some(head) = heads.get(position(id)).copied() else {
            panic!("id number {id} has no entry among the {} ids' heads", heads.len());
        };
        *value = value_of_head(id, head);
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
    let group_of = |hash: u64| usize_from_u64((hash & (u64_from_usize(buckets) - 1)) >> shift);
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
            if let Some(place) = order.get_mut(usize_from_u32(*next)) {
                // Ids are counted against limits::IDS_MAX as they are added or loaded.
                *place = (*hash, bounded(id, "id number (limits::IDS_MAX)"));
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
    pub(super) count: usize,
    pub(super) names: NameArena,
    pub(super) by_name: HashTable<u32>,
    pub(super) hasher: foldhash::fast::RandomState,
    pub(super) deletes: FastMap<u32, u32>,
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
        if parts.len() > IDS_MAX {
            return Err(format!("{} ids, more than the {IDS_MAX} an index holds", parts.len()));
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

/// A larger id lookup built off the index write lock ([`Index::grown_lookup`]).
pub(crate) struct GrownLookup {
    table: HashTable<u32>,
    /// [`Index::head_changes`] when it was built.
    head_changes: u64,
}

impl Index {
    /// The number of id `name` and the slot of its newest version ([`NO_SLOT`] for none), if the
    /// index knows it. The lookup's value leads to the newest version's entry, which names the
    /// id: the name is compared while that entry is read.
    #[inline]
    pub(super) fn id_and_head(&self, name: &str) -> Option<(u32, u32)> {
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
    pub(super) fn id_hash(&self, id: u32) -> u64 {
        self.hasher.hash_one(self.names.name_into(id, &mut NameBuf::new()))
    }

    /// The slot of id number `id`'s newest version ([`NO_SLOT`] for none or an unknown id).
    pub(super) fn head_of(&self, id: u32) -> u32 {
        if !self.has_id(id) {
            return NO_SLOT;
        }
        self.head_by_hash(id, self.id_hash(id))
    }

    /// The slot of id number `id`'s newest version, its name hashing to `hash`.
    pub(super) fn head_by_hash(&self, id: u32, hash: u64) -> u32 {
        self.by_name
            .find(hash, |&value| id_of_value(&self.slots, value) == Some(id))
            .map_or(NO_SLOT, |&value| head_of_value(value))
    }

    /// Makes `head` ([`NO_SLOT`] for none) the newest version of id number `id`, whose name hashes
    /// to `hash`.
    pub(super) fn set_head(&mut self, id: u32, hash: u64, head: u32) {
        let slots = &self.slots;
        if let Some(value) = self
            .by_name
            .find_mut(hash, |&value| id_of_value(slots, value) == Some(id))
        {
            *value = value_of_head(id, head);
        }
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
                    *head = bounded(slot, "slot number (limits::VERSIONS_MAX)");
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
    pub(super) fn push_head(&mut self, name: &str, slot: u32) -> (u32, u32) {
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
        // The writer (planning a batch) and replay (before each record) check room first.
        let id = bounded(self.names.len(), "id number (limits::IDS_MAX)");
        self.names.push(name);
        let (names, hasher, slots) = (&self.names, &self.hasher, &self.slots);
        // Growing in place (when no grown copy was put in first) rehashes the ids known before.
        self.by_name.insert_unique(hash, slot, |&value| {
            let id = id_of_value(slots, value).unwrap_or(0);
            hasher.hash_one(names.name_into(id, &mut NameBuf::new()))
        });
        (id, NO_SLOT)
    }
}

#[cfg(test)]
mod tests {
    use crate::index::tests::{put, HERE};
    use crate::index::Index;

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
}
