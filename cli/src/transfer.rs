//! `export` and `import`: a store's items as JSON lines, out and in.
//!
//! Export streams the library's export of a snapshot of now (`Snapshot::export_raw`, or
//! `Snapshot::export_all_versions_raw`: each item's JSON, unparsed): the items in the order their
//! batches committed, read a chunk at a time, so that memory stays bounded whatever the store's
//! size.
//! Import reads JSON lines one at a time and adds them in batches of [`IMPORT_BATCH`].

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

/// `ctxlog import DIR FILE [--register-type NAME[=REGEX]]...` (`-` for stdin).
pub(crate) fn import(dir: &Path, file: &Path, types: &[String]) -> CliResult<()> {
    let started = Instant::now();
    let (input, bar): (Box<dyn Read>, _) = if file.as_os_str() == "-" {
        (Box::new(std::io::stdin().lock()), progress::counter("items"))
    } else {
        let opened = File::open(file).map_err(|e| CliError::io(format!("opening {}", file.display()), &e))?;
        let size = opened.metadata().map_or(0, |m| m.len());
        (Box::new(opened), progress::bytes(size))
    };
    let is_stdin = file.as_os_str() == "-";
    let store = open_or_create(dir)?;
    register_types(&store, types)?;
    let mut reader = BufReader::with_capacity(1 << 16, input);
    let mut imported = Imported::default();
    let mut pending: Vec<Pending> = Vec::with_capacity(IMPORT_BATCH);
    let mut text = String::new();
    let mut line_no: u64 = 0;
    let result = (|| -> CliResult<()> {
        loop {
            text.clear();
            let read = reader
                .read_line(&mut text)
                .map_err(|e| CliError::io(format!("reading line {} of {}", line_no + 1, file.display()), &e))?;
            if read == 0 {
                break;
            }
            line_no += 1;
            if is_stdin {
                bar.inc(1);
            } else {
                bar.inc(read as u64);
            }
            let trimmed = text.trim();
            if trimmed.is_empty() {
                continue;
            }
            let item: ContextItem = serde_json::from_str(trimmed)
                .map_err(|e| CliError::failure(format!("line {line_no}: {e}; {}", imported.resume_hint())))?;
            pending.push(Pending { line: line_no, item });
            if pending.len() == IMPORT_BATCH {
                imported.commit(&store, &mut pending, line_no)?;
            }
        }
        if !pending.is_empty() {
            imported.commit(&store, &mut pending, line_no)?;
        }
        Ok(())
    })();
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
