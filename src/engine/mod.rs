//! The engine (layer 5): the state the store's threads share and the work they do on it: the writer
//! thread and its group commit, compaction, checkpoints of the index, recovery on open, and the
//! background maintenance thread. It builds on the read path (layer 4), the index and the log, and
//! serves the public facade (`store`, `snapshot`) above it.

pub(crate) mod check;
pub(crate) mod checkpoint;
pub(crate) mod commands;
pub(crate) mod compaction;
pub(crate) mod history;
pub(crate) mod maintenance;
pub(crate) mod recovery;
pub(crate) mod scrub;
pub(crate) mod shared;
pub(crate) mod writer;
