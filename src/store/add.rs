//! The add path of [`Store`]: the batch collected and checked (on idle worker threads when it is
//! large), handed to the writer thread, and answered; what is left of a large batch is then freed
//! off the caller's way, by the store's free thread or by the next add.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::commands::{Answer, Op, OpOutcome};
use crate::engine::shared::{Garbage, Shared, Writing, LEFTOVER_ITEMS_MAX, QUICK_ADD_ITEMS};
use crate::error::{Error, Result};
use crate::item::ContextItem;
use crate::limits::{BATCH_ITEMS_MAX, PARALLEL_ADD_ITEMS_MIN};
use crate::log::put::{validate_item, ValidItem};
use crate::read::view::check_scope_writable;
use crate::store::{AddOutcome, Store};

/// How long the free thread waits before it frees a batch's leftovers: the caller's own frees come
/// right after the answer (the outcomes' ids and versions, ~2,000 strings per 1,000 items), and
/// while the free thread frees the same allocator arena's memory the two take turns at its lock.
/// Dropping a W1 answer of 1,000 outcomes took 178-228 us beside the free thread against 53-86 us
/// with this wait, and bulk loads were 3-9% faster in four paired runs (docs/BENCHMARKS.md).
const FREE_GRACE: Duration = Duration::from_micros(300);

/// Whether an `add` of `items` leaves what is left of them to be freed later: a batch large
/// enough to be validated on several threads, and not so large that keeping it holds much memory.
/// A small batch frees its few on the spot (its contents while it waits).
fn leaves_leftovers(items: usize) -> bool {
    (PARALLEL_ADD_ITEMS_MIN..=LEFTOVER_ITEMS_MAX).contains(&items)
}

impl Store {
    /// [`Store::add`], for the store itself or (`session`) for a [`SessionView`](crate::SessionView),
    /// whose items must be in scopes it may write.
    pub(super) fn add_checked<I: IntoIterator<Item = ContextItem>>(
        &self,
        items: I,
        session: Option<&Arc<str>>,
    ) -> Result<Vec<AddOutcome>> {
        let shared = &self.inner.shared;
        let registry = shared.registry();
        let max_content = self.inner.options.max_content_bytes;
        let compress = self.inner.options.compress_content;
        let mut batch = collect_batch(items)?;
        // A small batch counts as writing from now: it is validated in microseconds, and the writer
        // thread may wait for it. A large one only once it is validated and sent, so that nobody
        // waits for its validation.
        let mut writing = (batch.len() <= QUICK_ADD_ITEMS).then(|| Writing::enter(&shared.writers));
        let check = |position: usize, item: ContextItem| -> Result<ValidItem> {
            if let Some(session) = session {
                check_scope_writable(&item.scope, session).map_err(|e| e.at(position))?;
            }
            validate_item(item, &registry, max_content, compress).map_err(|e| e.at(position))
        };
        let mut ops = validate_batch(&mut batch, self.inner.options.add_threads, shared, &check)?;
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        // The contents are in the records now, and the writer thread never reads the trees. A
        // small batch takes them out to free them here while it is written and synced; a large
        // one leaves them in its items, which go whole to the free thread once answered (no pass
        // over the batch to take them out, no array of them).
        let leave = leaves_leftovers(ops.len());
        let free_now = if leave { Vec::new() } else { take_contents(&mut ops) };
        writing.get_or_insert_with(|| Writing::enter(&shared.writers));
        let Answer { outcomes, mut ops } = shared.submit_then(ops, session.cloned(), move || {
            drop(free_now);
            drop(shared.swap_leftovers(None));
        })?;
        let answered = answers(&mut ops, outcomes);
        if leave {
            self.leave(Garbage { ops });
        }
        Ok(answered)
    }

    /// Hands what an answered add left to the free thread (started here the first time), or, when
    /// it is busy or cannot start, keeps it for the next add to free while it waits. Another
    /// thread's leftovers found there are freed here.
    fn leave(&self, garbage: Garbage) {
        let freer = self.inner.freer.get_or_init(|| {
            let (sender, receiver) = crossbeam_channel::bounded::<Garbage>(1);
            let spawned = std::thread::Builder::new().name("ctxlog-drop".into()).spawn(move || {
                for garbage in receiver {
                    std::thread::sleep(FREE_GRACE);
                    drop(garbage);
                }
            });
            match spawned {
                Ok(handle) => Some((sender, handle)),
                Err(e) => {
                    tracing::debug!("starting the free thread failed: {e}");
                    None
                }
            }
        });
        let garbage = match freer {
            Some((sender, _)) => match sender.try_send(garbage) {
                Ok(()) => return,
                Err(e) => e.into_inner(),
            },
            None => garbage,
        };
        drop(self.inner.shared.swap_leftovers(Some(garbage)));
    }
}

