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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Allocation, DirLock, SharedBytes, Storage, StorageFile};

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

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

#[derive(Debug, Clone)]
enum Pending {
    Write {
        offset: u64,
        bytes: Vec<u8>,
    },
    SetLen(u64),
    /// `allocate`: the length grows to at least this, with zeros.
    Grow(u64),
}

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<Pending>,
    /// The ranges `StorageFile::prepare` was given (start, end), adjacent ones merged: a hint,
    /// kept for tests only, with no effect on the bytes.
    prepared: Vec<(u64, u64)>,
}

impl Inode {
    fn apply(bytes: &mut Vec<u8>, change: &Pending) {
        match change {
            Pending::Write { offset, bytes: data } => {
                let start = usize::try_from(*offset).unwrap_or(usize::MAX);
                let end = start.saturating_add(data.len());
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                if let Some(target) = bytes.get_mut(start..end) {
                    target.copy_from_slice(data);
                }
            }
            Pending::SetLen(len) => bytes.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0),
            Pending::Grow(len) => {
                let len = usize::try_from(*len).unwrap_or(usize::MAX);
                if bytes.len() < len {
                    bytes.resize(len, 0);
                }
            }
        }
    }

    fn change(&mut self, change: Pending) {
        Inode::apply(&mut self.current, &change);
        self.pending.push(change);
    }

    fn sync(&mut self) {
        self.durable.clone_from(&self.current);
        self.pending.clear();
    }

    /// What survives a power loss.
    fn crashed(&self, rng: &mut Rng, in_order: bool) -> Vec<u8> {
        let count = self.pending.len();
        let kept: Vec<bool> = match rng.below(if in_order { 3 } else { 4 }) {
            0 => vec![false; count],
            1 => vec![true; count],
            2 => {
                let prefix = rng.below(count as u64 + 1);
                (0..count).map(|i| (i as u64) < prefix).collect()
            }
            _ => (0..count).map(|_| rng.below(2) == 0).collect(),
        };
        let torn = if in_order {
            // Only the last write that reached the disk may be torn.
            kept.iter()
                .rposition(|keep| *keep)
                .filter(|_| rng.below(2) == 0)
                .map(|i| i as u64)
        } else if count > 0 && rng.below(2) == 0 {
            Some(rng.below(count as u64))
        } else {
            None
        };
        let mut bytes = self.durable.clone();
        for (position, (change, keep)) in self.pending.iter().zip(kept).enumerate() {
            if !keep {
                continue;
            }
            match change {
                Pending::Write { offset, bytes: data } if torn == Some(position as u64) => {
                    let cut = usize::try_from(rng.below(data.len() as u64 + 1)).unwrap_or(0);
                    let prefix = Pending::Write {
                        offset: *offset,
                        bytes: data.get(..cut).unwrap_or_default().to_vec(),
                    };
                    Inode::apply(&mut bytes, &prefix);
                }
                other => Inode::apply(&mut bytes, other),
            }
        }
        bytes
    }
}

/// One atomic change of directory entries: names set to an inode, or removed (`None`).
type DirChange = Vec<(String, Option<u64>)>;

#[derive(Debug, Clone, Default)]
struct Dir {
    durable: BTreeMap<String, u64>,
    current: BTreeMap<String, u64>,
    journal: Vec<DirChange>,
}

impl Dir {
    fn change(&mut self, change: DirChange) {
        for (name, inode) in &change {
            match inode {
                Some(inode) => self.current.insert(name.clone(), *inode),
                None => self.current.remove(name),
            };
        }
        self.journal.push(change);
    }
}

#[derive(Debug, Clone, Copy)]
struct FaultPlan {
    first: u64,
    last: u64,
    fault: Fault,
}

