//! Compaction: rewriting sealed segments without what no view can see any more.
//!
//! A version's full record is kept while any view can see it: the current state (unless it has
//! expired), a live [`crate::Snapshot`] handle, or a pinned snapshot (expired or not, since a snapshot
//! judges TTL at its own time). A version of the id's current history that nothing sees any more is
//! *retired*: its content is reclaimed and a small record keeps its (id, version, hash), because the
//! store remembers every version added until the id is deleted. A version of a deleted history that
//! nothing sees is dropped entirely. Tombstones, type registrations and pins are always kept.
//!
//! A segment is rewritten to `NNNNNNNN.seg.tmp` (same number, same frame sequence numbers, emptied
//! frames left out), synced, and renamed over the old file, then the directory is synced; only then
//! does the index move to the new locations, in one step under its write lock. A crash before the
//! rename leaves the old segment (and a stray `.tmp` that opening deletes); after it, the new one.
//!
//! Here: the plan (which versions a rewrite would keep, retire or forget) and the choice of the
//! segments to rewrite; `rewrite` rewrites one segment, through a `spool` to its temporary file.

mod rewrite;
mod spool;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use self::rewrite::rewrite;
use crate::engine::history::past::{self, Floor};
use crate::engine::shared::Shared;
use crate::error::Result;
use crate::index::{Index, PurgeCursor, VersionEntry, SEQ_OPEN};
use crate::log::record::RECORD_HEADER_BYTES;
use crate::read::view::View;
use crate::storage::Storage;

/// What a compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionReport {
    /// Segment files rewritten.
    pub segments_rewritten: u64,
    /// Versions whose content was reclaimed because they had expired.
    pub reclaimed_expired: u64,
    /// Versions whose content was reclaimed because a newer version replaced them.
    pub reclaimed_superseded: u64,
    /// Versions whose content was reclaimed because their id was deleted.
    pub reclaimed_deleted: u64,
    /// Of the reclaimed versions, how many are still remembered by a retired record (id, version,
    /// hash) because their id's history is open.
    pub retired: u64,
    /// Rewrites given up because a snapshot came to see a version while it was being rewritten.
    pub segments_skipped: u64,
    /// Bytes of segment files before.
    pub bytes_before: u64,
    /// Bytes of segment files after.
    pub bytes_after: u64,
    /// How long it took.
    pub duration: Duration,
}

/// Why a version's content may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Expired,
    Superseded,
    Deleted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Copy the record as it is.
    Keep,
    /// Replace the record by a retired record.
    Retire(Reason),
    /// Leave the record out, and forget the version.
    Forget(Reason),
}

/// Every view that compaction must keep whole.
pub(crate) struct Views {
    current_seq: u64,
    now: i64,
    /// Sequence numbers of live snapshot handles and pins, sorted.
    snapshot_seqs: Vec<u64>,
    /// With a history retention: the last seq committed at the start of the retained span (or an
    /// earlier one, when the log cannot tell), and that start's time. Every view from there to
    /// now is kept.
    retained: Option<(u64, i64)>,
}

impl Views {
    /// The views as of now; `live` is the registry of live snapshot handles, locked by the caller;
    /// `retained` the retained span's start (see [`retained_span`]).
    pub(crate) fn gather(live: &BTreeMap<u64, usize>, index: &Index, now: i64, retained: Option<(u64, i64)>) -> Views {
        let mut seqs: BTreeSet<u64> = live.keys().copied().collect();
        seqs.extend(index.pins.values().map(|pin| pin.seq));
        Views {
            current_seq: index.seq,
            now,
            snapshot_seqs: seqs.into_iter().collect(),
            retained,
        }
    }

    /// Whether a moment of the retained span sees the version: created after its start, or ended
    /// after it. Expired or not: a view resolves its id's expired latest version as expired (with
    /// its expiry), which it can no longer do once the version is reclaimed.
    fn retains(&self, version: &VersionEntry, ended: u64) -> bool {
        self.retained
            .is_some_and(|(seq, _)| version.seq_created > seq || ended > seq)
    }

    /// How far reclaiming `version` raises the floor of the views of the past: to the batch that
    /// ended it, from which on no view sees it; for a version still its id's latest (reclaimed
    /// because it expired), past the current seq, since every view from its creation on resolves
    /// it (as expired, once it is).
    pub(crate) fn floor_after_reclaiming(&self, index: &Index, version: &VersionEntry) -> Floor {
        let ended = index.seq_ended(version);
        Floor {
            seq: if ended == SEQ_OPEN {
                self.current_seq.saturating_add(1)
            } else {
                ended
            },
            time: 0,
        }
    }

