//! [`Options`]: the settings a store is opened with, each checked against its
//! limits when the store opens.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::engine::commands::Durability;
use crate::engine::history::hub::SUBSCRIPTION_BUFFER_DEFAULT;
use crate::error::{Error, Result};
use crate::limits::{
    ADD_THREADS_DEFAULT_MAX, ADD_THREADS_MAX, CHECKPOINT_EVERY_BYTES_DEFAULT, CHECKPOINT_EVERY_BYTES_MAX,
    CHECKPOINT_EVERY_BYTES_MIN, CONTENT_BYTES_DEFAULT, CONTENT_BYTES_MAX, READ_THREADS_DEFAULT_MAX, READ_THREADS_MAX,
    SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN,
};
use crate::storage::{FileStorage, Storage};
use crate::store::Store;

/// Settings for opening a store. Every setter states its default.
#[derive(Clone)]
pub struct Options {
    pub(super) durability: Durability,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) segment_size: u64,
    pub(super) max_content_bytes: usize,
    pub(super) auto_compact: bool,
    pub(super) compress_content: bool,
    pub(super) storage: Arc<dyn Storage>,
    pub(super) add_threads: usize,
    pub(super) read_threads: usize,
    pub(super) checkpoint_every: u64,
    pub(super) subscription_buffer: usize,
    pub(super) history_retention: Duration,
    pub(super) read_only: bool,
    pub(super) scrub_bytes_per_sec: u64,
    pub(super) scrub_interval: Duration,
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
            .field("subscription_buffer", &self.subscription_buffer)
            .field("history_retention", &self.history_retention)
            .field("read_only", &self.read_only)
            .field("scrub_bytes_per_sec", &self.scrub_bytes_per_sec)
            .field("scrub_interval", &self.scrub_interval)
            .finish()
    }
}

/// `Options::scrub_bytes_per_sec` by default: 4 MiB/s.
const SCRUB_BYTES_PER_SEC_DEFAULT: u64 = 4 << 20;
/// `Options::scrub_interval` by default.
const SCRUB_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// The longest `Options::history_retention`: 100 years.
const HISTORY_RETENTION_SECONDS_MAX: u64 = 100 * 366 * 24 * 3600;

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
            subscription_buffer: SUBSCRIPTION_BUFFER_DEFAULT,
            history_retention: Duration::ZERO,
            read_only: false,
            scrub_bytes_per_sec: SCRUB_BYTES_PER_SEC_DEFAULT,
            scrub_interval: SCRUB_INTERVAL_DEFAULT,
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

    /// How many live changes a subscriber ([`Store::subscribe`]) may have queued and not received
    /// before it is lagged ([`Error::Lagged`]; replayed history does not count): the memory a
    /// subscriber holds is bounded by this many changes. A batch's changes are queued all or none,
    /// so a batch with more matching changes than this lags its subscriber. Default: 10,000;
    /// accepted: 1 and above.
    #[must_use]
    pub fn subscription_buffer(mut self, changes: usize) -> Self {
        self.subscription_buffer = changes;
        self
    }

    /// How far back compaction keeps the past (by the store's clock, whole seconds): every version,
    /// tombstone and record that was visible at some moment less than this long ago stays, so that
    /// [`Store::changes`](crate::Store::changes) and the views of
    /// [`Store::snapshot_at`](crate::Store::snapshot_at) and
    /// [`Store::snapshot_as_of`](crate::Store::snapshot_as_of) reach that far back. Default: zero
    /// (compaction keeps only what the current state, live snapshots and pins see). Accepted: up
    /// to 100 years.
    #[must_use]
    pub fn history_retention(mut self, retention: Duration) -> Self {
        self.history_retention = retention;
        self
    }

    /// How many bytes per second the scrub reads at the most: a background thread that reads every
    /// segment again, pass after pass, and checks every frame's and record's CRC and every item's
    /// content against its SHA-256, reporting what it finds through [`Stats::scrub`](crate::Stats)
    /// and the log (`tracing::error!`). It takes no lock while it reads and never blocks a writer.
    /// Default: 4 MiB/s (a pass over a 1 GiB store takes about four minutes); 0 turns it off.
    /// A read-only store is never scrubbed.
    #[must_use]
    pub fn scrub_bytes_per_sec(mut self, bytes: u64) -> Self {
        self.scrub_bytes_per_sec = bytes;
        self
    }

    /// When the scrub's passes start: the first this long after opening, each next one this long
    /// after the one before started (or as soon as it ends, if it took longer). Default: 60 s, so
    /// that a store opened for a moment is not read through; at least 1 ms.
    #[must_use]
    pub fn scrub_interval(mut self, interval: Duration) -> Self {
        self.scrub_interval = interval;
        self
    }

    /// Opens the store without changing any of its files, to look inside it (`ctxlog stats`,
    /// `verify`, `get`, ...). Default: false. A missing directory, or one without a segment file, is
    /// [`Error::NotAStore`](crate::Error::NotAStore) and is left as it is (nothing is created). Reads,
    /// snapshots, pins already made, the change feed and subscriptions work; every write
    /// (`add`, `delete`, `register_type`, pinning and unpinning, `compact`) is
    /// [`Error::ReadOnly`](crate::Error::ReadOnly), `flush` has nothing to do, and closing writes no
    /// checkpoint. A torn tail left by a crash stays in place and unread; no segment is opened for
    /// appends and no background thread compacts or checkpoints. The store's lock is still taken
    /// (a store has a `LOCK` file once a writer has opened it; a store without one, such as a copied
    /// directory, is opened without a lock rather than given a new file), so a read-only handle and a
    /// writer never share a store.
    #[must_use]
    pub fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// Opens (creating if needed) the store in directory `path`.
    ///
    /// # Errors
    /// `Invalid` for a setting out of range; `Locked` if another handle holds the store; `Corrupt` if
    /// acknowledged data is damaged; `Io` if the directory cannot be used.
    /// With [`Options::read_only`], `NotAStore` instead of creating anything.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(path.as_ref(), self)
    }

    /// `Invalid` for the first setting out of its range.
    pub(super) fn check(&self) -> Result<()> {
        within(
            "segment_size",
            self.segment_size,
            SEGMENT_BYTES_MIN,
            SEGMENT_BYTES_MAX,
            " bytes",
        )?;
        within("max_content_bytes", self.max_content_bytes, 1, CONTENT_BYTES_MAX, "")?;
        within(
            "checkpoint_every",
            self.checkpoint_every,
            CHECKPOINT_EVERY_BYTES_MIN,
            CHECKPOINT_EVERY_BYTES_MAX,
            " bytes",
        )?;
        within("add_threads", self.add_threads, 1, ADD_THREADS_MAX, "")?;
        within("read_threads", self.read_threads, 1, READ_THREADS_MAX, "")?;
        within("subscription_buffer", self.subscription_buffer, 1, usize::MAX, "")?;
        within(
            "history_retention",
            self.history_retention.as_secs(),
            0,
            HISTORY_RETENTION_SECONDS_MAX,
            " s",
        )?;
        if self.scrub_interval < Duration::from_millis(1) {
            return Err(Error::invalid("scrub_interval", "must be at least 1 ms"));
        }
        if let Durability::Periodic(period) = self.durability {
            if period.is_zero() {
                return Err(Error::invalid("durability", "a Periodic duration must be above zero"));
            }
        }
        Ok(())
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
