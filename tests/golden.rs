//! Pins the on-disk format: a fixed sequence of batches written by this build must produce exactly the
//! bytes of the committed fixture (tests/fixtures/format-v2/), and every fixture, of this format and
//! of the earlier ones (format-v1), must open and read back the same items forever. A change to either is a format change: bump FORMAT_VERSION, document it in
//! docs/FORMAT.md, and keep reading the old fixture.
//!
//! To regenerate after a deliberate format change: `CTXLOG_BLESS=1 cargo test --test golden`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxlog::{ContextItem, ContextQuery, Durability, ManualClock, Options, Resolution, Scope, Store, TypeSpec};
use serde_json::json;

/// The store as this build writes it: segment format 2.
fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v2")
}

/// The same store as the first release wrote it: segment format 1, no sync marks.
fn v1_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v1")
}

fn golden_items() -> Vec<ContextItem> {
    vec![
        ContextItem::new(
            "cl_1.2",
            "legal_clause",
            json!({"jurisdiction": "CN", "text": "合同"}),
            "crm",
            1_715_335_200,
            "1",
            Scope::GlobalReadonly,
        ),
        ContextItem::new(
            "m1",
            "message",
            json!({"role": "user", "b": [1, 2.5, null]}),
            "chat",
            1_715_335_260,
            "v1",
            Scope::Session("s1".into()),
        )
        .with_ttl(3600)
        .with_confidence(0.75),
    ]
}

/// Writes the fixed batches: a type registration, two items, then a delete of a third item.
fn write_golden(dir: &Path) -> Store {
    // Compression on, so that the fixtures pin both forms of stored content.
    let store = Options::new()
        .durability(Durability::Immediate)
        .compress_content(true)
        .clock(Arc::new(ManualClock::new(1_715_335_300)))
        .open(dir)
        .expect("open");
    store
        .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9.a-z]+$"))
        .expect("register");
    store.add(golden_items()).expect("add");
    store
        .add([ContextItem::new(
            "gone",
            "tool_result",
            json!(1),
            "tool",
            1_715_335_000,
            "1",
            Scope::GlobalWritable,
        )])
        .expect("add gone");
    assert!(store.delete("gone").expect("delete"));
    store
}

#[test]
fn this_build_writes_the_golden_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(write_golden(dir.path()));
    let written = std::fs::read(dir.path().join("00000001.seg")).expect("segment");
    let golden_path = fixture_dir().join("00000001.seg");
    if std::env::var_os("CTXLOG_BLESS").is_some() {
        std::fs::create_dir_all(fixture_dir()).expect("fixture dir");
        std::fs::write(&golden_path, &written).expect("bless");
    }
    let golden = std::fs::read(&golden_path).expect("the golden fixture is committed");
    assert_eq!(written.len(), golden.len(), "segment length changed");
    if let Some(at) = written.iter().zip(&golden).position(|(a, b)| a != b) {
        panic!(
            "the encoding changed at byte {at}: wrote {:#04x}, golden {:#04x}",
            written[at], golden[at]
        );
    }
    // The segment starts with the magic and format version 2.
    assert_eq!(&golden[0..8], b"CTXLOGSG");
    assert_eq!(u32::from_le_bytes(golden[8..12].try_into().expect("4 bytes")), 2);
}

#[test]
fn the_golden_stores_open_and_read_back() {
    for fixture in [fixture_dir(), v1_fixture_dir()] {
        golden_store_reads_back(&fixture);
    }
}

fn golden_store_reads_back(fixture: &Path) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(fixture.join("00000001.seg"), dir.path().join("00000001.seg")).expect("copy fixture");
    let store = Options::new()
        .clock(Arc::new(ManualClock::new(1_715_335_300)))
        .open(dir.path())
        .expect("open");
    assert!(store.verify().expect("verify").is_ok());
    assert_eq!(store.stats().seq, 4, "four batches: register, add, add, delete");
    let got = store.get(&ContextQuery::new()).expect("get");
    let mut expected = golden_items();
    for item in &mut expected {
        item.hash = None;
    }
    let mut got_without_hash = got.clone();
    for item in &mut got_without_hash {
        assert!(item.hash.as_deref().is_some_and(|h| h.starts_with("sha256:")));
        item.hash = None;
    }
    assert_eq!(got_without_hash, expected);
    assert_eq!(
        got[0].hash.as_deref(),
        Some("sha256:".to_owned() + &sha256_hex(&ctxlog::canonical_json(&got[0].content))).as_deref()
    );
    let resolved = store.resolve(["gone", "m1@v1"]).expect("resolve");
    assert_eq!(
        resolved[0],
        Resolution::NotFound {
            reference: "gone".into()
        }
    );
    assert!(matches!(&resolved[1], Resolution::Found(item) if item.id == "m1"));
    // The registered type came back from the log: its pattern is enforced.
    let bad = ContextItem::new("x1", "legal_clause", json!(1), "crm", 1, "1", Scope::GlobalReadonly);
    assert!(matches!(store.add([bad]), Err(ctxlog::Error::Invalid { ref field, .. }) if field == "id"));
}

