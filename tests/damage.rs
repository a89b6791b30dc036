//! Damage to segment files is either repaired by the documented recovery policy or reported, and never
//! returned as data: garbage after the last frame of the newest segment (random bytes, a partial
//! frame, zeros) is truncated on open without losing anything acknowledged; every single-bit flip in
//! a small store's segments is refused on open, reported by `verify()`, answered as `HashMismatch`, or
//! (only inside the last frame of the newest segment, which cannot be told from a torn write)
//! truncated away; a damaged frame in a sealed segment and a missing segment are `Error::Corrupt`
//! naming the file, and leave the files as they were; a newest segment torn while its header was being
//! written is removed and the store opens with everything before it.

mod common;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use common::copy_store;
use ctxlog::*;
use serde_json::json;
use sha2::{Digest, Sha256};

/// The smallest segment size accepted, so that a few batches span several segments.
const SEGMENT_SIZE: u64 = 4096;
const SEGMENT_HEADER_BYTES: usize = 32;
const FRAME_HEADER_BYTES: usize = 17;
const CLOCK_START: i64 = 1_700_000_000;

fn open_store(dir: &Path) -> Result<Store> {
    options_on(&Arc::new(ManualClock::new(CLOCK_START))).open(dir)
}

/// Durable adds, 4 KiB segments, time from `clock`.
fn options_on(clock: &Arc<ManualClock>) -> Options {
    Options::new()
        .durability(Durability::Immediate)
        .segment_size(SEGMENT_SIZE)
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
}

/// An item whose content carries `text_len` bytes of text.
fn item(id: &str, text_len: usize) -> ContextItem {
    // Pseudo-random hex from the id: the log's LZ4 cannot shrink it, so the sizes the tests rely on
    // (segments spanned, frames per segment) hold.
    let text = common::incompressible(id, text_len);
    ContextItem::new(
        id,
        "document_chunk",
        json!({"id": id, "text": text, "n": text_len}),
        "damage-test",
        CLOCK_START,
        "1",
        Scope::GlobalWritable,
    )
}

/// The item as the store must give it back: with its content hash.
fn stored(item: &ContextItem) -> ContextItem {
    let digest = Sha256::digest(canonical_json(&item.content));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    item.clone().with_hash(format!("sha256:{hex}"))
}

/// The byte ranges of the frames of a segment, read from their length fields. An open store's
/// newest segment ends in zeros: space allocated ahead of its appends.
fn frames(bytes: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = SEGMENT_HEADER_BYTES;
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        if bytes[at..].iter().all(|byte| *byte == 0) {
            return out;
        }
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let end = at + FRAME_HEADER_BYTES + len;
        assert!(
            end <= bytes.len(),
            "frame at {at} runs past the end of a pristine segment"
        );
        out.push(at..end);
        at = end;
    }
    assert_eq!(at, bytes.len(), "a pristine segment ends inside a frame header");
    out
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Checks that the store holds exactly `items`, each as written, through `resolve` and `get`.
fn assert_holds_exactly(store: &Store, items: &[ContextItem], context: &str) {
    let ids: Vec<&str> = items.iter().map(|item| item.id.as_str()).collect();
    let resolutions = store
        .resolve(&ids)
        .unwrap_or_else(|e| panic!("{context}: resolve failed: {e}"));
    for (item, resolution) in items.iter().zip(resolutions) {
        match resolution {
            Resolution::Found(found) => assert_eq!(found, stored(item), "{context}: {} came back different", item.id),
            other => panic!("{context}: {} resolves to {other:?}", item.id),
        }
    }
    let mut got = store
        .get(&ContextQuery::new())
        .unwrap_or_else(|e| panic!("{context}: get failed: {e}"));
    got.sort_by(|a, b| a.id.cmp(&b.id));
    let mut expected: Vec<ContextItem> = items.iter().map(stored).collect();
    expected.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(
        got, expected,
        "{context}: get does not return exactly the items written"
    );
    let report = store
        .verify()
        .unwrap_or_else(|e| panic!("{context}: verify failed: {e}"));
    assert!(
        report.is_ok(),
        "{context}: verify found problems: {:?}",
        report.problems
    );
}

/// Writes `batches` (one `add` each) into a new store in `dir` and closes it.
fn write_batches(dir: &Path, batches: &[Vec<ContextItem>]) {
    let store = open_store(dir).expect("opening a new store");
    for batch in batches {
        store.add(batch.clone()).expect("add");
    }
}

/// Batches of medium items that span several 4 KiB segments.
fn spanning_batches(prefix: &str, count: usize) -> Vec<Vec<ContextItem>> {
    (0..count)
        .map(|b| {
            (0..3)
                .map(|i| item(&format!("{prefix}{b}-{i}"), 300 + 40 * i))
                .collect()
        })
        .collect()
}

/// Copies every file of a store into another directory.
fn remove_checkpoints(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("listing the store") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "idx") {
            std::fs::remove_file(&path).expect("removing a checkpoint");
        }
    }
}

/// A deterministic PRNG (SplitMix64) for garbage bytes.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)).to_le_bytes()[0]
        })
        .collect()
}

