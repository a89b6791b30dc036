//! The version table of a checkpoint decoded: its rows checked against the rest of the file and
//! turned into index entries, a chunk at a time on two threads; the chunks put in slot order with
//! their overflow table; and the ordered sets derived from the time set.

use crate::index::{KeySet, Location, Rare, VersionEntry, VersionState, VersionTable, CHUNK, SCOPE_UNKNOWN, SEQ_OPEN};
use crate::num::usize_from_u32;

use super::{STATE_RETIRED, STATE_STORED, VERSION_BYTES};

#[inline]
fn le_u64(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

#[inline]
pub(super) fn le_u32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// What a version table entry must agree with.
pub(super) struct Bounds<'a> {
    pub(super) seq: u64,
    pub(super) ids: usize,
    /// (number, length) of each recorded segment, by number.
    pub(super) segment_lens: &'a [(u32, u64)],
    pub(super) tables: (usize, usize, usize),
}

/// Decodes one row of the version table, and its expiry and generation if they do not fit in the
/// entry (for the index's overflow table). `segment` is the (number, length) of the segment the
/// previous row pointed into: rows mostly point into the same segment as the row before.
fn decode_version(
    bytes: &[u8; VERSION_BYTES],
    bounds: &Bounds<'_>,
    segment: &mut (u32, u64),
) -> Result<(VersionEntry, Option<Rare>), String> {
    let seq_created = le_u64(bytes, 0);
    let seq_ended = le_u64(bytes, 8);
    let timestamp = le_u64(bytes, 16) as i64;
    let expires_at = le_u64(bytes, 24) as i64;
    let location = Location {
        segment: le_u32(bytes, 32),
        offset: le_u32(bytes, 36),
        len: le_u32(bytes, 40),
        crc: le_u32(bytes, 68),
    };
    let id = le_u32(bytes, 44);
    let generation = le_u32(bytes, 48);
    let version_tag = le_u32(bytes, 52);
    let scope = le_u32(bytes, 56);
    let source = le_u32(bytes, 60);
    let kind = u16::from_le_bytes([bytes.get(64).copied().unwrap_or(0), bytes.get(65).copied().unwrap_or(0)]);
    let state = match (bytes.get(66).copied(), bytes.get(67).copied()) {
        (Some(STATE_STORED), Some(0)) => VersionState::Stored,
        (Some(STATE_RETIRED), Some(0)) => VersionState::Retired,
        (state, _) => return Err(format!("unknown version state {state:?}")),
    };
    if usize_from_u32(id) >= bounds.ids {
        return Err(format!("id number {id} is out of range"));
    }
    if !(0..=crate::limits::TIMESTAMP_MAX).contains(&timestamp) {
        return Err(format!("timestamp {timestamp} is out of range"));
    }
    let (kinds, scopes, sources) = bounds.tables;
    let tables_hold = match state {
        VersionState::Stored => {
            usize::from(kind) < kinds && usize_from_u32(scope) < scopes && usize_from_u32(source) < sources
        }
        // A retired version keeps its type and scope (its source is not looked at), unless
        // they are unknown: then its scope is `SCOPE_UNKNOWN` and its type 0.
        _ if scope == SCOPE_UNKNOWN => kind == 0,
        _ => usize::from(kind) < kinds && usize_from_u32(scope) < scopes,
    };
    if !tables_hold {
        return Err("a table number is out of range".into());
    }
    if segment.0 != location.segment {
        *segment = bounds
            .segment_lens
            .binary_search_by_key(&location.segment, |(number, _)| *number)
            .ok()
            .and_then(|at| bounds.segment_lens.get(at))
            .map_or((location.segment, 0), |known| *known);
    }
    let fits = u64::from(location.offset) + u64::from(location.len) <= segment.1;
    if !fits {
        return Err("it points outside the recorded segments".into());
    }
    if seq_created > bounds.seq || (seq_ended != SEQ_OPEN && (seq_ended > bounds.seq || seq_ended < seq_created)) {
        return Err("its sequence numbers are after the checkpoint or out of order".into());
    }
    let mut version = VersionEntry::default().with_meta(timestamp, kind, state);
    version.seq_created = seq_created;
    version.location = location;
    version.id = id;
    version.scope = scope;
    let Ok(version_tag) = u16::try_from(version_tag) else {
        return Err(format!("version tag {version_tag:#x} is over 16 bits"));
    };
    version = version.with_tag(version_tag);
    let rare = version.set_rare_inline(Rare {
        expires_at,
        seq_ended,
        generation,
        source,
    });
    Ok((version, rare))
}

/// Runs `first` on another thread (on this one when no thread can be started) while this one runs
/// `second`. `first`'s result is always there unless its thread panicked, which is passed on.
pub(super) fn join<A: Send, B>(first: impl FnOnce() -> A + Send, second: impl FnOnce() -> B) -> (Option<A>, B) {
    let first = std::sync::Mutex::new(Some(first));
    let take = || first.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    std::thread::scope(|scope| {
        let other = std::thread::Builder::new()
            .name("ctxlog-checkpoint".into())
            .spawn_scoped(scope, || take().map(|work| work()));
        let b = second();
        let a = match other {
            Ok(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => None,
        };
        // The other thread did not start (or found nothing to do): the work is done here.
        let a = a.or_else(|| take().map(|work| work()));
        (a, b)
    })
}

/// Version table rows decoded by the two threads, a chunk of the index at a time: whichever thread
/// is free takes the next chunk.
pub(super) struct VersionRows<'a> {
    pub(super) rows: &'a [u8],
    pub(super) next: std::sync::atomic::AtomicUsize,
    pub(super) bounds: Bounds<'a>,
}

