//! Checked record reads, which every read path uses: finding a version's record in its segment,
//! checking it is the record the index points at (CRC, identity, metadata) and that its content
//! matches its SHA-256, and turning it into an item or its JSON. Damage is told from I/O failure
//! ([`ReadFailure`]). Records found under the index lock can be finished after it is released
//! ([`Located`], [`Held`]).

use std::sync::Arc;

use crate::error::Error;
use crate::index::{record_crc_at, version_tag, Index, Location, VersionEntry};
use crate::item::{content_hash, ContextItem, Scope};
use crate::log::record::{decode_checked_record, decode_record, DecodeError, PutView, RecordView, ScopeView};
use crate::log::segment::{RecordBytes, Segment};
use crate::read::answer::RawItem;
use crate::read::view::expiry_or_never;

/// Why a stored record could not be returned.
pub(crate) enum ReadFailure {
    /// The record is damaged: CRC, hash, or identity does not match the index.
    Damaged(Error),
    /// Reading failed.
    Io(Error),
}

impl ReadFailure {
    /// A failed segment read: damage when the segment says its bytes are wrong, I/O otherwise.
    fn of_segment_read(e: Error) -> ReadFailure {
        match e {
            e @ Error::Corrupt { .. } => ReadFailure::Damaged(e),
            other => ReadFailure::Io(other),
        }
    }
}

impl From<ReadFailure> for Error {
    fn from(failure: ReadFailure) -> Error {
        match failure {
            ReadFailure::Damaged(e) | ReadFailure::Io(e) => e,
        }
    }
}

/// The segment holding `version`'s record, and the record's bytes (borrowed from the map of a
/// sealed segment).
fn record_bytes<'a>(
    index: &'a Index,
    version: &VersionEntry,
) -> Result<(&'a Arc<Segment>, RecordBytes<'a>), ReadFailure> {
    let location = version.location;
    let Some(segment) = index.segments.get(&location.segment) else {
        return Err(ReadFailure::Damaged(Error::Corrupt {
            file: format!("segment {}", location.segment).into(),
            offset: u64::from(location.offset),
            reason: "the segment holding this record is missing".into(),
        }));
    };
    let bytes = segment
        .read(u64::from(location.offset), location.len)
        .map_err(ReadFailure::of_segment_read)?;
    Ok((segment, bytes))
}

fn damaged(index: &Index, version: &VersionEntry, reason: String) -> ReadFailure {
    let file = index.segments.get(&version.location.segment).map_or_else(
        || format!("segment {}", version.location.segment).into(),
        |s| s.path.clone(),
    );
    ReadFailure::Damaged(Error::Corrupt {
        file,
        offset: u64::from(version.location.offset),
        reason,
    })
}

/// Reads the item stored for `version`, checking the record's CRC, that it is the version the index
/// says it is, and the content's SHA-256.
pub(crate) fn read_item(index: &Index, version: &VersionEntry) -> Result<ContextItem, ReadFailure> {
    with_record(index, version, None, |put| item_of(put, &mut Vec::new()))
}

/// The item of a put whose record passed [`checked_put`]: its content decompressed (into
/// `scratch`, which a caller reading many items reuses instead of allocating one buffer per item),
/// checked against its SHA-256 and parsed.
pub(crate) fn item_of(put: &PutView<'_>, scratch: &mut Vec<u8>) -> Result<ContextItem, DecodeError> {
    let content = put.content_in(scratch)?;
    check_content(put, content)?;
    put.to_item_from(content)
}

/// The JSON shape of a put's item, without parsing its content: the envelope is written field by
/// field and the stored canonical content spliced in (decompressed straight into the output when
/// it is stored compressed), after its SHA-256 is checked. The bytes are exactly
/// `serde_json::to_vec` of [`item_of`]'s item.
///
/// `keep` sees the item's confidence and its verified canonical content before the rest is
/// written (the query's filters); when it says no, `Ok(None)`.
pub(crate) fn json_of(
    put: &PutView<'_>,
    keep: impl FnOnce(Option<f64>, &[u8]) -> Result<bool, DecodeError>,
) -> Result<Option<RawItem>, DecodeError> {
    let mut out = Vec::with_capacity(put.json_envelope_len() + put.content_len());
    put.write_json_head(&mut out);
    let start = out.len();
    put.append_content(&mut out)?;
    let content = out.get(start..).unwrap_or_default();
    check_content(put, content)?;
    if !keep(put.confidence, content)? {
        return Ok(None);
    }
    put.write_json_tail(&mut out);
    let json = String::from_utf8(out).map_err(|_| DecodeError("stored content is not UTF-8".into()))?;
    Ok(Some(RawItem::from_checked_json(json)))
}

