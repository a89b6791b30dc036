//! `export` and `import`: a store's items as JSON lines, out and in.
//!
//! Export walks the change feed in seq order and reads each added version back exactly (same
//! version, same hash): the live items from a snapshot of now, or, with `--all-versions`, each
//! version from a snapshot of the store as it stood right after that version's batch committed.
//! Live items whose adds compaction has taken out of the feed come first, from a query of now.
//! Import reads JSON lines one at a time and adds them in batches of [`IMPORT_BATCH`].

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::time::Instant;

use ctxlog::{AddOutcome, Change, ContextItem, ContextQuery, Resolution, Snapshot, Store, TypeSpec};

use crate::error::{CliError, CliResult};
use crate::open::{open_or_create, open_read};
use crate::out::write_line;
use crate::progress;

/// Items in one batch of an import.
pub(crate) const IMPORT_BATCH: usize = 1_000;
/// References resolved in one call of an export.
const EXPORT_CHUNK: usize = 1_000;

/// The id and version of an item's JSON (the rest is skipped).
#[derive(serde::Deserialize)]
struct Named {
    id: String,
    version: String,
}

/// An added version, as the change feed names it.
struct Added {
    seq: u64,
    id: String,
    version: String,
    hash: String,
}

/// Resolves `id@version` of each of `added` at `view` and returns the items found with exactly
/// that version and hash, in the order given (`None` for the others).
fn read_exact(view: &Snapshot, added: &[Added]) -> CliResult<Vec<Option<ContextItem>>> {
    let refs: Vec<String> = added.iter().map(|a| format!("{}@{}", a.id, a.version)).collect();
    let resolutions = view.resolve(&refs)?;
    Ok(resolutions
        .into_iter()
        .zip(added)
        .map(|(resolution, a)| match resolution {
            Resolution::Found(item) if item.version == a.version && item.hash.as_deref() == Some(a.hash.as_str()) => {
                Some(item)
            }
            _ => None,
        })
        .collect())
}

/// `ctxlog export DIR [--out FILE] [--all-versions]`.
pub(crate) fn export(dir: &Path, out: Option<&Path>, all_versions: bool) -> CliResult<()> {
    let store = open_read(dir)?;
    let (mut writer, target): (Box<dyn Write>, String) = match out {
        Some(path) => {
            let file = File::create(path).map_err(|e| CliError::io(format!("creating {}", path.display()), &e))?;
            (Box::new(file), path.display().to_string())
        }
        None => (Box::new(std::io::stdout().lock()), "stdout".to_owned()),
    };
    let mut writer = BufWriter::with_capacity(1 << 16, &mut writer);
    let stats = store.stats();
    let bar = progress::items(if all_versions { stats.versions } else { stats.items }, "items");
    let mut exporter = Exporter {
        store: &store,
        writer: &mut writer,
        target: &target,
        bar: &bar,
        exported: 0,
        left_out: 0,
    };
    let result = if all_versions {
        exporter.all_versions()
    } else {
        exporter.live()
    };
    bar.finish_and_clear();
    result?;
    let (exported, left_out) = (exporter.exported, exporter.left_out);
    writer
        .flush()
        .map_err(|e| CliError::io(format!("writing to {target}"), &e))?;
    if all_versions && left_out > 0 {
        eprintln!(
            "exported {exported} items ({left_out} added versions left out: deleted since, expired when committed, \
             or no longer readable exactly since compaction)"
        );
    } else {
        eprintln!("exported {exported} items");
    }
    Ok(())
}

/// An export in progress.
struct Exporter<'a, W: Write> {
    store: &'a Store,
    writer: &'a mut W,
    target: &'a str,
    bar: &'a indicatif::ProgressBar,
    exported: u64,
    left_out: u64,
}

