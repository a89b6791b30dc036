//! Opening a store: replay every segment into a fresh index, truncate a torn tail, refuse damage.
//!
//! Recovery policy: a frame that is short, or fails its CRC, at the tail of the newest segment (with
//! no valid frame after it) is a torn write: it was never acknowledged under `Durability::Immediate`,
//! so it is truncated away and opening goes on. The same anywhere else, in a sealed segment or with a
//! valid frame after it, is damage to acknowledged data: opening fails with `Error::Corrupt` naming
//! the file and offset; so is a whole frame with a good CRC but the wrong seq, wherever it is. A newest
//! segment whose header is incomplete was torn while being created and holds nothing: it is removed
//! and created again. Zero bytes from the end of the newest segment's frames to the end of its file
//! are space the writer allocated ahead of its appends: they are cut off as well, and counted apart
//! (`unwritten_bytes`), since a store that was not closed always leaves them.
//!
//! Each segment is replayed by the rules of its own format (its frames must be of it), and the
//! commit time of the last replayed frame that records one (segment format 3) becomes the index's
//! `committed_at`, else the checkpoint's stays: the writer's commit times go on from it.
//!
//! Opened read-only ([`Options::read_only`](crate::Options::read_only)), recovery judges the same
//! way and changes nothing: what it would cut off or remove is left in place and not read.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::engine::checkpoint::{self, SegmentMark};
use crate::error::{Error, Result};
use crate::index::{Index, Location, PinInfo};
use crate::item::TypeSpec;
use crate::log::record::{
    check_frame_format, decode_batch, decode_record, frame_sync_mark, read_frame, FrameError, RecordView,
    FRAME_HEADER_BYTES, FRAME_KIND_BATCH,
};
use crate::log::segment::{create_segment, ActiveSegment};
use crate::log::segment::{
    parse_segment_file_name, read_whole, segment_file_name, Segment, SegmentHeader, SEGMENT_HEADER_BYTES,
};
use crate::num::{saturating_u64, usize_from_u32, usize_from_u64};
use crate::storage::{sync_dir, SharedBytes, Storage};

/// What opening found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryStats {
    /// Segments opened: replayed, or covered by the checkpoint (only their headers read).
    pub segments: u64,
    /// Frames (batches) replayed.
    pub frames: u64,
    /// Records replayed.
    pub records: u64,
    /// Bytes of a torn tail cut off the newest segment (opened read-only: left in place, unread).
    pub truncated_bytes: u64,
    /// Zero bytes cut off the newest segment after its last frame: space the writer allocated
    /// ahead of its appends and never wrote (a store that was not closed leaves them). Not damage,
    /// and not counted in `truncated_bytes`.
    pub unwritten_bytes: u64,
    /// Whether a newest segment torn while being created was removed.
    pub removed_torn_segment: bool,
    /// Stray temporary files removed.
    pub removed_temporary_files: u64,
    /// Milliseconds the replay took.
    pub millis: u64,
    /// The sequence number of the checkpoint opening started from, if it used one.
    pub checkpoint_seq: Option<u64>,
    /// Why the newest checkpoint was not used (damaged, stale), when opening replayed the whole log.
    pub checkpoint_rejected: Option<String>,
}

pub(crate) struct Recovered {
    pub(crate) index: Index,
    /// The newest segment, open for appends; `None` when opened read-only.
    pub(crate) active: Option<ActiveSegment>,
    pub(crate) next_seq: u64,
    pub(crate) stats: RecoveryStats,
}

/// Called for each whole frame of a scan with its seq, offset and payload; an error stops the scan.
pub(crate) type FrameVisitor<'a> = dyn FnMut(u64, usize, &[u8]) -> std::result::Result<(), String> + 'a;

/// How a scan of one segment's frames ended.
pub(crate) enum ScanEnd {
    /// Every byte up to `end` is whole frames.
    Clean { end: usize },
    /// The frame at `offset` is short or bad.
    Bad { offset: usize, reason: String, torn: bool },
}

