//! The checks every fuzz target runs, shared by the cargo-fuzz targets in `fuzz/fuzz_targets/`
//! (through `#[path]`) and by `tests/fuzz_regressions.rs`, which replays the committed seeds and
//! crash inputs with a plain `cargo test`. A panic here is a finding: either ctxlog panicked, or a
//! property below does not hold.
#![allow(dead_code)]

use std::path::Path;
use std::sync::OnceLock;

use ctxlog::{
    AddOutcome, ContextItem, ContextQuery, Durability, Error, Options, RawResolution, Resolution, Store, TimeRange,
};

/// What a target runs on one input.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz/fuzz_targets/<name>.rs` and `fuzz/seeds/<name>/` name it.
pub const TARGETS: &[(&str, Target)] = &[
    ("decode_frame", decode_frame),
    ("scan_segment", scan_segment),
    ("decode_checkpoint", decode_checkpoint),
    ("item_json", item_json),
    ("time_range", time_range),
    ("recovery", recovery),
    ("stateful", stateful),
];

/// A frame, as is and with its CRCs recomputed: read, decoded, every record decoded again alone.
pub fn decode_frame(data: &[u8]) {
    let _ = ctxlog::testing::fuzz::fuzz_decode_frame(data);
}

/// A whole segment file, as is and sealed: header decoded, frames scanned as newest and as sealed.
pub fn scan_segment(data: &[u8]) {
    let _ = ctxlog::testing::fuzz::fuzz_scan_segment(data);
}

/// A checkpoint file, as is and with its trailing CRC recomputed.
pub fn decode_checkpoint(data: &[u8]) {
    let _ = ctxlog::testing::fuzz::fuzz_decode_checkpoint(data);
}

/// Where the stateful targets make their directories: memory when the machine has /dev/shm.
fn scratch() -> &'static Path {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        Box::leak(std::env::temp_dir().into_boxed_path())
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ctxlog-fuzz-")
        .tempdir_in(scratch())
        .expect("a temporary directory")
}

/// One store per process for `item_json` (the directory is left behind when the process exits).
fn item_store() -> &'static Store {
    static STORE: OnceLock<(tempfile::TempDir, Store)> = OnceLock::new();
    let (_, store) = STORE.get_or_init(|| {
        let dir = temp_dir();
        let store = Options::new()
            .durability(Durability::Never)
            .auto_compact(false)
            .open(dir.path())
            .expect("opening the item_json store");
        (dir, store)
    });
    store
}

/// Arbitrary text as an item's JSON: `from_json` refuses it with `Invalid` or accepts it; an accepted
/// item survives `to_json` -> `from_json` unchanged, and `add` either stores it (and a resolve of
/// `id@version` never reports damage, and finds the same content) or refuses it with an item error
/// that names index 0.
pub fn item_json(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let item = match ContextItem::from_json(&text) {
        Ok(item) => item,
        Err(Error::Invalid { index: None, .. }) => return,
        Err(other) => panic!("from_json refused with something other than Invalid: {other:?}"),
    };
    let json = item.to_json();
    match ContextItem::from_json(&json) {
        Ok(again) => assert_eq!(again, item, "to_json -> from_json changed the item; json: {json}"),
        Err(e) => panic!("from_json refused what to_json wrote: {e}; json: {json}"),
    }
    let store = item_store();
    match store.add([item.clone()]) {
        Ok(outcomes) => {
            assert_eq!(outcomes.len(), 1);
            match &outcomes[0] {
                AddOutcome::Added { id, version, .. } | AddOutcome::Unchanged { id, version } => {
                    assert_eq!((id, version), (&item.id, &item.version));
                }
                other => panic!("unexpected outcome {other:?}"),
            }
            let reference = format!("{}@{}", item.id, item.version);
            let resolved = store.resolve([reference.as_str()]).expect("resolve after add");
            match &resolved[..] {
                [Resolution::Found(found)] => {
                    assert_eq!((&found.id, &found.version), (&item.id, &item.version));
                    assert_eq!(found.content, item.content, "content changed in the store");
                    // The raw read writes the same bytes as serde_json does for the parsed item.
                    let raw = store.resolve_raw([reference.as_str()]).expect("raw resolve after add");
                    match &raw[..] {
                        [RawResolution::Found(raw)] => {
                            // `to_json` is `serde_json::to_string` of the item.
                            assert_eq!(raw.as_str(), found.to_json(), "raw read differs from serde_json");
                        }
                        other => panic!("{reference} resolved, but its raw read gave {other:?}"),
                    }
                }
                [Resolution::HashMismatch { .. }] => panic!("{reference} reads back as damaged"),
                [_] => {}
                other => panic!("one reference resolved to {} answers", other.len()),
            }
        }
        Err(
            e @ (Error::Invalid { .. }
            | Error::UnknownType { .. }
            | Error::HashMismatch { .. }
            | Error::VersionConflict { .. }
            | Error::TooLarge { .. }),
        ) => {
            assert!(
                e.to_string().starts_with("item 0: "),
                "an item error without its index: {e}"
            );
        }
        Err(other) => panic!("add refused an item with a non-item error: {other:?}"),
    }
}

