//! `changes`: the change feed as JSON lines.

use std::path::Path;

use crate::error::{CliError, CliResult};
use crate::open::open_read;
use crate::out::Out;

/// `ctxlog changes DIR [--after SEQ]`: every change after SEQ (default: the oldest the store
/// keeps), one JSON object per line, in seq order.
pub(crate) fn changes(dir: &Path, after: Option<u64>) -> CliResult<()> {
    let store = open_read(dir)?;
    let after = match after {
        Some(after) => after,
        None => store.history_start()?,
    };
    let changes = store.changes(after).map_err(|e| match e {
        ctxlog::Error::Invalid { .. } => CliError::usage(e.to_string()),
        other => CliError::from(other),
    })?;
    let mut out = Out::stdout();
    for change in changes {
        out.line(&change?.to_json())?;
    }
    out.flush()
}
