//! [`Stats`] and [`Store::stats`]: figures about a store, gathered from the engine's shared state.

use crate::engine::recovery::RecoveryStats;
use crate::engine::scrub::ScrubStats;
use crate::store::Store;

/// Figures about a store, from [`Store::stats`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Ids whose latest version is neither deleted nor superseded (expired ones included until
    /// compaction reclaims them).
    pub items: u64,
    /// Stored versions in the index, of every id.
    pub versions: u64,
    /// Sessions whose scope holds a stored version (superseded or deleted ones count until
    /// compaction reclaims them).
    pub sessions: u64,
    /// Pinned snapshots.
    pub pins: u64,
    /// Segment files.
    pub segments: u64,
    /// Bytes of every file in the store directory. While the store is open this includes the space
    /// allocated ahead of the active segment's appends (up to 4 MiB, zeros), which closing gives back.
    pub bytes_on_disk: u64,
    /// Estimated bytes of memory the index uses.
    pub index_bytes: u64,
    /// `index_bytes` per stored version.
    pub index_bytes_per_item: f64,
    /// The last published sequence number.
    pub seq: u64,
    /// Queries run by this handle.
    pub queries: u64,
    /// Index entries those queries examined.
    pub entries_examined: u64,
    /// What opening the store found and did.
    pub recovery: RecoveryStats,
    /// What the scrub has read and found since the store was opened (`Options::scrub_bytes_per_sec`).
    pub scrub: ScrubStats,
}

impl Store {
    /// Figures about the store.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let shared = &self.inner.shared;
        let (items, versions, segments, index_bytes, seq, sessions, pins) = {
            let index = shared.read_index();
            let sessions = index
                .scopes
                .values()
                .iter()
                .zip(&index.by_scope)
                .filter(|(scope, set)| matches!(scope, crate::item::Scope::Session(_)) && set.stored() > 0)
                .count() as u64;
            // A bulk group applied ahead of its fsync is not counted until it is published.
            (
                index.live_ids.saturating_sub(index.unpublished.live_ids),
                (index.slots.len() as u64)
                    .saturating_sub(index.forgotten)
                    .saturating_sub(index.unpublished.versions),
                index.segments.len() as u64,
                index.estimated_bytes(),
                index.seq,
                sessions,
                index.pins.len() as u64,
            )
        };
        let bytes_on_disk = shared
            .storage
            .list(&shared.dir)
            .map(|names| {
                names
                    .iter()
                    .filter_map(|name| shared.storage.len(&shared.dir.join(name)).ok())
                    .sum()
            })
            .unwrap_or(0);
        let (queries, entries_examined) = shared.query_counts();
        #[allow(clippy::cast_precision_loss)]
        let index_bytes_per_item = if versions == 0 {
            0.0
        } else {
            index_bytes as f64 / versions as f64
        };
        Stats {
            items,
            versions,
            sessions,
            pins,
            segments,
            bytes_on_disk,
            index_bytes,
            index_bytes_per_item,
            seq,
            queries,
            entries_examined,
            recovery: self.inner.recovery.clone(),
            scrub: self
                .inner
                .scrub_report
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }
}
