//! Splitting one call's work over threads kept for it: the validation of a large `add`
//! (`Options::add_threads`) and the reading of a large query's or resolve's items once the index
//! lock is released (`Options::read_threads`).
//!
//! The threads are a [`Workers`] pool of the store's, started by the first call that splits its
//! work and joined when the store's shared state goes. Starting a scoped thread for each call cost
//! the caller ~60 us before its own run could begin and ~100 us more waiting for the thread's exit
//! on the development VM, a tenth of a typical 1,000-item query's time; waking a kept thread costs
//! a fraction of that.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::error::Result;

/// How long dropping a [`Workers`] waits for its threads to end. They end as soon as they finish
/// the job in hand, which a store that is being dropped has none of; the bound only keeps a drop
/// from hanging should one never end.
const JOIN_WAIT: Duration = Duration::from_secs(10);

/// Threads kept for splitting calls' work ([`map_in_runs`]), shared by every call of one store.
/// A call borrows the idle ones it can use and runs the rest of its work itself: it never waits
/// for another call's work, whatever the number of callers.
pub(crate) struct Workers {
    /// How many threads the pool has once started.
    threads: usize,
    /// The pool, started by the first call that splits its work (`None` inside when it could not
    /// be started: every call then runs on its own thread).
    pool: OnceLock<Option<Pool>>,
    /// Threads of the pool not lent to a call.
    idle: AtomicUsize,
    /// Threads of the pool that have ended.
    ended: Arc<AtomicUsize>,
}

/// A started pool and the way to know when its threads have ended.
struct Pool {
    pool: Option<rayon_core::ThreadPool>,
    /// One message from each thread as it ends.
    ended: crossbeam_channel::Receiver<()>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else { return };
        // A thread of the pool cannot wait for its own end: dropped there (never by this crate,
        // whose jobs only borrow the store), the threads end on their own.
        let threads = if pool.current_thread_index().is_some() {
            0
        } else {
            pool.current_num_threads()
        };
        drop(pool);
        for _ in 0..threads {
            if self.ended.recv_timeout(JOIN_WAIT).is_err() {
                tracing::warn!("a worker thread did not end within {JOIN_WAIT:?} of the store's close");
                break;
            }
        }
    }
}

impl Workers {
    /// A pool of `threads` threads (none for 0), not started yet.
    pub(crate) fn new(threads: usize) -> Workers {
        Workers {
            threads,
            pool: OnceLock::new(),
            idle: AtomicUsize::new(threads),
            ended: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The pool, started now if it was not.
    fn pool(&self) -> Option<&rayon_core::ThreadPool> {
        if self.threads == 0 {
            return None;
        }
        self.pool
            .get_or_init(|| {
                let (sender, receiver) = crossbeam_channel::unbounded::<()>();
                let ended = Arc::clone(&self.ended);
                let built = rayon_core::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|k| format!("ctxlog-work-{k}"))
                    .exit_handler(move |_| {
                        ended.fetch_add(1, Ordering::AcqRel);
                        // The receiver lives as long as the pool: a failed send has no one to tell.
                        let _ = sender.send(());
                    })
                    .build();
                match built {
                    Ok(pool) => Some(Pool {
                        pool: Some(pool),
                        ended: receiver,
                    }),
                    Err(e) => {
                        tracing::debug!("starting the worker threads failed, calls run on their own threads: {e}");
                        None
                    }
                }
            })
            .as_ref()
            .and_then(|pool| pool.pool.as_ref())
    }

    /// Lends up to `wanted` idle threads to a call, until the returned loan is dropped.
    fn lend(&self, wanted: usize) -> Loan<'_> {
        let none = Loan {
            workers: self,
            pool: None,
            threads: 0,
        };
        if wanted == 0 {
            return none;
        }
        let Some(pool) = self.pool() else { return none };
        // The closure always gives a value: the update cannot fail, and the fallback lends none.
        let idle = self
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |idle| {
                Some(idle - idle.min(wanted))
            })
            .unwrap_or(0);
        Loan {
            workers: self,
            pool: Some(pool),
            threads: idle.min(wanted),
        }
    }

    /// Whether the pool's threads were started.
    #[cfg(test)]
    fn started(&self) -> bool {
        self.pool.get().is_some_and(Option::is_some)
    }
}

