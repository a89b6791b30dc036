//! Read views: [`Snapshot`] (a view fixed at a sequence number and a clock time), [`Resolution`],
//! and reading a version's record back with every check on the way.

use std::sync::Arc;

use serde::Serialize;
use sha2::Digest;

use crate::error::{Error, Result};
use crate::index::{record_crc_at, version_tag, Index, Location, VersionEntry, NEVER_EXPIRES};
use crate::item::{canonical_json, content_hash, format_hash, validate_name, validate_version, ContextItem, Scope};
use crate::limits::PARALLEL_READ_ITEMS_MIN;
use crate::log::record::{decode_checked_record, decode_record, DecodeError, PutView, RecordView, ScopeView};
use crate::log::segment::{RecordBytes, Segment};
use crate::log::writer::Op;
use crate::query::{self, scope_visible, ContextQuery, QueryStats, ViewBounds};
use crate::store::Shared;

/// The answer for one reference of a `resolve`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Resolution {
    /// The reference names the id's latest version (or just the id): here it is.
    Found(ContextItem),
    /// No such id, no such version, or an id the reader may not see.
    NotFound {
        /// The reference as it was given.
        reference: String,
    },
    /// The id's latest version has expired; `id@version` references of it answer the same.
    Expired {
        /// The id.
        id: String,
        /// When it expired, UTC seconds.
        expired_at: i64,
    },
    /// `id@version` names an earlier version of a live id; `latest` is the current item.
    Superseded {
        /// The id.
        id: String,
        /// The version that was asked for.
        requested_version: String,
        /// The id's latest version.
        latest: ContextItem,
    },
    /// The stored bytes no longer match their checksum or hash: damage is reported, never returned.
    HashMismatch {
        /// The id whose record is damaged.
        id: String,
    },
}

/// An item as its JSON shape (see [`ContextItem`]), read without parsing its content: what a server
/// that forwards JSON unchanged sends on.
///
/// The bytes are exactly those `serde_json::to_vec(&item)` gives for the [`ContextItem`] the parsed
/// read ([`Snapshot::resolve`], [`Snapshot::get`]) returns: the store writes the envelope field by
/// field and splices in the content's stored canonical JSON, which it checked against the record's
/// CRC and the content's SHA-256 as the parsed read does. [`RawItem::to_item`] parses it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RawItem {
    json: String,
}

impl RawItem {
    /// The JSON, as bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        self.json.as_bytes()
    }

    /// The JSON, as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.json
    }

    /// The JSON's length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// Always false: an item's JSON is never empty. (For symmetry with [`RawItem::len`].)
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }

    /// The JSON, as owned bytes.
    #[must_use]
    pub fn into_bytes(self) -> Vec<u8> {
        self.json.into_bytes()
    }

    /// The JSON, as an owned string.
    #[must_use]
    pub fn into_string(self) -> String {
        self.json
    }

    /// Parses the JSON into the item (what the parsed read returns).
    ///
    /// # Errors
    /// As [`ContextItem::from_json`]; never for bytes the store returned.
    pub fn to_item(&self) -> Result<ContextItem> {
        ContextItem::from_json(&self.json)
    }
}

impl std::fmt::Debug for RawItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RawItem").field(&self.json).finish()
    }
}

impl std::fmt::Display for RawItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.json)
    }
}

