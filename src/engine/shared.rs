//! [`Shared`]: the state the store's threads share (the index and its lock, the type registry, the
//! clock, the writer's queue, the registry of live snapshots, counters, leftovers, the worker
//! threads). It sits in the engine, below the facade, because the writer, compaction, checkpoints
//! and snapshots all work on it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::clock::Clock;
use crate::engine::commands::{poll_then_recv, Answer, Command, Op, OpOutcome};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::item::TypeRegistry;
use crate::storage::Storage;

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
    /// Whether the store was opened read-only: no writer thread, and every command refused.
    read_only: AtomicBool,
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
    pub(super) checkpoint_stale: AtomicBool,
    /// Size of the newest checkpoint written by this process, in bytes.
    pub(crate) last_checkpoint_bytes: AtomicU64,
    /// Threads inside an `add` or a `delete` (validating a small batch, queued, or waiting for their
    /// answer): the writer thread waits a moment for those not yet in its group, so that one fsync
    /// serves them.
    pub(crate) writers: AtomicUsize,
    /// Set by every read and query, cleared by the maintenance thread while it looks for a lull
    /// (see [`Store`](crate::Store), "Checkpoints").
    pub(super) read_since_look: AtomicBool,
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
    /// Where the change feed starts, kept per rewritten segment.
    pub(crate) history: crate::engine::history::start::HistoryStart,
    /// The live subscriptions, and what the writer hands them.
    pub(crate) hub: Arc<crate::engine::history::hub::Hub>,
    /// The oldest view of the past answered exactly (kept in `history.floor`): raised by
    /// compaction under the snapshot registry's lock, read under it by views of the past.
    floor: Mutex<crate::engine::history::past::Floor>,
    /// `Options::history_retention`, in seconds.
    history_retention: AtomicI64,
    /// Set while the floor opening found (for a store compacted by a build that kept none) is not
    /// in `history.floor` yet: the first commit writes it (opening changes nothing).
    floor_unsaved: AtomicBool,
}

/// What is left of a large add's items once it is answered: its operations, with their content
/// trees (whose canonical bytes are in the records), records, and type, source, scope and hash
/// strings. Freeing them takes ~0.6 ms per 1,000 W1 items: done by the store's free thread (see
/// `StoreInner::freer`, in the facade) after the answer, they stay off the add's way and off the
/// cores of its fsync and index insert.
// Its fields are held only to be dropped (read by the tests alone).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Garbage {
    pub(crate) ops: Vec<Op>,
}

/// The most items whose leftovers an `add` hands to the free thread or keeps for the next add to
/// free (about 1 KiB each for W1-like items); a larger batch frees its own.
pub(crate) const LEFTOVER_ITEMS_MAX: usize = 4096;

/// Batches of at most this many items count as writing (see [`Shared::writers`]) while they are
/// validated; larger ones only once they are sent.
pub(crate) const QUICK_ADD_ITEMS: usize = 16;

/// Counts a thread in [`Shared::writers`] while it lives.
pub(crate) struct Writing<'a>(&'a AtomicUsize);

impl<'a> Writing<'a> {
    #[inline]
    pub(crate) fn enter(writers: &'a AtomicUsize) -> Self {
        writers.fetch_add(1, Ordering::AcqRel);
        Writing(writers)
    }
}