#[test]
fn garbage_after_the_newest_segment_is_truncated_on_open() {
    let batches = spanning_batches("g", 8);
    let written: Vec<ContextItem> = batches.iter().flatten().cloned().collect();
    let pristine = tempfile::tempdir().expect("temp dir");
    write_batches(pristine.path(), &batches);
    let segments = common::segment_files(pristine.path());
    assert!(
        segments.len() >= 3,
        "the store should span several segments, has {segments:?}"
    );
    let newest = segments.last().expect("a segment").clone();
    let newest_bytes = std::fs::read(&newest).expect("reading the newest segment");
    let last_frame = frames(&newest_bytes).pop().expect("the newest segment holds a frame");
    let frame_bytes = &newest_bytes[last_frame];

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", garbage(7, 300)),
        ("a single random byte", garbage(11, 1)),
        (
            "half a copy of the last frame",
            frame_bytes[..frame_bytes.len() / 2].to_vec(),
        ),
        (
            "a copy of the last frame's header",
            frame_bytes[..FRAME_HEADER_BYTES].to_vec(),
        ),
        (
            "a copy of the last frame but its final byte",
            frame_bytes[..frame_bytes.len() - 1].to_vec(),
        ),
        ("a page of zeros", vec![0u8; 4096]),
    ];
    for (what, tail) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        copy_store(pristine.path(), dir.path());
        let damaged = dir.path().join(file_name(&newest));
        let mut bytes = newest_bytes.clone();
        bytes.extend_from_slice(&tail);
        std::fs::write(&damaged, &bytes).expect("appending garbage");

        let store = open_store(dir.path()).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
        // Zeros are what a store that was not closed leaves of the space it allocated ahead.
        let zeros = tail.iter().all(|byte| *byte == 0);
        let recovery = store.stats().recovery;
        assert_eq!(
            (recovery.truncated_bytes, recovery.unwritten_bytes),
            if zeros {
                (0, tail.len() as u64)
            } else {
                (tail.len() as u64, 0)
            },
            "{what}: (truncated_bytes, unwritten_bytes) do not count the bytes appended"
        );
        assert_eq!(
            std::fs::metadata(&damaged).expect("stat").len(),
            newest_bytes.len() as u64,
            "{what}: the newest segment was not cut back to its last whole frame"
        );
        assert_holds_exactly(&store, &written, &format!("{what}, after recovery"));

        let more = vec![item("after-1", 50), item("after-2", 60)];
        store
            .add(more.clone())
            .unwrap_or_else(|e| panic!("{what}: add after recovery failed: {e}"));
        let mut all = written.clone();
        all.extend(more);
        assert_holds_exactly(&store, &all, &format!("{what}, after a new add"));
        drop(store);

        let store = open_store(dir.path()).unwrap_or_else(|e| panic!("{what}: second open failed: {e}"));
        let recovery = store.stats().recovery;
        assert_eq!(recovery.truncated_bytes, 0, "{what}: the second open truncated again");
        assert!(
            !recovery.removed_torn_segment,
            "{what}: the second open removed a segment"
        );
        assert_holds_exactly(&store, &all, &format!("{what}, after reopening"));
    }
}

/// How one bit flip was caught, or that it was not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Detection {
    CorruptOnOpen,
    ReportedByVerify,
    HashMismatchOnResolve,
    TruncatedAsTornTail,
    /// The store opened, `verify()` is ok and every item resolved: the flip went unnoticed.
    Undetected,
}

/// The pristine store of the bit-flip test: its files' bytes, the batches, and where frames are.
struct Pristine {
    files: Vec<(String, Vec<u8>)>,
    batches: Vec<Vec<ContextItem>>,
    /// The byte range of the last frame of the newest segment.
    last_frame: Range<usize>,
}

/// Opens the work copy of the pristine store with bit `bit` of byte `at` of file `file` flipped and
/// says how the damage was caught (failing the test if it was not, or if wrong data was returned),
/// then puts the work copy back as it was.
fn classify_flip(dir: &Path, pristine: &Pristine, file: usize, at: usize, bit: u8) -> Detection {
    let path = dir.join(&pristine.files[file].0);
    let detection = classify_flip_in_place(dir, pristine, file, at, bit);
    // Undo the flip in place; rewrite whole files only where opening changed them (a truncated tail).
    let byte = [pristine.files[file].1[at]];
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &byte, at as u64))
        .expect("undoing the flip");
    for path in common::segment_files(dir) {
        match pristine.files.iter().find(|(name, _)| *name == file_name(&path)) {
            Some((_, bytes)) => {
                if std::fs::read(&path).expect("reading a segment copy") != *bytes {
                    std::fs::write(&path, bytes).expect("restoring a segment copy");
                }
            }
            None => std::fs::remove_file(&path).expect("removing a segment an open created"),
        }
    }
    detection
}

/// Writes the pristine store into `dir` (the flip test's work directory).
fn write_pristine(dir: &Path, pristine: &Pristine) {
    for (name, bytes) in &pristine.files {
        std::fs::write(dir.join(name), bytes).expect("writing a segment copy");
    }
}

