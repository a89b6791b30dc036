//! The scrub (`Options::scrub_bytes_per_sec`): it finds damage no read and no opening looks at (a
//! sealed segment a checkpoint covers), and damage no CRC can see (content changed under recomputed
//! CRCs), reports each problem once through `Stats::scrub`, keeps to its rate, stops at once when the
//! store closes, and does not run when it is off or the store is read-only.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ctxlog::*;
use serde_json::json;

/// A store of about 600 KiB over several 64 KiB segments, closed (with its checkpoint).
fn write_store(dir: &Path, clock: &Arc<ManualClock>) {
    let store = Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(64 << 10)
        .scrub_bytes_per_sec(0)
        .open(dir)
        .expect("open");
    for batch in 0..30 {
        let items: Vec<ContextItem> = (0..20)
            .map(|i| {
                let n = batch * 20 + i;
                item(
                    &format!("c{n}"),
                    NOW - 1000 + n,
                    "1",
                    json!({"text": incompressible(&format!("c{n}"), 900)}),
                )
            })
            .collect();
        store.add(items).expect("add");
    }
}

fn scrubbing(dir: &Path, clock: &Arc<ManualClock>, bytes_per_sec: u64) -> Store {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(64 << 10)
        .scrub_bytes_per_sec(bytes_per_sec)
        .scrub_interval(Duration::from_millis(1))
        .open(dir)
        .expect("open")
}

/// The scrub's figures once it has made `passes` passes (waiting up to 30 s).
fn after_passes(store: &Store, passes: u64) -> ScrubStats {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scrub = store.stats().scrub;
        if scrub.passes >= passes {
            return scrub;
        }
        assert!(Instant::now() < deadline, "no {passes} scrub passes in 30 s: {scrub:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The frame of a segment file holding byte `at`: (start, end).
fn frame_around(bytes: &[u8], at: usize) -> (usize, usize) {
    let mut start = 32;
    loop {
        let len = u32::from_le_bytes(bytes[start..start + 4].try_into().expect("4 bytes")) as usize;
        let end = start + 17 + len;
        if at < end {
            return (start, end);
        }
        start = end;
    }
}

/// The first segment file holding `id`'s record, with its bytes and the record's place.
fn segment_holding(dir: &Path, id: &str) -> (std::path::PathBuf, Vec<u8>, (usize, usize, usize)) {
    let path = segment_files(dir).into_iter().next().expect("a segment");
    let bytes = std::fs::read(&path).expect("read");
    let place = locate_record(&bytes, id);
    (path, bytes, place)
}

#[test]
fn the_scrub_finds_damage_that_opening_and_reads_pass_by() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    // A content byte of a record in the oldest (sealed) segment, which the checkpoint spares
    // opening from reading.
    let (path, bytes, (_, body, body_len)) = segment_holding(dir.path(), "c3");
    let at = body + body_len - 40;
    write_at(&path, at, &[bytes[at] ^ 0x04]);
    let (frame_start, _) = frame_around(&bytes, at);

    let store = scrubbing(dir.path(), &clock, 64 << 20);
    assert!(
        store.stats().recovery.checkpoint_seq.is_some(),
        "opened from the checkpoint"
    );
    let scrub = after_passes(&store, 2);
    assert_eq!(
        scrub.problems.len(),
        1,
        "one problem, reported once over two passes: {scrub:?}"
    );
    let problem = &scrub.problems[0];
    assert_eq!(problem.file, path);
    assert_eq!(problem.offset, frame_start as u64, "{problem:?}");
    assert!(scrub.bytes_checked >= 2 * 500_000, "{scrub:?}");
    assert!(scrub.records_checked >= 2 * 600, "{scrub:?}");
    // A read of the damaged record reports it too (its record CRC), never returns it.
    assert!(matches!(
        store.resolve(["c3"]).expect("resolve")[0],
        Resolution::HashMismatch { .. }
    ));
}

#[test]
fn the_scrub_finds_content_changed_under_recomputed_crcs() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let (path, mut bytes, (record, body, body_len)) = segment_holding(dir.path(), "c5");
    let at = body + body_len - 40;
    bytes[at] = if bytes[at] == b'a' { b'b' } else { b'a' };
    // The record's CRC over its body, then the frame's over its records.
    let record_crc = crc32fast::hash(&bytes[body..body + body_len]);
    bytes[record + 5..record + 9].copy_from_slice(&record_crc.to_le_bytes());
    let (start, end) = frame_around(&bytes, at);
    let frame_crc = crc32fast::hash(&bytes[start + 8..end]);
    bytes[start + 4..start + 8].copy_from_slice(&frame_crc.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write the forgery");

    let store = scrubbing(dir.path(), &clock, 64 << 20);
    let scrub = after_passes(&store, 1);
    assert_eq!(scrub.problems.len(), 1, "{scrub:?}");
    let problem = &scrub.problems[0];
    assert_eq!((&problem.file, problem.offset), (&path, record as u64), "{problem:?}");
    assert!(
        problem.reason.contains("\"c5\"") && problem.reason.contains("hash"),
        "{problem:?}"
    );
    // `verify` agrees.
    let verified = store.verify().expect("verify");
    assert!(verified.problems.contains(problem), "{verified:?}");
}

#[test]
fn a_pass_keeps_to_its_rate() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let opened = Instant::now();
    let rate = 1 << 20;
    let store = scrubbing(dir.path(), &clock, rate);
    let scrub = after_passes(&store, 1);
    let took = opened.elapsed();
    assert!(scrub.problems.is_empty(), "{scrub:?}");
    assert!(scrub.bytes_checked > 500_000, "{scrub:?}");
    // Sleeping keeps it from going faster; nothing makes it go slower but the machine.
    #[allow(clippy::cast_precision_loss)]
    let least = Duration::from_secs_f64(scrub.bytes_checked as f64 / rate as f64 * 0.9);
    assert!(took >= least, "a pass of {} bytes took {took:?}", scrub.bytes_checked);
    assert_eq!(scrub.bytes_per_sec, rate);
}

