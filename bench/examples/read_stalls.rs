//! Reads while a bulk load runs: one thread loads N W1 items (batches of 1,000, `Durability::Never`,
//! no background compaction) while another resolves random ids of the first 1,000 without pause.
//! Prints every batch that took more than 15 ms and every resolve that took more than 5 ms, with
//! when it happened: a resolve that waits that long is waiting for the index lock, so this shows
//! what the writer does under it as the store grows.
//!
//! `cargo run --release -p ctxlog-bench --example read_stalls -- [N] [DIR]` (defaults: 1000000, a temporary directory).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ctxlog::{Durability, Options};

use ctxlog_bench::w1;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let temp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| temp.path().to_path_buf(), std::path::PathBuf::from);
    let store = Options::new()
        .durability(Durability::Never)
        .auto_compact(false)
        .open(&dir)?;
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let reader = {
        let (store, done) = (store.clone(), Arc::clone(&done));
        std::thread::spawn(move || -> Result<(u64, Vec<(f64, f64)>), ctxlog::Error> {
            let (mut reads, mut stalls) = (0u64, Vec::new());
            while !done.load(Ordering::Relaxed) {
                reads += 1;
                let id = format!("item-{:08}", w1::mix(reads) % 1000);
                let at = Instant::now();
                store.resolve([id.as_str()])?;
                let ms = at.elapsed().as_secs_f64() * 1e3;
                if ms > 5.0 {
                    stalls.push((started.elapsed().as_secs_f64(), ms));
                }
            }
            Ok((reads, stalls))
        })
    };
    let mut slow = Vec::new();
    for batch in 0..n / 1000 {
        let items: Vec<_> = (batch * 1000..(batch + 1) * 1000).map(w1::item).collect();
        let at = Instant::now();
        store.add(items)?;
        let ms = at.elapsed().as_secs_f64() * 1e3;
        if ms > 15.0 {
            slow.push((batch * 1000, started.elapsed().as_secs_f64(), ms));
        }
    }
    done.store(true, Ordering::Relaxed);
    let (reads, stalls) = reader.join().map_err(|_| "the reader panicked")??;
    println!(
        "{n} items loaded in {:.2} s; {reads} resolves beside them",
        started.elapsed().as_secs_f64()
    );
    for (items, at, ms) in &slow {
        println!("batch at {items} items (t = {at:.2} s) took {ms:.1} ms");
    }
    for (at, ms) in &stalls {
        println!("resolve at t = {at:.2} s took {ms:.1} ms");
    }
    let worst = stalls.iter().map(|(_, ms)| *ms).fold(0.0, f64::max);
    println!("slowest resolve over 5 ms: {worst:.1} ms ({} of them)", stalls.len());
    Ok(())
}
