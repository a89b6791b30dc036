//! What the tests of the index and of the layers above it share (a put record, a record location),
//! and the test of the index's segment bookkeeping.

use std::sync::Arc;

use crate::index::{Index, Location};
use crate::log::record::{PutView, ScopeView};

/// A put of `id` at `version` and `timestamp`: a message from source `src`, global and writable.
pub(crate) fn put<'a>(id: &'a str, version: &'a str, timestamp: i64) -> PutView<'a> {
    PutView {
        id,
        kind: "message",
        version,
        scope: ScopeView::GlobalWritable,
        source: "src",
        timestamp,
        ttl_seconds: None,
        confidence: None,
        hash: [0; 32],
        content: b"null",
        compressed: false,
    }
}

pub(super) const HERE: Location = Location {
    segment: 1,
    offset: 32,
    len: 10,
    crc: 0,
};

#[test]
fn a_sealed_segment_counts_as_published_once_the_frames_before_the_next_one_are() {
    let disk = crate::storage::SimDisk::new();
    let dir = std::path::Path::new("/sim/index");
    crate::storage::Storage::create_dir_all(&disk, dir).expect("dir");
    let mut index = Index::default();
    // Segment 1 holds frames 1..=4; segment 2 starts at frame 5 and is the active one.
    for (number, base_seq) in [(1, 1), (2, 5)] {
        let made = crate::log::segment::create_segment(&disk, dir, number, base_seq).expect("segment");
        index.segments.insert(number, Arc::clone(&made.segment));
    }
    index.seq = 3;
    assert!(!index.segment_published(1), "frame 4 is written but not published");
    index.seq = 4;
    assert!(index.segment_published(1));
    assert!(!index.segment_published(2), "the active segment has no next one");
    assert!(!index.segment_published(7), "no such segment");
}