#[test]
fn closing_stops_a_slow_pass_at_once() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let store = scrubbing(dir.path(), &clock, 1024);
    std::thread::sleep(Duration::from_millis(200));
    let scrub = store.stats().scrub;
    assert_eq!(scrub.passes, 0, "a pass at 1 KiB/s is far from done: {scrub:?}");
    let closing = Instant::now();
    drop(store);
    assert!(
        closing.elapsed() < Duration::from_secs(5),
        "closing took {:?}",
        closing.elapsed()
    );
}

#[test]
fn no_scrub_when_it_is_off_or_the_store_is_read_only() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let store = scrubbing(dir.path(), &clock, 0);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(store.stats().scrub, ScrubStats::default());
    drop(store);

    let store = Options::new()
        .clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .scrub_interval(Duration::from_millis(1))
        .read_only(true)
        .open(dir.path())
        .expect("read-only open");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(store.stats().scrub, ScrubStats::default());

    assert!(matches!(
        Options::new().scrub_interval(Duration::ZERO).open(dir.path().join("other")),
        Err(Error::Invalid { field, .. }) if field == "scrub_interval"
    ));
}

#[test]
fn a_sound_store_stays_clean_under_writers_deletes_and_compaction() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let store = scrubbing(dir.path(), &clock, 256 << 20);
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                for round in 0..60 {
                    let items: Vec<ContextItem> = (0..10)
                        .map(|i| {
                            let id = format!("w{w}-{}", (round * 10 + i) % 150);
                            item(&id, NOW, &format!("{round}"), json!({"text": incompressible(&id, 700)}))
                        })
                        .collect();
                    store.add(items).expect("add");
                    if round % 10 == 9 {
                        store.delete(&format!("c{}", w * 100 + round)).expect("delete");
                        store.compact().expect("compact");
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer");
    }
    let passes = store.stats().scrub.passes;
    let scrub = after_passes(&store, passes + 2);
    assert!(scrub.problems.is_empty(), "{:?}", scrub.problems);
    assert!(store.verify().expect("verify").is_ok());
}

/// `verify` checks segments on several threads, then whether each continues the log where the one
/// before ends: a sealed segment whose header says it starts later (opening from the checkpoint
/// never reads its frames) is named, at its header's base seq.
#[test]
fn verify_names_a_segment_that_does_not_continue_the_log() {
    let clock = clock_at(NOW);
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path(), &clock);
    let second = segment_files(dir.path()).into_iter().nth(1).expect("a second segment");
    let mut header = std::fs::read(&second).expect("read")[..32].to_vec();
    let base = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
    header[16..24].copy_from_slice(&(base + 1).to_le_bytes());
    let crc = crc32fast::hash(&header[..28]);
    header[28..32].copy_from_slice(&crc.to_le_bytes());
    write_at(&second, 0, &header);

    let store = Options::new()
        .clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .read_threads(2)
        .read_only(true)
        .open(dir.path())
        .expect("opens from the checkpoint");
    let report = store.verify().expect("verify");
    let chain = report
        .problems
        .iter()
        .find(|p| p.file == second && p.offset == 16)
        .unwrap_or_else(|| panic!("no chain problem: {:?}", report.problems));
    assert!(
        chain
            .reason
            .contains(&format!("starts at seq {}, expected {base}", base + 1)),
        "{chain:?}"
    );
    assert_eq!(report.segments_checked, segment_files(dir.path()).len() as u64);
}
