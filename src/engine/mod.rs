//! The engine (layer 5): the state the store's threads share and the work they do on it, below the
//! public facade (`store`, `snapshot`) and above the read path, the index and the log.

pub(crate) mod compaction;
pub(crate) mod maintenance;
pub(crate) mod recovery;
pub(crate) mod shared;