/// Flips the bit in the work copy, opens it and classifies what happened.
fn classify_flip_in_place(dir: &Path, pristine: &Pristine, file: usize, at: usize, bit: u8) -> Detection {
    let byte = [pristine.files[file].1[at] ^ (1 << bit)];
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(&pristine.files[file].0))
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &byte, at as u64))
        .expect("flipping the bit");
    let flipped_name = &pristine.files[file].0;
    let context = format!("bit {bit} of byte {at} of {flipped_name}");
    let newest = file + 1 == pristine.files.len();
    let in_last_frame = newest && pristine.last_frame.contains(&at);

    let store = match open_store(dir) {
        Ok(store) => store,
        Err(Error::Corrupt {
            file: corrupt_file,
            offset,
            reason,
        }) => {
            assert_eq!(
                file_name(&corrupt_file),
                *flipped_name,
                "{context}: Corrupt names another file ({reason})"
            );
            assert!(
                offset <= at as u64,
                "{context}: Corrupt names offset {offset}, after the damage ({reason})"
            );
            return Detection::CorruptOnOpen;
        }
        Err(other) => panic!("{context}: open failed with something other than Corrupt: {other}"),
    };

    let truncated = store.stats().recovery.truncated_bytes;
    let report = store
        .verify()
        .unwrap_or_else(|e| panic!("{context}: verify failed: {e}"));
    let mut hash_mismatch = false;
    let mut missing = Vec::new();
    for (batch_index, batch) in pristine.batches.iter().enumerate() {
        let ids: Vec<&str> = batch.iter().map(|item| item.id.as_str()).collect();
        let resolutions = store
            .resolve(&ids)
            .unwrap_or_else(|e| panic!("{context}: resolve failed: {e}"));
        for (item, resolution) in batch.iter().zip(resolutions) {
            match resolution {
                Resolution::Found(found) => {
                    assert_eq!(found, stored(item), "{context}: {} came back different", item.id);
                }
                Resolution::HashMismatch { id } => {
                    assert_eq!(id, item.id, "{context}: HashMismatch for another id");
                    hash_mismatch = true;
                }
                Resolution::NotFound { .. } => missing.push((batch_index, item.id.clone())),
                other => panic!("{context}: {} resolves to {other:?}", item.id),
            }
        }
    }
    match store.get(&ContextQuery::new()) {
        Ok(items) => {
            for found in items {
                let written = pristine
                    .batches
                    .iter()
                    .flatten()
                    .find(|item| item.id == found.id)
                    .unwrap_or_else(|| panic!("{context}: get returned an id never written: {:?}", found.id));
                assert_eq!(found, stored(written), "{context}: get returned {} different", found.id);
            }
        }
        Err(Error::Corrupt { .. }) => {}
        Err(other) => panic!("{context}: get failed with something other than Corrupt: {other}"),
    }

    if truncated > 0 {
        assert!(
            in_last_frame,
            "{context}: recovery truncated {truncated} bytes as a torn tail, but the flip is not in the last frame \
             of the newest segment: acknowledged data was dropped"
        );
        assert_eq!(
            truncated,
            pristine.last_frame.len() as u64,
            "{context}: truncated another length than the last frame"
        );
        let last_batch = pristine.batches.len() - 1;
        let expected_missing: Vec<(usize, String)> = pristine.batches[last_batch]
            .iter()
            .map(|item| (last_batch, item.id.clone()))
            .collect();
        assert_eq!(
            missing, expected_missing,
            "{context}: the truncated batch is not exactly the last one"
        );
        assert!(
            report.is_ok(),
            "{context}: verify after truncation: {:?}",
            report.problems
        );
        return Detection::TruncatedAsTornTail;
    }
    assert!(
        missing.is_empty(),
        "{context}: items silently missing without any truncation: {missing:?}"
    );
    if !report.is_ok() {
        return Detection::ReportedByVerify;
    }
    if hash_mismatch {
        return Detection::HashMismatchOnResolve;
    }
    Detection::Undetected
}

/// Two batches of two ~1 KB items fill the first 4 KiB segment past its size, so the second starts
/// segment 2; the third batch (small, so that its frame is the short torn-tail region) follows it there.
fn flip_test_batches() -> Vec<Vec<ContextItem>> {
    vec![
        vec![item("f1-a", 900), item("f1-b", 900)],
        vec![item("f2-a", 900), item("f2-b", 900)],
        vec![item("f3-a", 10), item("f3-b", 12)],
    ]
}

#[test]
fn every_single_bit_flip_is_detected() {
    let started = Instant::now();
    let batches = flip_test_batches();
    let dir = tempfile::tempdir().expect("temp dir");
    write_batches(dir.path(), &batches);
    let files: Vec<(String, Vec<u8>)> = common::segment_files(dir.path())
        .iter()
        .map(|path| (file_name(path), std::fs::read(path).expect("reading a segment")))
        .collect();
    let layout: Vec<usize> = files.iter().map(|(_, bytes)| frames(bytes).len()).collect();
    assert_eq!(
        layout,
        [1, 2],
        "expected segment 1 with batch 1 and segment 2 with batches 2 and 3"
    );
    let last_frame = frames(&files[1].1).pop().expect("a last frame");
    let total_bytes: usize = files.iter().map(|(_, bytes)| bytes.len()).sum();
    assert!(
        total_bytes < 6000,
        "the store is {total_bytes} bytes, too large for the exhaustive loop"
    );
    let pristine = Pristine {
        files,
        batches,
        last_frame,
    };

    let flips: Vec<(usize, usize, u8)> = pristine
        .files
        .iter()
        .enumerate()
        .flat_map(|(file, (_, bytes))| (0..bytes.len()).flat_map(move |at| (0..8u8).map(move |bit| (file, at, bit))))
        .collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 4);
    let (counts, undetected) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let pristine = &pristine;
                let flips = &flips;
                scope.spawn(move || {
                    let dir = tempfile::tempdir().expect("temp dir");
                    write_pristine(dir.path(), pristine);
                    let mut counts = BTreeMap::new();
                    let mut undetected = Vec::new();
                    for &(file, at, bit) in flips.iter().skip(worker).step_by(workers) {
                        let flip = format!("bit {bit} of byte {at} of {}", pristine.files[file].0);
                        // A panic (in ctxlog or in a check above) is reported with the flip that caused it.
                        let detection = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            classify_flip(dir.path(), pristine, file, at, bit)
                        }))
                        .unwrap_or_else(|_| panic!("{flip}: panicked (message above)"));
                        *counts.entry(detection).or_insert(0u64) += 1;
                        if detection == Detection::Undetected {
                            undetected.push(flip);
                        }
                    }
                    (counts, undetected)
                })
            })
            .collect();
        let mut total = BTreeMap::new();
        let mut undetected = Vec::new();
        for handle in handles {
            let (counts, missed) = handle.join().expect("a flip worker panicked");
            for (detection, count) in counts {
                *total.entry(detection).or_insert(0) += count;
            }
            undetected.extend(missed);
        }
        (total, undetected)
    });

    println!(
        "bit flips: {} flips over {total_bytes} bytes in {:.1?}: {counts:?}",
        flips.len(),
        started.elapsed()
    );
    assert!(
        undetected.is_empty(),
        "{} flips went unnoticed (the store opened, verify() is ok and every item resolved as written), e.g. {:?}",
        undetected.len(),
        &undetected[..undetected.len().min(10)]
    );
    assert_eq!(
        counts.get(&Detection::TruncatedAsTornTail).copied().unwrap_or(0),
        pristine.last_frame.len() as u64 * 8,
        "exactly the flips inside the last frame of the newest segment are torn tails"
    );
}

