//! [`Subscription`]: a live stream of changes, first replaying the durable history a filter asks
//! for (read from the log with [`Changes`]), then delivering what its hub queues.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::change::Change;
use super::feed::Changes;
use super::hub::{Hub, Subscriber};
use crate::error::{Error, Result};

/// How long a replayed change that is not durable yet waits before its durability is looked at
/// again (`Durability::Periodic`).
const DURABLE_RECHECK: Duration = Duration::from_millis(2);

/// How a call waits for the next change.
#[derive(Clone, Copy)]
enum Wait {
    Forever,
    Until(Instant),
    Never,
}

/// A live stream of the store's changes, from [`crate::Store::subscribe`] or
/// [`crate::SessionView::subscribe`], in sequence order, each once.
///
/// With [`ChangeFilter::after`](crate::ChangeFilter::after), it first replays the durable changes
/// committed after that seq, then continues with the live ones, with no gap and no duplicate.
/// A change is delivered only once it is durable and visible to reads: under
/// [`Durability::Periodic`](crate::Durability::Periodic) it waits for the writer's next sync;
/// under `Durability::Never`, which promises no durability, it is delivered once visible.
///
/// # Lag
/// A subscriber with more than [`Options::subscription_buffer`](crate::Options::subscription_buffer)
/// live changes queued and not received (the replayed history does not count) is lagged: nothing
/// more is queued to it, and its next calls return the rest of the batch it is in the middle of
/// (so that it ends a batch whole), then [`Error::Lagged`] with `resume_after`, the seq of the
/// last batch it received whole. Every later call returns the same `Lagged` error. Subscribing
/// again with `after(resume_after)` loses nothing and receives nothing twice, while that history
/// is kept ([`crate::Store::history_start`]).
///
/// # Resuming
/// Every change of one batch carries that batch's `seq`, and a batch's changes come one after
/// another, in order. A subscriber that records what it received and may stop in the middle of a
/// batch (a crash between two of its changes) resumes after the last batch it recorded whole: it
/// drops what it holds of its last seq and subscribes with `after` the seq before, receiving that
/// batch again whole. Expiries ([`Change::Expired`](crate::Change::Expired)) are live news only and
/// are not replayed.
///
/// # Closing
/// Once the store closes (its last handle dropped), a subscription returns the changes already
/// queued to it, then [`Error::Closed`] (a call blocked in [`Subscription::recv`] wakes with it);
/// the replay of the history stops there. Dropping a subscription unsubscribes it.
pub struct Subscription {
    hub: Arc<Hub>,
    subscriber: Arc<Subscriber>,
    /// The replay of the history, until it is done.
    replay: Option<Changes>,
    /// The next replayed change that passes the filter, read ahead.
    replay_next: Option<Change>,
    /// The seq of the last change delivered (at first, where the subscription starts).
    last_seq: u64,
    /// Set once the subscription ended lagged: the seq to resume after.
    resume_after: Option<u64>,
    /// Set once a replay read failed: every later call is `Closed`.
    failed: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("filter", &self.subscriber.filter)
            .field("session", &self.subscriber.session)
            .field("last_seq", &self.last_seq)
            .field("replaying", &self.replay.is_some())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// A subscription registered with `hub` as `subscriber`, starting after `start` (the
    /// subscriber's `live_after`, unless a replay is given: see [`Subscription::replay`]).
    pub(crate) fn new(hub: Arc<Hub>, subscriber: Arc<Subscriber>, start: u64) -> Self {
        Subscription {
            hub,
            subscriber,
            replay: None,
            replay_next: None,
            last_seq: start,
            resume_after: None,
            failed: false,
        }
    }

    /// Replays `changes` before the live ones.
    pub(crate) fn replay(&mut self, changes: Changes) {
        self.replay = Some(changes);
    }

    /// The next change, waiting for one as long as it takes.
    ///
    /// # Errors
    /// `Lagged` once the subscriber fell too far behind (see [`Subscription`], "Lag"); `Closed`
    /// once the store closed; `Corrupt` if the replayed history cannot be read (the subscription
    /// then ends: later calls are `Closed`).
    pub fn recv(&mut self) -> Result<Change> {
        self.next(Wait::Forever)?.ok_or(Error::Closed)
    }