impl AsRef<[u8]> for RawItem {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<str> for RawItem {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<RawItem> for Vec<u8> {
    fn from(item: RawItem) -> Vec<u8> {
        item.into_bytes()
    }
}

impl From<RawItem> for String {
    fn from(item: RawItem) -> String {
        item.into_string()
    }
}

/// The answer for one reference of a `resolve_raw`: a [`Resolution`] whose items are [`RawItem`]s.
/// Each reference gets the answer `resolve` gives it, variant for variant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawResolution {
    /// The reference names the id's latest version (or just the id): here is its JSON.
    Found(RawItem),
    /// No such id, no such version, or an id the reader may not see.
    NotFound {
        /// The reference as it was given.
        reference: String,
    },
    /// The id's latest version has expired; `id@version` references of it answer the same.
    Expired {
        /// The id.
        id: String,
        /// When it expired, UTC seconds.
        expired_at: i64,
    },
    /// `id@version` names an earlier version of a live id; `latest` is the current item's JSON.
    Superseded {
        /// The id.
        id: String,
        /// The version that was asked for.
        requested_version: String,
        /// The id's latest version.
        latest: RawItem,
    },
    /// The stored bytes no longer match their checksum or hash: damage is reported, never returned.
    HashMismatch {
        /// The id whose record is damaged.
        id: String,
    },
}

/// What one reference resolves to, whatever form its items take: becomes a [`Resolution`] or a
/// [`RawResolution`].
enum Answer<T> {
    Found(T),
    NotFound,
    Expired { expired_at: i64 },
    Superseded { latest: T },
    HashMismatch,
}

impl Answer<Located> {
    /// Reads the item of a found answer with `read`; a record found damaged now answers
    /// `HashMismatch`, as one found damaged under the lock does.
    fn read<T>(&self, held: &Held, read: impl FnOnce(&PutView<'_>) -> Result<T, DecodeError>) -> Result<Answer<T>> {
        let item = |located: &Located| ReadFailure::or_mismatch(located.finish(held, read));
        Ok(match self {
            Answer::Found(located) => item(located)?.map_or_else(|mismatch| mismatch, Answer::Found),
            Answer::Superseded { latest } => {
                item(latest)?.map_or_else(|mismatch| mismatch, |latest| Answer::Superseded { latest })
            }
            Answer::NotFound => Answer::NotFound,
            Answer::Expired { expired_at } => Answer::Expired {
                expired_at: *expired_at,
            },
            Answer::HashMismatch => Answer::HashMismatch,
        })
    }
}

impl Answer<ContextItem> {
    fn into_resolution(self, reference: &str, id: &str, asked: Option<&str>) -> Resolution {
        match self {
            Answer::Found(item) => Resolution::Found(item),
            Answer::NotFound => Resolution::NotFound {
                reference: reference.to_owned(),
            },
            Answer::Expired { expired_at } => Resolution::Expired {
                id: id.to_owned(),
                expired_at,
            },
            Answer::Superseded { latest } => Resolution::Superseded {
                id: id.to_owned(),
                requested_version: asked.unwrap_or_default().to_owned(),
                latest,
            },
            Answer::HashMismatch => Resolution::HashMismatch { id: id.to_owned() },
        }
    }
}

impl Answer<RawItem> {
    fn into_raw_resolution(self, reference: &str, id: &str, asked: Option<&str>) -> RawResolution {
        match self {
            Answer::Found(item) => RawResolution::Found(item),
            Answer::NotFound => RawResolution::NotFound {
                reference: reference.to_owned(),
            },
            Answer::Expired { expired_at } => RawResolution::Expired {
                id: id.to_owned(),
                expired_at,
            },
            Answer::Superseded { latest } => RawResolution::Superseded {
                id: id.to_owned(),
                requested_version: asked.unwrap_or_default().to_owned(),
                latest,
            },
            Answer::HashMismatch => RawResolution::HashMismatch { id: id.to_owned() },
        }
    }
}

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

