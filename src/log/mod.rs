//! The append-only log: frame codec, segment files, and the writer thread.

pub(crate) mod record;
pub(crate) mod segment;
pub(crate) mod writer;