/// Threads of a [`Workers`] lent to one call; given back when dropped (a panic included).
struct Loan<'a> {
    workers: &'a Workers,
    pool: Option<&'a rayon_core::ThreadPool>,
    threads: usize,
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        self.workers.idle.fetch_add(self.threads, Ordering::AcqRel);
    }
}

/// Maps `f` over `items`, in order, on up to `threads` threads: the calling one and idle threads
/// of `workers`, each taking a contiguous run of at least `min_run` items (fewer items than twice
/// that stay on the calling thread). Each run has its own `S` (scratch space that `f` reuses from
/// one item to the next). When the workers are busy with other calls, fewer runs are made (one,
/// on the calling thread, when none is idle).
///
/// Returns the mapped items in order, or the error of the first position that failed: the same
/// answer as mapping them one by one. A panic in any run is resumed on the calling thread once
/// every run has ended. `f` takes its item as `&mut X`, so a run's items are where they were until
/// `f` sees them. `end` runs on each run's mapped items once the run has mapped them all (not after
/// a failed item), on the run's own thread: work on the mapped items that is shared out as the
/// mapping is ([`no_end`] for none).
pub(crate) fn map_in_runs<X, Y, S, F, E>(
    items: &mut [X],
    threads: usize,
    min_run: usize,
    workers: &Workers,
    f: &F,
    end: &E,
) -> Result<Vec<Y>>
where
    X: Send,
    Y: Send,
    S: Default,
    F: Fn(&mut S, usize, &mut X) -> Result<Y> + Sync,
    E: Fn(&mut [Y]) + Sync,
{
    // Each run's output is allocated once, with room for `capacity` items: the first run's for
    // the whole output, which the other runs' are appended to.
    let run = |base: usize, run_items: &mut [X], capacity: usize| -> Result<Vec<Y>> {
        let mut scratch = S::default();
        let mut out = Vec::with_capacity(capacity.max(run_items.len()));
        for (offset, item) in run_items.iter_mut().enumerate() {
            out.push(f(&mut scratch, base + offset, item)?);
        }
        end(&mut out);
        Ok(out)
    };
    let wanted = threads.min(items.len() / min_run.max(1)).max(1);
    let loan = workers.lend(wanted - 1);
    let (Some(pool), lent @ 1..) = (loan.pool, loan.threads) else {
        return run(0, items, items.len());
    };
    let len = items.len();
    let per_thread = len.div_ceil(lent + 1);
    // The lent threads' runs, each set by its job.
    let others: Vec<Mutex<Option<Result<Vec<Y>>>>> = (0..lent).map(|_| Mutex::new(None)).collect();
    let mut first = None;
    pool.in_place_scope(|scope| {
        let mut runs = items.chunks_mut(per_thread).enumerate();
        let first_run = runs.next();
        for ((k, run_items), slot) in runs.zip(&others) {
            scope.spawn(move |_| {
                let part = run(k * per_thread, run_items, 0);
                *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(part);
            });
        }
        first = first_run.map(|(_, run_items)| run(0, run_items, len));
    });
    drop(loan);
    // The first run's items stay where they were mapped (no copy of half the output or more): the
    // others are appended to them, in order; the first error by position wins.
    let mut mapped = first.unwrap_or_else(|| Ok(Vec::new()))?;
    for slot in others {
        // Every job of the scope has run when it ends (a panic would have been resumed): an empty
        // slot is a run with no items.
        if let Some(part) = slot.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            mapped.extend(part?);
        }
    }
    Ok(mapped)
}

/// The `end` of a [`map_in_runs`] with nothing to do once a run is mapped.
pub(crate) fn no_end<Y>(_: &mut [Y]) {}

