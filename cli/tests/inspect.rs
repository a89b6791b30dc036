//! `stats`, `verify`, `snapshots`, `pin`, `unpin` and `compact` run as the real binary, their
//! output compared with the library's own answers on the same store; locked stores and
//! directories that hold no store.

mod common;

use common::{build, entries, open, run, run_ok, s, stderr};
use serde_json::Value;

#[test]
fn stats_match_the_library() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 500, 100);
    let report: Value = serde_json::from_str(&run_ok(&["stats", s(dir.path()), "--json"])).unwrap();
    let store = open(dir.path());
    let stats = store.stats();
    assert_eq!(report["items"], stats.items);
    assert_eq!(report["versions"], stats.versions);
    assert_eq!(report["segments"], stats.segments);
    assert_eq!(report["last_seq"], stats.seq);
    assert_eq!(report["index_bytes"], stats.index_bytes);
    assert_eq!(report["pins"], stats.pins);
    assert_eq!(report["sessions"], stats.sessions);
    assert_eq!(report["sessions"], 2, "s1 and s2");
    assert_eq!(report["history_start"], store.history_start().unwrap());
    assert!(report["bytes_on_disk"].as_u64().unwrap() > 0);
    assert_eq!(report["recovery"]["records"], stats.recovery.records);
    drop(store);

    let table = run_ok(&["stats", s(dir.path())]);
    let store = open(dir.path());
    let stats = store.stats();
    let row = |label: &str| {
        table
            .lines()
            .find_map(|line| line.strip_prefix(label).filter(|rest| rest.starts_with("  ")))
            .unwrap_or_else(|| panic!("no row {label} in {table}"))
            .trim()
            .to_owned()
    };
    assert_eq!(row("items"), stats.items.to_string());
    assert_eq!(row("versions"), stats.versions.to_string());
    assert_eq!(row("last seq"), stats.seq.to_string());
    assert_eq!(row("sessions"), stats.sessions.to_string());
}

#[test]
fn verify_passes_a_sound_store() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 300, 50);
    let line = run_ok(&["verify", s(dir.path())]);
    let store = open(dir.path());
    let report = store.verify().unwrap();
    assert_eq!(
        line.trim(),
        format!(
            "ok: {} records, {} frames, {} segments, {} checkpoints, {} pins checked",
            report.records_checked,
            report.frames_checked,
            report.segments_checked,
            report.checkpoints_checked,
            report.pins_checked
        )
    );
    drop(store);
    let json: Value = serde_json::from_str(&run_ok(&["verify", s(dir.path()), "--json"])).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["records_checked"], report.records_checked);
    assert_eq!(json["problems"], Value::Array(vec![]));
}

#[test]
fn verify_finds_a_flipped_byte() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    // Several batches, so that the damaged first frame is followed by good ones (no torn tail).
    build(dir.path(), 300, 50);
    let segment = dir.path().join("00000001.seg");
    let mut bytes = std::fs::read(&segment).unwrap();
    // Past the 32-byte segment header, inside the first frame (a batch of 50 items: kilobytes).
    let at = 32 + 200;
    bytes[at] ^= 0x5a;
    std::fs::write(&segment, &bytes).unwrap();

    let output = run(&["verify", s(dir.path())]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    common::assert_no_progress(&output);
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), stderr(&output));
    assert!(said.contains("00000001.seg"), "names the segment: {said}");
    let names_offset = said.contains("at offset ") || said.contains("00000001.seg:");
    assert!(names_offset, "names an offset: {said}");
    assert!(stderr(&output).starts_with("ctxlog: error: "), "{said}");
    assert_eq!(stderr(&output).lines().count(), 1, "one error line: {said}");

    // Without the checkpoint that let the store open without reading the frame, opening finds the
    // damage: every command names it, and the others point to verify.
    for name in entries(dir.path()).unwrap() {
        if name.starts_with("checkpoint-") {
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }
    }
    let output = run(&["verify", s(dir.path())]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.contains("00000001.seg at offset ") && err.contains("first damage"),
        "{err}"
    );
    let output = run(&["stats", s(dir.path())]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(err.contains("00000001.seg") && err.contains("ctxlog verify"), "{err}");
}

