//! The single writer thread and group commit.
//!
//! Writers hand whole batches to this thread over a channel. It takes everything that is waiting,
//! checks each batch against the index plus the batches before it in the same group, encodes one frame
//! per batch, appends them, fsyncs once (under `Durability::Immediate`), publishes them to the index
//! in sequence order, and only then answers every waiting writer. A failed write or fsync poisons the
//! store: every later write is refused and the fsync is never retried on this handle.
//!
//! A group of many puts (a bulk load) is applied to the index while its fsync runs, on a helper
//! thread, and published once the fsync succeeded: the index then briefly holds versions above its
//! sequence number, which no view sees (see [`crate::index::Unpublished`]).
//!
//! This file holds the commands and answers and the thread's loop; the steps of a group are in
//! [`plan`] (checking and encoding its batches), [`append`] (writing their frames into the active
//! segment), [`sync`] (its fsync and the helper threads beside it) and [`publish`] (applying it to
//! the index); [`notify`] hands a published group's changes to the live subscriptions.

mod append;
mod notify;
mod plan;
mod publish;
mod sync;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::engine::commands::{poll_then_recv, Answer, Command, Durability, Op, OpOutcome};
use crate::engine::shared::Shared;
use crate::error::{Error, Result};
use crate::log::record::BatchEncoder;
use crate::log::segment::{ActiveSegment, SEGMENT_HEADER_BYTES};

pub(crate) use sync::SyncHelpers;

/// Bytes of waiting batches one group takes at most before it is written.
const GROUP_BYTES_MAX: usize = 64 << 20;
/// How long the writer waits for threads still writing to join a group (see `Shared::writers`).
const GROUP_LINGER: std::time::Duration = std::time::Duration::from_micros(100);
/// How often a lingering writer thread looks again at how many threads are still writing: one that
/// got its answer and had nothing more to write ends the wait early.
const GROUP_RECHECK: std::time::Duration = std::time::Duration::from_micros(20);

/// How long the writer thread polls for the next command after a group of one write: its writer
/// usually sends the next batch within microseconds of its answer.
const LONE_POLL: std::time::Duration = std::time::Duration::from_micros(100);

/// Where one operation's record lies in its batch's frame. Operations that write nothing (an
/// unchanged item, a delete of an id without history, a known type) have none.
struct RecordSpan {
    /// The operation's position in its batch.
    op: usize,
    /// The record's offset from the frame start.
    start: usize,
    /// The record's length.
    len: usize,
}

impl RecordSpan {
    /// The span of the record operation `op` appended at `start` of `encoder`.
    #[inline]
    fn since(op: usize, start: usize, encoder: &BatchEncoder) -> Self {
        RecordSpan {
            op,
            start,
            len: encoder.len() - start,
        }
    }
}

/// A batch's frame (sequence number still to fill in) and where its records lie in it.
type EncodedBatch = (Vec<u8>, Vec<RecordSpan>);

/// A batch that passed its checks and waits to be written.
struct Staged {
    ops: Vec<Op>,
    outcomes: Vec<OpOutcome>,
    frame: Option<EncodedBatch>,
    reply: Sender<Result<Answer>>,
    seq: u64,
    /// The batch's commit time, as its frame's sync mark records it (set when it is written).
    committed_at: i64,
    location: Option<(u32, u64)>,
}

/// A group's commands once its batches are checked: the batches that passed, and the flushes and
/// rotations to answer once they are written.
struct Group {
    staged: Vec<Staged>,
    flushes: Vec<Sender<Result<()>>>,
    rotations: Vec<Sender<Result<bool>>>,
}

pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) dir: PathBuf,
    pub(crate) active: ActiveSegment,
    pub(crate) next_seq: u64,
    pub(crate) durability: Durability,
    pub(crate) segment_size: u64,
    pub(crate) poisoned: Option<String>,
    pub(crate) dirty: bool,
    pub(crate) last_sync: Instant,
    pub(crate) buffer: Vec<u8>,
    /// Bytes of the active segment known durable: its length at the last fsync that succeeded.
    /// Every frame carries it (its sync mark), so that recovery can tell a hole left by writes that
    /// never reached the disk from damage to synced bytes.
    pub(crate) synced_len: u64,
    /// The commit time of the last frame written (at open: of the log's last batch that records
    /// one, or of the checkpoint's; 0 when none does): the next frame's is never less, whatever
    /// the clock says.
    pub(crate) last_committed_at: i64,
    /// Write commands in the last group: how many to wait for in the next one.
    pub(crate) last_group_writes: usize,
    /// Threads kept for the work beside a bulk group's fsync.
    pub(crate) helpers: SyncHelpers,
}