    /// Whether some snapshot sees the version's history (at or after the version's creation, before
    /// the delete that closed the history) and so may answer `id@version` as Superseded.
    fn may_see_history_of(&self, index: &Index, version: &VersionEntry) -> bool {
        let history_end = index
            .versions_of(version.id)
            .map(|(_, other)| other)
            .filter(|other| index.generation(other) == index.generation(version))
            .map(|other| index.seq_ended(&other))
            .max()
            .unwrap_or(SEQ_OPEN);
        let first = self.snapshot_seqs.partition_point(|seq| *seq < version.seq_created);
        self.snapshot_seqs.get(first).is_some_and(|seq| *seq < history_end)
            || self.retained.is_some_and(|(seq, _)| history_end > seq)
    }

    /// Whether some view can still see `version` whole.
    fn needed(&self, index: &Index, version: &VersionEntry) -> bool {
        if View::new(self.current_seq, self.now, None).sees_live(index, version) {
            return true;
        }
        // The first snapshot at or after the version's creation is the only one that can matter.
        let first = self.snapshot_seqs.partition_point(|seq| *seq < version.seq_created);
        let ended = index.seq_ended(version);
        self.snapshot_seqs.get(first).is_some_and(|seq| *seq < ended) || self.retains(version, ended)
    }
}

/// The plan for one segment: a decision for every version record in it.
struct SegmentPlan {
    /// (record offset, slot, decision), sorted by offset once the plan is made: a rewrite meets
    /// the records in that order.
    decisions: Vec<(u32, u32, Decision)>,
    reclaim_bytes: u64,
}

/// The version string length assumed when estimating a retired record's size.
const ESTIMATED_VERSION_BYTES: usize = 8;

/// Versions planned per hold of the index's read lock, so that the writer never waits long.
const PLAN_CHUNK: usize = 32 * 1024;

/// Decides, for every version, what a rewrite of its segment would do. The index is walked in
/// chunks, each under its own hold of the read lock: versions created after `views` were gathered
/// are left alone, and every decision is checked again before a rewrite is installed.
fn plan(shared: &Shared, views: &Views) -> HashMap<u32, SegmentPlan> {
    let mut plans: HashMap<u32, SegmentPlan> = HashMap::new();
    let mut start = 0usize;
    loop {
        let index = shared.read_index();
        let end = index.slots.len().min(start + PLAN_CHUNK);
        for position in start..end {
            let Ok(slot) = u32::try_from(position) else { break };
            let Some(version) = index.slot(slot) else { break };
            if version.seq_created > views.current_seq {
                continue;
            }
            let Some(decision) = decide(&index, views, &version) else {
                continue;
            };
            let entry = plans.entry(version.location.segment).or_insert_with(|| SegmentPlan {
                decisions: Vec::new(),
                reclaim_bytes: 0,
            });
            entry.reclaim_bytes += reclaim_of(&index, &version, decision);
            entry.decisions.push((version.location.offset, slot, decision));
        }
        if end >= index.slots.len() || end == start {
            break;
        }
        start = end;
    }
    for plan in plans.values_mut() {
        // Slots follow the log's order, so this is mostly sorted already.
        plan.decisions.sort_unstable_by_key(|(offset, ..)| *offset);
    }
    plans
}

/// The bytes a decision about `version` would reclaim.
fn reclaim_of(index: &Index, version: &VersionEntry, decision: Decision) -> u64 {
    match decision {
        Decision::Keep => 0,
        Decision::Forget(_) => u64::from(version.location.len),
        Decision::Retire(_) => {
            // The version string stays in the log; most are short, and this only ranks segments.
            let retired_len =
                (RECORD_HEADER_BYTES + 32 + 2 + ESTIMATED_VERSION_BYTES) as u64 + index.id_name_len(version.id) as u64;
            u64::from(version.location.len).saturating_sub(retired_len)
        }
    }
}

/// The views as of now, gathered under the registry and index locks, with the active segment's
/// number and the numbers of the segments whose every frame the index held then: only those may
/// be rewritten by a plan made with these views, since a version published later has no decision
/// in it and its record would move without its index entry.
fn views_now(shared: &Shared, retained: Option<(u64, i64)>) -> (Views, u32, BTreeSet<u32>) {
    let live = shared.live_snapshots();
    let index = shared.read_index();
    let views = Views::gather(&live, &index, shared.clock.now(), retained);
    let published = index
        .segments
        .keys()
        .copied()
        .filter(|number| index.segment_published(*number))
        .collect();
    (
        views,
        index.segments.keys().next_back().copied().unwrap_or(0),
        published,
    )
}

fn decide(index: &Index, views: &Views, version: &VersionEntry) -> Option<Decision> {
    if version.state() == crate::index::VersionState::Forgotten {
        return None;
    }
    let open_history = index.has_id(version.id) && index.deletes_of(version.id) == index.generation(version);
    if version.is_stored() && views.needed(index, version) {
        return Some(Decision::Keep);
    }
    let reason = if !open_history {
        Reason::Deleted
    } else if !index.is_open(version) {
        Reason::Superseded
    } else {
        Reason::Expired
    };
    // A snapshot that sees a later version of the same history answers `id@this` as Superseded: it
    // needs the version's identity even after the id's delete closed the history.
    let identity_needed = open_history || views.may_see_history_of(index, version);
    Some(match (identity_needed, version.is_retired()) {
        (true, true) => Decision::Keep,
        (true, false) => Decision::Retire(reason),
        (false, _) => Decision::Forget(reason),
    })
}

