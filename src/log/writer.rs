//! The single writer thread and group commit.
//!
//! Writers hand whole batches to this thread over a channel. It takes everything that is waiting,
//! checks each batch against the index plus the batches before it in the same group, encodes one frame
//! per batch, appends them, fsyncs once (under `Durability::Immediate`), publishes them to the index
//! in sequence order, and only then answers every waiting writer. A failed write or fsync poisons the
//! store: every later write is refused and the fsync is never retried on this handle.
//!
//! A group of many puts (a bulk load) is applied to the index while its fsync runs, on a helper
//! thread, and published once the fsync succeeded: the index then briefly holds versions above its
//! sequence number, which no view sees (see [`crate::index::Unpublished`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::{Error, Result};
use crate::index::{FastMap, Location, PinInfo, Unpublished};
use crate::item::{format_hash, Scope, TypeRegistry, TypeSpec};
use crate::log::put::ValidItem;
use crate::log::record::{set_frame_header, BatchEncoder, PutView, ScopeView};
use crate::log::segment::{segment_file_name, Segment, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::query::{scope_visible, scope_writable};
use crate::storage::{sync_dir, Allocation, Storage, StorageFile};
use crate::store::{Durability, Shared};

/// Bytes of waiting batches one group takes at most before it is written.
const GROUP_BYTES_MAX: usize = 64 << 20;
/// How long the writer waits for threads still writing to join a group (see `Shared::writers`).
const GROUP_LINGER: std::time::Duration = std::time::Duration::from_micros(100);
/// How often a lingering writer thread looks again at how many threads are still writing: one that
/// got its answer and had nothing more to write ends the wait early.
const GROUP_RECHECK: std::time::Duration = std::time::Duration::from_micros(20);

/// How long the writer thread polls for the next command after a group of one write: its writer
/// usually sends the next batch within microseconds of its answer.
const LONE_POLL: std::time::Duration = std::time::Duration::from_micros(100);

/// Puts in a group from which its index insert runs during its fsync rather than after it: below,
/// the insert takes less time than starting the thread that syncs (~20 us).
const APPLY_DURING_SYNC_PUTS: usize = 256;

/// A yield that took longer than this means other work wanted the core: polling then costs more
/// than it saves.
const SLOW_YIELD: std::time::Duration = std::time::Duration::from_micros(50);

/// The next message on `channel`: polled for up to `poll`, yielding the core between polls, then
/// waited for. Polling also stops after `slow_yields` yields slower than [`SLOW_YIELD`]. Both the
/// writer thread (for commands) and writers (for answers) wait this way: a scheduler wake-up costs
/// about 40 us here, a quarter of a durable add on a fast disk.
pub(crate) fn poll_then_recv<T>(
    channel: &Receiver<T>,
    poll: std::time::Duration,
    slow_yields: u32,
) -> std::result::Result<T, crossbeam_channel::RecvError> {
    let deadline = Instant::now() + poll;
    let mut slow = 0;
    loop {
        match channel.try_recv() {
            Ok(message) => return Ok(message),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(crossbeam_channel::RecvError),
            Err(crossbeam_channel::TryRecvError::Empty) => {}
        }
        let before = Instant::now();
        if before >= deadline || slow >= slow_yields {
            return channel.recv();
        }
        std::thread::yield_now();
        if before.elapsed() > SLOW_YIELD {
            slow += 1;
        }
    }
}

/// One operation of a batch.
#[allow(
    clippy::large_enum_variant,
    reason = "nearly every operation is a put; boxing would cost an allocation per item"
)]
pub(crate) enum Op {
    Put(ValidItem),
    Delete(String),
    RegisterType(TypeSpec),
    Pin {
        name: String,
        seq: u64,
        taken_at: i64,
        session: Option<Arc<str>>,
    },
    Unpin(String),
}

/// What one operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpOutcome {
    Added { seq: u64 },
    Unchanged,
    Deleted(bool),
    Registered(bool),
    Pinned,
    Unpinned(bool),
}

/// What the writer thread answers a write: each operation's outcome, and the operations themselves,
/// handed back so that the caller takes the ids and versions it reports without copying them, and
/// frees the items on its own thread.
pub(crate) struct Answer {
    pub(crate) outcomes: Vec<OpOutcome>,
    pub(crate) ops: Vec<Op>,
}

/// What the writer thread is asked to do.
pub(crate) enum Command {
    Write {
        ops: Vec<Op>,
        /// The session view the batch comes from (`None`: the store itself).
        session: Option<Arc<str>>,
        reply: Sender<Result<Answer>>,
    },
    Flush {
        reply: Sender<Result<()>>,
    },
    /// Seal the active segment if it holds any frame, so that compaction may rewrite it; answers
    /// whether it did.
    Rotate {
        reply: Sender<Result<bool>>,
    },
}

/// The segment being appended to.
pub(crate) struct ActiveSegment {
    pub(crate) file: Box<dyn StorageFile>,
    pub(crate) number: u32,
    /// Bytes written (and, once published, readable).
    pub(crate) len: u64,
    /// The file's length: `len` plus the zeros allocated ahead of the appends.
    pub(crate) allocated: u64,
    /// Where the written part of the file ends: the appended bytes, and the zeros written ahead of
    /// them ([`Allocation::Zeroed`]); past it, up to `allocated`, blocks are only reserved.
    pub(crate) zeroed: u64,
    /// Where the space made ready for the next appends ([`StorageFile::prepare`]) ends.
    pub(crate) prepared: u64,
    pub(crate) segment: Arc<Segment>,
}

/// The least space allocated ahead of the active segment's appends when they reach its end.
pub(crate) const ALLOCATE_AHEAD_MIN: u64 = 64 << 10;
/// The most: between the two, as much as the segment already holds (doubling its length).
pub(crate) const ALLOCATE_AHEAD_MAX: u64 = 4 << 20;
/// Appends shorter than this (single adds and their groups) go into zeros written ahead of them;
/// longer ones (bulk loads) into space only reserved, which costs no writing.
pub(crate) const ZERO_AHEAD_BELOW: u64 = 64 << 10;
/// The most zeros written ahead at once (their writing is paid once, by the sync that follows).
pub(crate) const ZERO_AHEAD_MAX: u64 = 1 << 20;
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

/// What the batches earlier in a group changed, for checking the later ones.
#[derive(Default, Clone)]
struct Overlay {
    ids: FastMap<String, PendingId>,
    types: FastMap<String, Option<String>>,
    /// Pins made (true) or ended (false) by earlier batches of the group.
    pins: FastMap<String, bool>,
}

#[derive(Default, Clone)]
struct PendingId {
    /// Deleted in this group: the index's history of the id no longer counts.
    reset: bool,
    /// Each version added: its version string, content hash and scope.
    versions: Vec<(String, [u8; 32], Scope)>,
}

