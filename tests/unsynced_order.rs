//! Unsynced frames that reach the disk out of order. Under `Durability::Never` (or `Periodic`) several
//! appends to the newest segment wait unsynced; a power cut may keep a later one and lose an earlier
//! one, leaving a hole followed by a valid frame. Every frame carries its sync mark (how much of the
//! segment was durable when it was written), so recovery can tell that hole, which nothing durable
//! lies beyond, from damage to synced bytes, which must stay an error.

mod common;

use std::path::Path;
use std::sync::Arc;

use ctxlog::storage::SimDisk;
use ctxlog::*;
use serde_json::json;

const DIR: &str = "/sim/store";

fn open(disk: &SimDisk, durability: Durability) -> Result<Store> {
    Options::new()
        .storage(Arc::new(disk.clone()))
        .clock(Arc::new(ManualClock::new(common::NOW)))
        .durability(durability)
        .auto_compact(false)
        .open(DIR)
}

fn segment(disk: &SimDisk) -> Vec<u8> {
    disk.file_bytes(&Path::new(DIR).join("00000001.seg"))
        .expect("segment 1")
}

fn batch(n: usize) -> Vec<ContextItem> {
    vec![common::item(
        &format!("doc-{n}"),
        common::NOW,
        "1",
        json!({"n": n, "text": common::incompressible(&n.to_string(), 64)}),
    )]
}

/// The ids a store shows, sorted.
fn shown(store: &Store) -> Vec<String> {
    let mut ids = common::ids(&store.get(&ContextQuery::new()).expect("get"));
    ids.sort();
    ids
}

#[test]
fn a_hole_left_by_unsynced_writes_is_truncated_and_what_was_flushed_survives() {
    let mut holes = 0;
    for seed in 0..400u64 {
        let disk = SimDisk::new();
        disk.set_reorder_unsynced(true);
        let store = open(&disk, Durability::Never).expect("open");
        store.add(batch(0)).expect("add 0");
        store.flush().expect("flush");
        let durable = common::frames_end(&segment(&disk));
        let mut ends = Vec::new();
        for n in 1..=4 {
            store.add(batch(n)).expect("add");
            ends.push(common::frames_end(&segment(&disk)));
        }
        let crashed = disk.crash(seed);
        drop(store);
        let bytes = segment(&crashed);
        let written = segment(&disk);
        // Which unsynced frames survived whole, by comparing their bytes.
        let mut start = durable;
        let kept: Vec<bool> = ends
            .iter()
            .map(|end| {
                let whole = bytes.get(start..*end) == written.get(start..*end);
                start = *end;
                whole
            })
            .collect();
        let first_lost = kept.iter().position(|k| !k);
        if first_lost.is_some_and(|lost| kept.iter().skip(lost).any(|k| *k)) {
            holes += 1;
        }

        let store = open(&crashed, Durability::Never)
            .unwrap_or_else(|e| panic!("seed {seed}: a power cut under Never must not block opening: {e}"));
        let ids = shown(&store);
        // Everything flushed is there; after it, a prefix of the unsynced batches, up to the first
        // one lost.
        let expected: Vec<String> = (0..=first_lost.unwrap_or(4)).map(|n| format!("doc-{n}")).collect();
        assert_eq!(ids, expected, "seed {seed}: kept {kept:?}");
        assert!(store.verify().expect("verify").is_ok(), "seed {seed}");
        // What it shows now is durable: it survives the next power cut too.
        store.add(batch(9)).expect("add after recovery");
        store.flush().expect("flush");
        let again = disk_after(&crashed);
        let store = open(&again, Durability::Never).expect("reopen");
        let mut want = expected.clone();
        want.push("doc-9".into());
        want.sort();
        assert_eq!(shown(&store), want, "seed {seed}");
    }
    assert!(
        holes >= 20,
        "only {holes} of 400 crashes left a hole before a valid frame"
    );
}

/// The disk after a power cut that loses everything unsynced.
fn disk_after(disk: &SimDisk) -> SimDisk {
    disk.crash_losing_unsynced()
}

#[test]
fn damage_before_a_frame_written_after_a_sync_is_still_an_error() {
    // Immediate: every frame is synced before the next is written, so a later frame's sync mark says
    // that the bytes before it were durable: damage there is damage to acknowledged data.
    let disk = SimDisk::new();
    let store = open(&disk, Durability::Immediate).expect("open");
    let mut ends = Vec::new();
    for n in 0..3 {
        store.add(batch(n)).expect("add");
        ends.push(common::frames_end(&segment(&disk)));
    }
    // A power cut rather than a clean close, so that no checkpoint covers the frames.
    let damaged = disk.crash_losing_unsynced();
    drop(store);
    let mut bytes = segment(&damaged);
    assert_eq!(
        common::frames_end(&bytes),
        ends[2],
        "every acknowledged frame is durable"
    );
    // A flipped bit inside the second frame's payload.
    let at = ends[0] + 40;
    bytes[at] ^= 0x10;
    damaged.set_file_bytes(&Path::new(DIR).join("00000001.seg"), bytes);
    match open(&damaged, Durability::Immediate) {
        Err(Error::Corrupt { file, offset, .. }) => {
            assert!(file.ends_with("00000001.seg"), "{}", file.display());
            assert_eq!(offset, ends[0] as u64, "the offset of the damaged frame");
        }
        other => panic!("damage to a synced frame must be Corrupt, got {other:?}"),
    }
}