#[derive(Debug, Default, Clone)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    dirs: BTreeMap<PathBuf, Dir>,
    locks: HashSet<PathBuf>,
    /// Calls made so far.
    calls: u64,
    /// Calls from this index on fail with EIO: the power is off.
    power_off_at: Option<u64>,
    faults: Vec<FaultPlan>,
    skip_file_syncs: bool,
    skip_dir_syncs: bool,
    /// Whether a crash keeps only a prefix of each file's unsynced writes.
    in_order: bool,
    /// Every call made, when [`SimDisk::record_calls`] is on.
    log: Option<Vec<Call>>,
    /// The number of the next open file handle.
    next_handle: u64,
}

/// Splits a path into its directory and file name.
fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok((dir, name.to_string_lossy().into_owned()))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found on the simulated disk", path.display()),
    )
}

impl State {
    /// Counts a call (and logs it, if asked) and says whether it must fail, and how.
    fn enter(&mut self, kind: CallKind, path: &Path, handle: Option<u64>) -> Option<Fault> {
        let call = self.calls;
        self.calls += 1;
        let fault = if self.power_off_at.is_some_and(|at| call >= at) {
            Some(Fault::Io)
        } else {
            self.faults
                .iter()
                .find(|plan| (plan.first..=plan.last).contains(&call))
                .map(|plan| plan.fault)
        };
        if let Some(log) = &mut self.log {
            log.push(Call {
                index: call,
                kind,
                path: path.to_path_buf(),
                handle,
                fault,
            });
        }
        fault
    }

    /// A new handle number, noted in the log entry of the call that opened it.
    fn new_handle(&mut self) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        if let Some(call) = self.log.as_mut().and_then(|log| log.last_mut()) {
            call.handle = Some(handle);
        }
        handle
    }

    fn dir(&mut self, dir: &Path) -> io::Result<&mut Dir> {
        self.dirs.get_mut(dir).ok_or_else(|| not_found(dir))
    }

    fn lookup(&self, path: &Path) -> io::Result<u64> {
        let (dir, name) = split(path)?;
        self.dirs
            .get(&dir)
            .and_then(|d| d.current.get(&name))
            .copied()
            .ok_or_else(|| not_found(path))
    }

    fn inode(&mut self, inode: u64) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&inode)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "stale simulated file handle"))
    }

    fn create_inode(&mut self, path: &Path) -> io::Result<u64> {
        let (dir, name) = split(path)?;
        let inode = self.next_inode;
        self.next_inode += 1;
        self.dir(&dir)?.change(vec![(name, Some(inode))]);
        self.inodes.insert(inode, Inode::default());
        Ok(inode)
    }
}

fn error(fault: Fault) -> io::Error {
    match fault {
        Fault::Io | Fault::ShortWrite => io::Error::from_raw_os_error(EIO),
        Fault::NoSpace => io::Error::from_raw_os_error(ENOSPC),
    }
}

/// A deterministic generator (SplitMix64) for the crash choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// An in-memory disk that keeps synced and unsynced state apart and can lose power. See the module
/// documentation for the fault model. Cloning gives another handle on the same disk.
#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<State>>,
    inode: u64,
    handle: u64,
    path: PathBuf,
    /// Where the next append writes.
    position: u64,
}

#[derive(Debug)]
struct SimLock {
    state: Arc<Mutex<State>>,
    dir: PathBuf,
}

