//! Durable single adds while a checkpoint is written: loads N W1 items (durable batches of 1,000),
//! then THREADS threads add single items under `Durability::Immediate` for SECONDS, and half way
//! through the main thread writes a checkpoint, as the maintenance thread does once 64 MiB of log
//! have been written since the last one. Prints the adds' latencies (p50, p99, p99.9, max) before,
//! during and after the checkpoint, and how long each of its steps took: what a background
//! checkpoint costs the writers.
//!
//! `cargo run --release -p ctxlog-bench --example checkpoint_stalls -- [THREADS] [N] [SECONDS] [DIR]` (defaults: 8,
//! 200000, 1.0, a temporary directory).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ctxlog_bench::w1;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: u64 = args.next().map_or(Ok(8), |a| a.parse())?;
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let seconds: f64 = args.next().map_or(Ok(1.0), |a| a.parse())?;
    let temp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| temp.path().to_path_buf(), std::path::PathBuf::from);
    let store = Arc::new(w1::open_durable(&dir)?);
    w1::load(&store, n)?;
    // A checkpoint of the load first, so that the one measured is not the maintenance thread's.
    ctxlog::testing::bench::checkpoint(&store)?;

    let stop = Arc::new(AtomicBool::new(false));
    let start_line = Arc::new(Barrier::new(usize::try_from(threads)? + 1));
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, stop, start_line) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&start_line));
            // Far apart id ranges: no thread runs into another's.
            let first = n + (t + 1) * 10_000_000;
            std::thread::spawn(move || -> Result<Vec<(f64, f64)>, ctxlog::Error> {
                let mut done = Vec::new();
                start_line.wait();
                let mut i = first;
                while !stop.load(Ordering::Relaxed) {
                    let item = w1::item(i);
                    i += 1;
                    let at = Instant::now();
                    store.add([item])?;
                    done.push((at.duration_since(started).as_secs_f64(), at.elapsed().as_secs_f64()));
                }
                Ok(done)
            })
        })
        .collect();
    start_line.wait();
    std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
    let checkpoint_from = started.elapsed().as_secs_f64();
    let seq = ctxlog::testing::bench::checkpoint(&store)?;
    let checkpoint_to = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
    stop.store(true, Ordering::Relaxed);
    let mut adds = Vec::new();
    for handle in handles {
        adds.extend(handle.join().map_err(|_| "a writer panicked")??);
    }

    println!(
        "{threads} threads, {} durable single adds in {seconds:.1} s over {n} items; checkpoint at seq {seq} from {:.1} ms to {:.1} ms ({:.1} ms)",
        adds.len(),
        checkpoint_from * 1e3,
        checkpoint_to * 1e3,
        (checkpoint_to - checkpoint_from) * 1e3
    );
    // An add that started before the checkpoint ended and ended after it began overlapped it.
    let during = |(at, took): &(f64, f64)| *at < checkpoint_to && at + took > checkpoint_from;
    for (label, filter) in [
        (
            "before",
            &(|a: &(f64, f64)| a.0 + a.1 <= checkpoint_from) as &dyn Fn(&(f64, f64)) -> bool,
        ),
        ("during", &during),
        ("after", &|a: &(f64, f64)| a.0 >= checkpoint_to),
    ] {
        let mut lat: Vec<f64> = adds.iter().filter(|a| filter(a)).map(|a| a.1).collect();
        lat.sort_by(f64::total_cmp);
        println!(
            "{label:>6}: {:>6} adds, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
            lat.len(),
            w1::quantile_ms(&lat, 0.5),
            w1::quantile_ms(&lat, 0.99),
            w1::quantile_ms(&lat, 0.999),
            lat.last().copied().unwrap_or(0.0) * 1e3
        );
    }
    Ok(())
}
