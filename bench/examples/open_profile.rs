//! Opens an existing store N times and prints the open time; with `replay`, its checkpoints are
//! removed first so that each open replays the whole log.
//! With `once`, it opens one time and exits without closing (no checkpoint is written), so that
//! `/usr/bin/time` measures the open alone.
//! `cargo run --release -p ctxlog-bench --example open_profile -- DIR [N] [replay|once]`.
use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("DIR")?;
    let n: u32 = args.next().map_or(Ok(3), |a| a.parse())?;
    let mode = args.next().unwrap_or_default();
    let replay = mode == "replay";
    for _ in 0..n {
        if replay {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "idx") {
                    std::fs::remove_file(path)?;
                }
            }
        }
        let started = Instant::now();
        let store = ctxlog::Options::new().auto_compact(false).open(&dir)?;
        let open = started.elapsed();
        let stats = store.stats();
        println!(
            "open {:.3} s, checkpoint {:?}, frames {}",
            open.as_secs_f64(),
            stats.recovery.checkpoint_seq,
            stats.recovery.frames
        );
        if mode == "once" {
            std::process::exit(0);
        }
        drop(store);
    }
    Ok(())
}