#[test]
fn damage_inside_a_sealed_segment_is_corrupt() {
    let batches = spanning_batches("s", 8);
    let pristine = tempfile::tempdir().expect("temp dir");
    write_batches(pristine.path(), &batches);
    let segments = common::segment_files(pristine.path());
    assert!(
        segments.len() >= 2,
        "the store should span several segments, has {segments:?}"
    );
    let sealed = &segments[0];
    let sealed_bytes = std::fs::read(sealed).expect("reading segment 1");
    let sealed_frames = frames(&sealed_bytes);
    assert!(sealed_frames.len() >= 2, "segment 1 should hold several frames");
    // A clean close leaves a checkpoint, and an open from a checkpoint does not re-read the sealed
    // segments it covers (damage there is found by reads and verify(), see
    // `damage_under_a_checkpoint_is_found_by_verify`). Without it, opening replays them and must refuse.
    remove_checkpoints(pristine.path());

    // A frame in the middle of the segment, and its last one (which in a sealed segment is no torn tail).
    for (what, frame) in [
        ("its first frame", sealed_frames[0].clone()),
        ("its last frame", sealed_frames[sealed_frames.len() - 1].clone()),
    ] {
        for at in [
            frame.start + (frame.end - frame.start) / 2,
            frame.end - 1,
            frame.start + 1,
        ] {
            let context = format!("segment 1, {what}, byte {at}");
            let dir = tempfile::tempdir().expect("temp dir");
            copy_store(pristine.path(), dir.path());
            let damaged_path = dir.path().join(file_name(sealed));
            let mut damaged = sealed_bytes.clone();
            damaged[at] ^= 0x5A;
            std::fs::write(&damaged_path, &damaged).expect("writing the damage");

            for attempt in ["first open", "second open"] {
                match open_store(dir.path()) {
                    Err(Error::Corrupt { file, offset, reason }) => {
                        assert_eq!(
                            file_name(&file),
                            file_name(sealed),
                            "{context}, {attempt}: Corrupt names another file"
                        );
                        assert!(
                            (frame.start as u64..=at as u64).contains(&offset),
                            "{context}, {attempt}: offset {offset} is not within the damaged frame before the \
                             damage ({frame:?}): {reason}"
                        );
                    }
                    Err(other) => panic!("{context}, {attempt}: expected Corrupt, got {other}"),
                    Ok(store) => panic!(
                        "{context}, {attempt}: opened a store with a damaged sealed segment (truncated {} bytes)",
                        store.stats().recovery.truncated_bytes
                    ),
                }
                assert_eq!(
                    std::fs::read(&damaged_path).expect("reading back"),
                    damaged,
                    "{context}, {attempt}: a refused open changed the damaged segment"
                );
            }
        }
    }
}

#[test]
fn a_missing_segment_is_corrupt() {
    let batches = spanning_batches("m", 10);
    let written: Vec<ContextItem> = batches.iter().flatten().cloned().collect();
    let pristine = tempfile::tempdir().expect("temp dir");
    write_batches(pristine.path(), &batches);
    let segments = common::segment_files(pristine.path());
    assert!(
        segments.len() >= 3,
        "the store should span three segments, has {segments:?}"
    );

    for (what, missing) in [("a middle segment", 1usize), ("the first segment", 0)] {
        let dir = tempfile::tempdir().expect("temp dir");
        copy_store(pristine.path(), dir.path());
        let missing_name = file_name(&segments[missing]);
        std::fs::remove_file(dir.path().join(&missing_name)).expect("removing a segment");
        let before: Vec<(PathBuf, Vec<u8>)> = common::segment_files(dir.path())
            .into_iter()
            .map(|path| {
                let bytes = std::fs::read(&path).expect("reading");
                (path, bytes)
            })
            .collect();

        match open_store(dir.path()) {
            Err(Error::Corrupt { file, reason, .. }) => {
                let named = file_name(&file);
                let neighbours: Vec<String> = segments[missing.saturating_sub(1)..=missing + 1]
                    .iter()
                    .map(|p| file_name(p))
                    .collect();
                assert!(
                    neighbours.contains(&named),
                    "{what}: Corrupt names {named}, not the gap at {missing_name}: {reason}"
                );
            }
            Err(other) => panic!("{what}: expected Corrupt, got {other}"),
            Ok(store) => panic!(
                "{what}: the store opened without {missing_name} ({} items)",
                store.stats().items
            ),
        }
        let after: Vec<(PathBuf, Vec<u8>)> = common::segment_files(dir.path())
            .into_iter()
            .map(|path| {
                let bytes = std::fs::read(&path).expect("reading");
                (path, bytes)
            })
            .collect();
        assert!(before == after, "{what}: a refused open changed the segment files");

        // Nothing was lost by refusing: with the segment back, everything is there.
        std::fs::copy(&segments[missing], dir.path().join(&missing_name)).expect("restoring the segment");
        let store = open_store(dir.path()).unwrap_or_else(|e| panic!("{what}: open after restoring failed: {e}"));
        assert_holds_exactly(&store, &written, &format!("{what} restored"));
    }
}

