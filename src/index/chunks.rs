//! A growable array in fixed chunks ([`ChunkVec`]): what the version table and the name arena are
//! built on, so that appending never moves what is stored.

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
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn get(&self, position: usize) -> Option<&T> {
        self.chunks.get(position / CHUNK)?.get(position % CHUNK)
    }

    #[inline]
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
    pub(super) fn append(&mut self, other: ChunkVec<T>) -> bool {
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
    #[inline]
    pub(super) fn run(&self, range: std::ops::Range<usize>) -> &[T] {
        let chunk = range.start / CHUNK;
        let within = range.start % CHUNK..range.end.saturating_sub(chunk * CHUNK);
        self.chunks.get(chunk).and_then(|c| c.get(within)).unwrap_or_default()
    }

    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        self.chunks.iter().flatten()
    }

    /// Heap bytes held, allocated capacity included.
    pub(super) fn heap_bytes(&self) -> u64 {
        (self.chunks.iter().map(Vec::capacity).sum::<usize>() * std::mem::size_of::<T>()
            + self.chunks.capacity() * std::mem::size_of::<Vec<T>>()) as u64
    }
}
