//! Loads N W1-like items (see issue "Benchmark harness") in durable batches, then reports the bulk-load
//! rate, the index's bytes per item (from `stats()` and from the process's peak RSS), and the time to
//! reopen the store. Run: `cargo run --release --example scale -- 1000000 [DIR]`.

use std::time::Instant;

use ctxlog::{ContextItem, ContextQuery, Durability, Options, Scope, Store, TimeRange};
use serde_json::json;

const TYPES: [(&str, u32); 7] = [
    ("document_chunk", 40),
    ("message", 20),
    ("tool_result", 15),
    ("monitoring_metric", 10),
    ("user_profile", 5),
    ("user_feedback", 5),
    ("product_document", 5),
];
const WORDS: [&str; 16] = [
    "context", "model", "session", "clause", "contract", "invoice", "metric", "latency", "customer", "policy",
    "answer", "question", "summary", "vector", "record", "window",
];

/// A small deterministic generator (SplitMix64).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn item(n: u64) -> ContextItem {
    let r = mix(n);
    let pick = u32::try_from(r % 100).unwrap_or(0);
    let mut acc = 0;
    let kind = TYPES
        .iter()
        .find(|(_, share)| {
            acc += share;
            pick < acc
        })
        .map_or("document_chunk", |(kind, _)| kind);
    let scope = match mix(r) % 10 {
        0..=6 => Scope::Session(format!("s{}", n % 1000)),
        7 | 8 => Scope::GlobalReadonly,
        _ => Scope::GlobalWritable,
    };
    let mut text = String::with_capacity(440);
    let mut w = r;
    while text.len() < 420 {
        w = mix(w);
        text.push_str(WORDS[usize::try_from(w % 16).unwrap_or(0)]);
        text.push(' ');
    }
    let timestamp = 1_700_000_000 + i64::try_from(n).unwrap_or(0);
    let mut item = ContextItem::new(
        format!("item-{n:08}"),
        kind,
        json!({"title": format!("doc {n}"), "lang": "en", "n": n, "text": text}),
        format!("source-{}", r % 20),
        timestamp,
        "1",
        scope,
    );
    if n.is_multiple_of(2) {
        item = item.with_ttl(3600);
    }
    if kind == "tool_result" {
        item = item.with_confidence(f64::from(u32::try_from(r % 101).unwrap_or(0)) / 100.0);
    }
    item
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("ctxlog-scale-{}", std::process::id())),
        std::path::PathBuf::from,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let rss_before = peak_rss_kib();
    let store = Options::new().durability(Durability::Immediate).open(&dir)?;
    let started = Instant::now();
    let mut logical = 0u64;
    let mut batch = Vec::with_capacity(1000);
    for i in 0..n {
        let it = item(i);
        logical += it.to_json().len() as u64;
        batch.push(it);
        if batch.len() == 1000 {
            store.add(std::mem::take(&mut batch))?;
        }
    }
    if !batch.is_empty() {
        store.add(batch)?;
    }
    let load = started.elapsed().as_secs_f64();
    let stats = store.stats();
    let rss_after_load = peak_rss_kib();
    #[allow(clippy::cast_precision_loss)]
    let (n_f, logical_f) = (n as f64, logical as f64);
    println!("items                 {n}");
    println!(
        "bulk load             {load:.2} s, {:.0} items/s, {:.1} MB/s of JSON",
        n_f / load,
        logical_f / load / 1e6
    );
    println!(
        "bytes on disk         {} ({:.2} x logical JSON {logical})",
        stats.bytes_on_disk,
        stats.bytes_on_disk as f64 / logical_f
    );
    println!(
        "index (stats)         {} bytes, {:.1} bytes/item",
        stats.index_bytes, stats.index_bytes_per_item
    );
    println!(
        "peak RSS              {} KiB before open, {} KiB after load: {:.1} bytes/item",
        rss_before,
        rss_after_load,
        (rss_after_load.saturating_sub(rss_before) * 1024) as f64 / n_f
    );
    drop(store);
    let started = Instant::now();
    let store = Store::open(&dir)?;
    let first = store.resolve(["item-00000000"])?;
    let reopen = started.elapsed().as_secs_f64();
    println!(
        "reopen (full replay)  {reopen:.3} s to the first resolve ({:?})",
        first.first().map(|_| "answered")
    );
    let started = Instant::now();
    let range = TimeRange::new(1_700_000_000 + 1000, 1_700_000_000 + 3500)?;
    let got = store.get(&ContextQuery::new().types(["document_chunk"]).time_range(range))?;
    println!(
        "typed window query    {} items in {:.2} ms",
        got.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
