//! A driver for durable single-item adds, for A/B runs and profiles of group commit: loads N W1
//! items (batches of 1,000), then times OPS single `Durability::Immediate` adds from one thread and
//! OPS more from THREADS threads at once, and prints both rates and their ratio. The items are
//! generated before the clock starts (the threads meet at a barrier), as in benches/compare.rs.
//! The compare harness's P2 runs 2,000 adds in ~50 ms, too short to tell two builds apart on a
//! noisy machine; this runs as many as asked.
//!
//! `cargo run --release -p ctxlog-bench --example group_commit -- [THREADS] [OPS] [N]` (defaults: 8, 20000, 20000).

use std::sync::{Arc, Barrier};
use std::time::Instant;

use ctxlog::ContextItem;

use ctxlog_bench::w1;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: u64 = args.next().map_or(Ok(8), |a| a.parse())?;
    let ops: u64 = args.next().map_or(Ok(20_000), |a| a.parse())?;
    let n: u64 = args.next().map_or(Ok(20_000), |a| a.parse())?;
    if threads == 0 || ops < threads {
        return Err("THREADS must be at least 1 and OPS at least THREADS".into());
    }
    let dir = tempfile::tempdir()?;
    let store = Arc::new(w1::open_durable(dir.path())?);
    w1::load(&store, n)?;
    let mut next = n;

    // One thread: the rate over the wall time of the adds alone.
    let items: Vec<ContextItem> = (next..next + ops).map(w1::item).collect();
    next += ops;
    let started = Instant::now();
    for item in items {
        store.add([item])?;
    }
    let one = ops as f64 / started.elapsed().as_secs_f64();

    // THREADS threads at once, OPS / THREADS adds each.
    let per_thread = ops / threads;
    let start_line = Arc::new(Barrier::new(usize::try_from(threads)? + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            let start_line = Arc::clone(&start_line);
            let first = next + t * per_thread;
            std::thread::spawn(move || -> Result<(), ctxlog::Error> {
                let items: Vec<ContextItem> = (first..first + per_thread).map(w1::item).collect();
                start_line.wait();
                for item in items {
                    store.add([item])?;
                }
                Ok(())
            })
        })
        .collect();
    start_line.wait();
    let started = Instant::now();
    for handle in handles {
        handle.join().map_err(|_| "an adding thread panicked")??;
    }
    let many = (per_thread * threads) as f64 / started.elapsed().as_secs_f64();
    println!(
        "one thread {one:.0} adds/s; {threads} threads {many:.0} adds/s; ratio {:.2}x",
        many / one
    );
    Ok(())
}
