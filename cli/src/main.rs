//! `ctxlog`: a command-line tour of the engine.
//!
//! `ctxlog demo [DIR]` writes a few thousand realistic context items into a store (a fresh directory
//! under the system temp dir unless DIR is given), then queries, resolves, isolates sessions, pins a
//! snapshot with a digest and a receipt of its resolve, changes the store under it, compacts, reopens
//! from a checkpoint, replays the receipt, unpins and compacts again, and verifies the store, printing
//! what each step found and how long it took. The store's clock is a `ManualClock` standing at
//! 2024-05-10T10:00:00Z, the data comes from a seeded generator and background compaction is off, so
//! every run on a fresh directory prints the same answers (timings aside).
//!
//! This file parses the arguments and runs the command; the demo's steps are in `demo.rs`, its
//! seeded data in `data.rs`, and how it prints what it found in `report.rs`.

mod data;
mod demo;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ctxlog",
    version,
    about = "ctxlog: an embedded store for the context AI applications hand to their models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes a few thousand items into a store and shows queries, resolves, sessions, pinned
    /// snapshots with digests and receipts, compaction, reopening from a checkpoint and verification,
    /// with counts and timings.
    Demo {
        /// Store directory, empty or new. Default: a fresh directory under the system temp dir.
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { dir } => demo::run(dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ctxlog: error: {message}");
            ExitCode::FAILURE
        }
    }
}
