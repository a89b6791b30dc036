//! Publishing a written group: its batches applied to the index in sequence order (after its fsync,
//! or during it, unpublished, for a bulk group), then the index's sequence number and the active
//! segment's readable length moved past them, so that new views see them.

use crate::engine::shared::Shared;
use crate::index::{Index, Location, PinInfo, Unpublished};
use crate::item::TypeRegistry;
use crate::log::record::{PutView, ScopeView};
use crate::num::{bounded, u64_from_usize};

use super::{Op, Staged, Writer};

impl Writer {
    /// Makes the written batches visible, in sequence order.
    pub(super) fn publish(&self, staged: &[Staged]) {
        let mut index = write_index_for(&self.shared, staged);
        let registry = apply(&mut index, &self.shared, staged);
        if let Some((seq, committed_at)) = last_written(staged) {
            index.seq = seq;
            index.committed_at = committed_at;
        }
        let active_len = self.active.len;
        self.active.segment.set_published_len(active_len);
        if let Some(registry) = registry {
            index.registry = registry.clone();
            self.shared.set_registry(registry);
        }
    }

    /// Makes the batches [`apply_unpublished`] applied visible, once their fsync succeeded.
    pub(super) fn publish_applied(&self, staged: &[Staged]) {
        let mut index = self.shared.write_index();
        if let Some((seq, committed_at)) = last_written(staged) {
            index.seq = seq;
            index.committed_at = committed_at;
        }
        index.unpublished = Unpublished::default();
        self.active.segment.set_published_len(self.active.len);
    }
}

/// The index's write lock, with room made first in its id lookup for every put the group writes
/// (built under the read lock, so that readers do not wait for it).
fn write_index_for<'a>(shared: &'a Shared, staged: &[Staged]) -> std::sync::RwLockWriteGuard<'a, Index> {
    let grown = shared.read_index().grown_lookup(written_puts(staged));
    let mut index = shared.write_index();
    if let Some(lookup) = grown {
        index.install_lookup(lookup);
    }
    index
}

/// Puts written by the group's batches.
#[inline]
pub(super) fn written_puts(staged: &[Staged]) -> usize {
    staged
        .iter()
        .filter(|batch| batch.frame.is_some())
        .map(|batch| batch.ops.iter().filter(|op| matches!(op, Op::Put(_))).count())
        .sum()
}

/// The sequence number and commit time of the group's last written batch.
fn last_written(staged: &[Staged]) -> Option<(u64, i64)> {
    staged
        .iter()
        .filter(|batch| batch.frame.is_some())
        .map(|batch| (batch.seq, batch.committed_at))
        .next_back()
}

/// Applies the written batches of a group of puts to the index without publishing them: their
/// versions are above the index's sequence number until [`Writer::publish_applied`].
pub(super) fn apply_unpublished(shared: &Shared, staged: &[Staged]) {
    let mut index = write_index_for(shared, staged);
    let (versions, live_ids) = (index.slots.len(), index.live_ids);
    // A group of puts changes no registry.
    let _ = apply(&mut index, shared, staged);
    // Under the one write lock, puts only append versions and only add live ids (a put's version
    // is stored, so the one it ends, if live, is replaced by a live one).
    index.unpublished = Unpublished {
        versions: u64_from_usize(index.slots.len() - versions),
        live_ids: index.live_ids - live_ids,
        failed: false,
    };
}

/// Applies the written batches to the index, in sequence order, without moving its sequence
/// number; returns the registry to install if a batch registered a type.
fn apply(index: &mut Index, shared: &Shared, staged: &[Staged]) -> Option<TypeRegistry> {
    // A copy of the registry only once a batch registers a type.
    let mut registry: Option<TypeRegistry> = None;
    for batch in staged {
        let (Some((frame, records)), Some((segment, frame_offset))) = (&batch.frame, batch.location) else {
            continue;
        };
        for record in records {
            match batch.ops.get(record.op) {
                Some(Op::Put(valid)) => {
                    let item = &valid.item;
                    let put = PutView {
                        id: &item.id,
                        kind: &item.kind,
                        version: &item.version,
                        scope: ScopeView::from(&item.scope),
                        source: &item.source,
                        timestamp: item.timestamp,
                        ttl_seconds: item.ttl_seconds,
                        confidence: item.confidence,
                        hash: valid.hash,
                        // The index keeps no content.
                        content: &[],
                        compressed: false,
                    };
                    // A frame starts below limits::SEGMENT_BYTES_MAX and holds at most
                    // limits::FRAME_PAYLOAD_BYTES_MAX: every offset in a segment fits in a u32.
                    let location = Location {
                        segment,
                        offset: bounded(
                            frame_offset + u64_from_usize(record.start),
                            "record offset in a segment",
                        ),
                        len: bounded(record.len, "record length (at most limits::FRAME_PAYLOAD_BYTES_MAX)"),
                        crc: crate::index::record_crc_at(frame, record.start),
                    };
                    index.apply_put(batch.seq, &put, location);
                }
                Some(Op::Delete(id)) => {
                    index.apply_delete(batch.seq, id);
                }
                Some(Op::RegisterType(spec)) => {
                    let registry = registry.get_or_insert_with(|| (*shared.registry()).clone());
                    // The writer checked the registration; a refusal here leaves the registry
                    // as it was, as before.
                    let _ = registry.insert(spec.clone());
                }
                Some(Op::Pin {
                    name,
                    seq,
                    taken_at,
                    session,
                }) => {
                    let pin = PinInfo {
                        seq: *seq,
                        taken_at: *taken_at,
                        session: session.clone(),
                    };
                    index.pins.insert(name.clone(), pin);
                }
                Some(Op::Unpin(name)) => {
                    index.pins.remove(name);
                }
                _ => {}
            }
        }
    }
    registry
}
