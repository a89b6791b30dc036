//! Single durable adds beside a bulk loader: one thread adds batches of 5,000 W1 items in a loop
//! while the main thread times 2,000 single `Durability::Immediate` adds, and prints their p50, p90
//! and p99. Shows what a bulk load costs the interactive writers of the same store (group commit
//! must not hold them for a large batch's validation). Run:
//! `cargo run --release -p ctxlog-bench --example mixed_writers`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ctxlog_bench::w1;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(w1::open_durable(dir.path())?);
    let done = Arc::new(AtomicBool::new(false));
    let bulk = {
        let (store, done) = (Arc::clone(&store), Arc::clone(&done));
        std::thread::spawn(move || -> Result<u64, ctxlog::Error> {
            let mut next = 1_000_000u64;
            while !done.load(Ordering::Relaxed) {
                let batch: Vec<_> = (next..next + 5000).map(w1::item).collect();
                next += 5000;
                store.add(batch)?;
            }
            Ok(next - 1_000_000)
        })
    };
    let mut latencies = Vec::with_capacity(2000);
    for n in 0..2000u64 {
        let item = w1::item(n);
        let started = Instant::now();
        store.add([item])?;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    done.store(true, Ordering::Relaxed);
    let bulk_items = bulk.join().map_err(|_| "the bulk loader panicked")??;
    latencies.sort_by(f64::total_cmp);
    let at = |p: usize| latencies.get(latencies.len() * p / 100).copied().unwrap_or(0.0);
    println!(
        "2000 single durable adds beside a bulk loader ({bulk_items} items loaded meanwhile): p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
        at(50),
        at(90),
        at(99)
    );
    Ok(())
}
