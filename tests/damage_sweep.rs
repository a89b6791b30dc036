//! Damage sweeps on the simulated disk (`SimDisk`), where a store reopens in well under a millisecond.
//!
//! Two stores are built by one workload: a registered type; items with and without TTL, confidence
//! and session scope; new versions; deletes; an id deleted and added again with the same version and
//! content (another timestamp and confidence), alone in a batch each time, so that both histories
//! hold put records of the same length; pins and an unpin; a compaction that rewrites sealed segments
//! (retired records, forgotten histories, versions kept for a pin); then a final phase of small
//! batches, a pin and a delete, with a clean close and reopen in the middle. Each store is kept in
//! three forms: closed cleanly (its checkpoint covers every byte), crashed at the end (an older
//! checkpoint, then a tail of the newest segment that opening replays; the checkpoint before it may
//! come back, its removal not being synced) and without any checkpoint (opening replays everything).
//!
//! - The small store (4 KiB segments, 12 items, 4 segments): every bit of every file flipped, in the
//!   crashed and bare forms, and every bit of the closed form's checkpoint (its segments are the
//!   crashed form's, byte for byte); 4 KiB of zeros at every 64th byte of every file; every frame
//!   copied over every frame's position and after the end of every segment. Every case that opens is
//!   compared in full.
//! - The larger store (32 KiB segments, about 550 items, 7 segments, about 215 KB): `DAMAGE_FLIPS`
//!   (default 100,000) single-bit flips drawn by a seeded generator over every byte of every file of
//!   the three forms; 4 KiB of zeros at every 4 KiB-aligned offset of every file, at 8 unaligned ones
//!   per file and at the end of each; frames copied over other frames (of the same segment and of
//!   another, of the same length, and every pair of same-length frames holding the same id) and after
//!   the end of every segment. One case in `FULL_EVERY` that opens is compared in full, the others
//!   on what the damage can touch (see `Depth`).
//!
//! Each damaged copy of the disk is opened, and the outcome must be one of:
//!
//! - `Error::Corrupt` naming the damaged file and an offset from the start of the first damaged frame
//!   (or header) to the end of the damage, and its message saying both;
//! - a store whose state (every item `get` returns, every `resolve` answer for every id and
//!   `id@version` ever written, every pin with what its snapshot shows, seq and counts) is exactly
//!   the undamaged one, except that an item whose own record was damaged may answer `HashMismatch`
//!   (and `get` fail with `Error::Corrupt` naming the file); when no read came across the damage,
//!   `verify()` reports it;
//! - only when the damage lies in the zeros past the newest segment's last frame (space the writer
//!   allocated ahead of its appends, which the crashed form keeps): the undamaged state, and the
//!   newest segment cut right after its last frame;
//! - only when the damage reaches into the tail of the newest segment that opening replays: the tail
//!   truncated from the first damaged frame on (never at a whole frame with a good CRC), and the state
//!   exactly the one the workload had before that frame's batch. docs/FORMAT.md calls this a torn
//!   write; a single flip may cut only the last frame, but zeros reaching the end of the file cut
//!   every batch they touch, acknowledged or not (the tally counts them).
//!
//! Never a panic, in the thread that opens and reads the store (each case runs under `catch_unwind`)
//! or in the store's own threads (a panic hook counts them). Each sweep prints its tally of outcomes,
//! an example of each, and its time.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ctxlog::storage::SimDisk;
use ctxlog::*;
use serde_json::json;

const DIR: &str = "/store";
const SEGMENT_HEADER_BYTES: usize = 32;
const FRAME_HEADER_BYTES: usize = 17;
const RECORD_HEADER_BYTES: usize = 9;
/// Where the id of a put body starts: flags, scope, timestamp, ttl, confidence, hash.
const PUT_ID_AT: usize = 58;
/// The clock while the workload writes its first phase.
const T0: i64 = common::NOW;
/// The clock from the compaction on, and at every reopen of a damaged copy: TTL is judged here.
const T_END: i64 = T0 + 1_000;
const TTL: u64 = 100;
const BLOCK: usize = 4096;

// ---------------------------------------------------------------------------------------------------
// The workload.

/// The size of a store the workload builds.
struct Shape {
    name: &'static str,
    segment_size: u64,
    /// Batches of the first phase, and items in each.
    batches: usize,
    batch_items: usize,
    /// Characters of incompressible text in each item's content.
    text_len: usize,
    /// Characters of text of two items, one in each half, deleted before the first pin: they fill
    /// segments that the compaction then shrinks (0: no such items).
    filler_len: usize,
    /// Batches (of one or two items) in the final phase, before and after a close and reopen.
    tail_batches: (usize, usize),
}

const SMALL: Shape = Shape {
    name: "small",
    segment_size: 4096,
    batches: 4,
    batch_items: 2,
    text_len: 60,
    filler_len: 3000,
    tail_batches: (2, 2),
};

const LARGE: Shape = Shape {
    name: "larger",
    segment_size: 32 * 1024,
    batches: 70,
    batch_items: 10,
    text_len: 60,
    filler_len: 0,
    tail_batches: (6, 6),
};

fn options(disk: &SimDisk, clock: Arc<ManualClock>, segment_size: u64) -> Options {
    Options::new()
        .storage(Arc::new(disk.clone()))
        .clock(clock)
        .durability(Durability::Immediate)
        .segment_size(segment_size)
        .auto_compact(false)
}

/// Opens a copy of a store as every damage case does: clock at `T_END`.
fn reopen(disk: &SimDisk, segment_size: u64) -> Result<Store> {
    options(disk, Arc::new(ManualClock::new(T_END)), segment_size).open(DIR)
}

/// The item the workload writes as number `n`.
fn workload_item(id: &str, n: usize, text_len: usize) -> ContextItem {
    let kind = if n % 13 == 4 { "tool_result" } else { "document_chunk" };
    let scope = match n % 11 {
        3 => Scope::Session("s1".into()),
        7 => Scope::GlobalReadonly,
        _ => Scope::GlobalWritable,
    };
    let source = ["crawler", "crm_export", "tool:search"][n % 3];
    let mut item = ContextItem::new(
        id,
        kind,
        json!({"n": n, "text": common::incompressible(id, text_len), "tags": ["a", n % 4]}),
        source,
        T0 - (n as i64 % 50),
        "1",
        scope,
    );
    if n % 5 == 1 {
        item = item.with_confidence((n % 10) as f64 / 10.0);
    }
    if n % 7 == 2 {
        item = item.with_ttl(TTL);
    }
    item
}

