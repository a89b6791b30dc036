//! Pins the on-disk format: a fixed sequence of batches written by this build must produce exactly the
//! bytes of the committed fixtures (tests/fixtures/format-v3/ and format-v3-compacted/), and every
//! fixture, of this format and of the earlier ones (format-v1, format-v2), must open and read back
//! the same items forever; a store of an earlier format goes on in a segment of this one. A change
//! to either is a format change: bump FORMAT_VERSION, document it in docs/FORMAT.md, and keep
//! reading the old fixtures.
//!
//! To regenerate after a deliberate format change: `CTXLOG_BLESS=1 cargo test --test golden`. Only
//! the fixtures of this build's format are written; those of earlier formats stay as committed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxlog::{ContextItem, ContextQuery, Durability, ManualClock, Options, Resolution, Scope, Store, TypeSpec};
use serde_json::json;

/// The store as this build writes it: segment format 3.
fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v3")
}

/// The same store as segment format 2 wrote it: sync marks without commit times, deletes without
/// a scope.
fn v2_fixture_dir() -> PathBuf {
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

/// The clock the golden stores are written with: 1_715_335_300 at the first batch, a second more at
/// each later one (so that each frame's commit time is its own).
const GOLDEN_CLOCK_START: i64 = 1_715_335_300;

/// Writes the fixed batches: a type registration, two items, then a delete of a third item.
fn write_golden(dir: &Path) -> Store {
    write_golden_with(dir, &Arc::new(ManualClock::new(GOLDEN_CLOCK_START)))
}

/// [`write_golden`] with `clock`, which moves a second after each batch.
fn write_golden_with(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    // Compression on, so that the fixtures pin both forms of stored content.
    let store = Options::new()
        .durability(Durability::Immediate)
        .compress_content(true)
        .clock(Arc::clone(clock) as Arc<dyn ctxlog::Clock>)
        .open(dir)
        .expect("open");
    store
        .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9.a-z]+$"))
        .expect("register");
    clock.advance(1);
    store.add(golden_items()).expect("add");
    clock.advance(1);
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
    clock.advance(1);
    assert!(store.delete("gone").expect("delete"));
    clock.advance(1);
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
    // The segment starts with the magic and format version 3.
    assert_eq!(&golden[0..8], b"CTXLOGSG");
    assert_eq!(u32::from_le_bytes(golden[8..12].try_into().expect("4 bytes")), 3);
    // Each frame starts with a 17-byte sync mark: the bytes durable before it, the second its batch
    // committed at (the clock moved a second after each batch), no flags.
    let frames = frames(&golden);
    assert_eq!(frames.iter().map(|f| f.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    for (n, frame) in frames.iter().enumerate() {
        assert_eq!(
            frame.mark(),
            Mark::V3 {
                synced: u64::try_from(frame.offset).expect("an offset"),
                committed_at: GOLDEN_CLOCK_START + i64::try_from(n).expect("a frame number"),
                flags: 0
            },
            "frame {}",
            frame.seq
        );
    }
    // The delete records the scope and type of the version it ended: gone was a global_writable
    // tool_result.
    let delete = &frames[3].records[1];
    assert_eq!(delete.0, 2);
    assert_eq!(delete.1, b"\x04gone\x02\x00\x0btool_result");
}

#[test]
fn the_golden_stores_open_and_read_back() {
    for fixture in [fixture_dir(), v2_fixture_dir(), v1_fixture_dir()] {
        golden_store_reads_back(&fixture);
    }
}

/// A sync mark as it is stored: format 2 (`synced`) or format 3 (`synced`, `committed_at`, flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    None,
    V2 { synced: u64 },
    V3 { synced: u64, committed_at: i64, flags: u8 },
}

/// A frame of a segment file, read by docs/FORMAT.md alone: where it starts, its seq, and its
/// records (tag and body).
struct Frame {
    offset: usize,
    seq: u64,
    records: Vec<(u8, Vec<u8>)>,
}

impl Frame {
    /// The frame's sync mark (its first record, when it is one).
    fn mark(&self) -> Mark {
        let le_u64 = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        match self.records.first() {
            Some((7, body)) if body.len() == 8 => Mark::V2 { synced: le_u64(body) },
            Some((7, body)) if body.len() == 17 => Mark::V3 {
                synced: le_u64(&body[0..8]),
                committed_at: i64::from_le_bytes(body[8..16].try_into().expect("8 bytes")),
                flags: body[16],
            },
            Some((7, body)) => panic!("a sync mark of {} bytes", body.len()),
            _ => Mark::None,
        }
    }
}

/// The frames of a segment file, up to its end or the zeros allocated after its last frame.
fn frames(segment: &[u8]) -> Vec<Frame> {
    let le_u32 = |at: usize| {
        usize::try_from(u32::from_le_bytes(segment[at..at + 4].try_into().expect("4 bytes"))).expect("a length")
    };
    let mut frames = Vec::new();
    let mut at = 32;
    while at + 17 <= segment.len() && segment[at + 8] == 1 {
        let len = le_u32(at);
        let seq = u64::from_le_bytes(segment[at + 9..at + 17].try_into().expect("8 bytes"));
        let count = le_u32(at + 17);
        let mut record = at + 21;
        let mut records = Vec::new();
        for _ in 0..count {
            let body_len = le_u32(record + 1);
            records.push((segment[record], segment[record + 9..record + 9 + body_len].to_vec()));
            record += 9 + body_len;
        }
        assert_eq!(record, at + 17 + len, "the records of frame {seq} do not fill it");
        frames.push(Frame {
            offset: at,
            seq,
            records,
        });
        at += 17 + len;
    }
    frames
}

/// A segment file's header fields: (format version, number, base_seq, rewrites).
fn segment_header(segment: &[u8]) -> (u32, u32, u64, u32) {
    let le_u32 = |at: usize| u32::from_le_bytes(segment[at..at + 4].try_into().expect("4 bytes"));
    (
        le_u32(8),
        le_u32(12),
        u64::from_le_bytes(segment[16..24].try_into().expect("8 bytes")),
        le_u32(24),
    )
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

/// The compacted store as this build writes it: segments of format 3, a checkpoint of format 7.
fn compacted_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v3-compacted")
}

/// The compacted store as segment format 2 wrote it (without the tenth and eleventh batches), with
/// a checkpoint of format 6.
fn v2_compacted_fixture_dir() -> PathBuf {
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

/// The golden batches, then a pin, superseded and expired versions, a batch of two items and a
/// delete of one of them, a compaction (which seals the active segment and rewrites segment 1 with
/// retired records, and without the records of deleted histories), a delete of tmp1, whose latest
/// version compaction retired (12, in segment 2), and a clean close (a checkpoint).
fn write_compacted(dir: &Path) {
    let clock = Arc::new(ManualClock::new(GOLDEN_CLOCK_START));
    let store = write_compacted_batches(dir, &clock);
    let report = store.compact().expect("compact");
    assert_eq!(report.segments_rewritten, 1, "{report:?}");
    assert_eq!(
        report.retired, 2,
        "tmp1 (expired) and old@1 (superseded) are retired: {report:?}"
    );
    assert_eq!(report.reclaimed_deleted, 2, "gone and pair-b are left out: {report:?}");
    assert!(store.delete("tmp1").expect("delete tmp1"));
    clock.advance(1);
}

/// The two items of the compacted store's tenth batch; `pair-b` is deleted by the eleventh.
fn pair_items() -> Vec<ContextItem> {
    vec![
        ContextItem::new(
            "pair-a",
            "message",
            json!("kept"),
            "chat",
            1_715_335_270,
            "1",
            Scope::GlobalWritable,
        ),
        ContextItem::new(
            "pair-b",
            "message",
            json!("deleted"),
            "chat",
            1_715_335_270,
            "1",
            Scope::Session("s2".into()),
        ),
    ]
}

/// The batches of [`write_compacted`] before its compaction, with `clock` moving a second after
/// each batch: seq 1 to 4 as [`write_golden`], then a pin (5), m1@v2 (6), tmp1 (7), old@1 (8),
/// old@2 (9), pair-a and pair-b (10), and the delete of pair-b (11).
fn write_compacted_batches(dir: &Path, clock: &Arc<ManualClock>) -> Store {
    let store = write_golden_with(dir, clock);
    store.pin_snapshot("audit").expect("pin");
    clock.advance(1);
    let m1 = &golden_items()[1];
    let mut m1_v2 = m1.clone();
    m1_v2.version = "v2".into();
    // Long and repetitive: stored LZ4-compressed, so the fixture pins that encoding too.
    m1_v2.content = m1_v2_content();
    store.add([m1_v2]).expect("m1 v2");
    clock.advance(1);
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
    clock.advance(1);
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
    clock.advance(1);
    let mut old_v2 = old;
    old_v2.version = "2".into();
    old_v2.content = json!("second");
    store.add([old_v2]).expect("old v2");
    clock.advance(1);
    store.add(pair_items()).expect("pair");
    clock.advance(1);
    assert!(store.delete("pair-b").expect("delete pair-b"));
    clock.advance(1);
    store
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
        [
            "00000001.seg",
            "00000002.seg",
            "checkpoint-00000000000000000012.idx",
            "history.floor"
        ]
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
    assert_eq!(segment_header(segment), (3, 1, 1, 1));
    // The rewritten frames keep their commit times; those that lost a record say so: tmp1 (7) and
    // old@1 (8) retired, pair-b (10) left out. Frame 3 (gone) lost its only record: it is gone.
    let kept = frames(segment);
    assert_eq!(
        kept.iter().map(|f| f.seq).collect::<Vec<_>>(),
        [1, 2, 4, 5, 6, 7, 8, 9, 10, 11]
    );
    for frame in &kept {
        let altered = [7, 8, 10].contains(&frame.seq);
        assert_eq!(
            frame.mark(),
            Mark::V3 {
                synced: 0,
                committed_at: GOLDEN_CLOCK_START + i64::try_from(frame.seq).expect("a seq") - 1,
                flags: u8::from(altered)
            },
            "frame {}",
            frame.seq
        );
    }
    // The retired records keep the type and scope of the versions they replace, after their hash,
    // id and version.
    for (frame, identity) in [
        (&kept[5], &b"\x04tmp1\x011\x0btool_result\x02\x00"[..]),
        (&kept[6], &b"\x03old\x011\x07message\x02\x00"[..]),
    ] {
        let (tag, body) = &frame.records[1];
        assert_eq!((*tag, &body[32..]), (4, identity), "frame {}", frame.seq);
    }
    // The delete of pair-b records its session scope and its type.
    assert_eq!(kept[9].records[1], (2, b"\x06pair-b\x00\x02s2\x07message".to_vec()));
    // The active segment after the compaction: the delete of tmp1, whose version is retired, still
    // names its scope and type.
    let active = &golden[1].1;
    assert_eq!(segment_header(active), (3, 2, 12, 0));
    let deleted = frames(active);
    assert_eq!(deleted.iter().map(|f| f.seq).collect::<Vec<_>>(), [12]);
    assert!(matches!(
        deleted[0].mark(),
        Mark::V3 { committed_at, flags: 0, .. } if committed_at == GOLDEN_CLOCK_START + 11
    ));
    assert_eq!(deleted[0].records[1], (2, b"\x04tmp1\x02\x00\x0btool_result".to_vec()));
    let checkpoint = &golden[2].1;
    assert_eq!(&checkpoint[0..8], b"CTXLOGCP");
    assert_eq!(u32::from_le_bytes(checkpoint[8..12].try_into().expect("4 bytes")), 7);
    assert_eq!(u64::from_le_bytes(checkpoint[16..24].try_into().expect("8 bytes")), 12);
    assert_eq!(
        i64::from_le_bytes(checkpoint[24..32].try_into().expect("8 bytes")),
        GOLDEN_CLOCK_START + 11,
        "the commit time of batch 12"
    );
}

#[test]
fn the_golden_compacted_store_opens_from_its_checkpoint_and_by_full_replay() {
    // (segments from, checkpoint from, the checkpoint seq opening starts from, the store's seq)
    let cases = [
        (compacted_fixture_dir(), Some(compacted_fixture_dir()), Some(12), 12),
        (compacted_fixture_dir(), None, None, 12),
        // A checkpoint of an older format is refused, never fatal: the whole log is replayed.
        (v2_compacted_fixture_dir(), Some(v2_compacted_fixture_dir()), None, 9),
        (v2_compacted_fixture_dir(), None, None, 9),
        (checkpoint_v1_fixture_dir(), Some(checkpoint_v1_fixture_dir()), None, 9),
        (checkpoint_v1_fixture_dir(), None, None, 9),
        (v2_compacted_fixture_dir(), Some(checkpoint_v2_fixture_dir()), None, 9),
        (v2_compacted_fixture_dir(), Some(checkpoint_v3_fixture_dir()), None, 9),
        (v2_compacted_fixture_dir(), Some(checkpoint_v4_fixture_dir()), None, 9),
        (v2_compacted_fixture_dir(), Some(checkpoint_v5_fixture_dir()), None, 9),
    ];
    for (fixture, checkpoint_from, started_from, seq) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_fixture(&fixture, checkpoint_from.as_deref(), dir.path());
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
        assert_eq!(store.stats().seq, seq);
        compacted_store_reads_back(&store, seq == 12);
    }
}

/// Copies the segments of `fixture` into `dir`, and the checkpoint of `checkpoint_from` if given.
fn copy_fixture(fixture: &Path, checkpoint_from: Option<&Path>, dir: &Path) {
    for (name, bytes) in store_files(fixture) {
        if !name.ends_with(".idx") {
            std::fs::write(dir.join(name), bytes).expect("copy fixture");
        }
    }
    if let Some(from) = checkpoint_from {
        for (name, bytes) in store_files(from) {
            if name.ends_with(".idx") {
                std::fs::write(dir.join(name), bytes).expect("copy checkpoint");
            }
        }
    }
}

/// Checks what the compacted golden store holds (with the pair of the tenth batch and the delete of
/// tmp1 after the compaction if `pair`).
fn compacted_store_reads_back(store: &Store, pair: bool) {
    assert!(store.verify().expect("verify").is_ok());
    let live = store
        .resolve(["m1", "m1@v1", "tmp1", "old", "old@1", "cl_1.2", "pair-a", "pair-b"])
        .expect("resolve");
    assert!(matches!(&live[0], Resolution::Found(item) if item.version == "v2" && item.content == m1_v2_content()));
    assert!(matches!(&live[1], Resolution::Superseded { latest, .. } if latest.version == "v2"));
    assert_eq!(
        live[2],
        Resolution::NotFound {
            reference: "tmp1".into()
        },
        "reclaimed after expiry (and deleted after that, with the pair)"
    );
    assert!(matches!(&live[3], Resolution::Found(item) if item.version == "2"));
    assert!(
        matches!(&live[4], Resolution::Superseded { .. }),
        "a retired version is remembered"
    );
    assert!(matches!(&live[5], Resolution::Found(_)));
    assert_eq!(
        matches!(&live[6], Resolution::Found(item) if item.content == json!("kept")),
        pair,
        "pair-a: {:?}",
        live[6]
    );
    assert_eq!(
        live[7],
        Resolution::NotFound {
            reference: "pair-b".into()
        }
    );
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

/// The frames of segment `number` of the store in `dir`, by seq.
fn segment_frames(dir: &Path, number: u32) -> Vec<Frame> {
    frames(&std::fs::read(dir.join(format!("{number:08}.seg"))).expect("segment"))
}

#[test]
fn compaction_marks_exactly_the_frames_it_changed_and_keeps_their_commit_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(GOLDEN_CLOCK_START));
    let store = write_compacted_batches(dir.path(), &clock);
    let before = segment_frames(dir.path(), 1);
    assert_eq!(before.len(), 11);
    assert!(before.iter().all(|f| matches!(f.mark(), Mark::V3 { flags: 0, .. })));
    // A frame is changed when a record of it (after its mark) is no longer the same.
    let check = |before: &[Frame], after: &[Frame], changed: &[u64]| {
        for frame in after {
            let was = before.iter().find(|f| f.seq == frame.seq).expect("a frame of before");
            let (
                Mark::V3 { committed_at, .. },
                Mark::V3 {
                    committed_at: was_at,
                    flags: was_flags,
                    ..
                },
            ) = (frame.mark(), was.mark())
            else {
                panic!("frame {}: not a format 3 mark", frame.seq);
            };
            assert_eq!(committed_at, was_at, "frame {}: its commit time moved", frame.seq);
            let differs = frame.records[1..] != was.records[1..];
            assert_eq!(differs, changed.contains(&frame.seq), "frame {}", frame.seq);
            let Mark::V3 { flags, .. } = frame.mark() else {
                unreachable!()
            };
            assert_eq!(
                flags,
                u8::from(differs || was_flags == 1),
                "frame {}: altered exactly when a record of it was left out or retired",
                frame.seq
            );
        }
    };
    store.compact().expect("compact");
    let after = segment_frames(dir.path(), 1);
    assert_eq!(
        after.iter().map(|f| f.seq).collect::<Vec<_>>(),
        [1, 2, 4, 5, 6, 7, 8, 9, 10, 11],
        "frame 3 (gone) lost its only record"
    );
    check(&before, &after, &[7, 8, 10]);

    // A second rewrite: old deleted, so old@1 (retired, frame 8, its only record) and old@2 (frame
    // 9) are left out. Frame 7 is not changed again, and stays marked.
    assert!(store.delete("old").expect("delete old"));
    store.compact().expect("compact again");
    let again = segment_frames(dir.path(), 1);
    assert_eq!(
        again.iter().map(|f| f.seq).collect::<Vec<_>>(),
        [1, 2, 4, 5, 6, 7, 10, 11]
    );
    check(&after, &again, &[]);
    assert!(
        matches!(again[5].mark(), Mark::V3 { flags: 1, .. }),
        "frame 7 stays altered"
    );
    drop(store);
    let store = Options::new()
        .clock(Arc::new(ManualClock::new(GOLDEN_CLOCK_START)))
        .open(dir.path())
        .expect("reopen");
    assert!(store.verify().expect("verify").is_ok());
}

