//! Checking a segment's bytes whole: its header, its place in the log, every frame's CRC and seq,
//! every record's CRC and every put's content against its SHA-256. `Store::verify` checks every
//! segment at once; the scrub ([`super::scrub`]) checks them again and again at a bounded pace.

use std::path::{Path, PathBuf};

use crate::engine::recovery::{scan_frames, ScanEnd};
use crate::item::content_hash;
use crate::log::record::{check_frame_format, decode_batch, RecordView, FRAME_HEADER_BYTES};
use crate::log::segment::{SegmentHeader, SEGMENT_HEADER_BYTES};

/// One problem found by [`Store::verify`](crate::Store::verify) or the scrub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file at fault.
    pub file: PathBuf,
    /// The byte offset in it.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

/// Where the segments checked so far leave the log.
#[derive(Default)]
pub(crate) struct Chain {
    /// The seq after the last frame of the previous segment whose header was whole.
    pub(crate) next_seq: Option<u64>,
    /// Whether that segment was rewritten by compaction.
    pub(crate) previous_rewritten: bool,
}

/// What checking one segment found.
#[derive(Default)]
pub(crate) struct Findings {
    pub(crate) frames: u64,
    pub(crate) records: u64,
    pub(crate) problems: Vec<Problem>,
    /// Whether `pace` stopped the check before the segment's end.
    pub(crate) stopped: bool,
}

/// Checks the segment at `path`, whose published bytes are `bytes`: its header, its place in the
/// log after the previous one (`chain`; a segment whose header is damaged leaves it as it was), and
/// every frame and record in it (a frame at or after `next_base_seq`, the next segment's first seq,
/// is damage). `pace` is called with the offset reached after each frame; when it says no, the
/// check stops there (and reports nothing of the rest).
pub(crate) fn check_segment(
    path: &Path,
    bytes: &[u8],
    next_base_seq: Option<u64>,
    chain: &mut Chain,
    pace: &mut dyn FnMut(usize) -> bool,
) -> Findings {
    let problem = |offset: usize, reason: String| Problem {
        file: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    let mut findings = Findings::default();
    let header = match SegmentHeader::decode(bytes) {
        Ok(header) => header,
        Err(reason) => {
            findings.problems.push(problem(0, reason));
            return findings;
        }
    };
    let mut seq = chain.next_seq.unwrap_or(header.base_seq);
    // A rewritten segment may have lost its last frames: the next one may start later.
    let continues = header.base_seq == seq || (chain.previous_rewritten && header.base_seq > seq);
    chain.previous_rewritten = header.rewrites > 0;
    if !continues {
        findings.problems.push(problem(
            16,
            format!("segment starts at seq {}, expected {seq}", header.base_seq),
        ));
    }
    seq = header.base_seq;
    let mut damaged_records = Vec::new();
    let (mut frames, mut records, mut stopped) = (0u64, 0u64, false);
    let end = scan_frames(
        bytes,
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
            frames += 1;
            let decoded = decode_batch(payload).map_err(|e| e.0)?;
            check_frame_format(header.version, &decoded).map_err(|e| e.0)?;
            for (start, _, record) in decoded {
                if matches!(record, RecordView::SyncMark { .. }) {
                    continue;
                }
                records += 1;
                if let RecordView::Put(put) = record {
                    let intact = put.content().is_ok_and(|content| content_hash(&content) == put.hash);
                    if !intact {
                        // `offset` is the frame's; `start` is the record's in the frame's payload.
                        damaged_records.push((
                            offset + FRAME_HEADER_BYTES + start,
                            format!("content of {:?} does not match its hash", put.id),
                        ));
                    }
                }
            }
            if !pace(offset + payload.len()) {
                // Ends the scan here; what it reports is not a problem.
                stopped = true;
                return Err(String::new());
            }
            Ok(())
        },
    );
    findings.frames = frames;
    findings.records = records;
    for (offset, reason) in damaged_records {
        findings.problems.push(problem(offset, reason));
    }
    findings.stopped = stopped;
    if stopped {
        return findings;
    }
    if let ScanEnd::Bad { offset, reason, .. } = end {
        findings.problems.push(problem(offset, reason));
    }
    chain.next_seq = Some(seq);
    findings
}
