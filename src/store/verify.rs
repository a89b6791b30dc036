//! [`Store::verify`]: reading back every segment, checkpoint and pinned snapshot of a store, and
//! the [`VerifyReport`] of what it found.

use std::path::PathBuf;

use crate::engine::checkpoint;
use crate::engine::recovery::{next_base_seq, scan_frames, ScanEnd};
use crate::error::{Error, Result};
use crate::item::content_hash;
use crate::log::record::{check_frame_format, decode_batch, RecordView};
use crate::log::segment::{read_whole, Segment, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::storage::Storage;
use crate::store::Store;

/// One problem found by [`Store::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file at fault.
    pub file: PathBuf,
    /// The byte offset in it.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

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
        let mut chain = Chain {
            next_seq: None,
            previous_rewritten: false,
        };
        let storage = &*self.inner.shared.storage;
        let next_base_seqs: Vec<Option<u64>> = segments
            .iter()
            .skip(1)
            .map(|next| next_base_seq(storage, &next.path))
            .chain([None])
            .collect();
        for (segment, next_base_seq) in segments.into_iter().zip(next_base_seqs) {
            report.segments_checked += 1;
            verify_segment(storage, &segment, next_base_seq, &mut chain, &mut report)?;
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

/// Where the segments verified so far leave the log.
struct Chain {
    /// The seq after the last frame of the previous segment whose header was whole.
    next_seq: Option<u64>,
    /// Whether that segment was rewritten by compaction.
    previous_rewritten: bool,
}

/// Checks one segment's header, its place in the log after the previous one, and every frame and
/// record in it (a frame at or after `next_base_seq`, the next segment's first seq, is damage). A
/// segment whose header is damaged leaves `chain` as it was.
fn verify_segment(
    storage: &dyn Storage,
    segment: &Segment,
    next_base_seq: Option<u64>,
    chain: &mut Chain,
    report: &mut VerifyReport,
) -> Result<()> {
    let mut bytes = read_whole(storage, &segment.path)?;
    bytes.truncate(crate::num::usize_from_u64(segment.published_len()));
    let problem = |offset: usize, reason: String| Problem {
        file: segment.path.clone(),
        offset: offset as u64,
        reason,
    };
    let header = match SegmentHeader::decode(&bytes) {
        Ok(header) => header,
        Err(reason) => {
            report.problems.push(problem(0, reason));
            return Ok(());
        }
    };
    let mut seq = chain.next_seq.unwrap_or(header.base_seq);
    // A rewritten segment may have lost its last frames: the next one may start later.
    let continues = header.base_seq == seq || (chain.previous_rewritten && header.base_seq > seq);
    chain.previous_rewritten = header.rewrites > 0;
    if !continues {
        report.problems.push(problem(
            16,
            format!("segment starts at seq {}, expected {seq}", header.base_seq),
        ));
    }
    seq = header.base_seq;
    let mut records_checked = 0u64;
    let mut frames_checked = 0u64;
    let mut damaged_records = Vec::new();
    let end = scan_frames(
        &bytes,
        SEGMENT_HEADER_BYTES,
        &mut seq,
        false,
        header.rewrites > 0,
        &mut |seq, offset, payload| {
            if let Some(base) = next_base_seq.filter(|base| seq >= *base) {
                return Err(format!(
                    "frame has seq {seq}, but the next segment starts at seq {base}"
                ));
            }
            frames_checked += 1;
            let records = decode_batch(payload).map_err(|e| e.0)?;
            check_frame_format(header.version, &records).map_err(|e| e.0)?;
            for (start, _, record) in records {
                if matches!(record, RecordView::SyncMark { .. }) {
                    continue;
                }
                records_checked += 1;
                if let RecordView::Put(put) = record {
                    let intact = put.content().is_ok_and(|content| content_hash(&content) == put.hash);
                    if !intact {
                        damaged_records.push((
                            offset + start,
                            format!("content of {:?} does not match its hash", put.id),
                        ));
                    }
                }
            }
            Ok(())
        },
    );
    report.records_checked += records_checked;
    report.frames_checked += frames_checked;
    for (offset, reason) in damaged_records {
        report.problems.push(problem(offset, reason));
    }
    if let ScanEnd::Bad { offset, reason, .. } = end {
        report.problems.push(problem(offset, reason));
    }
    chain.next_seq = Some(seq);
    Ok(())
}
