//! The change feed read from the log: [`Changes`], every change committed after a sequence
//! number, in order, each once. It reads the segments sequentially, frame by frame (sealed ones
//! from their maps), and decodes only the records' headers and identities, never their content.

use std::collections::VecDeque;
use std::sync::Arc;

use super::change::Change;
use crate::error::{Error, Result};
use crate::item::{expiry, format_hash};
use crate::log::record::{decode_batch, read_frame, PutView, RecordView, ScopeView, FRAME_HEADER_BYTES};
use crate::log::segment::{Segment, SEGMENT_HEADER_BYTES};

/// [`FRAME_HEADER_BYTES`] as a read length (a few bytes: it fits).
pub(crate) const FRAME_HEADER_LEN: u32 = crate::num::low_u32(crate::num::u64_from_usize(FRAME_HEADER_BYTES));

/// A segment as the feed reads it: its number, the segment, and the bytes of it published when
/// the reading started.
#[derive(Clone, Debug)]
pub(crate) struct LogPart {
    pub(crate) number: u32,
    pub(crate) segment: Arc<Segment>,
    pub(crate) end: u64,
}

/// Every durable change with a sequence number above a starting point, in sequence order, each
/// exactly once ([`crate::Store::changes`]). It ends at the store's last sequence number as it was
/// when the iterator was made; [`Change::Expired`] is never in it (expiries are not commits).
///
/// The iterator holds the segments it reads: compaction may rewrite them meanwhile, and it goes on
/// reading the bytes as they were. An item is an error only if a frame cannot be read back (the
/// segment is damaged); the iterator ends after it.
pub struct Changes {
    /// The segments from the one holding the first change on, in order, each with the bytes of it
    /// to read (its published length when the iterator was made).
    segments: VecDeque<LogPart>,
    /// Where the next frame starts in the first segment.
    offset: u64,
    /// Changes at or below this seq are skipped.
    after: u64,
    /// The store's last sequence number when the iterator was made: nothing past it is read.
    last: u64,
    /// The decoded changes of the frame being delivered.
    /// With the type of each delete (which its `Change` does not carry), for filters.
    pending: VecDeque<(Change, Option<String>)>,
    /// Set once an error was returned: the iterator ends.
    failed: bool,
}

impl Changes {
    /// The changes after `after`, read from `segments` (every segment of the store in number order,
    /// with the bytes published in each) up to `last`.
    pub(crate) fn new(segments: Vec<LogPart>, after: u64, last: u64) -> Changes {
        // The first segment to read is the last one that starts at or before the first change.
        let first = segments
            .iter()
            .rposition(|part| part.segment.base_seq <= after.saturating_add(1))
            .unwrap_or(0);
        Changes {
            segments: segments.into_iter().skip(first).collect(),
            offset: SEGMENT_HEADER_BYTES as u64,
            after,
            last,
            pending: VecDeque::new(),
            failed: after >= last,
        }
    }

    /// Reads the next frame with changes to deliver into `pending`; `Ok(false)` at the end.
    fn fill(&mut self) -> Result<bool> {
        loop {
            let Some(part) = self.segments.front() else {
                return Ok(false);
            };
            let (segment, end) = (Arc::clone(&part.segment), part.end);
            if self.offset + FRAME_HEADER_BYTES as u64 > end {
                self.segments.pop_front();
                self.offset = SEGMENT_HEADER_BYTES as u64;
                continue;
            }
            let head = segment.read(self.offset, FRAME_HEADER_LEN)?;
            let (len, seq) = frame_len_and_seq(&head);
            if seq > self.last {
                self.segments.clear();
                return Ok(false);
            }
            let frame_len = FRAME_HEADER_BYTES as u64 + u64::from(len);
            let at = self.offset;
            self.offset += frame_len;
            if seq <= self.after {
                continue;
            }
            let frame_len =
                u32::try_from(frame_len).map_err(|_| corrupt(&segment, at, "frame length overflow".into()))?;
            let bytes = segment.read(at, frame_len)?;
            let (_, payload) = read_frame(&bytes).map_err(|e| corrupt(&segment, at, format!("{e:?}")))?;
            let records = decode_batch(payload).map_err(|e| corrupt(&segment, at, e.0))?;
            // Decoded apart, so that a batch that fails half-way delivers none of its changes.
            let mut batch = VecDeque::new();
            decode_changes(seq, records.into_iter().map(|(_, _, record)| record), &mut batch)
                .map_err(|reason| corrupt(&segment, at, reason))?;
            self.pending = batch;
            if !self.pending.is_empty() {
                return Ok(true);
            }
        }
    }
}