    /// The next change, waiting at most `timeout` for one: `None` if none came.
    ///
    /// # Errors
    /// As [`Subscription::recv`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Change>> {
        let wait = Instant::now().checked_add(timeout).map_or(Wait::Forever, Wait::Until);
        self.next(wait)
    }

    /// The next change if one is ready, without waiting.
    ///
    /// # Errors
    /// As [`Subscription::recv`].
    pub fn try_recv(&mut self) -> Result<Option<Change>> {
        self.next(Wait::Never)
    }

    /// Whether the dispatcher has found this subscriber lagging (for tests, which otherwise could
    /// only guess when the dispatcher, a thread of its own, has caught up).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    #[must_use]
    pub fn is_lagged(&self) -> bool {
        self.resume_after.is_some() || self.subscriber.queue().lagged
    }

    fn next(&mut self, wait: Wait) -> Result<Option<Change>> {
        loop {
            if let Some(resume_after) = self.resume_after {
                return Err(Error::Lagged { resume_after });
            }
            if self.failed {
                return Err(Error::Closed);
            }
            if self.replay.is_some() {
                if let Some(change) = self.next_replayed(wait)? {
                    return Ok(Some(change));
                }
                if self.replay.is_some() {
                    // Not durable yet, and the wait is over.
                    return Ok(None);
                }
                continue;
            }
            return self.next_live(wait);
        }
    }

    /// The next change of the replay: `None` when the replay is done (`replay` is then `None`) or
    /// when its next change is not durable yet and `wait` is over.
    fn next_replayed(&mut self, wait: Wait) -> Result<Option<Change>> {
        let change = match self.replay_next.take() {
            Some(change) => change,
            None => match self.read_replay() {
                Ok(Some(change)) => change,
                Ok(None) => {
                    self.replay = None;
                    return Ok(None);
                }
                Err(e) => {
                    self.replay = None;
                    self.failed = true;
                    return Err(e);
                }
            },
        };
        let seq = change.seq().unwrap_or(self.last_seq);
        let (lagged, closed) = {
            let queue = self.subscriber.queue();
            (queue.lagged, queue.closed)
        };
        if closed {
            self.failed = true;
            return Err(Error::Closed);
        }
        if lagged && seq != self.last_seq {
            self.resume_after = Some(self.last_seq);
            return Err(Error::Lagged {
                resume_after: self.last_seq,
            });
        }
        while self.hub.holds() && seq > self.hub.durable() {
            let pause = match wait {
                Wait::Never => None,
                Wait::Forever => Some(DURABLE_RECHECK),
                Wait::Until(deadline) => Some(deadline.saturating_duration_since(Instant::now()).min(DURABLE_RECHECK))
                    .filter(|pause| !pause.is_zero()),
            };
            let Some(pause) = pause else {
                self.replay_next = Some(change);
                return Ok(None);
            };
            let queue = self.subscriber.queue();
            if queue.closed {
                self.failed = true;
                return Err(Error::Closed);
            }
            drop(
                self.subscriber
                    .ready
                    .wait_timeout(queue, pause)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
        self.last_seq = seq;
        Ok(Some(change))
    }

    /// The next replayed change that passes the filter.
    fn read_replay(&mut self) -> Result<Option<Change>> {
        let Some(replay) = self.replay.as_mut() else {
            return Ok(None);
        };
        while let Some(next) = replay.next_with_kind() {
            let (change, kind) = next?;
            if self
                .subscriber
                .filter
                .matches(&change, kind.as_deref(), None, self.subscriber.session.as_deref())
            {
                return Ok(Some(change));
            }
        }
        Ok(None)
    }

    /// The next live change, waiting as `wait` says.
    fn next_live(&mut self, wait: Wait) -> Result<Option<Change>> {
        let mut queue = self.subscriber.queue();
        loop {
            if queue.lagged {
                // The rest of the batch it is in the middle of, then the end.
                if queue.changes.front().and_then(|change| change.seq()) == Some(self.last_seq) {
                    return Ok(queue.changes.pop_front().map(Arc::unwrap_or_clone));
                }
                queue.changes = std::collections::VecDeque::new();
                self.resume_after = Some(self.last_seq);
                return Err(Error::Lagged {
                    resume_after: self.last_seq,
                });
            }
            if let Some(change) = queue.changes.pop_front() {
                if let Some(seq) = change.seq() {
                    self.last_seq = seq;
                }
                // The last subscriber to take a change takes it without a copy.
                return Ok(Some(Arc::unwrap_or_clone(change)));
            }
            if queue.closed {
                return Err(Error::Closed);
            }
            // Counted as waiting while it waits (the lock is held on both sides of the wait), so
            // that the dispatcher wakes it.
            queue = match wait {
                Wait::Never => return Ok(None),
                Wait::Forever => {
                    self.subscriber.waiting.fetch_add(1, Ordering::Relaxed);
                    let queue = self
                        .subscriber
                        .ready
                        .wait(queue)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    self.subscriber.waiting.fetch_sub(1, Ordering::Relaxed);
                    queue
                }
                Wait::Until(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    self.subscriber.waiting.fetch_add(1, Ordering::Relaxed);
                    let queue = self
                        .subscriber
                        .ready
                        .wait_timeout(queue, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                    self.subscriber.waiting.fetch_sub(1, Ordering::Relaxed);
                    queue
                }
            };
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unregister(&self.subscriber);
    }
}