/// Everything a store answers, as the damage checks compare it.
#[derive(Clone, Debug, PartialEq)]
struct State {
    seq: u64,
    items: u64,
    versions: u64,
    /// `get` of everything, in the store's order.
    all: Vec<ContextItem>,
    /// `resolve` of every reference in `Built::refs`.
    resolved: Vec<Resolution>,
    pins: Vec<PinState>,
}

#[derive(Clone, Debug, PartialEq)]
struct PinState {
    info: SnapshotInfo,
    all: Vec<ContextItem>,
    resolved: Vec<Resolution>,
}

fn capture(store: &Store, refs: &[String]) -> State {
    let stats = store.stats();
    let pins = store
        .snapshots()
        .into_iter()
        .map(|info| {
            let snapshot = store.open_snapshot(&info.name).expect("open_snapshot");
            PinState {
                all: snapshot.get(&ContextQuery::new()).expect("pinned get"),
                resolved: snapshot.resolve(refs).expect("pinned resolve"),
                info,
            }
        })
        .collect();
    State {
        seq: stats.seq,
        items: stats.items,
        versions: stats.versions,
        all: store.get(&ContextQuery::new()).expect("get"),
        resolved: store.resolve(refs).expect("resolve"),
        pins,
    }
}

/// One of the three forms of a built store.
struct Form {
    name: &'static str,
    disk: SimDisk,
    files: Vec<FileLayout>,
    /// The last segment the newest checkpoint lists, and its length there: where replay resumes.
    resume: Option<(String, usize)>,
}

struct FileLayout {
    name: String,
    path: PathBuf,
    bytes: Vec<u8>,
    /// `None` for a checkpoint.
    segment: Option<SegmentLayout>,
}

struct SegmentLayout {
    newest: bool,
    frames: Vec<Frame>,
}

#[derive(Clone)]
struct Frame {
    range: Range<usize>,
    seq: u64,
    /// The byte ranges of the put records in the frame, with their ids.
    puts: Vec<(Range<usize>, String)>,
}

struct Built {
    shape: &'static Shape,
    forms: Vec<Form>,
    /// Every id, and every `id@version`, the workload wrote, and one it never wrote.
    refs: Vec<String>,
    /// The state at the end of the workload: every form must reopen to it.
    last: State,
    /// The state right after each sequence number of the final phase (and right before it).
    tail_states: BTreeMap<u64, State>,
}

