//! [`Store`], [`Options`] and [`SessionView`]: the public handle over the log, the index and the
//! writer thread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::checkpoint;
use crate::clock::{Clock, SystemClock};
use crate::compaction::{self, CompactionReport};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::item::{content_hash, validate_name, ContextItem, Scope, TypeRegistry, TypeSpec};
use crate::limits::{
    ADD_THREADS_DEFAULT_MAX, ADD_THREADS_MAX, BATCH_ITEMS_MAX, CHECKPOINT_EVERY_BYTES_DEFAULT,
    CHECKPOINT_EVERY_BYTES_MAX, CHECKPOINT_EVERY_BYTES_MIN, CONTENT_BYTES_DEFAULT, CONTENT_BYTES_MAX,
    PARALLEL_ADD_ITEMS_MIN, READ_THREADS_DEFAULT_MAX, READ_THREADS_MAX, SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MAX,
    SEGMENT_BYTES_MIN,
};
use crate::log::put::{validate_item, ValidItem};
use crate::log::record::{decode_batch, RecordView};
use crate::log::segment::{read_whole, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::log::writer::{poll_then_recv, Answer, Command, Op, OpOutcome, SyncHelpers, Writer};
use crate::query::{scope_writable, ContextQuery, QueryStats};
use crate::recovery::{next_base_seq, recover, scan_frames, RecoveryStats, ScanEnd};
use crate::snapshot::{RawItem, RawResolution, Receipt, Resolution, Snapshot, SnapshotInfo};
use crate::storage::{DirLock, FileStorage, Storage};

/// When `add` may return relative to the fsync of its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `add` returns only after its batch is fsynced. Concurrent writers share one fsync (group
    /// commit). The default.
    Immediate,
    /// Batches are visible once written; the writer fsyncs at most every `Duration`, so a power loss
    /// may lose the batches of the last period.
    Periodic(Duration),
    /// Batches are visible once written; syncing is left to the operating system (and to
    /// [`Store::flush`], segment sealing and close).
    Never,
}

/// Settings for opening a store. Every setter states its default.
#[derive(Clone)]
pub struct Options {
    durability: Durability,
    clock: Arc<dyn Clock>,
    segment_size: u64,
    max_content_bytes: usize,
    auto_compact: bool,
    compress_content: bool,
    storage: Arc<dyn Storage>,
    add_threads: usize,
    read_threads: usize,
    checkpoint_every: u64,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("durability", &self.durability)
            .field("clock_now", &self.clock.now())
            .field("segment_size", &self.segment_size)
            .field("max_content_bytes", &self.max_content_bytes)
            .field("auto_compact", &self.auto_compact)
            .field("compress_content", &self.compress_content)
            .field("storage", &self.storage)
            .field("add_threads", &self.add_threads)
            .field("read_threads", &self.read_threads)
            .field("checkpoint_every", &self.checkpoint_every)
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Immediate,
            clock: Arc::new(SystemClock),
            segment_size: SEGMENT_BYTES_DEFAULT,
            max_content_bytes: CONTENT_BYTES_DEFAULT,
            auto_compact: true,
            compress_content: false,
            storage: Arc::new(FileStorage),
            add_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(ADD_THREADS_DEFAULT_MAX)),
            read_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(READ_THREADS_DEFAULT_MAX)),
            checkpoint_every: CHECKPOINT_EVERY_BYTES_DEFAULT,
        }
    }
}

impl Options {
    /// The defaults: `Durability::Immediate`, `SystemClock`, 64 MiB segments, 1 MiB content, auto
    /// compaction on, content stored uncompressed.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// When `add` returns relative to the fsync of its batch. Default: [`Durability::Immediate`].
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The clock that judges expiry and stamps snapshots. Default: [`SystemClock`].
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The size in bytes at which a segment is sealed and the next one started. Default: 64 MiB;
    /// accepted: 4 KiB to 2 GiB. A batch larger than this gets a segment of its own.
    #[must_use]
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
    }

    /// The largest canonical content of one item, in bytes. Default: 1 MiB; at most 64 MiB.
    #[must_use]
    pub fn max_content_bytes(mut self, bytes: usize) -> Self {
        self.max_content_bytes = bytes;
        self
    }

    /// Whether a background compactor rewrites, on its own, sealed segments of which at least half
    /// is reclaimable. Default: true.
    #[must_use]
    pub fn auto_compact(mut self, on: bool) -> Self {
        self.auto_compact = on;
        self
    }

    /// Whether an added item's content is stored LZ4-compressed (when it is at least 128 bytes long
    /// and the compressed form is at least an eighth smaller) or as its canonical JSON. Default:
    /// false.
    ///
    /// Compression costs the adding thread about 1.4 ns per content byte (~0.65 us for a 500-byte
    /// JSON object) and every read of the item a decompression (~0.1 us for the same object); it
    /// saves about two fifths of the bytes of typical JSON text on disk and in the page cache. Off,
    /// a durable bulk load of such items runs ~1.4x as fast and reads ~5-15% faster (see
    /// docs/BENCHMARKS.md). A store may hold both forms: the setting applies to items added while
    /// it is open, records already stored keep theirs, and every read handles either.
    #[must_use]
    pub fn compress_content(mut self, on: bool) -> Self {
        self.compress_content = on;
        self
    }

    /// Where the store's files live: every file and directory operation goes through it. Default:
    /// [`FileStorage`](crate::storage::FileStorage), the operating system's file system. Tests pass a
    /// [`SimDisk`](crate::storage::SimDisk) to simulate power loss and I/O errors. Only with the
    /// `sim-disk` feature.
    #[cfg(feature = "sim-disk")]
    #[must_use]
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// How many threads [`Store::add`] may use to validate, hash and encode one batch: the calling
    /// thread and up to `threads - 1` of the store's worker threads, each taking a contiguous run
    /// of at least [`PARALLEL_ADD_ITEMS_MIN`](crate::limits::PARALLEL_ADD_ITEMS_MIN) items (so a
    /// batch uses a second thread from twice that many on). 1 keeps every batch on the calling
    /// thread. Default: the machine's available parallelism, at most 4; accepted: 1 to 64.
    ///
    /// The worker threads (`ctxlog-work-N`, as many as the larger of this and
    /// [`Options::read_threads`], less one) are started by the first call that splits its work
    /// and kept until the store is closed and its last snapshot dropped. A call borrows only idle
    /// ones: calls made at once share them, and one that finds none idle does all its work on its
    /// own thread rather than wait.
    #[must_use]
    pub fn add_threads(mut self, threads: usize) -> Self {
        self.add_threads = threads;
        self
    }

    /// How many threads a query ([`Store::get`], [`Store::get_raw`]) may use to find and check its
    /// items' records (under the index lock) and to read its items (after it: each record's content
    /// checked against its SHA-256, then parsed or written out as JSON); a resolve of many
    /// references splits the reading. The calling thread and up to `threads - 1` of the store's
    /// worker threads (see [`Options::add_threads`]) each take a contiguous run of at least
    /// [`PARALLEL_READ_ITEMS_MIN`](crate::limits::PARALLEL_READ_ITEMS_MIN) items (so a read uses a
    /// second thread from twice that many on). The answer is the same either way. 1 keeps every read on the calling
    /// thread, for a server that answers many small requests at once and wants one core each.
    /// Default: the machine's available parallelism, at most 4; accepted: 1 to 64.
    #[must_use]
    pub fn read_threads(mut self, threads: usize) -> Self {
        self.read_threads = threads;
        self
    }

    /// Bytes of log appended after which the background thread writes a new checkpoint of the
    /// index, so that an open after a crash replays at most about this much log. It also waits until
    /// the log has grown by twice the last checkpoint's size, and, while the store is in use, for a
    /// lull in its use (see [`Store`], "Checkpoints"). Default: 64 MiB; accepted:
    /// 64 KiB to 1 TiB.
    #[must_use]
    pub fn checkpoint_every(mut self, bytes: u64) -> Self {
        self.checkpoint_every = bytes;
        self
    }

    /// Opens (creating if needed) the store in directory `path`.
    ///
    /// # Errors
    /// `Invalid` for a setting out of range; `Locked` if another handle holds the store; `Corrupt` if
    /// acknowledged data is damaged; `Io` if the directory cannot be used.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(path.as_ref(), self)
    }
}

