//! The active segment is allocated ahead of its appends (so that a durable add's fsync commits no new
//! file length), and cut back to its last frame when it is sealed or the store closes. A store that
//! was not closed leaves zeros past its last frame: opening cuts them, counts them as
//! `unwritten_bytes` (not as a torn tail) and loses nothing acknowledged.

mod common;

use std::path::Path;
use std::sync::Arc;

use ctxlog::storage::{CallKind, SimDisk};
use ctxlog::*;
use serde_json::json;

const SEGMENT_SIZE: u64 = 256 << 10;

fn batch(first: usize, count: usize) -> Vec<ContextItem> {
    (first..first + count)
        .map(|n| {
            common::item(
                &format!("doc-{n}"),
                common::NOW,
                "1",
                json!({"n": n, "text": common::incompressible(&n.to_string(), 300)}),
            )
        })
        .collect()
}

fn open_file_store(dir: &Path) -> Store {
    Options::new()
        .clock(Arc::new(ManualClock::new(common::NOW)))
        .segment_size(SEGMENT_SIZE)
        .auto_compact(false)
        .open(dir)
        .expect("open")
}

fn assert_holds(store: &Store, count: usize, context: &str) {
    let mut ids = common::ids(&store.get(&ContextQuery::new()).expect("get"));
    ids.sort();
    let mut want: Vec<String> = (0..count).map(|n| format!("doc-{n}")).collect();
    want.sort();
    assert_eq!(ids, want, "{context}");
    assert!(store.verify().expect("verify").is_ok(), "{context}");
}

#[test]
fn the_active_segment_is_allocated_ahead_and_cut_back_when_sealed_and_on_close() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_file_store(dir.path());
    store.add(batch(0, 10)).expect("add");
    let files = common::segment_files(dir.path());
    assert_eq!(files.len(), 1);
    let bytes = std::fs::read(&files[0]).expect("read");
    let written = common::frames_end(&bytes);
    assert!(
        bytes.len() > written,
        "no space allocated ahead: {} bytes, frames end at {written}",
        bytes.len()
    );
    assert!(bytes[written..].iter().all(|byte| *byte == 0));
    assert!(bytes.len() as u64 <= SEGMENT_SIZE, "allocated past the segment size");

    // Enough for several segments, in batches of 10.
    let mut count = 10;
    while common::segment_files(dir.path()).len() < 4 {
        store.add(batch(count, 10)).expect("add");
        count += 10;
    }
    assert_holds(&store, count, "open");
    let files = common::segment_files(dir.path());
    for sealed in &files[..files.len() - 1] {
        let bytes = std::fs::read(sealed).expect("read");
        assert_eq!(
            common::frames_end(&bytes),
            bytes.len(),
            "{}: a sealed segment holds more than its frames",
            sealed.display()
        );
        assert!(
            bytes.len() as u64 <= SEGMENT_SIZE + (64 << 10),
            "a sealed segment is too long"
        );
    }
    let newest = files.last().expect("a newest segment");
    let bytes = std::fs::read(newest).expect("read");
    assert!(
        bytes.len() > common::frames_end(&bytes),
        "the newest segment is not allocated ahead"
    );

    drop(store);
    let bytes = std::fs::read(newest).expect("read");
    assert_eq!(
        common::frames_end(&bytes),
        bytes.len(),
        "a closed store's newest segment ends in allocated zeros"
    );
    let store = open_file_store(dir.path());
    let recovery = store.stats().recovery;
    assert_eq!((recovery.truncated_bytes, recovery.unwritten_bytes), (0, 0));
    assert_holds(&store, count, "after a clean close");
    // Appends go on after the last frame of the reopened segment.
    store.add(batch(count, 10)).expect("add after reopen");
    drop(store);
    let store = open_file_store(dir.path());
    assert_holds(&store, count + 10, "after adding to the reopened segment");
}

