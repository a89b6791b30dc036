//! `export` and `import` run as the real binary: a round trip of 100,000 items, every version,
//! imports stopped by a bad line or a refused item (what stays committed), stdin, and reruns.

mod common;

use std::io::Write;
use std::path::Path;

use common::{all_items, build, ctxlog, entries, item, open, run, run_ok, s, stderr};
use ctxlog::ContextQuery;
use serde_json::Value;

/// Writes `lines` to `path`, one per line.
fn write_lines(path: &Path, lines: &[String]) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
    file.flush().unwrap();
}

/// Item `i` as a JSON line.
fn line(i: usize) -> String {
    serde_json::to_string(&item(i, "1")).unwrap()
}

#[test]
fn export_then_import_gives_the_same_items() {
    let _serial = common::serial();
    const N: usize = 100_000;
    let root = tempfile::tempdir().unwrap();
    let (source, target, file) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("items.jsonl"),
    );
    build(&source, N, 1_000);
    let started = std::time::Instant::now();
    let output = ctxlog()
        .args(["export", s(&source), "--out", s(&file)])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    common::assert_no_progress(&output);
    let exported_in = started.elapsed();
    let store = open(&source);
    let expected = all_items(&store);
    assert_eq!(stderr(&output).trim(), format!("exported {} items", expected.len()));
    drop(store);

    let started = std::time::Instant::now();
    let output = ctxlog().args(["import", s(&target), s(&file)]).output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    common::assert_no_progress(&output);
    let imported_in = started.elapsed();
    let err = stderr(&output);
    let summary = format!("imported {0} items ({0} added, 0 unchanged) in ", expected.len());
    assert!(err.starts_with(&summary) && err.trim_end().ends_with(" s"), "{err}");
    eprintln!("{N} items: export {exported_in:?}, import {imported_in:?}");

    let imported = open(&target);
    assert_eq!(all_items(&imported), expected, "same items, hashes and versions");
    // The export is in seq order: ids of version 1 in the order they were added, then the
    // revisions of every tenth id (version 2).
    let lines = std::fs::read_to_string(&file).unwrap();
    let versions: Vec<String> = lines
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["version"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let first_revision = versions.iter().position(|v| v == "2").unwrap();
    assert!(versions[first_revision..].iter().all(|v| v == "2"));
    drop(imported);

    // Running the same file again changes nothing.
    let output = ctxlog().args(["import", s(&target), s(&file)]).output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.starts_with(&format!("imported {0} items (0 added, {0} unchanged)", expected.len())),
        "{err}"
    );
}

#[test]
fn all_versions_exports_every_version_still_readable() {
    let _serial = common::serial();
    let root = tempfile::tempdir().unwrap();
    let (source, target) = (root.path().join("a"), root.path().join("b"));
    build(&source, 500, 100);
    let all = run_ok(&["export", s(&source), "--all-versions"]);
    let lines: Vec<Value> = common::json_lines(&all);
    // 500 version-1 adds, 50 revisions; the 10 deleted ids (7, 57, ...) are left out.
    assert_eq!(lines.len(), 500 + 50 - 10);
    let store = open(&source);
    // Every exported version is exactly what the store holds for that id and version.
    for value in &lines {
        let reference = format!(
            "{}@{}",
            value["id"].as_str().unwrap(),
            value["version"].as_str().unwrap()
        );
        let resolved = serde_json::to_value(&store.resolve([reference.as_str()]).unwrap()[0]).unwrap();
        match resolved["status"].as_str().unwrap() {
            "found" => assert_eq!(
                resolved.as_object().unwrap().len() - 1,
                value.as_object().unwrap().len()
            ),
            "superseded" => assert_eq!(value["version"], "1"),
            other => panic!("{reference}: {other}"),
        }
    }
    let expected = all_items(&store);
    drop(store);
    let file = root.path().join("all.jsonl");
    std::fs::write(&file, &all).unwrap();
    run_ok(&["import", s(&target), s(&file)]);
    let imported = open(&target);
    assert_eq!(all_items(&imported), expected, "the latest versions are the live items");
    assert_eq!(imported.stats().versions, 540);
}