#[test]
fn pin_snapshots_and_unpin_round_trip() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 200, 50);
    let last_seq = open(dir.path()).last_seq();
    let pinned: Value = serde_json::from_str(&run_ok(&["pin", s(dir.path()), "audit-1", "--json"])).unwrap();
    let store = open(dir.path());
    let infos = store.snapshots();
    assert_eq!(infos.len(), 1);
    assert_eq!(pinned["name"], "audit-1");
    assert_eq!(pinned["seq"], infos[0].seq);
    assert_eq!(pinned["seq"], last_seq, "a snapshot of the store as it was");
    assert_eq!(pinned["taken_at"], infos[0].taken_at);
    let digest = store.open_snapshot("audit-1").unwrap().digest().unwrap();
    assert_eq!(pinned["digest"], digest);
    // A second pin, by the library this time.
    store.add([common::item(9_999, "1")]).unwrap();
    store.pin_snapshot("audit-2").unwrap();
    drop(store);

    let listed: Value = serde_json::from_str(&run_ok(&["snapshots", s(dir.path()), "--json"])).unwrap();
    let store = open(dir.path());
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2);
    for (shown, info) in listed.iter().zip(store.snapshots()) {
        assert_eq!(shown["name"], info.name);
        assert_eq!(shown["seq"], info.seq);
        assert_eq!(shown["bytes_kept"], info.bytes_kept);
        assert_eq!(
            shown["digest"],
            store.open_snapshot(&info.name).unwrap().digest().unwrap()
        );
    }
    drop(store);
    let table = run_ok(&["snapshots", s(dir.path())]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("audit-1") && table.contains(&digest), "{table}");

    let unpinned: Value = serde_json::from_str(&run_ok(&["unpin", s(dir.path()), "audit-1", "--json"])).unwrap();
    assert_eq!(unpinned["unpinned"], true);
    let store = open(dir.path());
    let names: Vec<String> = store.snapshots().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["audit-2"]);
    drop(store);

    let again = run(&["unpin", s(dir.path()), "audit-1"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("no pinned snapshot named \"audit-1\""),
        "{}",
        stderr(&again)
    );
    let twice = run(&["pin", s(dir.path()), "audit-2"]);
    assert_eq!(twice.status.code(), Some(1), "a name already pinned");
}

#[test]
fn compact_reports_what_the_library_reports() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let twin = tempfile::tempdir().unwrap();
    build(dir.path(), 1_000, 100);
    for name in entries(dir.path()).unwrap() {
        if name != "LOCK" {
            std::fs::copy(dir.path().join(&name), twin.path().join(&name)).unwrap();
        }
    }
    let expected = open(twin.path()).compact().unwrap();
    let before = open(dir.path()).stats();

    let report: Value = serde_json::from_str(&run_ok(&["compact", s(dir.path()), "--json"])).unwrap();
    assert_eq!(report["segments_rewritten"], expected.segments_rewritten);
    assert_eq!(report["segments_skipped"], expected.segments_skipped);
    assert_eq!(report["reclaimed_expired"], expected.reclaimed_expired);
    assert_eq!(report["reclaimed_superseded"], expected.reclaimed_superseded);
    assert_eq!(report["reclaimed_deleted"], expected.reclaimed_deleted);
    assert_eq!(report["retired"], expected.retired);
    assert_eq!(report["bytes_before"], expected.bytes_before);
    assert_eq!(report["bytes_after"], expected.bytes_after);
    assert!(report["duration_ms"].as_f64().unwrap() >= 0.0);
    // build() made 100 revisions and deleted 20 ids.
    assert_eq!(report["reclaimed_superseded"], 100);
    assert!(report["reclaimed_deleted"].as_u64().unwrap() >= 20);

    let store = open(dir.path());
    assert_eq!(store.stats().items, before.items);
    assert!(store.verify().unwrap().is_ok());
    drop(store);
    let text = run_ok(&["compact", s(dir.path())]);
    assert!(text.starts_with("compacted "), "{text}");
}

#[test]
fn a_locked_store_names_its_lock() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 10, 10);
    let held = open(dir.path());
    for command in ["stats", "verify", "get", "export", "compact", "changes"] {
        let output = run(&[command, s(dir.path())]);
        assert_eq!(output.status.code(), Some(1), "{command}");
        let err = stderr(&output);
        assert!(err.starts_with("ctxlog: error: "), "{command}: {err}");
        assert!(
            err.contains(s(&dir.path().join("LOCK"))),
            "{command} names the lock: {err}"
        );
        assert!(err.contains("stop the process holding the store"), "{command}: {err}");
        assert_eq!(err.lines().count(), 1, "{command}: {err}");
    }
    drop(held);
    run_ok(&["stats", s(dir.path())]);
}

