//! The command's error: one message for the `ctxlog: error:` line, and the exit status it gives
//! (1 the command failed or found problems, 2 bad usage).

use std::fmt;
use std::path::Path;

/// A failed command: what to print after `ctxlog: error:`, and the exit status.
#[derive(Debug)]
pub(crate) struct CliError {
    /// The one-line message, saying what went wrong and what to do.
    pub(crate) message: String,
    /// The exit status: 1 failure, 2 bad usage; 0 for a quiet stop (the reader of stdout went away).
    pub(crate) code: u8,
}

/// A result whose error is a [`CliError`].
pub(crate) type CliResult<T> = Result<T, CliError>;

impl CliError {
    /// The command failed, or found problems (exit status 1).
    pub(crate) fn failure(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: 1,
        }
    }

    /// The command was used wrongly (exit status 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: 2,
        }
    }

    /// Stdout was closed by its reader (`ctxlog get ... | head`): stop without a message.
    pub(crate) fn stdout_closed() -> Self {
        CliError {
            message: String::new(),
            code: 0,
        }
    }

    /// An I/O failure while doing `what`.
    pub(crate) fn io(what: impl fmt::Display, err: &std::io::Error) -> Self {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            return CliError::stdout_closed();
        }
        CliError::failure(format!("{what}: {err}"))
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The message for a library error, with what to do about it: a locked store names its lock file,
/// damage names file and offset (the error's own text) and points to `ctxlog verify`.
pub(crate) fn describe(err: &ctxlog::Error) -> String {
    match err {
        ctxlog::Error::Locked { path } => format!(
            "the store {} is in use: its lock {} is held by another process or handle; stop the process holding \
             the store, then run the command again",
            path.display(),
            path.join("LOCK").display()
        ),
        ctxlog::Error::Corrupt { file, .. } => {
            let dir = file.parent().unwrap_or(Path::new("."));
            format!(
                "{err}; run `ctxlog verify {}` to list every problem, and restore the store from a backup",
                dir.display()
            )
        }
        ctxlog::Error::Poisoned { .. } => format!("{err}"),
        ctxlog::Error::HistoryCompacted { oldest_available } => {
            format!("{err}; ask for changes after seq {oldest_available} or later (`--after {oldest_available}`)")
        }
        other => other.to_string(),
    }
}

impl From<ctxlog::Error> for CliError {
    fn from(err: ctxlog::Error) -> Self {
        CliError::failure(describe(&err))
    }
}