/// Frees a large buffer on another thread: unmapping a few hundred MiB takes tens of milliseconds
/// that opening need not wait for.
pub(crate) fn drop_in_background<T: Send + 'static>(value: T) {
    // When no thread can be started, the closure, and the value with it, is dropped right here.
    let _ = std::thread::Builder::new()
        .name("ctxlog-free".into())
        .spawn(move || drop(value));
}

#[cfg(test)]
mod tests {
    use super::{map_in_runs, no_end, Workers};
    use crate::error::Error;
    use std::sync::Mutex;

    /// Maps positions `0..len` and returns the output and each run's (first position, thread).
    fn mapped_runs(
        len: usize,
        threads: usize,
        min_run: usize,
        workers: &Workers,
    ) -> (Vec<usize>, Vec<(usize, std::thread::ThreadId)>) {
        let mut items: Vec<usize> = (0..len).collect();
        let runs = Mutex::new(Vec::new());
        let mapped = map_in_runs(
            &mut items,
            threads,
            min_run,
            workers,
            &|seen: &mut Vec<usize>, at, x: &mut usize| {
                assert_eq!(at, *x, "a run's positions are the items' own");
                if seen.is_empty() {
                    runs.lock().expect("runs").push((at, std::thread::current().id()));
                }
                seen.push(at);
                Ok(*x * 1000 + seen.len())
            },
            &no_end,
        )
        .expect("no item fails");
        assert_eq!(mapped.len(), len);
        assert!(mapped.iter().enumerate().all(|(at, y)| y / 1000 == at), "{mapped:?}");
        let mut runs = runs.into_inner().expect("runs");
        runs.sort_unstable_by_key(|run| run.0);
        (mapped, runs)
    }

    #[test]
    fn runs_map_in_order_on_as_many_threads_as_asked_and_no_more_than_the_items_allow() {
        for (len, threads, min_run, expect_runs) in [
            (0, 4, 8, 0),
            (15, 4, 8, 1),
            (16, 4, 8, 2),
            (100, 4, 8, 4),
            (100, 1, 8, 1),
            (7, 3, 1, 3),
        ] {
            let workers = Workers::new(threads - 1);
            let (_, runs) = mapped_runs(len, threads, min_run, &workers);
            assert_eq!(runs.len(), expect_runs, "len {len} threads {threads}");
            // The first run is the calling thread's; the others are the workers'.
            if let Some((_, thread)) = runs.first() {
                assert_eq!(*thread, std::thread::current().id());
            }
            assert!(
                runs.iter()
                    .skip(1)
                    .all(|(_, thread)| *thread != std::thread::current().id()),
                "len {len} threads {threads}: {runs:?}"
            );
            assert_eq!(
                workers.started(),
                expect_runs > 1,
                "started only by a call that splits its work"
            );
        }
    }

    #[test]
    fn a_call_uses_only_idle_workers_and_runs_alone_when_none_is() {
        let workers = Workers::new(1);
        let loan = workers.lend(1);
        assert_eq!(loan.threads, 1);
        // The one worker is lent to another call: this one maps all on its own thread, at once.
        let (_, runs) = mapped_runs(100, 2, 8, &workers);
        assert_eq!(runs.len(), 1);
        assert_eq!(runs.first().map(|run| run.1), Some(std::thread::current().id()));
        assert_eq!(workers.lend(1).threads, 0, "a busy pool lends nothing");
        drop(loan);
        let (_, runs) = mapped_runs(100, 2, 8, &workers);
        assert_eq!(runs.len(), 2, "the worker given back is used again");
        // A call asking for more threads than the pool has gets what there is.
        let (_, runs) = mapped_runs(100, 4, 8, &workers);
        assert_eq!(runs.len(), 2);
    }

