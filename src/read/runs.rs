//! Reading many items on several threads: a read's [`Reader`] is the worker pool it may borrow
//! threads from and how many it may use (`Options::read_threads`). It holds no index: a read
//! releases the index lock part way (see `read::walk::run_query`, `read::resolve::resolve`), so
//! the index guard is handed to those functions by value.

use crate::error::Result;
use crate::limits::PARALLEL_READ_ITEMS_MIN;
use crate::parallel::{map_in_runs, no_end, Workers};

/// The threads a read may run its items' work on.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    /// The pool helper threads are borrowed from.
    pub(crate) workers: &'a Workers,
    /// The most threads one read uses, the calling one included (`Options::read_threads`).
    pub(crate) threads: usize,
}

impl Reader<'_> {
    /// Maps `f` over the items of one read, in order, on up to `threads` threads when there are
    /// enough of them ([`map_in_runs`]); each run has its own `S` (a scratch buffer).
    pub(crate) fn in_runs<X: Send, Y: Send, S: Default>(
        &self,
        items: &mut [X],
        f: &(dyn Fn(&mut S, &mut X) -> Result<Y> + Sync),
    ) -> Result<Vec<Y>> {
        self.in_runs_at(items, &|scratch: &mut S, _, item: &mut X| f(scratch, item))
    }

    /// As [`Reader::in_runs`], `f` also given each item's position among `items`.
    pub(crate) fn in_runs_at<X: Send, Y: Send, S: Default>(
        &self,
        items: &mut [X],
        f: &(dyn Fn(&mut S, usize, &mut X) -> Result<Y> + Sync),
    ) -> Result<Vec<Y>> {
        map_in_runs(
            items,
            self.threads,
            PARALLEL_READ_ITEMS_MIN,
            self.workers,
            &|scratch: &mut S, at, item: &mut X| f(scratch, at, item),
            &no_end,
        )
    }
}
