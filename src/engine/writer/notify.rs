//! The changes of a published group, for the hub of live subscriptions: built only while someone
//! subscribes, from the group's written operations (a put's item fields, a delete's id and the
//! scope its record names).

use crate::engine::history::change::Change;
use crate::engine::history::hub::{LiveBatch, LiveChange};
use crate::item::format_hash;
use crate::log::record::{decode_record, RecordView};

use super::{Op, Staged, Writer};

impl Writer {
    /// Hands the changes of the published `staged` batches to the hub, if anyone subscribes (and
    /// writes the history floor opening found, if it is not in its file yet).
    pub(super) fn notify(&self, staged: &[Staged]) {
        self.shared.save_floor_if_unsaved();
        let hub = &self.shared.hub;
        if !hub.has_subscribers() {
            return;
        }
        hub.publish(staged.iter().filter_map(live_batch).collect());
    }
}

/// The changes a written batch committed, in its order (`None` for a batch that wrote nothing).
fn live_batch(batch: &Staged) -> Option<LiveBatch> {
    let (frame, spans) = batch.frame.as_ref()?;
    let (seq, committed_at) = (batch.seq, batch.committed_at);
    let mut changes = Vec::with_capacity(spans.len());
    for span in spans {
        match batch.ops.get(span.op) {
            Some(Op::Put(put)) => {
                let item = &put.item;
                changes.push(LiveChange {
                    change: Change::Added {
                        seq,
                        committed_at,
                        id: item.id.clone(),
                        version: item.version.clone(),
                        hash: format_hash(&put.hash),
                        kind: item.kind.clone(),
                        scope: item.scope.clone(),
                        timestamp: item.timestamp,
                    },
                    kind: None,
                    scope: None,
                    expires_at: item.expires_at(),
                });
            }
            Some(Op::Delete(id)) => {
                // The scope the writer planned for the delete is the one its record names.
                let record = frame.get(span.start..span.start + span.len).unwrap_or_default();
                // A delete that could not name the version it ended (retired by a build older than
                // format 3) is no change anyone is told of, as in the feed.
                let Ok(RecordView::Delete {
                    scope: Some(scope),
                    kind,
                    ..
                }) = decode_record(record)
                else {
                    continue;
                };
                changes.push(LiveChange {
                    change: Change::Deleted {
                        seq,
                        committed_at,
                        id: id.clone(),
                        scope: scope.to_scope(),
                    },
                    kind: kind.map(str::to_owned),
                    scope: None,
                    expires_at: None,
                });
            }
            _ => {}
        }
    }
    (!changes.is_empty()).then_some(LiveBatch { seq, changes })
}
