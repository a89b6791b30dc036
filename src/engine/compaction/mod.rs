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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::recovery::{scan_frames, ScanEnd};
use crate::engine::shared::Shared;
use crate::error::{Error, Result};
use crate::index::{record_crc_at, Index, Location, PurgeCursor, VersionEntry, SEQ_OPEN};
use crate::log::record::{
    split_batch, BatchEncoder, RecordView, FRAME_HEADER_BYTES, RECORD_HEADER_BYTES, TAG_PUT, TAG_RETIRED, TAG_SYNC_MARK,
};
use crate::log::segment::{segment_file_name, Segment, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::storage::{append_prepared, sync_dir, Storage, StorageFile};

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
}

impl Views {
    /// The views as of now; `live` is the registry of live snapshot handles, locked by the caller.
    pub(crate) fn gather(live: &BTreeMap<u64, usize>, index: &Index, now: i64) -> Views {
        let mut seqs: BTreeSet<u64> = live.keys().copied().collect();
        seqs.extend(index.pins.values().map(|pin| pin.seq));
        Views {
            current_seq: index.seq,
            now,
            snapshot_seqs: seqs.into_iter().collect(),
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
    }

    /// Whether some view can still see `version` whole.
    fn needed(&self, index: &Index, version: &VersionEntry) -> bool {
        if index.visible_at(version, self.current_seq) && !index.expired_at(version, self.now) {
            return true;
        }
        // The first snapshot at or after the version's creation is the only one that can matter.
        let first = self.snapshot_seqs.partition_point(|seq| *seq < version.seq_created);
        self.snapshot_seqs
            .get(first)
            .is_some_and(|seq| *seq < index.seq_ended(version))
    }
}

/// The plan for one segment: a decision for every version record in it.
struct SegmentPlan {
    /// (record offset, slot, decision), sorted by offset once the plan is made: a rewrite meets
    /// the records in that order.
    decisions: Vec<(u32, u32, Decision)>,
    reclaim_bytes: u64,
}

/// A rewrite's walk through its segment's decisions, in step with its scan of the records.
struct DecisionCursor<'a> {
    decisions: &'a [(u32, u32, Decision)],
}

