//! A simulated disk for power-loss and I/O-error tests.
//!
//! Fault model. Each file (inode) keeps its durable bytes apart from the writes made since its last
//! `sync_data` / `sync_all` (appends, length changes and allocations, in order: zeros written ahead
//! are a write like an append, space reserved ahead a length change). Each directory keeps its durable
//! entries apart from a journal of the entry changes made since its last `sync_dir` (a create, a
//! remove, or a rename as one atomic change). [`SimDisk::crash`] cuts the power: every directory keeps
//! its durable entries plus a prefix of its journal (chosen by the seed), and every file keeps its
//! durable bytes plus a subset of its unsynced writes, in order (none, all, a prefix, or a random
//! subset), one of them possibly torn (only a prefix of it written); with
//! [`SimDisk::set_reorder_unsynced`] off, only a prefix of them, the last one possibly torn. Data of a
//! file whose entry does not survive is gone with it.
//!
//! [`SimDisk::cut_power_after`] freezes the disk after a given number of further calls: every later
//! call fails with EIO, as a disk without power would, and [`SimDisk::crash`] then starts from the
//! state at the cut. [`SimDisk::fail`] makes chosen calls fail with EIO, ENOSPC or a short write.
//! [`SimDisk::set_sync_files`] and [`SimDisk::set_sync_dirs`] turn the syncs into no-ops, to check
//! that a power-loss suite notices. [`SimDisk::record_calls`] keeps a log of every call (its number,
//! kind, path, file handle and injected fault), so that a test can name the call sites it failed and
//! check what the store did after a failure on a handle.
//!
//! This file holds the disk's handle ([`SimDisk`]: the switches, crashes, the storage calls) and
//! the call log's types; [`state`](mod@state) holds the files and directories and what a crash
//! leaves of them, [`handle`] the open files and directory locks.

mod handle;
mod state;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::num;

use super::{DirLock, Storage, StorageFile};
use handle::{SimFile, SimLock};
use state::{error, lock, split, FaultPlan, Pending, State};

/// How a chosen call fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// `EIO`.
    Io,
    /// `ENOSPC`.
    NoSpace,
    /// An append, or an allocation of written zeros, writes half its bytes and then fails
    /// (`WriteZero`); other calls fail with `EIO`.
    ShortWrite,
}

/// What a storage call was, as [`SimDisk::call_log`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CallKind {
    /// `Storage::create_dir_all`.
    CreateDirAll,
    /// `Storage::try_lock`.
    TryLock,
    /// `Storage::list`.
    List,
    /// `Storage::len`.
    Len,
    /// `Storage::read` (a whole file).
    Read,
    /// `Storage::open_read`.
    OpenRead,
    /// `Storage::open_append`.
    OpenAppend,
    /// `Storage::create_new`.
    CreateNew,
    /// `Storage::create`.
    Create,
    /// `Storage::rename`.
    Rename,
    /// `Storage::remove`.
    Remove,
    /// `Storage::sync_dir`.
    SyncDir,
    /// `StorageFile::read_exact_at`.
    ReadAt,
    /// `StorageFile::append`.
    Append,
    /// `StorageFile::sync_data`.
    SyncData,
    /// `StorageFile::sync_all`.
    SyncAll,
    /// `StorageFile::set_len`.
    SetLen,
    /// `StorageFile::allocate`.
    Allocate,
    /// `StorageFile::map`.
    Map,
}

impl CallKind {
    /// Whether the call writes a file's data or makes it durable (append, `set_len`, the syncs).
    #[must_use]
    pub fn writes_file(self) -> bool {
        matches!(
            self,
            CallKind::Append | CallKind::SyncData | CallKind::SyncAll | CallKind::SetLen | CallKind::Allocate
        )
    }

    /// Whether the call is an fsync of a file.
    #[must_use]
    pub fn syncs_file(self) -> bool {
        matches!(self, CallKind::SyncData | CallKind::SyncAll)
    }
}

/// One storage call, as [`SimDisk::call_log`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Its number, counted from the disk's creation as [`SimDisk::calls`] counts.
    pub index: u64,
    /// What it was.
    pub kind: CallKind,
    /// The file or directory it concerned (for a rename, the source).
    pub path: PathBuf,
    /// The open file it was made on (`StorageFile` methods), or the one it opened (the `open_*` and
    /// `create*` calls that succeeded): every open gives a new number.
    pub handle: Option<u64>,
    /// The fault it failed with, if it was made to fail (a call after a power cut fails with `Io`).
    pub fault: Option<Fault>,
}

