//! [`Store::verify`]: reading back every segment, checkpoint and pinned snapshot of a store, and
//! the [`VerifyReport`] of what it found.

use crate::engine::check::{check_chain, check_segment, Findings};
use crate::engine::checkpoint;
use crate::engine::recovery::next_base_seq;
use crate::error::{Error, Result};
use crate::log::segment::read_whole;
use crate::store::Store;

pub use crate::engine::check::Problem;

/// What [`Store::verify`] checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Records whose CRC (and, for items, content hash) was checked.
    pub records_checked: u64,
    /// Frames whose CRC was checked.
    pub frames_checked: u64,
    /// Segment files read.
    pub segments_checked: u64,
    /// Checkpoint files decoded.
    pub checkpoints_checked: u64,
    /// Pinned snapshots whose every visible version was read back.
    pub pins_checked: u64,
    /// Everything that is wrong; empty when the store is sound.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// Whether no problem was found.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Store {
    /// Reads every frame and record of every segment and checks CRCs and content hashes.
    ///
    /// # Errors
    /// `Io` if a segment cannot be read. Damage is reported in the [`VerifyReport`], not as an error.
    pub fn verify(&self) -> Result<VerifyReport> {
        let segments: Vec<_> = self.inner.shared.read_index().segments.values().cloned().collect();
        let mut report = VerifyReport::default();
        let storage = &*self.inner.shared.storage;
        let next_base_seqs: Vec<Option<u64>> = segments
            .iter()
            .skip(1)
            .map(|next| next_base_seq(storage, &next.path))
            .chain([None])
            .collect();
        // Each segment is checked on its own, on up to `read_threads` threads; then whether each
        // continues the one before. The segments are read on this thread alone, one after the
        // other in the log's order (a simulated disk numbers its calls), at most one per checking
        // thread ahead of the checks.
        let checkers = self.inner.shared.read_threads.clamp(1, segments.len().max(1));
        let (to_check, work) = crossbeam_channel::bounded::<(usize, Vec<u8>)>(checkers);
        let (segments_ref, next_ref) = (&segments, &next_base_seqs);
        let mut found: Vec<(usize, Findings)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..checkers)
                .map(|_| {
                    let work = work.clone();
                    scope.spawn(move || {
                        work.iter()
                            .filter_map(|(at, bytes)| {
                                let segment = segments_ref.get(at)?;
                                let next_base_seq = next_ref.get(at).copied().flatten();
                                Some((at, check_segment(&segment.path, &bytes, next_base_seq, &mut |_| true)))
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            drop(work);
            let mut read_error = None;
            for (at, segment) in segments.iter().enumerate() {
                match read_whole(storage, &segment.path) {
                    Ok(mut bytes) => {
                        bytes.truncate(crate::num::usize_from_u64(segment.published_len()));
                        if to_check.send((at, bytes)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        read_error = Some(e);
                        break;
                    }
                }
            }
            drop(to_check);
            let mut found = Vec::new();
            for handle in handles {
                found.extend(handle.join().map_err(|_| {
                    Error::io(
                        "verifying segments",
                        std::io::Error::other("a verifying thread panicked"),
                    )
                })?);
            }
            match read_error {
                Some(e) => Err(e),
                None => Ok(found),
            }
        })?;
        found.sort_by_key(|(at, _)| *at);
        let mut chained: Vec<(&std::path::Path, &mut Findings)> = segments
            .iter()
            .zip(found.iter_mut())
            .map(|(segment, (_, findings))| (segment.path.as_path(), findings))
            .collect();
        check_chain(&mut chained);
        for (_, findings) in found {
            report.segments_checked += 1;
            report.frames_checked += findings.frames;
            report.records_checked += findings.records;
            report.problems.extend(findings.problems);
        }
        self.verify_checkpoints(&mut report)?;
        self.verify_pins(&mut report);
        Ok(report)
    }

    /// Every checkpoint file must decode whole (magic, version, checksum, consistent contents).
    fn verify_checkpoints(&self, report: &mut VerifyReport) -> Result<()> {
        let storage = &*self.inner.shared.storage;
        // A checkpoint written meanwhile (the maintenance thread's) removes the older ones: it holds
        // this lock while it writes and removes, so none listed here vanishes before it is read.
        let _one_at_a_time = self
            .inner
            .shared
            .compaction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, path) in checkpoint::list(storage, &self.inner.shared.dir)? {
            report.checkpoints_checked += 1;
            let bytes = storage
                .read(&path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            if checkpoint::is_older_format(&bytes) {
                continue;
            }
            if let Err(reason) = checkpoint::decode(&bytes) {
                report.problems.push(Problem {
                    file: path,
                    offset: 0,
                    reason,
                });
            }
        }
        Ok(())
    }

    /// Every version a pinned snapshot sees must still read back whole (CRC, identity, SHA-256).
    fn verify_pins(&self, report: &mut VerifyReport) {
        let index = self.inner.shared.read_index();
        for (name, pin) in &index.pins {
            report.pins_checked += 1;
            if pin.seq > index.seq {
                report.problems.push(Problem {
                    file: self.inner.shared.dir.clone(),
                    offset: 0,
                    reason: format!("pin {name:?} is at seq {}, after the log's end {}", pin.seq, index.seq),
                });
            }
            for version in index
                .slots
                .iter()
                .filter(|v| v.is_stored() && index.visible_at(v, pin.seq))
            {
                if let Err(
                    crate::read::record::ReadFailure::Damaged(Error::Corrupt { file, offset, reason })
                    | crate::read::record::ReadFailure::Io(Error::Corrupt { file, offset, reason }),
                ) = crate::read::record::read_item(&index, &version)
                {
                    report.problems.push(Problem {
                        file,
                        offset,
                        reason: format!("pin {name:?} sees {:?}: {reason}", index.id_name(version.id)),
                    });
                }
            }
        }
    }
}
