//! Criterion micro-benchmarks of ctxlog's hot paths, so a regression is visible. Through the public
//! API: validation + hashing (an `add` of a batch to a `Durability::Never` store), `resolve`, a typed
//! time-window query, query planning alone (a query whose window holds nothing),
//! `ContextItem::from_json` / `to_json`, and `canonical_json`. Through `ctxlog::testing::bench`
//! (hidden, for benchmarks only): a batch frame's encoding and decoding, and the index insert of a
//! batch. And the cost of each check a read makes, and of allocating and freeing one item
//! (`read_checks`).
//!
//! `cargo bench -p ctxlog-bench --bench hot_paths` (add `-- NAME` to filter).

use std::hint::black_box;
use std::sync::Arc;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion, Throughput};
use ctxlog::testing::bench::{decode_frame_records, IndexInput, PutRecords};
use ctxlog::{canonical_json, ContextItem, ContextQuery, Durability, ManualClock, Options, Scope, Store, TimeRange};

use ctxlog_bench::w1;
use w1::{item, mix, BASE_TS};

const LOADED: u64 = 20_000;

fn store(dir: &std::path::Path) -> Store {
    options().open(dir).expect("open a store")
}

fn options() -> Options {
    Options::new()
        .durability(Durability::Never)
        .clock(Arc::new(ManualClock::new(BASE_TS)))
        .auto_compact(false)
}

fn unhashed(n: u64) -> ContextItem {
    let mut it = item(n);
    it.hash = None;
    it
}

fn loaded() -> (tempfile::TempDir, Store) {
    loaded_with(options())
}

fn loaded_with(options: Options) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = options.open(dir.path()).expect("open a store");
    for first in (0..LOADED).step_by(1000) {
        store.add((first..first + 1000).map(unhashed)).expect("load");
    }
    (dir, store)
}

/// Benchmarks `add` of successive batches of `len` fresh W1 items to `store`.
fn bench_adds(b: &mut criterion::Bencher<'_>, store: &Store, len: u64, size: BatchSize) {
    let mut next = 0u64;
    b.iter_batched(
        || {
            let batch: Vec<ContextItem> = (next..next + len).map(unhashed).collect();
            next += len;
            batch
        },
        |batch| store.add(batch).expect("add"),
        size,
    );
}

fn write_path(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path());
    let mut group = c.benchmark_group("add");
    group.throughput(Throughput::Elements(100));
    // Validation, canonical JSON, SHA-256, framing, the log write (no fsync) and the index insert.
    group.bench_function("batch_of_100_never_durable", |b| {
        bench_adds(b, &store, 100, BatchSize::SmallInput);
    });
    group.finish();
    // A batch large enough to be validated and encoded on several threads (`Options::add_threads`),
    // against the same batch on the calling thread alone.
    let mut group = c.benchmark_group("add_1000");
    group.throughput(Throughput::Elements(1000));
    for threads in [1, 2] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Options::new()
            .durability(Durability::Never)
            .auto_compact(false)
            .add_threads(threads)
            .open(dir.path())
            .expect("open");
        group.bench_function(format!("never_durable_{threads}_threads"), |b| {
            bench_adds(b, &store, 1000, BatchSize::LargeInput);
        });
    }
    group.finish();
}

/// Benchmarks `get` (as `name`) and `get_raw` (as `name_raw`) of document_chunk items in random
/// windows of `seconds` over the loaded items.
fn bench_windows(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, store: &Store, seconds: u64) {
    let window = |q: u64| {
        let start = BASE_TS + i64::try_from(mix(q) % (LOADED - seconds)).expect("fits");
        let end = start + i64::try_from(seconds).expect("fits") - 1;
        ContextQuery::new()
            .types(["document_chunk"])
            .time_range(TimeRange::new(start, end).expect("range"))
    };
    let mut q = 0u64;
    group.bench_function(name, |b| {
        b.iter(|| {
            q += 1;
            black_box(store.get(&window(q)).expect("get"))
        });
    });
    let mut q = 0u64;
    group.bench_function(format!("{name}_raw"), |b| {
        b.iter(|| {
            q += 1;
            black_box(store.get_raw(&window(q)).expect("get_raw"))
        });
    });
}