impl Changes {
    /// The next change, with the type of the version a `Deleted` ended (for a type filter).
    pub(crate) fn next_with_kind(&mut self) -> Option<Result<(Change, Option<String>)>> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Some(Ok(change));
            }
            if self.failed {
                return None;
            }
            match self.fill() {
                Ok(true) => {}
                Ok(false) => {
                    self.failed = true;
                    return None;
                }
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl Iterator for Changes {
    type Item = Result<Change>;

    fn next(&mut self) -> Option<Result<Change>> {
        self.next_with_kind().map(|next| next.map(|(change, _)| change))
    }
}

/// The payload length and sequence number of the frame header `head` (checked with the whole frame
/// when it is read).
pub(crate) fn frame_len_and_seq(head: &[u8]) -> (u32, u64) {
    let mut len = [0u8; 4];
    let mut seq = [0u8; 8];
    if let (Some(l), Some(s)) = (head.get(0..4), head.get(9..17)) {
        len.copy_from_slice(l);
        seq.copy_from_slice(s);
    }
    (u32::from_le_bytes(len), u64::from_le_bytes(seq))
}

fn corrupt(segment: &Segment, offset: u64, reason: String) -> Error {
    Error::Corrupt {
        file: segment.path.clone(),
        offset,
        reason: format!("reading the change feed: {reason}"),
    }
}

/// The changes the records of the batch `seq` committed, appended to `out` in the batch's order,
/// each `Deleted` with the type of the version it ended. The batch must be of segment format 3 (its
/// sync mark holds the commit time); one that is not is refused, with the reason. A delete whose
/// record could not name the version it ended (retired by a build older than format 3, so that
/// nobody could see it any more) is no change anyone is told of.
pub(crate) fn decode_changes<'a>(
    seq: u64,
    records: impl Iterator<Item = RecordView<'a>>,
    out: &mut VecDeque<(Change, Option<String>)>,
) -> std::result::Result<(), String> {
    each_change(seq, records, |change, kind, _| out.push_back((change, kind)))
}

/// [`decode_changes`], calling `each(change, kind, expires_at)`: `kind` the type of a deleted
/// version, `expires_at` when an added one expires (`None`: never).
pub(crate) fn each_change<'a>(
    seq: u64,
    records: impl Iterator<Item = RecordView<'a>>,
    mut each: impl FnMut(Change, Option<String>, Option<i64>),
) -> std::result::Result<(), String> {
    each_change_view(seq, records, |view| {
        each(
            view.to_change(seq),
            view.deleted_kind().map(str::to_owned),
            view.expires_at(),
        );
    })
}

/// A change as its record says it, borrowed from the frame: what a reader needs to decide whether
/// it wants the change at all, before it builds one ([`ChangeView::to_change`]).
#[derive(Clone, Copy)]
pub(crate) enum ChangeView<'a> {
    Added {
        put: &'a PutView<'a>,
        committed_at: i64,
    },
    Deleted {
        id: &'a str,
        scope: ScopeView<'a>,
        kind: Option<&'a str>,
        committed_at: i64,
    },
}

impl<'a> ChangeView<'a> {
    /// The id the change concerns.
    pub(crate) fn id(&self) -> &'a str {
        match self {
            ChangeView::Added { put, .. } => put.id,
            ChangeView::Deleted { id, .. } => id,
        }
    }

    /// The type of the item the change concerns, if known.
    pub(crate) fn kind(&self) -> Option<&'a str> {
        match self {
            ChangeView::Added { put, .. } => Some(put.kind),
            ChangeView::Deleted { kind, .. } => *kind,
        }
    }

    /// The type of a deleted version (which its `Change` does not carry).
    pub(crate) fn deleted_kind(&self) -> Option<&'a str> {
        match self {
            ChangeView::Added { .. } => None,
            ChangeView::Deleted { kind, .. } => *kind,
        }
    }

    /// When an added version expires (`None`: never, or not an add).
    pub(crate) fn expires_at(&self) -> Option<i64> {
        match self {
            ChangeView::Added { put, .. } => expiry(put.timestamp, put.ttl_seconds),
            ChangeView::Deleted { .. } => None,
        }
    }

    /// The change, owned, as batch `seq` committed it.
    pub(crate) fn to_change(self, seq: u64) -> Change {
        match self {
            ChangeView::Added { put, committed_at } => Change::Added {
                seq,
                committed_at,
                id: put.id.to_owned(),
                version: put.version.to_owned(),
                hash: format_hash(&put.hash),
                kind: put.kind.to_owned(),
                scope: put.scope.to_scope(),
                timestamp: put.timestamp,
            },
            ChangeView::Deleted {
                id,
                scope,
                committed_at,
                ..
            } => Change::Deleted {
                seq,
                committed_at,
                id: id.to_owned(),
                scope: scope.to_scope(),
            },
        }
    }
}

/// Calls `each` with every change of the records of batch `seq`, in order (see
/// [`decode_changes`]).
pub(crate) fn each_change_view<'a>(
    seq: u64,
    records: impl Iterator<Item = RecordView<'a>>,
    mut each: impl FnMut(ChangeView<'_>),
) -> std::result::Result<(), String> {
    let mut committed_at = None;
    for record in records {
        let at = || committed_at.ok_or_else(|| format!("batch {seq} has no commit time (no format-3 sync mark first)"));
        match record {
            RecordView::SyncMark {
                committed_at: Some(time),
                ..
            } => committed_at = Some(time),
            RecordView::SyncMark { committed_at: None, .. } => {
                return Err(format!("batch {seq} has a sync mark without a commit time"))
            }
            RecordView::Put(put) => each(ChangeView::Added {
                put: &put,
                committed_at: at()?,
            }),
            RecordView::Delete {
                id,
                scope: Some(scope),
                kind,
            } => each(ChangeView::Deleted {
                id,
                scope,
                kind,
                committed_at: at()?,
            }),
            RecordView::Delete { scope: None, .. }
            | RecordView::RegisterType { .. }
            | RecordView::Retired { .. }
            | RecordView::Pin { .. }
            | RecordView::Unpin { .. } => {}
        }
    }
    Ok(())
}