#[test]
fn a_directory_without_a_store_is_refused_and_left_alone() {
    let _serial = common::serial();
    let root = tempfile::tempdir().unwrap();
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let unrelated = root.path().join("unrelated");
    std::fs::create_dir(&unrelated).unwrap();
    std::fs::write(unrelated.join("notes.txt"), "not a store").unwrap();
    let missing = root.path().join("missing");
    let commands: [&[&str]; 9] = [
        &["stats"],
        &["verify"],
        &["get"],
        &["resolve", "_", "x"],
        &["export"],
        &["snapshots"],
        &["changes"],
        &["compact"],
        &["pin", "_", "p"],
    ];
    for dir in [&empty, &unrelated, &missing] {
        let before = entries(dir);
        for command in commands {
            let mut args: Vec<&str> = vec![command[0], s(dir)];
            args.extend(command.iter().skip(1).filter(|a| **a != "_"));
            let output = run(&args);
            assert_eq!(output.status.code(), Some(1), "{args:?}");
            let err = stderr(&output);
            assert!(err.starts_with("ctxlog: error: "), "{args:?}: {err}");
            assert!(err.contains("is not a ctxlog store"), "{args:?}: {err}");
            assert_eq!(entries(dir), before, "{args:?} left {} as it was", dir.display());
        }
    }
    assert!(!missing.exists());
    // unpin too.
    let output = run(&["unpin", s(&missing), "p"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(!missing.exists());
}

#[test]
fn bad_usage_exits_2() {
    let _serial = common::serial();
    for args in [
        &["stats"][..],
        &["stats", "/tmp", "--bogus"],
        &["get", "/tmp", "--scope", "Session"],
        &["get", "/tmp", "--min-confidence", "2"],
        &["resolve", "/tmp"],
        &["import", "/tmp"],
        &["frobnicate"],
    ] {
        let output = run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
    }
}

/// Every file of `dir` with its bytes.
fn contents(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    entries(dir)
        .unwrap()
        .into_iter()
        .map(|name| {
            let bytes = std::fs::read(dir.join(&name)).unwrap();
            (name, bytes)
        })
        .collect()
}

#[test]
fn read_commands_change_no_byte_of_a_store() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 300, 50);
    open(dir.path()).pin_snapshot("kept").unwrap();
    // A copy without its LOCK file, as a backup would be: no lock file is created in it either.
    let copy = tempfile::tempdir().unwrap();
    for name in entries(dir.path()).unwrap() {
        if name != "LOCK" {
            std::fs::copy(dir.path().join(&name), copy.path().join(&name)).unwrap();
        }
    }
    for store in [dir.path(), copy.path()] {
        let before = contents(store);
        for command in [
            &["stats"][..],
            &["stats", "--json"],
            &["verify"],
            &["get", "--type", "message"],
            &["resolve", "it_000001"],
            &["export"],
            &["export", "--all-versions"],
            &["snapshots"],
            &["changes"],
        ] {
            let mut args = vec![command[0], s(store)];
            args.extend(&command[1..]);
            run_ok(&args);
            assert!(contents(store) == before, "{args:?} changed {}", store.display());
        }
    }
}

#[test]
fn demo_still_runs() {
    let _serial = common::serial();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("demo");
    let tour = run_ok(&["demo", s(&dir)]);
    assert!(tour.contains("checks passed"), "{tour}");
    // Its store is one the other commands read.
    let line = run_ok(&["verify", s(&dir)]);
    assert!(line.starts_with("ok: "), "{line}");
    // A non-empty directory is refused, as before.
    let output = run(&["demo", s(&dir)]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).starts_with("ctxlog: error: "));
}

#[test]
fn verify_lists_each_problem_of_a_store_that_opens() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 300, 50);
    // Closing a store writes a checkpoint; a damaged one is set aside by opening (which replays the
    // log instead), and reported by verify.
    let checkpoint = entries(dir.path())
        .unwrap()
        .into_iter()
        .find(|name| name.starts_with("checkpoint-"))
        .expect("a checkpoint file");
    let path = dir.path().join(&checkpoint);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let output = run(&["verify", s(dir.path())]);
    let json_output = run(&["verify", s(dir.path()), "--json"]);
    // The library's own verify; opening a writer afterwards writes a fresh checkpoint.
    let expected = open(dir.path()).verify().unwrap();
    assert!(!expected.is_ok());
    let lines: Vec<String> = expected
        .problems
        .iter()
        .map(|p| format!("{}:{}: {}", p.file.display(), p.offset, p.reason))
        .collect();

    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().collect::<Vec<_>>(), lines);
    assert!(stdout.contains(&checkpoint), "{stdout}");
    let err = stderr(&output);
    assert!(
        err.starts_with(&format!("ctxlog: error: {} problem(s) found", lines.len())),
        "{err}"
    );

    assert_eq!(json_output.status.code(), Some(1));
    let json: Value = serde_json::from_slice(&json_output.stdout).unwrap();
    assert_eq!(json["ok"], false);
    assert_eq!(json["records_checked"], expected.records_checked);
    assert_eq!(json["problems"].as_array().unwrap().len(), lines.len());
}