/// Walks the frames of a segment's bytes from the header on, calling `on_frame(seq, offset, payload)`
/// for each whole frame whose seq is the expected next one (or, with `allow_gaps`, any later one: a
/// segment rewritten by compaction lacks the frames it emptied). `newest` says whether a bad frame may
/// be a torn tail (when no valid frame follows it).
pub(crate) fn scan_frames(
    bytes: &[u8],
    from: usize,
    next_seq: &mut u64,
    newest: bool,
    allow_gaps: bool,
    on_frame: &mut FrameVisitor<'_>,
) -> ScanEnd {
    let mut offset = from;
    while offset < bytes.len() {
        let rest = bytes.get(offset..).unwrap_or_default();
        // A whole frame with a good CRC but the wrong seq is no torn write (a write that never
        // finished cannot leave one): it is damage, wherever it is.
        let (failure, whole) = match read_frame(rest) {
            Ok((header, payload))
                if header.seq < u64::MAX && (header.seq == *next_seq || (allow_gaps && header.seq > *next_seq)) =>
            {
                if let Err(reason) = on_frame(header.seq, offset, payload) {
                    return ScanEnd::Bad {
                        offset,
                        reason,
                        torn: false,
                    };
                }
                *next_seq = header.seq + 1;
                offset += FRAME_HEADER_BYTES + payload.len();
                continue;
            }
            // No frame may take the last seq: the one after it would overflow.
            Ok((header, _)) if header.seq == u64::MAX => {
                (format!("frame has seq {}, past the last usable one", header.seq), true)
            }
            Ok((header, _)) => (format!("frame has seq {}, expected {}", header.seq, *next_seq), true),
            Err(FrameError::Short) => ("frame is cut short by the end of the file".to_owned(), false),
            Err(FrameError::Bad(reason)) => (reason, false),
        };
        let torn = newest && !whole && !synced_frame_after(bytes, offset, *next_seq);
        return ScanEnd::Bad {
            offset,
            reason: failure,
            torn,
        };
    }
    ScanEnd::Clean { end: offset }
}

/// Whether a CRC-valid frame with a plausible sequence number starts after the bad frame at `bad`
/// and shows that the bytes at `bad` had been synced before it was written: its sync mark is past
/// `bad`, or it has no sync mark (segment format 1). Frames written after the last sync that
/// reached the disk carry a mark at or before `bad`: such a frame after a hole is what a power cut
/// leaves when unsynced writes reach the disk out of order, and it was never durable either.
fn synced_frame_after(bytes: &[u8], bad: usize, expected_seq: u64) -> bool {
    let last = bytes.len().saturating_sub(FRAME_HEADER_BYTES);
    (bad + 1..=last).any(|at| {
        let kind = bytes.get(at + 8).copied();
        let seq = bytes
            .get(at + 9..at + 17)
            .and_then(|s| s.try_into().ok())
            .map(u64::from_le_bytes);
        if kind != Some(FRAME_KIND_BATCH) || !seq.is_some_and(|seq| seq >= expected_seq && seq - expected_seq < 1 << 32)
        {
            return false;
        }
        match read_frame(bytes.get(at..).unwrap_or_default()) {
            Ok((_, payload)) => frame_sync_mark(payload).is_none_or(|synced| synced > bad as u64),
            Err(_) => false,
        }
    })
}

/// The location of a record `start` bytes into `payload`, the payload of the frame at `frame_offset`.
pub(crate) fn location_of(
    segment: u32,
    frame_offset: usize,
    payload: &[u8],
    start: usize,
    len: usize,
) -> Result<Location, String> {
    let offset = frame_offset + FRAME_HEADER_BYTES + start;
    Ok(Location {
        segment,
        offset: u32::try_from(offset).map_err(|_| "record offset overflow".to_owned())?,
        len: u32::try_from(len).map_err(|_| "record length overflow".to_owned())?,
        crc: crate::index::record_crc_at(payload, start),
    })
}

