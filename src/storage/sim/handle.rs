//! What the simulated disk hands out: open files ([`SimFile`], the `StorageFile` calls on one
//! inode) and directory locks ([`SimLock`]).

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::num;
use crate::storage::{Allocation, DirLock, SharedBytes, StorageFile};

use super::state::{error, lock, Pending, State};
use super::{CallKind, Fault};

/// An open file of the simulated disk.
#[derive(Debug)]
pub(super) struct SimFile {
    pub(super) state: Arc<Mutex<State>>,
    pub(super) inode: u64,
    /// Its number in the call log.
    pub(super) handle: u64,
    pub(super) path: PathBuf,
    /// Where the next append writes.
    pub(super) position: u64,
}

/// The lock of a directory of the simulated disk, released when dropped.
#[derive(Debug)]
pub(super) struct SimLock {
    pub(super) state: Arc<Mutex<State>>,
    pub(super) dir: PathBuf,
}

impl DirLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        lock(&self.state).locks.remove(&self.dir);
    }
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
            Some(len) => current
                .get(..num::usize_from_u64(len))
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
        let start = num::usize_from_u64(offset);
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
                self.position += num::u64_from_usize(bytes.len());
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
        let from = num::u64_from_usize(file.current.len());
        if from < len {
            file.change(match how {
                // A write like any other: a power cut may keep any part of it, or none.
                Allocation::Zeroed => Pending::Write {
                    offset: from,
                    bytes: vec![0; num::usize_from_u64(if short { (len - from) / 2 } else { len - from })],
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
