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

/// What checking one segment found.
#[derive(Default)]
pub(crate) struct Findings {
    pub(crate) frames: u64,
    pub(crate) records: u64,
    pub(crate) problems: Vec<Problem>,
    /// Whether `pace` stopped the check before the segment's end.
    pub(crate) stopped: bool,
    /// Where the segment sits in the log, if its header is whole and the check went to its end:
    /// its first seq, whether compaction rewrote it, and the seq after its last good frame.
    pub(crate) span: Option<Span>,
}

/// Where a segment sits in the log ([`Findings::span`]).
#[derive(Clone, Copy)]
pub(crate) struct Span {
    base_seq: u64,
    rewritten: bool,
    end_seq: u64,
}

/// Checks that each segment continues the log where the one before it (in `segments`, oldest first,
/// each with its path) ends, adding a problem to the findings of each that does not. A segment
/// whose header is damaged (no span) is passed over.
pub(crate) fn check_chain(segments: &mut [(&Path, &mut Findings)]) {
    let mut previous: Option<Span> = None;
    for (path, findings) in segments.iter_mut() {
        let Some(span) = findings.span else { continue };
        if let Some(before) = previous {
            // A rewritten segment may have lost its last frames: the next one may start later.
            let continues = span.base_seq == before.end_seq || (before.rewritten && span.base_seq > before.end_seq);
            if !continues {
                findings.problems.push(Problem {
                    file: path.to_path_buf(),
                    offset: 16,
                    reason: format!("segment starts at seq {}, expected {}", span.base_seq, before.end_seq),
                });
            }
        }
        previous = Some(span);
    }
}

/// Checks the segment at `path`, whose published bytes are `bytes`: its header, and every frame and
/// record in it (a frame at or after `next_base_seq`, the next segment's first seq, is damage).
/// Where it sits among the others is [`check_chain`]'s to judge, from the findings' span. `pace`
/// is called with the offset reached after each frame; when it says no, the check stops there
/// (and reports nothing of the rest).
pub(crate) fn check_segment(
    path: &Path,
    bytes: &[u8],
    next_base_seq: Option<u64>,
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
    let mut seq = header.base_seq;
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
    findings.span = Some(Span {
        base_seq: header.base_seq,
        rewritten: header.rewrites > 0,
        end_seq: seq,
    });
    findings
}
