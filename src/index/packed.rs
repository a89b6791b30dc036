//! Slot numbers bit-packed as gaps in blocks of 64 ([`Packed`]): one of the forms of an ordered
//! set's sorted array (see [`SortedSlots`](super::slots::SortedSlots)), the one for slots that
//! mostly increase.

/// Entries per block of a [`Packed`] array.
pub(super) const PACK_BLOCK: usize = 64;

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
pub(super) struct Packed {
    blocks: Vec<PackedBlock>,
    words: Vec<u64>,
    pub(super) tail: Vec<u32>,
}

impl Packed {
    /// `slots` packed.
    pub(super) fn from_vec(slots: &[u32]) -> Packed {
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
    #[inline]
    pub(super) fn bytes(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<PackedBlock>() + self.words.len() * 8 + self.tail.len() * 4
    }

    #[inline]
    pub(super) fn len(&self) -> usize {
        self.blocks.len() * PACK_BLOCK + self.tail.len()
    }

    #[inline]
    pub(super) fn last(&self) -> Option<u32> {
        self.tail.last().copied()
    }

    pub(super) fn push(&mut self, slot: u32) {
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
            // At most 33 bits per slot, of at most limits::VERSIONS_MAX slots: under 2^31 words.
            word: crate::num::bounded(start, "word position in a packed array"),
            // 64 minus a count of leading zeros.
            width: crate::num::bounded(width, "bits per gap (at most 64)"),
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
        // The slot it was when it was packed.
        crate::num::bounded(i64::from(slot) + 1 + gap, "a packed slot")
    }

    /// Coded gap `j` of `block`.
    fn gap(&self, block: &PackedBlock, j: usize) -> u64 {
        let width = usize::from(block.width);
        if width == 0 {
            return 0;
        }
        let at = j * width;
        let word = crate::num::usize_from_u32(block.word) + at / 64;
        let shift = at % 64;
        let mut value = self.words.get(word).map_or(0, |w| w >> shift);
        if shift + width > 64 {
            value |= self.words.get(word + 1).map_or(0, |w| w << (64 - shift));
        }
        value & ((1u64 << width) - 1)
    }

    /// The slots of block `number` (the tail after the full blocks) into `out`; returns how many.
    pub(super) fn decode(&self, number: usize, out: &mut [u32; PACK_BLOCK]) -> usize {
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

    pub(super) fn get(&self, position: usize) -> Option<u32> {
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
    pub(super) fn partition_point(&self, mut pred: impl FnMut(u32) -> bool) -> usize {
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

    pub(super) fn heap_bytes(&self) -> u64 {
        (self.blocks.capacity() * std::mem::size_of::<PackedBlock>()
            + self.words.capacity() * 8
            + self.tail.capacity() * 4) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::slots::SortedSlots;

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
}
