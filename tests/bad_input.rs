//! Bad input is refused with the specific error (variant, field, batch index), never a panic, and
//! never a partial write: after every refused add the store's sequence number is unchanged and it
//! returns nothing, also after a reopen. Covers item fields, the JSON shape, types and id patterns,
//! hashes, content size, time ranges, the directory lock, whole batches refused for one item, and
//! large batches validated on several threads (the same answer and bytes as on one).

mod common;

use common::*;
use ctxlog::*;
use serde_json::json;

/// A valid item that every test changes in one field.
fn good() -> ContextItem {
    ContextItem::new(
        "ch3",
        "document_chunk",
        json!({"text": "Clause 3"}),
        "crm_export",
        1_715_299_200,
        "20240510.1",
        Scope::GlobalReadonly,
    )
}

/// A valid JSON item that every JSON test changes in one field.
fn good_json(extra: &str) -> String {
    let base = r#""id":"ch3","type":"document_chunk","content":{"text":"hi"},"source":"s","timestamp":1715299200,"version":"1""#;
    format!("{{{base},{extra}}}")
}

fn fresh() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    (dir, store)
}

/// The store holds nothing and its sequence number is still `seq_before`.
fn assert_nothing_written(store: &Store, seq_before: u64) {
    assert_eq!(store.stats().seq, seq_before, "the sequence number moved");
    assert_eq!(store.stats().versions, 0, "a version was stored");
    assert!(everything(store).is_empty(), "get returns items after a refused add");
}

/// Adds `bad` alone to a fresh store and expects `Invalid` on `field` at index 0 with nothing written.
/// Then checks that the store still accepts a valid item, so the refusal was about `bad`.
fn expect_invalid(bad: ContextItem, field: &str) -> Error {
    let (_dir, store) = fresh();
    let seq = store.stats().seq;
    let err = store.add([bad]).expect_err("a bad item must be refused");
    match &err {
        Error::Invalid {
            field: f,
            index,
            reason,
        } => {
            assert_eq!(f, field, "wrong field; reason: {reason}");
            assert_eq!(*index, Some(0));
            assert!(!reason.is_empty());
        }
        other => panic!("expected Invalid on {field}, got {other:?}"),
    }
    assert!(err.to_string().starts_with("item 0: "), "{err}");
    assert_nothing_written(&store, seq);
    let outcome = store.add([good()]).expect("a valid item after the refusal");
    assert!(matches!(outcome.as_slice(), [AddOutcome::Added { .. }]));
    err
}

/// Adds `item` alone to a fresh store and expects it to be accepted (the boundary side of a rule).
fn expect_accepted(item: ContextItem) -> ContextItem {
    let (_dir, store) = fresh();
    let id = item.id.clone();
    let outcomes = store.add([item.clone()]).expect("a valid item is accepted");
    assert!(
        matches!(outcomes.as_slice(), [AddOutcome::Added { .. }]),
        "{outcomes:?}"
    );
    let resolved = store.resolve([id.as_str()]).expect("resolve");
    let got = found(&resolved[0]).clone();
    assert_eq!(got, stored_form(&item));
    got
}

/// Parses `text` as an item JSON and expects `Invalid` on `field`; a store that sees the attempt stays empty.
fn expect_json_invalid(text: &str, field: &str) {
    let (_dir, store) = fresh();
    let seq = store.stats().seq;
    let result = ContextItem::from_json(text).and_then(|item| store.add([item]));
    match result {
        Err(Error::Invalid { field: f, reason, .. }) => assert_eq!(f, field, "reason: {reason}; json: {text}"),
        other => panic!("expected Invalid on {field} for {text}, got {other:?}"),
    }
    assert_nothing_written(&store, seq);
}

fn with_id(id: &str) -> ContextItem {
    let mut it = good();
    it.id = id.to_owned();
    it
}

// ---- ids ----

#[test]
fn empty_id_is_invalid() {
    expect_invalid(with_id(""), "id");
}

#[test]
fn id_with_a_space_is_invalid() {
    expect_invalid(with_id("ch 3"), "id");
}

#[test]
fn id_with_a_non_ascii_char_is_invalid() {
    expect_invalid(with_id("ché3"), "id");
    expect_invalid(with_id("文書"), "id");
}

