//! Making a group durable: its fsync, and the writer's kept helper threads that apply a bulk group
//! to the index and ready the space for the next ones while that fsync runs; and the polling wait
//! for the next message on a channel, by which the writer thread waits for commands and writers for
//! their answers.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::engine::shared::Shared;
use crate::error::{Error, Result};

use super::publish::{apply_unpublished, written_puts};
use super::{Staged, Writer};
use crate::engine::commands::Op;

/// Puts in a group from which its index insert runs during its fsync rather than after it: below,
/// the insert takes less time than starting the thread that syncs (~20 us).
const APPLY_DURING_SYNC_PUTS: usize = 256;

/// Work for one of the writer's kept helper threads, and what it gives back.
type HelperJob<T> = Box<dyn FnOnce() -> T + Send>;

/// A thread kept for one kind of the writer's work beside its fsyncs: it runs one job at a time,
/// handed to it over a channel, and reports what the job gave back (or its panic) on another.
/// Dropping it ends the thread and joins it.
struct Helper<T> {
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

/// Whether the group's index insert should run during its fsync: a group of many puts and nothing
/// else, so that applying it ahead of its sequence number changes nothing a view can see (no
/// delete, type, or pin).
fn apply_during_sync(staged: &[Staged]) -> bool {
    let only_puts = staged
        .iter()
        .all(|batch| batch.ops.iter().all(|op| matches!(op, Op::Put(_))));
    only_puts && written_puts(staged) >= APPLY_DURING_SYNC_PUTS
}

impl Writer {
    /// Makes what was written durable: the buffer written out, then one fsync of the active
    /// segment (none when nothing was written since the last one).
    pub(super) fn sync(&mut self) -> Result<()> {
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
        if result.is_ok() {
            self.note_durable();
        }
        self.last_sync = Instant::now();
        if let Err(e) = &result {
            self.poisoned = Some(e.to_string());
        }
        result
    }

    /// After the group's frames were written: syncs them when `must_sync` (applying a bulk group
    /// to the index during the fsync, see [`Writer::sync_beside`]), or only writes out the buffer.
    /// `before` is the active segment's number and length before the group. Returns whether the
    /// group's batches were applied to the index (unpublished); `staged` holds them either way.
    pub(super) fn sync_group(&mut self, staged: &mut Vec<Staged>, must_sync: bool, before: (u32, u64)) -> Result<bool> {
        if !must_sync {
            return self.write_buffer().map(|()| false);
        }
        if !apply_during_sync(staged) {
            return self.sync().map(|()| false);
        }
        let (segment_before, len_before) = before;
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
        let (ran, back) = self.sync_beside(std::mem::take(staged), shared, prepare);
        *staged = back;
        ran
    }

    /// Tells the live subscriptions that every batch written so far is durable.
    pub(super) fn note_durable(&self) {
        self.shared.hub.set_durable(self.next_seq.saturating_sub(1));
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