#[test]
fn a_store_that_was_not_closed_cuts_its_allocated_zeros_on_open_and_loses_nothing() {
    const DIR: &str = "/sim/store";
    let open = |disk: &SimDisk| {
        Options::new()
            .storage(Arc::new(disk.clone()))
            .clock(Arc::new(ManualClock::new(common::NOW)))
            .segment_size(SEGMENT_SIZE)
            .auto_compact(false)
            .open(DIR)
    };
    let newest = |disk: &SimDisk| {
        let mut names: Vec<String> = disk
            .file_names(Path::new(DIR))
            .into_iter()
            .filter(|name| name.ends_with(".seg"))
            .collect();
        names.sort();
        let name = names.pop().expect("a segment");
        disk.file_bytes(&Path::new(DIR).join(name)).expect("segment bytes")
    };
    let disk = SimDisk::new();
    let store = open(&disk).expect("open");
    let mut count = 0;
    for _ in 0..5 {
        store.add(batch(count, 7)).expect("add");
        count += 7;
    }
    // Every add was acknowledged under Immediate: a power cut keeps all of them, and the zeros.
    let crashed = disk.crash_losing_unsynced();
    drop(store);
    let bytes = newest(&crashed);
    let written = common::frames_end(&bytes);
    assert!(bytes.len() > written, "the crash left no allocated zeros to cut");

    let store = open(&crashed).expect("open after the power cut");
    let recovery = store.stats().recovery;
    assert_eq!(recovery.truncated_bytes, 0, "allocated zeros counted as a torn tail");
    assert_eq!(recovery.unwritten_bytes, (bytes.len() - written) as u64);
    assert_holds(&store, count, "after the power cut");
    assert_eq!(newest(&crashed).len(), written, "the zeros were not cut");

    // The store goes on writing after its last frame, and a second power cut loses nothing either.
    store.add(batch(count, 7)).expect("add after recovery");
    count += 7;
    let again = crashed.crash_losing_unsynced();
    drop(store);
    let store = open(&again).expect("open after the second power cut");
    assert_eq!(store.stats().recovery.truncated_bytes, 0);
    assert_holds(&store, count, "after the second power cut");
}

/// Where the next data at or after `offset` in the file at `path` starts (`SEEK_DATA`), if any.
/// Reading the file put its reserved blocks in the page cache as pages of zeros, which `SEEK_DATA`
/// reports as data: they are dropped first (the file is synced, so they are clean).
#[cfg(target_os = "linux")]
fn data_at(path: &Path, offset: u64) -> Option<u64> {
    let file = std::fs::File::open(path).expect("open");
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).expect("fadvise");
    rustix::fs::seek(&file, rustix::fs::SeekFrom::Data(offset)).ok()
}

/// Whether this file system tells blocks only reserved from written ones (ext4 and xfs do: reserved
/// blocks are holes to `SEEK_DATA` once synced).
#[cfg(target_os = "linux")]
fn reserved_blocks_are_holes(dir: &Path) -> bool {
    use ctxlog::storage::{Allocation, FileStorage, Storage};
    let path = dir.join("probe");
    let mut file = FileStorage.create_new(&path).expect("create");
    file.append(b"x").expect("append");
    file.allocate(1 << 20, Allocation::Reserved).expect("allocate");
    file.sync_data().expect("sync");
    let holes = data_at(&path, 64 << 10).is_none();
    std::fs::remove_file(&path).expect("remove");
    holes
}