#[test]
fn id_of_129_bytes_is_invalid_and_128_accepted() {
    let err = expect_invalid(with_id(&"a".repeat(129)), "id");
    assert!(err.to_string().contains("129"), "{err}");
    let got = expect_accepted(with_id(&"a".repeat(128)));
    assert_eq!(got.id.len(), 128);
    expect_accepted(with_id("Az09._:-"));
}

// ---- types ----

#[test]
fn unknown_type_is_refused_naming_the_known_types() {
    let (_dir, store) = fresh();
    let seq = store.stats().seq;
    let mut bad = good();
    bad.kind = "legal_clause".into();
    let err = store.add([bad]).expect_err("unknown type");
    match &err {
        Error::UnknownType { kind, known, index } => {
            assert_eq!(kind, "legal_clause");
            assert_eq!(*index, Some(0));
            for builtin in BUILTIN_TYPES {
                assert!(known.iter().any(|k| k == builtin), "{builtin} missing from {known:?}");
            }
        }
        other => panic!("expected UnknownType, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.starts_with("item 0: "), "{text}");
    assert!(
        text.contains("document_chunk") && text.contains("monitoring_metric"),
        "{text}"
    );
    assert_nothing_written(&store, seq);
}

#[test]
fn id_not_matching_the_type_pattern_is_invalid_also_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("open");
        store
            .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9.a-z]+$"))
            .expect("register");
        let seq = store.stats().seq;
        let mut bad = good();
        bad.kind = "legal_clause".into();
        bad.id = "ch3".into();
        match store.add([bad]).expect_err("id does not match the pattern") {
            Error::Invalid { field, index, reason } => {
                assert_eq!(field, "id", "{reason}");
                assert_eq!(index, Some(0));
            }
            other => panic!("expected Invalid id, got {other:?}"),
        }
        assert_nothing_written(&store, seq);
        // The registered type is now among the known ones.
        let mut unknown = good();
        unknown.kind = "no_such_type".into();
        match store.add([unknown]).expect_err("unknown type") {
            Error::UnknownType { known, .. } => assert!(known.iter().any(|k| k == "legal_clause"), "{known:?}"),
            other => panic!("expected UnknownType, got {other:?}"),
        }
    }
    let store = Store::open(dir.path()).expect("reopen");
    let mut bad = good();
    bad.kind = "legal_clause".into();
    bad.id = "CL_1".into();
    assert!(matches!(store.add([bad]), Err(Error::Invalid { ref field, .. }) if field == "id"));
    let mut ok = good();
    ok.kind = "legal_clause".into();
    ok.id = "cl_3.1a".into();
    store.add([ok.clone()]).expect("a matching id is accepted after reopen");
    assert_eq!(everything(&store), vec![stored_form(&ok)]);
}

// ---- JSON shape ----

