//! [`Snapshot::export`] and [`Snapshot::export_all_versions`]: every item a snapshot shows, or every
//! stored version of the ids it shows, in the order the log committed them, read a chunk at a time;
//! parsed, or as their JSON ([`Snapshot::export_raw`], for a writer of JSON lines).
//!
//! The versions are chosen once, under one index lock (a pass over the version table: 24 bytes kept
//! per version chosen), and ordered by their batch's seq and their place in the log. Their records
//! are then read [`CHUNK`] at a time, each chunk under its own index lock, so that a long export
//! never holds writers back for more than a chunk.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::index::{FastMap, Index, VersionEntry};
use crate::item::ContextItem;
use crate::read::answer::RawItem;
use crate::read::record::{raw_item_of, read_item, with_record, ReadFailure};
use crate::read::view::{Sight, View};
use crate::snapshot::Snapshot;

/// Records read under one index lock.
const CHUNK: usize = 512;

/// The versions an export reads, in log order: (seq created, segment, offset, slot).
type Chosen = Vec<(u64, u32, u32, u32)>;

/// Reads one chosen version's record.
type ReadOne<T> = fn(&Index, &VersionEntry) -> std::result::Result<T, ReadFailure>;

/// The items of an export, in the order the log committed them: parsed ([`Export`]) or as their
/// JSON ([`RawExport`]).
pub struct ExportOf<T> {
    /// Keeps compaction from reclaiming what the snapshot sees while the export runs.
    snapshot: Snapshot,
    chosen: Chosen,
    next: usize,
    ready: VecDeque<Result<T>>,
    read: ReadOne<T>,
}

/// The items of [`Snapshot::export`] or [`Snapshot::export_all_versions`], parsed.
pub type Export = ExportOf<ContextItem>;
/// The items of [`Snapshot::export_raw`] or [`Snapshot::export_all_versions_raw`], as their JSON
/// (checked as a parsed read checks them: record CRC, identity, content SHA-256).
pub type RawExport = ExportOf<RawItem>;

impl<T> std::fmt::Debug for ExportOf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("snapshot", &self.snapshot)
            .field("total", &self.chosen.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

fn read_raw(index: &Index, version: &VersionEntry) -> std::result::Result<RawItem, ReadFailure> {
    with_record(index, version, None, raw_item_of)
}

impl Snapshot {
    /// Every item this snapshot shows (what `get` with no filter returns: the latest version of
    /// each live id it may see, expired ones left out), in the order their batches committed,
    /// read lazily: a store of any size is exported with a bounded amount of memory beside 24
    /// bytes per item. Importing them in this order into an empty store gives the same items,
    /// hashes and versions.
    #[must_use]
    pub fn export(&self) -> Export {
        ExportOf::new(self, false, read_item)
    }

    /// [`Snapshot::export`], each item as its JSON (what `serde_json::to_string` of the parsed
    /// item gives), without parsing it.
    #[must_use]
    pub fn export_raw(&self) -> RawExport {
        ExportOf::new(self, false, read_raw)
    }

    /// [`Snapshot::export_all_versions`], each item as its JSON.
    #[must_use]
    pub fn export_all_versions_raw(&self) -> RawExport {
        ExportOf::new(self, true, read_raw)
    }

    /// Every version the store still holds, of every id this snapshot shows (expired ones
    /// included), created at or before its seq, oldest first: the history of each id since its
    /// last delete, as far as compaction has kept it. Versions this snapshot does not see itself
    /// (those an id's newer versions superseded) may be reclaimed by a compaction that runs while
    /// the export reads: they are then left out.
    #[must_use]
    pub fn export_all_versions(&self) -> Export {
        ExportOf::new(self, true, read_item)
    }
}

impl<T> ExportOf<T> {
    fn new(snapshot: &Snapshot, all_versions: bool, read: ReadOne<T>) -> ExportOf<T> {
        let chosen = {
            let index = snapshot.shared.read_index_for_caller();
            let view = snapshot.view(&index);
            choose(&index, &view, all_versions)
        };
        ExportOf {
            snapshot: snapshot.clone(),
            chosen,
            next: 0,
            ready: VecDeque::new(),
            read,
        }
    }

    /// How many items the export gives in all (fewer if versions it chose are reclaimed as it
    /// reads, see [`Snapshot::export_all_versions`]).
    #[must_use]
    pub fn total(&self) -> usize {
        self.chosen.len()
    }

    /// Reads the next chunk's records under one index lock.
    fn fill(&mut self) {
        let index = self.snapshot.shared.read_index_for_caller();
        let end = (self.next + CHUNK).min(self.chosen.len());
        for &(seq_created, _, _, slot) in self.chosen.get(self.next..end).unwrap_or_default() {
            let Some(version) = index
                .slot(slot)
                .filter(|v| v.seq_created == seq_created && v.is_stored())
            else {
                // Reclaimed since it was chosen: only a version the snapshot does not see can be.
                continue;
            };
            self.ready.push_back((self.read)(&index, &version).map_err(Error::from));
        }
        self.next = end;
    }
}

impl<T> Iterator for ExportOf<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        while self.ready.is_empty() && self.next < self.chosen.len() {
            self.fill();
        }
        self.ready.pop_front()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.ready.len() + (self.chosen.len() - self.next);
        (0, Some(left))
    }
}

/// The versions to export, in log order: those `view` sees live, or with `all_versions` every
/// stored version of the ids it sees (live or expired) of the history it sees.
fn choose(index: &Index, view: &View<'_>, all_versions: bool) -> Chosen {
    // With every version: the history (generation) of each id the view sees.
    let mut seen: FastMap<u32, u32> = FastMap::default();
    if all_versions {
        for version in index.slots.iter() {
            if !matches!(view.judge(index, &version), Sight::Hidden) {
                seen.insert(version.id, index.generation(&version));
            }
        }
    }
    let mut chosen: Chosen = Vec::new();
    for (slot, version) in (0u32..).zip(index.slots.iter()) {
        let wanted = if all_versions {
            version.is_stored()
                && view.has_seen(&version)
                && view.may_see_scope_id(index, version.scope)
                && seen.get(&version.id) == Some(&index.generation(&version))
        } else {
            matches!(view.judge(index, &version), Sight::Live)
        };
        if wanted {
            chosen.push((
                version.seq_created,
                version.location.segment,
                version.location.offset,
                slot,
            ));
        }
    }
    chosen.sort_unstable();
    chosen
}
