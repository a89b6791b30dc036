//! The real backend: `std::fs`, and `memmap2` for segments and checkpoints. The crate's only `unsafe`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::MmapOptions;

use super::{Allocation, DirLock, SharedBytes, Storage, StorageFile};

/// Zeros to write from, for [`Allocation::Zeroed`].
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Files in a directory of the operating system's file system. The default.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileStorage;

/// An open file and its write position (files are not opened `O_APPEND`: an allocated tail must
/// not move where the next append goes).
#[derive(Debug)]
struct RealFile {
    file: File,
    position: u64,
}

impl RealFile {
    /// `file`, writing at its end.
    fn at_end(file: File) -> io::Result<RealFile> {
        let position = file.metadata()?.len();
        Ok(RealFile { file, position })
    }
}

#[derive(Debug)]
struct LockFile(#[allow(dead_code, reason = "held for its lock, released when dropped")] File);

impl DirLock for LockFile {}

impl StorageFile for RealFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, self.position)?;
        self.position += bytes.len() as u64;
        Ok(())
    }

    fn allocate(&mut self, len: u64, how: Allocation) -> io::Result<()> {
        let Some(ahead) = len.checked_sub(self.position).filter(|ahead| *ahead > 0) else {
            return Ok(());
        };
        if how == Allocation::Zeroed {
            // From the write position: everything before it is written, and rewriting zeros already
            // allocated past it is harmless.
            let mut at = self.position;
            while at < len {
                let step = (len - at).min(ZEROS.len() as u64);
                self.file
                    .write_all_at(ZEROS.get(..crate::num::usize_from_u64(step)).unwrap_or_default(), at)?;
                at += step;
            }
            return Ok(());
        }
        #[cfg(target_os = "linux")]
        {
            // Mode 0, from the write position (everything before it is written): the length grows
            // to `len` if shorter, the new range reads as zeros and its blocks are reserved.
            let flags = rustix::fs::FallocateFlags::empty();
            loop {
                match rustix::fs::fallocate(&self.file, flags, self.position, ahead) {
                    Ok(()) => return Ok(()),
                    // Interrupted by a signal: as `std` does for its own calls, try again.
                    Err(rustix::io::Errno::INTR) => {}
                    // File systems without fallocate: grow the length alone (sparse), as elsewhere.
                    Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if self.file.metadata()?.len() < len {
            self.file.set_len(len)?;
        }
        Ok(())
    }

    fn prepare(&self, offset: u64, len: u64) {
        // Reading ahead space that `allocate` reserved puts zeroed pages in the page cache without
        // any disk read (the file system knows the blocks were never written), so the appends
        // into them copy into pages already there instead of getting each new page on the way.
        #[cfg(target_os = "linux")]
        if let Some(len) = std::num::NonZeroU64::new(len) {
            if let Err(e) = rustix::fs::fadvise(&self.file, offset, Some(len), rustix::fs::Advice::WillNeed) {
                tracing::debug!("preparing {len} bytes at {offset} for appends: {e}");
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (offset, len);
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.position = len;
        Ok(())
    }

    fn map(&self) -> io::Result<SharedBytes> {
        self.map_len(self.file.metadata()?.len())
    }

    fn map_prefix(&self, len: u64) -> io::Result<SharedBytes> {
        if self.file.metadata()?.len() < len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "mapping past the end of the file",
            ));
        }
        self.map_len(len)
    }
}

impl RealFile {
    /// Maps the file's first `len` bytes, which the caller has checked are within the file.
    #[expect(
        unsafe_code,
        reason = "mapping a segment or a checkpoint is the crate's one unsafe operation"
    )]
    fn map_len(&self, len: u64) -> io::Result<SharedBytes> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("mapping longer than the address space"))?;
        // SAFETY: ctxlog maps three kinds of files, and no ctxlog code changes a mapped byte while
        // the store is open (the LOCK file keeps other ctxlog processes out):
        // - sealed segments and checkpoint files, whole: nothing writes or truncates them;
        //   compaction renames a new file over a segment's path, which leaves this mapping on the
        //   old file; a checkpoint is written whole under a temporary name and later only removed,
        //   which leaves the mapping on the removed file;
        // - the active segment, up to its published length only: the writer thread writes it only
        //   at its write position, never before the published length (the space it allocates
        //   ahead is written later, past the mapped bytes), and truncates it only when sealing it,
        //   to that position; a torn tail is cut only by recovery, before any map of the file but
        //   one: the mapping recovery reads the segment its checkpoint resumes in through, which it
        //   drops before it cuts that segment's tail.
        // So every mapped page stays backed by the file and the mapped bytes never change. A
        // process that ignores the lock and modifies the file could change them under us; every
        // read of mapped bytes is bounds-checked and CRC-checked, so such damage is reported as
        // corruption, not undefined reads.
        let map = unsafe { MmapOptions::new().len(len).map(&self.file) }?;
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
        // Opened read-only: nothing is written through it, so no write position to look up.
        Ok(Box::new(RealFile {
            file: File::open(path)?,
            position: 0,
        }))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(RealFile::at_end(file)?))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().create_new(true).write(true).read(true).open(path)?;
        Ok(Box::new(RealFile { file, position: 0 }))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().create(true).truncate(true).write(true).open(path)?;
        Ok(Box::new(RealFile { file, position: 0 }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_written_ahead_read_as_zeros_and_are_data_not_reserved_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let mut file = FileStorage.create_new(&path).unwrap();
        file.append(b"head").unwrap();
        // More than one step of the zeros written from.
        let len = 3 * ZEROS.len() as u64 + 5;
        file.allocate(len, Allocation::Zeroed).unwrap();
        file.sync_data().unwrap();
        let bytes = FileStorage.read(&path).unwrap();
        assert_eq!(bytes.len() as u64, len);
        assert_eq!(&bytes[..4], b"head");
        assert!(bytes[4..].iter().all(|byte| *byte == 0));
        file.append(b"body").unwrap();
        assert_eq!(&*file.map_prefix(8).unwrap(), b"headbody");
        #[cfg(target_os = "linux")]
        {
            // Where the file system tells reserved blocks from written ones (ext4, xfs: reserved
            // blocks are holes to SEEK_DATA once synced), the zeros are data to the last byte; the
            // reserved space after them is not.
            file.allocate(len + (1 << 20), Allocation::Reserved).unwrap();
            file.sync_data().unwrap();
            let data_at = |offset: u64| {
                let file = std::fs::File::open(&path).unwrap();
                // Reading the file cached its pages, which SEEK_DATA takes for data: drop them.
                rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
                rustix::fs::seek(&file, rustix::fs::SeekFrom::Data(offset)).ok()
            };
            let tells_them_apart = data_at(len + 4096).is_none();
            if tells_them_apart {
                assert_eq!(data_at(len - 1), Some(len - 1));
            } else {
                eprintln!("this file system does not tell reserved blocks from data");
            }
        }
    }

    /// A new file "a" in a temporary directory holding `head`, with space reserved to `len` bytes.
    fn head_and_reserved_space(len: u64) -> (tempfile::TempDir, std::path::PathBuf, Box<dyn StorageFile>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let mut file = FileStorage.create_new(&path).unwrap();
        file.append(b"head").unwrap();
        file.allocate(len, Allocation::Reserved).unwrap();
        (dir, path, file)
    }

    #[test]
    fn allocated_space_reads_as_zeros_and_appends_write_into_it() {
        let (_dir, path, mut file) = head_and_reserved_space(1 << 16);
        assert_eq!(FileStorage.len(&path).unwrap(), 1 << 16);
        // The write position stays after the last append, not at the new end of the file.
        file.append(b"body").unwrap();
        let bytes = FileStorage.read(&path).unwrap();
        assert_eq!(bytes.len(), 1 << 16);
        assert_eq!(&bytes[..8], b"headbody");
        assert!(bytes[8..].iter().all(|byte| *byte == 0));
        // Allocating less than the file holds changes nothing.
        file.allocate(4, Allocation::Zeroed).unwrap();
        assert_eq!(FileStorage.len(&path).unwrap(), 1 << 16);
        assert_eq!(&*file.map_prefix(8).unwrap(), b"headbody");
        assert!(file.map_prefix((1 << 16) + 1).is_err(), "a prefix longer than the file");
        // Cutting the zeros moves the write position to the new end.
        file.set_len(8).unwrap();
        file.append(b"tail").unwrap();
        file.sync_data().unwrap();
        assert_eq!(FileStorage.read(&path).unwrap(), b"headbodytail");
        // A file opened again writes at its end.
        let mut again = FileStorage.open_append(&path).unwrap();
        again.append(b"!").unwrap();
        assert_eq!(FileStorage.read(&path).unwrap(), b"headbodytail!");
        assert_eq!(&*again.map().unwrap(), b"headbodytail!");
    }

    #[test]
    fn prepared_space_still_reads_as_zeros_and_takes_appends_as_any_other() {
        let (_dir, path, mut file) = head_and_reserved_space(1 << 20);
        file.sync_data().unwrap();
        // Prepared (pages of zeros in the page cache), across the file's end, and past it.
        file.prepare(4, 1 << 20);
        file.prepare(2 << 20, 4096);
        file.prepare(0, 0);
        assert_eq!(FileStorage.len(&path).unwrap(), 1 << 20);
        let bytes = FileStorage.read(&path).unwrap();
        assert_eq!(&bytes[..4], b"head");
        assert!(
            bytes[4..].iter().all(|byte| *byte == 0),
            "prepared space does not read as zeros"
        );
        // Appends into it land where they are written, durably, around the zeros still prepared.
        let body: Vec<u8> = (0..300_000u32).map(|n| (n % 251) as u8).collect();
        file.append(&body).unwrap();
        file.sync_data().unwrap();
        let bytes = FileStorage.read(&path).unwrap();
        assert_eq!(bytes.len(), 1 << 20);
        assert_eq!(&bytes[4..4 + body.len()], &body[..]);
        assert!(bytes[4 + body.len()..].iter().all(|byte| *byte == 0));
        file.set_len(4 + body.len() as u64).unwrap();
        assert_eq!(&*file.map().unwrap(), &[&b"head"[..], &body].concat()[..]);
    }
}