#[test]
fn commit_times_never_go_back_even_when_the_clock_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(2_000));
    let open = || {
        Options::new()
            .durability(Durability::Immediate)
            .clock(Arc::clone(&clock) as Arc<dyn ctxlog::Clock>)
            .open(dir.path())
            .expect("open")
    };
    let item = |n: i64| {
        ContextItem::new(
            format!("i{n}"),
            "message",
            json!(n),
            "chat",
            1_000,
            "1",
            Scope::GlobalWritable,
        )
    };
    let store = open();
    // Each step: where the clock is set, then a batch.
    for (n, now) in [2_000, 1_500, 2_500, 100].into_iter().enumerate() {
        clock.set(now);
        store.add([item(i64::try_from(n).expect("a step"))]).expect("add");
    }
    drop(store);
    // The last commit time is known again at open: from the last frame's mark, when the whole log
    // is replayed (the checkpoint of the close removed)...
    for (name, _) in store_files(dir.path()) {
        if name.ends_with(".idx") {
            std::fs::remove_file(dir.path().join(name)).expect("remove the checkpoint");
        }
    }
    clock.set(1_000);
    let store = open();
    assert_eq!(store.stats().recovery.checkpoint_seq, None);
    store.add([item(10)]).expect("add after reopen");
    assert!(store.delete("i0").expect("delete"));
    clock.set(3_000);
    store.add([item(11)]).expect("add");
    drop(store);
    // ... and from the checkpoint of the clean close, when no frame follows it.
    clock.set(0);
    let store = open();
    assert_eq!(store.stats().recovery.checkpoint_seq, Some(7));
    store.add([item(12)]).expect("add after a reopen from a checkpoint");
    drop(store);
    let marks: Vec<i64> = segment_frames(dir.path(), 1)
        .iter()
        .map(|frame| match frame.mark() {
            Mark::V3 { committed_at, .. } => committed_at,
            other => panic!("frame {}: {other:?}", frame.seq),
        })
        .collect();
    assert_eq!(marks, [2_000, 2_000, 2_500, 2_500, 2_500, 2_500, 3_000, 3_000]);
}