#[test]
fn a_bad_line_stops_the_import_after_the_committed_batches() {
    let _serial = common::serial();
    let root = tempfile::tempdir().unwrap();
    let (dir, file) = (root.path().join("store"), root.path().join("items.jsonl"));
    let mut lines: Vec<String> = (0..3_000).map(line).collect();
    // Line 2503 (1-based) has a typo'd field.
    let mut bad: Value = serde_json::from_str(&lines[2502]).unwrap();
    bad["ttl"] = Value::from(60);
    lines[2502] = bad.to_string();
    write_lines(&file, &lines);

    let output = run(&["import", s(&dir), s(&file)]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.starts_with("ctxlog: error: line 2503: unknown field `ttl`"),
        "{err}"
    );
    assert!(err.contains("lines 1..=2000 are committed"), "{err}");
    assert!(err.contains("from line 2001"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let store = open(&dir);
    let ids: Vec<String> = all_items(&store).into_iter().map(|i| i.id).collect();
    let mut expected: Vec<String> = (0..2_000).map(|i| format!("it_{i:06}")).collect();
    expected.sort();
    let mut ids_sorted = ids.clone();
    ids_sorted.sort();
    assert_eq!(ids_sorted, expected, "exactly the items of lines 1..=2000");
}

#[test]
fn a_refused_item_names_its_line() {
    let _serial = common::serial();
    let root = tempfile::tempdir().unwrap();
    let (dir, file) = (root.path().join("store"), root.path().join("items.jsonl"));
    let mut lines: Vec<String> = (0..2_500).map(line).collect();
    let mut refused: Value = serde_json::from_str(&lines[1501]).unwrap();
    refused["type"] = Value::from("legal_clause");
    lines[1501] = refused.to_string();
    write_lines(&file, &lines);

    let output = run(&["import", s(&dir), s(&file)]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.starts_with("ctxlog: error: line 1502: unknown type \"legal_clause\""),
        "{err}"
    );
    assert!(err.contains("lines 1..=1000 are committed"), "{err}");
    let store = open(&dir);
    assert_eq!(all_items(&store).len(), 1_000);
    drop(store);

    // Registering the type lets the same file through; the first 1,000 are unchanged.
    let output = run(&["import", s(&dir), s(&file), "--register-type", "legal_clause"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).starts_with("imported 2500 items (1500 added, 1000 unchanged)"));

    // A version conflict is refused the same way.
    let mut conflict: Value = serde_json::from_str(&lines[3]).unwrap();
    conflict["content"] = Value::from("changed");
    conflict.as_object_mut().unwrap().remove("hash");
    write_lines(&file, &[line(4_000), conflict.to_string()]);
    let output = run(&["import", s(&dir), s(&file)]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(err.contains("line 2: version conflict"), "{err}");
    assert!(err.contains("nothing was committed"), "{err}");
}

#[test]
fn import_reads_stdin_and_creates_only_where_it_may() {
    let _serial = common::serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("new");
    // Empty lines are skipped.
    let input: String = (0..1_500)
        .map(|i| line(i) + if i % 100 == 0 { "\n\n" } else { "\n" })
        .collect();
    let output = ctxlog()
        .args(["import", s(&dir), "-"])
        .write_stdin(input.clone())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    common::assert_no_progress(&output);
    assert!(stderr(&output).starts_with("imported 1500 items (1500 added, 0 unchanged)"));
    let store = open(&dir);
    let expected: Vec<ctxlog::ContextItem> = store.get(&ContextQuery::new()).unwrap();
    assert_eq!(expected.len(), 1_500);
    drop(store);

    // A non-empty directory that holds no store is refused and left as it is.
    let unrelated = root.path().join("unrelated");
    std::fs::create_dir(&unrelated).unwrap();
    std::fs::write(unrelated.join("notes.txt"), "keep").unwrap();
    let output = ctxlog()
        .args(["import", s(&unrelated), "-"])
        .write_stdin(input)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("is not a ctxlog store"), "{}", stderr(&output));
    assert_eq!(entries(&unrelated), Some(vec!["notes.txt".to_owned()]));

    // A missing file.
    let output = run(&["import", s(&dir), s(&root.path().join("nope.jsonl"))]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("ctxlog: error: opening "),
        "{}",
        stderr(&output)
    );
}

#[test]
fn export_after_compaction_still_gives_every_live_item() {
    let _serial = common::serial();
    let root = tempfile::tempdir().unwrap();
    let (source, target, file) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("items.jsonl"),
    );
    build(&source, 2_000, 100);
    let store = open(&source);
    let report = store.compact().unwrap();
    assert!(report.reclaimed_superseded > 0);
    let expected = all_items(&store);
    drop(store);
    let output = ctxlog()
        .args(["export", s(&source), "--out", s(&file)])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stderr(&output).trim(), format!("exported {} items", expected.len()));
    run_ok(&["import", s(&target), s(&file)]);
    assert_eq!(all_items(&open(&target)), expected);
}