/// Two arbitrary strings (split at the first newline) as a time range: refused with `Invalid`, or
/// accepted with start <= end, and then each end written back with `format_rfc3339` parses to the
/// same second.
pub fn time_range(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (start, end) = text.split_once('\n').unwrap_or((&text, &text));
    match TimeRange::parse(start, end) {
        Ok(range) => {
            assert!(range.start() <= range.end(), "{range:?} from {start:?}, {end:?}");
            let again = TimeRange::parse(
                &ctxlog::format_rfc3339(range.start()),
                &ctxlog::format_rfc3339(range.end()),
            );
            assert_eq!(
                again.ok(),
                Some(range),
                "{start:?}, {end:?} does not survive format_rfc3339"
            );
        }
        Err(Error::Invalid { .. }) => {}
        Err(other) => panic!("TimeRange::parse refused with something other than Invalid: {other:?}"),
    }
}

/// The magic bytes of a segment and of a checkpoint: each starts a new file in a `recovery` input.
const SEGMENT_MAGIC: &[u8] = b"CTXLOGSG";
const CHECKPOINT_MAGIC: &[u8] = b"CTXLOGCP";
/// At most this many files per input.
const FILES_MAX: usize = 8;

/// Splits a `recovery` input (after its flags byte) into files: a new one starts at every segment or
/// checkpoint magic. Segments are numbered 1, 2, ... in order; a checkpoint is named by the seq in
/// its header.
fn recovery_files(bytes: &[u8]) -> Vec<(String, &[u8])> {
    let mut starts = vec![0];
    for at in 1..bytes.len() {
        let rest = &bytes[at..];
        if rest.starts_with(SEGMENT_MAGIC) || rest.starts_with(CHECKPOINT_MAGIC) {
            starts.push(at);
        }
    }
    starts.truncate(FILES_MAX);
    let mut files = Vec::new();
    let mut segment = 0u32;
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(bytes.len());
        let chunk = &bytes[start..end];
        let name = if chunk.starts_with(CHECKPOINT_MAGIC) {
            let seq = chunk
                .get(16..24)
                .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()));
            format!("checkpoint-{seq:020}.idx")
        } else {
            segment += 1;
            format!("{segment:08}.seg")
        };
        files.push((name, chunk));
    }
    files
}

/// Arbitrary bytes as a store's files: the first byte holds flags (bit 0: recompute every CRC the
/// length fields lead to), the rest is split into segment and checkpoint files (see
/// [`recovery_files`]). Opening gives a store or a typed error, never a panic; an opened store
/// answers `verify`, `get`, `resolve` and `stats` without panicking.
pub fn recovery(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let seal = flags & 1 == 1;
    let dir = temp_dir();
    for (name, bytes) in recovery_files(rest) {
        let bytes = match (seal, name.ends_with(".idx")) {
            (false, _) => bytes.to_vec(),
            (true, false) => ctxlog::testing::fuzz::seal_segment(bytes),
            (true, true) => ctxlog::testing::fuzz::seal_checkpoint(bytes),
        };
        std::fs::write(dir.path().join(name), bytes).expect("writing an input file");
    }
    let opened = Options::new()
        .durability(Durability::Never)
        .auto_compact(false)
        .open(dir.path());
    let store = match opened {
        Ok(store) => store,
        Err(Error::Corrupt { .. } | Error::Invalid { .. }) => return,
        Err(other) => panic!("opening refused with an unexpected error: {other:?}"),
    };
    if let Some(problem) = ctxlog::testing::fuzz::opened_store_problem(&store) {
        panic!("{problem}");
    }
    let _ = store.verify();
    if let Ok(items) = store.get(&ContextQuery::new().limit(64)) {
        let ids: Vec<&str> = items.iter().map(|item| item.id.as_str()).collect();
        if let Ok(resolved) = store.resolve(&ids) {
            assert_eq!(resolved.len(), ids.len());
        }
    }
    let _ = store.stats();
}

/// Arbitrary bytes as a sequence of store operations on a simulated disk, power cuts included, each
/// answer and each recovered state checked against a model (see `ctxlog::testing::fuzz::stateful`).
pub fn stateful(data: &[u8]) {
    ctxlog::testing::stateful::run(data);
}