/// Whether the current history of `id` already holds `version`. The index's version tags rule out
/// almost every candidate; one whose tag matches is read back, from `bytes` (the segment being
/// replayed, number `segment`) or from an earlier segment.
fn stored_twice(index: &Index, segment: u32, bytes: &[u8], id: &str, version: &str) -> bool {
    let tag = crate::index::version_tag(version);
    index
        .current_history(id)
        .filter(|entry| entry.version_tag() == tag)
        .any(|entry| {
            if entry.location.segment != segment {
                return crate::read::record::read_identity(index, &entry).is_ok_and(|(found, _)| found == version);
            }
            let start = usize_from_u32(entry.location.offset);
            let end = start + usize_from_u32(entry.location.len);
            let record = bytes.get(start..end).and_then(|record| decode_record(record).ok());
            match record {
                Some(RecordView::Put(put)) => put.version == version,
                Some(RecordView::Retired { version: found, .. }) => found == version,
                _ => false,
            }
        })
}

/// Why a record that would take the index past one of its limits is refused.
fn past_limits(full: Error) -> String {
    format!("the log holds more than a store may: {full}")
}

/// Applies one replayed batch, a frame of a segment of format `version`, to the index.
fn replay_batch(
    index: &mut Index,
    seq: u64,
    (segment, version, bytes): (u32, u32, &[u8]),
    frame_offset: usize,
    payload: &[u8],
) -> Result<u64, String> {
    let records = decode_batch(payload).map_err(|e| e.0)?;
    check_frame_format(version, &records).map_err(|e| e.0)?;
    let count = records
        .iter()
        .filter(|(_, _, record)| !matches!(record, RecordView::SyncMark { .. }))
        .count() as u64;
    for (start, len, record) in records {
        match record {
            RecordView::Put(put) => {
                if stored_twice(index, segment, bytes, put.id, put.version) {
                    return Err(format!("item {:?} version {:?} is stored twice", put.id, put.version));
                }
                // The writer never wrote past the index's limits: a log that goes past them is damaged.
                index.check_room_to_replay(Some(put.kind)).map_err(past_limits)?;
                index.apply_put(seq, &put, location_of(segment, frame_offset, payload, start, len)?);
            }
            RecordView::Retired {
                id,
                version,
                kind,
                scope,
                ..
            } => {
                if stored_twice(index, segment, bytes, id, version) {
                    return Err(format!("item {id:?} version {version:?} is stored twice"));
                }
                index.check_room_to_replay(kind).map_err(past_limits)?;
                index.apply_retired(
                    seq,
                    id,
                    version,
                    kind.zip(scope),
                    location_of(segment, frame_offset, payload, start, len)?,
                );
            }
            RecordView::Pin {
                name,
                seq: pinned_seq,
                taken_at,
                session,
            } => {
                let pin = PinInfo {
                    seq: pinned_seq,
                    taken_at,
                    session: session.map(Arc::from),
                };
                index.pins.insert(name.to_owned(), pin);
            }
            RecordView::Unpin { name } => {
                index.pins.remove(name);
            }
            RecordView::Delete { id, .. } => {
                index.apply_delete(seq, id);
            }
            RecordView::SyncMark { committed_at, .. } => {
                if let Some(committed_at) = committed_at {
                    index.committed_at = committed_at;
                }
            }
            RecordView::RegisterType { name, pattern } => {
                let mut spec = TypeSpec::new(name);
                if let Some(pattern) = pattern {
                    spec = spec.id_pattern(pattern);
                }
                index
                    .registry
                    .insert(spec)
                    .map_err(|e| format!("stored type registration is invalid: {e}"))?;
            }
        }
    }
    index.seq = seq;
    Ok(count)
}

/// Where replay starts: the beginning of the log with an empty index, or a checkpoint's index.
struct Start {
    index: Index,
    next_seq: u64,
    /// Segments the checkpoint covers whole: opened without being read.
    covered: BTreeMap<u32, SegmentMark>,
    /// The segment and offset at which replay goes on after the checkpoint.
    resume: Option<SegmentMark>,
}

impl Start {
    fn empty() -> Start {
        Start {
            index: Index::default(),
            next_seq: 1,
            covered: BTreeMap::new(),
            resume: None,
        }
    }
}