/// Runs the workload for `shape` and keeps the store in its three forms.
fn build(shape: &'static Shape) -> Built {
    let disk = SimDisk::new();
    let clock = Arc::new(ManualClock::new(T0));
    let open = || {
        options(&disk, Arc::clone(&clock), shape.segment_size)
            .open(DIR)
            .expect("open")
    };
    let store = open();
    let mut ids: BTreeSet<String> = BTreeSet::new();
    let mut versions: BTreeSet<String> = BTreeSet::new();
    let mut written: Vec<ContextItem> = Vec::new();
    let mut add = |store: &Store, items: Vec<ContextItem>| {
        written.extend(items.iter().cloned());
        store.add(items).expect("add");
    };

    store
        .register_type(TypeSpec::new("legal_clause").id_pattern(r"^cl_[0-9a-z_]+$"))
        .expect("register_type");
    // An id that is deleted and added again with the same version and content (another timestamp
    // and confidence), each time alone in a batch: two put records of the same length.
    let trap = |timestamp: i64, confidence: f64| {
        ContextItem::new(
            "trap",
            "document_chunk",
            json!({"text": "same content in both histories"}),
            "trap-source",
            timestamp,
            "1",
            Scope::GlobalWritable,
        )
        .with_confidence(confidence)
    };
    add(&store, vec![trap(T0, 0.5)]);
    store.pin_snapshot("p0").expect("pin p0");
    let mut n = 0;
    let mut phase = |store: &Store, batches: Range<usize>, add: &mut dyn FnMut(&Store, Vec<ContextItem>)| {
        let first = n + 1;
        for batch in batches {
            let mut items: Vec<ContextItem> = (0..shape.batch_items)
                .map(|_| {
                    n += 1;
                    workload_item(&format!("d{n}"), n, shape.text_len)
                })
                .collect();
            if batch % 4 == 1 {
                items.push(
                    ContextItem::new(
                        format!("cl_{batch}"),
                        "legal_clause",
                        json!({"clause": batch, "jurisdiction": "CN"}),
                        "legal",
                        T0,
                        "1",
                        Scope::GlobalReadonly,
                    )
                    .with_confidence(0.9),
                );
            }
            add(store, items);
        }
        first..n + 1
    };
    let supersede = |store: &Store, ids: Vec<usize>, version: &str, add: &mut dyn FnMut(&Store, Vec<ContextItem>)| {
        let items: Vec<ContextItem> = ids
            .into_iter()
            .map(|i| {
                let mut item = workload_item(&format!("d{i}"), i, 0);
                item.version = version.into();
                item.content = json!({"n": i, "v": version});
                item
            })
            .collect();
        for chunk in items.chunks(shape.batch_items.max(1) * 2) {
            add(store, chunk.to_vec());
        }
    };
    let filler = |store: &Store, name: &str, add: &mut dyn FnMut(&Store, Vec<ContextItem>)| {
        if shape.filler_len > 0 {
            let text = common::incompressible(name, shape.filler_len);
            let item = ContextItem::new(name, "message", json!(text), "filler", T0, "1", Scope::GlobalWritable);
            add(store, vec![item]);
        }
    };
    // First half; then new versions of a third of it and deletes of an eighth, which no pin sees:
    // the compaction retires the old versions and forgets the deleted histories.
    filler(&store, "filler-1", &mut add);
    let first_half = phase(&store, 0..shape.batches / 2, &mut add);
    supersede(
        &store,
        first_half.clone().filter(|i| i % 3 == 0).collect(),
        "2",
        &mut add,
    );
    for i in first_half.clone().filter(|i| i % 8 == 5) {
        assert!(store.delete(&format!("d{i}")).expect("delete"), "d{i} was written");
    }
    // Second half; p1 sees it all, so that what supersedes it later stays for p1's sake.
    filler(&store, "filler-2", &mut add);
    let second_half = phase(&store, shape.batches / 2..shape.batches, &mut add);
    for name in ["filler-1", "filler-2"].into_iter().filter(|_| shape.filler_len > 0) {
        assert!(store.delete(name).expect("delete a filler"));
    }
    store.pin_snapshot("p1").expect("pin p1");
    supersede(
        &store,
        second_half.clone().filter(|i| i % 3 == 0).collect(),
        "2",
        &mut add,
    );
    supersede(&store, first_half.filter(|i| i % 6 == 0).collect(), "3", &mut add);
    for i in second_half.filter(|i| i % 8 == 5) {
        assert!(store.delete(&format!("d{i}")).expect("delete"), "d{i} was written");
    }
    assert!(store.delete("trap").expect("delete trap"));
    add(&store, vec![trap(T0 + 1, 0.25)]);
    assert!(store.unpin_snapshot("p0").expect("unpin p0"));
    // A version of an item in the active segment, superseded: the compaction seals the active
    // segment first, so that the final phase starts a segment of its own.
    supersede(&store, vec![n], "late-a", &mut add);
    supersede(&store, vec![n], "late-b", &mut add);

    // The compaction: TTL items no pin sees have expired, p0 is gone, p1 keeps what it sees.
    clock.set(T_END);
    let report = store.compact().expect("compact");
    assert!(
        report.segments_rewritten >= 2 && report.retired > 0 && report.reclaimed_deleted > 0,
        "{}: the compaction should rewrite segments, retire versions and forget deleted ones: {report:?}",
        shape.name
    );

    for item in &written {
        ids.insert(item.id.clone());
        versions.insert(format!("{}@{}", item.id, item.version));
    }

    // The final phase: small batches, a pin and a delete, and a clean close and reopen (whose
    // checkpoint covers part of the newest segment). Every state is kept, for the checks of
    // truncated tails.
    enum Tail {
        Add(Vec<ContextItem>),
        Pin(&'static str),
        Delete(&'static str),
        Reopen,
    }
    let mut tail = Vec::new();
    for k in 0..shape.tail_batches.0 + shape.tail_batches.1 {
        if k == shape.tail_batches.0 {
            tail.push(Tail::Reopen);
        }
        let items: Vec<ContextItem> = (0..1 + k % 2)
            .map(|j| workload_item(&format!("t{k}-{j}"), 1000 + 2 * k + j, 40 + 30 * j))
            .collect();
        for item in &items {
            ids.insert(item.id.clone());
            versions.insert(format!("{}@{}", item.id, item.version));
        }
        tail.push(Tail::Add(items));
        if k == 1 {
            tail.push(Tail::Pin("p2"));
            tail.push(Tail::Delete("d1"));
        }
    }
    let mut refs: Vec<String> = ids.into_iter().chain(versions).collect();
    refs.push("never-written".into());
    let mut tail_states = BTreeMap::new();
    tail_states.insert(store.stats().seq, capture(&store, &refs));
    let mut store = store;
    for op in tail {
        match op {
            Tail::Add(items) => drop(store.add(items).expect("add")),
            Tail::Pin(name) => drop(store.pin_snapshot(name).expect("pin")),
            Tail::Delete(id) => assert!(store.delete(id).expect("delete")),
            Tail::Reopen => {
                drop(store);
                store = open();
                assert!(
                    store.stats().recovery.checkpoint_seq.is_some(),
                    "the reopen used no checkpoint"
                );
                continue;
            }
        }
        tail_states.insert(store.stats().seq, capture(&store, &refs));
    }
    let last = capture(&store, &refs);

    // The three forms: crashed now (every batch was acknowledged under Immediate, so all of them
    // are durable), closed cleanly, and without any checkpoint.
    let crashed = disk.copy().crash_losing_unsynced();
    drop(store);
    let closed = disk.copy();
    let bare = closed.copy();
    for name in bare.file_names(Path::new(DIR)) {
        if name.ends_with(".idx") {
            ctxlog::storage::Storage::remove(&bare, &Path::new(DIR).join(name)).expect("removing the checkpoint");
        }
    }
    let forms: Vec<Form> = [
        ("closed cleanly", closed),
        ("crashed after a checkpoint", crashed),
        ("without a checkpoint", bare),
    ]
    .into_iter()
    .map(|(name, disk)| {
        let files = layout(&disk);
        Form {
            name,
            resume: files
                .iter()
                .rev()
                .find(|f| f.segment.is_none())
                .map(|f| resume_point(&f.bytes)),
            files,
            disk,
        }
    })
    .collect();

    let built = Built {
        shape,
        forms,
        refs,
        last,
        tail_states,
    };
    check_built(&built);
    built
}

/// The files of a store on `disk`, parsed.
fn layout(disk: &SimDisk) -> Vec<FileLayout> {
    let mut names = disk.file_names(Path::new(DIR));
    // The history floor file has its own damage test (tests/past.rs): any damage to it only
    // makes views of the past start later.
    names.retain(|name| name != "history.floor");
    names.sort();
    let newest = names.iter().filter(|name| name.ends_with(".seg")).max().cloned();
    names
        .into_iter()
        .map(|name| {
            let path = Path::new(DIR).join(&name);
            let bytes = disk.file_bytes(&path).expect("file bytes");
            let segment = name.ends_with(".seg").then(|| SegmentLayout {
                newest: Some(&name) == newest.as_ref(),
                frames: frames(&bytes),
            });
            assert!(
                segment.is_some() || name.ends_with(".idx"),
                "unexpected file {name} in the store"
            );
            FileLayout {
                name,
                path,
                bytes,
                segment,
            }
        })
        .collect()
}

/// The last segment a checkpoint lists, and its length: docs/FORMAT.md, "Checkpoint file".
fn resume_point(checkpoint: &[u8]) -> (String, usize) {
    // The body follows the 40-byte header; with flag bit 0 it is a length, a block count and the
    // blocks, each a length, an LZ4 length and an LZ4 block.
    let stored = &checkpoint[40..checkpoint.len() - 4];
    let body = if le_u32(checkpoint, 12) & 1 == 1 {
        let mut body = Vec::new();
        let mut at = 12;
        for _ in 0..le_u32(stored, 8) {
            let (len, stored_len) = (le_u32(stored, at), le_u32(stored, at + 4));
            let block = &stored[at + 8..at + 8 + stored_len];
            body.extend(lz4_flex::block::decompress(block, len).expect("LZ4 block"));
            at += 8 + stored_len;
        }
        body
    } else {
        stored.to_vec()
    };
    let count = le_u32(&body, 0);
    assert!(count > 0, "a checkpoint lists no segment");
    let last = 4 + (count - 1) * 16;
    let number = le_u32(&body, last);
    let len = u64::from_le_bytes(body[last + 8..last + 16].try_into().expect("8 bytes"));
    (
        format!("{number:08}.seg"),
        usize::try_from(len).expect("a segment length"),
    )
}

fn le_u32(bytes: &[u8], at: usize) -> usize {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize
}

/// The frames of a pristine segment, with the put records in each. The newest segment of a store
/// that was not closed ends in zeros: space allocated ahead of its appends.
fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut at = SEGMENT_HEADER_BYTES;
    while at < bytes.len() {
        if bytes[at..].iter().all(|byte| *byte == 0) {
            return out;
        }
        let end = at + FRAME_HEADER_BYTES + le_u32(bytes, at);
        let seq = u64::from_le_bytes(bytes[at + 9..at + 17].try_into().expect("8 bytes"));
        let count = le_u32(bytes, at + FRAME_HEADER_BYTES);
        let mut record = at + FRAME_HEADER_BYTES + 4;
        let mut puts = Vec::new();
        for _ in 0..count {
            let body = record + RECORD_HEADER_BYTES;
            let record_end = body + le_u32(bytes, record + 1);
            if bytes[record] == 1 {
                let id_len = bytes[body + PUT_ID_AT] as usize;
                let id = &bytes[body + PUT_ID_AT + 1..body + PUT_ID_AT + 1 + id_len];
                puts.push((record..record_end, String::from_utf8(id.to_vec()).expect("UTF-8 id")));
            }
            record = record_end;
        }
        assert_eq!(record, end, "the records of the frame at {at} do not fill it");
        out.push(Frame {
            range: at..end,
            seq,
            puts,
        });
        at = end;
    }
    assert_eq!(at, bytes.len(), "a pristine segment ends inside a frame");
    out
}

/// Checks what the sweeps rely on: each form reopens to the last state, the forms have the files
/// they should, and the states kept cover the newest segment.
fn check_built(built: &Built) {
    let name = built.shape.name;
    for form in &built.forms {
        let store = reopen(&form.disk.copy(), built.shape.segment_size)
            .unwrap_or_else(|e| panic!("{name}, {}: the undamaged store does not open: {e}", form.name));
        assert!(
            capture(&store, &built.refs) == built.last,
            "{name}, {}: the undamaged store does not reopen to the state it was left in",
            form.name
        );
        let report = store.verify().expect("verify");
        assert!(report.is_ok(), "{name}, {}: {:?}", form.name, report.problems);
        let segments: Vec<&FileLayout> = form.files.iter().filter(|f| f.segment.is_some()).collect();
        let checkpoints = form.files.len() - segments.len();
        // A crash may bring back the checkpoint the last one replaced (its removal is not synced).
        let expected_checkpoints = match form.name {
            "without a checkpoint" => 0..=0,
            "closed cleanly" => 1..=1,
            _ => 1..=2,
        };
        assert!(
            expected_checkpoints.contains(&checkpoints),
            "{name}, {}: {checkpoints} checkpoints",
            form.name
        );
        assert!(
            segments.len() >= 3,
            "{name}, {}: only {} segments",
            form.name,
            segments.len()
        );
        let rewritten = segments
            .iter()
            .filter(|f| u32::from_le_bytes(f.bytes[24..28].try_into().expect("4 bytes")) > 0)
            .count();
        assert!(rewritten >= 2, "{name}, {}: {rewritten} rewritten segments", form.name);
        let newest = segments
            .last()
            .and_then(|f| f.segment.as_ref())
            .expect("a newest segment");
        let first = newest.frames.first().expect("the newest segment holds frames");
        assert!(
            built.tail_states.contains_key(&(first.seq - 1)),
            "{name}, {}: the newest segment starts before the final phase",
            form.name
        );
        if form.name == "crashed after a checkpoint" {
            let state = store.stats();
            assert!(
                state.recovery.frames > 0 && state.recovery.checkpoint_seq.is_some(),
                "{name}: the crashed form should replay a tail after its checkpoint: {:?}",
                state.recovery
            );
        }
    }
    let items = built.last.all.len();
    let bytes: usize = built.forms[0].files.iter().map(|f| f.bytes.len()).sum();
    println!(
        "{name} store: {items} items, {} refs, {} pins; {} segments, {bytes} bytes in all closed cleanly",
        built.refs.len(),
        built.last.pins.len(),
        built.forms[0].files.iter().filter(|f| f.segment.is_some()).count()
    );
}

// ---------------------------------------------------------------------------------------------------
// Damage.

#[derive(Clone, Debug)]
enum Damage {
    /// Bit `bit` of byte `at` flipped.
    Flip { at: usize, bit: u8 },
    /// Bytes `range` (within the file) set to zero.
    Zeros { range: Range<usize> },
    /// The frame `frame` of file `from` written over the bytes from `at` on (extending the file if
    /// it runs past the end).
    Copy {
        from: usize,
        frame: Range<usize>,
        at: usize,
    },
}

#[derive(Clone, Debug)]
struct Case {
    form: usize,
    file: usize,
    damage: Damage,
}

impl Case {
    /// The damaged file's bytes, the range of bytes written, and the range of bytes that differ
    /// (`None` if none does).
    fn apply(&self, files: &[FileLayout]) -> (Vec<u8>, Range<usize>, Option<Range<usize>>) {
        let pristine = &files[self.file].bytes;
        let mut bytes = pristine.clone();
        let written = match &self.damage {
            Damage::Flip { at, bit } => {
                bytes[*at] ^= 1 << bit;
                *at..at + 1
            }
            Damage::Zeros { range } => {
                bytes[range.clone()].fill(0);
                range.clone()
            }
            Damage::Copy { from, frame, at } => {
                let source = &files[*from].bytes[frame.clone()];
                if bytes.len() < at + source.len() {
                    bytes.resize(at + source.len(), 0);
                }
                bytes[*at..at + source.len()].copy_from_slice(source);
                *at..at + source.len()
            }
        };
        let differs = |i: &usize| pristine.get(*i) != Some(&bytes[*i]);
        let first = written.clone().find(differs);
        let last = written.clone().rev().find(differs);
        let changed = first.zip(last).map(|(first, last)| first..last + 1);
        (bytes, written, changed)
    }

    fn describe(&self, built: &Built) -> String {
        let form = &built.forms[self.form];
        let file = &form.files[self.file].name;
        let what = match &self.damage {
            Damage::Flip { at, bit } => format!("bit {bit} of byte {at}"),
            Damage::Zeros { range } => format!("zeros over bytes {range:?}"),
            Damage::Copy { from, frame, at } => {
                format!(
                    "the frame at {frame:?} of {} copied to offset {at}",
                    form.files[*from].name
                )
            }
        };
        format!("{} store, {}: {what} of {file}", built.shape.name, form.name)
    }
}

/// How a damaged copy came out. Each is an allowed outcome; anything else fails the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// Opening failed with `Error::Corrupt` naming the file and offset.
    Corrupt,
    /// Opened with the undamaged state; nothing the checks read touched the damage (a sealed segment
    /// the checkpoint covers is not read on open, bytes outside any item record, a checkpoint no
    /// longer used).
    Latent,
    /// Opened with the undamaged state after rejecting the damaged checkpoint and replaying the log.
    CheckpointRejected,
    /// Opened with the undamaged state; the damaged item records answer `HashMismatch` and `get`
    /// fails with `Corrupt` naming the file.
    ReportedOnRead,
    /// Opened with the undamaged state; the damage was in the zeros allocated past the newest
    /// segment's last frame (a store that was not closed leaves them), which opening cut off.
    AllocatedCut,
    /// Opened after truncating the tail of the newest segment from the first damaged frame on; the
    /// state is the one before that frame's batch. The number is how many acknowledged batches
    /// (frames of the undamaged store) were cut.
    Truncated(usize),
}

