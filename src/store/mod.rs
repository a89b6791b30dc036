//! [`Store`]: the public handle over the log, the index and the engine's threads. Opening a store
//! starts them; the handle's calls hand writes to the writer thread and reads to snapshots.
//! [`Options`], [`SessionView`], the add path, [`Stats`] and [`Store::verify`] have files of their
//! own here.

mod add;
mod history;
mod options;
mod outcome;
mod session;
mod stats;
#[cfg(test)]
mod tests;
mod verify;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::Sender;

use crate::engine::checkpoint;
use crate::engine::commands::{Command, Op, OpOutcome};
use crate::engine::compaction::{self, CompactionReport};
use crate::engine::maintenance::{compact_and_mark, start_maintenance};
use crate::engine::recovery::{recover, RecoveryStats};
use crate::engine::scrub::start_scrub;
use crate::engine::shared::{Garbage, Writing};
use crate::engine::writer::{SyncHelpers, Writer};
use crate::error::{Error, Result};
use crate::item::{validate_name, ContextItem, TypeRegistry, TypeSpec};
use crate::log::segment::{parse_segment_file_name, ActiveSegment};
use crate::read::answer::{RawItem, RawResolution, Resolution};
use crate::read::query::{ContextQuery, QueryStats};
use crate::snapshot::{Receipt, Snapshot, SnapshotInfo};
use crate::storage::{DirLock, Storage};

pub use self::options::Options;
pub use self::outcome::AddOutcome;
pub use self::session::SessionView;
pub use self::stats::Stats;
pub use self::verify::{Problem, VerifyReport};
pub use crate::engine::commands::Durability;

struct StoreInner {
    shared: Arc<crate::engine::shared::Shared>,
    writer: Mutex<Option<JoinHandle<bool>>>,
    /// The maintenance thread (compaction, checkpoints): dropping the sender stops it.
    maintenance: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
    /// The free thread, started by the first add that leaves leftovers: it frees what those adds
    /// leave once answered (see [`Garbage`]), one batch at a time, with one more queued at most.
    /// Dropping the sender stops it.
    freer: std::sync::OnceLock<Option<(Sender<Garbage>, JoinHandle<()>)>>,
    options: Options,
    recovery: RecoveryStats,
    /// The scrub thread, if it runs: dropping the sender stops it.
    scrub: Mutex<Option<crate::engine::scrub::ScrubThread>>,
    /// What the scrub has done and found.
    scrub_report: crate::engine::scrub::ScrubReport,
    /// `None` only when opened read-only from a directory without a `LOCK` file.
    _lock: Option<Box<dyn DirLock>>,
}

/// Stops a background thread that runs until its sender is dropped, and waits for it.
fn stop_thread(thread: &Mutex<Option<(Sender<()>, JoinHandle<()>)>>, name: &str) {
    let taken = thread.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    if let Some((stop, handle)) = taken {
        drop(stop);
        if handle.join().is_err() {
            tracing::error!("the {name} thread panicked");
        }
    }
}

