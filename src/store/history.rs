//! The store's history: its last sequence number, and the change feed.

use std::sync::Arc;

use super::Store;
use crate::engine::history::expiry::Expiries;
use crate::engine::history::feed::Changes;
use crate::engine::history::filter::ChangeFilter;
use crate::engine::history::hub::Subscriber;
use crate::engine::history::past;
use crate::engine::history::subscription::Subscription;
use crate::error::{Error, Result};
use crate::snapshot::Snapshot;

impl Store {
    /// The sequence number of the last batch committed and visible to reads (0 for an empty store).
    #[must_use]
    pub fn last_seq(&self) -> u64 {
        self.inner.shared.read_index().seq
    }

    /// Every change committed after sequence number `after`, in sequence order, each exactly once:
    /// an iterator over the log as it stands now (it ends at [`Store::last_seq`] as of this call).
    /// A client that remembers the last `seq` it has seen resumes with it, across restarts of
    /// either side, missing nothing and receiving nothing twice, as long as that history is kept
    /// ([`Store::history_start`]). [`Change::Expired`](crate::Change::Expired) is never in it.
    ///
    /// Under [`Durability::Immediate`](crate::Durability::Immediate) every change it yields is
    /// durable; under `Periodic` or `Never`, as with `get`, a change may be visible (and so in the
    /// feed) before it is durable, and a power cut may take it back.
    ///
    /// # Errors
    /// `HistoryCompacted` when `after` is below [`Store::history_start`]; `Invalid` (field `after`)
    /// when it is past [`Store::last_seq`]. An item of the iterator is `Corrupt` if a frame it
    /// reads is damaged (the iterator ends there).
    pub fn changes(&self, after: u64) -> Result<Changes> {
        let shared = &self.inner.shared;
        let (parts, last) = shared.log_parts();
        if after > last {
            return Err(Error::invalid(
                "after",
                format!("{after} is past the store's last sequence number {last}"),
            ));
        }
        let start = shared.history.start(&parts, last)?;
        if after < start {
            return Err(Error::HistoryCompacted {
                oldest_available: start,
            });
        }
        Ok(Changes::new(parts, after, last))
    }

    /// The smallest `after` that [`Store::changes`] accepts: 0 while the log holds every change
    /// since the store was created; never above [`Store::last_seq`]. Compaction moves it past the
    /// changes whose records it removed; the history of a store written by a build older than
    /// segment format 3 starts after the last batch that build wrote.
    ///
    /// # Errors
    /// `Corrupt` if a segment that compaction rewrote cannot be read.
    pub fn history_start(&self) -> Result<u64> {
        let shared = &self.inner.shared;
        let (parts, last) = shared.log_parts();
        shared.history.start(&parts, last)
    }

    /// A live stream of the store's changes that pass `filter`, in sequence order, each once: see
    /// [`Subscription`]. Without [`ChangeFilter::after`] it delivers the changes committed from
    /// now on; with `after(seq)`, first every durable change after `seq` (read lazily from the
    /// log, as [`Store::changes`]), then the live ones, with no gap and no duplicate.
    ///
    /// # Errors
    /// `HistoryCompacted` when `after` is below [`Store::history_start`]; `Invalid` (field
    /// `after`) when it is past [`Store::last_seq`]; `Closed` if the store is closing; `Io` if the
    /// subscriptions' thread cannot be started.
    pub fn subscribe(&self, filter: ChangeFilter) -> Result<Subscription> {
        self.subscribe_as(filter, None)
    }

