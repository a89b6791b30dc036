//! The one error type of ctxlog.
//!
//! Every error that concerns one item of a batch carries `index`, the item's position in the batch,
//! and its `Display` starts with `item N: `. Errors are values a caller can branch on; none of them
//! is ever raised as a panic.

use std::fmt;
use std::path::PathBuf;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in ctxlog.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed. `context` says what ctxlog was doing.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What ctxlog was doing when the call failed.
        context: String,
        /// The error the operating system returned.
        #[source]
        source: std::io::Error,
    },
    /// A field of an input is malformed or out of range.
    #[error("{}invalid {field}: {reason}", ItemPrefix(*.index))]
    Invalid {
        /// The field at fault, by its JSON name (`id`, `type`, `session_id`, `time_range.start`, ...).
        field: String,
        /// Why the value is refused, and what would be accepted.
        reason: String,
        /// The position of the item in its batch, when the error concerns one item.
        index: Option<usize>,
    },
    /// An item names a type that is not registered.
    #[error("{}unknown type {kind:?}; known types: {}", ItemPrefix(*.index), known.join(", "))]
    UnknownType {
        /// The type that was named.
        kind: String,
        /// Every registered type, sorted.
        known: Vec<String>,
        /// The position of the item in its batch.
        index: Option<usize>,
    },
    /// An item's declared hash is well formed but does not match its content.
    #[error("{}hash mismatch for id {id:?}: declared {declared}, content hashes to {computed}", ItemPrefix(*.index))]
    HashMismatch {
        /// The item's id.
        id: String,
        /// The hash the item declared.
        declared: String,
        /// The hash of the item's canonical content.
        computed: String,
        /// The position of the item in its batch.
        index: Option<usize>,
    },
    /// The (id, version) pair is already stored with another content hash.
    #[error("{}version conflict: {id:?} version {version:?} is already stored with hash {existing}, not {attempted}; use a new version", ItemPrefix(*.index))]
    VersionConflict {
        /// The item's id.
        id: String,
        /// The version that was added again.
        version: String,
        /// The hash already stored for that version.
        existing: String,
        /// The hash of the refused item.
        attempted: String,
        /// The position of the item in its batch.
        index: Option<usize>,
    },
    /// Something is bigger than its limit.
    #[error("{}{what} is {len} bytes, over the limit of {max} bytes", ItemPrefix(*.index))]
    TooLarge {
        /// What is too large (`content`, `batch`, ...).
        what: String,
        /// Its size in bytes.
        len: u64,
        /// The limit in bytes.
        max: u64,
        /// The position of the item in its batch, when it concerns one item.
        index: Option<usize>,
    },
    /// The write would take the store past one of its limits on what it holds (see
    /// [`crate::limits`]): `what` (`versions`, `ids`, `types`, `scopes`, `sources`) at most `limit`.
    /// The write is refused whole, before anything of it is written.
    #[error("the store is full: it holds at most {limit} {what}, and this write could take it past that")]
    Full {
        /// What is full.
        what: String,
        /// How many of it a store holds at most.
        limit: u64,
    },
    /// A session view tried to write to a scope it does not own.
    #[error("{}permission denied: {reason}", ItemPrefix(*.index))]
    PermissionDenied {
        /// Why the write is refused.
        reason: String,
        /// The position of the item in its batch.
        index: Option<usize>,
    },
    /// Stored bytes are damaged. Opening a store whose acknowledged data is damaged fails with this.
    #[error("corrupt store file {} at offset {offset}: {reason}", file.display())]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// The byte offset in that file where the damage was found.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// No pinned snapshot has that name.
    #[error("no pinned snapshot named {name:?}")]
    SnapshotNotFound {
        /// The name that was asked for.
        name: String,
    },
    /// Another handle (in this process or another) holds the store's lock, and kept it for the
    /// quarter of a second opening waits for it.
    #[error("store directory {} is locked by another open handle; close it first", path.display())]
    Locked {
        /// The store's directory.
        path: PathBuf,
    },
    /// A write or fsync failed earlier on this handle, so the store refuses further writes; reopen it.
    #[error(
        "the store refuses writes after an earlier I/O failure ({reason}); drop every handle and reopen the store"
    )]
    Poisoned {
        /// The failure that poisoned the store.
        reason: String,
    },
    /// A receipt's answer differs from what its pinned snapshot answers now.
    #[error("receipt answer {position} differs: the receipt says {expected}, the snapshot now answers {found}")]
    ReceiptMismatch {
        /// The position of the answer in the receipt.
        position: usize,
        /// The answer the receipt recorded.
        expected: String,
        /// The answer given now.
        found: String,
    },
    /// The changes or the moment asked for are older than the history the store keeps: compaction
    /// has reclaimed records they need.
    #[error("history compacted: the oldest change still available follows seq {oldest_available}")]
    HistoryCompacted {
        /// The smallest `after` the change feed accepts (`Store::history_start`).
        oldest_available: u64,
    },
    /// A subscriber fell more than `Options::subscription_buffer` changes behind: its
    /// subscription has ended. Subscribing again with `after(resume_after)` loses nothing while
    /// that history is retained.
    #[error("subscription lagged: subscribe again after seq {resume_after}")]
    Lagged {
        /// The seq of the last change the subscriber received whole.
        resume_after: u64,
    },
    /// The store is shutting down.
    #[error("the store is closed")]
    Closed,
    /// A read-only open found no store in the directory (it is missing, or holds no segment file).
    #[error("{} is not a ctxlog store (no segment files); give the directory of an existing store", path.display())]
    NotAStore {
        /// The directory.
        path: PathBuf,
    },
    /// A write (or compaction) asked of a store opened with `Options::read_only`.
    #[error("the store is open read-only: {operation} needs a handle opened without Options::read_only")]
    ReadOnly {
        /// What was asked: `add`, `delete`, `compact`, ...
        operation: &'static str,
    },
}

/// Writes `item N: ` when an error concerns one item of a batch.
struct ItemPrefix(Option<usize>);

impl fmt::Display for ItemPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(index) => write!(f, "item {index}: "),
            None => Ok(()),
        }
    }
}

impl Error {
    /// An [`Error::Invalid`] that concerns no item of a batch.
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.into(),
            reason: reason.into(),
            index: None,
        }
    }

    /// An [`Error::Io`] with what ctxlog was doing.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The position in its batch of the item this error concerns, if any.
    #[must_use]
    pub fn index(&self) -> Option<usize> {
        match self {
            Error::Invalid { index, .. }
            | Error::UnknownType { index, .. }
            | Error::HashMismatch { index, .. }
            | Error::VersionConflict { index, .. }
            | Error::TooLarge { index, .. }
            | Error::PermissionDenied { index, .. } => *index,
            _ => None,
        }
    }

    /// The same error, saying that it concerns the item at `position` of its batch.
    #[must_use]
    pub(crate) fn at(mut self, position: usize) -> Self {
        match &mut self {
            Error::Invalid { index, .. }
            | Error::UnknownType { index, .. }
            | Error::HashMismatch { index, .. }
            | Error::VersionConflict { index, .. }
            | Error::TooLarge { index, .. }
            | Error::PermissionDenied { index, .. } => *index = Some(position),
            _ => {}
        }
        self
    }
}