/// What one item of an `add` did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddOutcome {
    /// A new version was stored and is now the id's latest.
    Added {
        /// The item's id.
        id: String,
        /// The version stored.
        version: String,
        /// The sequence number of the batch that stored it.
        seq: u64,
    },
    /// This (id, version) was already stored with the same content hash: nothing was written.
    Unchanged {
        /// The item's id.
        id: String,
        /// The version.
        version: String,
    },
}

/// Figures about a store, from [`Store::stats`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Ids whose latest version is neither deleted nor superseded (expired ones included until
    /// compaction reclaims them).
    pub items: u64,
    /// Stored versions in the index, of every id.
    pub versions: u64,
    /// Segment files.
    pub segments: u64,
    /// Bytes of every file in the store directory. While the store is open this includes the space
    /// allocated ahead of the active segment's appends (up to 4 MiB, zeros), which closing gives back.
    pub bytes_on_disk: u64,
    /// Estimated bytes of memory the index uses.
    pub index_bytes: u64,
    /// `index_bytes` per stored version.
    pub index_bytes_per_item: f64,
    /// The last published sequence number.
    pub seq: u64,
    /// Queries run by this handle.
    pub queries: u64,
    /// Index entries those queries examined.
    pub entries_examined: u64,
    /// What opening the store found and did.
    pub recovery: RecoveryStats,
}

/// One problem found by [`Store::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file at fault.
    pub file: PathBuf,
    /// The byte offset in it.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

/// What [`Store::verify`] checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Records whose CRC (and, for items, content hash) was checked.
    pub records_checked: u64,
    /// Frames whose CRC was checked.
    pub frames_checked: u64,
    /// Segment files read.
    pub segments_checked: u64,
    /// Checkpoint files decoded.
    pub checkpoints_checked: u64,
    /// Pinned snapshots whose every visible version was read back.
    pub pins_checked: u64,
    /// Everything that is wrong; empty when the store is sound.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// Whether no problem was found.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// One handle at `seq` less in the registry of live snapshot handles.
fn release(live: &mut BTreeMap<u64, usize>, seq: u64) {
    if let Some(count) = live.get_mut(&seq) {
        *count -= 1;
        if *count == 0 {
            live.remove(&seq);
        }
    }
}

/// State shared by the handle, the writer thread and every snapshot.
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    pub(crate) storage: Arc<dyn Storage>,
    index: RwLock<Index>,
    registry: RwLock<Arc<TypeRegistry>>,
    pub(crate) clock: Arc<dyn Clock>,
    queries: AtomicU64,
    examined: AtomicU64,
    /// The writer thread's queue; taken (closed) when the store handle closes.
    commands: Mutex<Option<Sender<Command>>>,
    /// Sequence numbers of live snapshot handles, with how many handles hold each.
    live_snapshots: Mutex<BTreeMap<u64, usize>>,
    /// Releases of handles dropped while `live_snapshots` was locked (a compaction holds it across
    /// its rename and directory fsync): a drop never waits for I/O. Applied by the next holder of
    /// `live_snapshots` before it reads the registry; until then the handle counts as live, which
    /// only keeps more.
    released_snapshots: Mutex<Vec<u64>>,
    /// Held while a compaction or a checkpoint runs: one at a time.
    pub(crate) compaction: Mutex<()>,
    /// Log bytes when the last checkpoint was written.
    checkpointed_log_bytes: AtomicU64,
    /// Set when a compaction rewrote segments after the last checkpoint: that checkpoint no longer
    /// matches the segment files (opening would replay the whole log), so the maintenance thread
    /// writes a new one in the next lull in the store's use, however little log has grown.
    checkpoint_stale: AtomicBool,
    /// Size of the newest checkpoint written by this process, in bytes.
    pub(crate) last_checkpoint_bytes: AtomicU64,
    /// Threads inside an `add` or a `delete` (validating a small batch, queued, or waiting for their
    /// answer): the writer thread waits a moment for those not yet in its group, so that one fsync
    /// serves them.
    pub(crate) writers: AtomicUsize,
    /// Set by every read and query, cleared by the maintenance thread while it looks for a lull
    /// (see [`Store`], "Checkpoints").
    read_since_look: AtomicBool,
    /// What a large `add` left of its items once answered (see [`Garbage`]) when the free thread
    /// was still busy: freed by the next `add` while it waits for its own answer, instead of on
    /// the way to the caller's return. At most one batch of [`LEFTOVER_ITEMS_MAX`] items.
    leftovers: Mutex<Option<Garbage>>,
    /// `Options::read_threads`.
    pub(crate) read_threads: usize,
    /// Threads kept for the validation of large adds and the reading of large reads, beside the
    /// calling thread: as many as the larger of `Options::add_threads` and
    /// `Options::read_threads`, less one. Started by the first call that uses them, joined when
    /// this state goes (the store closed and its last snapshot dropped).
    pub(crate) workers: crate::parallel::Workers,
}

/// What is left of a large add's items once it is answered: its operations, with their content
/// trees (whose canonical bytes are in the records), records, and type, source, scope and hash
/// strings. Freeing them takes ~0.6 ms per 1,000 W1 items: done by the
/// store's free thread (see [`StoreInner::freer`]) after the answer, they stay off the add's way
/// and off the cores of its fsync and index insert.
// Its fields are held only to be dropped (read by the tests alone).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Garbage {
    ops: Vec<Op>,
}

/// The most items whose leftovers an `add` hands to the free thread or keeps for the next add to
/// free (about 1 KiB each for W1-like items); a larger batch frees its own.
const LEFTOVER_ITEMS_MAX: usize = 4096;

/// How long the free thread waits before it frees a batch's leftovers: the caller's own frees come
/// right after the answer (the outcomes' ids and versions, ~2,000 strings per 1,000 items), and
/// while the free thread frees the same allocator arena's memory the two take turns at its lock.
/// Dropping a W1 answer of 1,000 outcomes took 178-228 us beside the free thread against 53-86 us
/// with this wait, and bulk loads were 3-9% faster in four paired runs (docs/BENCHMARKS.md).
const FREE_GRACE: Duration = Duration::from_micros(300);

/// Whether an `add` of `items` leaves what is left of them to be freed later: a batch large
/// enough to be validated on several threads, and not so large that keeping it holds much memory.
/// A small batch frees its few on the spot (its contents while it waits).
fn leaves_leftovers(items: usize) -> bool {
    (PARALLEL_ADD_ITEMS_MIN..=LEFTOVER_ITEMS_MAX).contains(&items)
}

/// Batches of at most this many items count as writing (see [`Shared::writers`]) while they are
/// validated; larger ones only once they are sent.
const QUICK_ADD_ITEMS: usize = 16;

/// Counts a thread in [`Shared::writers`] while it lives.
struct Writing<'a>(&'a AtomicUsize);

impl<'a> Writing<'a> {
    fn enter(writers: &'a AtomicUsize) -> Self {
        writers.fetch_add(1, Ordering::AcqRel);
        Writing(writers)
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a writer polls for the writer thread's answer before it sleeps: longer than a fast
/// disk's fdatasync, so that a durable add is not also charged a scheduler wake-up.
const POLL_FOR_ANSWER: Duration = Duration::from_micros(250);
/// Slow yields after which a writer stops polling and sleeps (other work wants the core).
const SLOW_YIELDS: u32 = 3;

/// The writer thread's answer (see [`poll_then_recv`]).
fn wait_for<T>(answer: &crossbeam_channel::Receiver<Result<T>>) -> Result<T> {
    poll_then_recv(answer, POLL_FOR_ANSWER, SLOW_YIELDS).map_err(|_| Error::Closed)?
}

impl Shared {
    /// The index for reading. A panic while the lock was held cannot leave it half-updated (updates
    /// are whole batches applied by one thread), so a poisoned lock is entered anyway.
    pub(crate) fn read_index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`Shared::read_index`] for a caller's read or query: also marks the store as in use, for the
    /// maintenance thread's lull detection. The mark is a load, and a store only in the first read
    /// after the maintenance thread cleared it, so that readers on many cores keep the flag's cache
    /// line shared rather than pass it around.
    pub(crate) fn read_index_for_caller(&self) -> RwLockReadGuard<'_, Index> {
        if !self.read_since_look.load(Ordering::Relaxed) {
            self.read_since_look.store(true, Ordering::Relaxed);
        }
        self.read_index()
    }

