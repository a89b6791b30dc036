//! How the demo prints what it found: durations, byte counts, resolutions and compaction reports.

use std::time::Duration;

use ctxlog::{format_rfc3339, CompactionReport, Resolution};

/// A duration in milliseconds, two decimals.
pub(crate) fn ms(elapsed: Duration) -> String {
    format!("{:.2} ms", elapsed.as_secs_f64() * 1e3)
}

/// A byte count in B, KiB or MiB.
pub(crate) fn human_bytes(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    if bytes >= 1 << 20 {
        format!("{:.2} MiB", b / f64::from(1u32 << 20))
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// A resolution in a few words.
pub(crate) fn describe(resolution: &Resolution) -> String {
    match resolution {
        Resolution::Found(item) => format!("Found v{}", item.version),
        Resolution::NotFound { .. } => "NotFound".to_owned(),
        Resolution::Expired { expired_at, .. } => format!("Expired (at {})", format_rfc3339(*expired_at)),
        Resolution::Superseded { latest, .. } => format!("Superseded (latest v{})", latest.version),
        Resolution::HashMismatch { .. } => "HashMismatch".to_owned(),
        other => format!("{other:?}"),
    }
}

/// Resolutions in a few words each.
pub(crate) fn describe_all(resolutions: &[Resolution]) -> String {
    resolutions.iter().map(describe).collect::<Vec<_>>().join(", ")
}

/// Prints a compaction report in two lines.
pub(crate) fn print_compaction(label: &str, report: &CompactionReport) {
    println!(
        "{label}: {} segment(s) rewritten, {} skipped; segment files {} -> {} in {}",
        report.segments_rewritten,
        report.segments_skipped,
        human_bytes(report.bytes_before),
        human_bytes(report.bytes_after),
        ms(report.duration)
    );
    println!(
        "  reclaimed {} expired, {} superseded, {} deleted versions ({} remembered by a retired record)",
        report.reclaimed_expired, report.reclaimed_superseded, report.reclaimed_deleted, report.retired
    );
}
