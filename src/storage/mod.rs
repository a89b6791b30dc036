//! The one seam for storage I/O: every file and directory operation of a store goes through a
//! [`Storage`], so that tests can run the engine on a simulated disk (`SimDisk`) that keeps synced
//! and unsynced bytes apart and can lose power. Public with the `sim-disk` feature, which also adds
//! `Options::storage` to choose one; without it, a store always uses [`FileStorage`].
//!
//! Two backends: [`FileStorage`] (`std::fs` and `memmap2`, the default; the crate's only `unsafe`)
//! and `SimDisk` (in memory, with the `sim-disk` feature). Paths are those the store builds: its directory joined with a file
//! name; the store never nests directories.

use std::fmt;
use std::io;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

mod file;
#[cfg(any(test, feature = "sim-disk"))]
mod sim;

pub use file::FileStorage;
#[cfg(any(test, feature = "sim-disk"))]
pub use sim::{Call, CallKind, Fault, SimDisk};

/// The whole contents of a file that is never written again (a sealed segment), shared between
/// readers without copying: a read-only mapping for files, shared memory for the simulated disk.
#[derive(Clone)]
pub struct SharedBytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl SharedBytes {
    /// Wraps any owner of bytes.
    pub fn new(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> SharedBytes {
        SharedBytes(Arc::new(bytes))
    }
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len())
    }
}

/// An open file. Writes append at the file's write position, which starts at the file's length when
/// it is opened and is moved by `append` and `set_len` only: [`StorageFile::allocate`] can make the
/// file longer than what was written. `sync_data` / `sync_all` make what was written durable.
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// `UnexpectedEof` past the end; any I/O error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `bytes` at the write position and moves it past them.
    ///
    /// # Errors
    /// Any I/O error; part of `bytes` may have been written.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Makes the file at least `len` bytes long, the new bytes zero and their space reserved, without
    /// moving the write position: appends up to `len` then change no file length, so that a sync
    /// after each of them commits no metadata. `how` says whether the zeros are written or only
    /// their blocks reserved. The new length is durable after the next sync.
    ///
    /// # Errors
    /// Any I/O error (`ENOSPC` when the space is not there). After one, the file may have grown by
    /// part of the zeros.
    fn allocate(&mut self, len: u64, how: Allocation) -> io::Result<()>;
    /// A hint that the `len` bytes at `offset`, inside what [`StorageFile::allocate`] made room
    /// for, will be appended to soon: a backend may get ready what those appends will write into
    /// (the page cache's pages, for files), so that they only copy. It changes nothing that can be
    /// read, synced or lost, and it has no errors to report: the default does nothing.
    fn prepare(&self, offset: u64, len: u64) {
        let _ = (offset, len);
    }
    /// Makes the file's data (and its length) durable.
    ///
    /// # Errors
    /// Any I/O error; after one, nothing is known of what is durable.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Makes the file's data and metadata durable.
    ///
    /// # Errors
    /// As [`StorageFile::sync_data`].
    fn sync_all(&mut self) -> io::Result<()>;
    /// Cuts (or extends with zeros) the file to `len` bytes, and moves the write position there.
    ///
    /// # Errors
    /// Any I/O error.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// The whole file as shared bytes, as long as it is now. The store maps files that will not be
    /// written again, and the active segment, which it only appends to while it is open: the bytes
    /// mapped never change.
    ///
    /// # Errors
    /// Any I/O error.
    fn map(&self) -> io::Result<SharedBytes>;
    /// The file's first `len` bytes as shared bytes: for the active segment, whose bytes past the
    /// published length may still be written (they were allocated ahead of the writes).
    ///
    /// # Errors
    /// `UnexpectedEof` if the file is shorter; any I/O error.
    fn map_prefix(&self, len: u64) -> io::Result<SharedBytes>;
}

/// Syncs a directory, so that files created, renamed or removed in it survive a crash.
pub(crate) fn sync_dir(storage: &dyn Storage, dir: &Path) -> crate::error::Result<()> {
    storage
        .sync_dir(dir)
        .map_err(|e| crate::error::Error::io(format!("syncing directory {}", dir.display()), e))
}

/// Appends `bytes` to `file`, whose write position is `at`, into room reserved and prepared first
/// ([`StorageFile::allocate`], [`StorageFile::prepare`]), so that the write copies into pages
/// already there; the file then ends where the bytes do. For files written whole, or in large
/// steps, once (checkpoints, rewritten segments).
pub(crate) fn append_prepared(file: &mut dyn StorageFile, at: u64, bytes: &[u8]) -> io::Result<()> {
    let len = bytes.len() as u64;
    file.allocate(at + len, Allocation::Reserved)?;
    file.prepare(at, len);
    file.append(bytes)
}

/// How [`StorageFile::allocate`] makes room ahead of the appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Blocks reserved without writing them (`fallocate`): cheap however much is reserved. The file
    /// system still records which blocks were never written, and the sync after the first append
    /// into a block writes that record too (on ext4, a sync of a 4 KiB append took ~145 us into
    /// reserved blocks against ~90 us into written zeros).
    Reserved,
    /// Zeros written: costs the writing of every byte, once; the syncs after appends into them
    /// write the appended data alone.
    Zeroed,
}

/// A lock on a store directory, released when dropped.
pub trait DirLock: Send + Sync + fmt::Debug {}

/// File and directory operations, as the store uses them.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates `dir` (and its parents) if missing.
    ///
    /// # Errors
    /// Any I/O error.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Takes the store lock of `dir`; `None` if another handle holds it.
    ///
    /// # Errors
    /// Any I/O error.
    fn try_lock(&self, dir: &Path) -> io::Result<Option<Box<dyn DirLock>>>;
    /// The names of the files in `dir`, in no particular order.
    ///
    /// # Errors
    /// Any I/O error.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The length of the file at `path`.
    ///
    /// # Errors
    /// `NotFound`; any I/O error.
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// The whole contents of the file at `path`.
    ///
    /// # Errors
    /// `NotFound`; any I/O error.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Opens an existing file for reading.
    ///
    /// # Errors
    /// `NotFound`; any I/O error.
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Opens an existing file for reading and appending (at its end).
    ///
    /// # Errors
    /// `NotFound`; any I/O error.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Creates a file that must not exist yet, for reading and appending.
    ///
    /// # Errors
    /// `AlreadyExists`; any I/O error.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Creates a file, or empties an existing one, for appending.
    ///
    /// # Errors
    /// Any I/O error.
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Renames `from` to `to`, replacing `to` if it exists (same directory).
    ///
    /// # Errors
    /// Any I/O error.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the file at `path`.
    ///
    /// # Errors
    /// Any I/O error.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (files created, renamed or removed in it) durable.
    ///
    /// # Errors
    /// Any I/O error.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}
