//! The simulated disk's state: files (inodes) and directories, each keeping its durable state apart
//! from the changes made since its last sync, and what a power cut leaves of them; the count of
//! calls, the faults planned and the switches.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::num;

use super::{Call, CallKind, Fault};

pub(super) const EIO: i32 = 5;
pub(super) const ENOSPC: i32 = 28;

/// A change to a file not yet synced.
#[derive(Debug, Clone)]
pub(super) enum Pending {
    Write {
        offset: u64,
        bytes: Vec<u8>,
    },
    SetLen(u64),
    /// `allocate`: the length grows to at least this, with zeros.
    Grow(u64),
}

/// A file: its durable bytes, its bytes as they are now, and the changes between them.
#[derive(Debug, Clone, Default)]
pub(super) struct Inode {
    pub(super) durable: Vec<u8>,
    pub(super) current: Vec<u8>,
    pub(super) pending: Vec<Pending>,
    /// The ranges `StorageFile::prepare` was given (start, end), adjacent ones merged: a hint,
    /// kept for tests only, with no effect on the bytes.
    pub(super) prepared: Vec<(u64, u64)>,
}

impl Inode {
    fn apply(bytes: &mut Vec<u8>, change: &Pending) {
        match change {
            Pending::Write { offset, bytes: data } => {
                let start = num::usize_from_u64(*offset);
                let end = start.saturating_add(data.len());
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                if let Some(target) = bytes.get_mut(start..end) {
                    target.copy_from_slice(data);
                }
            }
            Pending::SetLen(len) => bytes.resize(num::usize_from_u64(*len), 0),
            Pending::Grow(len) => {
                let len = num::usize_from_u64(*len);
                if bytes.len() < len {
                    bytes.resize(len, 0);
                }
            }
        }
    }

    pub(super) fn change(&mut self, change: Pending) {
        Inode::apply(&mut self.current, &change);
        self.pending.push(change);
    }

    pub(super) fn sync(&mut self) {
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
                let prefix = num::usize_from_u64(rng.below(num::u64_from_usize(count) + 1));
                (0..count).map(|i| i < prefix).collect()
            }
            _ => (0..count).map(|_| rng.below(2) == 0).collect(),
        };
        let torn = if in_order {
            // Only the last write that reached the disk may be torn.
            kept.iter().rposition(|keep| *keep).filter(|_| rng.below(2) == 0)
        } else if count > 0 && rng.below(2) == 0 {
            Some(num::usize_from_u64(rng.below(num::u64_from_usize(count))))
        } else {
            None
        };
        let mut bytes = self.durable.clone();
        for (position, (change, keep)) in self.pending.iter().zip(kept).enumerate() {
            if !keep {
                continue;
            }
            match change {
                Pending::Write { offset, bytes: data } if torn == Some(position) => {
                    let cut = num::usize_from_u64(rng.below(num::u64_from_usize(data.len()) + 1));
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
pub(super) type DirChange = Vec<(String, Option<u64>)>;

/// A directory: its durable entries, its entries as they are now, and the changes between them.
#[derive(Debug, Clone, Default)]
pub(super) struct Dir {
    pub(super) durable: BTreeMap<String, u64>,
    pub(super) current: BTreeMap<String, u64>,
    pub(super) journal: Vec<DirChange>,
}

impl Dir {
    pub(super) fn change(&mut self, change: DirChange) {
        for (name, inode) in &change {
            match inode {
                Some(inode) => self.current.insert(name.clone(), *inode),
                None => self.current.remove(name),
            };
        }
        self.journal.push(change);
    }
}

/// Calls `first..=last` fail with `fault`.
#[derive(Debug, Clone, Copy)]
pub(super) struct FaultPlan {
    pub(super) first: u64,
    pub(super) last: u64,
    pub(super) fault: Fault,
}

/// Everything the disk holds and knows, behind one lock.
#[derive(Debug, Default, Clone)]
pub(super) struct State {
    pub(super) inodes: HashMap<u64, Inode>,
    pub(super) next_inode: u64,
    pub(super) dirs: BTreeMap<PathBuf, Dir>,
    pub(super) locks: HashSet<PathBuf>,
    /// Calls made so far.
    pub(super) calls: u64,
    /// Calls from this index on fail with EIO: the power is off.
    pub(super) power_off_at: Option<u64>,
    pub(super) faults: Vec<FaultPlan>,
    pub(super) skip_file_syncs: bool,
    pub(super) skip_dir_syncs: bool,
    /// Whether a crash keeps only a prefix of each file's unsynced writes.
    pub(super) in_order: bool,
    /// Every call made, when [`SimDisk::record_calls`](super::SimDisk::record_calls) is on.
    pub(super) log: Option<Vec<Call>>,
    /// The number of the next open file handle.
    pub(super) next_handle: u64,
}

/// Splits a path into its directory and file name.
pub(super) fn split(path: &Path) -> io::Result<(PathBuf, String)> {
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
    pub(super) fn enter(&mut self, kind: CallKind, path: &Path, handle: Option<u64>) -> Option<Fault> {
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
    pub(super) fn new_handle(&mut self) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        if let Some(call) = self.log.as_mut().and_then(|log| log.last_mut()) {
            call.handle = Some(handle);
        }
        handle
    }

    pub(super) fn dir(&mut self, dir: &Path) -> io::Result<&mut Dir> {
        self.dirs.get_mut(dir).ok_or_else(|| not_found(dir))
    }

    pub(super) fn lookup(&self, path: &Path) -> io::Result<u64> {
        let (dir, name) = split(path)?;
        self.dirs
            .get(&dir)
            .and_then(|d| d.current.get(&name))
            .copied()
            .ok_or_else(|| not_found(path))
    }

    pub(super) fn inode(&mut self, inode: u64) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&inode)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "stale simulated file handle"))
    }

    pub(super) fn create_inode(&mut self, path: &Path) -> io::Result<u64> {
        let (dir, name) = split(path)?;
        let inode = self.next_inode;
        self.next_inode += 1;
        self.dir(&dir)?.change(vec![(name, Some(inode))]);
        self.inodes.insert(inode, Inode::default());
        Ok(inode)
    }

    /// The state a disk comes back with after a power cut: every directory's durable entries and
    /// every file's durable bytes, plus, with a seed, what the seed keeps of the changes made since
    /// their last syncs (see the module documentation). The switches carry over; the call count,
    /// the fault plans, the locks and the call log start afresh.
    pub(super) fn after_crash(&self, seed: Option<u64>) -> State {
        let mut rng = Rng(seed.unwrap_or(0));
        let mut after = State {
            next_inode: self.next_inode,
            skip_file_syncs: self.skip_file_syncs,
            skip_dir_syncs: self.skip_dir_syncs,
            in_order: self.in_order,
            ..State::default()
        };
        for (path, dir) in &self.dirs {
            let mut entries = dir.durable.clone();
            let kept = if seed.is_some() {
                rng.below(num::u64_from_usize(dir.journal.len()) + 1)
            } else {
                0
            };
            for change in dir.journal.iter().take(num::usize_from_u64(kept)) {
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
                let bytes = self
                    .inodes
                    .get(inode)
                    .map(|i| {
                        if seed.is_some() {
                            i.crashed(&mut rng, self.in_order)
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
        after
    }
}

/// The error a call made to fail with `fault` returns.
pub(super) fn error(fault: Fault) -> io::Error {
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

/// Locks the disk's state, even after a panic of another holder (a test that failed).
pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
