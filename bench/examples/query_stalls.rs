//! Durable single adds while queries read: loads N W1 items (durable batches of 1,000), then WRITERS
//! threads add single items under `Durability::Immediate` for SECONDS alone, and SECONDS more while
//! READERS threads run P4's queries (one type, a time window of ~1,000 items) without pause, parsed
//! (`get`) or raw (`get_raw`). Prints the adds' latencies (p50, p99, p99.9, max) in each half and the
//! readers' rate: what long reads cost the writers, and the readers what the writers cost them.
//!
//! `cargo run --release -p ctxlog-bench --example query_stalls -- [WRITERS] [READERS] [get|get_raw] [N] [SECONDS]`
//! (defaults: 2, 1, get, 200000, 2.0).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxlog::{ContextQuery, Store, TimeRange};

use ctxlog_bench::w1;

/// P4's query `q` over the first `n` items: a type and a window of ~1,000 of its items.
fn window(q: u64, n: u64) -> ctxlog::Result<ContextQuery> {
    let (kind, share) = w1::TYPES[usize::try_from(q % 7).unwrap_or(0)];
    let width = (100_000 / u64::from(share)).min(n);
    let start = w1::BASE_TS + i64::try_from(w1::mix(q ^ 0x5eed) % (n - width + 1)).unwrap_or(0);
    let end = start + i64::try_from(width).unwrap_or(0) - 1;
    Ok(ContextQuery::new()
        .types([kind])
        .time_range(TimeRange::new(start, end)?))
}

/// Runs `writers` threads of durable single adds (ids from `first` on) for `seconds`; returns each
/// add's latency in seconds, sorted, and the next unused id.
fn adds(store: &Arc<Store>, writers: u64, first: u64, seconds: f64) -> Result<(Vec<f64>, u64), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..writers)
        .map(|t| {
            let (store, stop) = (Arc::clone(store), Arc::clone(&stop));
            // Far apart id ranges: no thread runs into another's.
            let mut i = first + t * 10_000_000;
            std::thread::spawn(move || -> ctxlog::Result<Vec<f64>> {
                let mut took = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let item = w1::item(i);
                    i += 1;
                    let at = Instant::now();
                    store.add([item])?;
                    took.push(at.elapsed().as_secs_f64());
                }
                Ok(took)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for handle in handles {
        all.extend(
            handle
                .join()
                .map_err(|_| "a writer panicked".to_owned())?
                .map_err(|e| e.to_string())?,
        );
    }
    all.sort_by(f64::total_cmp);
    Ok((all, first + writers * 10_000_000))
}

fn report(label: &str, lat: &[f64], seconds: f64) {
    println!(
        "{label:>13}: {:>6} adds ({:>6.0}/s), p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        lat.len(),
        f64::from(u32::try_from(lat.len()).unwrap_or(u32::MAX)) / seconds,
        w1::quantile_ms(lat, 0.5),
        w1::quantile_ms(lat, 0.99),
        w1::quantile_ms(lat, 0.999),
        lat.last().copied().unwrap_or(0.0) * 1e3
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let writers: u64 = args.next().map_or(Ok(2), |a| a.parse())?;
    let readers: u64 = args.next().map_or(Ok(1), |a| a.parse())?;
    let mode = args.next().unwrap_or_else(|| "get".to_owned());
    if mode != "get" && mode != "get_raw" {
        return Err(format!("mode must be get or get_raw, not {mode}").into());
    }
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let seconds: f64 = args.next().map_or(Ok(2.0), |a| a.parse())?;
    let temp = tempfile::tempdir()?;
    let store = Arc::new(w1::open_durable(temp.path())?);
    w1::load(&store, n)?;
    ctxlog::testing::bench::checkpoint(&store)?;

    let (alone, next) = adds(&store, writers, n + 10_000_000, seconds)?;

    let stop = Arc::new(AtomicBool::new(false));
    let items = Arc::new(AtomicU64::new(0));
    let query_times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader_handles: Vec<_> = (0..readers)
        .map(|r| {
            let (store, stop, items, query_times) = (
                Arc::clone(&store),
                Arc::clone(&stop),
                Arc::clone(&items),
                Arc::clone(&query_times),
            );
            let mode = mode.clone();
            std::thread::spawn(move || -> ctxlog::Result<()> {
                let mut q = r * 1_000_003;
                let mut took = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let query = window(q, n)?;
                    q += 1;
                    let at = Instant::now();
                    let got = if mode == "get" {
                        store.get(&query)?.len()
                    } else {
                        store.get_raw(&query)?.len()
                    };
                    took.push(at.elapsed().as_secs_f64());
                    items.fetch_add(u64::try_from(got).unwrap_or(0), Ordering::Relaxed);
                }
                query_times
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend(took);
                Ok(())
            })
        })
        .collect();
    let started = Instant::now();
    let (with_reads, _) = adds(&store, writers, next, seconds)?;
    stop.store(true, Ordering::Relaxed);
    for handle in reader_handles {
        handle.join().map_err(|_| "a reader panicked")??;
    }
    let read_for = started.elapsed().as_secs_f64();
    let mut queries = query_times
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    queries.sort_by(f64::total_cmp);

    println!("{writers} writers of durable single adds over {n} items, {seconds:.1} s alone, then {seconds:.1} s beside {readers} {mode} readers");
    report("alone", &alone, seconds);
    report("beside reads", &with_reads, seconds);
    #[allow(clippy::cast_precision_loss)]
    let item_rate = items.load(Ordering::Relaxed) as f64 / read_for;
    println!(
        "{:>13}: {:>6} queries, {item_rate:.0} items/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        "reads",
        queries.len(),
        w1::quantile_ms(&queries, 0.5),
        w1::quantile_ms(&queries, 0.99),
        queries.last().copied().unwrap_or(0.0) * 1e3
    );
    Ok(())
}