impl Drop for Writing<'_> {
    #[inline]
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
    /// The state of a store opened in `dir` whose recovered index is `index`, with no writer
    /// thread yet (see [`Shared::set_commands`]) and `worker_threads` worker threads kept beside
    /// the calling one. The log as recovered counts as checkpointed.
    pub(crate) fn new(
        dir: PathBuf,
        storage: Arc<dyn Storage>,
        index: Index,
        clock: Arc<dyn Clock>,
        read_threads: usize,
        worker_threads: usize,
    ) -> Shared {
        let registry = Arc::new(index.registry.clone());
        let hub = Arc::new(crate::engine::history::hub::Hub::new(index.seq));
        let shared = Shared {
            dir,
            storage,
            index: RwLock::new(index),
            registry: RwLock::new(registry),
            clock,
            queries: AtomicU64::new(0),
            examined: AtomicU64::new(0),
            commands: Mutex::new(None),
            read_only: AtomicBool::new(false),
            live_snapshots: Mutex::new(BTreeMap::new()),
            released_snapshots: Mutex::new(Vec::new()),
            compaction: Mutex::new(()),
            checkpointed_log_bytes: AtomicU64::new(0),
            checkpoint_stale: AtomicBool::new(false),
            last_checkpoint_bytes: AtomicU64::new(0),
            writers: AtomicUsize::new(0),
            read_since_look: AtomicBool::new(false),
            leftovers: Mutex::new(None),
            read_threads,
            workers: crate::parallel::Workers::new(worker_threads),
            history: crate::engine::history::start::HistoryStart::default(),
            hub,
            floor: Mutex::new(crate::engine::history::past::Floor::default()),
            history_retention: AtomicI64::new(0),
            floor_unsaved: AtomicBool::new(false),
        };
        shared.note_checkpoint();
        shared
    }

    /// Sets the history retention (seconds) and the floor as opening found it (`unsaved`: not in
    /// its file yet).
    pub(crate) fn configure_history(
        &self,
        retention_seconds: i64,
        floor: crate::engine::history::past::Floor,
        unsaved: bool,
    ) {
        self.history_retention.store(retention_seconds, Ordering::Relaxed);
        *self.floor.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = floor;
        self.floor_unsaved.store(unsaved, Ordering::Release);
    }

    /// Writes the floor opening found if it is not in its file yet (the writer calls this after
    /// each commit: one load while there is nothing to do). A failure is logged and tried again
    /// at the next commit.
    #[inline]
    pub(crate) fn save_floor_if_unsaved(&self) {
        if !self.floor_unsaved.load(Ordering::Acquire) {
            return;
        }
        let floor = self.floor.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match crate::engine::history::past::store_floor(&*self.storage, &self.dir, *floor) {
            Ok(()) => self.floor_unsaved.store(false, Ordering::Release),
            Err(e) => tracing::warn!("writing the history floor failed: {e}"),
        }
    }

    /// `Options::history_retention`, in seconds (0: none).
    pub(crate) fn history_retention(&self) -> i64 {
        self.history_retention.load(Ordering::Relaxed)
    }

    /// The oldest view of the past answered exactly. Read it under the snapshot registry's lock
    /// (see [`Shared::live_snapshots`]) to order it with compaction.
    pub(crate) fn floor(&self) -> crate::engine::history::past::Floor {
        *self.floor.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Raises the floor of the views of the past to `floor` where it is higher, durably first.
    /// The caller (compaction) holds the snapshot registry's lock.
    ///
    /// # Errors
    /// `Io` if the floor file cannot be written.
    pub(crate) fn raise_floor(&self, floor: crate::engine::history::past::Floor) -> Result<()> {
        let mut kept = self.floor.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let raised = kept.max(floor);
        if raised != *kept || self.floor_unsaved.load(Ordering::Acquire) {
            crate::engine::history::past::store_floor(&*self.storage, &self.dir, raised)?;
            *kept = raised;
            self.floor_unsaved.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// The log as the change feed reads it: every segment in number order with its published
    /// bytes, and the last sequence number, taken together under the index's lock.
    pub(crate) fn log_parts(&self) -> (Vec<crate::engine::history::feed::LogPart>, u64) {
        let index = self.read_index();
        (self.log_parts_of(&index), index.seq)
    }

    /// [`Shared::log_parts`]'s segments, for a caller that holds the index's lock.
    pub(crate) fn log_parts_of(&self, index: &Index) -> Vec<crate::engine::history::feed::LogPart> {
        index
            .segments
            .iter()
            .map(|(number, segment)| crate::engine::history::feed::LogPart {
                number: *number,
                segment: Arc::clone(segment),
                end: segment.published_len(),
            })
            .collect()
    }

    /// Marks the store read-only: every command is refused with `ReadOnly` (there is no writer).
    pub(crate) fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Relaxed);
    }

    /// Whether the store was opened read-only.
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Relaxed)
    }

    /// Opens the writer thread's queue: commands sent from now on go to `sender`.
    pub(crate) fn set_commands(&self, sender: Sender<Command>) {
        *self.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sender);
    }

    /// Closes the writer thread's queue (the store handle is closing): the writer finishes what is
    /// queued, syncs and exits, and every later command is answered `Closed`.
    pub(crate) fn close_commands(&self) {
        drop(
            self.commands
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
    }

    /// Queries run, and index entries they examined.
    pub(crate) fn query_counts(&self) -> (u64, u64) {
        (
            self.queries.load(Ordering::Relaxed),
            self.examined.load(Ordering::Relaxed),
        )
    }

    /// The index for reading. A panic while the lock was held cannot leave it half-updated (updates
    /// are whole batches applied by one thread), so a poisoned lock is entered anyway.
    #[inline]
    pub(crate) fn read_index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`Shared::read_index`] for a caller's read or query: also marks the store as in use, for the
    /// maintenance thread's lull detection. The mark is a load, and a store only in the first read
    /// after the maintenance thread cleared it, so that readers on many cores keep the flag's cache
    /// line shared rather than pass it around.
    #[inline]
    pub(crate) fn read_index_for_caller(&self) -> RwLockReadGuard<'_, Index> {
        if !self.read_since_look.load(Ordering::Relaxed) {
            self.read_since_look.store(true, Ordering::Relaxed);
        }
        self.read_index()
    }

    #[inline]
    pub(crate) fn write_index(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
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
    pub(crate) fn swap_leftovers(&self, rest: Option<Garbage>) -> Option<Garbage> {
        std::mem::replace(
            &mut *self.leftovers.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
            rest,
        )
    }

    /// The kept leftovers, for the tests to look at.
    #[cfg(test)]
    pub(crate) fn leftovers(&self) -> MutexGuard<'_, Option<Garbage>> {
        self.leftovers.lock().unwrap()
    }

    pub(crate) fn send(&self, command: Command) -> Result<()> {
        if self.is_read_only() {
            return Err(Error::ReadOnly {
                operation: command.operation(),
            });
        }
        let commands = self.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sender = commands.as_ref().ok_or(Error::Closed)?;
        sender.send(command).map_err(|_| Error::Closed)
    }

    /// Makes every published batch durable.
    pub(crate) fn flush(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
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

    #[inline]
    pub(crate) fn count_query(&self, examined: u64) {
        self.queries.fetch_add(1, Ordering::Relaxed);
        self.examined.fetch_add(examined, Ordering::Relaxed);
    }
}
