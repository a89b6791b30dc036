//! Layer 4, the read layer: everything a read does below the public snapshot type, over the index
//! (layer 3) and the log's records (layer 2). It imports nothing from the engine or the facade:
//! its functions take the index (or its read lock's guard), a [`View`](view::View) and the
//! worker pool ([`Reader`](runs::Reader)) as parameters.
//!
//! - [`view`]: visibility (sequence number, clock time, session): TTL and scope are judged there.
//! - [`plan`]: the planner, a function from a query to a plan.
//! - [`query`]: the public query types and filters; [`walk`]: running a plan.
//! - [`record`]: checked record reads (CRC, SHA-256, identity).
//! - [`resolve`]: resolving references; [`answer`]: the public answer types.
//! - [`runs`]: reading many items on several threads.

pub(crate) mod answer;
pub(crate) mod plan;
pub(crate) mod query;
pub(crate) mod record;
pub(crate) mod resolve;
pub(crate) mod runs;
pub(crate) mod view;
pub(crate) mod walk;

pub use answer::{RawItem, RawResolution, Resolution};
pub use query::{ContextQuery, IndexUsed, QueryStats};