#[cfg(target_os = "linux")]
#[test]
fn single_adds_append_into_written_zeros_and_bulk_loads_into_reserved_space() {
    let dir = tempfile::tempdir().expect("temp dir");
    if !reserved_blocks_are_holes(dir.path()) {
        eprintln!("this file system does not tell reserved blocks from data: nothing to check");
        return;
    }
    let store_dir = dir.path().join("store");
    let store = open_file_store(&store_dir);
    for n in 0..5 {
        store.add(batch(n, 1)).expect("add");
    }
    let newest = common::segment_files(&store_dir).pop().expect("a segment");
    let bytes = std::fs::read(&newest).expect("read");
    let written = common::frames_end(&bytes) as u64;
    assert!(
        bytes.len() as u64 > written + (32 << 10),
        "no zeros ahead of the single adds"
    );
    // The fsync after a single add then writes its data alone: the space ahead is written zeros,
    // to the end of the file.
    let end = bytes.len() as u64;
    assert_eq!(data_at(&newest, written), Some(written));
    assert_eq!(
        data_at(&newest, end - 1),
        Some(end - 1),
        "the zeros ahead end before the file does"
    );

    // A batch too long for the zeros ahead (here ~130 KB): its space is reserved, not written.
    store.add(batch(5, 400)).expect("bulk add");
    let bytes = std::fs::read(&newest).expect("read");
    let written = common::frames_end(&bytes) as u64;
    assert!(bytes.len() as u64 > written, "no space allocated ahead of the bulk add");
    // The file system's blocks are at most 4 KiB here; the one the batch ends in is data.
    let next_block = written.div_ceil(4096) * 4096;
    assert!(next_block < bytes.len() as u64);
    assert_eq!(
        data_at(&newest, next_block),
        None,
        "zeros were written ahead of a bulk add"
    );
    drop(store);
    let store = open_file_store(&store_dir);
    assert_holds(&store, 405, "after a clean close");
}

/// The space that bulk writes go into is made ready before they come (`StorageFile::prepare`, which
/// puts the page cache's pages in place on a real file system): after a bulk add the writer thread
/// allocates room for two more of its size and prepares it, so that the next one allocates nothing
/// and appends into prepared space. Single adds prepare nothing. A checkpoint and a rewritten
/// segment are prepared whole before they are written, and end at their last byte.
#[test]
fn bulk_adds_checkpoints_and_rewrites_prepare_the_space_they_write_into() {
    const DIR: &str = "/sim/store";
    let disk = SimDisk::new();
    let clock = Arc::new(ManualClock::new(common::NOW));
    let open = || {
        Options::new()
            .storage(Arc::new(disk.clone()))
            .clock(clock.clone())
            .segment_size(4 << 20)
            .auto_compact(false)
            .open(DIR)
            .expect("open")
    };
    let store = open();
    let segment = Path::new(DIR).join("00000001.seg");
    let frames_end = || common::frames_end(&disk.file_bytes(&segment).expect("segment")) as u64;
    for n in 0..3 {
        store.add(batch(n, 1)).expect("single add");
    }
    // The writer thread prepares after it answers: a flush is answered once it is done.
    store.flush().expect("flush");
    assert!(disk.prepared_ranges(&segment).is_empty(), "single adds prepared space");

    // About 140 KB: a bulk add. Half of the items expire, for the rewrite below.
    let expiring = |first: usize| {
        batch(first, 400)
            .into_iter()
            .enumerate()
            .map(|(k, item)| if k % 2 == 0 { item.with_ttl(60) } else { item })
            .collect::<Vec<_>>()
    };
    let before = frames_end();
    store.add(expiring(3)).expect("bulk add");
    store.flush().expect("flush");
    let end = frames_end();
    let appended = end - before;
    assert!(
        appended > 64 << 10,
        "the batch is too short to be a bulk add: {appended} bytes"
    );
    assert_eq!(disk.prepared_ranges(&segment), vec![(end, end + 2 * appended)]);
    let allocated = disk.file_bytes(&segment).expect("segment").len() as u64;
    assert!(
        allocated >= end + 2 * appended,
        "room for two more not allocated: {allocated} bytes"
    );

    // The next bulk add appends into the prepared space without allocating first.
    disk.record_calls(true);
    store.add(expiring(403)).expect("second bulk add");
    store.flush().expect("flush");
    let calls = disk.call_log();
    let append = calls
        .iter()
        .position(|call| call.kind == CallKind::Append && call.path == segment)
        .expect("the second bulk add appended");
    assert!(
        !calls[..append]
            .iter()
            .any(|call| call.kind == CallKind::Allocate && call.path == segment),
        "the second bulk add allocated before its append"
    );
    let second_end = frames_end();
    assert!(
        second_end <= end + 2 * appended,
        "the second bulk add wrote past the prepared space"
    );
    let prepared = disk.prepared_ranges(&segment);
    assert_eq!(prepared.len(), 1, "{prepared:?}");
    assert_eq!(prepared[0].0, end);
    assert!(prepared[0].1 >= second_end + (second_end - end), "{prepared:?}");
    disk.record_calls(false);

    // A compaction rewrites the sealed segment without its expired items, into prepared space.
    clock.advance(120);
    let report = store.compact().expect("compact");
    assert_eq!(report.segments_rewritten, 1, "{report:?}");
    assert_eq!(report.reclaimed_expired, 400);
    let rewritten = disk.file_bytes(&segment).expect("rewritten segment");
    assert_eq!(
        common::frames_end(&rewritten),
        rewritten.len(),
        "zeros past the rewrite's frames"
    );
    assert_eq!(disk.prepared_ranges(&segment), vec![(0, rewritten.len() as u64)]);

    // Closing writes a checkpoint, prepared whole.
    drop(store);
    let checkpoints: Vec<String> = disk
        .file_names(Path::new(DIR))
        .into_iter()
        .filter(|name| name.ends_with(".idx"))
        .collect();
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    let checkpoint = Path::new(DIR).join(&checkpoints[0]);
    let len = disk.file_bytes(&checkpoint).expect("checkpoint").len() as u64;
    assert_eq!(disk.prepared_ranges(&checkpoint), vec![(0, len)]);
    let store = open();
    let mut ids = common::ids(&store.get(&ContextQuery::new()).expect("get"));
    ids.sort();
    let mut want: Vec<String> = (0..3)
        .chain((3..803).filter(|n| (n - 3) % 400 % 2 == 1))
        .map(|n| format!("doc-{n}"))
        .collect();
    want.sort();
    assert_eq!(ids, want, "after the compaction and a reopen");
    assert!(store.verify().expect("verify").is_ok());
}