#[test]
fn a_store_of_an_older_format_goes_on_in_a_new_segment_of_format_3() {
    // (fixture, its segments' format, its seq, the number of its newest segment)
    for (fixture, version, seq, newest) in [
        (v2_fixture_dir(), 2, 4, 1),
        (v1_fixture_dir(), 1, 4, 1),
        // The newest segment holds no frame: it is sealed as it is, 32 bytes long.
        (v2_compacted_fixture_dir(), 2, 9, 2),
        (checkpoint_v1_fixture_dir(), 1, 9, 2),
    ] {
        let context = fixture.display().to_string();
        let dir = tempfile::tempdir().expect("tempdir");
        copy_fixture(&fixture, None, dir.path());
        let old = store_files(dir.path());
        let clock = Arc::new(ManualClock::new(GOLDEN_CLOCK_START + 100));
        let open = || {
            Options::new()
                .clock(Arc::clone(&clock) as Arc<dyn ctxlog::Clock>)
                .auto_compact(false)
                .open(dir.path())
                .expect("open")
        };
        let store = open();
        // Opening changes nothing: the old files are only appended to by a writer of their format.
        assert_eq!(store_files(dir.path()), old, "{context}");
        let added = ContextItem::new(
            "new1",
            "message",
            json!("new"),
            "chat",
            1_715_335_400,
            "1",
            Scope::GlobalWritable,
        );
        store.add([added.clone()]).expect("add");
        assert!(store.delete("m1").expect("delete m1"));
        drop(store);
        for (name, bytes) in &old {
            if name.ends_with(".seg") {
                let now = std::fs::read(dir.path().join(name)).expect("old segment");
                assert_eq!(&now, bytes, "{context}: {name} changed");
                assert_eq!(segment_header(&now).0, version, "{context}: {name}");
            }
        }
        let next = newest + 1;
        let segment = std::fs::read(dir.path().join(format!("{next:08}.seg"))).expect("the new segment");
        assert_eq!(segment_header(&segment), (3, next, seq + 1, 0), "{context}");
        let frames = frames(&segment);
        assert_eq!(frames.iter().map(|f| f.seq).collect::<Vec<_>>(), [seq + 1, seq + 2]);
        for frame in &frames {
            assert!(
                matches!(frame.mark(), Mark::V3 { committed_at, flags: 0, .. } if committed_at == GOLDEN_CLOCK_START + 100),
                "{context}: frame {}",
                frame.seq
            );
        }
        // m1 was a session s1 message: the delete records that scope and type.
        assert_eq!(
            frames[1].records[1],
            (2, b"\x02m1\x00\x02s1\x07message".to_vec()),
            "{context}"
        );

        // Reopened from the checkpoint of the clean close, then by a full replay: it reads back.
        for replay in [false, true] {
            if replay {
                for (name, _) in store_files(dir.path()) {
                    if name.ends_with(".idx") {
                        std::fs::remove_file(dir.path().join(name)).expect("remove the checkpoint");
                    }
                }
            }
            let store = open();
            assert_eq!(
                store.stats().recovery.checkpoint_seq,
                (!replay).then_some(seq + 2),
                "{context}"
            );
            assert!(store.verify().expect("verify").is_ok(), "{context}");
            assert_eq!(store.stats().seq, seq + 2);
            let got = store.resolve(["new1", "m1", "cl_1.2", "gone"]).expect("resolve");
            assert!(
                matches!(&got[0], Resolution::Found(item) if item.content == added.content),
                "{context}"
            );
            assert_eq!(got[1], Resolution::NotFound { reference: "m1".into() }, "{context}");
            assert!(matches!(&got[2], Resolution::Found(_)), "{context}");
            assert_eq!(
                got[3],
                Resolution::NotFound {
                    reference: "gone".into()
                },
                "{context}"
            );
        }
    }
}