    /// [`Store::subscribe`] for a reader restricted to `session`.
    pub(super) fn subscribe_as(&self, filter: ChangeFilter, session: Option<Arc<str>>) -> Result<Subscription> {
        let shared = &self.inner.shared;
        let after = filter.after;
        // The replay's end and the live start meet at the seq read under the index's lock: no
        // batch is published while it is held.
        let index = shared.read_index();
        let last = index.seq;
        let parts = after.map(|_| shared.log_parts_of(&index));
        let subscriber = Arc::new(Subscriber::new(filter, session, last));
        if let Some(after) = after.filter(|after| *after > last) {
            return Err(Error::invalid(
                "after",
                format!("{after} is past the store's last sequence number {last}"),
            ));
        }
        let now = shared.clock.now();
        let watch = || Expiries::build(&index, now);
        match shared
            .hub
            .register(Arc::clone(&subscriber), Arc::downgrade(shared), watch)
        {
            Ok(Some(())) => {}
            Ok(None) => return Err(Error::Closed),
            Err(e) => return Err(Error::io("starting the subscriptions' thread", e)),
        }
        drop(index);
        let hub = Arc::clone(&shared.hub);
        let (Some(after), Some(parts)) = (after, parts) else {
            return Ok(Subscription::new(hub, subscriber, last));
        };
        // Dropped on an error, the subscription unregisters.
        let mut subscription = Subscription::new(hub, subscriber, after);
        let start = shared.history.start(&parts, last)?;
        if after < start {
            return Err(Error::HistoryCompacted {
                oldest_available: start,
            });
        }
        subscription.replay(Changes::new(parts, after, last));
        Ok(subscription)
    }

    /// Announces to the live subscriptions, at once, every [`Change::Expired`](crate::Change::Expired)
    /// the store's clock has reached and that was not announced yet (the background thread does the
    /// same within about a second; this is for [`ManualClock`](crate::ManualClock) users and
    /// tests), after every change committed before the call. Returns how many it announced,
    /// whether or not a filter let them through: 0 while nobody subscribes, as expiries are
    /// watched only for subscribers (an expiry that fell due before the first subscription is
    /// never announced).
    ///
    /// # Errors
    /// None today; a `Result` so that the session timeouts it will also judge can report theirs.
    pub fn expire_due(&self) -> Result<usize> {
        Ok(self.inner.shared.hub.expire_due())
    }

    /// The store as it stood right after batch `seq` committed, judging TTL at that batch's commit
    /// time: an ordinary [`Snapshot`] (get, resolve, query, pin, digest) that answers exactly what
    /// the store answered then, byte for byte. Seq 0 is the empty store before the first batch.
    ///
    /// Every moment less than [`Options::history_retention`](crate::Options::history_retention)
    /// ago is answered; an older one while compaction has reclaimed nothing the view would show
    /// (compaction keeps a floor below which it may have: views of the past reach back to it, and
    /// only to it).
    ///
    /// # Errors
    /// `Invalid` (field `seq`) past [`Store::last_seq`]; `HistoryCompacted` when compaction may
    /// have reclaimed something the view would show, or the log no longer holds the batch's commit
    /// time (it was left out by compaction, or written by a build older than segment format 3),
    /// with `oldest_available` the seq the floor stands at; `Corrupt` if a frame's header or sync
    /// mark cannot be read.
    pub fn snapshot_at(&self, seq: u64) -> Result<Snapshot> {
        let shared = &self.inner.shared;
        let (parts, last) = shared.log_parts();
        if seq > last {
            return Err(Error::invalid(
                "seq",
                format!("{seq} is past the store's last sequence number {last}"),
            ));
        }
        let Some(committed_at) = past::commit_time(&parts, seq)? else {
            return Err(Error::HistoryCompacted {
                oldest_available: shared.floor().seq,
            });
        };
        Snapshot::of_past(shared, seq, committed_at)
    }

    /// The store as it stood at time `t` (the store's clock, UTC seconds): as of the last batch
    /// committed at or before `t`, judging TTL at `t`. As [`Store::snapshot_at`] otherwise.
    ///
    /// # Errors
    /// `Invalid` (field `t`) past the clock's now; `HistoryCompacted` as [`Store::snapshot_at`],
    /// and when the log cannot tell which batch was the last by `t` (frames around it were left
    /// out by compaction, or have no commit time); `Corrupt` if a frame's header or sync mark
    /// cannot be read.
    pub fn snapshot_as_of(&self, t: i64) -> Result<Snapshot> {
        let shared = &self.inner.shared;
        let now = shared.clock.now();
        if t > now {
            return Err(Error::invalid(
                "t",
                format!("{t} is past the store's clock, which reads {now}"),
            ));
        }
        let (parts, last) = shared.log_parts();
        let Ok(seq) = past::seq_as_of(&parts, last, t)? else {
            return Err(Error::HistoryCompacted {
                oldest_available: shared.floor().seq,
            });
        };
        Snapshot::of_past(shared, seq, t)
    }
}