/// An in-memory disk that keeps synced and unsynced state apart and can lose power. See the module
/// documentation for the fault model. Cloning gives another handle on the same disk.
#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

impl SimDisk {
    /// An empty disk.
    #[must_use]
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Storage calls made so far (every method of the storage and of its files counts one).
    #[must_use]
    pub fn calls(&self) -> u64 {
        self.state().calls
    }

    /// Lets `calls` more calls through, then cuts the power: every later call fails with EIO and
    /// changes nothing.
    pub fn cut_power_after(&self, calls: u64) {
        let mut state = self.state();
        state.power_off_at = Some(state.calls.saturating_add(calls));
    }

    /// Whether the power is off (cut by [`SimDisk::cut_power_after`] or [`SimDisk::crash`]).
    #[must_use]
    pub fn is_powered_off(&self) -> bool {
        let state = self.state();
        state.power_off_at.is_some_and(|at| state.calls >= at)
    }

    /// Makes calls number `first..=last` (counted from the disk's creation, as [`SimDisk::calls`])
    /// fail with `fault`.
    pub fn fail(&self, first: u64, last: u64, fault: Fault) {
        self.state().faults.push(FaultPlan { first, last, fault });
    }

    /// Stops every fault armed by [`SimDisk::fail`]: later calls succeed (unless the power is off).
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Starts (and empties) or stops the log of calls that [`SimDisk::call_log`] returns. Off by
    /// default.
    pub fn record_calls(&self, on: bool) {
        self.state().log = on.then(Vec::new);
    }

    /// Every call made since [`SimDisk::record_calls`] was turned on, in order.
    #[must_use]
    pub fn call_log(&self) -> Vec<Call> {
        self.state().log.clone().unwrap_or_default()
    }

    /// Whether `sync_data` and `sync_all` make data durable (default true). Off, they do nothing.
    pub fn set_sync_files(&self, on: bool) {
        self.state().skip_file_syncs = !on;
    }

    /// Whether `sync_dir` makes directory entries durable (default true). Off, it does nothing.
    pub fn set_sync_dirs(&self, on: bool) {
        self.state().skip_dir_syncs = !on;
    }

    /// Whether a crash may keep any subset of a file's unsynced writes (default true), or only a
    /// prefix of them, as if they reached the disk in the order they were made.
    pub fn set_reorder_unsynced(&self, on: bool) {
        self.state().in_order = !on;
    }

    /// Cuts the power now (if it was not cut already) and returns the disk as it comes back: what was
    /// durable at the cut plus what the seed keeps of the rest. This disk stays powered off.
    #[must_use]
    pub fn crash(&self, seed: u64) -> SimDisk {
        self.crash_keeping(Some(seed))
    }

    /// Cuts the power now (if it was not cut already) and returns the disk with only what was durable:
    /// every unsynced write and directory change lost.
    #[must_use]
    pub fn crash_losing_unsynced(&self) -> SimDisk {
        self.crash_keeping(None)
    }

    fn crash_keeping(&self, seed: Option<u64>) -> SimDisk {
        let mut state = self.state();
        if state.power_off_at.is_none_or(|at| at > state.calls) {
            state.power_off_at = Some(state.calls);
        }
        SimDisk {
            state: Arc::new(Mutex::new(state.after_crash(seed))),
        }
    }