impl DirLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        lock(&self.state).locks.remove(&self.dir);
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
        let mut rng = Rng(seed.unwrap_or(0));
        let mut after = State {
            next_inode: state.next_inode,
            skip_file_syncs: state.skip_file_syncs,
            skip_dir_syncs: state.skip_dir_syncs,
            in_order: state.in_order,
            ..State::default()
        };
        for (path, dir) in &state.dirs {
            let mut entries = dir.durable.clone();
            let kept = if seed.is_some() {
                rng.below(dir.journal.len() as u64 + 1)
            } else {
                0
            };
            for change in dir.journal.iter().take(usize::try_from(kept).unwrap_or(usize::MAX)) {
                for (name, inode) in change {
                    match inode {
                        Some(inode) => entries.insert(name.clone(), *inode),
                        None => entries.remove(name),
                    };
                }
            }
            for inode in entries.values() {
                if after.inodes.contains_key(inode) {
                    continue;
                }
                let bytes = state
                    .inodes
                    .get(inode)
                    .map(|i| {
                        if seed.is_some() {
                            i.crashed(&mut rng, state.in_order)
                        } else {
                            i.durable.clone()
                        }
                    })
                    .unwrap_or_default();
                after.inodes.insert(
                    *inode,
                    Inode {
                        durable: bytes.clone(),
                        current: bytes,
                        pending: Vec::new(),
                        prepared: Vec::new(),
                    },
                );
            }
            after.dirs.insert(
                path.clone(),
                Dir {
                    durable: entries.clone(),
                    current: entries,
                    journal: Vec::new(),
                },
            );
        }
        SimDisk {
            state: Arc::new(Mutex::new(after)),
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
        let position = state.inode(inode)?.current.len() as u64;
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

impl SimFile {
    fn enter(&self, kind: CallKind) -> (MutexGuard<'_, State>, Option<Fault>) {
        let mut state = lock(&self.state);
        let fault = state.enter(kind, &self.path, Some(self.handle));
        (state, fault)
    }

    /// A copy of the file's current bytes, or of their first `len` (a `Map` call).
    fn mapped(&self, len: Option<u64>) -> io::Result<SharedBytes> {
        let (mut state, fault) = self.enter(CallKind::Map);
        if let Some(fault) = fault {
            return Err(error(fault));
        }
        let current = state.inode(self.inode)?.current.as_slice();
        let bytes = match len {
            None => current,
            Some(len) => usize::try_from(len)
                .ok()
                .and_then(|len| current.get(..len))
                .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "mapping past the end of the file"))?,
        };
        let bytes: Arc<[u8]> = bytes.into();
        Ok(SharedBytes::new(bytes))
    }
}

/// The effect of `sync_data` / `sync_all` on `inode`, once the call is counted.
fn sync_file(state: &mut State, inode: u64, fault: Option<Fault>) -> io::Result<()> {
    if let Some(fault) = fault {
        return Err(error(fault));
    }
    let skip = state.skip_file_syncs;
    let file = state.inode(inode)?;
    if !skip {
        file.sync();
    }
    Ok(())
}

impl StorageFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (mut state, fault) = self.enter(CallKind::ReadAt);
        if let Some(fault) = fault {
            return Err(error(fault));
        }
        let bytes = &state.inode(self.inode)?.current;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let source = bytes
            .get(start..start.saturating_add(buf.len()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, format!("reading {}", self.path.display())))?;
        buf.copy_from_slice(source);
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let (mut state, fault) = self.enter(CallKind::Append);
        let file = state.inode(self.inode)?;
        let offset = self.position;
        match fault {
            None => {
                file.change(Pending::Write {
                    offset,
                    bytes: bytes.to_vec(),
                });
                drop(state);
                self.position += bytes.len() as u64;
                Ok(())
            }
            Some(Fault::ShortWrite) => {
                let half = bytes.get(..bytes.len() / 2).unwrap_or_default().to_vec();
                file.change(Pending::Write { offset, bytes: half });
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "short write on the simulated disk",
                ))
            }
            Some(fault) => Err(error(fault)),
        }
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let (mut state, fault) = self.enter(CallKind::SyncData);
        sync_file(&mut state, self.inode, fault)
    }

    fn sync_all(&mut self) -> io::Result<()> {
        let (mut state, fault) = self.enter(CallKind::SyncAll);
        sync_file(&mut state, self.inode, fault)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let (mut state, fault) = self.enter(CallKind::SetLen);
        if let Some(fault) = fault {
            return Err(error(fault));
        }
        state.inode(self.inode)?.change(Pending::SetLen(len));
        drop(state);
        self.position = len;
        Ok(())
    }

    fn prepare(&self, offset: u64, len: u64) {
        // Not a call: a hint has no fault to inject and no effect to lose in a crash.
        let mut state = lock(&self.state);
        if let Ok(file) = state.inode(self.inode) {
            let end = offset.saturating_add(len);
            match file.prepared.last_mut() {
                Some(last) if last.1 == offset => last.1 = end,
                _ => file.prepared.push((offset, end)),
            }
        }
    }

    fn allocate(&mut self, len: u64, how: Allocation) -> io::Result<()> {
        let (mut state, fault) = self.enter(CallKind::Allocate);
        // Written zeros may stop part of the way, as an append may; other faults change nothing.
        let short = match fault {
            Some(Fault::ShortWrite) if how == Allocation::Zeroed => true,
            Some(fault) => return Err(error(fault)),
            None => false,
        };
        let file = state.inode(self.inode)?;
        let from = file.current.len() as u64;
        if from < len {
            file.change(match how {
                // A write like any other: a power cut may keep any part of it, or none.
                Allocation::Zeroed => Pending::Write {
                    offset: from,
                    bytes: vec![0; usize::try_from(if short { (len - from) / 2 } else { len - from }).unwrap_or(0)],
                },
                Allocation::Reserved => Pending::Grow(len),
            });
        }
        if short {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write on the simulated disk",
            ));
        }
        Ok(())
    }

    fn map(&self) -> io::Result<SharedBytes> {
        self.mapped(None)
    }

    fn map_prefix(&self, len: u64) -> io::Result<SharedBytes> {
        self.mapped(Some(len))
    }
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
        Ok(state.inode(inode)?.current.len() as u64)
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
mod tests {
    use super::*;

