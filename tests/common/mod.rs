//! Shared helpers for the integration tests: opening stores with a manual clock, building items, and
//! computing expected hashes independently of the engine.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};

use ctxlog::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The clock time most tests start at (2023-11-14T22:13:20Z).
pub const NOW: i64 = 1_700_000_000;

/// The seven built-in types.
pub const BUILTIN_TYPES: [&str; 7] = [
    "document_chunk",
    "tool_result",
    "user_profile",
    "user_feedback",
    "product_document",
    "monitoring_metric",
    "message",
];

/// Opens a store in `dir` whose clock is a shared `ManualClock`.
pub fn open_at(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    Options::new()
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .open(dir)
        .expect("open store")
}

/// A fresh manual clock standing at `t`.
pub fn clock_at(t: i64) -> Arc<ManualClock> {
    Arc::new(ManualClock::new(t))
}

/// A plain global_readonly document chunk.
pub fn item(id: &str, timestamp: i64, version: &str, content: Value) -> ContextItem {
    ContextItem::new(
        id,
        "document_chunk",
        content,
        "unit_tests",
        timestamp,
        version,
        Scope::GlobalReadonly,
    )
}

/// `"sha256:" + hex(SHA-256(canonical content))`, computed here rather than by the engine.
pub fn expected_hash(content: &Value) -> String {
    let digest = Sha256::digest(canonical_json(content));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The item as the store should give it back: the same, with its hash filled in.
pub fn stored_form(item: &ContextItem) -> ContextItem {
    let mut out = item.clone();
    out.hash = Some(expected_hash(&item.content));
    out
}

/// Everything a store handle sees.
pub fn everything(store: &Store) -> Vec<ContextItem> {
    store.get(&ContextQuery::new()).expect("get everything")
}

/// The item of a `Found` resolution, panicking with the resolution otherwise.
pub fn found(resolution: &Resolution) -> &ContextItem {
    match resolution {
        Resolution::Found(item) => item,
        other => panic!("expected Found, got {other:?}"),
    }
}

/// Ids of items, in order.
pub fn ids(items: &[ContextItem]) -> Vec<String> {
    items.iter().map(|item| item.id.clone()).collect()
}

/// `len` characters of pseudo-random hex determined by `seed`: text the log's LZ4 cannot shrink, for
/// tests that rely on how many bytes a record takes on disk.
pub fn incompressible(seed: &str, len: usize) -> String {
    let mut state = seed.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(b"0123456789abcdef"[(state >> 60) as usize])
        })
        .collect()
}

/// What a child process (a test binary re-executed) left when it was killed.
pub struct Killed<T> {
    /// What `read` made of its standard output.
    pub output: T,
    /// Its standard error.
    pub stderr: String,
    /// Whether it had already ended by itself before the kill.
    pub ended_early: bool,
    /// How it ended.
    pub status: std::process::ExitStatus,
}

/// Spawns `command` with piped output, SIGKILLs it once `delay` has passed since `spawned`, and
/// returns what `read` made of its standard output (read on a thread of its own) and its stderr.
pub fn run_until_killed<T: Send + 'static>(
    mut command: std::process::Command,
    spawned: std::time::Instant,
    delay: std::time::Duration,
    read: impl FnOnce(std::process::ChildStdout) -> T + Send + 'static,
) -> Killed<T> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut stderr = child.stderr.take().expect("child stderr");
    let output = std::thread::spawn(move || read(stdout));
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    std::thread::sleep(delay.saturating_sub(spawned.elapsed()));
    let ended_early = child.try_wait().expect("polling the child").is_some();
    child.kill().expect("killing the child");
    let status = child.wait().expect("waiting for the child");
    Killed {
        output: output.join().expect("stdout reader"),
        stderr: errors.join().expect("stderr reader"),
        ended_early,
        status,
    }
}

static STORE_THREAD_PANICS: AtomicU64 = AtomicU64::new(0);