    #[test]
    fn a_panicking_run_reaches_the_caller_after_every_run_ended_and_gives_its_worker_back() {
        let workers = Workers::new(1);
        let mut items: Vec<usize> = (0..100).collect();
        let ended = Mutex::new(0usize);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            map_in_runs(
                &mut items,
                2,
                8,
                &workers,
                &|_: &mut (), at, _x: &mut usize| {
                    assert_ne!(at, 70, "position 70 panics, in the worker's run");
                    *ended.lock().expect("ended") += 1;
                    Ok(at)
                },
                &no_end,
            )
        }));
        assert!(result.is_err(), "the worker's panic is resumed on the caller");
        // The caller's run (0..50) ended before the panic was resumed; the worker's stopped at 70.
        assert_eq!(*ended.lock().expect("ended"), 70);
        let (_, runs) = mapped_runs(100, 2, 8, &workers);
        assert_eq!(runs.len(), 2, "the worker was given back");
    }

    #[test]
    fn dropping_the_workers_joins_their_threads() {
        let workers = Workers::new(2);
        let (_, runs) = mapped_runs(300, 3, 8, &workers);
        assert_eq!(runs.len(), 3);
        let ended = std::sync::Arc::clone(&workers.ended);
        assert_eq!(
            ended.load(std::sync::atomic::Ordering::Acquire),
            0,
            "the threads are kept"
        );
        drop(workers);
        // The drop returned only once every thread had ended.
        assert_eq!(ended.load(std::sync::atomic::Ordering::Acquire), 2);
    }

    #[test]
    fn the_end_of_each_run_sees_that_run_s_mapped_items_once_on_the_run_s_thread() {
        let workers = Workers::new(3);
        for (len, threads) in [(0, 4), (15, 4), (100, 4), (100, 1), (1000, 3)] {
            let mut items: Vec<usize> = (0..len).collect();
            let mapper = Mutex::new(Vec::new());
            let ends = Mutex::new(Vec::new());
            let mapped = map_in_runs(
                &mut items,
                threads,
                8,
                &workers,
                &|_: &mut (), at, x: &mut usize| {
                    mapper.lock().expect("mapper").push((at, std::thread::current().id()));
                    Ok((*x, false))
                },
                &|run: &mut [(usize, bool)]| {
                    for (_, ended) in run.iter_mut() {
                        *ended = true;
                    }
                    let first = run.first().map(|(at, _)| *at);
                    ends.lock()
                        .expect("ends")
                        .push((first, run.len(), std::thread::current().id()));
                },
            )
            .expect("no item fails");
            assert_eq!(mapped, (0..len).map(|at| (at, true)).collect::<Vec<_>>());
            let mapper = mapper.into_inner().expect("mapper");
            let mut ends = ends.into_inner().expect("ends");
            ends.sort_unstable_by_key(|(first, _, _)| *first);
            // One end per run (a run of no items still ends), the runs back to back, each ended on
            // the thread that mapped its first item.
            let mut next = 0;
            for (first, run_len, thread) in &ends {
                if let Some(first) = first {
                    assert_eq!(*first, next, "len {len}: {ends:?}");
                    let mapped_by = mapper.iter().find(|(at, _)| at == first).map(|(_, t)| *t);
                    assert_eq!(mapped_by, Some(*thread), "len {len} run at {first}");
                }
                next += run_len;
            }
            assert_eq!(next, len);
            assert!(!ends.is_empty());
        }
    }

    #[test]
    fn the_first_failing_position_decides_the_error_whichever_run_fails_first() {
        let workers = Workers::new(3);
        let mut items: Vec<usize> = (0..1000).collect();
        // Positions 900 and 300 fail; the later run's failure comes sooner in its own run.
        let result: Result<Vec<usize>, Error> = map_in_runs(
            &mut items,
            4,
            10,
            &workers,
            &|_: &mut (), at, _x: &mut usize| {
                if at == 300 || at == 900 {
                    Err(Error::invalid("item", format!("position {at}")))
                } else {
                    Ok(at)
                }
            },
            &no_end,
        );
        let message = result.expect_err("two positions fail").to_string();
        assert!(message.contains("position 300"), "{message}");
    }
}
