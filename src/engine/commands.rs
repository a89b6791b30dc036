//! What the store's handles send to the writer thread and what it answers: the operations of a
//! batch, their outcomes, the commands, and how a writer waits for its answer; and the durability
//! policy the writer thread follows. The store, the shared state and the writer thread all speak
//! this language, so it stands apart from each of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::error::Result;
use crate::item::TypeSpec;
use crate::log::put::ValidItem;

/// When `add` may return relative to the fsync of its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `add` returns only after its batch is fsynced. Concurrent writers share one fsync (group
    /// commit). The default.
    Immediate,
    /// Batches are visible once written; the writer fsyncs at most every `Duration`, so a power loss
    /// may lose the batches of the last period.
    Periodic(Duration),
    /// Batches are visible once written; syncing is left to the operating system (and to
    /// [`Store::flush`](crate::Store::flush), segment sealing and close).
    Never,
}

/// One operation of a batch.
#[allow(
    clippy::large_enum_variant,
    reason = "nearly every operation is a put; boxing would cost an allocation per item"
)]
pub(crate) enum Op {
    Put(ValidItem),
    Delete(String),
    RegisterType(TypeSpec),
    Pin {
        name: String,
        seq: u64,
        taken_at: i64,
        session: Option<Arc<str>>,
    },
    Unpin(String),
}

/// What one operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpOutcome {
    Added { seq: u64 },
    Unchanged,
    Deleted(bool),
    Registered(bool),
    Pinned,
    Unpinned(bool),
}

/// What the writer thread answers a write: each operation's outcome, and the operations themselves,
/// handed back so that the caller takes the ids and versions it reports without copying them, and
/// frees the items on its own thread.
pub(crate) struct Answer {
    pub(crate) outcomes: Vec<OpOutcome>,
    pub(crate) ops: Vec<Op>,
}

/// What the writer thread is asked to do.
pub(crate) enum Command {
    Write {
        ops: Vec<Op>,
        /// The session view the batch comes from (`None`: the store itself).
        session: Option<Arc<str>>,
        reply: Sender<Result<Answer>>,
    },
    Flush {
        reply: Sender<Result<()>>,
    },
    /// Seal the active segment if it holds any frame, so that compaction may rewrite it; answers
    /// whether it did.
    Rotate {
        reply: Sender<Result<bool>>,
    },
}

impl Command {
    /// The public operation that sent it, for `Error::ReadOnly`.
    pub(crate) fn operation(&self) -> &'static str {
        match self {
            Command::Write { ops, .. } => match ops.first() {
                Some(Op::Delete(_)) => "delete",
                Some(Op::RegisterType(_)) => "register_type",
                Some(Op::Pin { .. }) => "pin_snapshot",
                Some(Op::Unpin(_)) => "unpin_snapshot",
                Some(Op::Put(_)) | None => "add",
            },
            Command::Flush { .. } => "flush",
            Command::Rotate { .. } => "compact",
        }
    }
}

/// A yield that took longer than this means other work wanted the core: polling then costs more
/// than it saves.
const SLOW_YIELD: Duration = Duration::from_micros(50);

/// The next message on `channel`: polled for up to `poll`, yielding the core between polls, then
/// waited for. Polling also stops after `slow_yields` yields slower than [`SLOW_YIELD`]. Both the
/// writer thread (for commands) and writers (for answers) wait this way: a scheduler wake-up costs
/// about 40 us here, a quarter of a durable add on a fast disk.
pub(crate) fn poll_then_recv<T>(
    channel: &Receiver<T>,
    poll: Duration,
    slow_yields: u32,
) -> std::result::Result<T, crossbeam_channel::RecvError> {
    let deadline = Instant::now() + poll;
    let mut slow = 0;
    loop {
        match channel.try_recv() {
            Ok(message) => return Ok(message),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(crossbeam_channel::RecvError),
            Err(crossbeam_channel::TryRecvError::Empty) => {}
        }
        let before = Instant::now();
        if before >= deadline || slow >= slow_yields {
            return channel.recv();
        }
        std::thread::yield_now();
        if before.elapsed() > SLOW_YIELD {
            slow += 1;
        }
    }
}