/// Replays the store in `dir` (which the caller has locked): from the newest valid checkpoint if
/// there is one, else from the beginning of the log. `read_only`: change no file (a torn tail is
/// left in place and read up to, a newest segment torn while being created is passed over, stray
/// temporary files stay, no segment is created) and open no segment for appends; a directory with
/// no segment is `NotAStore`.
pub(crate) fn recover(storage: &dyn Storage, dir: &Path, read_only: bool) -> Result<Recovered> {
    let started = std::time::Instant::now();
    let mut stats = RecoveryStats::default();
    let mut numbers = Vec::new();
    let names = storage
        .list(dir)
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for name in names {
        if let Some(number) = parse_segment_file_name(&name) {
            numbers.push(number);
        } else if name.ends_with(".tmp") && !read_only {
            let path = dir.join(&name);
            storage
                .remove(&path)
                .map_err(|e| Error::io(format!("removing stray {}", path.display()), e))?;
            stats.removed_temporary_files += 1;
        }
    }
    numbers.sort_unstable();
    if read_only && numbers.is_empty() {
        return Err(Error::NotAStore {
            path: dir.to_path_buf(),
        });
    }

    if let Some((seq, path)) = checkpoint::list(storage, dir)?.into_iter().next() {
        let attempt = checkpoint_start(storage, dir, &path, seq, &numbers).and_then(|start| {
            let mut attempt_stats = stats.clone();
            replay(storage, dir, &numbers, start, &mut attempt_stats, read_only)
                .map(|recovered| (recovered, attempt_stats))
                .map_err(|e| format!("replay after it failed: {e}"))
        });
        match attempt {
            Ok(((index, active, next_seq), attempt_stats)) => {
                stats = attempt_stats;
                stats.checkpoint_seq = Some(seq);
                stats.millis = saturating_u64(started.elapsed().as_millis());
                return Ok(Recovered {
                    index,
                    active,
                    next_seq,
                    stats,
                });
            }
            Err(reason) => {
                tracing::warn!(
                    "checkpoint {} not used, replaying the whole log: {reason}",
                    path.display()
                );
                stats.checkpoint_rejected = Some(format!("{}: {reason}", path.display()));
            }
        }
    }
    let (index, active, next_seq) = replay(storage, dir, &numbers, Start::empty(), &mut stats, read_only)?;
    stats.millis = saturating_u64(started.elapsed().as_millis());
    Ok(Recovered {
        index,
        active,
        next_seq,
        stats,
    })
}

/// Loads a checkpoint and checks that the segment files are exactly those it was taken over.
fn checkpoint_start(
    storage: &dyn Storage,
    dir: &Path,
    path: &Path,
    named_seq: u64,
    numbers: &[u32],
) -> Result<Start, String> {
    // Mapped, not read: the bytes are checked and decoded once, straight from the page cache.
    let bytes = storage
        .open_read(path)
        .and_then(|file| file.map())
        .map_err(|e| format!("cannot read it: {e}"))?;
    let loaded = checkpoint::decode(&bytes);
    crate::parallel::drop_in_background(bytes);
    let loaded = loaded?;
    if loaded.seq != named_seq {
        return Err(format!("it holds seq {}, but its name says {named_seq}", loaded.seq));
    }
    let (last, sealed) = loaded.segments.split_last().ok_or("it records no segment")?;
    let mut expected = loaded.segments.iter().map(|m| m.number);
    for number in numbers.iter().take(loaded.segments.len()) {
        if expected.next() != Some(*number) {
            return Err(format!("segment {number} is not one it was taken over"));
        }
    }
    if numbers.len() < loaded.segments.len() {
        return Err("a segment it was taken over is missing".into());
    }
    let next_seq = loaded.seq.checked_add(1).ok_or("its seq is past the last usable one")?;
    for mark in &loaded.segments {
        let file = dir.join(segment_file_name(mark.number));
        let len = storage
            .len(&file)
            .map_err(|e| format!("segment {}: {e}", mark.number))?;
        let mut header = [0u8; SEGMENT_HEADER_BYTES];
        storage
            .open_read(&file)
            .and_then(|f| f.read_exact_at(&mut header, 0))
            .map_err(|e| format!("segment {}: {e}", mark.number))?;
        let header = SegmentHeader::decode(&header).map_err(|e| format!("segment {}: {e}", mark.number))?;
        let same_length = if mark == last { len >= mark.len } else { len == mark.len };
        if header.rewrites != mark.rewrites || !same_length || header.number != mark.number {
            return Err(format!("segment {} changed since it was taken", mark.number));
        }
        // Every segment it was taken over started by then. One that starts later would leave the
        // index behind the segment the next batches go to (see `checkpoint::with_published_index`).
        if header.base_seq > next_seq {
            return Err(format!(
                "segment {} starts at seq {}, past its seq {}",
                mark.number, header.base_seq, loaded.seq
            ));
        }
    }
    Ok(Start {
        next_seq,
        covered: sealed.iter().map(|m| (m.number, *m)).collect(),
        resume: Some(*last),
        index: loaded.index,
    })
}

