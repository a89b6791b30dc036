//! [`Spool`]: a rewritten segment on its way to its temporary file, written in steps, by a helper
//! thread once it is large, so that compaction's scan and its writing overlap.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::index::record_crc_at;
use crate::storage::{append_prepared, Storage, StorageFile};

/// Bytes of a rewritten segment buffered before they are written out.
const SPOOL_BYTES: usize = 1 << 20;

/// A rewritten segment on its way to its temporary file, written in steps of [`SPOOL_BYTES`]:
/// compaction never holds a whole segment in memory. A rewrite shorter than a step is written by
/// the compacting thread; from the first full step on, a helper thread writes the steps while the
/// compacting thread goes on with the scan, so that the writing (the kernel's preparing and copying
/// of the pages, about two fifths of a rewrite's time) and the scan overlap. At most three steps
/// are in memory: the one being filled, one queued and one being written.
pub(super) struct Spool {
    path: PathBuf,
    pub(super) buf: Vec<u8>,
    /// Bytes before `buf`: written, or handed to the helper thread in order.
    written: usize,
    out: Out,
}

/// Where a [`Spool`]'s full steps go.
enum Out {
    /// Written on the compacting thread (until the first full step).
    Here(Box<dyn StorageFile>),
    /// Sent to a helper thread, which appends them in order and hands each buffer back for reuse;
    /// it returns the file, or the error that stopped it (after which it takes no more steps).
    Helper {
        steps: crossbeam_channel::Sender<Vec<u8>>,
        spare: crossbeam_channel::Receiver<Vec<u8>>,
        done: std::thread::JoinHandle<Result<Box<dyn StorageFile>>>,
    },
    /// Between the two, or after the helper was joined.
    Gone,
}

impl Spool {
    pub(super) fn create(storage: &dyn Storage, path: &Path) -> Result<Spool> {
        let file = storage
            .create(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        Ok(Spool {
            path: path.to_path_buf(),
            buf: Self::step_buffer(),
            written: 0,
            out: Out::Here(file),
        })
    }

    fn step_buffer() -> Vec<u8> {
        Vec::with_capacity(SPOOL_BYTES + (SPOOL_BYTES >> 2))
    }

    /// The length of the rewritten segment so far.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.written + self.buf.len()
    }

    /// The body CRC of the record at `at`, which is still buffered (the current frame's).
    #[inline]
    pub(super) fn crc_at(&self, at: usize) -> u32 {
        // Buffered: at or after what was written.
        record_crc_at(&self.buf, at - self.written)
    }

    fn write_error(path: &Path, e: std::io::Error) -> Error {
        Error::io(format!("writing {}", path.display()), e)
    }

    /// Hands a full step to the helper thread (started with the first one).
    pub(super) fn write_if_full(&mut self) -> Result<()> {
        if self.buf.len() < SPOOL_BYTES {
            return Ok(());
        }
        if matches!(self.out, Out::Here(_)) {
            if let Out::Here(file) = std::mem::replace(&mut self.out, Out::Gone) {
                self.out = self.start_helper(file)?;
            }
        }
        let Out::Helper { steps, spare, .. } = &self.out else {
            return Err(Error::io(
                format!("writing {}", self.path.display()),
                std::io::Error::other("the rewrite's writer thread is gone"),
            ));
        };
        let next = spare.try_recv().unwrap_or_else(|_| Self::step_buffer());
        let step = std::mem::replace(&mut self.buf, next);
        let len = step.len();
        if steps.send(step).is_err() {
            // The helper stopped at an error: that error is the answer.
            return Err(self.join().err().unwrap_or_else(|| {
                Error::io(
                    format!("writing {}", self.path.display()),
                    std::io::Error::other("the rewrite's writer thread stopped"),
                )
            }));
        }
        self.written += len;
        Ok(())
    }

    /// Starts the helper thread that appends the steps to `file` from offset `self.written`.
    fn start_helper(&self, mut file: Box<dyn StorageFile>) -> Result<Out> {
        let (steps, step_rx) = crossbeam_channel::bounded::<Vec<u8>>(1);
        let (spare_tx, spare) = crossbeam_channel::unbounded();
        let path = self.path.clone();
        let mut at = self.written as u64;
        let done = std::thread::Builder::new()
            .name("ctxlog-rewrite".into())
            .spawn(move || {
                for mut step in step_rx {
                    append_prepared(file.as_mut(), at, &step).map_err(|e| Self::write_error(&path, e))?;
                    at += step.len() as u64;
                    step.clear();
                    // The compacting thread may have finished: then the buffer is simply freed.
                    let _ = spare_tx.send(step);
                }
                Ok(file)
            })
            .map_err(|e| Error::io("starting the rewrite's writer thread", e))?;
        Ok(Out::Helper { steps, spare, done })
    }

    /// Waits for the helper thread to write every step sent, and takes back the file.
    fn join(&mut self) -> Result<Box<dyn StorageFile>> {
        match std::mem::replace(&mut self.out, Out::Gone) {
            Out::Here(file) => Ok(file),
            Out::Helper { steps, done, .. } => {
                drop(steps);
                done.join().unwrap_or_else(|_| {
                    Err(Self::write_error(
                        &self.path,
                        std::io::Error::other("the rewrite's writer thread panicked"),
                    ))
                })
            }
            Out::Gone => Err(Self::write_error(
                &self.path,
                std::io::Error::other("the rewrite's file is gone after an earlier error"),
            )),
        }
    }

    /// Writes the rest and syncs the file; returns its length.
    pub(super) fn finish(mut self) -> Result<usize> {
        let mut file = self.join()?;
        append_prepared(file.as_mut(), self.written as u64, &self.buf).map_err(|e| Self::write_error(&self.path, e))?;
        file.sync_all()
            .map_err(|e| Error::io(format!("syncing {}", self.path.display()), e))?;
        Ok(self.written + self.buf.len())
    }
}

impl Drop for Spool {
    /// A rewrite given up (an error in the scan or in a write) waits for the helper thread, so that
    /// nothing writes to the temporary file once the caller goes on to remove it.
    fn drop(&mut self) {
        let _ = self.join();
    }
}