#[test]
fn a_newest_segment_torn_while_created_is_removed() {
    let batches = spanning_batches("t", 8);
    let written: Vec<ContextItem> = batches.iter().flatten().cloned().collect();
    let pristine = tempfile::tempdir().expect("temp dir");
    write_batches(pristine.path(), &batches);
    let segments = common::segment_files(pristine.path());
    assert!(
        segments.len() >= 2,
        "the store should span several segments, has {segments:?}"
    );
    let newest = u32::try_from(segments.len()).unwrap();
    let torn_number = newest + 1;
    let seq = {
        let store = open_store(pristine.path()).expect("open");
        store.stats().seq
    };

    // The header segment `torn_number` would get, as docs/FORMAT.md lays it out.
    let mut header = Vec::with_capacity(SEGMENT_HEADER_BYTES);
    header.extend_from_slice(b"CTXLOGSG");
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&torn_number.to_le_bytes());
    header.extend_from_slice(&(seq + 1).to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32fast::hash(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(header.len(), SEGMENT_HEADER_BYTES);

    for len in [0usize, 1, 8, 20, 31] {
        let context = format!("a {len}-byte header");
        let dir = tempfile::tempdir().expect("temp dir");
        copy_store(pristine.path(), dir.path());
        let torn = dir.path().join(format!("{torn_number:08}.seg"));
        std::fs::write(&torn, &header[..len]).expect("writing the torn segment");

        let store = open_store(dir.path()).unwrap_or_else(|e| panic!("{context}: open failed: {e}"));
        let stats = store.stats();
        assert!(
            stats.recovery.removed_torn_segment,
            "{context}: removed_torn_segment is false"
        );
        assert_eq!(stats.recovery.truncated_bytes, 0, "{context}: truncated bytes");
        assert_eq!(stats.seq, seq, "{context}: seq");
        assert_holds_exactly(&store, &written, &context);

        let more = vec![item("after-torn-1", 40), item("after-torn-2", 3000)];
        store
            .add(more.clone())
            .unwrap_or_else(|e| panic!("{context}: add failed: {e}"));
        let mut all = written.clone();
        all.extend(more);
        assert_holds_exactly(&store, &all, &format!("{context}, after a new add"));
        drop(store);

        let recreated = std::fs::read(&torn).unwrap_or_else(|e| panic!("{context}: segment {torn_number}: {e}"));
        assert!(
            recreated.len() > SEGMENT_HEADER_BYTES && recreated[..SEGMENT_HEADER_BYTES] == header[..],
            "{context}: segment {torn_number} was not created again with its whole header"
        );
        let store = open_store(dir.path()).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
        let recovery = store.stats().recovery;
        assert!(
            !recovery.removed_torn_segment,
            "{context}: the reopen removed a segment again"
        );
        assert_eq!(recovery.truncated_bytes, 0, "{context}: the reopen truncated");
        assert_holds_exactly(&store, &all, &format!("{context}, reopened"));
    }
}

/// The byte ranges of the records of a frame, with the id of each put.
fn records(bytes: &[u8], frame: &Range<usize>) -> Vec<(Range<usize>, String)> {
    let le_u32 = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
    let count = le_u32(frame.start + FRAME_HEADER_BYTES);
    let mut at = frame.start + FRAME_HEADER_BYTES + 4;
    let mut out = Vec::new();
    for _ in 0..count {
        let body = at + 9;
        let end = body + le_u32(at + 1);
        if bytes[at] == 7 {
            // The frame's sync mark (segment formats 2 and 3).
            at = end;
            continue;
        }
        // A put body: flags, scope, timestamp, ttl, confidence, hash (58 bytes), then the id.
        let id_len = bytes[body + 58] as usize;
        let id = String::from_utf8(bytes[body + 59..body + 59 + id_len].to_vec()).expect("UTF-8 id");
        out.push((at..end, id));
        at = end;
    }
    assert_eq!(at, frame.end, "the records do not fill their frame");
    out
}

fn write_byte(path: &Path, at: usize, byte: u8) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &[byte], at as u64))
        .expect("writing a byte in place");
}

