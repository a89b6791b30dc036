//! The sorted array of an ordered set ([`SortedSlots`]): runs of consecutive slots, packed gaps
//! ([`Packed`]) or plain slots, whichever pays, with the same positions in every form; and its
//! iterator from either end ([`SlotIter`]).

use super::packed::{Packed, PACK_BLOCK};

/// A run of consecutive slot numbers in a [`SortedSlots`]: its first slot, and the position in the
/// array just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    first: u32,
    end: usize,
}

/// Runs per entry, at most, for an array to be kept as runs: from an eighth on, plain slots take
/// less room (a run takes 8 or 16 bytes, a plain slot 4).
const RUNS_PER_ENTRY_MAX: usize = 8;

/// The sorted array of an ordered set: while its slots come in long runs of consecutive numbers (the
/// time set of items added in time order, whose slots are numbered in the order they were added),
/// those runs; else, while that takes less room, packed as gaps between slots ([`Packed`]; the sets
/// of items added in time order, where the slots increase along the array, take a few bits per
/// entry); else the plain slots, which is also the form a purge edits. The positions are the same in
/// every form.
#[derive(Debug, Clone)]
pub(super) enum SortedSlots {
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
    pub(super) fn from_vec(slots: Vec<u32>) -> SortedSlots {
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

    #[inline]
    pub(super) fn len(&self) -> usize {
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

    #[inline]
    pub(super) fn last(&self) -> Option<u32> {
        match self {
            SortedSlots::Plain(slots) => slots.last().copied(),
            SortedSlots::Runs(runs) => {
                let last = runs.len().checked_sub(1)?;
                let run = runs.get(last)?;
                let count = run.end - SortedSlots::run_start(runs, last);
                // A run's slots are slot numbers, the last one included.
                Some(run.first + crate::num::bounded::<u32, _>(count - 1, "slots in a run"))
            }
            SortedSlots::Packed(packed) => packed.last(),
        }
    }

    /// The slot at `position`.
    #[inline]
    pub(super) fn get(&self, position: usize) -> Option<u32> {
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
    pub(super) fn push(&mut self, slot: u32) {
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
    pub(super) fn partition_point(&self, mut pred: impl FnMut(u32) -> bool) -> usize {
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
    #[inline]
    pub(super) fn iter(&self, from: usize, to: usize) -> SlotIter<'_> {
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
    pub(super) fn to_vec(&self) -> Vec<u32> {
        match self {
            SortedSlots::Plain(slots) => slots.clone(),
            SortedSlots::Runs(_) | SortedSlots::Packed(_) => self.iter(0, self.len()).collect(),
        }
    }

    /// Keeps the array as plain slots, for editing in place.
    pub(super) fn make_plain(&mut self) {
        if !matches!(self, SortedSlots::Plain(_)) {
            *self = SortedSlots::Plain(self.to_vec());
        }
    }

    /// The slots, in order, as a vector (the array is left empty).
    pub(super) fn take_vec(&mut self) -> Vec<u32> {
        match std::mem::take(self) {
            SortedSlots::Plain(slots) => slots,
            other @ (SortedSlots::Runs(_) | SortedSlots::Packed(_)) => other.to_vec(),
        }
    }

    pub(super) fn heap_bytes(&self) -> u64 {
        match self {
            SortedSlots::Plain(slots) => (slots.capacity() * 4) as u64,
            SortedSlots::Runs(runs) => (runs.capacity() * std::mem::size_of::<Run>()) as u64,
            SortedSlots::Packed(packed) => packed.heap_bytes(),
        }
    }
}

/// Positions `front..back` of a [`Packed`] array, with the last block decoded at either end.
pub(super) struct PackedIter<'a> {
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
pub(super) enum SlotIter<'a> {
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

    #[inline]
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
    #[inline]
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

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
}
