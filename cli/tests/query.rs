//! `get`, `resolve` and `changes` run as the real binary, their JSON lines compared with the
//! library's answers on the same store.

mod common;

use common::{build, json_lines, open, run, run_ok, s, stderr};
use ctxlog::{ContextQuery, Scope, TimeRange};
use serde_json::Value;

/// The library's items as JSON values.
fn as_values<T: serde::Serialize>(items: &[T]) -> Vec<Value> {
    items.iter().map(|i| serde_json::to_value(i).unwrap()).collect()
}

#[test]
fn get_answers_as_the_library_does() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 400, 100);
    let (from, to) = ("2024-05-09T12:00:00Z", "2024-05-09T18:00:00Z");
    let cases: Vec<(Vec<&str>, ContextQuery, Option<&str>)> = vec![
        (vec![], ContextQuery::new(), None),
        (
            vec!["--type", "document_chunk", "--type", "message"],
            ContextQuery::new().types(["document_chunk", "message"]),
            None,
        ),
        (
            vec!["--scope", "session:s1", "--scope", "global_writable"],
            ContextQuery::new().scopes([Scope::Session("s1".into()), Scope::GlobalWritable]),
            None,
        ),
        (
            vec!["--from", from, "--to", to, "--newest-first", "--limit", "7"],
            ContextQuery::new()
                .time_range(TimeRange::parse(from, to).unwrap())
                .newest_first()
                .limit(7),
            None,
        ),
        (
            vec!["--from", from],
            ContextQuery::new().time_range(TimeRange::new(1_715_256_000, 253_402_300_799).unwrap()),
            None,
        ),
        (
            vec!["--to", to],
            ContextQuery::new().time_range(TimeRange::new(0, 1_715_277_600).unwrap()),
            None,
        ),
        (
            vec!["--source", "wiki", "--min-confidence", "0.5"],
            ContextQuery::new().sources(["wiki"]).min_confidence(0.5),
            None,
        ),
        (vec!["--session", "s2"], ContextQuery::new(), Some("s2")),
        (
            vec!["--session", "s1", "--scope", "session:s2"],
            ContextQuery::new().scopes([Scope::Session("s2".into())]),
            Some("s1"),
        ),
    ];
    let mut outputs = Vec::new();
    for (args, _, _) in &cases {
        let mut full = vec!["get", s(dir.path())];
        full.extend(args);
        outputs.push(json_lines(&run_ok(&full)));
    }
    let store = open(dir.path());
    for ((args, query, session), output) in cases.iter().zip(outputs) {
        let expected = match session {
            Some(session) => store.session(session).get(query).unwrap(),
            None => store.get(query).unwrap(),
        };
        assert_eq!(output, as_values(&expected), "get {args:?}");
    }
    // The cases are not all empty answers.
    assert!(store.get(&ContextQuery::new()).unwrap().len() > 300);
    assert!(store
        .session("s1")
        .get(&ContextQuery::new().scopes([Scope::Session("s2".into())]))
        .unwrap()
        .is_empty());
}

#[test]
fn get_refuses_a_bad_time_as_usage() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 10, 10);
    for args in [
        &["--from", "2024-05-10T00:00:00+08:00"][..],
        &["--from", "2024-05-12T00:00:00Z", "--to", "2024-05-10T00:00:00Z"],
        &["--to", "yesterday"],
    ] {
        let mut full = vec!["get", s(dir.path())];
        full.extend(args);
        let output = run(&full);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(stderr(&output).starts_with("ctxlog: error: "), "{}", stderr(&output));
        assert!(stderr(&output).contains("RFC 3339"), "{}", stderr(&output));
    }
}

#[test]
fn resolve_answers_as_the_library_does() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 100, 50);
    // it_000000 has versions 1 and 2; it_000007 is deleted; it_000002 is s1's.
    let refs = [
        "it_000000",
        "it_000000@1",
        "it_000000@2",
        "it_000007",
        "nope",
        "it_000002",
        "it_000003@9",
    ];
    let mut args = vec!["resolve", s(dir.path())];
    args.extend(refs);
    let output = json_lines(&run_ok(&args));
    let mut as_s1 = vec!["resolve", s(dir.path()), "--session", "s1"];
    as_s1.extend(["it_000002", "it_000003"]);
    let output_s1 = json_lines(&run_ok(&as_s1));

    let store = open(dir.path());
    assert_eq!(output, as_values(&store.resolve(refs).unwrap()));
    let statuses: Vec<&str> = output.iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(
        statuses,
        [
            "found",
            "superseded",
            "found",
            "not_found",
            "not_found",
            "found",
            "not_found"
        ]
    );
    assert_eq!(
        output_s1,
        as_values(&store.session("s1").resolve(["it_000002", "it_000003"]).unwrap())
    );
    assert_eq!(output_s1[1]["status"], "not_found", "s2's item is hidden from s1");
    drop(store);
    let bad = run(&["resolve", s(dir.path()), "a b"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

#[test]
fn changes_are_the_feed() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 300, 50);
    let all = json_lines(&run_ok(&["changes", s(dir.path())]));
    let after = json_lines(&run_ok(&["changes", s(dir.path()), "--after", "4"]));
    let store = open(dir.path());
    let feed = |after: u64| -> Vec<Value> {
        store
            .changes(after)
            .unwrap()
            .map(|c| serde_json::from_str(&c.unwrap().to_json()).unwrap())
            .collect()
    };
    assert_eq!(all, feed(store.history_start().unwrap()));
    assert_eq!(after, feed(4));
    assert!(all.len() > after.len() && !after.is_empty());
    assert!(all.iter().any(|c| c["change"] == "deleted"));
    let last = store.last_seq();
    drop(store);
    let past = run(&["changes", s(dir.path()), "--after", &(last + 1).to_string()]);
    assert_eq!(past.status.code(), Some(2), "{}", stderr(&past));
}
