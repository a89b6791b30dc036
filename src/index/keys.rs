//! The ordered sets on (type, timestamp), (scope, timestamp) and (timestamp) ([`KeySet`]): a sorted
//! array of slots plus a small B-tree of keys that arrived out of order, read in key order or in
//! reverse.

use std::collections::BTreeSet;

use super::slots::SortedSlots;
use super::versions::VersionTable;

/// The key of a slot in the ordered sets.
pub(crate) fn key_of(slots: &VersionTable, slot: u32) -> (i64, u32) {
    let timestamp = slots
        .timestamp(super::position(slot))
        .map_or(i64::MAX, |timestamp| timestamp);
    (timestamp, slot)
}

/// Set entries inserted out of order that are merged into the sorted array at the latest once
/// there are this many (or an eighth of the array, if more).
const DELTA_MERGE_AT: usize = 4096;

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

    /// Entries of versions still stored.
    pub(crate) fn stored(&self) -> usize {
        self.len().saturating_sub(self.dead)
    }

    pub(super) fn insert(&mut self, slots: &VersionTable, key: (i64, u32)) {
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
        let stored = |slot: &u32| slots.is_stored(super::position(*slot));
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
    pub(super) fn remove(&mut self, key: (i64, u32)) {
        if !self.delta.remove(&key) {
            self.dead += 1;
        }
    }

    /// Drops the entries of slots no longer stored among `base[from..from + max]`. Returns how many
    /// entries it looked at and where to go on, or `None` when the array holds no more of them.
    pub(super) fn purge_step(&mut self, slots: &VersionTable, from: usize, max: usize) -> (usize, Option<usize>) {
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
            let stored = slots.is_stored(super::position(slot));
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

    pub(super) fn heap_bytes(&self) -> u64 {
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

#[cfg(test)]
mod tests {
    use crate::index::slots::SortedSlots;
    use crate::index::tests::{put, HERE};
    use crate::index::{position, Index, KeySet, PurgeCursor, VersionEntry};
    use crate::log::record::ScopeView;

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
}