#[test]
fn bit_rot_under_an_open_store_is_reported_never_returned() {
    let started = Instant::now();
    let batches = flip_test_batches();
    let written: Vec<ContextItem> = batches.iter().flatten().cloned().collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_store(dir.path()).expect("open");
    for batch in &batches {
        store.add(batch.clone()).expect("add");
    }
    let files: Vec<(PathBuf, Vec<u8>)> = common::segment_files(dir.path())
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).expect("reading a segment");
            (path, bytes)
        })
        .collect();
    assert_eq!(files.len(), 2, "expected a sealed (mapped) segment and an active one");

    let (mut in_records, mut outside_records) = (0u64, 0u64);
    for (path, bytes) in &files {
        let name = file_name(path);
        let layout = frames(bytes);
        let record_ranges: Vec<(Range<usize>, String)> =
            layout.iter().flat_map(|frame| records(bytes, frame)).collect();
        // The active segment's zeros past its last frame are allocated space, not data.
        let data_end = layout.last().map_or(SEGMENT_HEADER_BYTES, |frame| frame.end);
        for (at, bit) in (0..data_end).flat_map(|at| (0..8).map(move |bit| (at, bit))) {
            let context = format!("bit {bit} of byte {at} of {name}, flipped under an open store");
            write_byte(path, at, bytes[at] ^ (1 << bit));

            let report = store
                .verify()
                .unwrap_or_else(|e| panic!("{context}: verify failed: {e}"));
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| file_name(&p.file) == name && p.offset <= at as u64),
                "{context}: verify does not report it: {:?}",
                report.problems
            );

            let affected = record_ranges
                .iter()
                .find(|(range, _)| range.contains(&at))
                .map(|(_, id)| id.clone());
            let ids: Vec<&str> = written.iter().map(|item| item.id.as_str()).collect();
            // A short resolve reads its records under the index lock; a longer one (each id twice,
            // more than eight references) checks them under it and reads them after: both ways
            // must tell the damage.
            let resolutions: Vec<Resolution> = [ids.clone(), ids.repeat(2)]
                .iter()
                .flat_map(|refs| {
                    store
                        .resolve(refs)
                        .unwrap_or_else(|e| panic!("{context}: resolve failed: {e}"))
                })
                .collect();
            assert_eq!(resolutions.len(), 3 * written.len());
            for (item, resolution) in written.iter().cycle().zip(resolutions) {
                match resolution {
                    Resolution::HashMismatch { id } if Some(&item.id) == affected.as_ref() => {
                        assert_eq!(id, item.id, "{context}: HashMismatch names another id");
                    }
                    Resolution::Found(found) if Some(&item.id) != affected.as_ref() => {
                        assert_eq!(found, stored(item), "{context}: {} came back different", item.id);
                    }
                    other => panic!(
                        "{context}: {} resolves to {other:?} (the damaged record is {affected:?})",
                        item.id
                    ),
                }
            }
            match (store.get(&ContextQuery::new()), &affected) {
                (Ok(mut items), None) => {
                    items.sort_by(|a, b| a.id.cmp(&b.id));
                    let mut expected: Vec<ContextItem> = written.iter().map(stored).collect();
                    expected.sort_by(|a, b| a.id.cmp(&b.id));
                    assert_eq!(items, expected, "{context}: get returned other data");
                    outside_records += 1;
                }
                (Err(Error::Corrupt { file, .. }), Some(_)) => {
                    assert_eq!(file_name(&file), name, "{context}: get's Corrupt names another file");
                    in_records += 1;
                }
                (Ok(items), Some(id)) => panic!(
                    "{context}: get returned {} items although the record of {id} is damaged",
                    items.len()
                ),
                (Err(e), _) => panic!("{context}: get failed with {e} (damaged record: {affected:?})"),
            }

            write_byte(path, at, bytes[at]);
        }
    }
    assert_holds_exactly(&store, &written, "after undoing every flip");
    println!(
        "bit rot under an open store: {in_records} flips inside records (HashMismatch, get Corrupt, verify), \
         {outside_records} outside (verify only) in {:.1?}",
        started.elapsed()
    );
    assert!(
        in_records > 0 && outside_records > 0,
        "both kinds of flip must have been tried"
    );
}

#[test]
fn damage_under_a_checkpoint_is_found_by_verify() {
    let batches = spanning_batches("v", 8);
    let dir = tempfile::tempdir().expect("temp dir");
    write_batches(dir.path(), &batches);
    let segments = common::segment_files(dir.path());
    let sealed = &segments[0];
    let mut bytes = std::fs::read(sealed).expect("reading segment 1");
    let frame = frames(&bytes)[0].clone();
    let at = frame.start + (frame.end - frame.start) / 2;
    bytes[at] ^= 0x5A;
    std::fs::write(sealed, &bytes).expect("writing the damage");
    let store = open_store(dir.path()).expect("a checkpoint opens without re-reading sealed segments");
    assert!(
        store.stats().recovery.checkpoint_seq.is_some(),
        "the clean close left no checkpoint"
    );
    let report = store.verify().expect("verify");
    assert!(
        report.problems.iter().any(|p| file_name(&p.file) == file_name(sealed)),
        "verify missed the damage: {report:?}"
    );
}

/// Writes `source` over the bytes of `path` from `at` on (extending the file if it runs past the end).
fn copy_over(path: &Path, at: usize, source: &[u8]) {
    let mut bytes = std::fs::read(path).expect("reading the file to damage");
    if bytes.len() < at + source.len() {
        bytes.resize(at + source.len(), 0);
    }
    bytes[at..at + source.len()].copy_from_slice(source);
    std::fs::write(path, &bytes).expect("writing the damage");
}