    pub(crate) fn write_index(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn registry(&self) -> Arc<TypeRegistry> {
        Arc::clone(&self.registry.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    pub(crate) fn set_registry(&self, registry: TypeRegistry) {
        *self.registry.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(registry);
    }

    /// Hands a batch of operations to the writer thread and waits for its outcome.
    pub(crate) fn submit(&self, ops: Vec<Op>) -> Result<Vec<OpOutcome>> {
        self.submit_then(ops, None, || ()).map(|answer| answer.outcomes)
    }

    /// [`Shared::submit`], with the operations handed back, running `meanwhile` on this thread once
    /// they are sent, before waiting for their answer: work that would otherwise wait for the write
    /// and its fsync. `session`: the session view the puts come from, if any; the writer refuses a
    /// put of an id whose latest version the session may not write.
    pub(crate) fn submit_then(
        &self,
        ops: Vec<Op>,
        session: Option<Arc<str>>,
        meanwhile: impl FnOnce(),
    ) -> Result<Answer> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        // A large batch takes milliseconds to write and sync: its writer sleeps until the answer
        // rather than poll, leaving the cores to the writer thread and the fsync.
        let quick = ops.len() <= QUICK_ADD_ITEMS;
        self.send(Command::Write { ops, session, reply })?;
        meanwhile();
        if quick {
            wait_for(&answer)
        } else {
            answer.recv().map_err(|_| Error::Closed)?
        }
    }

    /// Puts `rest` in place of the kept leftovers (see [`Shared::leftovers`]) and returns those, for
    /// the caller to free outside the lock: an `add` takes them (`rest` empty) to free while it
    /// waits, and leaves its own there when the free thread is busy.
    fn swap_leftovers(&self, rest: Option<Garbage>) -> Option<Garbage> {
        std::mem::replace(
            &mut *self.leftovers.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
            rest,
        )
    }

    pub(crate) fn send(&self, command: Command) -> Result<()> {
        let commands = self.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sender = commands.as_ref().ok_or(Error::Closed)?;
        sender.send(command).map_err(|_| Error::Closed)
    }

    /// Makes every published batch durable.
    pub(crate) fn flush(&self) -> Result<()> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.send(Command::Flush { reply })?;
        wait_for(&answer)
    }

    /// The registry of live snapshot handles (sequence number -> how many handles hold it). Lock
    /// order: this before the index lock, never the other way.
    /// Releases queued by drops that found it locked are applied first.
    pub(crate) fn live_snapshots(&self) -> MutexGuard<'_, BTreeMap<u64, usize>> {
        let mut live = self
            .live_snapshots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let released = std::mem::take(
            &mut *self
                .released_snapshots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for seq in released {
            release(&mut live, seq);
        }
        live
    }

    /// A snapshot handle at `seq` (its last clone) is gone. If the registry is locked, the release
    /// is queued for its next holder rather than waited for.
    pub(crate) fn unregister_snapshot(&self, seq: u64) {
        match self.live_snapshots.try_lock() {
            Ok(mut live) => release(&mut live, seq),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => release(&mut poisoned.into_inner(), seq),
            Err(std::sync::TryLockError::WouldBlock) => self
                .released_snapshots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(seq),
        }
    }

    /// Bytes of log (every segment's published length).
    pub(crate) fn log_bytes(&self) -> u64 {
        self.read_index()
            .segments
            .values()
            .map(|segment| segment.published_len())
            .sum()
    }

    pub(crate) fn checkpointed_log_bytes(&self) -> u64 {
        self.checkpointed_log_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn note_checkpoint(&self) {
        self.checkpointed_log_bytes.store(self.log_bytes(), Ordering::Relaxed);
        self.checkpoint_stale.store(false, Ordering::Relaxed);
    }

    /// Whether a compaction has rewritten segments since the last checkpoint.
    pub(crate) fn checkpoint_stale(&self) -> bool {
        self.checkpoint_stale.load(Ordering::Relaxed)
    }

    pub(crate) fn count_query(&self, examined: u64) {
        self.queries.fetch_add(1, Ordering::Relaxed);
        self.examined.fetch_add(examined, Ordering::Relaxed);
    }
}

struct StoreInner {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<bool>>>,
    /// The maintenance thread (compaction, checkpoints): dropping the sender stops it.
    maintenance: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
    /// The free thread, started by the first add that leaves leftovers: it frees what those adds
    /// leave once answered (see [`Garbage`]), one batch at a time, with one more queued at most.
    /// Dropping the sender stops it.
    freer: std::sync::OnceLock<Option<(Sender<Garbage>, JoinHandle<()>)>>,
    options: Options,
    recovery: RecoveryStats,
    _lock: Box<dyn DirLock>,
}

impl Drop for StoreInner {
    fn drop(&mut self) {
        if let Some(Some((sender, handle))) = self.freer.take() {
            drop(sender);
            if handle.join().is_err() {
                tracing::error!("the free thread panicked");
            }
        }
        // Closing the channel lets the writer finish what is queued, sync and exit.
        if let Some((stop, handle)) = self
            .maintenance
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            drop(stop);
            if handle.join().is_err() {
                tracing::error!("the maintenance thread panicked");
            }
        }
        drop(
            self.shared
                .commands
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        if let Some(handle) = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            match handle.join() {
                // The log is whole and synced: a checkpoint spares the next open a full replay.
                Ok(true) => {
                    if let Err(e) = checkpoint::write_streamed(&self.shared) {
                        tracing::warn!("writing the checkpoint at close failed: {e}");
                    }
                }
                Ok(false) => {}
                Err(_) => tracing::error!("the writer thread panicked"),
            }
        }
    }
}

/// An open store: a cheap, cloneable handle that many threads may use at once.
///
/// # Checkpoints
/// A background thread writes a checkpoint of the index once [`Options::checkpoint_every`] bytes of
/// log (64 MiB by default) were appended since the last one, so that an open after a crash loads it
/// and replays only the log after it. Writing one takes the index's read lock while it is encoded and
/// tens of milliseconds of CPU and disk for a store of hundreds of thousands of items: concurrent
/// durable adds feel it as latency (they wait for the lock to publish), and reads and queries as
/// a share of the CPU and the caches. So, while the store is in use, the thread waits for a lull:
/// 50 ms without a commit, a read or a query, and no `add` or `delete` in progress. It waits at
/// most 10 s, or until the log has grown by twice `checkpoint_every`, and then writes the
/// checkpoint anyway.
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.shared.dir)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) the store in directory `path` with the default [`Options`].
    ///
    /// # Errors
    /// As [`Options::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Options::new().open(path)
    }

    /// The state the store's threads share (for the fuzzing module's checks).
    #[cfg(feature = "testing")]
    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    fn open_with(dir: &Path, options: Options) -> Result<Store> {
        within(
            "segment_size",
            options.segment_size,
            SEGMENT_BYTES_MIN,
            SEGMENT_BYTES_MAX,
            " bytes",
        )?;
        within("max_content_bytes", options.max_content_bytes, 1, CONTENT_BYTES_MAX, "")?;
        within(
            "checkpoint_every",
            options.checkpoint_every,
            CHECKPOINT_EVERY_BYTES_MIN,
            CHECKPOINT_EVERY_BYTES_MAX,
            " bytes",
        )?;
        within("add_threads", options.add_threads, 1, ADD_THREADS_MAX, "")?;
        within("read_threads", options.read_threads, 1, READ_THREADS_MAX, "")?;
        if let Durability::Periodic(period) = options.durability {
            if period.is_zero() {
                return Err(Error::invalid("durability", "a Periodic duration must be above zero"));
            }
        }
        let storage = Arc::clone(&options.storage);
        storage
            .create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let lock = storage
            .try_lock(dir)
            .map_err(|e| Error::io(format!("locking {}", dir.join("LOCK").display()), e))?
            .ok_or_else(|| Error::Locked {
                path: dir.to_path_buf(),
            })?;
        let recovered = recover(&*storage, dir)?;
        let registry = Arc::new(recovered.index.registry.clone());
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            storage,
            index: RwLock::new(recovered.index),
            registry: RwLock::new(registry),
            clock: Arc::clone(&options.clock),
            queries: AtomicU64::new(0),
            examined: AtomicU64::new(0),
            commands: Mutex::new(None),
            live_snapshots: Mutex::new(BTreeMap::new()),
            released_snapshots: Mutex::new(Vec::new()),
            compaction: Mutex::new(()),
            checkpointed_log_bytes: AtomicU64::new(0),
            checkpoint_stale: AtomicBool::new(false),
            last_checkpoint_bytes: AtomicU64::new(0),
            writers: AtomicUsize::new(0),
            read_since_look: AtomicBool::new(false),
            leftovers: Mutex::new(None),
            read_threads: options.read_threads,
            workers: crate::parallel::Workers::new(options.add_threads.max(options.read_threads) - 1),
        });
        shared.note_checkpoint();
        let (sender, receiver) = crossbeam_channel::unbounded();
        let synced_len = recovered.active.len;
        let writer = Writer {
            shared: Arc::clone(&shared),
            dir: dir.to_path_buf(),
            active: recovered.active,
            next_seq: recovered.next_seq,
            durability: options.durability,
            segment_size: options.segment_size,
            poisoned: None,
            dirty: false,
            last_sync: Instant::now(),
            buffer: Vec::new(),
            // Recovery synced what it replayed of the newest segment.
            synced_len,
            last_group_writes: 0,
            helpers: SyncHelpers::default(),
        };
        let handle = std::thread::Builder::new()
            .name("ctxlog-writer".into())
            .spawn(move || writer.run(&receiver))
            .map_err(|e| Error::io("starting the writer thread", e))?;
        *shared
            .commands
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sender);
        let maintenance = Some(start_maintenance(
            Arc::clone(&shared),
            options.auto_compact,
            options.checkpoint_every,
        )?);
        Ok(Store {
            inner: Arc::new(StoreInner {
                shared,
                writer: Mutex::new(Some(handle)),
                maintenance: Mutex::new(maintenance),
                freer: std::sync::OnceLock::new(),
                options,
                recovery: recovered.stats,
                _lock: lock,
            }),
        })
    }

    /// The directory of the store.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.shared.dir
    }

    fn submit(&self, ops: Vec<Op>) -> Result<Vec<OpOutcome>> {
        self.inner.shared.submit(ops)
    }

    /// Adds `items` as one atomic batch: every item is validated first, and if any is refused nothing
    /// is written. Returns what happened to each item, in order.
    ///
    /// # Errors
    /// `Invalid`, `UnknownType`, `HashMismatch`, `TooLarge`, `VersionConflict` with the position of the
    /// refused item as `index`; `TooLarge` for a batch over the limits; `Poisoned` after an earlier
    /// write failure; `Io` if the write or fsync fails.
    pub fn add<I: IntoIterator<Item = ContextItem>>(&self, items: I) -> Result<Vec<AddOutcome>> {
        self.add_checked(items, None)
    }

    fn add_checked<I: IntoIterator<Item = ContextItem>>(
        &self,
        items: I,
        session: Option<&Arc<str>>,
    ) -> Result<Vec<AddOutcome>> {
        let registry = self.inner.shared.registry();
        let max_content = self.inner.options.max_content_bytes;
        let compress = self.inner.options.compress_content;
        // Collected in place when the items come as a Vec (a move of ~200 KiB per 1,000 items
        // saved); the run that checks an item takes it out of its slot.
        let mut batch: Vec<ContextItem> = items.into_iter().take(BATCH_ITEMS_MAX + 1).collect();
        if batch.len() > BATCH_ITEMS_MAX {
            return Err(Error::TooLarge {
                what: "batch (items)".into(),
                len: BATCH_ITEMS_MAX as u64 + 1,
                max: BATCH_ITEMS_MAX as u64,
                index: None,
            });
        }
        // A small batch counts as writing from now: it is validated in microseconds, and the writer
        // thread may wait for it. A large one only once it is validated and sent, so that nobody
        // waits for its validation.
        let mut writing = (batch.len() <= QUICK_ADD_ITEMS).then(|| Writing::enter(&self.inner.shared.writers));
        let check = |position: usize, item: ContextItem| -> Result<ValidItem> {
            if let Some(session) = session {
                check_session_scope(&item.scope, session).map_err(|e| e.at(position))?;
            }
            validate_item(item, &registry, max_content, compress).map_err(|e| e.at(position))
        };
        let ops = validate_batch(&mut batch, self.inner.options.add_threads, &self.inner.shared, &check)?;
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        // The contents are in the records now, and the writer thread never reads the trees. A
        // small batch takes them out to free them here while it is written and synced; a large
        // one leaves them in its items, which go whole to the free thread once answered (no pass
        // over the batch to take them out, no array of them).
        let leave = leaves_leftovers(ops.len());
        let mut ops = ops;
        let free_now: Vec<serde_json::Value> = if leave {
            Vec::new()
        } else {
            ops.iter_mut()
                .filter_map(|op| match op {
                    Op::Put(valid) => Some(std::mem::take(&mut valid.item.content)),
                    _ => None,
                })
                .collect()
        };
        writing.get_or_insert_with(|| Writing::enter(&self.inner.shared.writers));
        let shared = &self.inner.shared;
        let Answer { outcomes, mut ops } = shared.submit_then(ops, session.cloned(), move || {
            drop(free_now);
            drop(shared.swap_leftovers(None));
        })?;
        // The ids and versions are taken out for the answer; the rest of the operations stay in
        // place (no second array of ~300 KiB per 1,000 items).
        let mut answered = Vec::with_capacity(ops.len());
        for (op, outcome) in ops.iter_mut().zip(outcomes) {
            let Op::Put(valid) = op else { continue };
            let id = std::mem::take(&mut valid.item.id);
            let version = std::mem::take(&mut valid.item.version);
            answered.push(match outcome {
                OpOutcome::Added { seq } => AddOutcome::Added { id, version, seq },
                _ => AddOutcome::Unchanged { id, version },
            });
        }
        if leave {
            self.leave(Garbage { ops });
        }
        Ok(answered)
    }

    /// Hands what an answered add left to the free thread (started here the first time), or, when
    /// it is busy or cannot start, keeps it for the next add to free while it waits. Another
    /// thread's leftovers found there are freed here.
    fn leave(&self, garbage: Garbage) {
        let freer = self.inner.freer.get_or_init(|| {
            let (sender, receiver) = crossbeam_channel::bounded::<Garbage>(1);
            let spawned = std::thread::Builder::new().name("ctxlog-drop".into()).spawn(move || {
                for garbage in receiver {
                    std::thread::sleep(FREE_GRACE);
                    drop(garbage);
                }
            });
            match spawned {
                Ok(handle) => Some((sender, handle)),
                Err(e) => {
                    tracing::debug!("starting the free thread failed: {e}");
                    None
                }
            }
        });
        let garbage = match freer {
            Some((sender, _)) => match sender.try_send(garbage) {
                Ok(()) => return,
                Err(e) => e.into_inner(),
            },
            None => garbage,
        };
        drop(self.inner.shared.swap_leftovers(Some(garbage)));
    }

    /// Writes a checkpoint now, as the maintenance thread does (for `ctxlog::bench`).
    #[cfg(feature = "testing")]
    pub(crate) fn checkpoint_now(&self) -> Result<u64> {
        let shared = &self.inner.shared;
        let _one_at_a_time = shared
            .compaction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seq = checkpoint::write(shared, true)?;
        shared.note_checkpoint();
        Ok(seq)
    }

    /// Tombstones `id`: its versions disappear from every later read, and a later add of the id
    /// starts a fresh history. Returns true if any version of it was added since its last delete.
    ///
    /// # Errors
    /// `Invalid` for a malformed id; `Poisoned` or `Io` as for [`Store::add`].
    pub fn delete(&self, id: &str) -> Result<bool> {
        let _writing = Writing::enter(&self.inner.shared.writers);
        validate_name("id", id)?;
        match self.submit(vec![Op::Delete(id.to_owned())])?.first() {
            Some(OpOutcome::Deleted(existed)) => Ok(*existed),
            _ => Ok(false),
        }
    }

    /// Registers a type, so that items of it may be added. Registrations are stored in the log. Registering
    /// the same spec again does nothing.
    ///
    /// # Errors
    /// `Invalid` for a malformed name or pattern, a built-in name, or a name already registered with
    /// another pattern; `Poisoned` or `Io` as for [`Store::add`].
    pub fn register_type(&self, spec: TypeSpec) -> Result<()> {
        TypeRegistry::validate_spec(&spec)?;
        self.submit(vec![Op::RegisterType(spec)]).map(|_| ())
    }

    /// Makes every batch written so far durable, whatever the [`Durability`].
    ///
    /// # Errors
    /// `Poisoned` after an earlier failure; `Io` if the fsync fails.
    pub fn flush(&self) -> Result<()> {
        self.inner.shared.flush()
    }

    /// A read view of now: the current sequence number and clock time. While the handle lives,
    /// compaction keeps everything it sees, including an id's latest version once it has expired
    /// (the snapshot answers `Expired` for it, and keeps doing so): drop handles once done with
    /// them, or a store that always holds one keeps its expired items on disk.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        self.view(None, true)
    }

    /// A view of now; `register` makes compaction keep what it sees (for handles given to users).
    fn view(&self, session: Option<Arc<str>>, register: bool) -> Snapshot {
        Snapshot::new(&self.inner.shared, session, register)
    }

    /// Removes expired, superseded and deleted records that no view can still see, and gives the disk
    /// space back: the current state, every live [`Snapshot`] handle and every pinned snapshot keep
    /// answering exactly as before. Seals the active segment first when it holds reclaimable data.
    /// The rewritten segments are durable when it returns; the checkpoint they make stale is
    /// replaced by the maintenance thread in the next lull (or at close), so a crash before that
    /// only makes the next open replay the whole log.
    ///
    /// # Errors
    /// `Io` if a rewrite fails (the old files stay in place); `Corrupt` if a segment is damaged;
    /// `Poisoned` after an earlier write failure.
    pub fn compact(&self) -> Result<CompactionReport> {
        let shared = &self.inner.shared;
        let _one_at_a_time = shared
            .compaction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if compaction::active_reclaimable(shared) > 0 {
            let (reply, answer) = crossbeam_channel::bounded(1);
            shared.send(Command::Rotate { reply })?;
            answer.recv().map_err(|_| Error::Closed)??;
        }
        compact_and_mark(shared, 0.0)
    }

    /// Pins a fresh snapshot of now under `name`: it survives restarts and compactions, and
    /// [`Store::open_snapshot`] gives it back. The pin is a log record, as durable as data.
    ///
    /// # Errors
    /// `Invalid` if the name breaks the id rules or is already pinned; `Poisoned` or `Io` as for
    /// [`Store::add`].
    pub fn pin_snapshot(&self, name: &str) -> Result<SnapshotInfo> {
        self.snapshot().pin(name)
    }

    /// The pinned snapshot `name`, answering exactly as it did when it was pinned.
    ///
    /// # Errors
    /// `SnapshotNotFound` if no snapshot is pinned under that name.
    pub fn open_snapshot(&self, name: &str) -> Result<Snapshot> {
        Snapshot::open_pinned(&self.inner.shared, name)
    }

    /// Ends the pin `name`, so that the next compaction may reclaim what only it kept. Returns false
    /// if no such pin exists.
    ///
    /// # Errors
    /// `Invalid` for a malformed name; `Poisoned` or `Io` as for [`Store::add`].
    pub fn unpin_snapshot(&self, name: &str) -> Result<bool> {
        validate_name("name", name)?;
        match self.submit(vec![Op::Unpin(name.to_owned())])?.first() {
            Some(OpOutcome::Unpinned(existed)) => Ok(*existed),
            _ => Ok(false),
        }
    }

    /// Every pinned snapshot, by name, with the bytes it keeps that the current state no longer needs.
    #[must_use]
    pub fn snapshots(&self) -> Vec<SnapshotInfo> {
        crate::snapshot::pinned(&self.inner.shared)
    }

    /// Resolves again the references of a receipt, through the pinned snapshot it was taken from,
    /// and checks that every answer is the same (id, version, hash).
    ///
    /// # Errors
    /// `SnapshotNotFound` once no pinned snapshot matches the receipt; `ReceiptMismatch` if an
    /// answer differs; as [`Snapshot::resolve`] otherwise.
    pub fn replay(&self, receipt: &Receipt) -> Result<Vec<Resolution>> {
        crate::snapshot::replay(&self.inner.shared, receipt)
    }

    /// The latest version of each live id that matches `query`. See [`Snapshot::get`].
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get(&self, query: &ContextQuery) -> Result<Vec<ContextItem>> {
        self.view(None, false).get(query)
    }

    /// Like [`Store::get`], with how the query ran.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_with_stats(&self, query: &ContextQuery) -> Result<(Vec<ContextItem>, QueryStats)> {
        self.view(None, false).get_with_stats(query)
    }

    /// Resolves references (`id` or `id@version`) as of now. See [`Snapshot::resolve`].
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve<I, R>(&self, refs: I) -> Result<Vec<Resolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.view(None, false).resolve(refs)
    }

    /// The items [`Store::get`] returns, as their JSON, read without parsing their content. See
    /// [`Snapshot::get_raw`].
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_raw(&self, query: &ContextQuery) -> Result<Vec<RawItem>> {
        self.view(None, false).get_raw(query)
    }

    /// Resolves references as [`Store::resolve`] does, returning items as their JSON, read without
    /// parsing their content. See [`Snapshot::resolve_raw`].
    ///
    /// ```
    /// use ctxlog::{ContextItem, RawResolution, Resolution, Scope, Store};
    /// use serde_json::json;
    ///
    /// # fn main() -> ctxlog::Result<()> {
    /// let dir = tempfile::tempdir().expect("temp dir");
    /// let store = Store::open(dir.path())?;
    /// store.add([ContextItem::new(
    ///     "ch3", "document_chunk", json!({"text": "Clause 3: ..."}), "contracts",
    ///     1_715_300_000, "1", Scope::GlobalReadonly,
    /// )])?;
    /// let RawResolution::Found(raw) = &store.resolve_raw(["ch3"])?[0] else { panic!("ch3 is stored") };
    /// let Resolution::Found(item) = &store.resolve(["ch3"])?[0] else { panic!("ch3 is stored") };
    /// // The bytes serde_json writes for the parsed item, ready to send on.
    /// assert_eq!(raw.as_bytes(), serde_json::to_vec(item).expect("JSON"));
    /// assert!(raw.as_str().starts_with(r#"{"id":"ch3","type":"document_chunk","content":{"text":"#));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve_raw<I, R>(&self, refs: I) -> Result<Vec<RawResolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.view(None, false).resolve_raw(refs)
    }

    /// A view restricted to session `session_id`: it reads only that session's scope and the global
    /// ones, and writes only its own scope and `GlobalWritable`. A session id that breaks the id rules
    /// can own nothing: writes to its scope are refused as `Invalid` (field `session_id`), and its reads
    /// see only the global scopes.
    #[must_use]
    pub fn session(&self, session_id: &str) -> SessionView {
        SessionView {
            store: self.clone(),
            session: Arc::from(session_id),
        }
    }

    /// Figures about the store.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let shared = &self.inner.shared;
        let (items, versions, segments, index_bytes, seq) = {
            let index = shared.read_index();
            // A bulk group applied ahead of its fsync is not counted until it is published.
            (
                index.live_ids.saturating_sub(index.unpublished.live_ids),
                (index.slots.len() as u64)
                    .saturating_sub(index.forgotten)
                    .saturating_sub(index.unpublished.versions),
                index.segments.len() as u64,
                index.estimated_bytes(),
                index.seq,
            )
        };
        let bytes_on_disk = shared
            .storage
            .list(&shared.dir)
            .map(|names| {
                names
                    .iter()
                    .filter_map(|name| shared.storage.len(&shared.dir.join(name)).ok())
                    .sum()
            })
            .unwrap_or(0);
        #[allow(clippy::cast_precision_loss)]
        let index_bytes_per_item = if versions == 0 {
            0.0
        } else {
            index_bytes as f64 / versions as f64
        };
        Stats {
            items,
            versions,
            segments,
            bytes_on_disk,
            index_bytes,
            index_bytes_per_item,
            seq,
            queries: shared.queries.load(Ordering::Relaxed),
            entries_examined: shared.examined.load(Ordering::Relaxed),
            recovery: self.inner.recovery.clone(),
        }
    }

    /// Reads every frame and record of every segment and checks CRCs and content hashes.
    ///
    /// # Errors
    /// `Io` if a segment cannot be read. Damage is reported in the [`VerifyReport`], not as an error.
    pub fn verify(&self) -> Result<VerifyReport> {
        let segments: Vec<_> = self.inner.shared.read_index().segments.values().cloned().collect();
        let mut report = VerifyReport::default();
        let mut next_seq: Option<u64> = None;
        let mut previous_rewritten = false;
        let storage = &*self.inner.shared.storage;
        let next_base_seqs: Vec<Option<u64>> = segments
            .iter()
            .skip(1)
            .map(|next| next_base_seq(storage, &next.path))
            .chain([None])
            .collect();
        for (segment, next_base_seq) in segments.into_iter().zip(next_base_seqs) {
            report.segments_checked += 1;
            let mut bytes = read_whole(&*self.inner.shared.storage, &segment.path)?;
            bytes.truncate(usize::try_from(segment.published_len()).unwrap_or(usize::MAX));
            let problem = |offset: usize, reason: String| Problem {
                file: segment.path.clone(),
                offset: offset as u64,
                reason,
            };
            let header = match SegmentHeader::decode(&bytes) {
                Ok(header) => header,
                Err(reason) => {
                    report.problems.push(problem(0, reason));
                    continue;
                }
            };
            let mut seq = next_seq.unwrap_or(header.base_seq);
            // A rewritten segment may have lost its last frames: the next one may start later.
            let continues = header.base_seq == seq || (previous_rewritten && header.base_seq > seq);
            previous_rewritten = header.rewrites > 0;
            if !continues {
                report.problems.push(problem(
                    16,
                    format!("segment starts at seq {}, expected {seq}", header.base_seq),
                ));
            }
            seq = header.base_seq;
            let mut records_checked = 0u64;
            let mut frames_checked = 0u64;
            let mut damaged_records = Vec::new();
            let end = scan_frames(
                &bytes,
                SEGMENT_HEADER_BYTES,
                &mut seq,
                false,
                header.rewrites > 0,
                &mut |seq, offset, payload| {
                    if let Some(base) = next_base_seq.filter(|base| seq >= *base) {
                        return Err(format!(
                            "frame has seq {seq}, but the next segment starts at seq {base}"
                        ));
                    }
                    frames_checked += 1;
                    let records = decode_batch(payload).map_err(|e| e.0)?;
                    for (start, _, record) in records {
                        if matches!(record, RecordView::SyncMark { .. }) {
                            continue;
                        }
                        records_checked += 1;
                        if let RecordView::Put(put) = record {
                            let intact = put.content().is_ok_and(|content| content_hash(&content) == put.hash);
                            if !intact {
                                damaged_records.push((
                                    offset + start,
                                    format!("content of {:?} does not match its hash", put.id),
                                ));
                            }
                        }
                    }
                    Ok(())
                },
            );
            report.records_checked += records_checked;
            report.frames_checked += frames_checked;
            for (offset, reason) in damaged_records {
                report.problems.push(problem(offset, reason));
            }
            if let ScanEnd::Bad { offset, reason, .. } = end {
                report.problems.push(problem(offset, reason));
            }
            next_seq = Some(seq);
        }
        self.verify_checkpoints(&mut report)?;
        self.verify_pins(&mut report);
        Ok(report)
    }

    /// Every checkpoint file must decode whole (magic, version, checksum, consistent contents).
    fn verify_checkpoints(&self, report: &mut VerifyReport) -> Result<()> {
        let storage = &*self.inner.shared.storage;
        for (_, path) in checkpoint::list(storage, &self.inner.shared.dir)? {
            report.checkpoints_checked += 1;
            let bytes = storage
                .read(&path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            if checkpoint::is_older_format(&bytes) {
                continue;
            }
            if let Err(reason) = checkpoint::decode(&bytes) {
                report.problems.push(Problem {
                    file: path,
                    offset: 0,
                    reason,
                });
            }
        }
        Ok(())
    }

    /// Every version a pinned snapshot sees must still read back whole (CRC, identity, SHA-256).
    fn verify_pins(&self, report: &mut VerifyReport) {
        let index = self.inner.shared.read_index();
        for (name, pin) in &index.pins {
            report.pins_checked += 1;
            if pin.seq > index.seq {
                report.problems.push(Problem {
                    file: self.inner.shared.dir.clone(),
                    offset: 0,
                    reason: format!("pin {name:?} is at seq {}, after the log's end {}", pin.seq, index.seq),
                });
            }
            for version in index
                .slots
                .iter()
                .filter(|v| v.is_stored() && index.visible_at(v, pin.seq))
            {
                if let Err(
                    crate::snapshot::ReadFailure::Damaged(Error::Corrupt { file, offset, reason })
                    | crate::snapshot::ReadFailure::Io(Error::Corrupt { file, offset, reason }),
                ) = crate::snapshot::read_item(&index, &version)
                {
                    report.problems.push(Problem {
                        file,
                        offset,
                        reason: format!("pin {name:?} sees {:?}: {reason}", index.id_name(version.id)),
                    });
                }
            }
        }
    }
}