/// SHA-256 in hex, computed here independently of the engine's own code path.
fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = <sha2::Sha256 as sha2::Digest>::digest(bytes);
    digest.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// m1's second version: content long and repetitive enough to be stored compressed.
fn m1_v2_content() -> serde_json::Value {
    json!({"role": "user", "b": "edited again and again, ".repeat(12)})
}

/// The compacted store as this build writes it: segments of format 2, a checkpoint of format 4.
fn compacted_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v2-compacted")
}

/// The compacted store's checkpoint as checkpoint format 2 wrote it (over the same segments).
fn checkpoint_v2_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-v2")
}

/// The compacted store's checkpoint as checkpoint format 3 wrote it (over the same segments).
fn checkpoint_v3_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-v3")
}

/// The compacted store's checkpoint as checkpoint format 4 wrote it (over the same segments).
fn checkpoint_v4_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-v4")
}

/// The compacted store's checkpoint as checkpoint format 5 wrote it (over the same segments).
fn checkpoint_v5_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-v5")
}

/// The same store as the first release wrote it, with a checkpoint of format 1.
fn checkpoint_v1_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v1-compacted")
}

/// The golden batches, then a pin, superseded and expired versions, a compaction (which seals the
/// active segment and rewrites segment 1 with retired records) and a clean close (a checkpoint).
fn write_compacted(dir: &Path) {
    let store = write_golden(dir);
    store.pin_snapshot("audit").expect("pin");
    let m1 = &golden_items()[1];
    let mut m1_v2 = m1.clone();
    m1_v2.version = "v2".into();
    // Long and repetitive: stored LZ4-compressed, so the fixture pins that encoding too.
    m1_v2.content = m1_v2_content();
    store.add([m1_v2]).expect("m1 v2");
    let expired = ContextItem::new(
        "tmp1",
        "tool_result",
        json!({"ok": true}),
        "tool",
        1_715_335_200,
        "1",
        Scope::GlobalWritable,
    )
    .with_ttl(10);
    store.add([expired]).expect("tmp1");
    let old = ContextItem::new(
        "old",
        "message",
        json!("first"),
        "chat",
        1_715_335_250,
        "1",
        Scope::GlobalWritable,
    );
    store.add([old.clone()]).expect("old v1");
    let mut old_v2 = old;
    old_v2.version = "2".into();
    old_v2.content = json!("second");
    store.add([old_v2]).expect("old v2");
    let report = store.compact().expect("compact");
    assert_eq!(report.segments_rewritten, 1, "{report:?}");
    assert_eq!(
        report.retired, 2,
        "tmp1 (expired) and old@1 (superseded) are retired: {report:?}"
    );
}

/// Every file of a store directory but the lock, by name.
fn store_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("list")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.file_name().is_some_and(|name| name != "LOCK"))
        .map(|path| {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, std::fs::read(&path).expect("read"))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn this_build_writes_the_golden_compacted_store_and_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_compacted(dir.path());
    let written = store_files(dir.path());
    let names: Vec<&str> = written.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["00000001.seg", "00000002.seg", "checkpoint-00000000000000000009.idx"]
    );
    if std::env::var_os("CTXLOG_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(compacted_fixture_dir());
        std::fs::create_dir_all(compacted_fixture_dir()).expect("fixture dir");
        for (name, bytes) in &written {
            std::fs::write(compacted_fixture_dir().join(name), bytes).expect("bless");
        }
    }
    let golden = store_files(&compacted_fixture_dir());
    assert_eq!(written.len(), golden.len(), "another set of files");
    for ((name, bytes), (golden_name, golden_bytes)) in written.iter().zip(&golden) {
        assert_eq!(name, golden_name);
        assert_eq!(bytes.len(), golden_bytes.len(), "{name}: length changed");
        if let Some(at) = bytes.iter().zip(golden_bytes).position(|(a, b)| a != b) {
            panic!("{name}: the encoding changed at byte {at}");
        }
    }
    // m1@v2's put record has the LZ4 flag (bit 2 of the body's first byte).
    let segment = &golden[0].1;
    let at = segment
        .windows(5)
        .rposition(|w| w == b"\x02m1\x07m")
        .expect("m1@v2 record");
    // The id follows the fixed part of the body: flags, scope, timestamp, ttl, confidence, hash.
    let body = at - (1 + 1 + 8 + 8 + 8 + 32);
    assert_eq!(segment[body] & 4, 4, "m1@v2 is stored compressed");
    // The rewritten segment says so in its header.
    assert_eq!(
        u32::from_le_bytes(segment[24..28].try_into().expect("4 bytes")),
        1,
        "rewrites"
    );
    assert_eq!(&golden[2].1[0..8], b"CTXLOGCP");
}