/// How thoroughly a case that opened is compared with the undamaged state. Both compare the figures
/// (seq, items, versions, pins) and `resolve`, in every pin, the references of every id whose record
/// the damage touched plus four chosen by the salt.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// And `get` of everything in the current view and every pin, `resolve` of every reference in the
    /// current view, and, when no read came across the damage, `verify()`.
    Full { salt: u64 },
    /// And the same `resolve` in the current view.
    Targeted { salt: u64 },
}

impl Depth {
    fn salt(self) -> u64 {
        match self {
            Depth::Full { salt } | Depth::Targeted { salt } => salt,
        }
    }
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Opens a damaged copy and checks the outcome; `Err` says what is wrong.
fn run_case(built: &Built, case: &Case, depth: Depth) -> std::result::Result<Outcome, String> {
    let form = &built.forms[case.form];
    let file = &form.files[case.file];
    let (bytes, written, changed) = case.apply(&form.files);
    let Some(changed) = changed else {
        return Err("the damage changes nothing (the sweep should skip it)".into());
    };
    let damaged_len = bytes.len();
    let disk = form.disk.copy();
    disk.set_file_bytes(&file.path, bytes);

    // Where the newest segment's frames end, before the zeros allocated past them (if any).
    let data_end = file.segment.as_ref().filter(|segment| segment.newest).map(|segment| {
        segment
            .frames
            .last()
            .map_or(SEGMENT_HEADER_BYTES, |frame| frame.range.end)
    });
    // Where an error may point: from the start of the frame (or header) the damage begins in; for
    // damage to the newest segment's allocated zeros, their start.
    let floor = match &file.segment {
        Some(_) if data_end.is_some_and(|end| changed.start >= end) => data_end.unwrap_or_default(),
        Some(segment) if changed.start >= SEGMENT_HEADER_BYTES => segment
            .frames
            .iter()
            .find(|frame| frame.range.contains(&changed.start))
            .map_or(changed.start, |frame| frame.range.start),
        _ => 0,
    };
    let store = match reopen(&disk, built.shape.segment_size) {
        Ok(store) => store,
        Err(error @ Error::Corrupt { .. }) => {
            let message = error.to_string();
            let Error::Corrupt {
                file: named, offset, ..
            } = error
            else {
                unreachable!()
            };
            ensure!(
                named == file.path,
                "Corrupt names {} instead of the damaged file: {message}",
                named.display()
            );
            ensure!(
                (floor as u64..=written.end as u64).contains(&offset),
                "Corrupt names offset {offset}, outside {floor}..={} (damage at {changed:?}): {message}",
                written.end
            );
            ensure!(
                message.contains(&file.name) && message.contains(&format!("offset {offset}")),
                "the message does not name the file and offset: {message}"
            );
            ensure!(
                file.segment.is_some(),
                "a damaged checkpoint made opening fail instead of replaying the log: {message}"
            );
            return Ok(Outcome::Corrupt);
        }
        Err(other) => return Err(format!("opening failed with something other than Corrupt: {other}")),
    };
    let recovery = store.stats().recovery;
    let checkpoint_rejected = recovery.checkpoint_rejected.is_some();
    // The newest checkpoint is the one opening tries; an older one is never read.
    let newest_checkpoint = form.files.iter().rev().find(|f| f.segment.is_none()).map(|f| &f.name);
    if newest_checkpoint == Some(&file.name) {
        ensure!(checkpoint_rejected, "a damaged checkpoint was used ({recovery:?})");
    }

    // Where replay started in the damaged file, when opening used the checkpoint: the bytes before
    // were not read.
    let used_checkpoint = recovery.checkpoint_seq.is_some() && !checkpoint_rejected;
    let resumed_at = match &form.resume {
        Some((name, len)) if used_checkpoint && *name == file.name => *len,
        _ => 0,
    };
    // The ids whose put records the damage touched (before `end`): they may answer HashMismatch.
    let affected = |end: usize| -> BTreeSet<String> {
        file.segment
            .iter()
            .flat_map(|segment| segment.frames.iter())
            .flat_map(|frame| frame.puts.iter())
            .filter(|(range, _)| range.start < changed.end && changed.start < range.end && range.end <= end)
            .map(|(_, id)| id.clone())
            .collect()
    };
    ensure!(
        recovery.truncated_bytes == 0 || data_end.is_some(),
        "{} bytes truncated, but the damage is not in the newest segment",
        recovery.truncated_bytes
    );
    // Opening cuts the newest segment after its last good frame: a torn tail (`truncated_bytes`),
    // zeros (`unwritten_bytes`), or both. Damage past the last frame cuts no frame.
    let cut = data_end.map(|_| damaged_len as u64 - recovery.truncated_bytes - recovery.unwritten_bytes);
    if let (Some(cut), Some(end)) = (cut, data_end) {
        ensure!(
            cut <= end as u64,
            "opening kept {cut} bytes of the newest segment, whose frames end at {end}"
        );
    }
    let outcome = if let Some(cut) = cut.filter(|cut| data_end.is_some_and(|end| *cut < end as u64)) {
        let segment = file
            .segment
            .as_ref()
            .filter(|segment| segment.newest)
            .ok_or("no newest segment")?;
        let first_read = floor.max(resumed_at);
        ensure!(
            cut == first_read as u64,
            "truncated at {cut}, not at the start {first_read} of the first damaged frame replayed (damage at \
             {changed:?})"
        );
        // docs/FORMAT.md: a torn write is a frame cut short by the end of the file or failing its
        // CRC; a whole frame with a good CRC is never one.
        let damaged = case.apply(&form.files).0;
        let cut_at = usize::try_from(cut).expect("an offset");
        if let Some(header) = damaged.get(cut_at..cut_at + FRAME_HEADER_BYTES) {
            let end = cut_at + FRAME_HEADER_BYTES + le_u32(header, 0);
            let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
            let whole = damaged
                .get(cut_at + 8..end)
                .is_some_and(|covered| crc32fast::hash(covered) == crc);
            ensure!(
                !whole,
                "the whole frame at {cut} (good CRC) was truncated as a torn write"
            );
        }
        let lost: Vec<&Frame> = segment
            .frames
            .iter()
            .filter(|frame| frame.range.start >= cut_at)
            .collect();
        if let Damage::Flip { .. } = case.damage {
            ensure!(
                lost.len() == 1 && Some(lost[0].range.end) == data_end,
                "a single flip truncated {} frames: more than the last one",
                lost.len()
            );
        }
        let before = lost.first().map_or(built.last.seq, |frame| frame.seq - 1);
        let expected = built
            .tail_states
            .get(&before)
            .ok_or_else(|| format!("no state kept for seq {before}"))?;
        compare(
            &store,
            built,
            expected,
            &affected(cut_at),
            Depth::Full { salt: 0 },
            file,
        )?;
        Outcome::Truncated(lost.len())
    } else if data_end.is_some_and(|end| changed.start >= end) {
        // Only the zeros allocated past the last frame were hit: opening cut them (checked above:
        // right after the last frame), and nothing else changed.
        let reported = compare(&store, built, &built.last, &BTreeSet::new(), depth, file)?;
        ensure!(!reported, "damage past the last frame was reported on read");
        Outcome::AllocatedCut
    } else {
        let reported = compare(&store, built, &built.last, &affected(usize::MAX), depth, file)?;
        if reported {
            Outcome::ReportedOnRead
        } else if checkpoint_rejected {
            Outcome::CheckpointRejected
        } else {
            Outcome::Latent
        }
    };
    if matches!(depth, Depth::Full { .. }) && matches!(outcome, Outcome::Latent | Outcome::CheckpointRejected) {
        // Damage that no read came across is still found by verify(): CRCs and hashes cover every
        // byte of every file.
        let report = store.verify().map_err(|e| format!("verify failed: {e}"))?;
        ensure!(
            report.problems.iter().any(|p| p.file == file.path),
            "verify() does not report the damage: {:?}",
            report.problems
        );
    }
    close_without_checkpoint(&disk, store)?;
    Ok(outcome)
}

/// Closes a store whose disk is thrown away next, without the checkpoint a clean close writes (the
/// most expensive part of a close): the power is cut and a write refused, so the store closes as
/// poisoned.
fn close_without_checkpoint(disk: &SimDisk, store: Store) -> std::result::Result<(), String> {
    disk.cut_power_after(0);
    let refused = store.add(vec![ContextItem::new(
        "poison",
        "message",
        json!("x"),
        "damage-sweep",
        T_END,
        "1",
        Scope::GlobalWritable,
    )]);
    ensure!(refused.is_err(), "a write on a disk without power succeeded");
    drop(store);
    Ok(())
}

/// Compares what the store answers with `expected`; items in `affected` may answer `HashMismatch`
/// (and make `get` fail with `Corrupt` naming `file`). Returns whether any did.
fn compare(
    store: &Store,
    built: &Built,
    expected: &State,
    affected: &BTreeSet<String>,
    depth: Depth,
    file: &FileLayout,
) -> std::result::Result<bool, String> {
    let stats = store.stats();
    ensure!(
        stats.seq == expected.seq,
        "seq {} instead of {}",
        stats.seq,
        expected.seq
    );
    ensure!(
        stats.items == expected.items && stats.versions == expected.versions,
        "{} items and {} versions instead of {} and {}",
        stats.items,
        stats.versions,
        expected.items,
        expected.versions
    );
    let infos: Vec<SnapshotInfo> = expected.pins.iter().map(|pin| pin.info.clone()).collect();
    ensure!(
        store.snapshots() == infos,
        "pins {:?} instead of {infos:?}",
        store.snapshots()
    );

    // The references of every id whose record the damage touched, and four chosen by the salt.
    let targeted: Vec<usize> = {
        let mut chosen: BTreeSet<usize> = built
            .refs
            .iter()
            .enumerate()
            .filter(|(_, reference)| affected.contains(reference.split('@').next().unwrap_or_default()))
            .map(|(i, _)| i)
            .collect();
        let mut rng = fastrand::Rng::with_seed(depth.salt());
        for _ in 0..4 {
            chosen.insert(rng.usize(0..built.refs.len().max(1)));
        }
        chosen.into_iter().collect()
    };
    let every: Vec<usize> = (0..built.refs.len()).collect();
    let mut reported = false;
    let mut check_view = |what: &str,
                          chosen: &[usize],
                          resolved: Result<Vec<Resolution>>,
                          all: Option<Result<Vec<ContextItem>>>,
                          expected_resolved: &[Resolution],
                          expected_all: &[ContextItem]|
     -> std::result::Result<(), String> {
        let resolved = resolved.map_err(|e| format!("{what}: resolve failed: {e}"))?;
        for (&i, got) in chosen.iter().zip(&resolved) {
            let want = &expected_resolved[i];
            if got == want {
                continue;
            }
            let mismatch_allowed = matches!(got, Resolution::HashMismatch { id } if affected.contains(id))
                && matches!(want, Resolution::Found(_) | Resolution::Superseded { .. });
            ensure!(
                mismatch_allowed,
                "{what}: {} resolves to {got:?} instead of {want:?}",
                built.refs[i]
            );
            reported = true;
        }
        match all {
            None => {}
            Some(Ok(items)) => ensure!(items == expected_all, "{what}: get returns other items"),
            Some(Err(Error::Corrupt { file: named, .. })) => {
                ensure!(
                    named == file.path && expected_all.iter().any(|item| affected.contains(&item.id)),
                    "{what}: get fails with Corrupt naming {} (affected: {affected:?})",
                    named.display()
                );
                reported = true;
            }
            Some(Err(other)) => return Err(format!("{what}: get failed with {other}")),
        }
        Ok(())
    };
    let full = matches!(depth, Depth::Full { .. });
    let refs = |chosen: &[usize]| -> Vec<&str> { chosen.iter().map(|&i| built.refs[i].as_str()).collect() };
    let chosen = if full { &every } else { &targeted };
    check_view(
        "the current view",
        chosen,
        store.resolve(refs(chosen)),
        full.then(|| store.get(&ContextQuery::new())),
        &expected.resolved,
        &expected.all,
    )?;
    for pin in &expected.pins {
        let snapshot = store
            .open_snapshot(&pin.info.name)
            .map_err(|e| format!("open_snapshot({}) failed: {e}", pin.info.name))?;
        check_view(
            &format!("pin {}", pin.info.name),
            &targeted,
            snapshot.resolve(refs(&targeted)),
            full.then(|| snapshot.get(&ContextQuery::new())),
            &pin.resolved,
            &pin.all,
        )?;
    }
    Ok(reported)
}

// ---------------------------------------------------------------------------------------------------
// Sweeps.

/// Tallies of one sweep.
#[derive(Default)]
struct Tally {
    cases: u64,
    outcomes: BTreeMap<Outcome, u64>,
    /// The first case of each outcome (in each worker's order).
    examples: BTreeMap<Outcome, String>,
    failures: Vec<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.cases += other.cases;
        for (outcome, count) in other.outcomes {
            *self.outcomes.entry(outcome).or_insert(0) += count;
        }
        for (outcome, example) in other.examples {
            self.examples.entry(outcome).or_insert(example);
        }
        self.failures.extend(other.failures);
    }
}