/// A bulk group of several megabytes gets at most 8 MiB prepared ahead of it, not two more of its size.
#[test]
fn the_space_prepared_ahead_of_a_large_group_is_bounded() {
    let disk = SimDisk::new();
    let store = Options::new()
        .storage(Arc::new(disk.clone()))
        .clock(Arc::new(ManualClock::new(common::NOW)))
        .auto_compact(false)
        .open("/sim/store")
        .expect("open");
    let segment = Path::new("/sim/store").join("00000001.seg");
    store.add(batch(0, 12_500)).expect("bulk add");
    store.flush().expect("flush");
    let end = common::frames_end(&disk.file_bytes(&segment).expect("segment")) as u64;
    assert!(
        end > 4 << 20,
        "the group is too short for the bound to matter: {end} bytes"
    );
    assert_eq!(disk.prepared_ranges(&segment), vec![(end, end + (8 << 20))]);
}

/// A bulk batch's frame is appended straight from the buffer it was built in when nothing is
/// buffered before it in its group, and single adds that share the group are buffered behind it:
/// every one must land where the index says, through rotations and across a reopen.
#[test]
fn bulk_frames_written_straight_keep_their_place_among_single_adds() {
    const BULK: usize = 12;
    const PER_BULK: usize = 400;
    const SINGLE_THREADS: usize = 4;
    const SINGLES: usize = 60;
    let dir = tempfile::tempdir().expect("temp dir");
    let open = || {
        Options::new()
            .clock(Arc::new(ManualClock::new(common::NOW)))
            .segment_size(2 << 20)
            .auto_compact(false)
            .open(dir.path())
            .expect("open")
    };
    let store = open();
    std::thread::scope(|scope| {
        let bulk = store.clone();
        scope.spawn(move || {
            for b in 0..BULK {
                bulk.add(batch(b * PER_BULK, PER_BULK)).expect("bulk add");
            }
        });
        for t in 0..SINGLE_THREADS {
            let single = store.clone();
            scope.spawn(move || {
                for k in 0..SINGLES {
                    single
                        .add(batch(BULK * PER_BULK + t * SINGLES + k, 1))
                        .expect("single add");
                }
            });
        }
    });
    let count = BULK * PER_BULK + SINGLE_THREADS * SINGLES;
    assert!(store.stats().segments > 1, "the bulk adds did not fill a segment");
    assert_holds(&store, count, "before close");
    drop(store);
    let store = open();
    assert_holds(&store, count, "after reopen");
}