    const DIR: &str = "/d";

    fn disk_with_dir() -> SimDisk {
        let disk = SimDisk::new();
        disk.create_dir_all(Path::new(DIR)).unwrap();
        disk
    }

    fn path(name: &str) -> PathBuf {
        Path::new(DIR).join(name)
    }

    #[test]
    fn synced_data_and_entries_survive_every_crash() {
        let disk = disk_with_dir();
        let mut file = disk.create_new(&path("a")).unwrap();
        file.append(b"hello").unwrap();
        file.sync_data().unwrap();
        disk.sync_dir(Path::new(DIR)).unwrap();
        file.append(b" world").unwrap();
        for seed in 0..200 {
            let after = disk.crash(seed);
            let bytes = after.read(&path("a")).unwrap();
            assert!(bytes.starts_with(b"hello"), "seed {seed}: {bytes:?}");
            assert!(b"hello world".starts_with(&bytes), "seed {seed}: {bytes:?}");
        }
        assert_eq!(disk.crash_losing_unsynced().read(&path("a")).unwrap(), b"hello");
    }

    #[test]
    fn unsynced_entries_roll_back() {
        let disk = disk_with_dir();
        let mut file = disk.create(&path("old")).unwrap();
        file.append(b"old").unwrap();
        file.sync_all().unwrap();
        disk.sync_dir(Path::new(DIR)).unwrap();
        let mut tmp = disk.create(&path("new.tmp")).unwrap();
        tmp.append(b"new").unwrap();
        tmp.sync_all().unwrap();
        disk.rename(&path("new.tmp"), &path("old")).unwrap();
        let lost = disk.crash_losing_unsynced();
        assert_eq!(lost.file_names(Path::new(DIR)), vec!["old".to_string()]);
        assert_eq!(lost.read(&path("old")).unwrap(), b"old");
        // A crash keeps a prefix of the directory's changes: the rename is whole or absent.
        let mut seen = HashSet::new();
        for seed in 0..100 {
            let after = disk.crash(seed);
            let names = after.file_names(Path::new(DIR));
            let old = after.read(&path("old")).unwrap();
            seen.insert((names.clone(), old.clone()));
            assert!(
                (names == ["new.tmp", "old"] && old == b"old")
                    || (names == ["old"] && (old == b"old" || old == b"new")),
                "seed {seed}: {names:?} {old:?}"
            );
        }
        assert_eq!(seen.len(), 3, "every prefix of the changes happens for some seed");
        assert!(disk.remove(&path("old")).is_err(), "a crashed disk stays powered off");
    }

