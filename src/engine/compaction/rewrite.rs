//! The rewrite of one segment by its plan: its frames copied to a temporary file without what no
//! view can see, the plan checked again against the views of then, the file renamed over the old
//! one, and the index moved to the new locations in one step.

use std::path::Path;
use std::sync::Arc;

use super::spool::Spool;
use super::{CompactionReport, Decision, Reason, SegmentPlan, Views};
use crate::engine::history::past::Floor;
use crate::engine::recovery::{scan_frames, ScanEnd};
use crate::engine::shared::Shared;
use crate::error::{Error, Result};
use crate::index::{Index, Location};
use crate::log::record::{split_batch, BatchEncoder, RecordTag, RecordView, FRAME_HEADER_BYTES};
use crate::log::segment::{segment_file_name, Segment, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::storage::sync_dir;

/// Set entries unlinked per hold of the index's write lock.
const UNLINK_CHUNK: usize = 4096;

/// A change to one version that a rewrite makes.
enum Update {
    Move(u32, Location),
    Retire(u32, Location, Reason),
    Forget(u32, Reason),
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

/// Rewrites segment `number` by its plan; returns whether versions no longer stored were unlinked
/// from the ordered sets, whose arrays the caller then purges.
pub(super) fn rewrite(
    shared: &Shared,
    number: u32,
    plan: &SegmentPlan,
    report: &mut CompactionReport,
    retained: Option<(u64, i64)>,
) -> Result<bool> {
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
    let path = shared.dir.join(segment_file_name(number));
    let tmp = shared.dir.join(format!("{}.tmp", segment_file_name(number)));
    let (updates, len) = write_rewrite(shared, number, bytes, &header, plan, &tmp, &corrupt)?;

    // From here until the index has moved, no snapshot handle may be created: one could come to see
    // a version this rewrite leaves out. Readers and the writer go on; only the final swap takes the
    // index's write lock.
    let live = shared.live_snapshots();
    {
        let index = shared.read_index();
        let views = Views::gather(&live, &index, shared.clock.now(), retained);
        if !still_reclaimable(&index, &views, &updates) {
            report.segments_skipped += 1;
            return shared
                .storage
                .remove(&tmp)
                .map(|()| false)
                .map_err(|e| Error::io(format!("removing {}", tmp.display()), e));
        }
        // Views of the past that would show what this rewrite reclaims are refused from now on
        // (the registry's lock, held, orders this before any such view is opened), and the floor
        // is durable before the rewrite is.
        let floor = updates
            .iter()
            .filter_map(|update| match update {
                Update::Move(..) => None,
                Update::Retire(slot, ..) | Update::Forget(slot, _) => index.slot(*slot),
            })
            .fold(Floor::default(), |floor, version| {
                floor.max(views.floor_after_reclaiming(&index, &version))
            });
        drop(index);
        shared.raise_floor(floor)?;
    }
    let rewritten = install(shared, &tmp, &path, len)?;
    let unlink = apply(&mut shared.write_index(), number, rewritten, updates, report);
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

/// Writes the rewrite of segment `number` (its bytes and header) by `plan` to `tmp`, synced;
/// returns the index updates it makes and its length. A failure removes `tmp`.
fn write_rewrite(
    shared: &Shared,
    number: u32,
    bytes: &[u8],
    header: &SegmentHeader,
    plan: &SegmentPlan,
    tmp: &Path,
    corrupt: &impl Fn(usize, String) -> Error,
) -> Result<(Vec<Update>, usize)> {
    // The count tells a checkpoint that the segment changed under it: it may not stand still.
    let Some(rewrites) = header.rewrites.checked_add(1) else {
        return Err(Error::invalid(
            "rewrites",
            format!(
                "segment {number} was rewritten {} times, as often as its header counts",
                header.rewrites
            ),
        ));
    };
    // A segment keeps its format: its frames are rewritten in it (a format 1 segment in format 2,
    // as before: its frames gain a sync mark, which format 1 has none of).
    let new_header = SegmentHeader {
        version: header.version.max(2),
        number,
        base_seq: header.base_seq,
        rewrites,
    };
    let mut out = Spool::create(&*shared.storage, tmp)?;
    out.buf.extend_from_slice(&new_header.encode());
    let mut copy = FrameCopy {
        number,
        version: new_header.version,
        decisions: DecisionCursor {
            decisions: &plan.decisions,
        },
        out: &mut out,
        updates: Vec::new(),
        write_error: None,
    };
    let mut seq = header.base_seq;
    let end = scan_frames(
        bytes,
        SEGMENT_HEADER_BYTES,
        &mut seq,
        false,
        header.rewrites > 0,
        &mut |frame_seq, frame_offset, payload| copy.frame(frame_seq, frame_offset, payload),
    );
    let FrameCopy {
        updates, write_error, ..
    } = copy;
    let failed = match (write_error, end) {
        (Some(e), _) => Some(e),
        (None, ScanEnd::Bad { offset, reason, .. }) => Some(corrupt(offset, reason)),
        (None, _) => None,
    };
    let written = match failed {
        Some(e) => Err(e),
        None => out.finish(),
    };
    match written {
        Ok(len) => Ok((updates, len)),
        Err(e) => {
            // Best effort: a temporary file left behind is removed by the next open.
            let _ = shared.storage.remove(tmp);
            Err(e)
        }
    }
}

/// A rewrite's copy of its segment's frames into its spool, one frame at a time, with the index
/// updates it makes.
struct FrameCopy<'a> {
    number: u32,
    /// The segment format the frames are written in.
    version: u32,
    decisions: DecisionCursor<'a>,
    out: &'a mut Spool,
    updates: Vec<Update>,
    /// An I/O error while the rewrite is written stops the scan; it is reported as itself.
    write_error: Option<Error>,
}

/// A record placed in the rewritten frame: its offset and length in the frame's payload, and the
/// slot of its version with, for a retired record, the reason.
type Placed = (usize, usize, Option<(u32, Option<Reason>)>);

/// What the sync mark of a rewritten frame of segment format 3 keeps and says: the frame's commit
/// time, and whether a record of it is left out or retired.
type KeptMark = (i64, bool);

impl FrameCopy<'_> {
    /// Copies the frame `frame_seq` at `frame_offset` of the old segment, whose payload is
    /// `payload`: its records kept, retired or left out by their decisions.
    fn frame(&mut self, frame_seq: u64, frame_offset: usize, payload: &[u8]) -> std::result::Result<(), String> {
        let mut encoder = BatchEncoder::for_format(self.version);
        let (placed, mark) = self.records(frame_offset, payload, &mut encoder)?;
        if encoder.is_empty() {
            return Ok(());
        }
        if self.version >= 3 {
            // The frame keeps its commit time; it says whether this or an earlier rewrite left out
            // or retired a record of it.
            let (committed_at, altered) = mark.ok_or("a frame of segment format 3 has no sync mark of its format")?;
            encoder.set_mark(committed_at, altered);
        }
        let frame_at = self.out.len();
        self.out
            .buf
            .extend_from_slice(&encoder.finish(frame_seq).map_err(|e| e.to_string())?);
        for (at, len, version) in placed {
            let Some((slot, retired)) = version else { continue };
            let location = Location {
                segment: self.number,
                offset: u32::try_from(frame_at + at).map_err(|_| "offset overflow")?,
                len: u32::try_from(len).map_err(|_| "length overflow")?,
                crc: self.out.crc_at(frame_at + at),
            };
            self.updates.push(match retired {
                Some(reason) => Update::Retire(slot, location, reason),
                None => Update::Move(slot, location),
            });
        }
        self.out.write_if_full().map_err(|e| {
            self.write_error = Some(e);
            "the rewrite could not be written".to_owned()
        })
    }

    /// Encodes the records of the frame at `frame_offset` that the rewrite keeps into `encoder`,
    /// and notes the versions it leaves out; returns where the kept ones are placed, and, for a
    /// frame of format 3, its commit time and whether a record of it is now left out or retired (by
    /// this rewrite or an earlier one).
    fn records(
        &mut self,
        frame_offset: usize,
        payload: &[u8],
        encoder: &mut BatchEncoder,
    ) -> std::result::Result<(Vec<Placed>, Option<KeptMark>), String> {
        // The frame's CRC covers every record: only a record that is replaced by a retired
        // one is decoded (and its own CRC checked), and the sync mark; the others are copied or
        // left out as they are.
        let records = split_batch(payload).map_err(|e| e.0)?;
        let mut placed = Vec::new();
        let mut mark = None;
        let mut altered = false;
        for record in records {
            let (start, len) = (record.start, record.len);
            let raw = payload.get(start..start + len).ok_or("record out of its frame")?;
            let offset = u32::try_from(frame_offset + FRAME_HEADER_BYTES + start).map_err(|_| "offset overflow")?;
            // A record of no known tag is copied as it is (reading it reports the damage).
            let tag = record.kind().ok();
            let decision = match tag {
                Some(RecordTag::Put | RecordTag::Retired) => self.decisions.at(offset),
                _ => None,
            };
            match decision {
                Some((slot, Decision::Retire(reason))) if tag == Some(RecordTag::Put) => {
                    let RecordView::Put(put) = record.decode().map_err(|e| e.0)? else {
                        return Err("a put record decoded as another kind".to_owned());
                    };
                    let at = encoder.retired(put.id, put.version, &put.hash, put.kind, put.scope);
                    placed.push((at, encoder.len() - at, Some((slot, Some(reason)))));
                    altered = true;
                }
                Some((slot, Decision::Forget(reason))) => {
                    self.updates.push(Update::Forget(slot, reason));
                    altered = true;
                }
                Some((slot, _)) => {
                    let at = encoder.raw(raw);
                    placed.push((at, len, Some((slot, None))));
                }
                // The rewritten frame has its own sync mark (a sealed segment is synced whole),
                // with the commit time of this one.
                None if tag == Some(RecordTag::SyncMark) => {
                    if self.version < 3 {
                        continue;
                    }
                    if let RecordView::SyncMark {
                        committed_at: Some(committed_at),
                        altered: before,
                        ..
                    } = record.decode().map_err(|e| e.0)?
                    {
                        mark = Some((committed_at, before));
                    }
                }
                None => {
                    let at = encoder.raw(raw);
                    placed.push((at, len, None));
                }
            }
        }
        Ok((
            placed,
            mark.map(|(committed_at, before)| (committed_at, before || altered)),
        ))
    }
}

/// Whether every version the rewrite retires or leaves out is still unseen by `views` (a snapshot
/// taken meanwhile may have come to see one).
fn still_reclaimable(index: &Index, views: &Views, updates: &[Update]) -> bool {
    updates.iter().all(|update| match update {
        Update::Move(..) => true,
        Update::Retire(slot, ..) => index.slot(*slot).is_none_or(|v| !views.needed(index, &v)),
        Update::Forget(slot, _) => index
            .slot(*slot)
            .is_none_or(|v| !views.needed(index, &v) && !views.may_see_history_of(index, &v)),
    })
}

/// Renames the rewritten segment `tmp` (`len` bytes) over the old one at `path`, makes the rename
/// durable, and opens it.
fn install(shared: &Shared, tmp: &Path, path: &Path, len: usize) -> Result<Arc<Segment>> {
    shared
        .storage
        .rename(tmp, path)
        .map_err(|e| Error::io(format!("renaming {} over {}", tmp.display(), path.display()), e))?;
    sync_dir(&*shared.storage, &shared.dir)?;
    Ok(Arc::new(Segment::open(&*shared.storage, path, true, len as u64)?))
}

/// Moves the index to the rewritten segment `number`: its versions to their new locations, the
/// retired ones to their retired records, the ones left out forgotten. Returns the slots of the
/// versions no longer stored, to unlink from the ordered sets.
fn apply(
    index: &mut Index,
    number: u32,
    rewritten: Arc<Segment>,
    updates: Vec<Update>,
    report: &mut CompactionReport,
) -> Vec<u32> {
    let mut unlink = Vec::new();
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
    unlink
}

fn count(report: &mut CompactionReport, reason: Reason) {
    match reason {
        Reason::Expired => report.reclaimed_expired += 1,
        Reason::Superseded => report.reclaimed_superseded += 1,
        Reason::Deleted => report.reclaimed_deleted += 1,
    }
}
