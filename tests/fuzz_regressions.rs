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
                    ctxlog::fuzzing::stateful::run_on(&data, disk);
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
        assert!(ctxlog::fuzzing::decode_frame(&data) > 0, "{}", path.display());
    }
    for path in inputs("seeds", "scan_segment") {
        let data = std::fs::read(&path).expect("seed");
        let frames = ctxlog::fuzzing::scan_segment(&data);
        assert!(frames > 0 || data.len() == 32, "{}", path.display());
    }
    for path in inputs("seeds", "decode_checkpoint") {
        let data = std::fs::read(&path).expect("seed");
        assert!(ctxlog::fuzzing::decode_checkpoint(&data), "{}", path.display());
    }
}