    /// An independent copy of the disk as it is now, unsynced state and switches included (open
    /// locks and fault plans left out).
    #[must_use]
    pub fn copy(&self) -> SimDisk {
        let mut state = self.state().clone();
        state.locks.clear();
        state.faults.clear();
        SimDisk {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// The names of the files in `dir` as they are now (not counted as a call; for tests).
    #[must_use]
    pub fn file_names(&self, dir: &Path) -> Vec<String> {
        self.state()
            .dirs
            .get(dir)
            .map(|d| d.current.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The bytes of the file at `path` as they are now (not counted as a call; for tests).
    #[must_use]
    pub fn file_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state();
        let inode = state.lookup(path).ok()?;
        state.inodes.get(&inode).map(|i| i.current.clone())
    }

    /// The ranges (start, end) that `StorageFile::prepare` was given for the file at `path`, in
    /// order, adjacent ones merged (not counted as a call; for tests: a hint changes no byte).
    #[must_use]
    pub fn prepared_ranges(&self, path: &Path) -> Vec<(u64, u64)> {
        let state = self.state();
        let Ok(inode) = state.lookup(path) else {
            return Vec::new();
        };
        state.inodes.get(&inode).map(|i| i.prepared.clone()).unwrap_or_default()
    }

    /// Replaces the bytes of the file at `path`, durably (not counted as a call; for tests).
    pub fn set_file_bytes(&self, path: &Path, bytes: Vec<u8>) {
        let mut state = self.state();
        if let Ok(inode) = state.lookup(path) {
            if let Ok(inode) = state.inode(inode) {
                inode.current = bytes;
                inode.sync();
            }
        }
    }

    fn open(&self, path: &Path, create: Create) -> io::Result<Box<dyn StorageFile>> {
        let mut state = self.state();
        let kind = match create {
            Create::No(kind) => kind,
            Create::New => CallKind::CreateNew,
            Create::Truncate => CallKind::Create,
        };
        if let Some(fault) = state.enter(kind, path, None) {
            return Err(error(fault));
        }
        let inode = match (state.lookup(path), create) {
            (Ok(_), Create::New) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists", path.display()),
                ))
            }
            (Ok(inode), Create::Truncate) => {
                let file = state.inode(inode)?;
                if !file.current.is_empty() {
                    file.change(Pending::SetLen(0));
                }
                inode
            }
            (Ok(inode), Create::No(_)) => inode,
            (Err(e), Create::No(_)) => return Err(e),
            (Err(_), Create::New | Create::Truncate) => state.create_inode(path)?,
        };
        let handle = state.new_handle();
        let position = num::u64_from_usize(state.inode(inode)?.current.len());
        Ok(Box::new(SimFile {
            state: Arc::clone(&self.state),
            inode,
            handle,
            path: path.to_path_buf(),
            position,
        }))
    }
}

#[derive(Clone, Copy)]
enum Create {
    /// Opens an existing file (the call being `OpenRead` or `OpenAppend`).
    No(CallKind),
    New,
    Truncate,
}

impl Storage for SimDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::CreateDirAll, dir, None) {
            return Err(error(fault));
        }
        // Directories themselves are durable at once: the store never creates one it relies on
        // surviving without having written into it.
        state.dirs.entry(dir.to_path_buf()).or_default();
        Ok(())
    }

    fn try_lock(&self, dir: &Path) -> io::Result<Option<Box<dyn DirLock>>> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::TryLock, dir, None) {
            return Err(error(fault));
        }
        state.dir(dir)?;
        if !state.locks.insert(dir.to_path_buf()) {
            return Ok(None);
        }
        Ok(Some(Box::new(SimLock {
            state: Arc::clone(&self.state),
            dir: dir.to_path_buf(),
        })))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::List, dir, None) {
            return Err(error(fault));
        }
        Ok(state.dir(dir)?.current.keys().cloned().collect())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::Len, path, None) {
            return Err(error(fault));
        }
        let inode = state.lookup(path)?;
        Ok(num::u64_from_usize(state.inode(inode)?.current.len()))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::Read, path, None) {
            return Err(error(fault));
        }
        let inode = state.lookup(path)?;
        Ok(state.inode(inode)?.current.clone())
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.open(path, Create::No(CallKind::OpenRead))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.open(path, Create::No(CallKind::OpenAppend))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.open(path, Create::New)
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.open(path, Create::Truncate)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::Rename, from, None) {
            return Err(error(fault));
        }
        let inode = state.lookup(from)?;
        let (from_dir, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        if from_dir != to_dir {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the simulated disk renames within one directory",
            ));
        }
        state
            .dir(&from_dir)?
            .change(vec![(to_name, Some(inode)), (from_name, None)]);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::Remove, path, None) {
            return Err(error(fault));
        }
        state.lookup(path)?;
        let (dir, name) = split(path)?;
        state.dir(&dir)?.change(vec![(name, None)]);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state();
        if let Some(fault) = state.enter(CallKind::SyncDir, dir, None) {
            return Err(error(fault));
        }
        let skip = state.skip_dir_syncs;
        let entries = state.dir(dir)?;
        if !skip {
            entries.durable.clone_from(&entries.current);
            entries.journal.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