impl Drop for StoreInner {
    fn drop(&mut self) {
        if let Some(Some((sender, handle))) = self.freer.take() {
            drop(sender);
            if handle.join().is_err() {
                tracing::error!("the free thread panicked");
            }
        }
        stop_thread(&self.scrub, "scrub");
        stop_thread(&self.maintenance, "maintenance");
        // Closing the channel lets the writer finish what is queued, sync and exit.
        self.shared.close_commands();
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
        // After the writer's last sync: subscribers get what it made durable, then `Closed`.
        self.shared.hub.close();
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

    /// The state the store's threads share (for `ctxlog::testing`'s checks).
    #[cfg(feature = "testing")]
    pub(crate) fn shared(&self) -> &crate::engine::shared::Shared {
        &self.inner.shared
    }

    fn open_with(dir: &Path, options: Options) -> Result<Store> {
        options.check()?;
        let storage = Arc::clone(&options.storage);
        let lock = if options.read_only {
            lock_existing(&*storage, dir)?
        } else {
            Some(lock_dir(&*storage, dir)?)
        };
        let recovered = recover(&*storage, dir, options.read_only)?;
        let committed_at = recovered.index.committed_at;
        let floor = crate::engine::history::past::open_floor(&*storage, dir, &recovered.index, options.clock.now())?;
        let shared = Arc::new(crate::engine::shared::Shared::new(
            dir.to_path_buf(),
            storage,
            recovered.index,
            Arc::clone(&options.clock),
            options.read_threads,
            options.add_threads.max(options.read_threads) - 1,
        ));
        shared.hub.configure(
            matches!(options.durability, Durability::Periodic(_)),
            options.subscription_buffer,
        );
        // Checked to be at most 100 years: it fits.
        let retention = i64::try_from(options.history_retention.as_secs()).unwrap_or(i64::MAX);
        shared.configure_history(retention, floor.0, floor.1);
        let scrub_rate = if options.read_only {
            0
        } else {
            options.scrub_bytes_per_sec
        };
        let (scrub_report, scrub) = start_scrub(Arc::clone(&shared), scrub_rate, options.scrub_interval)?;
        let (handle, maintenance) = match recovered.active {
            Some(active) => (
                Some(start_writer(
                    &shared,
                    active,
                    (recovered.next_seq, committed_at),
                    &options,
                )?),
                Some(start_maintenance(
                    Arc::clone(&shared),
                    options.auto_compact,
                    options.checkpoint_every,
                )?),
            ),
            None => {
                shared.set_read_only();
                (None, None)
            }
        };
        Ok(Store {
            inner: Arc::new(StoreInner {
                shared,
                writer: Mutex::new(handle),
                maintenance: Mutex::new(maintenance),
                scrub: Mutex::new(scrub),
                scrub_report,
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
    /// refused item as `index`; `TooLarge` for a batch over the limits; `Full` for a batch that could
    /// take the store past what its index numbers ([`limits`](crate::limits): versions, ids, scopes,
    /// sources); `Poisoned` after an earlier write failure; `Io` if the write or fsync fails.
    pub fn add<I: IntoIterator<Item = ContextItem>>(&self, items: I) -> Result<Vec<AddOutcome>> {
        self.add_checked(items, None)
    }

    /// Writes a checkpoint now, as the maintenance thread does (for `ctxlog::testing::bench`).
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
    /// another pattern; `Full` for a new type once [`limits::TYPES_MAX`](crate::limits::TYPES_MAX)
    /// types (built-in ones included) are registered; `Poisoned` or `Io` as for [`Store::add`].
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
        if shared.is_read_only() {
            return Err(Error::ReadOnly { operation: "compact" });
        }
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
        SessionView::new(self.clone(), session_id)
    }
}

/// Creates the store's directory if needed and takes its lock.
fn lock_dir(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn DirLock>> {
    storage
        .create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    take_lock(storage, dir)
}

/// How long opening waits for a lock held elsewhere before it says `Locked`: a process another
/// thread of this one is starting holds a copy of the lock until it executes its program (the
/// file is closed on exec), so a store dropped and reopened meanwhile finds it held for a moment.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// The store's lock, waited for up to [`LOCK_PATIENCE`]; `Locked` if it stays held.
fn take_lock(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn DirLock>> {
    let started = Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let taken = storage
            .try_lock(dir)
            .map_err(|e| Error::io(format!("locking {}", dir.join("LOCK").display()), e))?;
        if let Some(lock) = taken {
            return Ok(lock);
        }
        if started.elapsed() >= LOCK_PATIENCE {
            return Err(Error::Locked {
                path: dir.to_path_buf(),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
}

/// For a read-only open: `NotAStore` unless `dir` holds a segment file, and its lock if it has a
/// `LOCK` file (none is created).
fn lock_existing(storage: &dyn Storage, dir: &Path) -> Result<Option<Box<dyn DirLock>>> {
    let not_a_store = || Error::NotAStore {
        path: dir.to_path_buf(),
    };
    let names = match storage.list(dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_a_store()),
        Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
    };
    if !names.iter().any(|name| parse_segment_file_name(name).is_some()) {
        return Err(not_a_store());
    }
    if !names.iter().any(|name| name == "LOCK") {
        return Ok(None);
    }
    take_lock(storage, dir).map(Some)
}

/// Starts the writer thread, appending to `active` from batch `next_seq` on, with commit times from
/// `last_committed_at` (the log's last) on, and opens its queue.
fn start_writer(
    shared: &Arc<crate::engine::shared::Shared>,
    active: ActiveSegment,
    (next_seq, last_committed_at): (u64, i64),
    options: &Options,
) -> Result<JoinHandle<bool>> {
    let (sender, receiver) = crossbeam_channel::unbounded();
    let synced_len = active.len;
    let writer = Writer {
        shared: Arc::clone(shared),
        dir: shared.dir.clone(),
        active,
        next_seq,
        durability: options.durability,
        segment_size: options.segment_size,
        poisoned: None,
        dirty: false,
        last_sync: Instant::now(),
        buffer: Vec::new(),
        // Recovery synced what it replayed of the newest segment.
        synced_len,
        last_committed_at,
        last_group_writes: 0,
        helpers: SyncHelpers::default(),
    };
    let handle = std::thread::Builder::new()
        .name("ctxlog-writer".into())
        .spawn(move || writer.run(&receiver))
        .map_err(|e| Error::io("starting the writer thread", e))?;
    shared.set_commands(sender);
    Ok(handle)
}