type Replayed = (Index, Option<ActiveSegment>, u64);

/// The first seq of the segment at `path`, if its header can be read and is whole.
pub(crate) fn next_base_seq(storage: &dyn Storage, path: &Path) -> Option<u64> {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    storage.open_read(path).ok()?.read_exact_at(&mut header, 0).ok()?;
    SegmentHeader::decode(&header).ok().map(|header| header.base_seq)
}

/// The bytes of a segment to replay. The one a checkpoint resumes in is mapped rather than read: a
/// replay touches its header, the frames after the resume point (none after a clean close) and, for
/// a version it finds stored twice, the few earlier records that hold it; a read of the whole file
/// would copy the tens of MiB before the resume point too. Every other segment is read whole, as a
/// full replay reads each in turn.
fn segment_for_replay(storage: &dyn Storage, path: &Path, resume: Option<SegmentMark>) -> Result<SharedBytes> {
    let whole = || read_whole(storage, path).map(SharedBytes::new);
    let Some(mark) = resume else { return whole() };
    let len = storage
        .len(path)
        .map_err(|e| Error::io(format!("reading the length of {}", path.display()), e))?;
    if len < SEGMENT_HEADER_BYTES as u64 || len < mark.len {
        // Torn or cut short: read as it is, and judged as before.
        return whole();
    }
    storage
        .open_read(path)
        .and_then(|file| file.map())
        .map_err(|e| Error::io(format!("mapping {}", path.display()), e))
}

/// Replays `numbers` (sorted segment numbers) into `start`'s index.
fn replay(
    storage: &dyn Storage,
    dir: &Path,
    numbers: &[u32],
    start: Start,
    stats: &mut RecoveryStats,
    read_only: bool,
) -> Result<Replayed> {
    let Start {
        index,
        next_seq,
        covered,
        resume,
    } = start;
    let mut replay = Replay {
        storage,
        dir,
        numbers,
        index,
        next_seq,
        previous_rewritten: false,
        stats,
        read_only,
    };
    let mut active = None;
    let count = numbers.len();
    for (position, number) in numbers.iter().copied().enumerate() {
        let path = dir.join(segment_file_name(number));
        if position > 0 && numbers.get(position - 1).is_some_and(|previous| previous + 1 != number) {
            return Err(corrupt(
                &path,
                0,
                format!("segment {} is missing before this one", number - 1),
            ));
        }
        replay.stats.segments += 1;
        if let Some(mark) = covered.get(&number) {
            // Covered by the checkpoint, which checked its header and length: map it, read nothing.
            replay.previous_rewritten = mark.rewrites > 0;
            replay
                .index
                .segments
                .insert(number, Arc::new(Segment::open(storage, &path, true, mark.len)?));
            continue;
        }
        let at = SegmentAt {
            position,
            number,
            path: &path,
            newest: position + 1 == count,
        };
        // Only the newest segment (the last one) gives an active segment, whole or torn.
        if let Some(newest) = replay.segment(&at, resume.filter(|mark| mark.number == number))? {
            active = Some(newest);
        }
    }
    let Replay {
        mut index, next_seq, ..
    } = replay;
    let active = match active {
        Some(active) => Some(active),
        None if read_only => None,
        None => Some(create_segment(
            storage,
            dir,
            numbers.last().map_or(1, |n| n + 1),
            next_seq,
        )?),
    };
    if let Some(active) = &active {
        index.segments.insert(active.number, Arc::clone(&active.segment));
    }
    index.seq = next_seq - 1;
    Ok((index, active, next_seq))
}

