//! Id names, front-coded in a chunked arena ([`NameArena`]): each name stored as the bytes it does
//! not share with the previous id's, every sixteenth whole; rebuilt on the stack ([`NameBuf`]) or
//! compared piece by piece without rebuilding.

use crate::num::{bounded, u64_from_usize, usize_from_u64};

use super::chunks::{ChunkVec, CHUNK};
use super::position;

/// Bytes per chunk of the name arena; a stored name part (at most 255 bytes) never spans two.
pub(crate) const NAME_CHUNK: usize = 1 << 16;

/// Ids per mark of the name arena: a name is rebuilt from the mark before it, through at most this
/// many names. A divisor of [`CHUNK`], so that the parts from a mark to any name are in one chunk.
pub(super) const NAME_MARK: usize = 16;
const _: () = assert!(CHUNK.is_multiple_of(NAME_MARK));

/// The longest id name the arena holds: what a log record's one length byte allows (a put's id is
/// at most [`ID_BYTES_MAX`](crate::limits::ID_BYTES_MAX) bytes).
pub(super) const NAME_MAX: usize = 255;
const _: () = assert!(crate::limits::ID_BYTES_MAX <= NAME_MAX && NAME_MAX <= u8::MAX as usize);

/// Id names, front-coded. In id order, each name is stored as the bytes it does not share with the
/// previous id's name (at least one), back to back in chunks that never move; a chunk holds whole
/// parts only, and a part that does not fit in the chunk being filled starts the next one (so a
/// part ends its chunk exactly when it ends where the chunk does). Every [`NAME_MARK`]-th name is
/// stored whole, and where it starts is kept. Per id: two bytes (shared and stored lengths) and
/// the stored part, so that sequential and structured ids (`item-00000017`, `s4/chunk-9`) take a
/// few bytes each, and random ones two bytes more than their length.
#[derive(Debug, Clone, Default)]
pub(crate) struct NameArena {
    chunks: Vec<String>,
    /// Per id: bytes its name shares with the previous id's, and bytes stored.
    parts: ChunkVec<[u8; 2]>,
    /// Where the part of id `k * NAME_MARK` starts: chunk << 32 | offset.
    marks: Vec<u64>,
    /// The last id's name, which the next one is coded against.
    last: String,
}

/// A name rebuilt from the arena, on the stack.
pub(crate) struct NameBuf {
    bytes: [u8; NAME_MAX],
    pub(super) len: usize,
}

impl NameBuf {
    #[inline]
    pub(crate) fn new() -> NameBuf {
        NameBuf {
            bytes: [0; NAME_MAX],
            len: 0,
        }
    }

    #[inline]
    pub(super) fn as_str(&self) -> &str {
        // Parts are cut at character boundaries, so a rebuilt name is UTF-8.
        std::str::from_utf8(self.bytes.get(..self.len).unwrap_or_default()).unwrap_or("")
    }

    /// Puts `part` after the first `shared` bytes of the name held; false if it cannot be there.
    #[inline]
    pub(super) fn extend(&mut self, shared: usize, part: &[u8]) -> bool {
        if shared > self.len {
            return false;
        }
        let Some(place) = self.bytes.get_mut(shared..shared + part.len()) else {
            return false;
        };
        place.copy_from_slice(part);
        self.len = shared + part.len();
        true
    }
}

/// Bytes `name` shares with `last` at its start, cut at a character boundary and leaving at least
/// one byte of `name`.
fn shared_prefix(last: &str, name: &str) -> usize {
    let mut shared = last
        .bytes()
        .zip(name.bytes())
        .take_while(|(a, b)| a == b)
        .count()
        .min(name.len().saturating_sub(1));
    while !name.is_char_boundary(shared) {
        shared -= 1;
    }
    shared
}

/// A mark of the name arena: where a part starts, as chunk << 32 | offset.
#[inline]
pub(super) fn mark_of((chunk, offset): (usize, usize)) -> u64 {
    ((chunk as u64) << 32) | offset as u64
}

/// The (chunk, offset) a mark holds.
fn mark_place(mark: u64) -> (usize, usize) {
    (usize_from_u64(mark >> 32), usize_from_u64(mark & 0xffff_ffff))
}

