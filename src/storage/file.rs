//! The real backend: `std::fs`, and `memmap2` for segments and checkpoints. The crate's only `unsafe`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::Mmap;

use super::{DirLock, SharedBytes, Storage, StorageFile};

/// Files in a directory of the operating system's file system. The default.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileStorage;

#[derive(Debug)]
struct RealFile(File);

#[derive(Debug)]
struct LockFile(#[allow(dead_code, reason = "held for its lock, released when dropped")] File);

impl DirLock for LockFile {}

impl StorageFile for RealFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    #[expect(
        unsafe_code,
        reason = "mapping a segment or a checkpoint is the crate's one unsafe operation"
    )]
    fn map(&self) -> io::Result<SharedBytes> {
        // SAFETY: ctxlog maps sealed segments and checkpoint files, which no ctxlog code writes,
        // truncates or renames while the store is open (the LOCK file keeps other ctxlog processes
        // out; compaction renames a new file over the path, which leaves this mapping on the old file;
        // a checkpoint is written whole under a temporary name, and later only removed, which leaves
        // the mapping on the removed file), and the active segment, which the writer thread only
        // appends to while the store is open (a torn tail is cut only by recovery, before any map):
        // the mapping covers the file's length at this call, every page of it stays backed by the
        // file, and appends change only bytes past it. A process that ignores
        // the lock and modifies the file could change the mapped bytes under us; every read of mapped
        // bytes is bounds-checked and CRC-checked, so such damage is reported as corruption, not
        // undefined reads.
        let map = unsafe { Mmap::map(&self.0) }?;
        Ok(SharedBytes::new(map))
    }
}

impl Storage for FileStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn try_lock(&self, dir: &Path) -> io::Result<Option<Box<dyn DirLock>>> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        match lock.try_lock() {
            Ok(()) => Ok(Some(Box::new(LockFile(lock)))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(RealFile(File::open(path)?)))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).append(true).open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().create_new(true).append(true).read(true).open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().create(true).truncate(true).write(true).open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
