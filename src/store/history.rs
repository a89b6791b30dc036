//! The store's history: its last sequence number, and the change feed.

use super::Store;
use crate::engine::history::feed::Changes;
use crate::error::{Error, Result};

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
            return Err(Error::HistoryCompacted { oldest_available: start });
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
}