/// Expects `Error::Corrupt` naming `file` at `offset`, with both in its message.
fn assert_corrupt_at(result: Result<Store>, file: &Path, offset: usize, context: &str) {
    match result {
        Err(error @ Error::Corrupt { .. }) => {
            let message = error.to_string();
            let Error::Corrupt {
                file: named,
                offset: at,
                ..
            } = error
            else {
                unreachable!()
            };
            assert_eq!(
                (file_name(&named), at),
                (file_name(file), offset as u64),
                "{context}: {message}"
            );
            assert!(
                message.contains(&file_name(file)) && message.contains(&format!("offset {offset}")),
                "{context}: the message does not name the file and offset: {message}"
            );
        }
        Err(other) => panic!("{context}: expected Corrupt, got {other}"),
        Ok(store) => panic!(
            "{context}: the store opened ({} bytes truncated, {} items)",
            store.stats().recovery.truncated_bytes,
            store.stats().items
        ),
    }
}

/// An id deleted and added again with the same version and content keeps the same (id, version,
/// hash) in both histories, in records of the same length. A frame of the first history copied over
/// the second's (in a segment the checkpoint covers, so that opening does not read it) used to be
/// returned as the item: the read checked the record's CRC, id, version and hash, all of which match.
#[test]
fn a_put_of_an_earlier_history_copied_over_the_current_one_is_never_returned() {
    let trap = |timestamp: i64, confidence: f64| {
        ContextItem::new(
            "trap",
            "document_chunk",
            json!({"text": "the same content in both histories"}),
            "damage-test",
            timestamp,
            "1",
            Scope::GlobalWritable,
        )
        .with_confidence(confidence)
    };
    // The second history differs in its timestamp and confidence, then in its confidence alone
    // (which only the record's CRC, kept in the index, tells apart).
    for second_timestamp in [CLOCK_START + 1, CLOCK_START] {
        earlier_history_copied_over(&trap, second_timestamp);
    }
}

fn earlier_history_copied_over(trap: &dyn Fn(i64, f64) -> ContextItem, second_timestamp: i64) {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = open_store(dir.path()).expect("open");
        store.add(vec![trap(CLOCK_START, 0.5)]).expect("add the first history");
        assert!(store.delete("trap").expect("delete"));
        store
            .add(vec![trap(second_timestamp, 0.25)])
            .expect("add the second history");
    }
    let segment = common::segment_files(dir.path()).pop().expect("a segment");
    let bytes = std::fs::read(&segment).expect("reading the segment");
    let layout = frames(&bytes);
    let (first, second) = (layout[0].clone(), layout[2].clone());
    assert_eq!(
        first.len(),
        second.len(),
        "both puts should take frames of the same length"
    );
    copy_over(&segment, second.start, &bytes[first]);

    let store = open_store(dir.path()).expect("opening from the checkpoint reads no frame");
    assert!(
        store.stats().recovery.checkpoint_seq.is_some(),
        "no checkpoint was used"
    );
    let resolved = store.resolve(["trap", "trap@1"]).expect("resolve");
    for resolution in resolved {
        assert_eq!(
            resolution,
            Resolution::HashMismatch { id: "trap".into() },
            "the first history's record was taken for the second's"
        );
    }
    match store.get(&ContextQuery::new()) {
        Err(Error::Corrupt { file, offset, .. }) => {
            assert_eq!(file_name(&file), file_name(&segment));
            assert!(
                (second.start as u64..second.end as u64).contains(&offset),
                "offset {offset}"
            );
        }
        other => panic!("get should fail with Corrupt, got {other:?}"),
    }
    let report = store.verify().expect("verify");
    assert!(
        report
            .problems
            .iter()
            .any(|p| file_name(&p.file) == file_name(&segment)),
        "verify misses the misplaced frame: {:?}",
        report.problems
    );
}

/// A rewritten segment may skip sequence numbers, so a whole frame with a later seq copied over its
/// last frame passed its scan, and the damage was blamed on the next segment ("starts at seq N, but
/// the log before it ends at M"), by opening and by verify(). Every frame must come before the next
/// segment's first seq: the error names the damaged segment and the frame's offset.
#[test]
fn a_frame_with_a_later_seq_in_a_rewritten_segment_is_corrupt_in_that_segment() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = open_store(dir.path()).expect("open");
        store.add(vec![item("pad-1", 3300)]).expect("add");
        store.add(vec![item("eq-a", 100)]).expect("add");
        store.add(vec![item("pad-2", 3300)]).expect("add");
        store.add(vec![item("eq-b", 100)]).expect("add");
        let mut newer = item("pad-1", 10);
        newer.version = "2".into();
        store.add(vec![newer]).expect("add");
        let report = store.compact().expect("compact");
        assert!(report.segments_rewritten >= 1, "{report:?}");
    }
    let segments = common::segment_files(dir.path());
    let rewritten = &segments[0];
    let rewritten_bytes = std::fs::read(rewritten).expect("reading segment 1");
    assert!(
        u32::from_le_bytes(rewritten_bytes[24..28].try_into().expect("4 bytes")) > 0,
        "segment 1 should have been rewritten"
    );
    let next_bytes = std::fs::read(&segments[1]).expect("reading segment 2");
    let frame_of = |bytes: &[u8], id: &[u8]| {
        frames(bytes)
            .into_iter()
            .find(|frame| bytes[frame.clone()].windows(id.len()).any(|w| w == id))
            .unwrap_or_else(|| panic!("no frame holds {}", String::from_utf8_lossy(id)))
    };
    let target = frame_of(&rewritten_bytes, b"eq-a");
    assert_eq!(target.end, rewritten_bytes.len(), "eq-a's frame should end segment 1");
    let source = frame_of(&next_bytes, b"eq-b");
    assert_eq!(
        target.len(),
        source.len(),
        "eq-a and eq-b should take frames of the same length"
    );
    copy_over(rewritten, target.start, &next_bytes[source]);

    // Opening from the checkpoint does not read segment 1; verify() does.
    let store = open_store(dir.path()).expect("open from the checkpoint");
    let report = store.verify().expect("verify");
    assert!(
        report
            .problems
            .iter()
            .any(|p| file_name(&p.file) == file_name(rewritten) && p.offset == target.start as u64),
        "verify does not report the frame at {} of {}: {:?}",
        target.start,
        file_name(rewritten),
        report.problems
    );
    drop(store);
    // A full replay refuses it, naming segment 1.
    remove_checkpoints(dir.path());
    assert_corrupt_at(open_store(dir.path()), rewritten, target.start, "full replay");
}