/// Runs `cases` on several threads; `depth` chooses each case's depth from its position.
fn sweep(built: &Built, what: &str, cases: &[Case], depth: &(dyn Fn(usize) -> Depth + Sync)) -> Tally {
    common::count_store_thread_panics();
    let started = Instant::now();
    let panics_before = common::store_thread_panics();
    // Each case spends part of its time waiting for the store's threads: more workers than cores.
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| 3 * n.get())
        .clamp(2, 8);
    let mut tally = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                scope.spawn(move || {
                    let mut tally = Tally::default();
                    for (position, case) in cases.iter().enumerate().skip(worker).step_by(workers) {
                        tally.cases += 1;
                        let result = catch_unwind(AssertUnwindSafe(|| run_case(built, case, depth(position))))
                            .unwrap_or_else(|_| Err("panicked (message above)".into()));
                        match result {
                            Ok(outcome) => {
                                *tally.outcomes.entry(outcome).or_insert(0) += 1;
                                tally.examples.entry(outcome).or_insert_with(|| case.describe(built));
                            }
                            Err(reason) => tally.failures.push(format!("{}: {reason}", case.describe(built))),
                        }
                    }
                    tally
                })
            })
            .collect();
        let mut total = Tally::default();
        for handle in handles {
            total.merge(handle.join().expect("a sweep worker panicked"));
        }
        total
    });
    let panics = common::store_thread_panics() - panics_before;
    if panics > 0 && tally.failures.is_empty() {
        tally
            .failures
            .push(format!("{panics} panics on the store's threads (messages above)"));
    }
    println!(
        "{} store, {what}: {} cases in {:.1?}: {:?}",
        built.shape.name,
        tally.cases,
        started.elapsed(),
        tally.outcomes
    );
    for (outcome, example) in &tally.examples {
        println!("    e.g. {outcome:?}: {example}");
    }
    tally
}

