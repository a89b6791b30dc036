//! Writing a group's frames into the active segment: sequence numbers assigned, frames buffered or
//! appended straight, space allocated (and zeroed, and made ready) ahead of the appends, the
//! allocated tail trimmed, and the segment sealed and the next one started when it is full. The
//! writer's policy over the log's [`ActiveSegment`](crate::log::segment::ActiveSegment).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::log::record::set_frame_header;
use crate::log::segment::{create_segment, segment_file_name, Segment, FORMAT_VERSION, SEGMENT_HEADER_BYTES};
use crate::storage::Allocation;

use super::{Op, OpOutcome, Staged, Writer, GROUP_BYTES_MAX};

/// The least space allocated ahead of the active segment's appends when they reach its end.
const ALLOCATE_AHEAD_MIN: u64 = 64 << 10;
/// The most: between the two, as much as the segment already holds (doubling its length).
const ALLOCATE_AHEAD_MAX: u64 = 4 << 20;
/// Appends shorter than this (single adds and their groups) go into zeros written ahead of them;
/// longer ones (bulk loads) into space only reserved, which costs no writing.
const ZERO_AHEAD_BELOW: u64 = 64 << 10;
/// The most zeros written ahead at once (their writing is paid once, by the sync that follows).
const ZERO_AHEAD_MAX: u64 = 1 << 20;
/// After a group that appended at least [`ZERO_AHEAD_BELOW`] bytes, the writer thread makes room
/// for this many groups of the same size past the active segment's end, and gets it ready for
/// them, before the next group comes (see [`Writer::prepare_ahead`]).
const PREPARE_GROUPS_AHEAD: u64 = 2;
/// A frame at least this long, with nothing buffered before it, is appended straight from the
/// batch's own buffer rather than copied into the writer's.
const WRITE_STRAIGHT_MIN: usize = 64 << 10;
/// The most space prepared ahead at once (groups of several megabytes get the first part of
/// the next one ready).
const PREPARE_AHEAD_MAX: u64 = 8 << 20;