    /// A read's outcome as a resolve answers it: damage is `HashMismatch`, I/O fails the resolve.
    fn or_mismatch<X, T>(read: Result<X, ReadFailure>) -> Result<Result<X, Answer<T>>> {
        match read {
            Ok(x) => Ok(Ok(x)),
            Err(ReadFailure::Damaged(_)) => Ok(Err(Answer::HashMismatch)),
            Err(ReadFailure::Io(e)) => Err(e),
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
fn item_of(put: &PutView<'_>, scratch: &mut Vec<u8>) -> Result<ContextItem, DecodeError> {
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
fn json_of(
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
    Ok(Some(RawItem { json }))
}

/// [`json_of`] keeping every item.
fn raw_item_of(put: &PutView<'_>) -> Result<RawItem, DecodeError> {
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
fn with_record<R>(
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
struct Held {
    /// Each held segment with its number.
    segments: Vec<(u32, Arc<Segment>)>,
}

impl Held {
    /// Holds the segment of `index` (under its lock) that `located`'s record lies in, if it is not
    /// held yet, and notes in `located` where. A read's records mostly come from one segment or a
    /// few, in runs: the last one held is looked at first.
    fn hold(&mut self, index: &Index, located: &mut Located) {
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
type Finish<'a, T> = dyn Fn(&mut Vec<u8>, &PutView<'_>) -> Result<T, DecodeError> + Sync + 'a;

/// Loads a byte of every 64 of each record at `locations` ([`Segment::touch`]) before they are
/// found and checked: those loads overlap, where the checks, one record after another, would each
/// wait for its record's cache and TLB misses in turn.
fn touch_records<'a>(index: &Index, locations: impl Iterator<Item = &'a Location>) {
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
const TOUCH_AHEAD: usize = 16;

/// A put record found and checked ([`checked_put`]) under the index lock. What a read does with it
/// next (decompressing and hashing the content, parsing it or writing the item's JSON) needs no
/// lock: [`Located::finish`] does it after the lock is released, so that long reads do not hold
/// back the writer's publication.
struct Located {
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
    confidence: Option<f64>,
}

impl Located {
    /// Finds `version`'s record and checks it against the index (and `asked_id`, as
    /// [`checked_put`]). The caller holds its segment ([`Held::hold`]) before it releases the lock.
    fn find(index: &Index, version: &VersionEntry, asked_id: Option<&str>) -> Result<Located, ReadFailure> {
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
    fn finish<R>(
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
        RecordView::Retired { id, version, hash } => (id, version, hash),
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
        && put.expires_at().unwrap_or(NEVER_EXPIRES) == index.expires_at(version)
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

/// A resolve of at most this many references reads its items under the index lock (a few
/// microseconds each): for so few, finding the records first and reading them after the lock costs
/// more than the lock's hold.
const READ_UNDER_LOCK: usize = 8;

/// Keeps compaction from reclaiming what a live snapshot handle sees, until the last clone drops.
struct Registration {
    shared: Arc<Shared>,
    seq: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.unregister_snapshot(self.seq);
    }
}

/// A read view fixed at a sequence number and a clock time. Later adds, deletes, expiries and
/// compactions never change its answers; TTL is judged at [`Snapshot::taken_at`].
#[derive(Clone)]
pub struct Snapshot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) seq: u64,
    pub(crate) taken_at: i64,
    pub(crate) session: Option<Arc<str>>,
    /// The store's current state rather than a fixed view (see [`Snapshot::new`]).
    current: bool,
    _registration: Option<Arc<Registration>>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("seq", &self.seq)
            .field("taken_at", &self.taken_at)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// A pinned snapshot, as [`crate::Store::snapshots`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// The pin's name.
    pub name: String,
    /// The sequence number the snapshot is fixed at.
    pub seq: u64,
    /// The clock time it judges TTL at.
    pub taken_at: i64,
    /// The session it is restricted to, if it was taken through a session view.
    pub session: Option<String>,
    /// Bytes of records it sees that the current state no longer needs: what unpinning it lets the
    /// next compaction reclaim, unless another pin or live snapshot also sees them.
    pub bytes_kept: u64,
}

/// Proof of what a resolve answered: the snapshot and, for each reference, the (id, version, hash)
/// of the answer. [`crate::Store::replay`] turns it back into the identical answers while the
/// snapshot is pinned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Receipt {
    /// The snapshot's sequence number.
    pub seq: u64,
    /// The snapshot's clock time.
    pub taken_at: i64,
    /// The session the snapshot is restricted to, if any.
    pub session: Option<String>,
    /// One answer per reference, in order.
    pub answers: Vec<ReceiptAnswer>,
}

/// One answer of a [`Receipt`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ReceiptAnswer {
    /// The reference as given.
    pub reference: String,
    /// `found`, `not_found`, `expired`, `superseded` or `hash_mismatch`.
    pub status: String,
    /// The id answered (for `superseded`, the latest version's).
    pub id: Option<String>,
    /// The version answered.
    pub version: Option<String>,
    /// The hash of the content answered.
    pub hash: Option<String>,
}

impl ReceiptAnswer {
    fn of(reference: &str, resolution: &Resolution) -> ReceiptAnswer {
        let (status, item, id) = match resolution {
            Resolution::Found(item) => ("found", Some(item), None),
            Resolution::NotFound { .. } => ("not_found", None, None),
            Resolution::Expired { id, .. } => ("expired", None, Some(id)),
            Resolution::Superseded { latest, .. } => ("superseded", Some(latest), None),
            Resolution::HashMismatch { id } => ("hash_mismatch", None, Some(id)),
        };
        ReceiptAnswer {
            reference: reference.to_owned(),
            status: status.to_owned(),
            id: item.map(|item| item.id.clone()).or_else(|| id.cloned()),
            version: item.map(|item| item.version.clone()),
            hash: item.and_then(|item| item.hash.clone()),
        }
    }
}

impl Snapshot {
    /// A view of now. With `register`, it is fixed at the current sequence number and clock time, and
    /// compaction keeps what it sees for as long as the handle (or a clone) lives. Without, it is the
    /// store's current state: each call reads the sequence number under the same index lock as its
    /// query, so that no compaction step can fall between the two.
    pub(crate) fn new(shared: &Arc<Shared>, session: Option<Arc<str>>, register: bool) -> Self {
        if !register {
            return Snapshot {
                shared: Arc::clone(shared),
                seq: 0,
                taken_at: 0,
                session,
                current: true,
                _registration: None,
            };
        }
        // Registering under the registry lock, taken before the index lock, orders this view
        // before or after any compaction step, never in the middle of one.
        let mut live = shared.live_snapshots();
        let index = shared.read_index();
        let (seq, taken_at) = (index.seq, shared.clock.now());
        drop(index);
        *live.entry(seq).or_insert(0) += 1;
        drop(live);
        let registration = Some(Arc::new(Registration {
            shared: Arc::clone(shared),
            seq,
        }));
        Snapshot {
            shared: Arc::clone(shared),
            seq,
            taken_at,
            session,
            current: false,
            _registration: registration,
        }
    }

    /// The sequence number and time this view reads at, given the locked index.
    fn at(&self, index: &Index) -> (u64, i64) {
        if self.current {
            (index.seq, self.shared.clock.now())
        } else {
            (self.seq, self.taken_at)
        }
    }

    /// The snapshot pinned under `name`, registered before the pin can be ended and reclaimed.
    pub(crate) fn open_pinned(shared: &Arc<Shared>, name: &str) -> Result<Snapshot> {
        let mut live = shared.live_snapshots();
        let pin = shared
            .read_index()
            .pins
            .get(name)
            .cloned()
            .ok_or_else(|| Error::SnapshotNotFound { name: name.to_owned() })?;
        *live.entry(pin.seq).or_insert(0) += 1;
        drop(live);
        let registration = Some(Arc::new(Registration {
            shared: Arc::clone(shared),
            seq: pin.seq,
        }));
        Ok(Snapshot {
            shared: Arc::clone(shared),
            seq: pin.seq,
            taken_at: pin.taken_at,
            session: pin.session,
            current: false,
            _registration: registration,
        })
    }

    /// Pins this snapshot under `name` (a session view's snapshot keeps its session's visibility).
    ///
    /// # Errors
    /// `Invalid` if the name breaks the id rules or is already pinned, or (field `session_id`) if
    /// this is the snapshot of a session view whose session id breaks the id rules; `Poisoned` or
    /// `Io` if the pin cannot be written.
    pub fn pin(&self, name: &str) -> Result<SnapshotInfo> {
        validate_name("name", name)?;
        if let Some(session) = &self.session {
            // The pin stores the session to restrict the snapshot again when it is opened: an id that
            // breaks the id rules (an empty one would read back as no session at all, one of over 255
            // bytes does not fit its length byte) is refused rather than stored.
            validate_name("session_id", session)?;
        }
        let op = Op::Pin {
            name: name.to_owned(),
            seq: self.seq,
            taken_at: self.taken_at,
            session: self.session.clone(),
        };
        self.shared.submit(vec![op])?;
        Ok(pinned(&self.shared)
            .into_iter()
            .find(|info| info.name == name)
            .unwrap_or(SnapshotInfo {
                name: name.to_owned(),
                seq: self.seq,
                taken_at: self.taken_at,
                session: self.session.as_deref().map(str::to_owned),
                bytes_kept: 0,
            }))
    }

    /// One SHA-256 over the canonical JSON of every item this snapshot shows, ordered by (id,
    /// version), each followed by a newline: `"sha256:" + 64 hex`. An auditor can check later that
    /// nothing the snapshot shows has changed.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn digest(&self) -> Result<String> {
        let mut items = self.get(&ContextQuery::new())?;
        items.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
        let mut hasher = sha2::Sha256::new();
        for item in &items {
            let value = serde_json::to_value(item).map_err(|e| Error::invalid("item", e.to_string()))?;
            hasher.update(canonical_json(&value));
            hasher.update(b"\n");
        }
        let digest: [u8; 32] = hasher.finalize().into();
        Ok(format_hash(&digest))
    }

    /// Resolves `refs` as [`Snapshot::resolve`] does, and returns a [`Receipt`] of the answers.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve_with_receipt<I, R>(&self, refs: I) -> Result<(Vec<Resolution>, Receipt)>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        let refs: Vec<String> = refs.into_iter().map(|r| r.as_ref().to_owned()).collect();
        let answers = self.resolve(&refs)?;
        let receipt = Receipt {
            seq: self.seq,
            taken_at: self.taken_at,
            session: self.session.as_deref().map(str::to_owned),
            answers: refs
                .iter()
                .zip(&answers)
                .map(|(r, a)| ReceiptAnswer::of(r, a))
                .collect(),
        };
        Ok((answers, receipt))
    }

    /// The sequence number this view is fixed at.
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The clock time this view judges TTL at, UTC seconds.
    #[must_use]
    pub fn taken_at(&self) -> i64 {
        self.taken_at
    }

    /// The session this view is restricted to, if it was taken through a session view.
    #[must_use]
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// The latest visible version of each id that matches `query`, in `(timestamp, id)` order.
    ///
    /// # Errors
    /// `UnknownType` or `Invalid` for a malformed query; `Corrupt` if a matching record is damaged;
    /// `Io` if reading fails.
    pub fn get(&self, query: &ContextQuery) -> Result<Vec<ContextItem>> {
        self.get_with_stats(query).map(|(items, _)| items)
    }

    /// Like [`Snapshot::get`], and says which index the query walked and how many entries it examined.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_with_stats(&self, query: &ContextQuery) -> Result<(Vec<ContextItem>, QueryStats)> {
        self.run_query(query, &|scratch, put| {
            let item = item_of(put, scratch)?;
            Ok(query::content_passes(query, &item.content).then_some(item))
        })
    }

    /// The items [`Snapshot::get`] returns, in the same order, as their JSON ([`RawItem`]), read
    /// without parsing their content (a query with `content_eq` parses it to compare, and still
    /// returns the stored bytes).
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_raw(&self, query: &ContextQuery) -> Result<Vec<RawItem>> {
        let filters_content = query::filters_content(query);
        let (items, _) = self.run_query(query, &|_, put| {
            json_of(put, |_, content| {
                if !filters_content {
                    return Ok(true);
                }
                let content: serde_json::Value = serde_json::from_slice(content)
                    .map_err(|e| DecodeError(format!("stored content is not JSON: {e}")))?;
                Ok(query::content_passes(query, &content))
            })
        })?;
        Ok(items)
    }

    /// Maps `f` over the items of one read, in order, on up to `Options::read_threads` threads when
    /// there are enough of them ([`map_in_runs`](crate::parallel::map_in_runs)); each run has its own
    /// `S` (a scratch buffer).
    fn read_in_runs<X: Send, Y: Send, S: Default>(
        &self,
        items: &mut [X],
        f: &(dyn Fn(&mut S, &mut X) -> Result<Y> + Sync),
    ) -> Result<Vec<Y>> {
        self.read_in_runs_at(items, &|scratch: &mut S, _, item: &mut X| f(scratch, item))
    }

    /// As [`Snapshot::read_in_runs`], `f` also given each item's position among `items`.
    fn read_in_runs_at<X: Send, Y: Send, S: Default>(
        &self,
        items: &mut [X],
        f: &(dyn Fn(&mut S, usize, &mut X) -> Result<Y> + Sync),
    ) -> Result<Vec<Y>> {
        crate::parallel::map_in_runs(
            items,
            self.shared.read_threads,
            PARALLEL_READ_ITEMS_MIN,
            &self.shared.workers,
            &|scratch: &mut S, at, item: &mut X| f(scratch, at, item),
            &crate::parallel::no_end,
        )
    }

    /// Runs `query` at this view's bounds. Under the index lock it walks the index and finds and
    /// checks each candidate's record, filtering on confidence, which the record's header holds;
    /// after releasing the lock it turns each into an item with `finish`, which also applies the
    /// content filter (`None`: filtered out), on up to `Options::read_threads` threads when there
    /// are many (`finish` gets each thread's scratch buffer). A query with both a limit and a
    /// content filter reads its items under the lock: which candidates fill the limit is known only
    /// once they are read.
    fn run_query<T: Send>(&self, query: &ContextQuery, finish: &Finish<'_, Option<T>>) -> Result<(Vec<T>, QueryStats)> {
        let index = self.shared.read_index_for_caller();
        let (seq, now) = self.at(&index);
        let bounds = ViewBounds {
            seq,
            now,
            session: self.session.as_deref(),
        };
        if query.limit.is_some() && query::filters_content(query) {
            let scratch = std::cell::RefCell::new(Vec::new());
            let fetch = |version: &VersionEntry| {
                with_record(&index, version, None, |put| {
                    if query::confidence_passes(query, put.confidence) {
                        finish(&mut scratch.borrow_mut(), put)
                    } else {
                        Ok(None)
                    }
                })
                .map_err(Error::from)
            };
            let result = query::run(&index, query, &bounds, &fetch)?;
            self.shared.count_query(result.1.examined);
            return Ok(result);
        }
        let (mut found, mut stats) = if query.limit.is_some() && query.min_confidence.is_some() {
            // Which candidates fill the limit is known only once their records are read.
            let fetch = |version: &VersionEntry| -> Result<Option<Located>> {
                let located = Located::find(&index, version, None)?;
                Ok(query::confidence_passes(query, located.confidence).then_some(located))
            };
            query::run(&index, query, &bounds, &fetch)?
        } else {
            // Every candidate the walk picks is read: the walk only collects them, and their
            // records are found and checked afterwards, still under the lock, on up to
            // `read_threads` threads.
            let (mut candidates, stats) = query::run(&index, query, &bounds, &|version| Ok(Some(*version)))?;
            let locations: Vec<Location> = candidates.iter().map(|version| version.location).collect();
            let found: Vec<Option<Located>> = self.read_in_runs_at(&mut candidates, &|(): &mut (), at, version| {
                if at % TOUCH_AHEAD == 0 {
                    touch_records(&index, locations.get(at..).unwrap_or_default().iter().take(TOUCH_AHEAD));
                }
                let located = Located::find(&index, version, None)?;
                Ok(query::confidence_passes(query, located.confidence).then_some(located))
            })?;
            (found.into_iter().flatten().collect(), stats)
        };
        let mut held = Held::default();
        for located in &mut found {
            held.hold(&index, located);
        }
        drop(index);
        self.shared.count_query(stats.examined);
        let items = self.read_in_runs(&mut found, &|scratch: &mut Vec<u8>, located| {
            Ok(located.finish(&held, |put| finish(scratch, put))?)
        })?;
        let items: Vec<T> = items.into_iter().flatten().collect();
        stats.returned = items.len() as u64;
        Ok((items, stats))
    }

    /// Resolves each reference (`id` or `id@version`), one [`Resolution`] per reference, in order.
    ///
    /// # Errors
    /// `Invalid` (with the reference's position as `index`) for a reference that is not a valid id,
    /// optionally followed by `@` and a valid version; `Io` if reading fails.
    pub fn resolve<I, R>(&self, refs: I) -> Result<Vec<Resolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.resolve_each(refs, &|scratch, put| item_of(put, scratch), Answer::into_resolution)
    }

    /// Resolves each reference as [`Snapshot::resolve`] does, with the same answer for each, but
    /// returns items as their JSON ([`RawItem`]), read without parsing their content.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve_raw<I, R>(&self, refs: I) -> Result<Vec<RawResolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.resolve_each(refs, &|_, put| raw_item_of(put), Answer::into_raw_resolution)
    }