    #[test]
    fn allocated_space_reads_as_zeros_and_appends_write_into_it() {
        let disk = disk_with_dir();
        let mut file = disk.create_new(&path("a")).unwrap();
        disk.sync_dir(Path::new(DIR)).unwrap();
        file.append(b"head").unwrap();
        file.allocate(16, Allocation::Reserved).unwrap();
        assert_eq!(disk.read(&path("a")).unwrap(), b"head\0\0\0\0\0\0\0\0\0\0\0\0");
        // The write position stays where the last append ended, not at the new end of the file.
        file.append(b"body").unwrap();
        assert_eq!(disk.read(&path("a")).unwrap(), b"headbody\0\0\0\0\0\0\0\0");
        // Allocating less than the file holds changes nothing.
        file.allocate(4, Allocation::Zeroed).unwrap();
        assert_eq!(disk.len(&path("a")).unwrap(), 16);
        assert_eq!(&*file.map_prefix(8).unwrap(), b"headbody");
        assert!(file.map_prefix(17).is_err(), "a prefix longer than the file");
        file.sync_data().unwrap();
        // Cutting the zeros moves the write position to the new end.
        file.set_len(8).unwrap();
        file.append(b"tail").unwrap();
        assert_eq!(disk.read(&path("a")).unwrap(), b"headbodytail");
        // Unsynced, the cut, the append and a new allocation may each be lost; what an allocation
        // covers reads as zeros.
        file.allocate(32, Allocation::Reserved).unwrap();
        let mut lengths = HashSet::new();
        for seed in 0..100 {
            let bytes = disk.crash(seed).read(&path("a")).unwrap();
            assert!(bytes.starts_with(b"headbody"), "seed {seed}: {bytes:?}");
            assert!(bytes.len() <= 32, "seed {seed}: {} bytes", bytes.len());
            assert!(
                bytes.iter().skip(12).all(|byte| *byte == 0),
                "seed {seed}: past the append, only zeros: {bytes:?}"
            );
            lengths.insert(bytes.len());
        }
        assert!(lengths.contains(&32) && lengths.contains(&16), "{lengths:?}");
        assert_eq!(
            disk.crash_losing_unsynced().read(&path("a")).unwrap(),
            b"headbody\0\0\0\0\0\0\0\0"
        );
    }

