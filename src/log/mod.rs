//! The append-only log: put records prepared from items, the frame codec, segment files, and the
//! writer thread.

pub(crate) mod put;
pub(crate) mod record;
pub(crate) mod segment;
pub(crate) mod writer;
