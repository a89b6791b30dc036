//! Pins the on-disk format: a fixed sequence of batches written by this build must produce exactly the
//! bytes of the committed fixture (tests/fixtures/format-v1/), and the fixture must open and read back
//! the same items forever. A change to either is a format change: bump FORMAT_VERSION, document it in
//! docs/FORMAT.md, and keep reading the old fixture.
//!
//! To regenerate after a deliberate format change: `CTXLOG_BLESS=1 cargo test --test golden`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxlog::{ContextItem, ContextQuery, Durability, ManualClock, Options, Resolution, Scope, Store, TypeSpec};
use serde_json::json;

fn fixture_dir() -> PathBuf {
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
    let store = Options::new()
        .durability(Durability::Immediate)
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
    // The segment starts with the magic and format version 1.
    assert_eq!(&golden[0..8], b"CTXLOGSG");
    assert_eq!(u32::from_le_bytes(golden[8..12].try_into().expect("4 bytes")), 1);
}

#[test]
fn the_golden_store_opens_and_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(fixture_dir().join("00000001.seg"), dir.path().join("00000001.seg")).expect("copy fixture");
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
