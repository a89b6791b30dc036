//! A read-heavy driver for profiling: loads N W1 items (as benches/compare.rs does, batches of
//! 1,000, without fsync), then runs one read mode for a number of operations and prints the time
//! per operation, wall-clock and on-CPU (user + system time of the process, so that other load on a
//! shared machine counts less). Run it under `perf record` / `perf stat` to see where the time goes.
//!
//! `cargo run --release -p ctxlog-bench --example read_profile -- [resolve|resolve_raw|get|get_raw] [N] [OPS] [READ_THREADS]`
//! (defaults: resolve, 200000, 1000000 resolves or 2000 queries, `Options`' default read threads). `get` and `get_raw` run P4's typed
//! window queries (~1,000 items each).

use std::sync::Arc;
use std::time::Instant;

use ctxlog::{ContextQuery, Durability, ManualClock, Options, RawResolution, Resolution, TimeRange};

use ctxlog_bench::w1;

use w1::{item, mix, BASE_TS, TYPES};

/// User + system CPU seconds of this process so far, from /proc (0 where there is none).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |at: usize| fields.get(at).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "resolve".into());
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let queries = mode.starts_with("get");
    let ops: u64 = args
        .next()
        .map_or(Ok(if queries { 2000 } else { 1_000_000 }), |a| a.parse())?;
    let read_threads: Option<usize> = args.next().map(|a| a.parse()).transpose()?;
    let dir = tempfile::tempdir()?;
    let mut options = Options::new();
    if let Some(threads) = read_threads {
        options = options.read_threads(threads);
    }
    let store = options
        .durability(Durability::Never)
        .clock(Arc::new(ManualClock::new(BASE_TS)))
        .auto_compact(false)
        .open(dir.path())?;
    let mut next = 0;
    while next < n {
        let end = n.min(next + 1000);
        store.add((next..end).map(|i| {
            let mut it = item(i);
            it.hash = None;
            it
        }))?;
        next = end;
    }
    let ids: Vec<String> = (0..ops.min(1_000_000))
        .map(|i| format!("item-{:08}", mix(i ^ 0xabcd) % n))
        .collect();
    let window = |q: u64| -> Result<ContextQuery, ctxlog::Error> {
        let (kind, share) = TYPES[usize::try_from(q % 7).unwrap_or(0)];
        let width = (100_000 / u64::from(share)).min(n);
        let start = BASE_TS + i64::try_from(mix(q ^ 0x5eed) % (n - width + 1)).unwrap_or(0);
        let end = start + i64::try_from(width).unwrap_or(0) - 1;
        Ok(ContextQuery::new()
            .types([kind])
            .time_range(TimeRange::new(start, end)?))
    };
    let (cpu, wall) = (cpu_seconds(), Instant::now());
    let mut answered = 0u64;
    for op in 0..ops {
        let id = ids
            .get(usize::try_from(op).unwrap_or(0) % ids.len().max(1))
            .map_or("", String::as_str);
        answered += match mode.as_str() {
            "resolve" => u64::from(matches!(store.resolve([id])?.first(), Some(Resolution::Found(_)))),
            "resolve_raw" => u64::from(matches!(
                store.resolve_raw([id])?.first(),
                Some(RawResolution::Found(_))
            )),
            "get" => store.get(&window(op)?)?.len() as u64,
            "get_raw" => store.get_raw(&window(op)?)?.len() as u64,
            other => return Err(format!("unknown mode {other:?}").into()),
        };
    }
    let (wall, cpu) = (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    #[allow(clippy::cast_precision_loss)]
    let per = |secs: f64| secs * 1e9 / (if queries { answered } else { ops }) as f64;
    println!(
        "{mode}: {ops} ops, {answered} items, {:.0} ns/{} wall, {:.0} ns on CPU",
        per(wall),
        if queries { "item" } else { "op" },
        per(cpu)
    );
    Ok(())
}