#[test]
fn json_control_item_parses() {
    let item = ContextItem::from_json(&good_json(r#""scope":"session","session_id":"s1""#)).expect("valid JSON");
    assert_eq!(item.scope, Scope::Session("s1".into()));
    let item = ContextItem::from_json(&good_json(r#""scope":"global_readonly","session_id":null"#)).expect("null");
    assert_eq!(item.scope, Scope::GlobalReadonly);
    assert_eq!(ContextItem::from_json(&item.to_json()).expect("roundtrip"), item);
}

#[test]
fn json_scope_session_capitalised_is_invalid() {
    expect_json_invalid(&good_json(r#""scope":"Session","session_id":"s1""#), "scope");
}

#[test]
fn json_scope_global_is_invalid() {
    expect_json_invalid(&good_json(r#""scope":"global""#), "scope");
}

#[test]
fn json_session_scope_without_session_id_is_invalid() {
    expect_json_invalid(&good_json(r#""scope":"session""#), "session_id");
    expect_json_invalid(&good_json(r#""scope":"session","session_id":null"#), "session_id");
}

#[test]
fn json_session_id_on_a_global_scope_is_invalid() {
    expect_json_invalid(
        &good_json(r#""scope":"global_readonly","session_id":"s1""#),
        "session_id",
    );
    expect_json_invalid(
        &good_json(r#""scope":"global_writable","session_id":"s1""#),
        "session_id",
    );
}

#[test]
fn json_negative_ttl_is_invalid() {
    expect_json_invalid(
        &good_json(r#""scope":"global_readonly","ttl_seconds":-5"#),
        "ttl_seconds",
    );
}

#[test]
fn json_negative_timestamp_is_invalid() {
    let text = good_json(r#""scope":"global_readonly""#).replace("1715299200", "-1");
    expect_json_invalid(&text, "timestamp");
}

#[test]
fn json_unknown_field_ttl_is_invalid() {
    expect_json_invalid(&good_json(r#""scope":"global_readonly","ttl":60"#), "ttl");
}

#[test]
fn session_scope_with_a_malformed_session_id_is_invalid() {
    let mut bad = good();
    bad.scope = Scope::Session(String::new());
    expect_invalid(bad, "session_id");
    let mut bad = good();
    bad.scope = Scope::Session("s 1".into());
    expect_invalid(bad, "session_id");
}

// ---- numbers ----

#[test]
fn confidence_out_of_range_or_not_finite_is_invalid() {
    for c in [1.5, -0.1, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = expect_invalid(good().with_confidence(c), "confidence");
        assert!(err.to_string().contains("confidence"), "{err}");
    }
    for c in [0.0, 1.0, 0.5] {
        assert_eq!(expect_accepted(good().with_confidence(c)).confidence, Some(c));
    }
}

#[test]
fn ttl_zero_is_invalid_and_one_accepted() {
    expect_invalid(good().with_ttl(0), "ttl_seconds");
    let mut it = good().with_ttl(1);
    it.timestamp = 4_000_000_000; // far in the future so the item is visible now
    assert_eq!(expect_accepted(it).ttl_seconds, Some(1));
}

#[test]
fn timestamp_beyond_year_9999_is_invalid() {
    let mut bad = good();
    bad.timestamp = 253_402_300_800;
    expect_invalid(bad, "timestamp");
    let mut bad = good();
    bad.timestamp = -1;
    expect_invalid(bad, "timestamp");
    let mut edge = good();
    edge.timestamp = 253_402_300_799;
    expect_accepted(edge);
    let mut zero = good();
    zero.timestamp = 0;
    expect_accepted(zero);
}

// ---- version, source ----

#[test]
fn empty_version_is_invalid() {
    let mut bad = good();
    bad.version = String::new();
    expect_invalid(bad, "version");
}

#[test]
fn version_with_a_space_is_invalid() {
    let mut bad = good();
    bad.version = "2024 05".into();
    expect_invalid(bad, "version");
    let mut bad = good();
    bad.version = "a:b".into(); // ':' is allowed in ids but not versions
    expect_invalid(bad, "version");
}

#[test]
fn empty_source_is_invalid() {
    let mut bad = good();
    bad.source = String::new();
    expect_invalid(bad, "source");
}

#[test]
fn source_of_257_bytes_is_invalid_and_256_accepted() {
    let mut bad = good();
    bad.source = "s".repeat(257);
    expect_invalid(bad, "source");
    let mut edge = good();
    edge.source = "s".repeat(256);
    assert_eq!(expect_accepted(edge).source.len(), 256);
}

// ---- hashes ----

#[test]
fn malformed_hashes_are_invalid() {
    let right = expected_hash(&good().content);
    let hex = right.strip_prefix("sha256:").expect("prefix").to_owned();
    for bad in [
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha512:{hex}"),
        format!("SHA256:{hex}"),
        hex.clone(),
        format!("sha256:{}", &hex[..63]),
        format!("sha256:{hex}0"),
        format!("sha256:{}g", &hex[..63]),
        String::new(),
    ] {
        expect_invalid(good().with_hash(bad), "hash");
    }
    // The well-formed right hash is accepted and is what the engine stores.
    assert_eq!(expect_accepted(good().with_hash(right.clone())).hash, Some(right));
}

#[test]
fn well_formed_hash_that_does_not_match_is_hash_mismatch() {
    let (_dir, store) = fresh();
    let seq = store.stats().seq;
    let declared = expected_hash(&json!({"text": "something else"}));
    let err = store.add([good().with_hash(declared.clone())]).expect_err("mismatch");
    match &err {
        Error::HashMismatch { index, .. } => assert_eq!(*index, Some(0)),
        other => panic!("expected HashMismatch, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.starts_with("item 0: ") && text.contains(&declared), "{text}");
    assert_nothing_written(&store, seq);
}

// ---- content size ----

#[test]
fn content_over_max_content_bytes_is_too_large() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new().max_content_bytes(64).open(dir.path()).expect("open");
    let seq = store.stats().seq;
    let mut bad = good();
    bad.content = json!("x".repeat(63)); // 65 bytes with its quotes
    match store.add([bad]).expect_err("too large") {
        Error::TooLarge { what, len, max, index } => {
            assert_eq!(what, "content");
            assert_eq!(len, 65);
            assert_eq!(max, 64);
            assert_eq!(index, Some(0));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_nothing_written(&store, seq);
    let mut edge = good();
    edge.content = json!("x".repeat(62)); // exactly 64 bytes
    store.add([edge.clone()]).expect("content at the limit is accepted");
    assert_eq!(everything(&store), vec![stored_form(&edge)]);
}

// ---- time ranges ----

fn range_field(result: Result<TimeRange>) -> String {
    match result {
        Err(Error::Invalid { field, index, .. }) => {
            assert_eq!(index, None);
            field
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn time_range_with_an_offset_is_invalid() {
    let good = "2024-05-10T00:00:00Z";
    for bad in ["2024-05-10T00:00:00+08:00", "2024-05-10T00:00:00+00:00"] {
        assert_eq!(range_field(TimeRange::parse(bad, good)), "time_range.start", "{bad}");
        assert_eq!(range_field(TimeRange::parse(good, bad)), "time_range.end", "{bad}");
    }
}

#[test]
fn time_range_without_a_zone_is_invalid() {
    let good = "2024-05-12T00:00:00Z";
    assert_eq!(
        range_field(TimeRange::parse("2024-05-10T00:00:00", good)),
        "time_range.start"
    );
}

#[test]
fn time_range_with_an_impossible_date_is_invalid() {
    let good = "2024-05-12T00:00:00Z";
    assert_eq!(
        range_field(TimeRange::parse("2024-02-30T00:00:00Z", good)),
        "time_range.start"
    );
    assert_eq!(
        range_field(TimeRange::parse("2024-01-01T00:00:00Z", "2024-02-30T00:00:00Z")),
        "time_range.end"
    );
}

#[test]
fn time_range_with_start_after_end_is_invalid() {
    assert_eq!(
        range_field(TimeRange::parse("2024-05-12T00:00:00Z", "2024-05-10T00:00:00Z")),
        "time_range"
    );
    assert_eq!(range_field(TimeRange::new(11, 10)), "time_range");
    let ok = TimeRange::parse("2024-05-10T00:00:00Z", "2024-05-12T23:59:59Z").expect("valid");
    assert_eq!((ok.start(), ok.end()), (1_715_299_200, 1_715_558_399));
}

// ---- the lock ----

#[test]
fn second_open_of_the_same_dir_is_locked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Store::open(dir.path()).expect("first open");
    match Store::open(dir.path()) {
        Err(Error::Locked { path }) => assert_eq!(path, dir.path()),
        Err(other) => panic!("expected Locked, got {other:?}"),
        Ok(_) => panic!("a second open of a locked directory succeeded"),
    }
    // The first handle still works; after it is dropped the directory opens again.
    first.add([good()]).expect("the first handle still writes");
    drop(first);
    let again = Store::open(dir.path()).expect("reopen after drop");
    assert_eq!(everything(&again), vec![stored_form(&good())]);
}

// ---- whole batches ----

fn batch_of_ten() -> Vec<ContextItem> {
    (0..10)
        .map(|i| {
            ContextItem::new(
                format!("b{i}"),
                "message",
                json!({"n": i}),
                "batch",
                1_715_299_200 + i,
                "1",
                Scope::GlobalWritable,
            )
        })
        .collect()
}

/// One bad item at position 7 refuses the whole batch of 10: index 7, "item 7:", nothing stored, also
/// after drop and reopen.
fn refuse_batch_at_7(spoil: impl Fn(&mut ContextItem), matches_variant: impl Fn(&Error) -> bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Options::new().max_content_bytes(1024).open(dir.path()).expect("open");
        let seq = store.stats().seq;
        let mut batch = batch_of_ten();
        spoil(&mut batch[7]);
        let err = store.add(batch).expect_err("the batch must be refused");
        assert!(matches_variant(&err), "unexpected error {err:?}");
        assert_eq!(err.index(), Some(7));
        assert!(err.to_string().starts_with("item 7:"), "{err}");
        assert_nothing_written(&store, seq);
        let resolved = store.resolve(["b0", "b6", "b8"]).expect("resolve");
        assert!(
            resolved.iter().all(|r| matches!(r, Resolution::NotFound { .. })),
            "{resolved:?}"
        );
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_nothing_written(&store, 0);
    // The same batch without the spoiled item is accepted, all 10 of it.
    let outcomes = store.add(batch_of_ten()).expect("the clean batch");
    assert_eq!(outcomes.len(), 10);
    assert_eq!(everything(&store).len(), 10);
}

#[test]
fn batch_with_a_bad_id_at_7_writes_nothing() {
    refuse_batch_at_7(
        |it| it.id = "b 7".into(),
        |e| matches!(e, Error::Invalid { field, .. } if field == "id"),
    );
}

#[test]
fn batch_with_an_unknown_type_at_7_writes_nothing() {
    refuse_batch_at_7(|it| it.kind = "nope".into(), |e| matches!(e, Error::UnknownType { .. }));
}

#[test]
fn batch_with_a_hash_mismatch_at_7_writes_nothing() {
    refuse_batch_at_7(
        |it| it.hash = Some(expected_hash(&json!("other"))),
        |e| matches!(e, Error::HashMismatch { .. }),
    );
}

#[test]
fn batch_with_too_large_content_at_7_writes_nothing() {
    refuse_batch_at_7(
        |it| it.content = json!("y".repeat(2000)),
        |e| matches!(e, Error::TooLarge { .. }),
    );
}

#[test]
fn batch_with_a_bad_confidence_at_7_writes_nothing() {
    refuse_batch_at_7(
        |it| it.confidence = Some(f64::NAN),
        |e| matches!(e, Error::Invalid { field, .. } if field == "confidence"),
    );
}

#[test]
fn batch_with_a_version_conflict_at_7_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut stored = batch_of_ten()[7].clone();
    stored.id = "existing".into();
    stored.content = json!({"original": true});
    {
        let store = Store::open(dir.path()).expect("open");
        store.add([stored.clone()]).expect("first version");
        let seq = store.stats().seq;
        let mut batch = batch_of_ten();
        batch[7].id = "existing".into(); // same (id, version), other content
        let err = store.add(batch).expect_err("conflict");
        match &err {
            Error::VersionConflict { id, version, index, .. } => {
                assert_eq!(id, "existing");
                assert_eq!(version, "1");
                assert_eq!(*index, Some(7));
            }
            other => panic!("expected VersionConflict, got {other:?}"),
        }
        assert_eq!(err.index(), Some(7));
        assert!(err.to_string().starts_with("item 7:"), "{err}");
        assert_eq!(store.stats().seq, seq);
        assert_eq!(everything(&store), vec![stored_form(&stored)]);
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(everything(&store), vec![stored_form(&stored)]);
    assert_eq!(store.stats().versions, 1);
}

#[test]
fn conflict_inside_one_batch_writes_nothing() {
    let (_dir, store) = fresh();
    let mut batch = batch_of_ten();
    batch[7].id = "b2".into(); // (b2, 1) twice in one batch with different content
    let err = store.add(batch).expect_err("conflict inside the batch");
    assert!(matches!(err, Error::VersionConflict { .. }), "{err:?}");
    assert_eq!(err.index(), Some(7));
    assert_nothing_written(&store, 0);
}

// ---- large batches, validated on several threads ----

fn big_batch(len: usize) -> Vec<ContextItem> {
    (0..len)
        .map(|i| {
            ContextItem::new(
                format!("big{i}"),
                "message",
                json!({"n": i, "text": format!("item {i} of a batch large enough to be split over threads")}),
                "batch",
                1_715_299_200 + i64::try_from(i).expect("small"),
                "1",
                Scope::Session(format!("s{}", i % 7)),
            )
        })
        .collect()
}

/// A batch of 2,000 items on 4 threads: whichever runs hold bad items, the error names the first bad
/// position (the same answer as checking one by one), and nothing is written.
#[test]
fn a_large_batch_split_over_threads_reports_the_first_bad_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new().add_threads(4).open(dir.path()).expect("open");
    // Runs of 500: positions 0-499 on the calling thread, the rest on helpers.
    for bad in [
        vec![1_999],
        vec![700, 1_500],
        vec![499, 500],
        vec![3, 1_200, 1_999],
        vec![0],
    ] {
        let mut batch = big_batch(2_000);
        for &at in &bad {
            batch[at].id = format!("bad id {at}");
        }
        let err = store.add(batch).expect_err("the batch must be refused");
        assert!(matches!(&err, Error::Invalid { field, .. } if field == "id"), "{err:?}");
        assert_eq!(err.index(), Some(bad[0]), "bad positions {bad:?}: {err}");
        assert_nothing_written(&store, 0);
    }
    // A session view refuses an item of another session at the first such position.
    let mut batch = big_batch(2_000);
    for item in &mut batch {
        item.scope = Scope::Session("s1".into());
    }
    batch[1_234].scope = Scope::Session("s2".into());
    batch[1_800].scope = Scope::Session("s3".into());
    let err = store.session("s1").add(batch).expect_err("another session's item");
    assert_eq!(err.index(), Some(1_234), "{err}");
    assert_nothing_written(&store, 0);
}

/// A store adding with `threads` threads. Its clock stands still: each frame's sync mark records the
/// second its batch committed (segment format 3), and stores whose bytes are compared must agree on it.
fn open_with_threads(dir: &std::path::Path, threads: usize) -> Store {
    Options::new()
        .clock(std::sync::Arc::new(ManualClock::new(1_715_335_300)))
        .add_threads(threads)
        .auto_compact(false)
        .open(dir)
        .expect("open")
}

/// The bytes of every segment file in `dir`, in file-name order.
fn segment_bytes(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| entry.expect("entry").file_name().into_string().expect("name"))
        .filter(|name| name.ends_with(".seg"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no segment in {}", dir.display());
    names
        .iter()
        .map(|name| std::fs::read(dir.join(name)).expect("read segment"))
        .collect()
}

/// The records a batch writes do not depend on how many threads encoded them: one thread and four
/// leave byte-identical segments, and every item resolves to what was added.
#[test]
fn a_large_batch_writes_the_same_bytes_on_one_thread_and_on_four() {
    let mut segments = Vec::new();
    for threads in [1, 4] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open_with_threads(dir.path(), threads);
        let batch = big_batch(3_000);
        let outcomes = store.add(batch.clone()).expect("add");
        assert_eq!(outcomes.len(), 3_000);
        for (outcome, item) in outcomes.iter().zip(&batch) {
            assert!(
                matches!(outcome, AddOutcome::Added { id, seq: 1, .. } if *id == item.id),
                "{outcome:?}"
            );
        }
        let ids: Vec<&str> = batch.iter().map(|item| item.id.as_str()).collect();
        let resolved = store.resolve(ids).expect("resolve");
        for (resolution, item) in resolved.iter().zip(&batch) {
            assert_eq!(found(resolution), &stored_form(item));
        }
        drop(store);
        segments.push(segment_bytes(dir.path()));
    }
    assert!(
        segments[0] == segments[1],
        "one thread and four wrote different segments"
    );
}

/// Opening a fresh directory with `options` is refused as `Invalid` naming `field`, with a reason
/// that quotes `quoted`, and creates nothing in the directory.
fn expect_options_invalid(options: Options, field: &str, quoted: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = options.open(dir.path()).expect_err("refused");
    assert!(
        matches!(&err, Error::Invalid { field: f, reason, .. } if f == field && reason.contains(quoted)),
        "{field} ({quoted}): {err:?}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("list").count(),
        0,
        "{field} ({quoted}): files created"
    );
}

#[test]
fn add_threads_out_of_range_is_invalid() {
    for threads in [0, 65] {
        expect_options_invalid(Options::new().add_threads(threads), "add_threads", &threads.to_string());
    }
}

#[test]
fn segment_size_out_of_range_is_invalid() {
    use ctxlog::limits::{SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};
    for bytes in [0, SEGMENT_BYTES_MIN - 1, SEGMENT_BYTES_MAX + 1, u64::MAX] {
        expect_options_invalid(Options::new().segment_size(bytes), "segment_size", &bytes.to_string());
    }
    for bytes in [SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Options::new()
            .segment_size(bytes)
            .open(dir.path())
            .unwrap_or_else(|e| panic!("{bytes} refused: {e:?}"));
        store.add([good()]).expect("add");
    }
}

#[test]
fn max_content_bytes_out_of_range_is_invalid() {
    use ctxlog::limits::CONTENT_BYTES_MAX;
    for bytes in [0, CONTENT_BYTES_MAX + 1, usize::MAX] {
        expect_options_invalid(
            Options::new().max_content_bytes(bytes),
            "max_content_bytes",
            &bytes.to_string(),
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new()
        .max_content_bytes(CONTENT_BYTES_MAX)
        .open(dir.path())
        .expect("the largest accepted");
    store.add([good()]).expect("add");
}

#[test]
fn periodic_durability_of_zero_is_invalid() {
    expect_options_invalid(
        Options::new().durability(Durability::Periodic(std::time::Duration::ZERO)),
        "durability",
        "above zero",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Options::new()
        .durability(Durability::Periodic(std::time::Duration::from_nanos(1)))
        .open(dir.path())
        .expect("the shortest period");
    store.add([good()]).expect("add");
}

#[test]
fn checkpoint_every_out_of_range_is_invalid() {
    for bytes in [0, (64 << 10) - 1, (1 << 40) + 1, u64::MAX] {
        expect_options_invalid(
            Options::new().checkpoint_every(bytes),
            "checkpoint_every",
            &bytes.to_string(),
        );
    }
    for bytes in [64 << 10, 1 << 40] {
        let dir = tempfile::tempdir().expect("tempdir");
        Options::new()
            .checkpoint_every(bytes)
            .open(dir.path())
            .unwrap_or_else(|e| panic!("{bytes} refused: {e:?}"));
    }
}

/// How an item of a large batch may be spoiled, each refused by validation with its own error.
#[derive(Debug, Clone, Copy)]
enum Spoil {
    Id,
    UnknownType,
    Confidence,
    DeclaredHash,
    OtherSession,
}

fn spoil(item: &mut ContextItem, how: Spoil) {
    match how {
        Spoil::Id => item.id = "bad id".into(),
        Spoil::UnknownType => item.kind = "no_such_type".into(),
        Spoil::Confidence => item.confidence = Some(1.5),
        Spoil::DeclaredHash => item.hash = Some(format!("sha256:{}", "0".repeat(64))),
        Spoil::OtherSession => item.scope = Scope::Session("someone_else".into()),
    }
}

/// Adds `batch` through session `s0`'s view of a fresh store with `threads` add threads; returns the
/// error's text, or the outcomes and the segments' bytes.
fn add_with_threads(batch: Vec<ContextItem>, threads: usize) -> Result<(Vec<AddOutcome>, Vec<Vec<u8>>), String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_with_threads(dir.path(), threads);
    let outcome = store.session("s0").add(batch);
    let seq = store.stats().seq;
    drop(store);
    let outcomes = outcome.map_err(|e| format!("{e:?} / {e}"))?;
    assert!(seq > 0);
    let segments = segment_bytes(dir.path());
    Ok((outcomes, segments))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Split over 2 to 4 threads, a large batch gets exactly the answer it gets on one thread: the
    /// same error (variant, field, position, text) wherever its bad items lie, or the same outcomes and
    /// byte-identical segments.
    #[test]
    fn a_large_batch_gets_the_same_answer_on_any_number_of_threads(
        len in 256usize..1_500,
        threads in 2usize..=4,
        spoils in proptest::collection::vec((0usize..1_500, 0usize..5), 0..4),
    ) {
        let mut batch = big_batch(len);
        for item in &mut batch {
            item.scope = Scope::Session("s0".into());
        }
        let kinds = [Spoil::Id, Spoil::UnknownType, Spoil::Confidence, Spoil::DeclaredHash, Spoil::OtherSession];
        for &(at, kind) in &spoils {
            if let Some(item) = batch.get_mut(at) {
                spoil(item, kinds[kind]);
            }
        }
        let one = add_with_threads(batch.clone(), 1);
        let many = add_with_threads(batch, threads);
        proptest::prop_assert_eq!(&one, &many);
        if let Err(text) = &one {
            let first = spoils.iter().map(|&(at, _)| at).filter(|&at| at < len).min();
            proptest::prop_assert!(first.is_some(), "refused without a spoiled item: {}", text);
            let expected = format!("item {}:", first.unwrap_or(0));
            proptest::prop_assert!(text.contains(&expected), "{} does not name {}", text, expected);
        }
    }
}