/// [`json_of`] keeping every item.
pub(crate) fn raw_item_of(put: &PutView<'_>) -> Result<RawItem, DecodeError> {
    // A `keep` that always says yes always gets an item.
    json_of(put, |_, _| Ok(true))?.ok_or_else(|| DecodeError("a raw read that keeps every item kept none".into()))
}

/// Checks canonical content against the SHA-256 its record carries.
fn check_content(put: &PutView<'_>, canonical: &[u8]) -> Result<(), DecodeError> {
    if content_hash(canonical) == put.hash {
        Ok(())
    } else {
        Err(DecodeError("content does not match its SHA-256".into()))
    }
}

/// Reads the put record stored for `version`, checks it ([`checked_put`], against `asked_id` when
/// the read asked for an id) and hands it to `read`, whose error means damage too.
pub(crate) fn with_record<R>(
    index: &Index,
    version: &VersionEntry,
    asked_id: Option<&str>,
    read: impl FnOnce(&PutView<'_>) -> Result<R, DecodeError>,
) -> Result<R, ReadFailure> {
    let (_, bytes) = record_bytes(index, version)?;
    let put = checked_put(index, version, asked_id, &bytes)?;
    read(&put).map_err(|e| damaged(index, version, e.0))
}

/// Decodes the record `bytes` read at `version`'s location, checking its CRC and that it is the put
/// the index points at (body CRC, id, timestamp, version tag, and the rest of the metadata the index
/// keeps). The record's id is compared with `asked_id` when the read asked for one (a resolve, whose
/// lookup compared the index's name for the id with it already), else with the index's name for
/// `version`'s id, which is rebuilt from its front-coded parts for the comparison.
fn checked_put<'b>(
    index: &Index,
    version: &VersionEntry,
    asked_id: Option<&str>,
    bytes: &'b [u8],
) -> Result<PutView<'b>, ReadFailure> {
    if record_crc_at(bytes, 0) != version.location.crc {
        return Err(damaged(
            index,
            version,
            "the record there is not the one the index points at (its CRC differs)".into(),
        ));
    }
    let record = decode_record(bytes).map_err(|e| damaged(index, version, e.0))?;
    let RecordView::Put(put) = record else {
        return Err(damaged(
            index,
            version,
            "the index points at a record that is not an item".into(),
        ));
    };
    let id_matches = match asked_id {
        Some(asked) => put.id == asked,
        None => index.id_name_is(version.id, put.id),
    };
    if !id_matches || version_tag(put.version) != version.version_tag() {
        return Err(damaged(
            index,
            version,
            "the stored record is not the version the index expects".into(),
        ));
    }
    // An id deleted and added again may hold the same (id, version, hash) in both histories, in
    // records of the same length: a record of the other history at this location (a frame copied
    // over another) must not pass for this one.
    if !same_metadata(index, version, &put) {
        return Err(damaged(
            index,
            version,
            "the stored record is another put of this version (its metadata differs from the index)".into(),
        ));
    }
    Ok(put)
}

/// The segments the records of one read lie in, each held once. Holding a segment keeps its
/// records readable after the index lock is released, whatever compaction or the writer does
/// meanwhile: a mapping stays on its file when compaction renames a new one over it, and the bytes
/// below a segment's published length never change (see `storage::file`).
#[derive(Default)]
pub(crate) struct Held {
    /// Each held segment with its number.
    segments: Vec<(u32, Arc<Segment>)>,
}

impl Held {
    /// Holds the segment of `index` (under its lock) that `located`'s record lies in, if it is not
    /// held yet, and notes in `located` where. A read's records mostly come from one segment or a
    /// few, in runs: the last one held is looked at first.
    pub(crate) fn hold(&mut self, index: &Index, located: &mut Located) {
        let number = located.segment;
        if let Some(at) = self.segments.iter().rposition(|(held, _)| *held == number) {
            located.held_at = at;
        } else if let Some(segment) = index.segments.get(&number) {
            self.segments.push((number, Arc::clone(segment)));
            located.held_at = self.segments.len() - 1;
        }
    }

