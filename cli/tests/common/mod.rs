//! Helpers the command's tests share: stores built with the library on a manual clock, the real
//! binary run as a process, and its output parsed.

#![allow(dead_code)]

use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex, MutexGuard};

use assert_cmd::Command;
use ctxlog::{ContextItem, ContextQuery, ManualClock, Options, Scope, Store};
use serde_json::{json, Value};

/// Taken by every test for its whole run: the tests of one binary run one at a time. A store's
/// lock is an `flock` on its LOCK file, and a child process that another test thread spawns
/// inherits every open descriptor until it execs, so a store dropped and reopened (by the test or
/// by the binary it runs) while another test spawns a process could find its own lock still held.
pub fn serial() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The test stores' clock: 2024-05-10T10:00:00Z.
pub const NOW: i64 = 1_715_335_200;

/// Opens (or creates) the store in `dir` on a manual clock standing at [`NOW`], without background
/// compaction.
pub fn open(dir: &Path) -> Store {
    Options::new()
        .clock(Arc::new(ManualClock::new(NOW)))
        .auto_compact(false)
        .open(dir)
        .expect("open the store")
}

/// Item number `i`: types, scopes, sources and confidences vary with `i`; no TTL, so that nothing
/// expires by the binary's system clock.
pub fn item(i: usize, version: &str) -> ContextItem {
    let kinds = ["document_chunk", "tool_result", "message", "user_feedback"];
    let scope = match i % 4 {
        0 => Scope::GlobalReadonly,
        1 => Scope::GlobalWritable,
        2 => Scope::Session("s1".into()),
        _ => Scope::Session("s2".into()),
    };
    let i64_i = i64::try_from(i).expect("small");
    let mut item = ContextItem::new(
        format!("it_{i:06}"),
        kinds[i % kinds.len()],
        json!({"n": i, "text": format!("item {i} version {version}"), "tags": ["a", "b"], "nested": {"x": i % 7}}),
        ["crm_export", "wiki", "agent"][i % 3],
        NOW - 86_400 + i64_i * 3 % 86_400,
        version,
        scope,
    );
    if !i.is_multiple_of(5) {
        item = item.with_confidence(f64::from(u32::try_from(i % 11).expect("small")) / 10.0);
    }
    item
}

/// A store of `n` items added in batches of `batch`, with versions "2" of every tenth and a delete
/// of every 50th (offset by 7), built in `dir` and closed.
pub fn build(dir: &Path, n: usize, batch: usize) {
    let store = open(dir);
    let items: Vec<ContextItem> = (0..n).map(|i| item(i, "1")).collect();
    for chunk in items.chunks(batch) {
        store.add(chunk.to_vec()).expect("add");
    }
    let revised: Vec<ContextItem> = (0..n).step_by(10).map(|i| item(i, "2")).collect();
    for chunk in revised.chunks(batch) {
        store.add(chunk.to_vec()).expect("add revisions");
    }
    for i in (7..n).step_by(50) {
        assert!(store.delete(&format!("it_{i:06}")).expect("delete"));
    }
    drop(store);
}

/// Every live item, as `get` of everything answers.
pub fn all_items(store: &Store) -> Vec<ContextItem> {
    store.get(&ContextQuery::new()).expect("get everything")
}

/// The real binary.
pub fn ctxlog() -> Command {
    Command::cargo_bin("ctxlog").expect("the ctxlog binary")
}

/// Runs the binary with `args` and returns its output, whatever its status.
pub fn run(args: &[&str]) -> Output {
    ctxlog().args(args).output().expect("run ctxlog")
}

/// Runs the binary with `args`, which must succeed, and returns its stdout.
pub fn run_ok(args: &[&str]) -> String {
    let output = run(args);
    assert!(
        output.status.success(),
        "ctxlog {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_no_progress(&output);
    String::from_utf8(output.stdout).expect("utf-8 stdout")
}

/// Stdout's JSON lines.
pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// Stderr as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// No progress bar drawn: stderr (not a terminal under the tests) holds no carriage return or
/// escape sequence.
pub fn assert_no_progress(output: &Output) {
    let err = stderr(output);
    assert!(!err.contains('\r'), "a carriage return on stderr: {err:?}");
    assert!(!err.contains("\x1b["), "an escape sequence on stderr: {err:?}");
}

/// The names in `dir`, sorted (`None` if it does not exist).
pub fn entries(dir: &Path) -> Option<Vec<String>> {
    let read = std::fs::read_dir(dir).ok()?;
    let mut names: Vec<String> = read
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Some(names)
}

/// The path as a `&str`.
pub fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}
