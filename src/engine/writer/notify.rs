//! The hand-over of published groups to the hub of live subscriptions: only while someone
//! subscribes, the writer gives it each batch's frame as written (moved, not copied: the writer has
//! no more use for it), and the hub's dispatcher decodes the changes off the writer's thread.

use crate::engine::history::hub::WrittenFrame;

use super::{Staged, Writer};

impl Writer {
    /// Hands the frames of the published `staged` batches to the hub, if anyone subscribes (and
    /// writes the history floor opening found, if it is not in its file yet).
    pub(super) fn notify(&self, staged: &mut [Staged]) {
        self.shared.save_floor_if_unsaved();
        let hub = &self.shared.hub;
        if !hub.has_subscribers() {
            return;
        }
        hub.publish(
            staged
                .iter_mut()
                .filter_map(|batch| {
                    let (bytes, _) = batch.frame.take()?;
                    Some(WrittenFrame { seq: batch.seq, bytes })
                })
                .collect(),
        );
    }
}