/// Where each of consecutive parts, of the stored lengths `lens`, starts in `chunks`, the first at
/// `(chunk, offset)`: a part that ends its chunk is followed by the next chunk's first part. The one
/// statement of the rule the arena fills its chunks by, for everything that reads them.
pub(super) fn part_places<'a, S: AsRef<str>>(
    chunks: &'a [S],
    (mut chunk, mut offset): (usize, usize),
    lens: impl Iterator<Item = usize> + 'a,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let chunk_len = move |chunk: usize| chunks.get(chunk).map_or(0, |c| c.as_ref().len());
    let mut len_here = chunk_len(chunk);
    lens.map(move |len| {
        if offset == len_here {
            chunk += 1;
            offset = 0;
            len_here = chunk_len(chunk);
        }
        let place = (chunk, offset);
        offset += len;
        place
    })
}

/// The stored length of each of `parts`.
pub(super) fn stored_lens<'a>(parts: impl Iterator<Item = &'a [u8; 2]> + 'a) -> impl Iterator<Item = usize> + 'a {
    parts.map(|[_, len]| usize::from(*len))
}

/// Rebuilds in `buf` the name whose parts are `parts` (from a mark to it), the first at `mark` in
/// `chunks` (see [`name_pieces`]); empty if they do not fit.
pub(super) fn rebuild_name<'b, S: AsRef<str>>(
    chunks: &[S],
    parts: &[[u8; 2]],
    mark: u64,
    buf: &'b mut NameBuf,
) -> &'b str {
    let bytes = &mut buf.bytes;
    let len = name_pieces(chunks, parts, mark, |at, piece| {
        bytes
            .get_mut(at..at + piece.len())
            .map(|place| place.copy_from_slice(piece))
            .is_some()
    });
    buf.len = len.unwrap_or(0);
    buf.as_str()
}

/// Hands `piece` the parts that the bytes of a name come from, last first: each as the position in
/// the name where it goes and its bytes, until the whole name is covered. `parts` are those of the
/// ids from a mark to the name's, and `mark` where the first of them is in `chunks`. Returns the
/// name's length, or `None` (having stopped) if `piece` says no or the parts do not fit.
fn name_pieces<S: AsRef<str>>(
    chunks: &[S],
    parts: &[[u8; 2]],
    mark: u64,
    mut piece: impl FnMut(usize, &[u8]) -> bool,
) -> Option<usize> {
    if parts.is_empty() || parts.len() > NAME_MARK {
        return None;
    }
    let mut places = [(0usize, 0usize); NAME_MARK];
    for (place, found) in places
        .iter_mut()
        .zip(part_places(chunks, mark_place(mark), stored_lens(parts.iter())))
    {
        *place = found;
    }
    // Backwards, each part gives the bytes from where it starts in its name up to where a later
    // part took over: for sequential names, a few parts give all.
    let &[shared, len] = parts.last()?;
    let total = usize::from(shared) + usize::from(len);
    let mut needed = total;
    for ([shared, _], (chunk, offset)) in parts.iter().zip(places).rev() {
        let shared = usize::from(*shared);
        if shared < needed {
            let bytes = chunks
                .get(chunk)
                .and_then(|c| c.as_ref().as_bytes().get(offset..offset + (needed - shared)))?;
            if !piece(shared, bytes) {
                return None;
            }
            needed = shared;
        }
        if needed == 0 {
            return Some(total);
        }
    }
    None
}

impl NameArena {
    /// Stores the name of the next id, at most [`NAME_MAX`] bytes: a put's id is validated, and a
    /// replayed record's is no longer than its length byte allows.
    pub(super) fn push(&mut self, name: &str) {
        assert!(
            name.len() <= NAME_MAX,
            "an id name of {} bytes is past the {NAME_MAX} the index holds",
            name.len()
        );
        let marked = self.parts.len().is_multiple_of(NAME_MARK);
        let shared = if marked { 0 } else { shared_prefix(&self.last, name) };
        let part = name.get(shared..).unwrap_or("");
        if self
            .chunks
            .last()
            .is_none_or(|chunk| chunk.len() + part.len() > NAME_CHUNK)
        {
            self.chunks.push(String::with_capacity(NAME_CHUNK));
        }
        let chunk = self.chunks.len() - 1;
        let Some(last) = self.chunks.last_mut() else { return };
        let offset = last.len();
        last.push_str(part);
        if marked {
            self.marks.push(mark_of((chunk, offset)));
        }
        // Both at most the name's length, at most NAME_MAX (asserted above).
        self.parts.push([
            bounded(shared, "shared bytes of an id name (at most NAME_MAX)"),
            bounded(part.len(), "stored bytes of an id name (at most NAME_MAX)"),
        ]);
        self.last.clear();
        self.last.push_str(name);
    }

