//! `export` and `import`: a store's items as JSON lines, out and in.
//!
//! Export streams the library's export of a snapshot of now (`Snapshot::export_raw`, or
//! `Snapshot::export_all_versions_raw`: each item's JSON, unparsed): the items in the order their
//! batches committed, read a chunk at a time, so that memory stays bounded whatever the store's
//! size.
//! Import reads and parses JSON lines on one thread, in batches of [`IMPORT_BATCH`], while another
//! adds them: at most [`BATCHES_AHEAD`] batches wait between the two.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::time::Instant;

use ctxlog::{AddOutcome, ContextItem, Store, TypeSpec};

use crate::error::{CliError, CliResult};
use crate::open::{open_or_create, open_read};
use crate::out::write_line;
use crate::progress;

/// Items in one batch of an import.
pub(crate) const IMPORT_BATCH: usize = 1_000;

/// `ctxlog export DIR [--out FILE] [--all-versions]`: the library's streaming export of a snapshot
/// of now, one JSON line per item.
pub(crate) fn export(dir: &Path, out: Option<&Path>, all_versions: bool) -> CliResult<()> {
    let store = open_read(dir)?;
    let (writer, target): (Box<dyn Write>, String) = match out {
        Some(path) => {
            let file = File::create(path).map_err(|e| CliError::io(format!("creating {}", path.display()), &e))?;
            (Box::new(file), path.display().to_string())
        }
        None => (Box::new(std::io::stdout().lock()), "stdout".to_owned()),
    };
    let mut writer = BufWriter::with_capacity(1 << 16, writer);
    let snapshot = store.snapshot();
    // Each item as its JSON, unparsed: the bytes `serde_json::to_string(&item)` would give.
    let items = if all_versions {
        snapshot.export_all_versions_raw()
    } else {
        snapshot.export_raw()
    };
    let bar = progress::items(items.total() as u64, "items");
    let mut exported: u64 = 0;
    let result = (|| -> CliResult<()> {
        for item in items {
            write_line(&mut writer, item?.as_str(), &target)?;
            exported += 1;
            bar.inc(1);
        }
        writer
            .flush()
            .map_err(|e| CliError::io(format!("writing to {target}"), &e))
    })();
    bar.finish_and_clear();
    result?;
    eprintln!("exported {exported} items");
    Ok(())
}

/// One item of an import's current batch, with the line it came from.
struct Pending {
    line: u64,
    item: ContextItem,
}

/// What an import has done so far.
#[derive(Default)]
struct Imported {
    added: u64,
    unchanged: u64,
    /// The last line of the last committed batch (0: none).
    committed_through: u64,
}

impl Imported {
    /// What a failed import says about what is committed, and how to go on.
    fn resume_hint(&self) -> String {
        if self.committed_through == 0 {
            "nothing was committed; fix the line and rerun the import".to_owned()
        } else {
            format!(
                "lines 1..={} are committed; rerun with the rest of the file from line {} (or the whole file: \
                 items already stored are left unchanged)",
                self.committed_through,
                self.committed_through + 1
            )
        }
    }

    /// Adds the batch `pending` (read through line `last_line`) to `store`.
    fn commit(&mut self, store: &Store, pending: &mut Vec<Pending>, last_line: u64) -> CliResult<()> {
        let lines: Vec<u64> = pending.iter().map(|p| p.line).collect();
        let items = pending.drain(..).map(|p| p.item);
        match store.add(items) {
            Ok(outcomes) => {
                for outcome in outcomes {
                    match outcome {
                        AddOutcome::Unchanged { .. } => self.unchanged += 1,
                        _ => self.added += 1,
                    }
                }
                self.committed_through = last_line;
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                let located = e.index().and_then(|i| lines.get(i).map(|line| (i, *line)));
                let message = match located {
                    Some((i, line)) => {
                        let reason = message.strip_prefix(&format!("item {i}: ")).unwrap_or(&message);
                        format!("line {line}: {reason}")
                    }
                    None => crate::error::describe(&e),
                };
                Err(CliError::failure(format!("{message}; {}", self.resume_hint())))
            }
        }
    }
}

