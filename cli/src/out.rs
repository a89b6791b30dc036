//! Writing to stdout: buffered, and quiet when the reader goes away (`ctxlog get DIR | head`).

use std::io::{BufWriter, StdoutLock, Write};

use crate::error::{CliError, CliResult};

/// Buffered, locked stdout.
pub(crate) struct Out {
    inner: BufWriter<StdoutLock<'static>>,
}

impl Out {
    /// Stdout, buffered.
    pub(crate) fn stdout() -> Self {
        Out {
            inner: BufWriter::with_capacity(1 << 16, std::io::stdout().lock()),
        }
    }

    /// Writes `text` and a newline.
    pub(crate) fn line(&mut self, text: &str) -> CliResult<()> {
        self.inner
            .write_all(text.as_bytes())
            .and_then(|()| self.inner.write_all(b"\n"))
            .map_err(|e| CliError::io("writing to stdout", &e))
    }

    /// Writes out what is buffered.
    pub(crate) fn flush(&mut self) -> CliResult<()> {
        self.inner.flush().map_err(|e| CliError::io("writing to stdout", &e))
    }
}

/// Writes lines to any writer (a file or stdout), mapping failures to a [`CliError`] naming `target`.
pub(crate) fn write_line(writer: &mut impl Write, text: &str, target: &str) -> CliResult<()> {
    writer
        .write_all(text.as_bytes())
        .and_then(|()| writer.write_all(b"\n"))
        .map_err(|e| CliError::io(format!("writing to {target}"), &e))
}