/// How often the maintenance thread looks for work.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(1);
/// While the log is idle, how far the clock must move before expiries are worth a new plan.
const MAINTENANCE_CLOCK_STEP_SECONDS: i64 = 60;
/// The reclaimable share of a sealed segment at which the background compactor rewrites it.
const AUTO_COMPACT_MIN_SHARE: f64 = 0.5;
/// A new checkpoint also waits for this many times the last checkpoint's size of log, so that
/// rewriting checkpoints never costs more than half as many bytes as the log itself.
const CHECKPOINT_EVERY_SIZES: u64 = 2;
/// A due checkpoint waits for a lull this long: no commit, read or query in it, and no `add` or
/// `delete` in progress at its end (see [`Store`], "Checkpoints").
const CHECKPOINT_LULL: Duration = Duration::from_millis(50);
/// ... for this long at the most ...
const CHECKPOINT_DEFER_MAX: Duration = Duration::from_secs(10);
/// ... and only while the log since the last checkpoint is under this many times the amount that
/// makes one due, so that a crash under a steady load replays at most about twice as much log.
const CHECKPOINT_DEFER_GROWTH: u64 = 2;

/// Compacts while holding the compaction lock. A compaction that rewrote segments leaves the last
/// checkpoint stale: the maintenance thread writes the next one in a lull (as it does when the log
/// has grown), and closing the store writes one too. The rewritten segments are durable already;
/// a crash before the new checkpoint only makes the next open replay the whole log.
fn compact_and_mark(shared: &Shared, min_share: f64) -> Result<CompactionReport> {
    let report = compaction::compact(shared, min_share)?;
    if report.segments_rewritten > 0 {
        shared.checkpoint_stale.store(true, Ordering::Relaxed);
    }
    Ok(report)
}