/// Bytes of every segment file.
fn segment_bytes(storage: &dyn Storage, index: &Index) -> u64 {
    index
        .segments
        .values()
        .map(|segment| storage.len(&segment.path).unwrap_or(0))
        .sum()
}

/// Reclaimable bytes of the active segment (the newest), for deciding whether to seal it first.
///
/// Its versions are the newest slots (compaction moves only sealed segments' records), so the walk
/// goes back from the last slot and stops at the first version stored elsewhere: the whole index
/// is planned once, by the compaction that follows.
pub(crate) fn active_reclaimable(shared: &Shared) -> u64 {
    let (views, active, _) = views_now(shared, retained_span(shared));
    let mut reclaim = 0;
    let mut end = shared.read_index().slots.len();
    while end > 0 {
        let index = shared.read_index();
        let start = end.saturating_sub(PLAN_CHUNK);
        for position in (start..end.min(index.slots.len())).rev() {
            let Some(version) = u32::try_from(position).ok().and_then(|slot| index.slot(slot)) else {
                continue;
            };
            if version.state() == crate::index::VersionState::Forgotten || version.seq_created > views.current_seq {
                continue;
            }
            if version.location.segment != active {
                return reclaim;
            }
            if let Some(decision) = decide(&index, &views, &version) {
                reclaim += reclaim_of(&index, &version, decision);
            }
        }
        end = start;
    }
    reclaim
}

/// Rewrites every sealed segment whose reclaimable share is at least `min_share` (0 = any reclaim).
pub(crate) fn compact(shared: &Shared, min_share: f64) -> Result<CompactionReport> {
    let started = Instant::now();
    let mut report = CompactionReport::default();
    let retained = retained_span(shared);
    let (views, active, published) = views_now(shared, retained);
    let mut plans = plan(shared, &views);
    plans.remove(&active);
    let (mut chosen, bytes_before) = {
        let index = shared.read_index();
        let mut chosen: Vec<(u32, SegmentPlan)> = Vec::new();
        for (number, plan) in plans {
            let Some(segment) = index.segments.get(&number) else {
                continue;
            };
            #[allow(clippy::cast_precision_loss)]
            let share = plan.reclaim_bytes as f64 / segment.published_len().max(1) as f64;
            if plan.reclaim_bytes > 0 && share >= min_share && number < active && published.contains(&number) {
                chosen.push((number, plan));
            }
        }
        (chosen, segment_bytes(&*shared.storage, &index))
    };
    chosen.sort_unstable_by_key(|(number, _)| *number);
    report.bytes_before = bytes_before;
    if !chosen.is_empty() {
        // What the plan reclaims was superseded, deleted or unpinned by published batches. Under
        // `Durability::Never` or `Periodic` those may not be durable yet, and a rewrite is durable once
        // renamed: sync the log first, or a power cut could keep the rewrite and lose the batches
        // that justified it (an id would vanish).
        shared.flush()?;
    }
    let mut unlinked = false;
    let rewritten: Result<()> = chosen.drain(..).try_for_each(|(number, plan)| {
        unlinked |= rewrite(shared, number, &plan, &mut report, retained)?;
        Ok(())
    });
    if unlinked {
        // Once for every rewrite, in steps: a whole purge of a million-entry set held the lock for
        // tens of milliseconds. Readers skip the entries of versions no longer stored meanwhile.
        let mut cursor = Some(PurgeCursor::default());
        while let Some(at) = cursor {
            cursor = shared.write_index().purge_sets_step(at, PURGE_STEP);
        }
    }
    rewritten?;
    report.bytes_after = segment_bytes(&*shared.storage, &shared.read_index());
    report.duration = started.elapsed();
    Ok(report)
}

/// The start of the span `Options::history_retention` keeps (`None` without one): the time that
/// long before the clock's now, and the last seq committed by then, or an earlier one where the
/// log cannot tell (0 if it cannot read the log: everything is kept).
fn retained_span(shared: &Shared) -> Option<(u64, i64)> {
    let retention = shared.history_retention();
    if retention == 0 {
        return None;
    }
    let time = shared.clock.now().saturating_sub(retention);
    let (parts, last) = shared.log_parts();
    let seq = match past::seq_as_of(&parts, last, time) {
        Ok(Ok(seq) | Err(seq)) => seq,
        Err(e) => {
            tracing::warn!("compaction keeps the whole history: the log's commit times cannot be read: {e}");
            0
        }
    };
    Some((seq, time))
}

/// Set array entries purged per hold of the index's write lock.
const PURGE_STEP: usize = 1 << 16;