    /// The held segment `located`'s record lies in.
    fn get(&self, located: &Located) -> Option<&Arc<Segment>> {
        self.segments
            .get(located.held_at)
            .and_then(|(number, segment)| (*number == located.segment).then_some(segment))
    }
}

/// What a read does with each put record it returns, given its thread's scratch buffer (for
/// decompressing content): an item, its JSON, or `None` when a content filter leaves it out.
pub(crate) type Finish<'a, T> = dyn Fn(&mut Vec<u8>, &PutView<'_>) -> Result<T, DecodeError> + Sync + 'a;

/// Loads a byte of every 64 of each record at `locations` ([`Segment::touch`]) before they are
/// found and checked: those loads overlap, where the checks, one record after another, would each
/// wait for its record's cache and TLB misses in turn.
pub(crate) fn touch_records<'a>(index: &Index, locations: impl Iterator<Item = &'a Location>) {
    let mut sum = 0u8;
    let mut locations = locations.peekable();
    while let Some(first) = locations.peek() {
        let number = first.segment;
        let mut these = std::iter::from_fn(|| locations.next_if(|location| location.segment == number))
            .map(|location| (location.offset, location.len));
        if let Some(segment) = index.segments.get(&number) {
            sum ^= segment.touch(&mut these);
        }
        // Whatever `touch` left of this segment's locations, so that the loop moves on.
        these.for_each(drop);
    }
    std::hint::black_box(sum);
}

/// Records a query's find step touches at a time, ahead of checking them.
pub(crate) const TOUCH_AHEAD: usize = 16;

/// A put record found and checked ([`checked_put`]) under the index lock. What a read does with it
/// next (decompressing and hashing the content, parsing it or writing the item's JSON) needs no
/// lock: [`Located::finish`] does it after the lock is released, so that long reads do not hold
/// back the writer's publication.
pub(crate) struct Located {
    /// The number of the record's segment.
    segment: u32,
    /// Where the read's [`Held`] holds that segment (set by [`Held::hold`]).
    held_at: usize,
    offset: u32,
    len: u32,
    /// The record's bytes when they are not borrowed from a sealed segment's map (the active
    /// segment's window, shared, or a positioned read's copy past it): kept, rather than read a
    /// second time.
    copied: Option<RecordBytes<'static>>,
    /// The item's confidence, from the record's header (the query's filter on it needs no more).
    pub(crate) confidence: Option<f64>,
}

impl Located {
    /// Finds `version`'s record and checks it against the index (and `asked_id`, as
    /// [`checked_put`]). The caller holds its segment ([`Held::hold`]) before it releases the lock.
    pub(crate) fn find(index: &Index, version: &VersionEntry, asked_id: Option<&str>) -> Result<Located, ReadFailure> {
        let location = version.location;
        let (_, bytes) = record_bytes(index, version)?;
        let confidence = checked_put(index, version, asked_id, &bytes)?.confidence;
        let copied = bytes.detached();
        Ok(Located {
            segment: location.segment,
            held_at: usize::MAX,
            offset: location.offset,
            len: location.len,
            copied,
            confidence,
        })
    }