/// A whole frame with a good CRC at the tail of the newest segment, but not the seq expected there,
/// cannot be a torn write; it was truncated like one, and with it every acknowledged batch it had
/// overwritten. It is `Error::Corrupt` now, wherever it is.
#[test]
fn a_whole_frame_with_the_wrong_seq_at_the_tail_is_corrupt_not_a_torn_write() {
    let pristine = tempfile::tempdir().expect("temp dir");
    write_batches(
        pristine.path(),
        &[vec![item("w-1", 40)], vec![item("w-2", 40)], vec![item("w-3", 400)]],
    );
    remove_checkpoints(pristine.path());
    let newest = common::segment_files(pristine.path()).pop().expect("a segment");
    let bytes = std::fs::read(&newest).expect("reading the segment");
    let layout = frames(&bytes);
    assert_eq!(layout.len(), 3, "one segment with three frames");
    let (second, last) = (layout[1].clone(), layout[2].clone());
    for (what, at, source) in [
        // Overwrites the second frame and the start of the last one: two acknowledged batches.
        (
            "the last frame copied over the one before it",
            second.start,
            last.clone(),
        ),
        ("the first frame copied after the end", bytes.len(), layout[0].clone()),
        ("the last frame copied after the end", bytes.len(), last.clone()),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        copy_store(pristine.path(), dir.path());
        let damaged = dir.path().join(file_name(&newest));
        copy_over(&damaged, at, &bytes[source]);
        let before = std::fs::read(&damaged).expect("reading the damage");
        assert_corrupt_at(open_store(dir.path()), &damaged, at, what);
        assert_eq!(
            std::fs::read(&damaged).expect("reading back"),
            before,
            "{what}: a refused open changed the segment"
        );
    }
}

/// Opens `dir` as [`open_store`] does, on `clock`, with no background compaction.
fn open_on_clock(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    options_on(clock).auto_compact(false).open(dir).expect("open")
}

/// A record damaged under a good frame CRC (the byte changed and the frame's CRC computed again, as a
/// writer's bug would leave it) is caught by its own CRC whatever compaction does with it. A rewrite
/// copies a kept record as it is (the frame's CRC, checked, covers it): the damage moves with it and
/// reads still refuse it, and `verify()` still reports it. A record the rewrite retires is decoded
/// and its CRC checked first: the compaction fails with `Corrupt` naming the segment, and the kept
/// item still reads back whole.
#[test]
fn a_record_damaged_under_a_good_frame_crc_is_never_returned_after_a_compaction() {
    for damaged_id in ["kept", "expired"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(ManualClock::new(CLOCK_START));
        let kept = item("kept", 600);
        let expired = item("expired", 600).with_ttl(10);
        {
            let store = open_on_clock(dir.path(), &clock);
            store.add(vec![kept.clone(), expired.clone()]).expect("add");
        }
        let segment = common::segment_files(dir.path()).pop().expect("a segment");
        let mut bytes = std::fs::read(&segment).expect("reading the segment");
        let frame = frames(&bytes)[0].clone();
        let (_, body, body_len) = common::locate_record(&bytes, damaged_id);
        let at = body + body_len - 20;
        bytes[at] ^= 0x01;
        let crc = crc32fast::hash(&bytes[frame.start + 8..frame.end]);
        bytes[frame.start + 4..frame.start + 8].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&segment, &bytes).expect("writing the damage");

        let store = open_on_clock(dir.path(), &clock);
        clock.set(CLOCK_START + 11);
        let compacted = store.compact();
        let context = format!("{damaged_id} damaged");
        match (damaged_id, &compacted) {
            ("kept", Ok(report)) => assert_eq!(report.reclaimed_expired, 1, "{context}: {report:?}"),
            ("expired", Err(Error::Corrupt { file, offset, .. })) => {
                assert_eq!(file_name(file), file_name(&segment), "{context}");
                assert!(
                    (frame.start as u64..frame.end as u64).contains(offset),
                    "{context}: offset {offset}"
                );
            }
            _ => panic!("{context}: compaction gave {compacted:?}"),
        }
        let resolved = store.resolve(["kept"]);
        if damaged_id == "kept" {
            assert!(
                !matches!(resolved, Ok(ref answers) if matches!(answers[0], Resolution::Found(_))),
                "{context}: the damaged record was returned: {resolved:?}"
            );
            assert!(
                matches!(store.get(&ContextQuery::new()), Err(Error::Corrupt { .. })),
                "{context}: get does not refuse the damaged record"
            );
            let report = store.verify().expect("verify");
            assert!(
                !report.problems.is_empty(),
                "{context}: verify finds nothing after the compaction"
            );
        } else {
            assert_eq!(
                resolved.expect("resolve"),
                vec![Resolution::Found(stored(&kept))],
                "{context}: the kept item"
            );
        }
    }
}
