//! Opening a store, in one place: read-only commands open with `Options::read_only` and never open
//! (and so never create) a directory that holds no store; every open has background compaction
//! off.

use std::path::Path;

use ctxlog::{Options, Store};

use crate::error::{CliError, CliResult};

/// The options every command opens with: no background compaction.
fn options() -> Options {
    Options::new().auto_compact(false)
}

/// Whether `dir` holds segment files (`NNNNNNNN.seg`): the mark of a store.
fn holds_segments(dir: &Path) -> CliResult<bool> {
    let entries = std::fs::read_dir(dir).map_err(|e| CliError::io(format!("reading {}", dir.display()), &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| CliError::io(format!("reading {}", dir.display()), &e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(digits) = name.strip_suffix(".seg") {
            if digits.len() == 8 && digits.bytes().all(|b| b.is_ascii_digit()) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The error for a directory that holds no store.
fn not_a_store(dir: &Path, why: &str) -> CliError {
    CliError::failure(format!(
        "{} is not a ctxlog store (no segment files{why}); check the path, or create a store with `ctxlog import {} FILE`",
        dir.display(),
        dir.display()
    ))
}

/// Refuses `dir` unless it is a directory holding a store, before anything opens (and so creates
/// or changes) it.
fn check_store(dir: &Path) -> CliResult<()> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_a_store(dir, ": the directory does not exist")),
        Err(e) => Err(CliError::io(format!("reading {}", dir.display()), &e)),
        Ok(meta) if !meta.is_dir() => Err(not_a_store(dir, ": it is not a directory")),
        Ok(_) if !holds_segments(dir)? => Err(not_a_store(dir, "")),
        Ok(_) => Ok(()),
    }
}

/// Opens the store in `dir` for a command that only reads it, read-only: no file of it is
/// created or changed (no lock file, no checkpoint, a torn tail left in place). A directory that
/// holds no store is refused and left as it is.
pub(crate) fn open_read(dir: &Path) -> CliResult<Store> {
    open_read_or(dir, CliError::from)
}

/// [`open_read`], telling the library's errors with `describe`.
pub(crate) fn open_read_or(dir: &Path, describe: impl FnOnce(ctxlog::Error) -> CliError) -> CliResult<Store> {
    check_store(dir)?;
    options().read_only(true).open(dir).map_err(|e| match e {
        ctxlog::Error::NotAStore { .. } => not_a_store(dir, ""),
        other => describe(other),
    })
}

/// Opens the store in `dir` for a command that changes it (compact, pin, unpin). A directory that
/// holds no store is refused and left as it is.
pub(crate) fn open_write(dir: &Path) -> CliResult<Store> {
    check_store(dir)?;
    Ok(options().open(dir)?)
}

/// Opens the store in `dir` for `import`, creating it in a missing or empty directory; a non-empty
/// directory that holds no store is refused.
pub(crate) fn open_or_create(dir: &Path) -> CliResult<Store> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CliError::io(format!("reading {}", dir.display()), &e)),
        Ok(meta) if !meta.is_dir() => return Err(not_a_store(dir, ": it is not a directory")),
        Ok(_) => {
            let empty = std::fs::read_dir(dir)
                .map_err(|e| CliError::io(format!("reading {}", dir.display()), &e))?
                .next()
                .is_none();
            if !empty && !holds_segments(dir)? {
                return Err(CliError::failure(format!(
                    "{} is not empty and is not a ctxlog store (no segment files); import into an existing store, \
                     or a new or empty directory",
                    dir.display()
                )));
            }
        }
    }
    Ok(options().open(dir)?)
}