fn assert_clean(tally: &Tally, what: &str) {
    assert!(
        tally.failures.is_empty(),
        "{what}: {} of {} cases failed, e.g.:\n{}",
        tally.failures.len(),
        tally.cases,
        tally.failures.iter().take(12).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Every bit of every file of every form that `take` chooses.
fn every_flip(built: &Built, take: &dyn Fn(&Form, &FileLayout) -> bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for (form, f) in built.forms.iter().enumerate() {
        for (file, layout) in f.files.iter().enumerate().filter(|(_, layout)| take(f, layout)) {
            for at in 0..layout.bytes.len() {
                for bit in 0..8 {
                    cases.push(Case {
                        form,
                        file,
                        damage: Damage::Flip { at, bit },
                    });
                }
            }
        }
    }
    cases
}

/// A block of zeros (clipped to the file) at every multiple of `step` of every file, at `extra`
/// unaligned offsets chosen by the seed, and ending at the end of the file.
fn zero_blocks(built: &Built, step: usize, extra: usize, seed: u64) -> Vec<Case> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut cases = Vec::new();
    for (form, f) in built.forms.iter().enumerate() {
        for (file, layout) in f.files.iter().enumerate() {
            let len = layout.bytes.len();
            let mut starts: BTreeSet<usize> = (0..len).step_by(step).collect();
            for _ in 0..extra {
                starts.insert(rng.usize(0..len.max(1)));
            }
            starts.insert(len.saturating_sub(BLOCK));
            for start in starts {
                let range = start..(start + BLOCK).min(len);
                if layout.bytes[range.clone()].iter().any(|&b| b != 0) {
                    cases.push(Case {
                        form,
                        file,
                        damage: Damage::Zeros { range },
                    });
                }
            }
        }
    }
    cases
}

/// Frames copied over other frames' positions and after the end of segments. With `all`, every
/// (frame, position) pair; else, for each position, a frame of the same segment and one of another
/// (chosen by the seed), frames of equal length (see below), and each segment's last frame again
/// after its end.
fn frame_copies(built: &Built, all: bool, seed: u64) -> Vec<Case> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut cases = Vec::new();
    for (form, f) in built.forms.iter().enumerate() {
        let frames: Vec<(usize, Frame)> = f
            .files
            .iter()
            .enumerate()
            .flat_map(|(file, layout)| {
                layout
                    .segment
                    .iter()
                    .flat_map(move |segment| segment.frames.iter().map(move |frame| (file, frame.clone())))
            })
            .collect();
        let mut pairs: BTreeSet<(usize, usize, usize, usize)> = BTreeSet::new();
        let mut push = |source: &(usize, Frame), file: usize, at: usize| {
            pairs.insert((source.0, source.1.range.start, file, at));
        };
        for (file, layout) in f.files.iter().enumerate() {
            let Some(segment) = &layout.segment else { continue };
            let positions: Vec<usize> = segment
                .frames
                .iter()
                .map(|frame| frame.range.start)
                .chain([layout.bytes.len()])
                .collect();
            let same: Vec<&(usize, Frame)> = frames.iter().filter(|(from, _)| *from == file).collect();
            let other: Vec<&(usize, Frame)> = frames.iter().filter(|(from, _)| *from != file).collect();
            for &at in &positions {
                if all {
                    for source in &frames {
                        push(source, file, at);
                    }
                    continue;
                }
                for pool in [&same, &other] {
                    if !pool.is_empty() {
                        push(pool[rng.usize(0..(pool.len()).max(1))], file, at);
                    }
                }
            }
            if all {
                continue;
            }
            for frame in &segment.frames {
                // A frame of the same length over this one: its records land where the index expects
                // records of the same size. Every such pair between puts of the same id (the id
                // added again after a delete), and one more chosen by the seed.
                let ids: BTreeSet<&String> = frame.puts.iter().map(|(_, id)| id).collect();
                let same_length: Vec<&(usize, Frame)> = frames
                    .iter()
                    .filter(|(_, source)| source.range.len() == frame.range.len())
                    .collect();
                for source in &same_length {
                    if source.1.puts.iter().any(|(_, id)| ids.contains(id)) {
                        push(source, file, frame.range.start);
                    }
                }
                if !same_length.is_empty() {
                    push(
                        same_length[rng.usize(0..(same_length.len()).max(1))],
                        file,
                        frame.range.start,
                    );
                }
            }
            // The segment's own last frame after its end (a duplicate of its last batch).
            if let Some(last) = segment.frames.last() {
                push(&(file, last.clone()), file, layout.bytes.len());
            }
        }
        for (from, start, file, at) in pairs {
            let frame = frames
                .iter()
                .find(|(f, frame)| *f == from && frame.range.start == start)
                .map(|(_, frame)| frame.range.clone())
                .expect("a frame");
            let case = Case {
                form,
                file,
                damage: Damage::Copy { from, frame, at },
            };
            if case.apply(&f.files).2.is_some() {
                cases.push(case);
            }
        }
    }
    cases
}

