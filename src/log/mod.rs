//! The append-only log: put records prepared from items, the frame codec, and segment files (the
//! active one among them).

pub(crate) mod put;
pub(crate) mod record;
pub(crate) mod segment;

pub(crate) mod writer {
    // BRIDGE: old path, removed after the merge
    pub(crate) use crate::engine::writer::{poll_then_recv, Answer, Command, Op, OpOutcome, SyncHelpers, Writer};
    // BRIDGE: old path, removed after the merge
    pub(crate) use crate::log::segment::{create_segment, ActiveSegment};
}