impl Overlay {
    fn merge(&mut self, batch: Overlay) {
        if self.ids.is_empty() && self.types.is_empty() && self.pins.is_empty() {
            *self = batch;
            return;
        }
        for (id, pending) in batch.ids {
            let entry = self.ids.entry(id).or_default();
            if pending.reset {
                *entry = pending;
            } else {
                entry.versions.extend(pending.versions);
            }
        }
        self.types.extend(batch.types);
        self.pins.extend(batch.pins);
    }
}

/// Where one operation's record lies in its batch's frame. Operations that write nothing (an
/// unchanged item, a delete of an id without history, a known type) have none.
struct RecordSpan {
    /// The operation's position in its batch.
    op: usize,
    /// The record's offset from the frame start.
    start: usize,
    /// The record's length.
    len: usize,
}

impl RecordSpan {
    /// The span of the record operation `op` appended at `start` of `encoder`.
    fn since(op: usize, start: usize, encoder: &BatchEncoder) -> Self {
        RecordSpan {
            op,
            start,
            len: encoder.len() - start,
        }
    }
}

/// A batch's frame (sequence number still to fill in) and where its records lie in it.
type EncodedBatch = (Vec<u8>, Vec<RecordSpan>);

/// A batch that passed its checks and waits to be written.
struct Staged {
    ops: Vec<Op>,
    outcomes: Vec<OpOutcome>,
    frame: Option<EncodedBatch>,
    reply: Sender<Result<Answer>>,
    seq: u64,
    location: Option<(u32, u64)>,
}

/// Work for one of the writer's kept helper threads, and what it gives back.
type HelperJob<T> = Box<dyn FnOnce() -> T + Send>;

/// A thread kept for one kind of the writer's work beside its fsyncs: it runs one job at a time,
/// handed to it over a channel, and reports what the job gave back (or its panic) on another.
/// Dropping it ends the thread and joins it.
pub(crate) struct Helper<T> {
    jobs: Option<Sender<HelperJob<T>>>,
    done: Receiver<std::thread::Result<T>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T: Send + 'static> Helper<T> {
    fn start(name: &str) -> std::io::Result<Self> {
        let (jobs, inbox) = crossbeam_channel::bounded::<HelperJob<T>>(1);
        let (report, done) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            for job in inbox {
                if report
                    .send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)))
                    .is_err()
                {
                    break;
                }
            }
        })?;
        Ok(Helper {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Hands `job` to the thread, or gives it back when the thread is gone. One job at a time:
    /// each is waited for ([`Helper::wait`]) before the next is given.
    fn give(&self, job: HelperJob<T>) -> std::result::Result<(), HelperJob<T>> {
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|e| e.into_inner()),
            None => Err(job),
        }
    }

    /// What the job given last gave back, once it is done; its panic if it panicked.
    fn wait(&self) -> std::thread::Result<T> {
        self.done
            .recv()
            .unwrap_or_else(|_| Err(Box::new("a helper thread of the writer stopped")))
    }
}

impl<T> Drop for Helper<T> {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer's kept helpers: the apply helper, which applies a bulk group to the index during
/// its fsync, and the prepare helper, which readies the space for the next groups meanwhile. Both
/// are started by the first such group; `None` inside once starting one failed.
#[derive(Default)]
pub(crate) struct SyncHelpers {
    apply: Option<Option<Helper<Vec<Staged>>>>,
    prepare: Option<Option<Helper<()>>>,
}

impl SyncHelpers {
    /// Starts the helpers not tried yet; whether the apply helper is there.
    fn start(&mut self) -> bool {
        fn started<T: Send + 'static>(name: &str) -> Option<Helper<T>> {
            Helper::start(name)
                .inspect_err(|e| tracing::debug!("starting the writer's helper {name}: {e}"))
                .ok()
        }
        self.prepare.get_or_insert_with(|| started("ctxlog-prepare"));
        self.apply.get_or_insert_with(|| started("ctxlog-apply")).is_some()
    }

    fn get(&self) -> (Option<&Helper<Vec<Staged>>>, Option<&Helper<()>>) {
        (
            self.apply.as_ref().and_then(Option::as_ref),
            self.prepare.as_ref().and_then(Option::as_ref),
        )
    }
}

pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) dir: PathBuf,
    pub(crate) active: ActiveSegment,
    pub(crate) next_seq: u64,
    pub(crate) durability: Durability,
    pub(crate) segment_size: u64,
    pub(crate) poisoned: Option<String>,
    pub(crate) dirty: bool,
    pub(crate) last_sync: Instant,
    pub(crate) buffer: Vec<u8>,
    /// Bytes of the active segment known durable: its length at the last fsync that succeeded.
    /// Every frame carries it (its sync mark), so that recovery can tell a hole left by writes that
    /// never reached the disk from damage to synced bytes.
    pub(crate) synced_len: u64,
    /// Write commands in the last group: how many to wait for in the next one.
    pub(crate) last_group_writes: usize,
    /// Threads kept for the work beside a bulk group's fsync.
    pub(crate) helpers: SyncHelpers,
}