impl Writer {
    /// Serves commands until every sender is gone, then syncs; returns whether the log ended clean
    /// (never poisoned).
    pub(crate) fn run(mut self, commands: &Receiver<Command>) -> bool {
        loop {
            let first = match (self.durability, self.dirty) {
                (Durability::Periodic(period), true) => {
                    let wait = period.saturating_sub(self.last_sync.elapsed());
                    match commands.recv_timeout(wait) {
                        Ok(command) => Some(command),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                // After a group of one write, poll a moment before sleeping.
                _ if self.last_group_writes == 1 => match poll_then_recv(commands, LONE_POLL, u32::MAX) {
                    Ok(command) => Some(command),
                    Err(_) => break,
                },
                _ => match commands.recv() {
                    Ok(command) => Some(command),
                    Err(_) => break,
                },
            };
            let Some(first) = first else {
                let _ = self.sync();
                continue;
            };
            let group = self.gather(first, commands);
            self.process(group);
        }
        if self.poisoned.is_none() {
            // A closed store's newest segment ends at its last frame: no allocated zeros.
            if let Err(e) = self.sync().and_then(|()| self.trim()).and_then(|()| self.sync()) {
                tracing::error!("final sync of the store failed: {e}");
            }
        }
        self.poisoned.is_none()
    }

    /// The group that starts with `first`: every command already waiting, and under
    /// `Durability::Immediate` those of the threads still writing, for a moment. Sets
    /// `last_group_writes`.
    fn gather(&mut self, first: Command, commands: &Receiver<Command>) -> Vec<Command> {
        let mut group = vec![first];
        let mut bytes = 0usize;
        while bytes < GROUP_BYTES_MAX {
            match commands.try_recv() {
                Ok(command) => {
                    if let Command::Write { ops, .. } = &command {
                        bytes += ops.iter().map(op_bytes).sum::<usize>();
                    }
                    group.push(command);
                }
                Err(_) => break,
            }
        }
        // Group commit: writers submit their next batch as soon as the last fsync answers them,
        // not all at once. While threads are inside an add or a delete whose batch is not in
        // the group yet (validating it, or just answered and about to send the next), wait a
        // moment for them, so that one fsync serves them all. Waiting for as many as the last
        // group held instead locked 8 writers into two groups of 4 that took turns.
        let writes = |group: &[Command]| group.iter().filter(|c| matches!(c, Command::Write { .. })).count();
        if matches!(self.durability, Durability::Immediate) {
            let deadline = Instant::now() + GROUP_LINGER;
            while writes(&group) < self.shared.writers.load(std::sync::atomic::Ordering::Acquire)
                && bytes < GROUP_BYTES_MAX
            {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match commands.recv_timeout(left.min(GROUP_RECHECK)) {
                    Ok(command) => {
                        if let Command::Write { ops, .. } = &command {
                            bytes += ops.iter().map(op_bytes).sum::<usize>();
                        }
                        group.push(command);
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        }
        self.last_group_writes = writes(&group);
        group
    }

    /// One group: its batches checked, written, synced as the durability asks, published, and
    /// every command answered.
    fn process(&mut self, group: Vec<Command>) {
        let (segment_before, len_before) = (self.active.number, self.active.len);
        let Group {
            mut staged,
            flushes,
            rotations,
        } = self.check_group(group);
        let written = self.write_staged(&mut staged);
        let must_sync = !flushes.is_empty()
            || match self.durability {
                Durability::Immediate => true,
                Durability::Periodic(period) => self.last_sync.elapsed() >= period,
                Durability::Never => false,
            };
        let synced = written.and_then(|()| self.sync_group(&mut staged, must_sync, (segment_before, len_before)));
        let applied = match synced {
            Ok(applied) => applied,
            Err(e) => {
                self.refuse_group(
                    &e,
                    Group {
                        staged,
                        flushes,
                        rotations,
                    },
                );
                return;
            }
        };
        if must_sync {
            self.note_durable();
        }
        if applied {
            self.publish_applied(&staged);
        } else {
            self.publish(&staged);
        }
        self.notify(&mut staged);
        for batch in staged {
            let _ = batch.reply.send(Ok(Answer {
                outcomes: batch.outcomes,
                ops: batch.ops,
            }));
        }
        for reply in flushes {
            let _ = reply.send(Ok(()));
        }
        self.active.segment.extend_window();
        if self.active.number == segment_before {
            self.prepare_ahead(self.active.len - len_before);
        }
        if !rotations.is_empty() {
            self.rotate_on_request(rotations);
        }
    }

    /// Poisons the store after the group's write or fsync failed with `e`, and refuses every
    /// command of the group.
    fn refuse_group(&mut self, e: &Error, group: Group) {
        // A group applied to the index during its failed fsync stays there, never published:
        // no view sees it, and no checkpoint is taken of it.
        let mut index = self.shared.write_index();
        if !index.unpublished.is_none() {
            index.unpublished.failed = true;
        }
        drop(index);
        // A writer already poisoned keeps the failure that poisoned it: its `Poisoned` refusal
        // must not be wrapped into a longer reason at every refused command.
        let reason = self.poisoned.get_or_insert_with(|| e.to_string()).clone();
        tracing::error!("store poisoned: {reason}");
        for batch in group.staged {
            let _ = batch.reply.send(Err(Error::Poisoned { reason: reason.clone() }));
        }
        for reply in group.flushes {
            let _ = reply.send(Err(Error::Poisoned { reason: reason.clone() }));
        }
        for reply in group.rotations {
            let _ = reply.send(Err(Error::Poisoned { reason: reason.clone() }));
        }
    }

    /// Answers the group's rotation requests: the active segment is sealed if it holds any frame.
    fn rotate_on_request(&mut self, rotations: Vec<Sender<Result<bool>>>) {
        let rotated = if self.active.len > SEGMENT_HEADER_BYTES as u64 {
            self.rotate().map(|()| true)
        } else {
            Ok(false)
        };
        if let Err(e) = &rotated {
            self.poisoned = Some(e.to_string());
        }
        for reply in rotations {
            let _ = reply.send(match &rotated {
                Ok(done) => Ok(*done),
                Err(e) => Err(Error::Poisoned { reason: e.to_string() }),
            });
        }
    }
}

fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Put(valid) => valid.record.len(),
        Op::Delete(id) => id.len() + 16,
        Op::RegisterType(spec) => spec.name().len() + spec.pattern().map_or(0, str::len) + 16,
        Op::Pin { name, .. } | Op::Unpin(name) => name.len() + 160,
    }
}