/// `Corrupt` at `offset` of the segment file at `path`.
fn corrupt(path: &Path, offset: usize, reason: String) -> Error {
    Error::Corrupt {
        file: path.to_path_buf(),
        offset: offset as u64,
        reason,
    }
}

/// A replay on its way through the segments.
struct Replay<'a> {
    storage: &'a dyn Storage,
    dir: &'a Path,
    /// Every segment's number, sorted.
    numbers: &'a [u32],
    index: Index,
    /// The seq the next frame must have (or, after a rewritten segment, exceed).
    next_seq: u64,
    /// Whether the segment before was rewritten by compaction (and may have lost its last frames).
    previous_rewritten: bool,
    stats: &'a mut RecoveryStats,
    /// Whether to change no file and open no segment for appends.
    read_only: bool,
}

/// The segment a replay is in.
struct SegmentAt<'a> {
    /// Its place among the segments.
    position: usize,
    number: u32,
    path: &'a Path,
    /// Whether it is the newest segment, which may end in a torn tail.
    newest: bool,
}

impl Replay<'_> {
    /// Replays the segment `at` (one the checkpoint does not cover whole), from `resume` if the
    /// checkpoint ends in it. Returns the active segment if it is the newest.
    fn segment(&mut self, at: &SegmentAt<'_>, resume: Option<SegmentMark>) -> Result<Option<ActiveSegment>> {
        let kept = segment_for_replay(self.storage, at.path, resume)?;
        let bytes: &[u8] = &kept;
        let header = match SegmentHeader::decode(bytes) {
            Ok(header) => header,
            Err(_) if at.newest && bytes.len() <= SEGMENT_HEADER_BYTES => {
                // Torn while being created: it can hold no frame.
                if self.read_only {
                    return Ok(None);
                }
                return self.replace_torn(at).map(Some);
            }
            Err(reason) => return Err(corrupt(at.path, 0, reason)),
        };
        if header.number != at.number {
            return Err(corrupt(
                at.path,
                12,
                format!("header says segment {}, file name says {}", header.number, at.number),
            ));
        }
        let from = self.start_in(at, &header, resume)?;
        self.previous_rewritten = header.rewrites > 0;
        let end = self.frames(at, bytes, from, &header)?;
        let file_len = bytes.len();
        // A mapping must not outlive a cut of its file's tail (see `storage::file`).
        drop(kept);
        if at.newest && !self.read_only {
            self.open_active(at, end, file_len).map(Some)
        } else {
            // Read-only, the newest segment is mapped as it is, its frames read up to `end`.
            let published = if at.newest { end } else { file_len };
            self.index.segments.insert(
                at.number,
                Arc::new(Segment::open(self.storage, at.path, true, published as u64)?),
            );
            Ok(None)
        }
    }

    /// Removes the newest segment `at`, torn while being created, and creates it again.
    fn replace_torn(&mut self, at: &SegmentAt<'_>) -> Result<ActiveSegment> {
        self.storage
            .remove(at.path)
            .map_err(|e| Error::io(format!("removing torn {}", at.path.display()), e))?;
        sync_dir(self.storage, self.dir)?;
        self.stats.removed_torn_segment = true;
        create_segment(self.storage, self.dir, at.number, self.next_seq)
    }

    /// Where the replay of segment `at` starts: at the checkpoint's end in the segment it resumes in
    /// (`resume`), else after the header, once the segment is found to continue the log.
    fn start_in(&mut self, at: &SegmentAt<'_>, header: &SegmentHeader, resume: Option<SegmentMark>) -> Result<usize> {
        if let Some(mark) = resume {
            return Ok(usize_from_u64(mark.len));
        }
        // A rewritten segment may have lost its last frames: the next one may start later.
        let continues =
            header.base_seq == self.next_seq || (self.previous_rewritten && header.base_seq > self.next_seq);
        if !continues {
            return Err(corrupt(
                at.path,
                16,
                format!(
                    "segment starts at seq {}, but the log before it ends at {}",
                    header.base_seq,
                    self.next_seq - 1
                ),
            ));
        }
        self.next_seq = header.base_seq;
        Ok(SEGMENT_HEADER_BYTES)
    }

    /// Replays the frames of segment `at` (its `bytes`, whose header is `header`) from `from` into
    /// the index, with gaps in their seqs allowed in a rewritten segment; returns where its good
    /// frames end.
    fn frames(&mut self, at: &SegmentAt<'_>, bytes: &[u8], from: usize, header: &SegmentHeader) -> Result<usize> {
        // Every frame comes before the next segment's first seq: a later one (which a rewritten
        // segment's allowed gaps would let through) is damage here, not at the next segment.
        let next_base_seq = self
            .numbers
            .get(at.position + 1)
            .and_then(|next| next_base_seq(self.storage, &self.dir.join(segment_file_name(*next))));
        let mut frames = 0u64;
        let mut records = 0u64;
        let index = &mut self.index;
        let scanned = scan_frames(
            bytes,
            from,
            &mut self.next_seq,
            at.newest,
            header.rewrites > 0,
            &mut |seq, offset, payload| {
                if let Some(base) = next_base_seq.filter(|base| seq >= *base) {
                    return Err(format!(
                        "frame has seq {seq}, but the next segment starts at seq {base}"
                    ));
                }
                frames += 1;
                records += replay_batch(index, seq, (at.number, header.version, bytes), offset, payload)?;
                Ok(())
            },
        );
        let end = tail_end(scanned, bytes, at.path, self.stats)?;
        self.stats.frames += frames;
        self.stats.records += records;
        Ok(end)
    }

    /// Opens the newest segment `at` for appends, cut to `end` (its good frames) from `file_len`
    /// bytes, and makes what was replayed of it durable.
    fn open_active(&mut self, at: &SegmentAt<'_>, end: usize, file_len: usize) -> Result<ActiveSegment> {
        let mut file = self
            .storage
            .open_append(at.path)
            .map_err(|e| Error::io(format!("opening {}", at.path.display()), e))?;
        if end < file_len {
            file.set_len(end as u64)
                .map_err(|e| Error::io(format!("truncating {}", at.path.display()), e))?;
        }
        // What was replayed may not be durable: a batch whose fsync failed (never acknowledged,
        // but now shown), or a segment whose creation failed before its header or its directory
        // entry was synced. Make it durable before anything is acknowledged on top of it.
        file.sync_all()
            .map_err(|e| Error::io(format!("syncing {}", at.path.display()), e))?;
        sync_dir(self.storage, self.dir)?;
        let segment = Arc::new(Segment::open(self.storage, at.path, false, end as u64)?);
        self.index.segments.insert(at.number, Arc::clone(&segment));
        Ok(ActiveSegment {
            file,
            number: at.number,
            len: end as u64,
            allocated: end as u64,
            zeroed: end as u64,
            prepared: end as u64,
            segment,
        })
    }
}

/// Where the replayed frames of the segment at `path` end, by how their scan ended: a torn tail
/// (only the newest segment has one) is cut off, and counted as unwritten when it is all zeros
/// (space the writer allocated ahead); any other bad frame is damage.
fn tail_end(scanned: ScanEnd, bytes: &[u8], path: &Path, stats: &mut RecoveryStats) -> Result<usize> {
    match scanned {
        ScanEnd::Clean { end } => Ok(end),
        ScanEnd::Bad { offset, torn: true, .. }
            if bytes
                .get(offset..)
                .is_some_and(|tail| tail.iter().all(|byte| *byte == 0)) =>
        {
            stats.unwritten_bytes += (bytes.len() - offset) as u64;
            Ok(offset)
        }
        ScanEnd::Bad {
            offset,
            torn: true,
            reason,
        } => {
            tracing::warn!(
                "truncating a torn tail of {} bytes at offset {offset} of {}: {reason}",
                bytes.len() - offset,
                path.display()
            );
            stats.truncated_bytes += (bytes.len() - offset) as u64;
            Ok(offset)
        }
        ScanEnd::Bad {
            offset,
            reason,
            torn: false,
        } => Err(corrupt(path, offset, reason)),
    }
}
