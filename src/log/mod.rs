//! The append-only log: put records prepared from items, the frame codec, and segment files (the
//! active one among them).

pub(crate) mod put;
pub(crate) mod record;
pub(crate) mod segment;