/// What [`wait_for_lull`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lull {
    /// A lull: write the checkpoint now.
    Quiet,
    /// No lull, but the checkpoint has waited long enough, or the log has grown too far: write it.
    Overdue,
    /// No lull before the next round of the maintenance thread.
    NotYet,
    /// The store is closing.
    Stopped,
}

/// Waits, until the next maintenance round at the latest, for a lull in the store's use (see
/// [`CHECKPOINT_LULL`]), or until `deadline` or the log since the last checkpoint reaching
/// `growth_max` bytes makes the checkpoint overdue.
fn wait_for_lull(
    shared: &Shared,
    stopped: &crossbeam_channel::Receiver<()>,
    deadline: Instant,
    growth_max: u64,
) -> Lull {
    let round_ends = Instant::now() + MAINTENANCE_INTERVAL;
    loop {
        let overdue = Instant::now() >= deadline
            || shared.log_bytes().saturating_sub(shared.checkpointed_log_bytes()) >= growth_max;
        if overdue {
            return Lull::Overdue;
        }
        let seq_before = shared.read_index().seq;
        shared.read_since_look.store(false, Ordering::Relaxed);
        if !matches!(
            stopped.recv_timeout(CHECKPOINT_LULL),
            Err(crossbeam_channel::RecvTimeoutError::Timeout)
        ) {
            return Lull::Stopped;
        }
        let quiet = shared.read_index().seq == seq_before
            && shared.writers.load(Ordering::Acquire) == 0
            && !shared.read_since_look.load(Ordering::Relaxed);
        if quiet {
            return Lull::Quiet;
        }
        if Instant::now() >= round_ends {
            return Lull::NotYet;
        }
    }
}