    /// Parses every reference, then answers each under one hold of the index lock, and reads the
    /// items with `read` and turns each answer into the caller's form with `answer`. Up to
    /// [`READ_UNDER_LOCK`] references read their items under the lock too; more only find and check
    /// their records under it and read the items after releasing it (on up to
    /// `Options::read_threads` threads when there are many), so that a long resolve does not hold
    /// back the writer's publication.
    fn resolve_each<I, R, T: Send, O>(
        &self,
        refs: I,
        read: &Finish<'_, T>,
        answer: impl Fn(Answer<T>, &str, &str, Option<&str>) -> O,
    ) -> Result<Vec<O>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        let refs: Vec<R> = refs.into_iter().collect();
        let mut parsed = Vec::with_capacity(refs.len());
        for (position, reference) in refs.iter().enumerate() {
            parsed.push(parse_reference(reference.as_ref()).map_err(|e| e.at(position))?);
        }
        let index = self.shared.read_index_for_caller();
        let at = self.at(&index);
        if refs.len() <= READ_UNDER_LOCK {
            let mut scratch = Vec::new();
            let mut read =
                |entry: &VersionEntry, id: &str| with_record(&index, entry, Some(id), |put| read(&mut scratch, put));
            return parsed
                .into_iter()
                .zip(&refs)
                .map(|((id, version), reference)| {
                    let found = self.resolve_one(&index, at, id, version, &mut read)?;
                    Ok(answer(found, reference.as_ref(), id, version))
                })
                .collect();
        }
        let mut held = Held::default();
        let mut find = |entry: &VersionEntry, id: &str| {
            let mut located = Located::find(&index, entry, Some(id))?;
            held.hold(&index, &mut located);
            Ok(located)
        };
        let mut found = parsed
            .iter()
            .map(|(id, version)| self.resolve_one(&index, at, id, *version, &mut find))
            .collect::<Result<Vec<_>>>()?;
        drop(index);
        let answers = self.read_in_runs(&mut found, &|scratch: &mut Vec<u8>, found| {
            found.read(&held, |put| read(scratch, put))
        })?;
        Ok(answers
            .into_iter()
            .zip(parsed)
            .zip(&refs)
            .map(|((found, (id, version)), reference)| answer(found, reference.as_ref(), id, version))
            .collect())
    }