impl Writer {
    #[inline]
    pub(super) fn write_buffer(&mut self) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let mut buffer = std::mem::take(&mut self.buffer);
        let result = self.append(&buffer);
        buffer.clear();
        self.buffer = buffer;
        result
    }

    /// Appends `bytes` to the active segment, allocating ahead of them as needed; the caller moves
    /// `active.len` past them.
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        let result = self.allocate_for(bytes.len() as u64).and_then(|()| {
            self.active
                .file
                .append(bytes)
                .map_err(|e| Error::io(format!("appending to segment {}", self.active.number), e))
        });
        self.dirty = true;
        result
    }

    /// Allocates the active segment ahead of an append of `bytes` that would pass its file length,
    /// or, for a short append, its written zeros. An append inside the file's length changes no
    /// file length, so the fsync after it commits none: on ext4, single durable adds take about a
    /// third less time than appends that grow the file. An append into blocks only reserved still
    /// makes its fsync record them as written, which costs a group commit's multi-page append
    /// about half as much again as an append into written zeros (docs/BENCHMARKS.md): short
    /// appends get zeros written ahead of them, long ones (whose fsync that record hardly slows)
    /// space reserved. Never past the segment size, unless the append itself goes there.
    fn allocate_for(&mut self, bytes: u64) -> Result<()> {
        let active = &mut self.active;
        let need = active.len + bytes;
        let (how, ready, most) = if bytes < ZERO_AHEAD_BELOW {
            (Allocation::Zeroed, active.zeroed.max(active.len), ZERO_AHEAD_MAX)
        } else {
            (Allocation::Reserved, active.allocated, ALLOCATE_AHEAD_MAX)
        };
        if need <= ready {
            return Ok(());
        }
        let ahead = active.len.clamp(ALLOCATE_AHEAD_MIN, most);
        let target = need.max(need.saturating_add(ahead).min(self.segment_size));
        active
            .file
            .allocate(target, how)
            .map_err(|e| Error::io(format!("allocating space in segment {}", active.number), e))?;
        active.allocated = active.allocated.max(target);
        if how == Allocation::Zeroed {
            active.zeroed = target;
        }
        Ok(())
    }

    /// Readies the active segment for the next group, when the one just written appended
    /// `appended` bytes, at least [`ZERO_AHEAD_BELOW`] (a bulk load's): room for
    /// [`PREPARE_GROUPS_AHEAD`] such groups (at most [`PREPARE_AHEAD_MAX`] bytes) is allocated now
    /// rather than by the next append ([`Writer::allocate_for`]), and the pages they will be
    /// written into are made ready ([`crate::storage::StorageFile::prepare`]). The next append then
    /// copies into pages already there instead of getting each on the way: on the development VM,
    /// where new memory comes slowly from its host, a 480 KiB append took 3.5 ms cold against
    /// 0.14 ms into prepared pages (docs/BENCHMARKS.md). A group applied to the index during its
    /// fsync has this done by a second helper thread during that fsync ([`Writer::reserve_ahead`]);
    /// any other after the answer, while the writer would wait for the next command. A failure here
    /// changes nothing: the next append allocates, and reports, as always.
    pub(super) fn prepare_ahead(&mut self, appended: u64) {
        if let Some((from, len)) = self.reserve_ahead(appended) {
            self.active.file.prepare(from, len);
        }
    }

    /// The allocation of [`Writer::prepare_ahead`]; returns the range still to prepare, already
    /// counted as prepared, for the caller to prepare itself or have prepared by another thread.
    pub(super) fn reserve_ahead(&mut self, appended: u64) -> Option<(u64, u64)> {
        if appended < ZERO_AHEAD_BELOW || self.poisoned.is_some() {
            return None;
        }
        let ahead = appended.saturating_mul(PREPARE_GROUPS_AHEAD).min(PREPARE_AHEAD_MAX);
        let end = self.active.len.saturating_add(ahead);
        if end > self.segment_size {
            // The next groups go to a new segment.
            return None;
        }
        if end > self.active.allocated {
            if let Err(e) = self.allocate_for(ahead) {
                tracing::debug!("allocating ahead of the next group: {e}");
                return None;
            }
        }
        let active = &mut self.active;
        let from = active.prepared.max(active.len);
        let to = end.min(active.allocated);
        if to <= from {
            return None;
        }
        active.prepared = to;
        Some((from, to - from))
    }

    /// Cuts the zeros allocated past the active segment's written bytes (before it is sealed or
    /// the store closes); the next sync makes the new length durable.
    pub(super) fn trim(&mut self) -> Result<()> {
        if self.active.allocated > self.active.len {
            self.active
                .file
                .set_len(self.active.len)
                .map_err(|e| Error::io(format!("trimming segment {}", self.active.number), e))?;
            self.active.allocated = self.active.len;
            self.active.zeroed = self.active.len;
            self.active.prepared = self.active.len;
            self.dirty = true;
        }
        Ok(())
    }

    /// Assigns sequence numbers and commit times and appends every staged frame, starting new
    /// segments as needed: when the active one is full, and before the first frame written to a
    /// store whose active segment is of an older format (every segment holds frames of its own
    /// format only).
    pub(super) fn write_staged(&mut self, staged: &mut [Staged]) -> Result<()> {
        let now = self.shared.clock.now();
        for batch in staged.iter_mut() {
            let Some((frame, _)) = &mut batch.frame else {
                continue;
            };
            let seq = self.next_seq;
            let frame_len = frame.len() as u64;
            let pending = self.active.len + self.buffer.len() as u64;
            let full = pending > SEGMENT_HEADER_BYTES as u64 && pending + frame_len > self.segment_size;
            if full || self.active.segment.version < FORMAT_VERSION {
                self.rotate()?;
            }
            // Commit times never go back, even when the clock does.
            let committed_at = now.max(self.last_committed_at);
            self.last_committed_at = committed_at;
            batch.committed_at = committed_at;
            set_frame_header(frame, seq, self.synced_len, committed_at);
            let offset = self.active.len + self.buffer.len() as u64;
            if self.buffer.is_empty() && frame.len() >= WRITE_STRAIGHT_MIN {
                // A bulk batch's frame is written from where it was built, not copied first.
                self.append(frame)?;
                self.active.len += frame_len;
            } else {
                self.buffer.extend_from_slice(frame);
            }
            batch.seq = seq;
            batch.location = Some((self.active.number, offset));
            self.next_seq += 1;
            for (outcome, op) in batch.outcomes.iter_mut().zip(&batch.ops) {
                if matches!(op, Op::Put(_)) && *outcome == (OpOutcome::Added { seq: 0 }) {
                    *outcome = OpOutcome::Added { seq };
                }
            }
            if self.buffer.len() >= GROUP_BYTES_MAX {
                let written = self.buffer.len() as u64;
                self.write_buffer()?;
                self.active.len += written;
            }
        }
        let written = self.buffer.len() as u64;
        self.write_buffer()?;
        self.active.len += written;
        Ok(())
    }

    /// Seals the active segment (synced and mapped for readers) and starts the next one.
    pub(super) fn rotate(&mut self) -> Result<()> {
        // Segment numbers only grow: the last one is refused before the active segment is sealed.
        let next_number = self.active.number.checked_add(1).ok_or_else(|| Error::Full {
            what: "segments (numbered by a u32)".to_owned(),
            limit: u64::from(u32::MAX),
        })?;
        let written = self.buffer.len() as u64;
        self.write_buffer()?;
        self.active.len += written;
        // A sealed segment ends at its last frame, durably, before the next one exists: recovery
        // takes zeros past the last frame as allocated space only in the newest segment.
        self.trim()?;
        self.active
            .file
            .sync_data()
            .map_err(|e| Error::io(format!("syncing segment {} before sealing it", self.active.number), e))?;
        self.dirty = false;
        let number = self.active.number;
        let path = self.dir.join(segment_file_name(number));
        let storage = &*self.shared.storage;
        let sealed = Arc::new(Segment::open(storage, &path, true, self.active.len)?);
        let next = create_segment(storage, &self.dir, next_number, self.next_seq)?;
        let mut index = self.shared.write_index();
        index.segments.insert(number, sealed);
        index.segments.insert(next.number, Arc::clone(&next.segment));
        drop(index);
        self.active = next;
        // The new segment's header was synced when it was created.
        self.synced_len = self.active.len;
        Ok(())
    }
}