/// Registers each of `types` (`NAME` or `NAME=REGEX`, the pattern its ids must match) in `store`.
fn register_types(store: &Store, types: &[String]) -> CliResult<()> {
    for text in types {
        let spec = match text.split_once('=') {
            Some((name, pattern)) => TypeSpec::new(name).id_pattern(pattern),
            None => TypeSpec::new(text.as_str()),
        };
        store.register_type(spec).map_err(|e| match e {
            ctxlog::Error::Invalid { .. } => CliError::usage(format!("--register-type {text}: {e}")),
            other => CliError::from(other),
        })?;
    }
    Ok(())
}

/// What the import's reading thread hands over: a batch of parsed items, or why it stopped.
enum Parsed {
    /// Up to [`IMPORT_BATCH`] items, the last of them read from line `last_line`.
    Batch { items: Vec<Pending>, last_line: u64 },
    /// Line `line` is not an item (or could not be read): nothing after the batches before it.
    Bad { message: String },
}

/// Batches parsed ahead of the one being added: enough to go on parsing while the store syncs, and a bound on
/// memory whatever the file's size.
const BATCHES_AHEAD: usize = 8;

/// Reads and parses JSON lines from `input` into batches, on the calling thread, handing each to
/// `send` (which says false once nobody listens).
fn read_batches(
    input: Box<dyn Read + Send>,
    file: &Path,
    is_stdin: bool,
    bar: &indicatif::ProgressBar,
    send: &dyn Fn(Parsed) -> bool,
) {
    let mut reader = BufReader::with_capacity(1 << 16, input);
    let mut items: Vec<Pending> = Vec::with_capacity(IMPORT_BATCH);
    let mut text = String::new();
    let mut line_no: u64 = 0;
    loop {
        text.clear();
        let read = match reader.read_line(&mut text) {
            Ok(read) => read,
            Err(e) => {
                let message =
                    CliError::io(format!("reading line {} of {}", line_no + 1, file.display()), &e).to_string();
                send(Parsed::Bad { message });
                return;
            }
        };
        if read == 0 {
            break;
        }
        line_no += 1;
        bar.inc(if is_stdin { 1 } else { read as u64 });
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        match serde_json::from_str::<ContextItem>(trimmed) {
            Ok(item) => items.push(Pending { line: line_no, item }),
            Err(e) => {
                send(Parsed::Bad {
                    message: format!("line {line_no}: {e}"),
                });
                return;
            }
        }
        if items.len() == IMPORT_BATCH {
            let batch = std::mem::replace(&mut items, Vec::with_capacity(IMPORT_BATCH));
            if !send(Parsed::Batch {
                items: batch,
                last_line: line_no,
            }) {
                return;
            }
        }
    }
    if !items.is_empty() {
        send(Parsed::Batch {
            items,
            last_line: line_no,
        });
    }
}

/// `ctxlog import DIR FILE [--register-type NAME[=REGEX]]...` (`-` for stdin). One thread reads and
/// parses the lines, [`BATCHES_AHEAD`] batches ahead at the most, while this one adds them.
pub(crate) fn import(dir: &Path, file: &Path, types: &[String]) -> CliResult<()> {
    let started = Instant::now();
    let is_stdin = file.as_os_str() == "-";
    let (input, bar): (Box<dyn Read + Send>, _) = if is_stdin {
        (Box::new(std::io::stdin()), progress::counter("items"))
    } else {
        let opened = File::open(file).map_err(|e| CliError::io(format!("opening {}", file.display()), &e))?;
        let size = opened.metadata().map_or(0, |m| m.len());
        (Box::new(opened), progress::bytes(size))
    };
    let store = open_or_create(dir)?;
    register_types(&store, types)?;
    let mut imported = Imported::default();
    let (sender, batches) = std::sync::mpsc::sync_channel::<Parsed>(BATCHES_AHEAD);
    let result = std::thread::scope(|scope| -> CliResult<()> {
        let reader_bar = bar.clone();
        scope.spawn(move || {
            read_batches(input, file, is_stdin, &reader_bar, &|read| sender.send(read).is_ok());
        });
        // Dropping `batches` on an error tells the reading thread to stop.
        for read in batches {
            match read {
                Parsed::Batch { mut items, last_line } => imported.commit(&store, &mut items, last_line)?,
                Parsed::Bad { message } => {
                    return Err(CliError::failure(format!("{message}; {}", imported.resume_hint())));
                }
            }
        }
        Ok(())
    });
    bar.finish_and_clear();
    result?;
    store.flush()?;
    eprintln!(
        "imported {} items ({} added, {} unchanged) in {:.2} s",
        imported.added + imported.unchanged,
        imported.added,
        imported.unchanged,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