/// A decoded chunk of the version table: its number, its versions, how many of them are stored,
/// and the expiries and generations that go to the overflow table (by position in the chunk).
pub(super) struct DecodedChunk {
    number: usize,
    versions: VersionTable,
    stored: usize,
    rare: Vec<(usize, Rare)>,
}

pub(super) type DecodedChunks = Vec<DecodedChunk>;

impl VersionRows<'_> {
    pub(super) fn decode_chunks(&self) -> Result<DecodedChunks, String> {
        let mut done = Vec::new();
        loop {
            let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(rows) = self.rows.chunks(CHUNK * VERSION_BYTES).nth(number) else {
                return Ok(done);
            };
            let mut chunk = VersionTable::default();
            let mut stored = 0;
            let mut rare = Vec::new();
            // A segment number no row can have, so that the first row looks its segment up.
            let mut segment = (u32::MAX, 0);
            for raw in rows.chunks_exact(VERSION_BYTES) {
                let Ok(raw) = <&[u8; VERSION_BYTES]>::try_from(raw) else {
                    break;
                };
                let (version, overflow) = decode_version(raw, &self.bounds, &mut segment)
                    .map_err(|reason| format!("version {}: {reason}", number * CHUNK + chunk.len()))?;
                stored += usize::from(version.is_stored());
                if let Some(overflow) = overflow {
                    rare.push((chunk.len(), overflow));
                }
                chunk.push(&version);
            }
            done.push(DecodedChunk {
                number,
                versions: chunk,
                stored,
                rare,
            });
        }
    }
}

/// The type and scope sets from the time set (slot numbers sorted by (timestamp, slot)) and their
/// sizes: they hold the same slots in the same order. The time set must list only stored versions,
/// strictly in order, and the sizes must match.
pub(super) fn derive_sets(
    time: &[u32],
    slots: &VersionTable,
    type_sizes: &[u32],
    scope_sizes: &[u32],
) -> Result<(Vec<KeySet>, Vec<KeySet>), String> {
    for (sizes, what) in [(type_sizes, "type"), (scope_sizes, "scope")] {
        if sizes.iter().map(|n| usize_from_u32(*n)).sum::<usize>() != time.len() {
            return Err(format!("the {what} set sizes do not add up to the time set's"));
        }
    }
    let stored = |slot: u32| slots.set_keys(usize_from_u32(slot));
    // Each set is allocated for the size it announces (the sizes add up to the time set's, which
    // the file's length bounds) and may not go beyond it; as every slot of the time set goes to one
    // set of each kind, every set then ends up exactly full.
    let fill = |sizes: &[u32], pick: &dyn Fn((i64, u16, u32)) -> usize, what: &str| {
        let mut sets: Vec<(Vec<u32>, usize)> = sizes
            .iter()
            .map(|n| (Vec::with_capacity(usize_from_u32(*n)), usize_from_u32(*n)))
            .collect();
        for slot in time {
            if let Some(keys) = stored(*slot) {
                let (set, _) = sets
                    .get_mut(pick(keys))
                    .filter(|(set, size)| set.len() < *size)
                    .ok_or_else(|| format!("a {what} set holds more slots than its size"))?;
                set.push(*slot);
            }
        }
        Ok::<_, String>(
            sets.into_iter()
                .map(|(set, _)| KeySet::from_sorted(set))
                .collect::<Vec<KeySet>>(),
        )
    };
    let (by_scope, by_type) = join(
        || fill(scope_sizes, &|(_, _, scope)| usize_from_u32(scope), "scope"),
        || {
            let mut last: Option<(i64, u32)> = None;
            for slot in time {
                let (timestamp, _, _) =
                    stored(*slot).ok_or_else(|| format!("the time set lists slot {slot}, which is not stored"))?;
                let key = (timestamp, *slot);
                if last.is_some_and(|last| last >= key) {
                    return Err("the time set is not in order".to_string());
                }
                last = Some(key);
            }
            fill(type_sizes, &|(_, kind, _)| usize::from(kind), "type")
        },
    );
    let by_type = by_type?;
    let by_scope = by_scope.ok_or("the scope sets were not built")??;
    Ok((by_type, by_scope))
}

/// The decoded chunks of both threads in slot order, then the overflow table, in slot order: each
/// entry that needs it points at its place there. Returns the versions, the overflow table, and how
/// many of the versions are stored.
pub(super) fn assemble(here: DecodedChunks, there: DecodedChunks) -> Result<(VersionTable, Vec<Rare>, usize), String> {
    let mut decoded = here;
    decoded.extend(there);
    decoded.sort_unstable_by_key(|chunk| chunk.number);
    let stored: usize = decoded.iter().map(|chunk| chunk.stored).sum();
    let mut slots = VersionTable::default();
    let mut overflowing = Vec::new();
    for chunk in decoded {
        let first = slots.len();
        overflowing.extend(chunk.rare.into_iter().map(|(at, overflow)| (first + at, overflow)));
        slots.append(chunk.versions)?;
    }
    let mut rare = Vec::with_capacity(overflowing.len());
    for (position, overflow) in overflowing {
        let at = u32::try_from(rare.len()).map_err(|_| "too many overflow entries")?;
        if slots.update(position, |version| version.set_overflow(at)) {
            rare.push(overflow);
        }
    }
    Ok((slots, rare, stored))
}