fn small() -> &'static Built {
    static BUILT: std::sync::OnceLock<Built> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| build(&SMALL))
}

fn large() -> &'static Built {
    static BUILT: std::sync::OnceLock<Built> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| build(&LARGE))
}

#[test]
fn every_bit_of_every_file_of_a_small_store() {
    let built = small();
    // The closed form's segments are byte for byte the crashed form's (a clean close writes only a
    // checkpoint, and cuts the zeros allocated past the newest segment's frames): of the closed
    // form, only its checkpoint.
    let cases = every_flip(built, &|form, file| {
        form.name != "closed cleanly" || file.segment.is_none()
    });
    let tally = sweep(built, "every bit flipped", &cases, &|position| Depth::Full {
        salt: position as u64,
    });
    assert_clean(&tally, "every bit of the small store");
    assert!(tally.outcomes.get(&Outcome::Corrupt).copied().unwrap_or(0) > 0);
}

#[test]
fn zeroed_blocks_and_misplaced_frames_in_a_small_store() {
    let built = small();
    let blocks = zero_blocks(built, 64, 0, 1);
    let tally = sweep(built, "4 KiB of zeros at every 64th byte", &blocks, &|position| {
        Depth::Full { salt: position as u64 }
    });
    assert_clean(&tally, "zeroed blocks in the small store");
    let copies = frame_copies(built, true, 2);
    let tally = sweep(built, "every frame over every frame position", &copies, &|position| {
        Depth::Full { salt: position as u64 }
    });
    assert_clean(&tally, "frame copies in the small store");
}