/// The items of an add, collected in place when they come as a Vec (a move of ~200 KiB per 1,000
/// items saved); the run that checks an item takes it out of its slot. `TooLarge` once the batch
/// goes over [`BATCH_ITEMS_MAX`] items: no more than one item too many is taken.
fn collect_batch<I: IntoIterator<Item = ContextItem>>(items: I) -> Result<Vec<ContextItem>> {
    let batch: Vec<ContextItem> = items.into_iter().take(BATCH_ITEMS_MAX + 1).collect();
    if batch.len() > BATCH_ITEMS_MAX {
        return Err(Error::TooLarge {
            what: "batch (items)".into(),
            len: BATCH_ITEMS_MAX as u64 + 1,
            max: BATCH_ITEMS_MAX as u64,
            index: None,
        });
    }
    Ok(batch)
}

/// Takes the content trees out of `ops`' puts, for the caller to free while the batch is written.
fn take_contents(ops: &mut [Op]) -> Vec<serde_json::Value> {
    ops.iter_mut()
        .filter_map(|op| match op {
            Op::Put(valid) => Some(std::mem::take(&mut valid.item.content)),
            _ => None,
        })
        .collect()
}

/// The answer to an add: each put's outcome with its id and version, which are taken out of `ops`;
/// the rest of the operations stay in place (no second array of ~300 KiB per 1,000 items).
fn answers(ops: &mut [Op], outcomes: Vec<OpOutcome>) -> Vec<AddOutcome> {
    let mut answered = Vec::with_capacity(ops.len());
    for (op, outcome) in ops.iter_mut().zip(outcomes) {
        let Op::Put(valid) = op else { continue };
        let id = std::mem::take(&mut valid.item.id);
        let version = std::mem::take(&mut valid.item.version);
        answered.push(match outcome {
            OpOutcome::Added { seq } => AddOutcome::Added { id, version, seq },
            _ => AddOutcome::Unchanged { id, version },
        });
    }
    answered
}

/// Runs `check` on every item of `batch` with its position, on up to `threads` threads (the calling
/// one and idle workers of `shared`), each taking a contiguous run. Returns the checked items in order, as the
/// writer's operations (built where each item is checked: no second pass over the batch), or the
/// error of the first refused position: the same answer as checking them one by one.
///
/// When the batch is split, each run also looks up its items' ids in the index once they are checked
/// ([`note_unknown_ids`]): a bulk load's new ids are then not looked up again on the writer thread,
/// whose steps run one after the other.
fn validate_batch<F>(slots: &mut [ContextItem], threads: usize, shared: &Shared, check: &F) -> Result<Vec<Op>>
where
    F: Fn(usize, ContextItem) -> Result<ValidItem> + Sync,
{
    // An item is taken out of its slot (which keeps an empty item, no allocation) by its check.
    let take = |position: usize, slot: &mut ContextItem| {
        check(position, std::mem::replace(slot, ContextItem::vacant())).map(Op::Put)
    };
    if threads.min(slots.len() / PARALLEL_ADD_ITEMS_MIN) <= 1 {
        return slots
            .iter_mut()
            .enumerate()
            .map(|(position, slot)| take(position, slot))
            .collect();
    }
    crate::parallel::map_in_runs(
        slots,
        threads,
        PARALLEL_ADD_ITEMS_MIN,
        &shared.workers,
        &|(): &mut (), position, slot: &mut ContextItem| take(position, slot),
        &|ops: &mut [Op]| note_unknown_ids(shared, ops),
    )
}

/// Ids looked up per lock of the index by [`note_unknown_ids`]: a writer waiting to apply a batch
/// waits for at most this many lookups.
const UNKNOWN_IDS_PER_LOCK: usize = 64;

/// Looks up the ids of `ops`' puts in the index and notes each one it does not know
/// ([`ValidItem::unknown_among`]), taking the index's read lock for a few ids at a time.
fn note_unknown_ids(shared: &Shared, ops: &mut [Op]) {
    for chunk in ops.chunks_mut(UNKNOWN_IDS_PER_LOCK) {
        let index = shared.read_index();
        let known = index.id_count();
        for op in chunk {
            if let Op::Put(valid) = op {
                valid.unknown_among = (!index.knows_id(&valid.item.id)).then_some(known);
            }
        }
    }
}
