//! Replays every committed fuzz input, the seeds in `fuzz/seeds/<target>/` and the minimized crash
//! inputs in `fuzz/regressions/<target>/`, through the same checks the cargo-fuzz targets run
//! (`fuzz/harness.rs`), so that a plain `cargo test` keeps every past crash fixed without cargo-fuzz.

#[path = "../fuzz/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("listing fuzz inputs").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every input of `target`, and reports every one that panics, by file name.
fn replay(target: &str) {
    let run = harness::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, run)| *run)
        .expect("a known target");
    let seeds = inputs("seeds", target);
    assert!(!seeds.is_empty(), "no seed inputs for {target}");
    let mut failed = Vec::new();
    let all: Vec<PathBuf> = seeds.into_iter().chain(inputs("regressions", target)).collect();
    for path in &all {
        let data = std::fs::read(path).expect("reading a fuzz input");
        if std::panic::catch_unwind(|| run(&data)).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{target}: inputs that fail: {failed:#?}");
    println!("{target}: {} inputs replayed", all.len());
}

#[test]
fn every_target_has_a_test_here() {
    let names: Vec<&str> = harness::TARGETS.iter().map(|(name, _)| *name).collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets");
    for entry in std::fs::read_dir(dir).expect("fuzz/fuzz_targets") {
        let name = entry.expect("entry").file_name().to_string_lossy().replace(".rs", "");
        assert!(names.contains(&name.as_str()), "fuzz target {name} is not replayed");
    }
    assert_eq!(names.len(), 7);
}

#[test]
fn decode_frame() {
    replay("decode_frame");
}

#[test]
fn scan_segment() {
    replay("scan_segment");
}

#[test]
fn decode_checkpoint() {
    replay("decode_checkpoint");
}

#[test]
fn item_json() {
    replay("item_json");
}

#[test]
fn time_range() {
    replay("time_range");
}

#[test]
fn recovery() {
    replay("recovery");
}

#[test]
fn stateful() {
    replay("stateful");
}

/// The stateful target can fail: on a disk whose file syncs, or directory syncs, do nothing, some of
/// its seeds lose acknowledged operations in a power cut, and the model notices.
#[test]
fn the_stateful_target_fails_when_syncs_do_nothing() {
    for (files, dirs) in [(false, true), (true, false)] {
        let caught: Vec<String> = inputs("seeds", "stateful")
            .into_iter()
            .filter(|path| {
                let data = std::fs::read(path).expect("reading a fuzz input");
                std::panic::catch_unwind(|| {
                    let disk = ctxlog::storage::SimDisk::new();
                    disk.set_sync_files(files);
                    disk.set_sync_dirs(dirs);
                    ctxlog::testing::stateful::run_on(&data, disk);
                })
                .is_err()
            })
            .map(|path| path.display().to_string())
            .collect();
        println!("file syncs {files}, directory syncs {dirs}: caught by {caught:?}");
        assert!(
            !caught.is_empty(),
            "with file syncs {files} and directory syncs {dirs}, no stateful seed failed"
        );
    }
}

/// The binary seeds are real, accepted files: the fuzzer starts from the code behind every CRC.
#[test]
fn binary_seeds_are_accepted_inputs() {
    for path in inputs("seeds", "decode_frame") {
        let data = std::fs::read(&path).expect("seed");
        assert!(ctxlog::testing::fuzz::decode_frame(&data) > 0, "{}", path.display());
    }
    for path in inputs("seeds", "scan_segment") {
        let data = std::fs::read(&path).expect("seed");
        let frames = ctxlog::testing::fuzz::scan_segment(&data);
        assert!(frames > 0 || data.len() == 32, "{}", path.display());
    }
    for path in inputs("seeds", "decode_checkpoint") {
        let data = std::fs::read(&path).expect("seed");
        assert!(ctxlog::testing::fuzz::decode_checkpoint(&data), "{}", path.display());
    }
}

/// Bit 1 of a stateful input's first byte turns on `Options::compress_content`: the pool's long
/// repetitive content (pool entry 4) is then only in compressed records, and with the bit cleared it
/// is stored as it is, so the model checks both forms (the seeds `compressed-*` start from it).
#[test]
fn the_stateful_target_stores_content_compressed_when_its_input_asks() {
    use ctxlog::storage::{SimDisk, Storage};
    let repeated = "context window ".repeat(40);
    // Item "a" version 1 with pool content 4 (identity 18 * (8 + 4)), global_readonly, no TTL or
    // confidence, added; then resolved (fuzz/make_seeds.py has the encoding).
    let ops = [0u8, 0, 0, 216, 12, 0x40, 6, 6, 0, 0, 0];
    let stored_plain = |first: u8| -> bool {
        let disk = SimDisk::new();
        let data: Vec<u8> = std::iter::once(first).chain(ops).collect();
        ctxlog::testing::stateful::run_on(&data, disk.clone());
        let dir = Path::new("/fuzz/store");
        let segments: Vec<String> = disk
            .list(dir)
            .expect("listing the fuzz store")
            .into_iter()
            .filter(|name| name.ends_with(".seg"))
            .collect();
        assert!(!segments.is_empty());
        segments.iter().any(|name| {
            let bytes = disk.read(&dir.join(name)).expect("reading a segment");
            bytes.windows(repeated.len()).any(|w| w == repeated.as_bytes())
        })
    };
    for durability in [0u8, 1] {
        assert!(
            stored_plain(durability),
            "durability bit {durability}: not stored as it is"
        );
        assert!(
            !stored_plain(durability | 2),
            "durability bit {durability}: not compressed"
        );
    }
    let compressed_seeds = inputs("seeds", "stateful")
        .into_iter()
        .filter(|path| std::fs::read(path).expect("seed").first().is_some_and(|b| b & 2 == 2))
        .count();
    assert!(compressed_seeds >= 2, "{compressed_seeds} seeds with compression");
}
