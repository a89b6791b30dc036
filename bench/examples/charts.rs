//! Draws the comparison harness's results as SVG charts (plotters, SVG backend only).
//!
//! ```text
//! cargo run --release -p ctxlog-bench --example charts -- --in target/compare-results.jsonl --out docs/charts
//! ```
//!
//! Reads the harness's JSON lines (`benches/compare.rs`, `--out` there; `bench/target/compare-results.jsonl`
//! by default), takes the newest invocation's engine records (same `started` stamp and `n` as the last
//! one) and each figure's median across its runs, as the harness's table does, and writes into the
//! `--out` folder:
//!
//! - `p1.svg` … `p7.svg`: one chart per phase, a panel of bars per headline figure (P1 items/s and
//!   MB/s; P2 adds/s with 1 and 8 threads and the 8-thread p99; P3 resolves/s parsed and raw; P4
//!   window-query items/s parsed and raw; P5 close and reopen ms; P6 bytes on disk, and per byte of
//!   JSON live and after a reopen; P7 expire + reclaim seconds, bytes after, and per byte of live
//!   JSON), ctxlog first and outlined, then sled, redb, sqlite, fjall, each value printed on its bar;
//! - `latency-p2.svg`: the durable add latency distributions, 1 thread and 8 threads, one line per
//!   engine through the quantiles of `LATENCY_QUANTILES` on a "nines" axis (p90, p99, p99.9, max),
//!   log-scale ms;
//! - `latency-p3.svg`: the same for P3's resolves (one in 16 timed), parsed and raw, in µs;
//! - `summary.svg`: ctxlog's ratio to the best other engine per headline figure (> 1: ctxlog ahead).
//!
//! Each engine has one colour in every chart. A chart whose figures are all missing (a phase left
//! out with `--phases`) is not written.

use std::path::PathBuf;

use ctxlog_bench::charts::{newest_set, parse_jsonl, render_all, Res};

fn run() -> Res<()> {
    let mut input = PathBuf::from("target/compare-results.jsonl");
    let mut out = PathBuf::from("docs/charts");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--in" => input = PathBuf::from(value()?),
            "--out" => out = PathBuf::from(value()?),
            "--help" | "-h" => {
                println!("charts [--in RESULTS.jsonl] [--out DIR]");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    let text = std::fs::read_to_string(&input).map_err(|e| format!("{}: {e}", input.display()))?;
    let records = parse_jsonl(&text).map_err(|e| format!("{}: {e}", input.display()))?;
    let set = newest_set(&records).ok_or_else(|| format!("{}: no engine results", input.display()))?;
    println!(
        "{}: {} ({} records; engines {})",
        input.display(),
        set.describe(),
        set.records.len(),
        set.engines.join(", ")
    );
    for path in render_all(&set, &out)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn main() {
    if let Err(err) = run() {
        eprintln!("charts: {err}");
        std::process::exit(1);
    }
}
