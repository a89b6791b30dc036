//! `stats`, `verify` and `snapshots`: looking at a store without changing what it holds.

use std::path::Path;

use ctxlog::{format_rfc3339, SnapshotInfo, Store};
use serde_json::{json, Value};

use crate::error::{CliError, CliResult};
use crate::open::{open_read, open_read_or};
use crate::out::Out;
use crate::progress;
use crate::report::human_bytes;

/// Prints rows of (label, value) as two aligned columns.
fn print_table(out: &mut Out, rows: &[(&str, String)]) -> CliResult<()> {
    let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
    for (label, value) in rows {
        out.line(&format!("{label:<width$}  {value}"))?;
    }
    Ok(())
}

/// `ctxlog stats DIR`: figures about the store, as a table or one JSON object.
pub(crate) fn stats(dir: &Path, as_json: bool) -> CliResult<()> {
    let store = open_read(dir)?;
    let stats = store.stats();
    let history_start = store.history_start()?;
    let recovery = &stats.recovery;
    let mut out = Out::stdout();
    if as_json {
        let report = json!({
            "items": stats.items,
            "versions": stats.versions,
            "segments": stats.segments,
            "bytes_on_disk": stats.bytes_on_disk,
            "index_bytes": stats.index_bytes,
            "index_bytes_per_item": stats.index_bytes_per_item,
            "sessions": stats.sessions,
            "pins": stats.pins,
            "last_seq": stats.seq,
            "history_start": history_start,
            "recovery": {
                "segments": recovery.segments,
                "frames": recovery.frames,
                "records": recovery.records,
                "truncated_bytes": recovery.truncated_bytes,
                "unwritten_bytes": recovery.unwritten_bytes,
                "removed_torn_segment": recovery.removed_torn_segment,
                "removed_temporary_files": recovery.removed_temporary_files,
                "millis": recovery.millis,
                "checkpoint_seq": recovery.checkpoint_seq,
                "checkpoint_rejected": recovery.checkpoint_rejected,
            },
        });
        out.line(&report.to_string())?;
        return out.flush();
    }
    let checkpoint = recovery
        .checkpoint_seq
        .map_or_else(|| "none (whole log replayed)".to_owned(), |seq| format!("at seq {seq}"));
    let mut rows = vec![
        ("items", stats.items.to_string()),
        ("versions", stats.versions.to_string()),
        ("segments", stats.segments.to_string()),
        (
            "bytes on disk",
            format!("{} ({} B)", human_bytes(stats.bytes_on_disk), stats.bytes_on_disk),
        ),
        ("index bytes", human_bytes(stats.index_bytes)),
        ("index bytes per item", format!("{:.1}", stats.index_bytes_per_item)),
        ("sessions", stats.sessions.to_string()),
        ("pins", stats.pins.to_string()),
        ("last seq", stats.seq.to_string()),
        ("history start", format!("after seq {history_start}")),
        (
            "recovery",
            format!(
                "{} frames, {} records replayed from {} segments in {} ms",
                recovery.frames, recovery.records, recovery.segments, recovery.millis
            ),
        ),
        ("checkpoint", checkpoint),
    ];
    if let Some(why) = &recovery.checkpoint_rejected {
        rows.push(("checkpoint rejected", why.clone()));
    }
    if recovery.truncated_bytes > 0 {
        rows.push(("torn tail cut", format!("{} B", recovery.truncated_bytes)));
    }
    print_table(&mut out, &rows)?;
    out.flush()
}

/// `ctxlog verify DIR`: reads every record, checkpoint and pin; exit 1 and each problem
/// (`FILE:OFFSET: reason`) if any. A store too damaged to open fails with the file and offset of
/// the first damage.
pub(crate) fn verify(dir: &Path, as_json: bool) -> CliResult<()> {
    let bar = progress::spinner("opening the store");
    let store = match open_read_or(dir, |e| match e {
        ctxlog::Error::Corrupt { .. } => CliError::failure(format!(
            "{e}; the store does not open, so verify stops at this first damage; restore the store from a backup"
        )),
        other => CliError::from(other),
    }) {
        Ok(store) => store,
        Err(e) => {
            bar.finish_and_clear();
            return Err(e);
        }
    };
    bar.set_message("reading every record, checkpoint and pin");
    let report = store.verify();
    bar.finish_and_clear();
    let report = report.map_err(|e| match e {
        ctxlog::Error::Corrupt { .. } => CliError::failure(format!(
            "{e}; verify cannot read past this damage; restore the store from a backup"
        )),
        other => CliError::from(other),
    })?;
    let mut out = Out::stdout();
    if as_json {
        let problems: Vec<Value> = report
            .problems
            .iter()
            .map(|p| json!({"file": p.file.display().to_string(), "offset": p.offset, "reason": p.reason}))
            .collect();
        let object = json!({
            "ok": report.is_ok(),
            "records_checked": report.records_checked,
            "frames_checked": report.frames_checked,
            "segments_checked": report.segments_checked,
            "checkpoints_checked": report.checkpoints_checked,
            "pins_checked": report.pins_checked,
            "problems": problems,
        });
        out.line(&object.to_string())?;
    } else if report.is_ok() {
        out.line(&format!(
            "ok: {} records, {} frames, {} segments, {} checkpoints, {} pins checked",
            report.records_checked,
            report.frames_checked,
            report.segments_checked,
            report.checkpoints_checked,
            report.pins_checked
        ))?;
    } else {
        for problem in &report.problems {
            out.line(&format!(
                "{}:{}: {}",
                problem.file.display(),
                problem.offset,
                problem.reason
            ))?;
        }
    }
    out.flush()?;
    if report.is_ok() {
        Ok(())
    } else {
        Err(CliError::failure(format!(
            "{} problem(s) found in {} ({} records checked); restore the damaged files from a backup",
            report.problems.len(),
            dir.display(),
            report.records_checked
        )))
    }
}

/// A pinned snapshot as JSON: its fields, its digest and when it was taken.
pub(crate) fn pin_json(store: &Store, info: &SnapshotInfo) -> CliResult<Value> {
    let digest = store.open_snapshot(&info.name)?.digest()?;
    Ok(json!({
        "name": info.name,
        "seq": info.seq,
        "taken_at": info.taken_at,
        "taken_at_rfc3339": format_rfc3339(info.taken_at),
        "session": info.session,
        "bytes_kept": info.bytes_kept,
        "digest": digest,
    }))
}

/// `ctxlog snapshots DIR`: the pinned snapshots with digest and bytes kept, as a table or a JSON
/// array.
pub(crate) fn snapshots(dir: &Path, as_json: bool) -> CliResult<()> {
    let store = open_read(dir)?;
    let pins = store
        .snapshots()
        .iter()
        .map(|info| pin_json(&store, info))
        .collect::<CliResult<Vec<_>>>()?;
    let mut out = Out::stdout();
    if as_json {
        out.line(&Value::Array(pins).to_string())?;
        return out.flush();
    }
    if pins.is_empty() {
        out.line("no pinned snapshots")?;
        return out.flush();
    }
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let rows: Vec<[String; 6]> = pins
        .iter()
        .map(|p| {
            [
                text(&p["name"]),
                text(&p["seq"]),
                text(&p["taken_at_rfc3339"]),
                text(&p["session"]),
                human_bytes(p["bytes_kept"].as_u64().unwrap_or(0)),
                text(&p["digest"]),
            ]
        })
        .collect();
    let header = ["NAME", "SEQ", "TAKEN AT", "SESSION", "BYTES KEPT", "DIGEST"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.line(cells.join("  ").trim_end())?;
    }
    out.flush()
}
