//! `ctxlog`: the command-line tool of the ctxlog storage engine.
//!
//! One binary with subcommands, each taking a store directory `DIR`:
//!
//! - `demo [DIR]`: a tour of the engine on a fresh store (its steps are in `demo.rs`, its seeded
//!   data in `data.rs`). The store's clock is a `ManualClock` standing at 2024-05-10T10:00:00Z, the
//!   data comes from a seeded generator and background compaction is off, so every run on a fresh
//!   directory prints the same answers (timings aside).
//! - looking inside a store without changing a byte of it (`inspect.rs`, `query.rs`, `feed.rs`):
//!   `stats`, `verify`, `snapshots`, `get` (a query), `resolve` (references), `changes` (the change
//!   feed), and `export`;
//! - moving items out and in (`transfer.rs`): `export` (the library's streaming export, in commit
//!   order) and `import` (JSON lines in atomic batches of 1,000; a rerun leaves stored items
//!   unchanged), as JSON lines;
//! - maintenance (`maintain.rs`): `compact`, `pin`, `unpin`.
//!
//! Items, resolutions and changes print as JSON lines; reports print as a short aligned table, or
//! as one JSON object with `--json`. Long work draws a progress bar on stderr when stderr is a
//! terminal (`progress.rs`). Every store is opened in `open.rs`: read-only commands open it with
//! `Options::read_only` and refuse a directory that holds no store without creating or changing
//! it; `import` creates a store only in a missing or empty directory; background compaction is
//! always off. Errors print as one line `ctxlog: error: ...` saying what to do (`error.rs`); the
//! exit status is 0 done, 1 failed or found problems, 2 bad usage.
//!
//! This file parses the arguments and dispatches to the modules.

mod data;
mod demo;
mod error;
mod feed;
mod inspect;
mod maintain;
mod open;
mod out;
mod progress;
mod query;
mod report;
mod transfer;

/// The allocator of the command (not of the library, whose users choose their own): imports
/// allocate items on the reading thread and the store frees them on another.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::{CliError, CliResult};