/// An option's value, `Invalid` naming `field` unless within `min..=max` (`unit` follows the value
/// in the reason).
fn within<T: PartialOrd + Copy + std::fmt::Display>(field: &str, value: T, min: T, max: T, unit: &str) -> Result<()> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(field, format!("{value}{unit} is outside {min}..={max}")))
    }
}

/// Starts the maintenance thread (background compaction when `auto_compact`, and a checkpoint every
/// `checkpoint_every` bytes of log, or [`CHECKPOINT_EVERY_SIZES`] times the last checkpoint's size,
/// in a lull in the store's use); it stops when the returned sender is dropped.
fn start_maintenance(
    shared: Arc<Shared>,
    auto_compact: bool,
    checkpoint_every: u64,
) -> Result<(Sender<()>, JoinHandle<()>)> {
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    let handle = std::thread::Builder::new()
        .name("ctxlog-maintenance".into())
        .spawn(move || {
            let mut last_seen: Option<(u64, i64)> = None;
            // Since when a checkpoint has been due and waiting for a lull.
            let mut due_since: Option<Instant> = None;
            while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stopped.recv_timeout(MAINTENANCE_INTERVAL) {
                // Nothing to gain while the log has not moved and the clock has not moved much: a
                // plan walks the whole index. A checkpoint still waiting is written.
                let (seq, now) = (shared.read_index().seq, shared.clock.now());
                let idle = last_seen.is_some_and(|(last_seq, last_now)| {
                    last_seq == seq && now.saturating_sub(last_now) < MAINTENANCE_CLOCK_STEP_SECONDS
                });
                if idle && due_since.is_none() && !shared.checkpoint_stale() {
                    continue;
                }
                last_seen = Some((seq, now));
                if auto_compact && !idle {
                    let _one_at_a_time = shared
                        .compaction
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Err(e) = compact_and_mark(&shared, AUTO_COMPACT_MIN_SHARE) {
                        tracing::warn!("background compaction failed: {e}");
                    }
                }
                let every =
                    checkpoint_every.max(CHECKPOINT_EVERY_SIZES * shared.last_checkpoint_bytes.load(Ordering::Relaxed));
                let due = |shared: &Shared| {
                    shared.checkpoint_stale()
                        || shared.log_bytes().saturating_sub(shared.checkpointed_log_bytes()) >= every
                };
                if !due(&shared) {
                    due_since = None;
                    continue;
                }
                let since = *due_since.get_or_insert_with(Instant::now);
                let growth_max = every.saturating_mul(CHECKPOINT_DEFER_GROWTH);
                match wait_for_lull(&shared, &stopped, since + CHECKPOINT_DEFER_MAX, growth_max) {
                    Lull::Stopped => break,
                    Lull::NotYet => continue,
                    Lull::Quiet | Lull::Overdue => {}
                }
                let _one_at_a_time = shared
                    .compaction
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // Another checkpoint (`ctxlog::bench`'s) may have been written in between.
                if !due(&shared) {
                    due_since = None;
                    continue;
                }
                match checkpoint::write(&shared, true) {
                    Ok(_) => {
                        shared.note_checkpoint();
                        due_since = None;
                    }
                    Err(e) => tracing::warn!("writing a checkpoint failed: {e}"),
                }
            }
        })
        .map_err(|e| Error::io("starting the maintenance thread", e))?;
    Ok((stop, handle))
}