    /// The parts of id number `id`'s name from the mark before it, and that mark.
    fn block(&self, id: u32) -> Option<(&[[u8; 2]], u64)> {
        let id = position(id);
        let &mark = self.marks.get(id / NAME_MARK)?;
        Some((self.parts.run(id - id % NAME_MARK..id + 1), mark))
    }

    /// [`name_pieces`] of id number `id`.
    fn pieces(&self, id: u32, piece: impl FnMut(usize, &[u8]) -> bool) -> Option<usize> {
        let (parts, mark) = self.block(id)?;
        name_pieces(&self.chunks, parts, mark, piece)
    }

    /// Rebuilds the name of id number `id` in `buf`; empty if out of bounds.
    #[inline]
    pub(super) fn name_into<'b>(&self, id: u32, buf: &'b mut NameBuf) -> &'b str {
        match self.block(id) {
            Some((parts, mark)) => rebuild_name(&self.chunks, parts, mark, buf),
            None => {
                buf.len = 0;
                ""
            }
        }
    }

    /// Whether id number `id` is named `name`, compared piece by piece without rebuilding it.
    #[inline]
    pub(super) fn is(&self, id: u32, name: &str) -> bool {
        let name = name.as_bytes();
        let fits = self
            .parts
            .get(position(id))
            .is_some_and(|[shared, len]| usize::from(*shared) + usize::from(*len) == name.len());
        fits && self
            .pieces(id, |at, piece| name.get(at..at + piece.len()) == Some(piece))
            .is_some()
    }

    /// How many names the arena holds.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.parts.len()
    }

    /// The length of id number `id`'s name.
    #[inline]
    pub(super) fn name_len(&self, id: u32) -> usize {
        self.parts
            .get(position(id))
            .map_or(0, |[shared, len]| usize::from(*shared) + usize::from(*len))
    }

    /// Calls `each` with every id's number and name, in id order.
    pub(super) fn for_each(&self, mut each: impl FnMut(u32, &str)) {
        let mut buf = NameBuf::new();
        let places = part_places(&self.chunks, (0, 0), stored_lens(self.parts.iter()));
        for (id, ([shared, len], (chunk, offset))) in self.parts.iter().zip(places).enumerate() {
            let part = self
                .chunks
                .get(chunk)
                .and_then(|c| c.as_bytes().get(offset..offset + usize::from(*len)));
            if !part.is_some_and(|part| buf.extend(usize::from(*shared), part)) {
                buf.len = 0;
            }
            each(bounded(id, "id number (limits::IDS_MAX)"), buf.as_str());
        }
    }

    /// A copy of the names a checkpoint stores as the arena holds them: `parts` has the shared and
    /// stored lengths of each id, and the parts are back to back in `chunks`. The layout is checked
    /// by [`IdTable::from_name_parts`](super::IdTable::from_name_parts) (on another thread, from the
    /// same bytes); this only copies it.
    pub(crate) fn from_parts(chunks: &[&str], parts: &[[u8; 2]]) -> NameArena {
        let mut arena = NameArena {
            chunks: chunks
                .iter()
                .map(|text| {
                    let mut chunk = String::with_capacity(NAME_CHUNK);
                    chunk.push_str(text);
                    chunk
                })
                .collect(),
            // Each chunk with room for CHUNK entries, as pushing allocates them.
            parts: ChunkVec::from_chunks(
                parts
                    .chunks(CHUNK)
                    .map(|run| {
                        let mut chunk = Vec::with_capacity(CHUNK);
                        chunk.extend_from_slice(run);
                        chunk
                    })
                    .collect(),
            ),
            marks: Vec::with_capacity(parts.len().div_ceil(NAME_MARK)),
            last: String::new(),
        };
        arena.marks = part_places(chunks, (0, 0), stored_lens(parts.iter()))
            .step_by(NAME_MARK)
            .map(mark_of)
            .collect();
        if let Some(last) = parts.len().checked_sub(1).and_then(|id| u32::try_from(id).ok()) {
            arena.last = arena.name_into(last, &mut NameBuf::new()).to_owned();
        }
        arena
    }

    /// The shared and stored lengths of each id's name, in id order, and the chunks of parts.
    pub(crate) fn parts_and_chunks(&self) -> (impl Iterator<Item = &[u8; 2]> + '_, &[String]) {
        (self.parts.iter(), &self.chunks)
    }

    pub(super) fn heap_bytes(&self) -> u64 {
        u64_from_usize(
            self.chunks.iter().map(String::capacity).sum::<usize>()
                + self.chunks.capacity() * 24
                + self.marks.capacity() * 8
                + self.last.capacity(),
        ) + self.parts.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::ids::IdTable;
    use crate::index::tests::{put, HERE};
    use crate::index::Index;

    #[test]
    fn names_are_found_by_number_and_by_name_across_chunks() {
        let mut index = Index::default();
        // Lengths 1 to 255 (multi-byte characters included) fill chunks to uneven ends, so that
        // names end chunks at every position relative to the layout's marks.
        let names: Vec<String> = (0..6000usize)
            .map(|n| {
                let len = 1 + (n * 7919) % 120;
                let mut name = format!("{n}-");
                while name.len() < len {
                    name.push(if n % 5 == 0 { 'é' } else { 'x' });
                }
                name
            })
            .collect();
        for (n, name) in names.iter().enumerate() {
            index.apply_put(1 + n as u64, &put(name, "1", 5), HERE);
        }
        assert!(index.names.chunks.len() > 5, "the names span several chunks");
        for (n, name) in names.iter().enumerate() {
            let id = u32::try_from(n).unwrap();
            assert_eq!(&index.id_name(id), name, "id {n}");
            assert_eq!(index.id_number(name), Some(id), "id {n}");
        }
        let mut in_order = Vec::new();
        index.for_each_id_name(|id, name| in_order.push((id, name.to_owned())));
        assert!(in_order.iter().map(|(_, name)| name).eq(names.iter()));
        assert!(in_order.iter().map(|(id, _)| *id).eq(0..6000));
        assert_eq!(index.id_name(6000), "");
        assert_eq!(index.id_number("6000-"), None);
        assert_eq!(index.id_number("1-"), None, "a prefix of a known name");
        // The arena copied from its parts and chunks (as a checkpoint loads it) holds the same
        // names, and the next name is coded against the last one, as in the original.
        let (parts, chunks) = index.names.parts_and_chunks();
        let parts: Vec<[u8; 2]> = parts.copied().collect();
        let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
        let mut rebuilt = NameArena::from_parts(&chunks, &parts);
        let mut buf = NameBuf::new();
        for (n, name) in names.iter().enumerate() {
            assert_eq!(rebuilt.name_into(u32::try_from(n).unwrap(), &mut buf), name);
        }
        let mut original = index.names.clone();
        for arena in [&mut rebuilt, &mut original] {
            arena.push("5999-y");
            assert_eq!(arena.name_into(6000, &mut buf), "5999-y");
        }
        assert_eq!(rebuilt.parts.iter().last(), original.parts.iter().last());
        assert!(IdTable::from_name_parts(&chunks, &parts).is_ok());
    }

    /// Names drawn from a few stems and alphabets (multi-byte characters included), so that
    /// neighbours often share prefixes of every length and sometimes share nothing.
    fn arb_names() -> impl proptest::strategy::Strategy<Value = Vec<String>> {
        use proptest::prelude::*;
        let piece = prop_oneof![
            Just("item-".to_owned()),
            Just("s/".to_owned()),
            Just("é".to_owned()),
            Just("日本".to_owned()),
            "[a-c0-2]{1,3}",
            "[x-zé]{0,40}",
        ];
        prop::collection::vec(prop::collection::vec(piece, 1..6), 0..400).prop_map(|names| {
            let mut seen = std::collections::HashSet::new();
            names
                .into_iter()
                .map(|pieces| {
                    let mut name = pieces.concat();
                    name.truncate(
                        name.char_indices()
                            .map(|(at, c)| at + c.len_utf8())
                            .take_while(|end| *end <= 128)
                            .last()
                            .unwrap_or(0),
                    );
                    name
                })
                .filter(|name| !name.is_empty() && seen.insert(name.clone()))
                .collect()
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// The front-coded arena against a plain list of the names: every name rebuilt, compared
        /// (with itself and its neighbours), measured and found; the copy a checkpoint loads
        /// (parts and chunks) holds the same and passes the loader's checks.
        #[test]
        fn the_name_arena_holds_exactly_the_names_pushed(filler in 520usize..560, drawn in arb_names()) {
            // 120-byte names that share nothing with their neighbours fill most of a chunk, so
            // that the first chunk ends among the drawn names or just before them.
            let mut names: Vec<String> = (0..filler)
                .map(|n| format!("{}{n:0>119}", char::from(b'A' + u8::try_from(n % 26).unwrap())))
                .collect();
            names.extend(drawn);
            let mut index = Index::default();
            for (n, name) in names.iter().enumerate() {
                index.apply_put(1 + n as u64, &put(name, "1", 5), HERE);
            }
            let arena = &index.names;
            let mut buf = NameBuf::new();
            for (n, name) in names.iter().enumerate() {
                let id = u32::try_from(n).unwrap();
                proptest::prop_assert_eq!(arena.name_into(id, &mut buf), name.as_str());
                proptest::prop_assert!(arena.is(id, name));
                proptest::prop_assert_eq!(arena.name_len(id), name.len());
                proptest::prop_assert_eq!(index.id_number(name), Some(id));
                for other in [n.wrapping_sub(1), n + 1] {
                    if let Some(other) = names.get(other) {
                        proptest::prop_assert!(!arena.is(id, other));
                    }
                }
            }
            let mut all = Vec::new();
            arena.for_each(|_, name| all.push(name.to_owned()));
            proptest::prop_assert_eq!(&all, &names);
            let (parts, chunks) = arena.parts_and_chunks();
            proptest::prop_assert!(chunks.len() >= 2 || filler * 120 < NAME_CHUNK);
            let parts: Vec<[u8; 2]> = parts.copied().collect();
            let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
            let table = IdTable::from_name_parts(&chunks, &parts);
            proptest::prop_assert!(table.is_ok(), "{:?}", table.err());
            let copy = NameArena::from_parts(&chunks, &parts);
            for (n, name) in names.iter().enumerate() {
                proptest::prop_assert_eq!(copy.name_into(u32::try_from(n).unwrap(), &mut buf), name.as_str());
            }
            proptest::prop_assert_eq!(&copy.last, &arena.last);
        }
    }

    #[test]
    fn sequential_names_take_a_few_bytes_each() {
        let mut arena = NameArena::default();
        let names: Vec<String> = (0..100_000).map(|n| format!("item-{n:08}")).collect();
        for name in &names {
            arena.push(name);
        }
        let per_name = arena.heap_bytes() as f64 / 100_000.0;
        assert!(per_name < 5.0, "{per_name} bytes per 13-byte name");
        let mut buf = NameBuf::new();
        for n in [0, 1, 15, 16, 17, 99_999] {
            assert_eq!(arena.name_into(n, &mut buf), names[n as usize]);
            assert!(arena.is(n, &names[n as usize]));
            assert!(!arena.is(n, "item-1"));
            // Same length, one byte off: in the mark's name, then in the middle.
            let other = names[n as usize].replacen("item", "itex", 1);
            assert!(!arena.is(n, &other));
            let other = names[n as usize].replacen("-000", "-010", 1);
            assert!(!arena.is(n, &other));
        }
        // Shared prefixes stop at a character boundary and leave at least one byte.
        for (last, name, shared) in [("aé", "aè", 1), ("abc", "abc", 2), ("abc", "ab", 1), ("x", "y", 0)] {
            assert_eq!(shared_prefix(last, name), shared, "{last} {name}");
        }
    }
}