/// How many sampled flips the larger store takes (`DAMAGE_FLIPS`, default 100,000).
fn sampled_flips() -> usize {
    env_number("DAMAGE_FLIPS").map_or(100_000, |n| usize::try_from(n).expect("DAMAGE_FLIPS fits a usize"))
}

/// The seed of the sampled flips (`DAMAGE_SEED`, default 0xda3a6e): another seed, other flips.
fn flip_seed() -> u64 {
    env_number("DAMAGE_SEED").unwrap_or(0x00da_3a6e)
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// In the sampled sweeps, one case in this many is compared in full; the others are targeted.
const FULL_EVERY: usize = 256;

fn sampled_depth(position: usize) -> Depth {
    if position.is_multiple_of(FULL_EVERY) {
        Depth::Full { salt: position as u64 }
    } else {
        Depth::Targeted { salt: position as u64 }
    }
}

#[test]
fn sampled_flips_in_a_larger_store() {
    let built = large();
    let sizes: Vec<(usize, usize, usize)> = built
        .forms
        .iter()
        .enumerate()
        .flat_map(|(form, f)| {
            f.files
                .iter()
                .enumerate()
                .map(move |(file, l)| (form, file, l.bytes.len()))
        })
        .collect();
    let total: usize = sizes.iter().map(|s| s.2).sum();
    let seed = flip_seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let cases: Vec<Case> = (0..sampled_flips())
        .map(|_| {
            let mut byte = rng.usize(0..(total).max(1));
            let &(form, file, _) = sizes
                .iter()
                .find(|&&(_, _, len)| {
                    if byte < len {
                        true
                    } else {
                        byte -= len;
                        false
                    }
                })
                .expect("a byte of some file");
            Case {
                form,
                file,
                damage: Damage::Flip {
                    at: byte,
                    bit: rng.u8(0..8),
                },
            }
        })
        .collect();
    let tally = sweep(
        built,
        &format!("sampled bit flips (seed {seed:#x})"),
        &cases,
        &sampled_depth,
    );
    assert_clean(&tally, "sampled flips in the larger store");
}

#[test]
fn zeroed_blocks_and_misplaced_frames_in_a_larger_store() {
    let built = large();
    let blocks = zero_blocks(built, BLOCK, 8, 3);
    let tally = sweep(built, "4 KiB of zeros, aligned and not", &blocks, &sampled_depth);
    assert_clean(&tally, "zeroed blocks in the larger store");
    let copies = frame_copies(built, false, 4);
    let tally = sweep(built, "frames copied to wrong offsets", &copies, &sampled_depth);
    assert_clean(&tally, "frame copies in the larger store");
}