impl DecisionCursor<'_> {
    /// The slot and decision for the record at `offset`; the scan asks in ascending offsets.
    fn at(&mut self, offset: u32) -> Option<(u32, Decision)> {
        while let Some(((at, slot, decision), rest)) = self.decisions.split_first() {
            if *at > offset {
                return None;
            }
            self.decisions = rest;
            if *at == offset {
                return Some((*slot, *decision));
            }
        }
        None
    }
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
fn views_now(shared: &Shared) -> (Views, u32, BTreeSet<u32>) {
    let live = shared.live_snapshots();
    let index = shared.read_index();
    let views = Views::gather(&live, &index, shared.clock.now());
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
    let (views, active, _) = views_now(shared);
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
    let (views, active, published) = views_now(shared);
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
        unlinked |= rewrite(shared, number, &plan, &mut report)?;
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

/// A change to one version that a rewrite makes.
enum Update {
    Move(u32, Location),
    Retire(u32, Location, Reason),
    Forget(u32, Reason),
}

/// Rewrites segment `number` by its plan; returns whether versions no longer stored were unlinked
/// from the ordered sets, whose arrays the caller then purges.
fn rewrite(shared: &Shared, number: u32, plan: &SegmentPlan, report: &mut CompactionReport) -> Result<bool> {
    let Some(segment) = shared.read_index().segments.get(&number).cloned() else {
        return Ok(false);
    };
    let Some(bytes) = segment.mapped() else {
        return Ok(false);
    };
    let corrupt = |offset: usize, reason: String| Error::Corrupt {
        file: segment.path.clone(),
        offset: offset as u64,
        reason,
    };
    let header = SegmentHeader::decode(bytes).map_err(|reason| corrupt(0, reason))?;
    let new_header = SegmentHeader {
        number,
        base_seq: header.base_seq,
        rewrites: header.rewrites.saturating_add(1),
    };
    let path = shared.dir.join(segment_file_name(number));
    let tmp = shared.dir.join(format!("{}.tmp", segment_file_name(number)));
    let mut out = Spool::create(&*shared.storage, &tmp)?;
    out.buf.extend_from_slice(&new_header.encode());
    // An I/O error while the rewrite is written stops the scan; it is reported as itself.
    let mut write_error = None;
    let mut updates = Vec::new();
    let mut seq = header.base_seq;
    let mut decisions = DecisionCursor {
        decisions: &plan.decisions,
    };
    let end = scan_frames(
        bytes,
        SEGMENT_HEADER_BYTES,
        &mut seq,
        false,
        header.rewrites > 0,
        &mut |frame_seq, frame_offset, payload| {
            // The frame's CRC covers every record: only a record that is replaced by a retired
            // one is decoded (and its own CRC checked); the others are copied or left out as they are.
            let records = split_batch(payload).map_err(|e| e.0)?;
            let mut encoder = BatchEncoder::new();
            let mut placed = Vec::new();
            for record in records {
                let (start, len) = (record.start, record.len);
                let raw = payload.get(start..start + len).ok_or("record out of its frame")?;
                let offset = u32::try_from(frame_offset + FRAME_HEADER_BYTES + start).map_err(|_| "offset overflow")?;
                let decision = match record.tag {
                    TAG_PUT | TAG_RETIRED => decisions.at(offset),
                    _ => None,
                };
                match decision {
                    Some((slot, Decision::Retire(reason))) if record.tag == TAG_PUT => {
                        let RecordView::Put(put) = record.decode().map_err(|e| e.0)? else {
                            return Err("a put record decoded as another kind".to_owned());
                        };
                        let at = encoder.retired(put.id, put.version, &put.hash);
                        placed.push((at, encoder.len() - at, Some((slot, Some(reason)))));
                    }
                    Some((slot, Decision::Forget(reason))) => updates.push(Update::Forget(slot, reason)),
                    Some((slot, _)) => {
                        let at = encoder.raw(raw);
                        placed.push((at, len, Some((slot, None))));
                    }
                    // The rewritten frame has its own sync mark (a sealed segment is synced whole).
                    None if record.tag == TAG_SYNC_MARK => {}
                    None => {
                        let at = encoder.raw(raw);
                        placed.push((at, len, None));
                    }
                }
            }
            if encoder.is_empty() {
                return Ok(());
            }
            let frame_at = out.len();
            out.buf
                .extend_from_slice(&encoder.finish(frame_seq).map_err(|e| e.to_string())?);
            for (at, len, version) in placed {
                let Some((slot, retired)) = version else { continue };
                let location = Location {
                    segment: number,
                    offset: u32::try_from(frame_at + at).map_err(|_| "offset overflow")?,
                    len: u32::try_from(len).map_err(|_| "length overflow")?,
                    crc: out.crc_at(frame_at + at),
                };
                updates.push(match retired {
                    Some(reason) => Update::Retire(slot, location, reason),
                    None => Update::Move(slot, location),
                });
            }
            out.write_if_full().map_err(|e| {
                write_error = Some(e);
                "the rewrite could not be written".to_owned()
            })
        },
    );
    let failed = match (write_error, end) {
        (Some(e), _) => Some(e),
        (None, ScanEnd::Bad { offset, reason, .. }) => Some(corrupt(offset, reason)),
        (None, _) => None,
    };
    let written = match failed {
        Some(e) => Err(e),
        None => out.finish(),
    };
    let len = match written {
        Ok(len) => len,
        Err(e) => {
            // Best effort: a temporary file left behind is removed by the next open.
            let _ = shared.storage.remove(&tmp);
            return Err(e);
        }
    };

    // From here until the index has moved, no snapshot handle may be created: one could come to see
    // a version this rewrite leaves out. Readers and the writer go on; only the final swap takes the
    // index's write lock.
    let live = shared.live_snapshots();
    {
        let index = shared.read_index();
        let views = Views::gather(&live, &index, shared.clock.now());
        let still_reclaimable = updates.iter().all(|update| match update {
            Update::Move(..) => true,
            Update::Retire(slot, ..) => index.slot(*slot).is_none_or(|v| !views.needed(&index, &v)),
            Update::Forget(slot, _) => index
                .slot(*slot)
                .is_none_or(|v| !views.needed(&index, &v) && !views.may_see_history_of(&index, &v)),
        });
        if !still_reclaimable {
            report.segments_skipped += 1;
            return shared
                .storage
                .remove(&tmp)
                .map(|()| false)
                .map_err(|e| Error::io(format!("removing {}", tmp.display()), e));
        }
    }
    shared
        .storage
        .rename(&tmp, &path)
        .map_err(|e| Error::io(format!("renaming {} over {}", tmp.display(), path.display()), e))?;
    sync_dir(&*shared.storage, &shared.dir)?;
    let rewritten = Arc::new(Segment::open(&*shared.storage, &path, true, len as u64)?);
    let mut unlink = Vec::new();
    {
        let mut index = shared.write_index();
        index.segments.insert(number, rewritten);
        for update in updates {
            match update {
                Update::Move(slot, location) => index.relocate(slot, location),
                Update::Retire(slot, location, reason) => {
                    if index.retire(slot, location) {
                        unlink.push(slot);
                    }
                    report.retired += 1;
                    count(report, reason);
                }
                Update::Forget(slot, reason) => {
                    let was_retired = index.slot(slot).is_some_and(|v| v.is_retired());
                    if index.forget(slot) {
                        unlink.push(slot);
                    }
                    if !was_retired {
                        count(report, reason);
                    }
                }
            }
        }
    }
    drop(live);
    // Readers already skip what is no longer stored; the set entries go in small steps so that
    // writers never wait long for the lock.
    for chunk in unlink.chunks(UNLINK_CHUNK) {
        let mut index = shared.write_index();
        for slot in chunk {
            index.unlink_from_sets(*slot);
        }
    }
    report.segments_rewritten += 1;
    // The old file is unlinked already; its mapping (and with it the last handle, whose closing
    // frees the file's pages) goes on another thread: tens of milliseconds for a 64 MiB segment.
    crate::parallel::drop_in_background(segment);
    Ok(!unlink.is_empty())
}

/// Set entries unlinked per hold of the index's write lock.
const UNLINK_CHUNK: usize = 4096;
/// Set array entries purged per hold of the index's write lock.
const PURGE_STEP: usize = 1 << 16;

fn count(report: &mut CompactionReport, reason: Reason) {
    match reason {
        Reason::Expired => report.reclaimed_expired += 1,
        Reason::Superseded => report.reclaimed_superseded += 1,
        Reason::Deleted => report.reclaimed_deleted += 1,
    }
}

/// Bytes of a rewritten segment buffered before they are written out.
const SPOOL_BYTES: usize = 1 << 20;

/// A rewritten segment on its way to its temporary file, written in steps of [`SPOOL_BYTES`]:
/// compaction never holds a whole segment in memory. A rewrite shorter than a step is written by
/// the compacting thread; from the first full step on, a helper thread writes the steps while the
/// compacting thread goes on with the scan, so that the writing (the kernel's preparing and copying
/// of the pages, about two fifths of a rewrite's time) and the scan overlap. At most three steps
/// are in memory: the one being filled, one queued and one being written.
struct Spool {
    path: PathBuf,
    buf: Vec<u8>,
    /// Bytes before `buf`: written, or handed to the helper thread in order.
    written: usize,
    out: Out,
}

/// Where a [`Spool`]'s full steps go.
enum Out {
    /// Written on the compacting thread (until the first full step).
    Here(Box<dyn StorageFile>),
    /// Sent to a helper thread, which appends them in order and hands each buffer back for reuse;
    /// it returns the file, or the error that stopped it (after which it takes no more steps).
    Helper {
        steps: crossbeam_channel::Sender<Vec<u8>>,
        spare: crossbeam_channel::Receiver<Vec<u8>>,
        done: std::thread::JoinHandle<Result<Box<dyn StorageFile>>>,
    },
    /// Between the two, or after the helper was joined.
    Gone,
}

impl Spool {
    fn create(storage: &dyn Storage, path: &Path) -> Result<Spool> {
        let file = storage
            .create(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        Ok(Spool {
            path: path.to_path_buf(),
            buf: Self::step_buffer(),
            written: 0,
            out: Out::Here(file),
        })
    }

    fn step_buffer() -> Vec<u8> {
        Vec::with_capacity(SPOOL_BYTES + (SPOOL_BYTES >> 2))
    }

    /// The length of the rewritten segment so far.
    fn len(&self) -> usize {
        self.written + self.buf.len()
    }

    /// The body CRC of the record at `at`, which is still buffered (the current frame's).
    fn crc_at(&self, at: usize) -> u32 {
        record_crc_at(&self.buf, at.saturating_sub(self.written))
    }

    fn write_error(path: &Path, e: std::io::Error) -> Error {
        Error::io(format!("writing {}", path.display()), e)
    }

    /// Hands a full step to the helper thread (started with the first one).
    fn write_if_full(&mut self) -> Result<()> {
        if self.buf.len() < SPOOL_BYTES {
            return Ok(());
        }
        if matches!(self.out, Out::Here(_)) {
            if let Out::Here(file) = std::mem::replace(&mut self.out, Out::Gone) {
                self.out = self.start_helper(file)?;
            }
        }
        let Out::Helper { steps, spare, .. } = &self.out else {
            return Err(Error::io(
                format!("writing {}", self.path.display()),
                std::io::Error::other("the rewrite's writer thread is gone"),
            ));
        };
        let next = spare.try_recv().unwrap_or_else(|_| Self::step_buffer());
        let step = std::mem::replace(&mut self.buf, next);
        let len = step.len();
        if steps.send(step).is_err() {
            // The helper stopped at an error: that error is the answer.
            return Err(self.join().err().unwrap_or_else(|| {
                Error::io(
                    format!("writing {}", self.path.display()),
                    std::io::Error::other("the rewrite's writer thread stopped"),
                )
            }));
        }
        self.written += len;
        Ok(())
    }

    /// Starts the helper thread that appends the steps to `file` from offset `self.written`.
    fn start_helper(&self, mut file: Box<dyn StorageFile>) -> Result<Out> {
        let (steps, step_rx) = crossbeam_channel::bounded::<Vec<u8>>(1);
        let (spare_tx, spare) = crossbeam_channel::unbounded();
        let path = self.path.clone();
        let mut at = self.written as u64;
        let done = std::thread::Builder::new()
            .name("ctxlog-rewrite".into())
            .spawn(move || {
                for mut step in step_rx {
                    append_prepared(file.as_mut(), at, &step).map_err(|e| Self::write_error(&path, e))?;
                    at += step.len() as u64;
                    step.clear();
                    // The compacting thread may have finished: then the buffer is simply freed.
                    let _ = spare_tx.send(step);
                }
                Ok(file)
            })
            .map_err(|e| Error::io("starting the rewrite's writer thread", e))?;
        Ok(Out::Helper { steps, spare, done })
    }

    /// Waits for the helper thread to write every step sent, and takes back the file.
    fn join(&mut self) -> Result<Box<dyn StorageFile>> {
        match std::mem::replace(&mut self.out, Out::Gone) {
            Out::Here(file) => Ok(file),
            Out::Helper { steps, done, .. } => {
                drop(steps);
                done.join().unwrap_or_else(|_| {
                    Err(Self::write_error(
                        &self.path,
                        std::io::Error::other("the rewrite's writer thread panicked"),
                    ))
                })
            }
            Out::Gone => Err(Self::write_error(
                &self.path,
                std::io::Error::other("the rewrite's file is gone after an earlier error"),
            )),
        }
    }

    /// Writes the rest and syncs the file; returns its length.
    fn finish(mut self) -> Result<usize> {
        let mut file = self.join()?;
        append_prepared(file.as_mut(), self.written as u64, &self.buf).map_err(|e| Self::write_error(&self.path, e))?;
        file.sync_all()
            .map_err(|e| Error::io(format!("syncing {}", self.path.display()), e))?;
        Ok(self.written + self.buf.len())
    }
}

impl Drop for Spool {
    /// A rewrite given up (an error in the scan or in a write) waits for the helper thread, so that
    /// nothing writes to the temporary file once the caller goes on to remove it.
    fn drop(&mut self) {
        let _ = self.join();
    }
}