    /// The answer for one reference, its record read with `read` (an item, or a record found and
    /// checked to be read later).
    fn resolve_one<X>(
        &self,
        index: &Index,
        (seq, now): (u64, i64),
        id: &str,
        version: Option<&str>,
        read: &mut dyn FnMut(&VersionEntry, &str) -> Result<X, ReadFailure>,
    ) -> Result<Answer<X>> {
        let not_found = || Ok(Answer::NotFound);
        let Some(visible) = index.visible(id, seq) else {
            return not_found();
        };
        let (latest_slot, latest) = (visible.slot, &visible.version);
        // A retired version's content was reclaimed: nothing is stored to answer with.
        if !latest.is_stored() {
            return not_found();
        }
        let scope_allowed = index
            .scopes
            .value(latest.scope)
            .is_some_and(|scope| scope_visible(scope, self.session.as_deref()));
        if !scope_allowed {
            return not_found();
        }
        if index.expired_at(latest, now) {
            return Ok(Answer::Expired {
                expired_at: index.expires_at(latest),
            });
        }
        let mut read = |entry: &VersionEntry| ReadFailure::or_mismatch(read(entry, id));
        let Some(asked) = version else {
            return Ok(read(latest)?.map_or_else(|mismatch| mismatch, Answer::Found));
        };
        // The version tag rules the latest version out without reading it; when it matches, the
        // record decides (a damaged one answers HashMismatch, as a plain `id` would).
        if latest.version_tag() == version_tag(asked) {
            match is_version(index, latest, asked) {
                Ok(true) => return Ok(read(latest)?.map_or_else(|mismatch| mismatch, Answer::Found)),
                Ok(false) => {}
                Err(ReadFailure::Damaged(_)) => return Ok(Answer::HashMismatch),
                Err(ReadFailure::Io(e)) => return Err(e),
            }
        }
        // An earlier version of the same history that this view has seen. A record whose tag
        // matches but that cannot be read is taken as that version: its identity is not in doubt,
        // only its bytes, and it is not returned.
        let mut earlier = false;
        for (slot, entry) in index.versions_of(latest.id) {
            let entry = &entry;
            if slot == latest_slot || index.generation(entry) != index.generation(latest) || entry.seq_created > seq {
                continue;
            }
            match is_version(index, entry, asked) {
                Ok(true) | Err(ReadFailure::Damaged(_)) if entry.version_tag() == version_tag(asked) => {
                    earlier = true;
                    break;
                }
                Ok(_) | Err(ReadFailure::Damaged(_)) => {}
                Err(ReadFailure::Io(e)) => return Err(e),
            }
        }
        if !earlier {
            return not_found();
        }
        Ok(match read(latest)? {
            Ok(item) => Answer::Superseded { latest: item },
            Err(mismatch) => mismatch,
        })
    }
}

