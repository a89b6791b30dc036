//! Loads N W1-like items (see issue "Benchmark harness") in durable batches, then reports the bulk-load
//! rate, the index's bytes per item (from `stats()` and from the process's peak RSS), the time to reopen
//! the store with its checkpoint and by full replay, and, after expiring half the items, compaction
//! throughput against the disk's write bandwidth, add latency during compaction, and the bytes left. Run: `cargo run --release -p ctxlog-bench --example scale -- 1000000 [DIR]`.

use std::time::Instant;

use std::sync::Arc;

use ctxlog::{ContextQuery, Durability, ManualClock, Options, Store, TimeRange};

use ctxlog_bench::w1;

use w1::{item, peak_rss_kib};

/// Sequential write bandwidth of the disk under `dir`: 256 MiB in 4 MiB writes, then fdatasync.
fn disk_write_mb_per_s(dir: &std::path::Path) -> std::io::Result<f64> {
    use std::io::Write;
    let path = dir.join("bandwidth.probe");
    let chunk = vec![0x5au8; 4 << 20];
    let started = Instant::now();
    let mut file = std::fs::File::create(&path)?;
    for _ in 0..64 {
        file.write_all(&chunk)?;
    }
    file.sync_data()?;
    let secs = started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(256.0 * 1.048_576 / secs)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(at).copied().unwrap_or(0.0)
}

/// Latencies (ms) of `count` durable single-item adds, sorted.
fn single_adds(store: &Store, first: u64, count: u64) -> Result<Vec<f64>, ctxlog::Error> {
    let mut latencies = Vec::new();
    for n in first..first + count {
        let started = Instant::now();
        store.add([item(n)])?;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

fn open(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Result<Store, ctxlog::Error> {
    Options::new()
        .durability(Durability::Immediate)
        .clock(clock.clone())
        .auto_compact(false)
        .open(dir)
}

#[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let dir = args.next().map_or_else(
        || std::env::temp_dir().join(format!("ctxlog-scale-{}", std::process::id())),
        std::path::PathBuf::from,
    );
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let clock = Arc::new(ManualClock::new(1_700_000_000));
    let rss_before = peak_rss_kib();
    let store = open(&dir, &clock)?;
    // Only the adds are timed, as in the comparison harness: making the items is not.
    let mut load = 0.0;
    let mut logical = 0u64;
    let mut live_logical = 0u64;
    let mut batch = Vec::with_capacity(1000);
    for i in 0..n {
        let it = item(i);
        let len = it.to_json().len() as u64;
        logical += len;
        if it.ttl_seconds.is_none() {
            live_logical += len;
        }
        batch.push(it);
        if batch.len() == 1000 || i + 1 == n {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(1000));
            let started = Instant::now();
            store.add(full)?;
            load += started.elapsed().as_secs_f64();
        }
    }
    let stats = store.stats();
    let rss_after_load = peak_rss_kib();
    let n_f = n as f64;
    println!("items                 {n}");
    println!(
        "bulk load             {load:.2} s, {:.0} items/s, {:.1} MB/s of JSON",
        n_f / load,
        logical as f64 / load / 1e6
    );
    println!(
        "bytes on disk         {} ({:.2} x logical JSON {logical})",
        stats.bytes_on_disk,
        stats.bytes_on_disk as f64 / logical as f64
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

    let started = Instant::now();
    drop(store);
    println!(
        "close                 {:.3} s (writes a checkpoint)",
        started.elapsed().as_secs_f64()
    );
    if std::env::var_os("CTXLOG_SCALE_LOAD_ONLY").is_some() {
        return Ok(());
    }
    let started = Instant::now();
    let store = open(&dir, &clock)?;
    let _ = store.resolve(["item-00000000"])?;
    let with_checkpoint = started.elapsed().as_secs_f64();
    let used = store.stats().recovery.checkpoint_seq.is_some();
    drop(store);
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "idx") {
            std::fs::remove_file(path)?;
        }
    }
    let started = Instant::now();
    let store = open(&dir, &clock)?;
    let _ = store.resolve(["item-00000000"])?;
    let full_replay = started.elapsed().as_secs_f64();
    println!(
        "reopen                {with_checkpoint:.3} s with the checkpoint (used: {used}), {full_replay:.3} s by full replay: {:.1}x",
        full_replay / with_checkpoint
    );
    let range = TimeRange::new(1_700_000_000 + 1000, 1_700_000_000 + 3500)?;
    let started = Instant::now();
    let got = store.get(&ContextQuery::new().types(["document_chunk"]).time_range(range))?;
    println!(
        "typed window query    {} items in {:.2} ms",
        got.len(),
        started.elapsed().as_secs_f64() * 1e3
    );

    let disk = disk_write_mb_per_s(&dir)?;
    println!("disk                  {disk:.0} MB/s sequential write with fdatasync (same run)");
    let quiet = single_adds(&store, n, 300)?;
    // Expire every TTL item (half of them) and compact while single durable adds go on.
    clock.advance(100_000_000);
    let compactor = {
        let store = store.clone();
        std::thread::spawn(move || store.compact())
    };
    let mut during = Vec::new();
    let mut next = n + 300;
    while !compactor.is_finished() {
        during.extend(single_adds(&store, next, 20)?);
        next += 20;
    }
    during.sort_by(f64::total_cmp);
    let report = compactor.join().map_err(|_| "compaction thread panicked")??;
    let secs = report.duration.as_secs_f64();
    println!(
        "compaction            {} segments in {secs:.2} s: read {:.0} MB/s, wrote {:.0} MB/s ({:.0}% of the disk's write bandwidth); reclaimed {} expired",
        report.segments_rewritten,
        report.bytes_before as f64 / secs / 1e6,
        report.bytes_after as f64 / secs / 1e6,
        report.bytes_after as f64 / secs / 1e6 / disk * 100.0,
        report.reclaimed_expired
    );
    println!(
        "single add latency    quiet p50 {:.2} ms p99 {:.2} ms; during compaction p50 {:.2} ms p99 {:.2} ms ({} adds)",
        percentile(&quiet, 0.5),
        percentile(&quiet, 0.99),
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        during.len()
    );
    let after = store.stats().bytes_on_disk;
    println!(
        "after purge           {after} bytes on disk = {:.2} x the live logical JSON ({live_logical})",
        after as f64 / live_logical as f64
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