/// Installs, once per test binary, a panic hook that counts panics on the store's own threads
/// (`ctxlog-writer`, `ctxlog-maintenance`, ...), which a caller only sees as `Closed` errors and a
/// log line; `catch_unwind` around a case catches only those of the calling thread.
pub fn count_store_thread_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current()
                .name()
                .is_some_and(|name| name.starts_with("ctxlog-"))
            {
                STORE_THREAD_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// Panics counted on the store's own threads since [`count_store_thread_panics`] was first called.
pub fn store_thread_panics() -> u64 {
    STORE_THREAD_PANICS.load(Ordering::SeqCst)
}

/// Where the frames of a segment file end (docs/FORMAT.md: a 32-byte header, then frames of a
/// 17-byte header and the length its first field gives). An open or crashed store's newest segment
/// goes on with zeros: space allocated ahead of its appends.
pub fn frames_end(segment: &[u8]) -> usize {
    let mut at = 32;
    while let Some(header) = segment.get(at..at + 17) {
        if segment[at..].iter().all(|byte| *byte == 0) {
            break;
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        at += 17 + len;
    }
    at.min(segment.len())
}

/// Copies every file of the store directory `from` into `to`.
pub fn copy_store(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("listing the store") {
        let entry = entry.expect("dir entry");
        if entry.file_type().expect("file type").is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copying a store file");
        }
    }
}

/// Every file of a directory with its bytes, by name: to check that nothing changed it.
pub fn dir_contents(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("listing the directory")
        .map(|entry| {
            let entry = entry.expect("dir entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(entry.path()).expect("reading a file"))
        })
        .collect()
}

/// The segment files of a store directory, oldest first.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("listing the store")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "seg"))
        .collect();
    files.sort();
    files
}

/// The record of `id` in a segment file: (start of the record, body start, body length).
pub fn locate_record(bytes: &[u8], id: &str) -> (usize, usize, usize) {
    let mut needle = vec![u8::try_from(id.len()).expect("short id")];
    needle.extend_from_slice(id.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|window| window == needle)
        .expect("the id's record is in the segment");
    // A put body: flags, scope, timestamp, ttl, confidence, hash (58 bytes), then the id's length.
    let body = at - 58;
    let record = body - 9;
    let body_len = u32::from_le_bytes(bytes[record + 1..record + 5].try_into().expect("4 bytes")) as usize;
    (record, body, body_len)
}

/// Overwrites `bytes` at offset `at` of the file at `path`, in place (a store may have it open).
pub fn write_at(path: &Path, at: usize, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open segment");
    std::os::unix::fs::FileExt::write_all_at(&file, bytes, at as u64).expect("write in place");
}

/// Every change `store.changes(after)` lists, each read back.
pub fn feed(store: &Store, after: u64) -> Vec<Change> {
    store
        .changes(after)
        .expect("changes")
        .collect::<Result<Vec<_>, _>>()
        .expect("every change reads back")
}

/// The complete lines a child process wrote to `stdout` before it ended (killed or not), without
/// their newline; a last line cut short by a kill is not among them.
pub fn complete_lines(stdout: impl std::io::Read) -> Vec<String> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(stdout);
    let mut lines = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.pop() != Some(b'\n') {
            break;
        }
        lines.push(String::from_utf8_lossy(&line).into_owned());
    }
    lines
}

/// The sequence number of the batch of an add whose items were all stored (one batch, one seq).
pub fn batch_seq(outcomes: &[AddOutcome]) -> u64 {
    let seqs: Vec<u64> = outcomes
        .iter()
        .map(|outcome| match outcome {
            AddOutcome::Added { seq, .. } => *seq,
            other => panic!("expected every item added, got {other:?}"),
        })
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] == w[1]), "one batch, one seq: {seqs:?}");
    seqs.first().copied().expect("at least one item")
}

/// The change an added item makes, as the feed reports it.
pub fn added(item: &ContextItem, seq: u64, committed_at: i64) -> Change {
    Change::Added {
        seq,
        committed_at,
        id: item.id.clone(),
        version: item.version.clone(),
        hash: expected_hash(&item.content),
        kind: item.kind.clone(),
        scope: item.scope.clone(),
        timestamp: item.timestamp,
    }
}