/// Runs `check` on every item of `batch` with its position, on up to `threads` threads (the calling
/// one and idle workers of `shared`), each taking a contiguous run. Returns the checked items in order, as the
/// writer's operations (built where each item is checked: no second pass over the batch), or the
/// error of the first refused position: the same answer as checking them one by one.
///
/// When the batch is split, each run also looks up its items' ids in the index once they are checked
/// ([`note_unknown_ids`]): a bulk load's new ids are then not looked up again on the writer thread,
/// whose steps run one after the other.
fn validate_batch<F>(slots: &mut [ContextItem], threads: usize, shared: &Shared, check: &F) -> Result<Vec<Op>>
where
    F: Fn(usize, ContextItem) -> Result<ValidItem> + Sync,
{
    // An item is taken out of its slot (which keeps an empty item, no allocation) by its check.
    let take = |position: usize, slot: &mut ContextItem| {
        check(position, std::mem::replace(slot, ContextItem::vacant())).map(Op::Put)
    };
    if threads.min(slots.len() / PARALLEL_ADD_ITEMS_MIN) <= 1 {
        return slots
            .iter_mut()
            .enumerate()
            .map(|(position, slot)| take(position, slot))
            .collect();
    }
    crate::parallel::map_in_runs(
        slots,
        threads,
        PARALLEL_ADD_ITEMS_MIN,
        &shared.workers,
        &|(): &mut (), position, slot: &mut ContextItem| take(position, slot),
        &|ops: &mut [Op]| note_unknown_ids(shared, ops),
    )
}

/// Ids looked up per lock of the index by [`note_unknown_ids`]: a writer waiting to apply a batch
/// waits for at most this many lookups.
const UNKNOWN_IDS_PER_LOCK: usize = 64;

/// Looks up the ids of `ops`' puts in the index and notes each one it does not know
/// ([`ValidItem::unknown_among`]), taking the index's read lock for a few ids at a time.
fn note_unknown_ids(shared: &Shared, ops: &mut [Op]) {
    for chunk in ops.chunks_mut(UNKNOWN_IDS_PER_LOCK) {
        let index = shared.read_index();
        let known = index.id_count();
        for op in chunk {
            if let Op::Put(valid) = op {
                valid.unknown_among = (!index.knows_id(&valid.item.id)).then_some(known);
            }
        }
    }
}

fn check_session_scope(scope: &Scope, session: &str) -> Result<()> {
    if scope_writable(scope, session) {
        return Ok(());
    }
    match scope {
        Scope::Session(_) | Scope::GlobalWritable => Err(Error::PermissionDenied {
            reason: format!("session {session:?} may not write to another session's scope"),
            index: None,
        }),
        Scope::GlobalReadonly => Err(Error::PermissionDenied {
            reason: format!("session {session:?} may not write to the global_readonly scope"),
            index: None,
        }),
    }
}

/// A store seen from one session: it reads its own session's scope and the global ones, and writes
/// its own scope and `GlobalWritable`. Another session's items resolve as `NotFound`.
#[derive(Clone, Debug)]
pub struct SessionView {
    store: Store,
    session: Arc<str>,
}