/// The records (tag and body) after the sync marks of the frames of the newest segment of the store
/// in `dir`, from seq `from` on.
fn newest_records_from(dir: &Path, from: u64) -> Vec<(u8, Vec<u8>)> {
    let newest = store_files(dir)
        .into_iter()
        .rfind(|(name, _)| name.ends_with(".seg"))
        .expect("a segment");
    frames(&newest.1)
        .into_iter()
        .filter(|frame| frame.seq >= from)
        .flat_map(|frame| frame.records.into_iter().skip(1))
        .collect()
}

/// Removes the checkpoints of the store in `dir`, so that it opens by replaying its whole log.
fn remove_checkpoints(dir: &Path) {
    for (name, _) in store_files(dir) {
        if name.ends_with(".idx") {
            std::fs::remove_file(dir.join(name)).expect("remove the checkpoint");
        }
    }
}

#[test]
fn a_delete_of_an_id_whose_latest_version_is_retired_names_its_type_and_scope() {
    // tmp1 (a global_writable tool_result) and tmp2 (a user_profile of session s2) expire, and
    // compaction retires them; each is then deleted in the same store, after a reopen from the
    // checkpoint of its clean close, or after one by a full replay of its log.
    for reopen in [None, Some(false), Some(true)] {
        let context = format!("reopened by replay: {reopen:?}");
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(GOLDEN_CLOCK_START));
        let open = || {
            Options::new()
                .clock(Arc::clone(&clock) as Arc<dyn ctxlog::Clock>)
                .auto_compact(false)
                .open(dir.path())
                .expect("open")
        };
        let store = write_compacted_batches(dir.path(), &clock);
        let expired = ContextItem::new(
            "tmp2",
            "user_profile",
            json!({"name": "x"}),
            "crm",
            1_715_335_200,
            "1",
            Scope::Session("s2".into()),
        )
        .with_ttl(10);
        store.add([expired]).expect("tmp2");
        clock.advance(1);
        let report = store.compact().expect("compact");
        assert_eq!(report.reclaimed_expired, 2, "{context}: {report:?}");
        let store = match reopen {
            None => store,
            Some(replay) => {
                drop(store);
                if replay {
                    remove_checkpoints(dir.path());
                }
                let store = open();
                assert_eq!(
                    store.stats().recovery.checkpoint_seq,
                    (!replay).then_some(12),
                    "{context}"
                );
                store
            }
        };
        assert!(store.delete("tmp1").expect("delete tmp1"), "{context}");
        assert!(store.delete("tmp2").expect("delete tmp2"), "{context}");
        drop(store);
        assert_eq!(
            newest_records_from(dir.path(), 13),
            [
                (2, b"\x04tmp1\x02\x00\x0btool_result".to_vec()),
                (2, b"\x04tmp2\x00\x02s2\x0cuser_profile".to_vec()),
            ],
            "{context}"
        );
        let store = open();
        assert!(store.verify().expect("verify").is_ok(), "{context}");
        assert!(
            !store.delete("tmp1").expect("delete again"),
            "{context}: no history left"
        );
    }
}