#[test]
fn the_golden_compacted_store_opens_from_its_checkpoint_and_by_full_replay() {
    // (segments from, checkpoint from, the checkpoint seq opening starts from)
    let cases = [
        (compacted_fixture_dir(), Some(compacted_fixture_dir()), Some(9)),
        (compacted_fixture_dir(), None, None),
        // A checkpoint of an older format is refused, never fatal: the whole log is replayed.
        (checkpoint_v1_fixture_dir(), Some(checkpoint_v1_fixture_dir()), None),
        (checkpoint_v1_fixture_dir(), None, None),
        (compacted_fixture_dir(), Some(checkpoint_v2_fixture_dir()), None),
        (compacted_fixture_dir(), Some(checkpoint_v3_fixture_dir()), None),
        (compacted_fixture_dir(), Some(checkpoint_v4_fixture_dir()), None),
        (compacted_fixture_dir(), Some(checkpoint_v5_fixture_dir()), None),
    ];
    for (fixture, checkpoint_from, started_from) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, bytes) in store_files(&fixture) {
            if !name.ends_with(".idx") {
                std::fs::write(dir.path().join(name), bytes).expect("copy fixture");
            }
        }
        if let Some(from) = &checkpoint_from {
            for (name, bytes) in store_files(from) {
                if name.ends_with(".idx") {
                    std::fs::write(dir.path().join(name), bytes).expect("copy checkpoint");
                }
            }
        }
        let store = Options::new()
            .clock(Arc::new(ManualClock::new(1_715_335_300)))
            .auto_compact(false)
            .open(dir.path())
            .expect("open");
        let recovery = store.stats().recovery;
        assert_eq!(recovery.checkpoint_seq, started_from, "{}", fixture.display());
        if checkpoint_from.is_some() && started_from.is_none() {
            let why = recovery.checkpoint_rejected.unwrap_or_default();
            assert!(why.contains("is not supported"), "{why}");
        }
        assert!(store.verify().expect("verify").is_ok());
        assert_eq!(store.stats().seq, 9);
        let live = store
            .resolve(["m1", "m1@v1", "tmp1", "old", "old@1", "cl_1.2"])
            .expect("resolve");
        assert!(matches!(&live[0], Resolution::Found(item) if item.version == "v2" && item.content == m1_v2_content()));
        assert!(matches!(&live[1], Resolution::Superseded { latest, .. } if latest.version == "v2"));
        assert_eq!(
            live[2],
            Resolution::NotFound {
                reference: "tmp1".into()
            },
            "reclaimed after expiry"
        );
        assert!(matches!(&live[3], Resolution::Found(item) if item.version == "2"));
        assert!(
            matches!(&live[4], Resolution::Superseded { .. }),
            "a retired version is remembered"
        );
        assert!(matches!(&live[5], Resolution::Found(_)));
        // The retired version's identity conflicts with other content.
        let other = ContextItem::new(
            "old",
            "message",
            json!("else"),
            "chat",
            1_715_335_250,
            "1",
            Scope::GlobalWritable,
        );
        assert!(matches!(store.add([other]), Err(ctxlog::Error::VersionConflict { .. })));
        // The pin still sees m1 at v1, whole.
        let audit = store.open_snapshot("audit").expect("pin");
        let pinned = audit.resolve(["m1", "old"]).expect("resolve");
        assert!(matches!(&pinned[0], Resolution::Found(item) if item.version == "v1"));
        assert_eq!(
            pinned[1],
            Resolution::NotFound {
                reference: "old".into()
            }
        );
    }
}
