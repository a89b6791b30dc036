//! The maintenance thread: background compaction and checkpoints, the latter written in a lull in
//! the store's use. An engine thread over [`Shared`], started and stopped by the store handle.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::engine::checkpoint;
use crate::engine::compaction::{self, CompactionReport};
use crate::engine::shared::Shared;
use crate::error::{Error, Result};

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
/// `delete` in progress at its end (see [`Store`](crate::Store), "Checkpoints").
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
pub(crate) fn compact_and_mark(shared: &Shared, min_share: f64) -> Result<CompactionReport> {
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
fn wait_for_lull(shared: &Shared, stopped: &Receiver<()>, deadline: Instant, growth_max: u64) -> Lull {
    let round_ends = Instant::now() + MAINTENANCE_INTERVAL;
    loop {
        let overdue = Instant::now() >= deadline
            || shared.log_bytes().saturating_sub(shared.checkpointed_log_bytes()) >= growth_max;
        if overdue {
            return Lull::Overdue;
        }
        let seq_before = shared.read_index().seq;
        shared.read_since_look.store(false, Ordering::Relaxed);
        if !matches!(stopped.recv_timeout(CHECKPOINT_LULL), Err(RecvTimeoutError::Timeout)) {
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

/// Starts the maintenance thread (background compaction when `auto_compact`, and a checkpoint every
/// `checkpoint_every` bytes of log, or [`CHECKPOINT_EVERY_SIZES`] times the last checkpoint's size,
/// in a lull in the store's use); it stops when the returned sender is dropped.
pub(crate) fn start_maintenance(
    shared: Arc<Shared>,
    auto_compact: bool,
    checkpoint_every: u64,
) -> Result<(Sender<()>, JoinHandle<()>)> {
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    let maintenance = Maintenance {
        shared,
        auto_compact,
        checkpoint_every,
        last_seen: None,
        due_since: None,
    };
    let handle = std::thread::Builder::new()
        .name("ctxlog-maintenance".into())
        .spawn(move || maintenance.run(&stopped))
        .map_err(|e| Error::io("starting the maintenance thread", e))?;
    Ok((stop, handle))
}

/// The maintenance thread's state between its rounds.
struct Maintenance {
    shared: Arc<Shared>,
    auto_compact: bool,
    checkpoint_every: u64,
    /// The seq and clock time of the last round that was not idle.
    last_seen: Option<(u64, i64)>,
    /// Since when a checkpoint has been due and waiting for a lull.
    due_since: Option<Instant>,
}

impl Maintenance {
    /// A round every [`MAINTENANCE_INTERVAL`] until `stopped` is closed.
    fn run(mut self, stopped: &Receiver<()>) {
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(MAINTENANCE_INTERVAL) {
            if self.round(stopped).is_break() {
                break;
            }
        }
    }

    /// Compacts if the log or the clock moved, then writes a checkpoint if one is due; breaks when
    /// the store is closing.
    fn round(&mut self, stopped: &Receiver<()>) -> ControlFlow<()> {
        let shared = &*self.shared;
        // Nothing to gain while the log has not moved and the clock has not moved much: a
        // plan walks the whole index. A checkpoint still waiting is written.
        let (seq, now) = (shared.read_index().seq, shared.clock.now());
        let idle = self.last_seen.is_some_and(|(last_seq, last_now)| {
            last_seq == seq && now.saturating_sub(last_now) < MAINTENANCE_CLOCK_STEP_SECONDS
        });
        if idle && self.due_since.is_none() && !shared.checkpoint_stale() {
            return ControlFlow::Continue(());
        }
        self.last_seen = Some((seq, now));
        if self.auto_compact && !idle {
            let _one_at_a_time = shared
                .compaction
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = compact_and_mark(shared, AUTO_COMPACT_MIN_SHARE) {
                tracing::warn!("background compaction failed: {e}");
            }
        }
        self.checkpoint_if_due(stopped)
    }

    /// Writes a checkpoint if one is due and a lull comes (or it is overdue); breaks when the store
    /// is closing.
    fn checkpoint_if_due(&mut self, stopped: &Receiver<()>) -> ControlFlow<()> {
        let shared = &*self.shared;
        let every = self
            .checkpoint_every
            .max(CHECKPOINT_EVERY_SIZES * shared.last_checkpoint_bytes.load(Ordering::Relaxed));
        let due = |shared: &Shared| {
            shared.checkpoint_stale() || shared.log_bytes().saturating_sub(shared.checkpointed_log_bytes()) >= every
        };
        if !due(shared) {
            self.due_since = None;
            return ControlFlow::Continue(());
        }
        let since = *self.due_since.get_or_insert_with(Instant::now);
        let growth_max = every.saturating_mul(CHECKPOINT_DEFER_GROWTH);
        match wait_for_lull(shared, stopped, since + CHECKPOINT_DEFER_MAX, growth_max) {
            Lull::Stopped => return ControlFlow::Break(()),
            Lull::NotYet => return ControlFlow::Continue(()),
            Lull::Quiet | Lull::Overdue => {}
        }
        let _one_at_a_time = shared
            .compaction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another checkpoint (`ctxlog::testing::bench`'s) may have been written in between.
        if !due(shared) {
            self.due_since = None;
            return ControlFlow::Continue(());
        }
        match checkpoint::write(shared, true) {
            Ok(_) => {
                shared.note_checkpoint();
                self.due_since = None;
            }
            Err(e) => tracing::warn!("writing a checkpoint failed: {e}"),
        }
        ControlFlow::Continue(())
    }
}
