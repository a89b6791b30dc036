//! Layer 5, the engine: the threads and procedures that keep the log and the index in step (the
//! writer thread and its group commit, checkpoints of the index). It builds on the index (layer 3)
//! and the read rules (layer 4), and serves the store and its snapshots above it.

pub(crate) mod checkpoint;
pub(crate) mod writer;