/// Every pinned snapshot, with the bytes of records it keeps that the current state does not need.
pub(crate) fn pinned(shared: &Shared) -> Vec<SnapshotInfo> {
    let index = shared.read_index();
    let now = shared.clock.now();
    index
        .pins
        .iter()
        .map(|(name, pin)| {
            let bytes_kept = index
                .slots
                .iter()
                .filter(|v| v.is_stored() && index.visible_at(v, pin.seq))
                .filter(|v| !index.visible_at(v, index.seq) || index.expired_at(v, now))
                .map(|v| u64::from(v.location.len))
                .sum();
            SnapshotInfo {
                name: name.clone(),
                seq: pin.seq,
                taken_at: pin.taken_at,
                session: pin.session.as_deref().map(str::to_owned),
                bytes_kept,
            }
        })
        .collect()
}

/// Resolves a receipt's references again through the pinned snapshot it came from.
pub(crate) fn replay(shared: &Arc<Shared>, receipt: &Receipt) -> Result<Vec<Resolution>> {
    let name = shared
        .read_index()
        .pins
        .iter()
        .find(|(_, pin)| {
            pin.seq == receipt.seq
                && pin.taken_at == receipt.taken_at
                && pin.session.as_deref() == receipt.session.as_deref()
        })
        .map(|(name, _)| name.clone())
        .ok_or_else(|| Error::SnapshotNotFound {
            name: format!("(none pinned at seq {} taken at {})", receipt.seq, receipt.taken_at),
        })?;
    let snapshot = Snapshot::open_pinned(shared, &name)?;
    let answers = snapshot.resolve(receipt.answers.iter().map(|answer| answer.reference.as_str()))?;
    for (position, (expected, answer)) in receipt.answers.iter().zip(&answers).enumerate() {
        let found = ReceiptAnswer::of(&expected.reference, answer);
        if &found != expected {
            return Err(Error::ReceiptMismatch {
                position,
                expected: format!("{expected:?}"),
                found: format!("{found:?}"),
            });
        }
    }
    Ok(answers)
}

/// Splits `id@version`, validating both parts.
fn parse_reference(reference: &str) -> Result<(&str, Option<&str>)> {
    let (id, version) = match reference.split_once('@') {
        Some((id, version)) => (id, Some(version)),
        None => (reference, None),
    };
    let refuse = |e: Error| match e {
        Error::Invalid { reason, .. } => Error::invalid(
            "reference",
            format!("{reference:?} is not `id` or `id@version`: {reason}"),
        ),
        other => other,
    };
    validate_name("id", id).map_err(refuse)?;
    if let Some(version) = version {
        validate_version(version).map_err(refuse)?;
    }
    Ok((id, version))
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

    #[test]
    fn references_parse() {
        assert_eq!(parse_reference("ch3").unwrap(), ("ch3", None));
        assert_eq!(parse_reference("ch9@20240512.1").unwrap(), ("ch9", Some("20240512.1")));
        for bad in ["", "@1", "a@", "a b", "a@1@2", "a@x y"] {
            assert!(matches!(parse_reference(bad), Err(Error::Invalid { .. })), "{bad:?}");
        }
    }
}