    /// Decodes the record again (its bytes are those [`Located::find`] checked, CRC included) and
    /// hands it to `read`, whose error means damage.
    pub(crate) fn finish<R>(
        &self,
        held: &Held,
        read: impl FnOnce(&PutView<'_>) -> Result<R, DecodeError>,
    ) -> Result<R, ReadFailure> {
        let Some(segment) = held.get(self) else {
            return Err(ReadFailure::Io(Error::invalid(
                "read",
                "a located record's segment is not held",
            )));
        };
        let damaged = |reason: String| {
            ReadFailure::Damaged(Error::Corrupt {
                file: segment.path.clone(),
                offset: u64::from(self.offset),
                reason,
            })
        };
        let read_again;
        let bytes: &[u8] = if let Some(bytes) = &self.copied {
            bytes
        } else {
            read_again = segment
                .read(u64::from(self.offset), self.len)
                .map_err(ReadFailure::of_segment_read)?;
            &read_again
        };
        let RecordView::Put(put) = decode_checked_record(bytes).map_err(|e| damaged(e.0))? else {
            return Err(damaged("the index points at a record that is not an item".into()));
        };
        read(&put).map_err(|e| damaged(e.0))
    }
}

/// The version string and content hash of a stored or retired version, from its record.
pub(crate) fn read_identity(index: &Index, version: &VersionEntry) -> Result<(String, [u8; 32]), ReadFailure> {
    let (_, bytes) = record_bytes(index, version)?;
    if record_crc_at(&bytes, 0) != version.location.crc {
        return Err(damaged(
            index,
            version,
            "the record there is not the one the index points at (its CRC differs)".into(),
        ));
    }
    let record = decode_record(&bytes).map_err(|e| damaged(index, version, e.0))?;
    let (id, found, hash) = match record {
        RecordView::Put(put) => (put.id, put.version, put.hash),
        RecordView::Retired { id, version, hash, .. } => (id, version, hash),
        _ => {
            return Err(damaged(
                index,
                version,
                "the index points at a record that is not an item".into(),
            ))
        }
    };
    if !index.id_name_is(version.id, id) || version_tag(found) != version.version_tag() {
        return Err(damaged(
            index,
            version,
            "the stored record is not the version the index expects".into(),
        ));
    }
    Ok((found.to_owned(), hash))
}

/// Whether `entry` is version `asked`: the tag decides when it differs, the record when it matches.
pub(crate) fn is_version(index: &Index, entry: &VersionEntry, asked: &str) -> Result<bool, ReadFailure> {
    if entry.version_tag() != version_tag(asked) {
        return Ok(false);
    }
    Ok(read_identity(index, entry)?.0 == asked)
}

/// Whether a put's timestamp, expiry, type, scope and source are those the index has for `version`.
fn same_metadata(index: &Index, version: &VersionEntry, put: &PutView<'_>) -> bool {
    let scope_matches = index
        .scopes
        .value(version.scope)
        .is_some_and(|scope| match (scope, put.scope) {
            (Scope::Session(expected), ScopeView::Session(stored)) => expected == stored,
            (Scope::GlobalReadonly, ScopeView::GlobalReadonly) | (Scope::GlobalWritable, ScopeView::GlobalWritable) => {
                true
            }
            _ => false,
        });
    put.timestamp == version.timestamp()
        && expiry_or_never(put.expires_at()) == crate::read::view::expiry_of(index, version)
        && scope_matches
        && index
            .kinds
            .value(u32::from(version.kind()))
            .is_some_and(|kind| **kind == *put.kind)
        && index
            .sources
            .value(index.source_of(version))
            .is_some_and(|source| **source == *put.source)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A put record of `id` as the index's test puts describe it (same metadata for every id).
    fn record_of(id: &str) -> Vec<u8> {
        let template = crate::index::tests::put(id, "1", 10);
        crate::log::record::encode_put(&crate::log::record::PutRef {
            id,
            kind: template.kind,
            version: template.version,
            scope: &Scope::GlobalWritable,
            source: template.source,
            timestamp: template.timestamp,
            ttl_seconds: None,
            confidence: None,
            hash: &template.hash,
            content: template.content,
            compress: false,
        })
    }

    /// An index that points "aa"'s version at a record of "ab" and gives it that record's CRC (as an
    /// index bug would) is caught by the id check, whether the read asked for "aa" (a resolve,
    /// compared with the asked id) or not (a query, compared with the index's name); the record
    /// of "aa" itself passes both ways.
    #[test]
    fn a_record_of_another_id_is_refused_with_or_without_an_asked_id() {
        let here = crate::index::Location {
            segment: 1,
            offset: 32,
            len: 0,
            crc: 0,
        };
        let mut index = Index::default();
        index.apply_put(1, &crate::index::tests::put("aa", "1", 10), here);
        index.apply_put(2, &crate::index::tests::put("ab", "1", 10), here);
        let aa = index.slot(0).expect("aa's version");
        for (record_id, passes) in [("aa", true), ("ab", false)] {
            let bytes = record_of(record_id);
            let mut version = aa;
            version.location.len = u32::try_from(bytes.len()).expect("len");
            version.location.crc = record_crc_at(&bytes, 0);
            for asked in [Some("aa"), None] {
                match checked_put(&index, &version, asked, &bytes) {
                    Ok(put) => assert!(
                        passes && put.id == "aa",
                        "a record of {record_id:?} passed, asked {asked:?}"
                    ),
                    Err(ReadFailure::Damaged(error)) => {
                        assert!(!passes, "the record of aa refused, asked {asked:?}: {error}");
                        assert!(
                            error.to_string().contains("not the version the index expects"),
                            "{error}"
                        );
                    }
                    Err(ReadFailure::Io(error)) => panic!("no I/O here: {error}"),
                }
            }
        }
    }
}