#[test]
fn a_delete_of_a_version_retired_by_an_older_format_says_its_type_and_scope_are_unknown() {
    // In the compacted stores of formats 1 and 2, compaction retired tmp1 (expired, its latest
    // version) with a record that keeps neither its type nor its scope, and old@1 (superseded by
    // old@2, stored). The store goes on in a segment of format 3, by a full replay, then from the
    // checkpoint (of format 7) that replay's clean close wrote.
    for fixture in [v2_compacted_fixture_dir(), checkpoint_v1_fixture_dir()] {
        for from_checkpoint in [false, true] {
            let context = format!("{}, from a checkpoint: {from_checkpoint}", fixture.display());
            let dir = tempfile::tempdir().expect("tempdir");
            copy_fixture(&fixture, None, dir.path());
            let open = || {
                Options::new()
                    .clock(Arc::new(ManualClock::new(GOLDEN_CLOCK_START + 100)))
                    .auto_compact(false)
                    .open(dir.path())
                    .expect("open")
            };
            if from_checkpoint {
                drop(open());
            }
            let store = open();
            assert_eq!(
                store.stats().recovery.checkpoint_seq,
                from_checkpoint.then_some(9),
                "{context}"
            );
            assert!(store.delete("tmp1").expect("delete tmp1"), "{context}");
            assert!(store.delete("old").expect("delete old"), "{context}");
            drop(store);
            assert_eq!(
                newest_records_from(dir.path(), 10),
                [
                    // The scope byte "unknown", an empty session id and type.
                    (2, b"\x04tmp1\x03\x00\x00".to_vec()),
                    (2, b"\x03old\x02\x00\x07message".to_vec()),
                ],
                "{context}"
            );
            let store = open();
            assert!(store.verify().expect("verify").is_ok(), "{context}");
            let got = store.resolve(["tmp1", "old", "m1"]).expect("resolve");
            assert_eq!(
                got[0],
                Resolution::NotFound {
                    reference: "tmp1".into()
                },
                "{context}"
            );
            assert_eq!(
                got[1],
                Resolution::NotFound {
                    reference: "old".into()
                },
                "{context}"
            );
            assert!(
                matches!(&got[2], Resolution::Found(item) if item.version == "v2"),
                "{context}"
            );
        }
    }
}