impl<W: Write> Exporter<'_, W> {
    /// Writes one item.
    fn emit(&mut self, item: &ContextItem) -> CliResult<()> {
        let line = serde_json::to_string(item).map_err(|e| CliError::failure(format!("writing an item: {e}")))?;
        write_line(self.writer, &line, self.target)?;
        self.exported += 1;
        self.bar.inc(1);
        Ok(())
    }

    /// Every added version in the change feed, in seq order.
    fn added(&self) -> CliResult<impl Iterator<Item = CliResult<Added>>> {
        let changes = self.store.changes(self.store.history_start()?)?;
        Ok(changes.filter_map(|change| match change {
            Ok(Change::Added {
                seq, id, version, hash, ..
            }) => Some(Ok(Added { seq, id, version, hash })),
            Ok(_) => None,
            Err(e) => Some(Err(CliError::from(e))),
        }))
    }

    /// The live items whose adds the change feed no longer holds (compaction moved
    /// [`Store::history_start`] past them): every item of `now` whose (id, version) is not added
    /// in the feed. Their adds all precede the feed's; among themselves they come in the query's
    /// order, (timestamp, id), since the store keeps no seq with an item.
    fn before_history(&mut self, now: &Snapshot) -> CliResult<()> {
        if self.store.history_start()? == 0 {
            return Ok(());
        }
        let mut in_feed: HashSet<(String, String)> = HashSet::new();
        for added in self.added()? {
            let added = added?;
            in_feed.insert((added.id, added.version));
        }
        for raw in now.get_raw(&ContextQuery::new())? {
            let named: Named = serde_json::from_str(raw.as_str())
                .map_err(|e| CliError::failure(format!("reading an item back: {e}")))?;
            if !in_feed.contains(&(named.id, named.version)) {
                write_line(self.writer, raw.as_str(), self.target)?;
                self.exported += 1;
                self.bar.inc(1);
            }
        }
        Ok(())
    }

    /// Every live item, in the seq order of the add that made its version: the items added before
    /// the feed's history (see [`Exporter::before_history`]), then each added version of the feed
    /// still latest, live and of the same hash in a snapshot of now.
    fn live(&mut self) -> CliResult<()> {
        let now = self.store.snapshot();
        self.before_history(&now)?;
        let mut emitted: HashSet<String> = HashSet::new();
        let mut chunk: Vec<Added> = Vec::with_capacity(EXPORT_CHUNK);
        let mut added = self.added()?;
        loop {
            let next = added.next().transpose()?;
            let done = next.is_none();
            chunk.extend(next);
            if chunk.len() == EXPORT_CHUNK || (done && !chunk.is_empty()) {
                for item in read_exact(&now, &chunk)?.into_iter().flatten() {
                    // An id deleted and added again with the same version is added twice: once out.
                    if emitted.insert(item.id.clone()) {
                        self.emit(&item)?;
                    }
                }
                chunk.clear();
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Every stored version of every id not deleted since, in seq order: each read from a snapshot
    /// of the store right after its batch committed (or, for a batch whose view compaction has
    /// reclaimed, from now if it is still the latest).
    fn all_versions(&mut self) -> CliResult<()> {
        // The last delete of each id: versions added before it are not exported.
        let mut deleted_at: HashMap<String, u64> = HashMap::new();
        for change in self.store.changes(self.store.history_start()?)? {
            if let Change::Deleted { seq, id, .. } = change? {
                deleted_at.insert(id, seq);
            }
        }
        let now = self.store.snapshot();
        self.before_history(&now)?;
        let mut batch: Vec<Added> = Vec::new();
        let mut added = self.added()?;
        loop {
            let next = added.next().transpose()?;
            let ends_batch = match (&next, batch.first()) {
                (Some(a), Some(first)) => a.seq != first.seq || batch.len() == EXPORT_CHUNK,
                (None, _) => true,
                (Some(_), None) => false,
            };
            if ends_batch && !batch.is_empty() {
                self.export_batch(&batch, &now)?;
                batch.clear();
            }
            match next {
                Some(a) if deleted_at.get(&a.id).is_some_and(|&at| at > a.seq) => self.left_out += 1,
                Some(a) => batch.push(a),
                None => return Ok(()),
            }
        }
    }

    /// Exports the versions of one batch (one seq) read back exactly.
    fn export_batch(&mut self, batch: &[Added], now: &Snapshot) -> CliResult<()> {
        let seq = batch.first().map_or(0, |a| a.seq);
        let found = match self.store.snapshot_at(seq) {
            Ok(then) => read_exact(&then, batch)?,
            Err(ctxlog::Error::HistoryCompacted { .. }) => read_exact(now, batch)?,
            Err(e) => return Err(e.into()),
        };
        for item in found {
            match item {
                Some(item) => self.emit(&item)?,
                None => self.left_out += 1,
            }
        }
        Ok(())
    }
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