    #[test]
    fn written_zeros_are_a_write_a_power_cut_may_keep_in_part() {
        let disk = disk_with_dir();
        let mut file = disk.create_new(&path("a")).unwrap();
        disk.sync_dir(Path::new(DIR)).unwrap();
        file.append(b"head").unwrap();
        file.sync_data().unwrap();
        file.allocate(64, Allocation::Zeroed).unwrap();
        let mut want = b"head".to_vec();
        want.resize(64, 0);
        assert_eq!(disk.read(&path("a")).unwrap(), want);
        // Allocating less than the file holds writes nothing.
        file.allocate(16, Allocation::Zeroed).unwrap();
        assert_eq!(disk.len(&path("a")).unwrap(), 64);
        // Unlike reserved space, which a power cut keeps whole or not at all, written zeros may be
        // kept up to any point.
        let mut lengths = HashSet::new();
        for seed in 0..300 {
            let bytes = disk.copy().crash(seed).read(&path("a")).unwrap();
            assert!(
                bytes.starts_with(b"head") && bytes.len() <= 64,
                "seed {seed}: {bytes:?}"
            );
            assert!(bytes.iter().skip(4).all(|byte| *byte == 0), "seed {seed}: {bytes:?}");
            lengths.insert(bytes.len());
        }
        assert!(lengths.contains(&4) && lengths.contains(&64), "{lengths:?}");
        assert!(lengths.iter().any(|len| (5..64).contains(len)), "{lengths:?}");
        // The write position stays after the last append.
        file.append(b"body").unwrap();
        assert_eq!(disk.read(&path("a")).unwrap().get(..8), Some(b"headbody".as_slice()));
        // A short write of zeros leaves part of them, like a short append.
        let next = disk.calls();
        disk.fail(next, next, Fault::ShortWrite);
        let error = file.allocate(128, Allocation::Zeroed).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WriteZero);
        assert_eq!(disk.len(&path("a")).unwrap(), 96);
        // Other faults change nothing, whichever the allocation.
        for how in [Allocation::Zeroed, Allocation::Reserved] {
            let next = disk.calls();
            disk.fail(next, next, Fault::NoSpace);
            assert_eq!(file.allocate(256, how).unwrap_err().raw_os_error(), Some(ENOSPC));
            assert_eq!(disk.len(&path("a")).unwrap(), 96);
        }
        file.allocate(128, Allocation::Reserved).unwrap();
        assert_eq!(disk.len(&path("a")).unwrap(), 128);
    }

    #[test]
    fn power_cut_and_faults_fail_calls() {
        let disk = disk_with_dir();
        let mut file = disk.create_new(&path("a")).unwrap();
        let next = disk.calls();
        disk.fail(next, next, Fault::NoSpace);
        assert_eq!(file.append(b"abcd").unwrap_err().raw_os_error(), Some(ENOSPC));
        disk.fail(next + 1, next + 1, Fault::ShortWrite);
        assert_eq!(file.append(b"abcd").unwrap_err().kind(), io::ErrorKind::WriteZero);
        assert_eq!(disk.read(&path("a")).unwrap(), b"ab");
        disk.cut_power_after(1);
        assert!(!disk.is_powered_off());
        file.sync_data().unwrap();
        assert!(disk.is_powered_off());
        assert_eq!(file.append(b"x").unwrap_err().raw_os_error(), Some(EIO));
        assert!(disk.sync_dir(Path::new(DIR)).is_err());
    }

    #[test]
    fn the_call_log_names_each_call_its_handle_and_its_fault() {
        let disk = disk_with_dir();
        disk.record_calls(true);
        let first = disk.calls();
        let mut file = disk.create_new(&path("a")).unwrap();
        disk.fail(first + 2, first + 2, Fault::ShortWrite);
        file.append(b"ab").unwrap();
        assert!(file.append(b"cd").is_err());
        let reader = disk.open_read(&path("a")).unwrap();
        let mut byte = [0u8; 1];
        reader.read_exact_at(&mut byte, 0).unwrap();
        disk.clear_faults();
        disk.sync_dir(Path::new(DIR)).unwrap();
        let log: Vec<(u64, CallKind, Option<u64>, Option<Fault>)> = disk
            .call_log()
            .iter()
            .map(|call| (call.index, call.kind, call.handle, call.fault))
            .collect();
        assert_eq!(
            log,
            vec![
                (first, CallKind::CreateNew, Some(0), None),
                (first + 1, CallKind::Append, Some(0), None),
                (first + 2, CallKind::Append, Some(0), Some(Fault::ShortWrite)),
                (first + 3, CallKind::OpenRead, Some(1), None),
                (first + 4, CallKind::ReadAt, Some(1), None),
                (first + 5, CallKind::SyncDir, None, None),
            ]
        );
        assert_eq!(disk.call_log()[0].path, path("a"));
        assert_eq!(disk.read(&path("a")).unwrap(), b"abc", "half of the short write");
        disk.record_calls(false);
        assert!(disk.call_log().is_empty());
    }

    #[test]
    fn switched_off_syncs_keep_nothing() {
        let disk = disk_with_dir();
        disk.set_sync_files(false);
        disk.set_sync_dirs(false);
        let mut file = disk.create_new(&path("a")).unwrap();
        file.append(b"data").unwrap();
        file.sync_all().unwrap();
        disk.sync_dir(Path::new(DIR)).unwrap();
        assert!(disk.crash_losing_unsynced().file_names(Path::new(DIR)).is_empty());
    }
}
