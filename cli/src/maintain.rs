//! `compact`, `pin` and `unpin`: the commands that change a store's files but not what it holds.

use std::path::Path;

use serde_json::json;

use crate::error::{CliError, CliResult};
use crate::inspect::pin_json;
use crate::open::open_write;
use crate::out::Out;
use crate::progress;
use crate::report::{human_bytes, ms};

/// `ctxlog compact DIR`: compacts and prints the report.
pub(crate) fn compact(dir: &Path, as_json: bool) -> CliResult<()> {
    let store = open_write(dir)?;
    let bar = progress::spinner("compacting");
    let report = store.compact();
    bar.finish_and_clear();
    let report = report?;
    let mut out = Out::stdout();
    if as_json {
        let object = json!({
            "segments_rewritten": report.segments_rewritten,
            "segments_skipped": report.segments_skipped,
            "reclaimed_expired": report.reclaimed_expired,
            "reclaimed_superseded": report.reclaimed_superseded,
            "reclaimed_deleted": report.reclaimed_deleted,
            "retired": report.retired,
            "bytes_before": report.bytes_before,
            "bytes_after": report.bytes_after,
            "duration_ms": report.duration.as_secs_f64() * 1e3,
        });
        out.line(&object.to_string())?;
    } else {
        out.line(&format!(
            "compacted {}: {} segment(s) rewritten, {} skipped; segment files {} -> {} in {}",
            dir.display(),
            report.segments_rewritten,
            report.segments_skipped,
            human_bytes(report.bytes_before),
            human_bytes(report.bytes_after),
            ms(report.duration)
        ))?;
        out.line(&format!(
            "reclaimed {} expired, {} superseded, {} deleted versions ({} remembered by a retired record)",
            report.reclaimed_expired, report.reclaimed_superseded, report.reclaimed_deleted, report.retired
        ))?;
    }
    out.flush()
}

/// `ctxlog pin DIR NAME`: pins a snapshot of now under NAME.
pub(crate) fn pin(dir: &Path, name: &str, as_json: bool) -> CliResult<()> {
    let store = open_write(dir)?;
    let info = store.pin_snapshot(name)?;
    let object = pin_json(&store, &info)?;
    let mut out = Out::stdout();
    if as_json {
        out.line(&object.to_string())?;
    } else {
        out.line(&format!(
            "pinned {} at seq {} ({})",
            info.name,
            info.seq,
            object["digest"].as_str().unwrap_or("")
        ))?;
    }
    out.flush()
}

/// `ctxlog unpin DIR NAME`: unpins NAME; exit 1 if no snapshot is pinned under it.
pub(crate) fn unpin(dir: &Path, name: &str, as_json: bool) -> CliResult<()> {
    let store = open_write(dir)?;
    let unpinned = store.unpin_snapshot(name)?;
    let mut out = Out::stdout();
    if as_json {
        out.line(&json!({"name": name, "unpinned": unpinned}).to_string())?;
    } else if unpinned {
        out.line(&format!(
            "unpinned {name}; the next `ctxlog compact` may reclaim what it kept"
        ))?;
    }
    out.flush()?;
    if unpinned {
        Ok(())
    } else {
        Err(CliError::failure(format!(
            "no pinned snapshot named {name:?}; `ctxlog snapshots {}` lists them",
            dir.display()
        )))
    }
}