fn read_path(c: &mut Criterion) {
    let (_dir, store) = loaded();
    let mut i = 0u64;
    c.bench_function("resolve_one", |b| {
        b.iter(|| {
            i += 1;
            let id = format!("item-{:08}", mix(i) % LOADED);
            black_box(store.resolve([id.as_str()]).expect("resolve"))
        });
    });
    // The same random ids, answered as the item's JSON without parsing its content.
    let mut i = 0u64;
    c.bench_function("resolve_one_raw", |b| {
        b.iter(|| {
            i += 1;
            let id = format!("item-{:08}", mix(i) % LOADED);
            black_box(store.resolve_raw([id.as_str()]).expect("resolve_raw"))
        });
    });
    let mut group = c.benchmark_group("query");
    // ~100 document_chunk items (40% of a 250-second window).
    group.throughput(Throughput::Elements(100));
    bench_windows(&mut group, "type_and_window_100_items", &store, 250);
    group.finish();
    // ~1,000 items, P4's size: read on the default `read_threads` and on one thread.
    let (_one_dir, one_thread) = loaded_with(options().read_threads(1));
    let mut group = c.benchmark_group("query_1000");
    group.throughput(Throughput::Elements(1000));
    for (name, store) in [("default_read_threads", &store), ("one_read_thread", &one_thread)] {
        bench_windows(&mut group, &format!("type_and_window_{name}"), store, 2_500);
    }
    group.finish();
    // Planning alone: the query's checks, its filters interned, the smallest candidate set chosen
    // (two types against two scopes against time) and its range found, over a window before every
    // item, so that nothing is read.
    let before = ContextQuery::new()
        .types(["document_chunk", "message"])
        .scopes([Scope::GlobalReadonly, Scope::Session("s7".into())])
        .time_range(TimeRange::new(BASE_TS - 1_000, BASE_TS - 1).expect("range"));
    c.bench_function("query_plan_empty_window", |b| {
        b.iter(|| black_box(store.get(black_box(&before)).expect("get")))
    });
}

fn internals(c: &mut Criterion) {
    // One 1,000-item W1 batch, validated and encoded once, as the adding threads encode it (content
    // uncompressed, the default).
    let records = PutRecords::encode((0..1000).map(item), false).expect("valid W1 items");
    let frame = records.frame(1).expect("frame");
    let mut group = c.benchmark_group("frame");
    group.throughput(Throughput::Elements(records.len() as u64));
    // The writer's copy of every record into the frame, and the frame's CRC.
    group.bench_function("encode_1000_records", |b| {
        b.iter(|| black_box(records.frame(black_box(1)).expect("frame")))
    });
    // Opening's and replay's check of the frame CRC and decoding of every record (no item built).
    group.bench_function("decode_1000_records", |b| {
        b.iter(|| black_box(decode_frame_records(black_box(&frame))))
    });
    group.finish();
    let input = IndexInput::decode(&frame).expect("decode the frame");
    let mut group = c.benchmark_group("index");
    group.throughput(Throughput::Elements(input.len() as u64));
    // What publishing the batch does to the index (id lookup, version entry, type, scope and time
    // sets), into a fresh index each time (its allocation and freeing included).
    group.bench_function("insert_1000_into_empty", |b| {
        b.iter(|| black_box(input.insert_into_fresh_index()))
    });
    group.finish();
}

fn json_paths(c: &mut Criterion) {
    let it = item(7);
    let text = it.to_json();
    let mut group = c.benchmark_group("item");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("from_json", |b| {
        b.iter(|| black_box(ContextItem::from_json(black_box(&text)).expect("parse")));
    });
    group.bench_function("to_json", |b| b.iter(|| black_box(black_box(&it).to_json())));
    group.bench_function("canonical_json_content", |b| {
        b.iter(|| black_box(canonical_json(black_box(&it.content))));
    });
    group.finish();
}

fn read_checks(c: &mut Criterion) {
    // What each check of the read path costs on one W1 item: the record CRC (crc32fast, over the
    // stored body: the LZ4 block plus ~100 bytes of fields), the SHA-256 of the canonical content,
    // LZ4 decompression, UTF-8 validation of the item's JSON, and parsing the content into a Value.
    let it = item(7);
    let canonical = canonical_json(&it.content);
    let block = lz4_flex::block::compress(&canonical);
    let mut body = vec![0x5au8; 100];
    body.extend_from_slice(&block);
    let json = it.to_json();
    let mut group = c.benchmark_group("read_checks");
    group.bench_function("crc32_record_body", |b| {
        b.iter(|| black_box(crc32fast::hash(black_box(&body))))
    });
    group.bench_function("sha256_content", |b| {
        b.iter(|| black_box(<sha2::Sha256 as sha2::Digest>::digest(black_box(&canonical))))
    });
    group.bench_function("lz4_compress_content", |b| {
        b.iter(|| black_box(lz4_flex::block::compress(black_box(&canonical))))
    });
    group.bench_function("lz4_decompress_content", |b| {
        let mut out = vec![0u8; canonical.len()];
        b.iter(|| black_box(lz4_flex::block::decompress_into(black_box(&block), &mut out).expect("lz4")))
    });
    group.bench_function("utf8_check_item_json", |b| {
        b.iter(|| black_box(std::str::from_utf8(black_box(json.as_bytes())).is_ok()))
    });
    group.bench_function("parse_content_value", |b| {
        b.iter(|| black_box(serde_json::from_slice::<serde_json::Value>(black_box(&canonical)).expect("json")))
    });
    // The floor of any parsed read, whatever the stored encoding: allocating a W1 item's strings and
    // content tree and freeing them again (a clone and its drop, no decoding at all).
    group.bench_function("item_alloc_and_free", |b| b.iter(|| black_box(black_box(&it).clone())));
    group.finish();
}

criterion_group!(benches, write_path, read_path, json_paths, read_checks, internals);
criterion_main!(benches);