/// The golden compacted store keeps its history floor (`history.floor`, pinned above): views of the
/// past are answered from it on, refused below it, across reopens.
#[test]
fn the_golden_compacted_store_answers_views_of_the_past_from_its_floor_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_fixture(&compacted_fixture_dir(), Some(&compacted_fixture_dir()), dir.path());
    let clock = Arc::new(ManualClock::new(GOLDEN_CLOCK_START + 1000));
    let store = Options::new()
        .clock(Arc::clone(&clock) as Arc<dyn ctxlog::Clock>)
        .auto_compact(false)
        .open(dir.path())
        .expect("open");
    assert_eq!(store.last_seq(), 12);
    let at = store.snapshot_at(12).expect("the floor's seq");
    assert_eq!(at.seq(), 12);
    for seq in [0, 5, 11] {
        match store.snapshot_at(seq) {
            Err(ctxlog::Error::HistoryCompacted { oldest_available }) => assert_eq!(oldest_available, 12),
            other => panic!("seq {seq}: {other:?}"),
        }
    }
}

/// A store compacted by a build that kept no history floor: what that compaction reclaimed is not
/// known, so views of the past are answered only from its reopening on (judging TTL from then).
/// Opening changes no file; the first commit writes the floor, which later opens keep.
#[test]
fn a_store_compacted_before_history_floors_answers_the_past_only_from_its_reopening() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v3-compacted-unfloored");
    let dir = tempfile::tempdir().expect("tempdir");
    copy_fixture(&fixture, Some(&fixture), dir.path());
    let old = store_files(dir.path());
    let clock = Arc::new(ManualClock::new(GOLDEN_CLOCK_START + 1000));
    let open = || {
        Options::new()
            .clock(Arc::clone(&clock) as Arc<dyn ctxlog::Clock>)
            .auto_compact(false)
            .open(dir.path())
            .expect("open")
    };
    let store = open();
    assert_eq!(store_files(dir.path()), old, "opening changed a file");
    for seq in [3, 12] {
        assert!(
            matches!(
                store.snapshot_at(seq),
                Err(ctxlog::Error::HistoryCompacted { oldest_available: 12 })
            ),
            "seq {seq}"
        );
    }
    let added = ContextItem::new(
        "new1",
        "message",
        json!("new"),
        "chat",
        1_715_335_400,
        "1",
        Scope::GlobalWritable,
    );
    store.add([added]).expect("add");
    let floor = std::fs::read(dir.path().join("history.floor")).expect("the first commit wrote the floor");
    assert_eq!(&floor[..8], b"CTXFLOOR");
    assert_eq!(u64::from_le_bytes(floor[12..20].try_into().expect("8 bytes")), 12);
    assert_eq!(
        i64::from_le_bytes(floor[20..28].try_into().expect("8 bytes")),
        GOLDEN_CLOCK_START + 1000
    );
    let view = store.snapshot_at(13).expect("the commit after the reopening");
    assert_eq!(view.resolve(["new1"]).expect("resolve").len(), 1);
    drop((view, store));
    clock.advance(5000);
    let store = open();
    assert!(store.snapshot_at(13).is_ok(), "a later open moved the floor");
    assert!(matches!(
        store.snapshot_at(12),
        Err(ctxlog::Error::HistoryCompacted { .. })
    ));
}
