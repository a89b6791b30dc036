//! The `ctxlog` command's transfers against the library and the machine, on the same W1 items:
//! `import` of a JSON-lines file against the library's bulk load of the same items (parsing
//! excluded), `export` in items/s, `verify` in MB/s of segments against a read of the same files
//! from the page cache and a single-threaded SHA-256 over them (its CPU bound), and the import's peak
//! RSS (its `VmHWM`, watched while it runs). Medians of `--runs` runs (default 3), each command a process.
//!
//! ```text
//! cargo build --release -p ctxlog-cli
//! cargo run --release -p ctxlog-bench --example transfer -- --n 1000000 --runs 3
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ctxlog::{ContextItem, Options};
use ctxlog_bench::w1;
use sha2::Digest;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Items per batch, the command's and the library run's.
const BATCH: usize = 1000;

struct Args {
    n: u64,
    runs: usize,
    ctxlog: PathBuf,
}

fn args() -> Res<Args> {
    let mut args = Args {
        n: 1_000_000,
        runs: 3,
        ctxlog: PathBuf::from("target/release/ctxlog"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--n" => args.n = value.parse()?,
            "--runs" => args.runs = value.parse()?,
            "--ctxlog" => args.ctxlog = PathBuf::from(value),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if !args.ctxlog.exists() {
        return Err(format!(
            "{} not found: build it first (cargo build --release -p ctxlog-cli)",
            args.ctxlog.display()
        )
        .into());
    }
    Ok(args)
}

/// The median of `xs` (0 for none).
fn median(xs: Vec<f64>) -> f64 {
    ctxlog_bench::charts::median(xs).unwrap_or(0.0)
}

/// Runs the command with `args`, failing unless it succeeds; its wall time.
fn run(ctxlog: &Path, args: &[&str]) -> Res<Duration> {
    let started = Instant::now();
    let output = Command::new(ctxlog).args(args).output()?;
    let took = started.elapsed();
    if !output.status.success() {
        return Err(format!("ctxlog {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr)).into());
    }
    Ok(took)
}

/// The library's bulk load of the file's items into a fresh store in `dir`: the time spent in
/// `add` (parsing the lines, a batch at a time, is not counted).
fn library_load(file: &Path, dir: &Path) -> Res<Duration> {
    let store = Options::new().auto_compact(false).open(dir)?;
    let mut lines = BufReader::new(std::fs::File::open(file)?).lines();
    let mut in_add = Duration::ZERO;
    loop {
        let mut batch: Vec<ContextItem> = Vec::with_capacity(BATCH);
        for line in lines.by_ref().take(BATCH) {
            batch.push(serde_json::from_str(&line?)?);
        }
        if batch.is_empty() {
            break;
        }
        let started = Instant::now();
        store.add(batch)?;
        in_add += started.elapsed();
    }
    Ok(in_add)
}

/// The segment files of a store, and their bytes in all.
fn segments(dir: &Path) -> Res<(Vec<PathBuf>, u64)> {
    let mut files = Vec::new();
    let mut bytes = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "seg") {
            bytes += std::fs::metadata(&path)?.len();
            files.push(path);
        }
    }
    Ok((files, bytes))
}

/// Reads `files` whole (from the page cache, read just before), and hashes them with SHA-256 on
/// one thread: (read time, hash time).
fn read_and_hash(files: &[PathBuf]) -> Res<(Duration, Duration)> {
    let mut buf = vec![0u8; 1 << 20];
    let started = Instant::now();
    for file in files {
        let mut f = std::fs::File::open(file)?;
        while f.read(&mut buf)? > 0 {}
    }
    let read = started.elapsed();
    let mut hasher = sha2::Sha256::new();
    let started = Instant::now();
    for file in files {
        let mut f = std::fs::File::open(file)?;
        loop {
            let got = f.read(&mut buf)?;
            if got == 0 {
                break;
            }
            hasher.update(&buf[..got]);
        }
    }
    std::hint::black_box(hasher.finalize());
    Ok((read, started.elapsed()))
}

/// Runs the command with `args` as [`run`] does, watching its peak resident set (`VmHWM`, KiB)
/// every 20 ms while it runs: (wall time, the last peak seen).
fn run_watched(ctxlog: &Path, args: &[&str]) -> Res<(Duration, u64)> {
    let started = Instant::now();
    let mut child = Command::new(ctxlog)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok());
            peak = peak.max(hwm.unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    if !status.success() {
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            pipe.read_to_string(&mut stderr)?;
        }
        return Err(format!("ctxlog {}: {stderr}", args.join(" ")).into());
    }
    Ok((took, peak))
}

#[allow(clippy::cast_precision_loss)]
fn main() -> Res<()> {
    let args = args()?;
    let work = tempfile::tempdir()?;
    let file = work.path().join("items.jsonl");
    {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&file)?);
        for i in 0..args.n {
            writeln!(out, "{}", serde_json::to_string(&w1::item(i))?)?;
        }
    }
    let file_bytes = std::fs::metadata(&file)?.len();
    println!(
        "{} W1 items, {:.1} MB of JSON lines, {} runs, batches of {BATCH}",
        args.n,
        file_bytes as f64 / 1e6,
        args.runs
    );
    let n = args.n as f64;
    let (mut library, mut export, mut verify, mut read, mut hash) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut store_bytes = 0;
    let mut exported_items = 0;
    let mut import_peak_kib = 0;
    let mut import = |cli_dir: &Path| -> Res<f64> {
        let (took, peak) = run_watched(&args.ctxlog, &["import", path(cli_dir)?, path(&file)?])?;
        import_peak_kib = import_peak_kib.max(peak);
        Ok(n / took.as_secs_f64())
    };
    let mut imports = Vec::new();
    for run_no in 0..args.runs {
        let lib_dir = work.path().join(format!("library-{run_no}"));
        let cli_dir = work.path().join(format!("command-{run_no}"));
        let exported = work.path().join("exported.jsonl");
        // Alternate which goes first, so neither always meets a fresher page cache.
        if run_no % 2 == 0 {
            library.push(n / library_load(&file, &lib_dir)?.as_secs_f64());
            imports.push(import(&cli_dir)?);
        } else {
            imports.push(import(&cli_dir)?);
            library.push(n / library_load(&file, &lib_dir)?.as_secs_f64());
        }
        std::fs::remove_dir_all(&lib_dir)?;
        // W1 gives some items a TTL: those expired by now are not exported.
        let took = run(&args.ctxlog, &["export", path(&cli_dir)?, "--out", path(&exported)?])?;
        let exported_lines = BufReader::new(std::fs::File::open(&exported)?).lines().count();
        exported_items = exported_lines;
        export.push(exported_lines as f64 / took.as_secs_f64());
        std::fs::remove_file(&exported)?;
        let (files, bytes) = segments(&cli_dir)?;
        store_bytes = bytes;
        let (read_time, hash_time) = read_and_hash(&files)?;
        read.push(bytes as f64 / 1e6 / read_time.as_secs_f64());
        hash.push(bytes as f64 / 1e6 / hash_time.as_secs_f64());
        verify.push(bytes as f64 / 1e6 / run(&args.ctxlog, &["verify", path(&cli_dir)?])?.as_secs_f64());
        std::fs::remove_dir_all(&cli_dir)?;
        println!(
            "run {run_no}: library {:.0}/s, import {:.0}/s, export {:.0}/s, verify {:.0} MB/s",
            library.last().unwrap_or(&0.0),
            imports.last().unwrap_or(&0.0),
            export.last().unwrap_or(&0.0),
            verify.last().unwrap_or(&0.0)
        );
    }
    let (library, import) = (median(library), median(imports));
    println!();
    println!("| measure | figure | against | ratio |");
    println!("|---|---:|---|---:|");
    println!(
        "| import, items/s (process wall time) | {import:.0} | library bulk load {library:.0} items/s | {:.2} |",
        import / library
    );
    println!(
        "| export of the {exported_items} live items, items/s (process wall time) | {:.0} | target 500,000 | |",
        median(export)
    );
    let (verify, read, hash) = (median(verify), median(read), median(hash));
    println!(
        "| verify, MB/s of {:.0} MB of segments | {verify:.0} | page-cache read {read:.0} MB/s; SHA-256 one thread {hash:.0} MB/s | {:.2} / {:.2} |",
        store_bytes as f64 / 1e6,
        verify / read,
        verify / hash
    );
    println!(
        "| import's peak RSS, MiB | {:.0} | | |",
        import_peak_kib as f64 / 1024.0
    );
    Ok(())
}

fn path(p: &Path) -> Res<&str> {
    p.to_str().ok_or_else(|| format!("{} is not UTF-8", p.display()).into())
}