impl Writer {
    /// Serves commands until every sender is gone, then syncs; returns whether the log ended clean
    /// (never poisoned).
    pub(crate) fn run(mut self, commands: &Receiver<Command>) -> bool {
        loop {
            let first = match (self.durability, self.dirty) {
                (Durability::Periodic(period), true) => {
                    let wait = period.saturating_sub(self.last_sync.elapsed());
                    match commands.recv_timeout(wait) {
                        Ok(command) => Some(command),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                // After a group of one write, poll a moment before sleeping.
                _ if self.last_group_writes == 1 => match poll_then_recv(commands, LONE_POLL, u32::MAX) {
                    Ok(command) => Some(command),
                    Err(_) => break,
                },
                _ => match commands.recv() {
                    Ok(command) => Some(command),
                    Err(_) => break,
                },
            };
            let Some(first) = first else {
                let _ = self.sync();
                continue;
            };
            let mut group = vec![first];
            let mut bytes = 0usize;
            while bytes < GROUP_BYTES_MAX {
                match commands.try_recv() {
                    Ok(command) => {
                        if let Command::Write { ops, .. } = &command {
                            bytes += ops.iter().map(op_bytes).sum::<usize>();
                        }
                        group.push(command);
                    }
                    Err(_) => break,
                }
            }
            // Group commit: writers submit their next batch as soon as the last fsync answers them,
            // not all at once. While threads are inside an add or a delete whose batch is not in
            // the group yet (validating it, or just answered and about to send the next), wait a
            // moment for them, so that one fsync serves them all. Waiting for as many as the last
            // group held instead locked 8 writers into two groups of 4 that took turns.
            let writes = |group: &[Command]| group.iter().filter(|c| matches!(c, Command::Write { .. })).count();
            if matches!(self.durability, Durability::Immediate) {
                let deadline = Instant::now() + GROUP_LINGER;
                while writes(&group) < self.shared.writers.load(std::sync::atomic::Ordering::Acquire)
                    && bytes < GROUP_BYTES_MAX
                {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match commands.recv_timeout(left.min(GROUP_RECHECK)) {
                        Ok(command) => {
                            if let Command::Write { ops, .. } = &command {
                                bytes += ops.iter().map(op_bytes).sum::<usize>();
                            }
                            group.push(command);
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            }
            self.last_group_writes = writes(&group);
            self.process(group);
        }
        if self.poisoned.is_none() {
            // A closed store's newest segment ends at its last frame: no allocated zeros.
            if let Err(e) = self.sync().and_then(|()| self.trim()).and_then(|()| self.sync()) {
                tracing::error!("final sync of the store failed: {e}");
            }
        }
        self.poisoned.is_none()
    }

    /// Makes what was written durable: the buffer written out, then one fsync of the active
    /// segment (none when nothing was written since the last one).
    fn sync(&mut self) -> Result<()> {
        if let Some(reason) = &self.poisoned {
            return Err(Error::Poisoned { reason: reason.clone() });
        }
        let result = self.write_buffer().and_then(|()| {
            if !self.dirty {
                return Ok(());
            }
            self.active
                .file
                .sync_data()
                .map_err(|e| Error::io(format!("syncing segment {}", self.active.number), e))?;
            self.dirty = false;
            self.synced_len = self.active.len;
            Ok(())
        });
        self.last_sync = Instant::now();
        if let Err(e) = &result {
            self.poisoned = Some(e.to_string());
        }
        result
    }

    /// As [`Writer::sync`], with the group's batches applied to the index (unpublished)
    /// during the fsync by the writer's kept apply helper, and `prepare` (a hint) run by its kept
    /// prepare helper: handing them work costs a wake-up, where starting two threads for each
    /// group cost ~50 us on this thread before its fsync could begin. The batches come back with
    /// the answer whether they were applied. Without helpers (they could not be started), the
    /// batches are left to be applied after the fsync, by the publication.
    fn sync_beside(
        &mut self,
        staged: Vec<Staged>,
        shared: Arc<Shared>,
        prepare: Option<impl FnOnce() + Send + 'static>,
    ) -> (Result<bool>, Vec<Staged>) {
        if self.poisoned.is_some() || !self.helpers.start() {
            return (self.sync().map(|()| false), staged);
        }
        if let Err(e) = self.write_buffer() {
            self.poisoned = Some(e.to_string());
            return (Err(e), staged);
        }
        if !self.dirty {
            self.last_sync = Instant::now();
            return (Ok(false), staged);
        }
        let (Some(apply), prepare_helper) = self.helpers.get() else {
            return (self.sync().map(|()| false), staged);
        };
        let preparing = match (prepare, prepare_helper) {
            (Some(work), Some(helper)) => helper.give(Box::new(work)).is_ok().then_some(helper),
            _ => None,
        };
        let job: HelperJob<Vec<Staged>> = Box::new(move || {
            apply_unpublished(&shared, &staged);
            staged
        });
        // A helper whose thread is gone gives the job back: it is done here, before the fsync.
        let done_here = apply.give(job).err().map(|job| job());
        let synced = self.active.file.sync_data();
        let staged = match done_here {
            Some(staged) => staged,
            None => apply.wait().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        };
        if let Some(Err(panic)) = preparing.map(Helper::wait) {
            std::panic::resume_unwind(panic);
        }
        self.last_sync = Instant::now();
        match synced {
            Ok(()) => {
                self.dirty = false;
                self.synced_len = self.active.len;
                (Ok(true), staged)
            }
            Err(e) => {
                let e = Error::io(format!("syncing segment {}", self.active.number), e);
                self.poisoned = Some(e.to_string());
                (Err(e), staged)
            }
        }
    }

    fn write_buffer(&mut self) -> Result<()> {
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
    /// written into are made ready ([`StorageFile::prepare`]). The next append then copies into
    /// pages already there instead of getting each on the way: on the development VM, where new
    /// memory comes slowly from its host, a 480 KiB append took 3.5 ms cold against 0.14 ms into
    /// prepared pages (docs/BENCHMARKS.md). A group applied to the index during its fsync has this
    /// done by a second helper thread during that fsync ([`Writer::reserve_ahead`]); any other
    /// after the answer, while the writer would wait for the next command. A failure here changes
    /// nothing: the next append allocates, and reports, as always.
    fn prepare_ahead(&mut self, appended: u64) {
        if let Some((from, len)) = self.reserve_ahead(appended) {
            self.active.file.prepare(from, len);
        }
    }

    /// The allocation of [`Writer::prepare_ahead`]; returns the range still to prepare, already
    /// counted as prepared, for the caller to prepare itself or have prepared by another thread.
    fn reserve_ahead(&mut self, appended: u64) -> Option<(u64, u64)> {
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
    fn trim(&mut self) -> Result<()> {
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

    fn process(&mut self, group: Vec<Command>) {
        let (segment_before, len_before) = (self.active.number, self.active.len);
        let mut staged = Vec::new();
        let mut flushes = Vec::new();
        let mut rotations = Vec::new();
        {
            let index = self.shared.read_index();
            let registry = self.shared.registry();
            let mut overlay = Overlay::default();
            let solo = group.iter().filter(|c| matches!(c, Command::Write { .. })).count() == 1;
            for command in group {
                match command {
                    Command::Flush { reply } => flushes.push(reply),
                    Command::Rotate { reply } => rotations.push(reply),
                    Command::Write { ops, session, reply } => {
                        if let Some(reason) = &self.poisoned {
                            let _ = reply.send(Err(Error::Poisoned { reason: reason.clone() }));
                            continue;
                        }
                        match plan(&index, &registry, &overlay, &ops, solo, session.as_deref()) {
                            Ok((outcomes, batch_overlay, encoder)) => {
                                overlay.merge(batch_overlay);
                                staged.push(Staged {
                                    ops,
                                    outcomes,
                                    frame: encoder,
                                    reply,
                                    seq: 0,
                                    location: None,
                                });
                            }
                            Err(e) => {
                                let _ = reply.send(Err(e));
                            }
                        }
                    }
                }
            }
        }
        let written = self.write_staged(&mut staged);
        let must_sync = !flushes.is_empty()
            || match self.durability {
                Durability::Immediate => true,
                Durability::Periodic(period) => self.last_sync.elapsed() >= period,
                Durability::Never => false,
            };
        let mut applied = false;
        let synced = written.and_then(|()| {
            if !must_sync {
                self.write_buffer()
            } else if apply_during_sync(&staged) {
                // The space for the next groups is prepared during this fsync too, on a second
                // helper, rather than after the answer beside the next batch's validation.
                let ahead = if self.active.number == segment_before {
                    self.reserve_ahead(self.active.len - len_before)
                } else {
                    None
                };
                let segment = Arc::clone(&self.active.segment);
                let prepare = ahead.map(|(from, len)| move || segment.prepare(from, len));
                let shared = Arc::clone(&self.shared);
                let (ran, back) = self.sync_beside(std::mem::take(&mut staged), shared, prepare);
                staged = back;
                ran.map(|ran| applied = ran)
            } else {
                self.sync()
            }
        });
        if let Err(e) = synced {
            // A group applied to the index during its failed fsync stays there, never published:
            // no view sees it, and no checkpoint is taken of it.
            let mut index = self.shared.write_index();
            if !index.unpublished.is_none() {
                index.unpublished.failed = true;
            }
            drop(index);
            // A writer already poisoned keeps the failure that poisoned it: its `Poisoned` refusal
            // must not be wrapped into a longer reason at every refused command.
            let reason = self.poisoned.get_or_insert_with(|| e.to_string()).clone();
            tracing::error!("store poisoned: {reason}");
            for batch in staged {
                let _ = batch.reply.send(Err(Error::Poisoned { reason: reason.clone() }));
            }
            for reply in flushes {
                let _ = reply.send(Err(Error::Poisoned { reason: reason.clone() }));
            }
            for reply in rotations {
                let _ = reply.send(Err(Error::Poisoned { reason: reason.clone() }));
            }
            return;
        }
        if applied {
            self.publish_applied(&staged);
        } else {
            self.publish(&staged);
        }
        for batch in staged {
            let _ = batch.reply.send(Ok(Answer {
                outcomes: batch.outcomes,
                ops: batch.ops,
            }));
        }
        for reply in flushes {
            let _ = reply.send(Ok(()));
        }
        self.active.segment.extend_window();
        if self.active.number == segment_before {
            self.prepare_ahead(self.active.len - len_before);
        }
        if !rotations.is_empty() {
            let rotated = if self.active.len > SEGMENT_HEADER_BYTES as u64 {
                self.rotate().map(|()| true)
            } else {
                Ok(false)
            };
            if let Err(e) = &rotated {
                self.poisoned = Some(e.to_string());
            }
            for reply in rotations {
                let _ = reply.send(match &rotated {
                    Ok(done) => Ok(*done),
                    Err(e) => Err(Error::Poisoned { reason: e.to_string() }),
                });
            }
        }
    }

    /// Assigns sequence numbers and appends every staged frame, starting new segments as needed.
    fn write_staged(&mut self, staged: &mut [Staged]) -> Result<()> {
        for batch in staged.iter_mut() {
            let Some((frame, _)) = &mut batch.frame else {
                continue;
            };
            let seq = self.next_seq;
            let frame_len = frame.len() as u64;
            let pending = self.active.len + self.buffer.len() as u64;
            if pending > SEGMENT_HEADER_BYTES as u64 && pending + frame_len > self.segment_size {
                self.rotate()?;
            }
            set_frame_header(frame, seq, self.synced_len);
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
    fn rotate(&mut self) -> Result<()> {
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
        let next = create_segment(storage, &self.dir, number + 1, self.next_seq)?;
        let mut index = self.shared.write_index();
        index.segments.insert(number, sealed);
        index.segments.insert(next.number, Arc::clone(&next.segment));
        drop(index);
        self.active = next;
        // The new segment's header was synced when it was created.
        self.synced_len = self.active.len;
        Ok(())
    }

    /// Makes the written batches visible, in sequence order.
    fn publish(&self, staged: &[Staged]) {
        let mut index = write_index_for(&self.shared, staged);
        let registry = apply(&mut index, &self.shared, staged);
        if let Some(seq) = last_seq(staged) {
            index.seq = seq;
        }
        let active_len = self.active.len;
        self.active.segment.set_published_len(active_len);
        if let Some(registry) = registry {
            index.registry = registry.clone();
            self.shared.set_registry(registry);
        }
    }

    /// Makes the batches [`apply_unpublished`] applied visible, once their fsync succeeded.
    fn publish_applied(&self, staged: &[Staged]) {
        let mut index = self.shared.write_index();
        if let Some(seq) = last_seq(staged) {
            index.seq = seq;
        }
        index.unpublished = Unpublished::default();
        self.active.segment.set_published_len(self.active.len);
    }
}

/// The index's write lock, with room made first in its id lookup for every put the group writes
/// (built under the read lock, so that readers do not wait for it).
fn write_index_for<'a>(shared: &'a Shared, staged: &[Staged]) -> std::sync::RwLockWriteGuard<'a, crate::index::Index> {
    let grown = shared.read_index().grown_lookup(written_puts(staged));
    let mut index = shared.write_index();
    if let Some(lookup) = grown {
        index.install_lookup(lookup);
    }
    index
}

/// Puts written by the group's batches.
fn written_puts(staged: &[Staged]) -> usize {
    staged
        .iter()
        .filter(|batch| batch.frame.is_some())
        .map(|batch| batch.ops.iter().filter(|op| matches!(op, Op::Put(_))).count())
        .sum()
}

/// The sequence number of the group's last written batch.
fn last_seq(staged: &[Staged]) -> Option<u64> {
    staged
        .iter()
        .filter(|batch| batch.frame.is_some())
        .map(|batch| batch.seq)
        .next_back()
}

/// Whether the group's index insert should run during its fsync: a group of many puts and nothing
/// else, so that applying it ahead of its sequence number changes nothing a view can see (no
/// delete, type, or pin).
fn apply_during_sync(staged: &[Staged]) -> bool {
    let only_puts = staged
        .iter()
        .all(|batch| batch.ops.iter().all(|op| matches!(op, Op::Put(_))));
    only_puts && written_puts(staged) >= APPLY_DURING_SYNC_PUTS
}

/// Applies the written batches of a group of puts to the index without publishing them: their
/// versions are above the index's sequence number until [`Writer::publish_applied`].
fn apply_unpublished(shared: &Shared, staged: &[Staged]) {
    let mut index = write_index_for(shared, staged);
    let (versions, live_ids) = (index.slots.len() as u64, index.live_ids);
    // A group of puts changes no registry.
    let _ = apply(&mut index, shared, staged);
    index.unpublished = Unpublished {
        versions: (index.slots.len() as u64).saturating_sub(versions),
        live_ids: index.live_ids.saturating_sub(live_ids),
        failed: false,
    };
}

/// Applies the written batches to the index, in sequence order, without moving its sequence
/// number; returns the registry to install if a batch registered a type.
fn apply(index: &mut crate::index::Index, shared: &Shared, staged: &[Staged]) -> Option<TypeRegistry> {
    // A copy of the registry only once a batch registers a type.
    let mut registry: Option<TypeRegistry> = None;
    for batch in staged {
        let (Some((frame, records)), Some((segment, frame_offset))) = (&batch.frame, batch.location) else {
            continue;
        };
        for record in records {
            match batch.ops.get(record.op) {
                Some(Op::Put(valid)) => {
                    let item = &valid.item;
                    let put = PutView {
                        id: &item.id,
                        kind: &item.kind,
                        version: &item.version,
                        scope: ScopeView::from(&item.scope),
                        source: &item.source,
                        timestamp: item.timestamp,
                        ttl_seconds: item.ttl_seconds,
                        confidence: item.confidence,
                        hash: valid.hash,
                        // The index keeps no content.
                        content: &[],
                        compressed: false,
                    };
                    let location = Location {
                        segment,
                        offset: u32::try_from(frame_offset + record.start as u64).unwrap_or(u32::MAX),
                        len: u32::try_from(record.len).unwrap_or(u32::MAX),
                        crc: crate::index::record_crc_at(frame, record.start),
                    };
                    index.apply_put(batch.seq, &put, location);
                }
                Some(Op::Delete(id)) => {
                    index.apply_delete(batch.seq, id);
                }
                Some(Op::RegisterType(spec)) => {
                    let registry = registry.get_or_insert_with(|| (*shared.registry()).clone());
                    // The writer checked the registration; a refusal here leaves the registry
                    // as it was, as before.
                    let _ = registry.insert(spec.clone());
                }
                Some(Op::Pin {
                    name,
                    seq,
                    taken_at,
                    session,
                }) => {
                    let pin = PinInfo {
                        seq: *seq,
                        taken_at: *taken_at,
                        session: session.clone(),
                    };
                    index.pins.insert(name.clone(), pin);
                }
                Some(Op::Unpin(name)) => {
                    index.pins.remove(name);
                }
                _ => {}
            }
        }
    }
    registry
}

fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Put(valid) => valid.record.len(),
        Op::Delete(id) => id.len() + 16,
        Op::RegisterType(spec) => spec.name().len() + spec.pattern().map_or(0, str::len) + 16,
        Op::Pin { name, .. } | Op::Unpin(name) => name.len() + 160,
    }
}

type Plan = (Vec<OpOutcome>, Overlay, Option<EncodedBatch>);

/// Checks one batch against the index and the earlier batches of its group, and encodes what it
/// writes. Nothing is changed if any operation is refused. `solo`: the batch is the only write of
/// its group.
fn plan(
    index: &crate::index::Index,
    registry: &TypeRegistry,
    group: &Overlay,
    ops: &[Op],
    solo: bool,
    session: Option<&str>,
) -> Result<Plan> {
    // The overlay tells the batch's later operations and the group's later batches what the batch
    // did. The only batch of a group, of puts of distinct ids (a bulk load), has no reader for it:
    // none is built (three allocations per put saved on the writer thread).
    let tracked = !(solo && distinct_put_ids(ops));
    let mut batch = Overlay::default();
    if tracked {
        batch.ids.reserve(ops.len());
    }
    let mut outcomes = Vec::with_capacity(ops.len());
    let record_bytes = ops
        .iter()
        .map(|op| match op {
            Op::Put(valid) => valid.record.len(),
            _ => 0,
        })
        .sum();
    let mut encoder = BatchEncoder::with_capacity(record_bytes);
    let mut records = Vec::with_capacity(ops.len());
    for (position, op) in ops.iter().enumerate() {
        match op {
            Op::Put(valid) => {
                let item = &valid.item;
                // An id the validating thread found unknown to the index, which has learned no id
                // since, is still unknown to it: only the overlays are looked at.
                let unknown = valid.unknown_among == Some(index.id_count());
                // Before anything about the id's versions is compared (and so revealed): a session
                // adds versions only to ids whose latest version it may write itself.
                if let Some(session) = session {
                    if !session_may_write(index, group, &batch, &item.id, session, unknown) {
                        return Err(Error::PermissionDenied {
                            reason: format!(
                                "session {session:?} may not add a version of id {:?}: its latest version is in a \
                                 scope this session may not write",
                                item.id
                            ),
                            index: Some(position),
                        });
                    }
                }
                match existing_hash(index, group, &batch, &item.id, &item.version, session, unknown)? {
                    // A session compares only versions it may see: a version in another session's
                    // scope, or one whose record compaction reclaimed (its scope is not kept), is
                    // refused alike, so that neither a `VersionConflict` (the stored hash) nor an
                    // `Unchanged` (a guessed content confirmed) tells the session about it.
                    Some((_, false)) => {
                        return Err(Error::PermissionDenied {
                            reason: format!(
                                "session {:?} may not add version {:?} of id {:?}: that version was added \
                                 before, and is in a scope this session may not see, or its content was \
                                 reclaimed by compaction (which keeps no scope to check)",
                                session.unwrap_or_default(),
                                item.version,
                                item.id
                            ),
                            index: Some(position),
                        });
                    }
                    Some((existing, true)) if existing == valid.hash => {
                        outcomes.push(OpOutcome::Unchanged);
                        continue;
                    }
                    Some((existing, true)) => {
                        return Err(Error::VersionConflict {
                            id: item.id.clone(),
                            version: item.version.clone(),
                            existing: format_hash(&existing),
                            attempted: format_hash(&valid.hash),
                            index: Some(position),
                        });
                    }
                    None => {}
                }
                if tracked {
                    batch.ids.entry(item.id.clone()).or_default().versions.push((
                        item.version.clone(),
                        valid.hash,
                        item.scope.clone(),
                    ));
                }
                let start = encoder.push_encoded(&valid.record);
                records.push(RecordSpan::since(position, start, &encoder));
                outcomes.push(OpOutcome::Added { seq: 0 });
            }
            Op::Delete(id) => {
                let existed = has_history(index, group, &batch, id);
                let pending = batch.ids.entry(id.clone()).or_default();
                pending.reset = true;
                pending.versions.clear();
                if existed {
                    let start = encoder.delete(id);
                    records.push(RecordSpan::since(position, start, &encoder));
                }
                outcomes.push(OpOutcome::Deleted(existed));
            }
            Op::RegisterType(spec) => {
                let pending = batch.types.get(spec.name()).or_else(|| group.types.get(spec.name()));
                let is_new = match pending {
                    Some(pattern) if pattern.as_deref() == spec.pattern() => false,
                    Some(_) => {
                        return Err(Error::invalid(
                            "type",
                            format!("{:?} is being registered with another id pattern", spec.name()),
                        ))
                    }
                    None => registry.check_register(spec)?,
                };
                if is_new {
                    batch
                        .types
                        .insert(spec.name().to_owned(), spec.pattern().map(str::to_owned));
                    let start = encoder.register_type(spec);
                    records.push(RecordSpan::since(position, start, &encoder));
                }
                outcomes.push(OpOutcome::Registered(is_new));
            }
            Op::Pin {
                name,
                seq,
                taken_at,
                session,
            } => {
                let pinned = is_pinned(index, group, &batch, name);
                if pinned {
                    return Err(Error::invalid(
                        "name",
                        format!("a snapshot named {name:?} is already pinned"),
                    ));
                }
                batch.pins.insert(name.clone(), true);
                let start = encoder.pin(name, *seq, *taken_at, session.as_deref());
                records.push(RecordSpan::since(position, start, &encoder));
                outcomes.push(OpOutcome::Pinned);
            }
            Op::Unpin(name) => {
                let pinned = is_pinned(index, group, &batch, name);
                if pinned {
                    batch.pins.insert(name.clone(), false);
                    let start = encoder.unpin(name);
                    records.push(RecordSpan::since(position, start, &encoder));
                }
                outcomes.push(OpOutcome::Unpinned(pinned));
            }
        }
    }
    if encoder.is_empty() {
        return Ok((outcomes, batch, None));
    }
    // The sequence number and the CRC are filled in when the frame is written; finishing here
    // checks the size.
    let frame = encoder.finish_unsealed()?;
    Ok((outcomes, batch, Some((frame, records))))
}

/// Whether every operation of `ops` is a put, each of another id.
fn distinct_put_ids(ops: &[Op]) -> bool {
    // Ids that rise from each put to the next (a load in id order) are distinct: no set is built.
    let mut last: Option<&str> = None;
    let rising = ops.iter().all(|op| match op {
        Op::Put(valid) => {
            let id = valid.item.id.as_str();
            last.replace(id).is_none_or(|before| before < id)
        }
        _ => false,
    });
    if rising {
        return true;
    }
    let mut ids: std::collections::HashSet<&str, foldhash::fast::RandomState> =
        std::collections::HashSet::with_capacity_and_hasher(ops.len(), foldhash::fast::RandomState::default());
    ops.iter().all(|op| match op {
        Op::Put(valid) => ids.insert(valid.item.id.as_str()),
        _ => false,
    })
}

/// The hash of version `version` of id `id` (in this batch, the group's earlier batches, or the
/// index, since the id's last delete), if there is one, and whether a view of `session` may see
/// that version: always without a session; with one, when the version's scope is the session's
/// own or a global one. A version whose record compaction reclaimed keeps no scope
/// (docs/FORMAT.md, "Retired-version body"): no session may see it. `unknown`: the index is known
/// not to know the id, and is not looked at.
fn existing_hash(
    index: &crate::index::Index,
    group: &Overlay,
    batch: &Overlay,
    id: &str,
    version: &str,
    session: Option<&str>,
    unknown: bool,
) -> Result<Option<([u8; 32], bool)>> {
    let visible = |scope: Option<&Scope>| session.is_none() || scope.is_some_and(|scope| scope_visible(scope, session));
    for overlay in [batch, group] {
        if let Some(pending) = overlay.ids.get(id) {
            if let Some((_, hash, scope)) = pending.versions.iter().find(|(v, _, _)| v == version) {
                return Ok(Some((*hash, visible(Some(scope)))));
            }
            if pending.reset {
                return Ok(None);
            }
        }
    }
    if unknown {
        return Ok(None);
    }
    for entry in index.current_history(id) {
        if entry.version_tag() != crate::index::version_tag(version) {
            continue;
        }
        let (found, hash) = crate::snapshot::read_identity(index, &entry).map_err(Error::from)?;
        if found == version {
            let scope = if entry.is_stored() {
                index.scopes.value(entry.scope)
            } else {
                None
            };
            return Ok(Some((hash, visible(scope))));
        }
    }
    Ok(None)
}

/// Whether a session view of `session` may add a version of id `id`: the id's latest version
/// (in this batch, the group's earlier batches, or the index, since the id's last delete), if its
/// record is still stored, is in a scope the session may write (its own or `GlobalWritable`).
/// Otherwise a session could replace a `GlobalReadonly` item for every reader, or another session's
/// item under that session's own id, and comparing its version with the stored ones would tell it
/// their hashes. A latest version whose record compaction reclaimed (expired) holds no content and
/// keeps no scope (docs/FORMAT.md: a retired version's scope is not stored): it does not count.
/// `unknown`: the index is known not to know the id, and is not looked at.
fn session_may_write(
    index: &crate::index::Index,
    group: &Overlay,
    batch: &Overlay,
    id: &str,
    session: &str,
    unknown: bool,
) -> bool {
    let writable = |scope: &Scope| scope_writable(scope, session);
    for overlay in [batch, group] {
        if let Some(pending) = overlay.ids.get(id) {
            if let Some((_, _, scope)) = pending.versions.last() {
                return writable(scope);
            }
            if pending.reset {
                return true;
            }
        }
    }
    if unknown {
        return true;
    }
    match index.current_history(id).next() {
        Some(latest) if latest.is_stored() => index.scopes.value(latest.scope).is_some_and(writable),
        _ => true,
    }
}

/// Whether `name` is pinned once the earlier batches of the group and this one are applied.
fn is_pinned(index: &crate::index::Index, group: &Overlay, batch: &Overlay, name: &str) -> bool {
    batch
        .pins
        .get(name)
        .or_else(|| group.pins.get(name))
        .copied()
        .unwrap_or_else(|| index.pins.contains_key(name))
}

fn has_history(index: &crate::index::Index, group: &Overlay, batch: &Overlay, id: &str) -> bool {
    for overlay in [batch, group] {
        if let Some(pending) = overlay.ids.get(id) {
            if !pending.versions.is_empty() {
                return true;
            }
            if pending.reset {
                return false;
            }
        }
    }
    index.current_history(id).next().is_some()
}

/// Creates segment `number` whose first frame will carry `base_seq`: header written and synced, and
/// the directory synced so that the file survives a crash.
pub(crate) fn create_segment(storage: &dyn Storage, dir: &Path, number: u32, base_seq: u64) -> Result<ActiveSegment> {
    let path = dir.join(segment_file_name(number));
    let mut file = storage
        .create_new(&path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    let header = SegmentHeader {
        number,
        base_seq,
        rewrites: 0,
    }
    .encode();
    file.append(&header)
        .map_err(|e| Error::io(format!("writing the header of {}", path.display()), e))?;
    file.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", path.display()), e))?;
    sync_dir(storage, dir)?;
    let segment = Arc::new(Segment::open(storage, &path, false, SEGMENT_HEADER_BYTES as u64)?);
    Ok(ActiveSegment {
        file,
        number,
        len: SEGMENT_HEADER_BYTES as u64,
        allocated: SEGMENT_HEADER_BYTES as u64,
        zeroed: SEGMENT_HEADER_BYTES as u64,
        prepared: SEGMENT_HEADER_BYTES as u64,
        segment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::{ContextItem, Scope};
    use crate::limits::CONTENT_BYTES_DEFAULT;
    use crate::log::put::validate_item;

    fn put(id: &str, version: &str, text: &str) -> Op {
        scoped_put(id, version, text, Scope::GlobalWritable)
    }

    fn scoped_put(id: &str, version: &str, text: &str, scope: Scope) -> Op {
        let item = ContextItem::new(
            id,
            "document_chunk",
            serde_json::json!({ "text": text }),
            "test",
            1_700_000_000,
            version,
            scope,
        );
        Op::Put(validate_item(item, &TypeRegistry::default(), CONTENT_BYTES_DEFAULT, false).expect("valid item"))
    }

    fn pin(name: &str) -> Op {
        Op::Pin {
            name: name.into(),
            seq: 0,
            taken_at: 0,
            session: None,
        }
    }

    /// Plans `batches` as one group, as `Writer::process` does (a batch that passes adds its changes
    /// to the group's overlay): what each batch was answered.
    fn plan_group(batches: Vec<Vec<Op>>) -> Vec<std::result::Result<Vec<OpOutcome>, String>> {
        plan_group_of(batches.into_iter().map(|ops| (None, ops)).collect())
    }

    /// As [`plan_group`], each batch from the session view named beside it (`None`: the store).
    fn plan_group_of(batches: Vec<(Option<&str>, Vec<Op>)>) -> Vec<std::result::Result<Vec<OpOutcome>, String>> {
        let index = crate::index::Index::default();
        let registry = TypeRegistry::default();
        let mut overlay = Overlay::default();
        let mut answers = Vec::new();
        for (session, ops) in batches {
            match plan(&index, &registry, &overlay, &ops, false, session) {
                Ok((outcomes, batch, _frame)) => {
                    overlay.merge(batch);
                    answers.push(Ok(outcomes));
                }
                Err(e) => answers.push(Err(e.to_string())),
            }
        }
        answers
    }

    #[test]
    fn a_sessions_batch_may_not_add_to_an_id_an_earlier_batch_of_its_group_gave_a_scope_it_may_not_write() {
        use OpOutcome::*;
        let added = || Added { seq: 0 };
        let s1 = || Scope::Session("s1".into());
        let answers = plan_group_of(vec![
            (
                Some("s1"),
                vec![
                    scoped_put("a", "1", "mine", s1()),
                    scoped_put("b", "1", "shared", Scope::GlobalWritable),
                ],
            ),
            (None, vec![scoped_put("c", "1", "read only", Scope::GlobalReadonly)]),
            // Another session: s1's id (same version, same content: no Unchanged answer), s1's id
            // again (new version), the read-only id: each refused before its versions are compared.
            (Some("s2"), vec![scoped_put("a", "1", "mine", Scope::GlobalWritable)]),
            (Some("s2"), vec![scoped_put("a", "2", "taken", Scope::GlobalWritable)]),
            (
                Some("s2"),
                vec![
                    scoped_put("b", "2", "fine", Scope::GlobalWritable),
                    scoped_put("c", "2", "x", Scope::GlobalWritable),
                ],
            ),
            // What s2 may write: the global_writable id, and its own.
            (
                Some("s2"),
                vec![
                    scoped_put("b", "2", "fine", Scope::GlobalWritable),
                    scoped_put("d", "1", "own", Scope::Session("s2".into())),
                ],
            ),
            // The owner and the store itself are not refused.
            (Some("s1"), vec![scoped_put("a", "2", "mine again", s1())]),
            (None, vec![scoped_put("c", "2", "by the store", Scope::GlobalReadonly)]),
        ]);
        assert_eq!(answers[0], Ok(vec![added(), added()]));
        assert_eq!(answers[1], Ok(vec![added()]));
        for (at, answer) in [(2, 0), (3, 0), (4, 1)] {
            let message = answers[at].as_ref().expect_err("refused");
            assert!(
                message.contains(&format!("item {answer}: permission denied")),
                "{message}"
            );
            assert!(!message.contains("hash"), "{message}");
        }
        assert_eq!(answers[5], Ok(vec![added(), added()]));
        assert_eq!(answers[6], Ok(vec![added()]));
        assert_eq!(answers[7], Ok(vec![added()]));
    }

    #[test]
    fn a_kept_helper_runs_each_job_on_its_thread_in_turn_and_outlives_a_panicking_one() {
        let helper = Helper::<String>::start("ctxlog-test-helper").expect("start");
        for k in 0..3 {
            let job: HelperJob<String> =
                Box::new(move || format!("{}:{k}", std::thread::current().name().unwrap_or("?")));
            assert!(helper.give(job).is_ok());
            assert_eq!(helper.wait().expect("done"), format!("ctxlog-test-helper:{k}"));
        }
        assert!(helper.give(Box::new(|| panic!("a job that panics"))).is_ok());
        let panic = helper.wait().expect_err("the panic is reported");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"a job that panics"));
        assert!(helper.give(Box::new(|| "still there".to_owned())).is_ok());
        assert_eq!(helper.wait().expect("done"), "still there");
        // Dropping it ends its thread and joins it.
        drop(helper);
    }

    #[test]
    fn a_session_compares_only_versions_it_may_see_among_the_earlier_batches_of_its_group() {
        use OpOutcome::*;
        let s1 = || Scope::Session("s1".into());
        let answers = plan_group_of(vec![
            // s1's id: a private version 1, then a global_writable version 2 (its latest).
            (
                Some("s1"),
                vec![
                    scoped_put("a", "1", "secret", s1()),
                    scoped_put("a", "2", "public", Scope::GlobalWritable),
                ],
            ),
            // s2 may add to the id now, but not compare with its private version 1: neither the
            // right content (no Unchanged) nor another (no VersionConflict naming the hash).
            (Some("s2"), vec![scoped_put("a", "1", "secret", Scope::GlobalWritable)]),
            (Some("s2"), vec![scoped_put("a", "1", "guess", Scope::GlobalWritable)]),
            // Version 2 is global: s2 sees it, so it is compared.
            (Some("s2"), vec![scoped_put("a", "2", "public", Scope::GlobalWritable)]),
            (Some("s2"), vec![scoped_put("a", "2", "other", Scope::GlobalWritable)]),
            // The owner and the store compare version 1 as before.
            (Some("s1"), vec![scoped_put("a", "1", "secret", s1())]),
            (None, vec![scoped_put("a", "1", "guess", s1())]),
        ]);
        assert_eq!(answers[0], Ok(vec![Added { seq: 0 }, Added { seq: 0 }]));
        for at in [1, 2] {
            let message = answers[at].as_ref().expect_err("refused");
            assert!(message.contains("item 0: permission denied"), "{message}");
            assert!(!message.contains("hash") && !message.contains("sha256"), "{message}");
        }
        assert_eq!(answers[3], Ok(vec![Unchanged]));
        let conflict = answers[4].as_ref().expect_err("conflict");
        assert!(conflict.contains("version conflict"), "{conflict}");
        assert_eq!(answers[5], Ok(vec![Unchanged]));
        let conflict = answers[6].as_ref().expect_err("conflict");
        assert!(conflict.contains("version conflict"), "{conflict}");
    }

    #[test]
    fn a_group_checks_each_batch_against_the_earlier_ones_and_forgets_a_batch_that_failed() {
        use OpOutcome::*;
        let added = Added { seq: 0 };
        let answers = plan_group(vec![
            // Within a batch: a repeat with the same content is unchanged.
            vec![
                put("a", "1", "x"),
                put("b", "1", "y"),
                put("a", "1", "x"),
                put("a", "2", "z"),
            ],
            // Fails on its second put (a@1 with other content): its first put must not count.
            vec![put("c", "1", "w"), put("a", "1", "other")],
            vec![put("c", "1", "w2"), Op::Delete("c".into()), Op::Delete("c".into())],
            // A delete ends the history: a@1 may then come with other content.
            vec![Op::Delete("a".into()), put("a", "1", "other")],
            vec![put("a", "1", "other"), put("b", "1", "y"), put("a", "2", "z")],
            vec![Op::Delete("b".into()), Op::Delete("b".into()), put("b", "1", "new")],
            vec![put("b", "1", "y")],
            vec![pin("p"), Op::Unpin("p".into()), Op::Unpin("p".into()), pin("p")],
            vec![pin("p")],
            vec![Op::Unpin("p".into()), pin("q")],
            vec![pin("q")],
        ]);
        let expected: Vec<std::result::Result<Vec<OpOutcome>, &str>> = vec![
            Ok(vec![added.clone(), added.clone(), Unchanged, added.clone()]),
            Err("version conflict"),
            Ok(vec![added.clone(), Deleted(true), Deleted(false)]),
            Ok(vec![Deleted(true), added.clone()]),
            Ok(vec![Unchanged, Unchanged, added.clone()]),
            Ok(vec![Deleted(true), Deleted(false), added.clone()]),
            Err("version conflict"),
            Ok(vec![Pinned, Unpinned(true), Unpinned(false), Pinned]),
            Err("already pinned"),
            Ok(vec![Unpinned(true), Pinned]),
            Err("already pinned"),
        ];
        assert_eq!(answers.len(), expected.len());
        for (at, (answer, want)) in answers.iter().zip(&expected).enumerate() {
            match (answer, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "batch {at}"),
                (Err(got), Err(want)) => assert!(
                    got.to_lowercase().contains(want),
                    "batch {at}: {got:?} does not say {want:?}"
                ),
                (got, want) => panic!("batch {at}: {got:?}, expected {want:?}"),
            }
        }
    }

    /// The only batch of a group builds no overlay when its puts are of distinct ids; it must answer
    /// and encode exactly as when it builds one, and a repeated id must still be checked.
    #[test]
    fn a_group_of_one_batch_answers_as_a_batch_among_others() {
        use OpOutcome::*;
        let added = Added { seq: 0 };
        let registry = TypeRegistry::default();
        let none = Overlay::default();
        let index = crate::index::Index::default();
        let distinct: Vec<Op> = (0..300).map(|n| put(&format!("id-{n}"), "1", "x")).collect();
        assert!(distinct_put_ids(&distinct));
        let (solo, solo_overlay, solo_frame) = plan(&index, &registry, &none, &distinct, true, None).expect("solo");
        let (tracked, tracked_overlay, tracked_frame) =
            plan(&index, &registry, &none, &distinct, false, None).expect("tracked");
        assert_eq!(solo, tracked);
        assert!(solo.iter().all(|o| *o == added));
        assert_eq!(solo_frame.map(|f| f.0), tracked_frame.map(|f| f.0), "the same frame");
        assert!(solo_overlay.ids.is_empty(), "no overlay built");
        assert_eq!(tracked_overlay.ids.len(), 300);

        // A repeated id in a group of one batch: the overlay is built, and checked.
        let repeated = vec![
            put("a", "1", "x"),
            put("b", "1", "y"),
            put("a", "1", "x"),
            put("a", "1", "z"),
        ];
        assert!(!distinct_put_ids(&repeated));
        let conflict = plan(&index, &registry, &none, &repeated, true, None).map(|p| p.0);
        assert!(
            matches!(conflict, Err(Error::VersionConflict { ref id, .. }) if id == "a"),
            "{conflict:?}"
        );
        let same = plan(&index, &registry, &none, &repeated[..3], true, None).map(|p| p.0);
        assert_eq!(same.ok(), Some(vec![added.clone(), added, Unchanged]));
        // Not only puts: the overlay is built.
        assert!(!distinct_put_ids(&[put("a", "1", "x"), Op::Delete("b".into())]));
        assert!(!distinct_put_ids(&[Op::Delete("b".into()), put("a", "1", "x")]));
        // Rising ids are distinct; a repeat, next to its first or after a fall, is found.
        let rising: Vec<Op> = (0..300).map(|n| put(&format!("id-{n:04}"), "1", "x")).collect();
        assert!(distinct_put_ids(&rising));
        for ids in [["a", "b", "b"], ["a", "b", "a"], ["b", "a", "b"], ["c", "c", "d"]] {
            let ops: Vec<Op> = ids.iter().map(|id| put(id, "1", "x")).collect();
            assert!(!distinct_put_ids(&ops), "{ids:?}");
        }
        let falling: Vec<Op> = ["c", "b", "a"].iter().map(|id| put(id, "1", "x")).collect();
        assert!(distinct_put_ids(&falling));
    }

    #[test]
    fn many_ids_in_a_group_are_all_found() {
        // Enough ids for the overlay to grow several times; every other one deleted again.
        let ops: Vec<Op> = (0..3000).map(|n| put(&format!("id-{n}"), "1", "x")).collect();
        let deletes: Vec<Op> = (0..3000).step_by(2).map(|n| Op::Delete(format!("id-{n}"))).collect();
        let again: Vec<Op> = (0..3000).map(|n| put(&format!("id-{n}"), "1", "changed")).collect();
        let answers = plan_group(vec![ops, deletes, again]);
        assert!(answers[0]
            .as_ref()
            .is_ok_and(|o| o.iter().all(|o| *o == OpOutcome::Added { seq: 0 })));
        assert!(answers[1]
            .as_ref()
            .is_ok_and(|o| o.iter().all(|o| *o == OpOutcome::Deleted(true))));
        // id-1, id-3, ... still hold version 1 with the old content: the batch conflicts on id-1.
        let Err(conflict) = &answers[2] else {
            panic!("a put of a kept version with other content passed: {:?}", answers[2]);
        };
        assert!(conflict.contains("id-1"), "{conflict}");
    }
}