impl SessionView {
    /// The session id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.session
    }

    /// Adds items as one batch, as [`Store::add`]; each must be scoped to this session or
    /// `GlobalWritable`, and may be a new version only of an id whose latest version (while its
    /// record is stored) is in one of those scopes too: a session can neither replace a
    /// `GlobalReadonly` item nor another session's. Ids are one namespace for the whole store: such
    /// a refusal tells the session that the id is taken, and nothing else about it.
    ///
    /// # Errors
    /// `PermissionDenied` (with `index`) for another session's scope or `GlobalReadonly`, or for a
    /// version of an id whose latest version is in such a scope (refused before any version is
    /// compared: no `VersionConflict` or `Unchanged` answer tells another session's hash), and for
    /// a version number already stored in a scope this session may not see, or whose record
    /// compaction reclaimed (a retired version keeps no scope), whatever its content; otherwise as
    /// [`Store::add`].
    pub fn add<I: IntoIterator<Item = ContextItem>>(&self, items: I) -> Result<Vec<AddOutcome>> {
        self.store.add_checked(items, Some(&self.session))
    }

    /// As [`Store::get`], restricted to this session and the global scopes.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get(&self, query: &ContextQuery) -> Result<Vec<ContextItem>> {
        self.store.view(Some(Arc::clone(&self.session)), false).get(query)
    }

    /// As [`Store::get_with_stats`], restricted to this session and the global scopes.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_with_stats(&self, query: &ContextQuery) -> Result<(Vec<ContextItem>, QueryStats)> {
        self.store
            .view(Some(Arc::clone(&self.session)), false)
            .get_with_stats(query)
    }

    /// As [`Store::resolve`]; another session's items are `NotFound`.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve<I, R>(&self, refs: I) -> Result<Vec<Resolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.store.view(Some(Arc::clone(&self.session)), false).resolve(refs)
    }

    /// As [`Store::get_raw`], restricted to this session and the global scopes.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_raw(&self, query: &ContextQuery) -> Result<Vec<RawItem>> {
        self.store.view(Some(Arc::clone(&self.session)), false).get_raw(query)
    }

    /// As [`Store::resolve_raw`]; another session's items are `NotFound`.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve_raw<I, R>(&self, refs: I) -> Result<Vec<RawResolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.store
            .view(Some(Arc::clone(&self.session)), false)
            .resolve_raw(refs)
    }

    /// A snapshot of now that keeps this session's visibility.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        self.store.view(Some(Arc::clone(&self.session)), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: usize, n: usize) -> Vec<ContextItem> {
        (first..first + n)
            .map(|k| {
                ContextItem::new(
                    format!("item-{k:06}"),
                    "message",
                    serde_json::json!({"k": k, "text": "words ".repeat(30)}),
                    "src",
                    1_700_000_000 + i64::try_from(k).unwrap(),
                    "1",
                    Scope::GlobalReadonly,
                )
            })
            .collect()
    }

    /// How many of `ops` still hold their content tree.
    fn contents_in(ops: &[Op]) -> usize {
        ops.iter()
            .filter(|op| matches!(op, Op::Put(valid) if !valid.item.content.is_null()))
            .count()
    }

    /// The kept leftovers: how many content trees, and each put's type, source and record length
    /// (and whether its id and version were taken out for the answer).
    fn leftovers(store: &Store) -> (usize, Vec<(String, String, usize, bool)>) {
        let left = store.inner.shared.leftovers.lock().unwrap();
        left.as_ref().map_or((0, Vec::new()), |garbage| {
            let puts = garbage
                .ops
                .iter()
                .filter_map(|op| match op {
                    Op::Put(valid) => Some((
                        valid.item.kind.clone(),
                        valid.item.source.clone(),
                        valid.record.len(),
                        valid.item.id.is_empty() && valid.item.version.is_empty(),
                    )),
                    _ => None,
                })
                .collect();
            (contents_in(&garbage.ops), puts)
        })
    }

    /// Puts a stand-in free thread in place: it takes nothing until `go` is sent, then reports,
    /// for each batch it frees, its content trees and its operations.
    fn stand_in_freer(
        store: &Store,
    ) -> (
        crossbeam_channel::Sender<()>,
        crossbeam_channel::Receiver<(usize, usize)>,
    ) {
        let (sender, receiver) = crossbeam_channel::bounded::<Garbage>(1);
        let (go, wait) = crossbeam_channel::bounded::<()>(1);
        let (report, reports) = crossbeam_channel::unbounded();
        let handle = std::thread::spawn(move || {
            let _ = wait.recv();
            for garbage in receiver {
                let _ = report.send((contents_in(&garbage.ops), garbage.ops.len()));
            }
        });
        assert!(store.inner.freer.set(Some((sender, handle))).is_ok());
        (go, reports)
    }

    #[test]
    fn a_batch_over_the_item_limit_is_refused_after_one_item_too_many_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Options::new().durability(Durability::Never).open(dir.path()).unwrap();
        // An endless iterator: the add takes one item over the limit, no more, and refuses.
        let mut made = 0usize;
        let items = std::iter::from_fn(|| {
            made += 1;
            Some(ContextItem::new(
                format!("i{made}"),
                "message",
                serde_json::json!({}),
                "src",
                1_700_000_000,
                "1",
                Scope::GlobalReadonly,
            ))
        });
        match store.add(items) {
            Err(Error::TooLarge {
                what,
                len,
                max,
                index: None,
            }) => {
                assert_eq!(what, "batch (items)");
                assert_eq!((len, max), (BATCH_ITEMS_MAX as u64 + 1, BATCH_ITEMS_MAX as u64));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(made, BATCH_ITEMS_MAX + 1);
        assert_eq!(store.stats().items, 0);
        // The refusal left the store usable: the next batch goes through whole.
        assert_eq!(store.add(batch(0, 3)).unwrap().len(), 3);
        assert_eq!(store.stats().items, 3);
    }

    #[test]
    fn the_free_thread_starts_with_the_first_large_add_and_stops_with_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Options::new().durability(Durability::Never).open(dir.path()).unwrap();
        store.add(batch(0, PARALLEL_ADD_ITEMS_MIN - 1)).unwrap();
        assert!(store.inner.freer.get().is_none(), "a small add frees its own");
        for k in 0..3 {
            store.add(batch(1000 * (k + 1), 300)).unwrap();
        }
        let Some(Some((_, handle))) = store.inner.freer.get() else {
            panic!("the free thread did not start");
        };
        assert_eq!(handle.thread().name(), Some("ctxlog-drop"));
        let weak = Arc::downgrade(&store.inner);
        drop(store);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn a_large_add_leaves_its_leftovers_to_the_free_thread_or_when_it_is_busy_to_the_next_add() {
        let dir = tempfile::tempdir().unwrap();
        let store = Options::new().durability(Durability::Never).open(dir.path()).unwrap();
        let (go, freed) = stand_in_freer(&store);
        let answers = store.add(batch(0, 300)).unwrap();
        // The answers still carry every id and version, in order.
        assert_eq!(answers.len(), 300);
        assert!(matches!(&answers[7], AddOutcome::Added { id, version, .. } if id == "item-000007" && version == "1"));
        // The first batch went to the free thread's queue; the free thread holds it.
        assert_eq!(leftovers(&store), (0, Vec::new()));
        // The queue is full: the next large batch's leftovers are kept, contents, records and
        // strings, ids and versions taken out.
        store.add(batch(300, PARALLEL_ADD_ITEMS_MIN)).unwrap();
        let (contents, puts) = leftovers(&store);
        assert_eq!((contents, puts.len()), (PARALLEL_ADD_ITEMS_MIN, PARALLEL_ADD_ITEMS_MIN));
        assert!(puts
            .iter()
            .all(|(kind, source, record, taken)| kind == "message" && source == "src" && *record > 0 && *taken));
        // Any next add frees them during its wait; a small one leaves nothing of its own.
        store.add(batch(600, 1)).unwrap();
        assert_eq!(leftovers(&store), (0, Vec::new()));
        // A batch over the cap frees its own: nothing kept, nothing queued.
        store.add(batch(1000, LEFTOVER_ITEMS_MAX + 1)).unwrap();
        assert_eq!(leftovers(&store), (0, Vec::new()));
        // Let go, the free thread gets the first batch only, whole.
        go.send(()).unwrap();
        assert_eq!(freed.recv_timeout(Duration::from_secs(10)), Ok((300, 300)));
        assert!(freed.recv_timeout(Duration::from_millis(200)).is_err());
        // What was added reads back whole.
        let found = store
            .snapshot()
            .resolve(["item-000007", "item-000300", "item-005096"])
            .unwrap();
        assert!(found.iter().all(|r| matches!(r, Resolution::Found(_))), "{found:?}");
    }

    /// A snapshot handle dropped while the registry of live handles is locked (a compaction holds it
    /// across its rename and directory fsync) does not wait for it: its release is queued, and the
    /// registry's next holder applies it before reading.
    #[test]
    fn a_handle_dropped_while_the_registry_is_locked_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.add(batch(0, 3)).unwrap();
        let (snap, other) = (store.snapshot(), store.snapshot());
        let seq = snap.seq();
        let shared = store.shared();
        let live = shared.live_snapshots();
        assert_eq!(live.get(&seq), Some(&2));
        let (done, dropped) = crossbeam_channel::bounded(1);
        let dropper = std::thread::spawn(move || {
            drop(snap);
            done.send(()).unwrap();
        });
        assert_eq!(dropped.recv_timeout(Duration::from_secs(10)), Ok(()));
        dropper.join().unwrap();
        drop(live);
        // Applied by the next holder: one handle left at that seq, then none.
        assert_eq!(shared.live_snapshots().get(&seq), Some(&1));
        drop(other);
        assert!(shared.live_snapshots().is_empty());
    }
}