#[derive(Parser)]
#[command(
    name = "ctxlog",
    version,
    about = "ctxlog: an embedded store for the context AI applications hand to their models",
    after_help = "Exit status: 0 done; 1 the command failed or found problems; 2 bad usage."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A tour of the engine on a fresh store, with counts and timings.
    ///
    /// Writes a few thousand items into a store and shows queries, resolves, sessions, pinned
    /// snapshots with digests and receipts, compaction, reopening from a checkpoint and verification,
    /// with counts and timings.
    Demo {
        /// Store directory, empty or new. Default: a fresh directory under the system temp dir.
        dir: Option<PathBuf>,
    },
    /// Figures about a store.
    ///
    /// Items, versions, sessions, segments, bytes on disk, index bytes per item, pins, last seq,
    /// where the change feed starts, and what opening the store found.
    Stats {
        /// Store directory.
        dir: PathBuf,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Reads every record, checkpoint and pin back; exit 1 if anything is damaged.
    ///
    /// Checks CRCs and content hashes; prints each problem as FILE:OFFSET: reason and exits 1 if
    /// there is any. A store too damaged to open fails with the file and offset of the damage.
    Verify {
        /// Store directory.
        dir: PathBuf,
        /// One JSON object instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// A query: items as JSON lines.
    ///
    /// The latest version of each live item that passes every filter, as JSON lines, oldest first
    /// by (timestamp, id) unless --newest-first.
    Get {
        /// Store directory.
        dir: PathBuf,
        #[command(flatten)]
        args: query::GetArgs,
    },
    /// Resolves references (`id` or `id@version`): one resolution per line, as JSON.
    Resolve {
        /// Store directory.
        dir: PathBuf,
        /// References: `id` or `id@version`.
        #[arg(required = true, value_name = "REF")]
        refs: Vec<String>,
        /// Resolve as session S sees the store.
        #[arg(long, value_name = "S")]
        session: Option<String>,
    },
    /// Every live item (or every stored version) as JSON lines, in seq order.
    ///
    /// `ctxlog import` reads them back (types registered in this store must be registered in the
    /// other with `import --register-type`). Prints how many items it wrote on stderr.
    Export {
        /// Store directory.
        dir: PathBuf,
        /// Write to FILE (created or truncated) instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Every version the store still holds of each id it shows (expired ones included),
        /// oldest first: each id's history since its last delete, as far as compaction kept it.
        #[arg(long)]
        all_versions: bool,
    },
    /// Adds items from a file of JSON lines, in batches of 1,000.
    ///
    /// One item per line, as `ctxlog export` writes them; each batch of 1,000 is atomic. An item that does not parse or is refused stops the import and names
    /// its line; the batches before it stay committed and the command says up to which line. Items
    /// already stored with the same version and content are left unchanged, so running the same file
    /// again is harmless. Creates the store in a missing or empty directory.
    Import {
        /// Store directory: a store, or a missing or empty directory.
        dir: PathBuf,
        /// The JSON lines file; `-` reads stdin.
        file: PathBuf,
        /// Registers type NAME first (its ids must match REGEX if given), for items of types
        /// other than the built-in ones: an export does not carry the source store's registered
        /// types. Registering a type again with the same pattern does nothing. Repeat for several.
        #[arg(long = "register-type", value_name = "NAME[=REGEX]")]
        register_types: Vec<String>,
    },
    /// Compacts the store and prints the report.
    ///
    /// Reclaims expired, superseded and deleted versions that no pinned snapshot still sees.
    Compact {
        /// Store directory.
        dir: PathBuf,
        /// One JSON object instead of the report.
        #[arg(long)]
        json: bool,
    },
    /// The pinned snapshots, with seq, time, digest and bytes kept.
    Snapshots {
        /// Store directory.
        dir: PathBuf,
        /// A JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Pins a snapshot of the store as it is now under NAME.
    Pin {
        /// Store directory.
        dir: PathBuf,
        /// The pin's name.
        name: String,
        /// One JSON object instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Unpins the snapshot NAME (exit 1 if there is none).
    ///
    /// The next compaction may then reclaim what it kept.
    Unpin {
        /// Store directory.
        dir: PathBuf,
        /// The pin's name.
        name: String,
        /// One JSON object instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// The change feed: every change after a seq, as JSON lines.
    Changes {
        /// Store directory.
        dir: PathBuf,
        /// Changes after this seq. Default: the oldest change the store still keeps.
        #[arg(long, value_name = "SEQ")]
        after: Option<u64>,
    },
}

/// Runs one parsed command.
fn run(command: Command) -> CliResult<()> {
    match command {
        Command::Demo { dir } => demo::run(dir).map_err(CliError::failure),
        Command::Stats { dir, json } => inspect::stats(&dir, json),
        Command::Verify { dir, json } => inspect::verify(&dir, json),
        Command::Get { dir, args } => query::get(&dir, &args),
        Command::Resolve { dir, refs, session } => query::resolve(&dir, &refs, session.as_deref()),
        Command::Export { dir, out, all_versions } => transfer::export(&dir, out.as_deref(), all_versions),
        Command::Import {
            dir,
            file,
            register_types,
        } => transfer::import(&dir, &file, &register_types),
        Command::Compact { dir, json } => maintain::compact(&dir, json),
        Command::Snapshots { dir, json } => inspect::snapshots(&dir, json),
        Command::Pin { dir, name, json } => maintain::pin(&dir, &name, json),
        Command::Unpin { dir, name, json } => maintain::unpin(&dir, &name, json),
        Command::Changes { dir, after } => feed::changes(&dir, after),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if !error.message.is_empty() {
                eprintln!("ctxlog: error: {}", error.message);
            }
            ExitCode::from(error.code)
        }
    }
}
