//! # ctxlog
//!
//! An embedded storage engine for the context that AI applications hand to their models: typed,
//! scoped, versioned, hashed, expiring JSON records ([`ContextItem`]) in an append-only,
//! CRC-framed log, with in-memory indexes on type, scope and time, session isolation, and MVCC
//! snapshots whose resolves can be reproduced later.
//!
//! ```
//! use ctxlog::{ContextItem, ContextQuery, Resolution, Scope, Store, TimeRange};
//! use serde_json::json;
//!
//! # fn main() -> ctxlog::Result<()> {
//! let dir = tempfile::tempdir().expect("temp dir");
//! let store = Store::open(dir.path())?;
//! store.add([ContextItem::new(
//!     "ch3", "document_chunk", json!({"text": "Clause 3: ..."}), "contracts",
//!     1_715_300_000, "1", Scope::GlobalReadonly,
//! )])?;
//! let items = store.get(
//!     &ContextQuery::new()
//!         .types(["document_chunk"])
//!         .time_range(TimeRange::parse("2024-05-10T00:00:00Z", "2024-05-12T23:59:59Z")?),
//! )?;
//! assert_eq!(items.len(), 1);
//! assert!(matches!(&store.resolve(&["ch3"])?[0], Resolution::Found(item) if item.id == "ch3"));
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing))]

mod clock;
mod engine;
mod error;
mod index;
mod item;
pub mod limits;
mod log;
mod num;
mod parallel;
mod read;
mod snapshot;
#[cfg(feature = "sim-disk")]
pub mod storage;
#[cfg(not(feature = "sim-disk"))]
mod storage;
mod store;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
mod time;

pub use crate::clock::{Clock, ManualClock, SystemClock};
pub use crate::engine::compaction::CompactionReport;
pub use crate::engine::history::change::Change;
pub use crate::engine::history::feed::Changes;
pub use crate::engine::history::filter::ChangeFilter;
pub use crate::engine::history::subscription::Subscription;
pub use crate::engine::recovery::RecoveryStats;
pub use crate::engine::scrub::ScrubStats;
pub use crate::error::{Error, Result};
pub use crate::item::{canonical_json, ContextItem, Scope, TypeSpec};
pub use crate::read::{ContextQuery, IndexUsed, QueryStats, RawItem, RawResolution, Resolution};
pub use crate::snapshot::{Export, ExportOf, RawExport, Receipt, ReceiptAnswer, Snapshot, SnapshotInfo};
pub use crate::store::{AddOutcome, Durability, Options, Problem, SessionView, Stats, Store, VerifyReport};
pub use crate::time::{format_rfc3339, TimeRange};
