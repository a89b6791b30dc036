//! The `stateful` fuzz target: arbitrary bytes read as a sequence of store operations, run on a
//! [`SimDisk`] and, side by side, on a plain in-memory model of what API.md promises. Any answer
//! that the model does not allow, any panic, and any state after a power cut that the acknowledged
//! operations do not allow is a finding (the function panics).
//!
//! Operations: `add` batches of 1 to 3 items (through the store or a session view; 6 ids, 3
//! versions, 3 types, 4 scopes, TTLs, confidences, usual or other content, so that re-adds answer
//! `Unchanged` and conflicts happen), `delete`, `get` with filters, `resolve` of `id` and
//! `id@version`, live snapshots read later, clock advances, `compact`, `pin_snapshot` (of the
//! store or of a session view's snapshot), `unpin_snapshot`, `open_snapshot`, `flush`, a clean
//! reopen, a power cut between two operations ([`SimDisk::crash`], then the store reopens, maybe
//! after a second cut inside recovery), and a power cut armed to fall after a given number of
//! storage calls: inside the next operations, or between them.
//!
//! The first byte's bit 1 chooses whether content is stored compressed (`Options::compress_content`;
//! one content of the pool is long and repetitive, so that it is), and its bit 0 the durability:
//! `Immediate` (every operation that returned `Ok` is durable) or `Never` (durable at `flush`, at a
//! clean reopen, and at a compaction that rewrote something, which syncs the log first). The model
//! therefore does not follow one state but a set of candidates, each with the states a power cut
//! may bring back (from its last durable state to its current one, plus the operation in flight
//! when the power went off); after a cut the recovered
//! store must show one of them exactly (every current item, every `id@version`, every pin and what
//! it shows, `stats().items`), `verify()` must find nothing, and no `.tmp` may be left. Candidates
//! that later answers contradict are dropped; when none is left, that is a finding.
//!
//! Unsynced writes may survive a power cut in any order, under every durability: a lost write
//! followed by a kept one is a hole that recovery truncates (segment format 2's sync marks).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::storage::SimDisk;
use crate::{
    canonical_json, AddOutcome, Clock, ContextItem, ContextQuery, Durability, Error, ManualClock, Options, Resolution,
    Scope, Snapshot, Store, TimeRange,
};

const DIR: &str = "/fuzz/store";
const START: i64 = 1_000;
/// Operations read from one input at most; the rest of the bytes are ignored.
pub const OPS_MAX: usize = 24;
/// Small segments, so that the log rotates and compaction has sealed segments to rewrite.
const SEGMENT_SIZE: u64 = 4096;
/// Live snapshot handles kept at most (the oldest is dropped first).
const SNAPS_MAX: usize = 4;
const IDS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const VERSIONS: [&str; 3] = ["1", "2", "3"];
const KINDS: [&str; 3] = ["message", "tool_result", "document_chunk"];
/// Query types: the kinds used plus a registered type nothing is stored under.
const QUERY_KINDS: [&str; 4] = ["message", "tool_result", "document_chunk", "user_profile"];
const SOURCES: [&str; 2] = ["src1", "src2"];
/// Sessions readers may take; "s3" owns nothing.
const VIEWS: [&str; 3] = ["s1", "s2", "s3"];
const CONFIDENCES: [f64; 4] = [0.1, 0.5, 0.9, 1.0];
const MIN_CONFIDENCES: [f64; 3] = [0.0, 0.5, 0.9];
const PATHS: [&str; 2] = ["k", "n.x"];
const PIN_NAMES: [&str; 3] = ["p1", "p2", "p3"];

fn pick<T: Copy>(from: &[T], byte: u8) -> T {
    match from.get(usize::from(byte) % from.len().max(1)) {
        Some(value) => *value,
        None => panic!("an empty alphabet"),
    }
}

/// The input, read a byte at a time; past its end every byte reads as 0.
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let byte = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    fn is_empty(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn seed(&mut self) -> u64 {
        u64::from(self.byte()) | u64::from(self.byte()) << 8
    }

    fn read_view(&mut self) -> Option<&'static str> {
        match self.byte() % 5 {
            0..=1 => None,
            n => Some(pick(&VIEWS, n - 2)),
        }
    }

    fn write_view(&mut self) -> Option<&'static str> {
        match self.byte() % 6 {
            0..=3 => None,
            4 => Some("s1"),
            _ => Some("s2"),
        }
    }

    fn item(&mut self) -> ItemSpec {
        let identity = self.byte();
        let labels = self.byte();
        let extras = self.byte();
        let time = self.byte();
        let content = match (identity / 18) % 14 {
            n @ 8.. => Some(usize::from(n - 8)),
            _ => None,
        };
        ItemSpec {
            id: pick(&IDS, identity),
            version: pick(&VERSIONS, identity / 6),
            content,
            kind: pick(&KINDS, labels),
            source: pick(&SOURCES, labels / 3),
            scope: usize::from((labels / 6) % 4),
            ttl: (extras & 0x80 != 0).then_some(1 + u64::from(extras % 12)),
            confidence: match (extras >> 4) & 7 {
                n @ 0..=3 => Some(pick(&CONFIDENCES, n)),
                _ => None,
            },
            timestamp: START - 6 + i64::from(time % 15),
        }
    }

    fn query(&mut self) -> QuerySpec {
        let flags = self.byte();
        let mut query = QuerySpec::everything();
        if flags & 1 != 0 {
            // At least one type (see tests/model.rs: what `.types([])` means is not settled).
            let mask = self.byte() % 15 + 1;
            query.types = Some(subset(&QUERY_KINDS, mask));
        }
        if flags & 2 != 0 {
            let b = self.byte();
            let start = START - 7 + i64::from(b % 17);
            query.range = Some((start, start + i64::from((b / 17) % 8)));
        }
        if flags & 4 != 0 {
            let mask = self.byte() % 16;
            query.scopes = Some((0..4).filter(|s| mask & (1 << s) != 0).collect());
        }
        if flags & 8 != 0 {
            query.min_confidence = Some(pick(&MIN_CONFIDENCES, self.byte()));
        }
        if flags & 16 != 0 {
            let mask = self.byte() % 4;
            query.sources = Some(subset(&SOURCES, mask));
        }
        if flags & 32 != 0 {
            let b = self.byte();
            query.content_eq = Some((pick(&PATHS, b), usize::from((b / 2) % 4)));
        }
        query.newest_first = flags & 64 != 0;
        if flags & 128 != 0 {
            query.limit = Some(usize::from(self.byte() % 5));
        }
        query
    }

    fn refs(&mut self) -> Vec<Ref> {
        let count = 1 + self.byte() % 4;
        (0..count)
            .map(|_| {
                let b = self.byte();
                let version = match (b / 6) % 4 {
                    0 => None,
                    n => Some(pick(&VERSIONS, n - 1)),
                };
                (pick(&IDS, b), version)
            })
            .collect()
    }

    fn op(&mut self) -> Op {
        match self.byte() % 20 {
            0..=3 => {
                let view = self.write_view();
                let count = 1 + self.byte() % 3;
                let items = (0..count).map(|_| self.item()).collect();
                Op::Add { view, items }
            }
            4 => Op::Delete(pick(&IDS, self.byte())),
            5 | 18 => Op::Get {
                view: self.read_view(),
                query: self.query(),
            },
            6 | 19 => Op::Resolve {
                view: self.read_view(),
                refs: self.refs(),
            },
            7 => Op::Snapshot { view: self.read_view() },
            8 => Op::ReadSnap {
                snap: usize::from(self.byte()),
                query: self.query(),
                refs: self.refs(),
            },
            9 => Op::Advance(i64::from(self.byte() % 7)),
            10 => Op::Compact,
            11 => Op::Pin {
                name: pick(&PIN_NAMES, self.byte()),
                view: self.read_view(),
            },
            12 => Op::Unpin(pick(&PIN_NAMES, self.byte())),
            13 => Op::OpenPinned {
                name: pick(&PIN_NAMES, self.byte()),
                query: self.query(),
                refs: self.refs(),
            },
            14 => Op::Flush,
            15 => Op::Reopen,
            16 => {
                let seed = self.seed();
                let b = self.byte();
                let recovery_cut = (b & 1 != 0).then(|| (u64::from(b >> 1), self.seed()));
                Op::Crash { seed, recovery_cut }
            }
            _ => Op::CutPower {
                after: u64::from(self.byte()),
                seed: self.seed(),
            },
        }
    }
}

fn subset<T: Copy>(from: &[T], mask: u8) -> Vec<T> {
    from.iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, value)| *value)
        .collect()
}

/// What an input means: the durability and whether content is compressed, then the operations.
fn decode(data: &[u8]) -> (Durability, bool, Vec<Op>) {
    let mut input = Input { bytes: data, at: 0 };
    let first = input.byte();
    let durability = if first & 1 == 1 {
        Durability::Never
    } else {
        Durability::Immediate
    };
    let compress = first & 2 == 2;
    let mut ops = Vec::new();
    while !input.is_empty() && ops.len() < OPS_MAX {
        ops.push(input.op());
    }
    (durability, compress, ops)
}

fn scope_of(i: usize) -> Scope {
    match i {
        0 => Scope::Session("s1".into()),
        1 => Scope::Session("s2".into()),
        2 => Scope::GlobalReadonly,
        _ => Scope::GlobalWritable,
    }
}

/// `len` hex characters determined by `seed`: text that LZ4 cannot shrink, so that a few dozen
/// records fill a 4 KiB segment.
fn noise(seed: &str, len: usize) -> String {
    let mut state = seed.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from_digit(u32::try_from(state >> 60).unwrap_or(0), 16).unwrap_or('0')
        })
        .collect()
}

/// The content of an item: `None` is the usual content of its (id, version), so that most re-adds
/// are `Unchanged`; `Some(i)` picks from a small pool, so that conflicts happen too.
fn content_of(id: &str, version: &str, pick: Option<usize>) -> Value {
    match pick {
        None => {
            let k = if version == "2" { 2 } else { 1 };
            let x = if id < "d" { "y" } else { "z" };
            json!({"id": id, "v": version, "k": k, "n": {"x": x}, "pad": noise(&format!("{id}@{version}"), 240)})
        }
        Some(0) => json!({"k": 1}),
        Some(1) => json!({"k": 2, "n": {"x": "y"}}),
        Some(2) => json!({"t": "é", "n": {"x": "z"}, "k": 1}),
        Some(3) => json!("plain"),
        // Long and repetitive: stored LZ4-compressed when the input asks for compression.
        Some(4) => json!([1, 2, 3, "context window ".repeat(40)]),
        // Half a segment.
        Some(_) => json!({"big": noise("big", 2000), "k": 2}),
    }
}

fn eq_value_of(i: usize) -> Value {
    match i % 4 {
        0 => json!(1),
        1 => json!(2),
        2 => json!("y"),
        _ => json!("z"),
    }
}

fn hex_sha256(bytes: impl AsRef<[u8]>) -> String {
    let mut text = String::from("sha256:");
    for byte in Sha256::digest(bytes) {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

#[derive(Clone, Debug)]
struct ItemSpec {
    id: &'static str,
    version: &'static str,
    content: Option<usize>,
    kind: &'static str,
    source: &'static str,
    timestamp: i64,
    scope: usize,
    ttl: Option<u64>,
    confidence: Option<f64>,
}

impl ItemSpec {
    fn item(&self) -> ContextItem {
        let mut item = ContextItem::new(
            self.id,
            self.kind,
            content_of(self.id, self.version, self.content),
            self.source,
            self.timestamp,
            self.version,
            scope_of(self.scope),
        );
        if let Some(ttl) = self.ttl {
            item = item.with_ttl(ttl);
        }
        if let Some(c) = self.confidence {
            item = item.with_confidence(c);
        }
        item
    }
}

#[derive(Clone, Debug)]
struct QuerySpec {
    types: Option<Vec<&'static str>>,
    range: Option<(i64, i64)>,
    scopes: Option<Vec<usize>>,
    min_confidence: Option<f64>,
    sources: Option<Vec<&'static str>>,
    content_eq: Option<(&'static str, usize)>,
    newest_first: bool,
    limit: Option<usize>,
}

impl QuerySpec {
    fn everything() -> QuerySpec {
        QuerySpec {
            types: None,
            range: None,
            scopes: None,
            min_confidence: None,
            sources: None,
            content_eq: None,
            newest_first: false,
            limit: None,
        }
    }

    fn query(&self) -> ContextQuery {
        let mut q = ContextQuery::new();
        if let Some(types) = &self.types {
            q = q.types(types.iter().copied());
        }
        if let Some((start, end)) = self.range {
            if let Ok(range) = TimeRange::new(start, end) {
                q = q.time_range(range);
            }
        }
        if let Some(scopes) = &self.scopes {
            q = q.scopes(scopes.iter().map(|s| scope_of(*s)));
        }
        if let Some(min) = self.min_confidence {
            q = q.min_confidence(min);
        }
        if let Some(sources) = &self.sources {
            q = q.sources(sources.iter().copied());
        }
        if let Some((path, value)) = self.content_eq {
            q = q.content_eq(path, eq_value_of(value));
        }
        if self.newest_first {
            q = q.newest_first();
        }
        if let Some(n) = self.limit {
            q = q.limit(n);
        }
        q
    }

    fn matches(&self, item: &ContextItem) -> bool {
        self.types.as_ref().is_none_or(|t| t.contains(&item.kind.as_str()))
            && self
                .range
                .is_none_or(|(start, end)| start <= item.timestamp && item.timestamp <= end)
            && self
                .scopes
                .as_ref()
                .is_none_or(|s| s.iter().any(|s| scope_of(*s) == item.scope))
            && self
                .min_confidence
                .is_none_or(|min| item.confidence.is_none_or(|c| c >= min))
            && self.sources.as_ref().is_none_or(|s| s.contains(&item.source.as_str()))
            && self
                .content_eq
                .is_none_or(|(path, value)| lookup(&item.content, path) == Some(&eq_value_of(value)))
    }
}

/// Top-level key, else a dotted path through nested objects.
fn lookup<'v>(content: &'v Value, path: &str) -> Option<&'v Value> {
    content
        .get(path)
        .or_else(|| path.split('.').try_fold(content, |v, key| v.get(key)))
}

type Ref = (&'static str, Option<&'static str>);

fn ref_text((id, version): &Ref) -> String {
    match version {
        Some(v) => format!("{id}@{v}"),
        None => (*id).to_owned(),
    }
}

/// Every reference there is: each id, and each `id@version`.
fn all_refs() -> Vec<Ref> {
    IDS.iter()
        .flat_map(|id| std::iter::once((*id, None)).chain(VERSIONS.iter().map(move |v| (*id, Some(*v)))))
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Add {
        view: Option<&'static str>,
        items: Vec<ItemSpec>,
    },
    Delete(&'static str),
    Get {
        view: Option<&'static str>,
        query: QuerySpec,
    },
    Resolve {
        view: Option<&'static str>,
        refs: Vec<Ref>,
    },
    /// Takes a live snapshot handle (of the store or of a session view).
    Snapshot {
        view: Option<&'static str>,
    },
    /// Reads the live snapshot `snap % count` with `get` and `resolve` (skipped when there is none).
    ReadSnap {
        snap: usize,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    Advance(i64),
    Compact,
    Pin {
        name: &'static str,
        view: Option<&'static str>,
    },
    Unpin(&'static str),
    /// `open_snapshot`, then `get`, `resolve` and `digest` through it; the handle is kept as a live
    /// snapshot.
    OpenPinned {
        name: &'static str,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    Flush,
    /// Closes the store and opens it again.
    Reopen,
    /// Cuts the power now; the disk comes back as `seed` decides. With `recovery_cut`, the power is
    /// cut again after that many storage calls of the recovery (open and close), and the disk comes
    /// back again.
    Crash {
        seed: u64,
        recovery_cut: Option<(u64, u64)>,
    },
    /// Cuts the power after `after` more storage calls (inside the next operations, or between two),
    /// then the disk comes back as `seed` decides.
    CutPower {
        after: u64,
        seed: u64,
    },
}

/// What the model says an add does.
#[derive(Debug, PartialEq)]
enum AddExpect {
    Added(String, String),
    Unchanged(String, String),
}

#[derive(Debug, PartialEq)]
enum AddError {
    PermissionDenied(usize),
    VersionConflict(usize),
}

/// One version in the model: the item (with its hash), the step of the operation that added it
/// (steps order versions and snapshots as sequence numbers do), and whether compaction has
/// reclaimed its content (only ever the latest version, once expired).
#[derive(Clone, Debug, PartialEq)]
struct Version {
    item: ContextItem,
    created: usize,
    reclaimed: bool,
}

/// Per id, its current history (since its last delete), in the order added; the last entry is the
/// latest version. Reclaimed versions stay: the store remembers their (id, version, hash).
#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    ids: BTreeMap<String, Vec<Version>>,
}

/// Whether a session view of `session` may write `scope`.
fn writable_by(scope: &Scope, session: &str) -> bool {
    match scope {
        Scope::Session(owner) => owner == session,
        Scope::GlobalWritable => true,
        Scope::GlobalReadonly => false,
    }
}

fn visible_to(scope: &Scope, session: Option<&str>) -> bool {
    match (scope, session) {
        (Scope::Session(owner), Some(reader)) => owner == reader,
        _ => true,
    }
}

fn expired(item: &ContextItem, now: i64) -> Option<i64> {
    let at = item.timestamp + i64::try_from(item.ttl_seconds?).ok()?;
    (at <= now).then_some(at)
}

impl Model {
    /// The answer to `items` added by `session` (`None`: the store handle) at `step`. `denied` is
    /// the position the store refused with `PermissionDenied`, if it did: it settles the one case the
    /// model cannot know, whether compaction retired a superseded version (see below).
    fn add(
        &mut self,
        items: &[ContextItem],
        session: Option<&str>,
        step: usize,
        denied: Option<usize>,
    ) -> Result<Vec<AddExpect>, AddError> {
        if let Some(session) = session {
            for (position, item) in items.iter().enumerate() {
                if !writable_by(&item.scope, session) {
                    return Err(AddError::PermissionDenied(position));
                }
            }
        }
        let mut ids = self.ids.clone();
        let mut out = Vec::new();
        for (position, item) in items.iter().enumerate() {
            let mut item = item.clone();
            item.hash = Some(hex_sha256(canonical_json(&item.content)));
            let history = ids.entry(item.id.clone()).or_default();
            // A session adds versions only to ids whose latest version (since the last delete), if
            // not reclaimed, is in a scope it may write; this is checked before versions are compared.
            if let Some(session) = session {
                if history
                    .last()
                    .is_some_and(|latest| !latest.reclaimed && !writable_by(&latest.item.scope, session))
                {
                    return Err(AddError::PermissionDenied(position));
                }
            }
            let latest = history.len().checked_sub(1);
            let found = history.iter().position(|known| known.item.version == item.version);
            if let (Some(session), Some((at, known))) = (session, found.and_then(|at| Some((at, history.get(at)?)))) {
                // A session compares only with versions it may see: not another session's, nor a
                // reclaimed one (whose scope the store no longer keeps). Compaction also retires a
                // superseded version that no view sees, which this model does not follow: for an
                // earlier step's superseded version, the store's refusal tells that it did, unless the
                // version's scope already explains the refusal.
                let visible = visible_to(&known.item.scope, Some(session));
                let retired = known.reclaimed
                    || (visible && Some(at) != latest && known.created < step && denied == Some(position));
                if retired || !visible {
                    if retired {
                        if let Some(kept) = self.ids.get_mut(&item.id).and_then(|h| h.get_mut(at)) {
                            kept.reclaimed = true;
                        }
                    }
                    return Err(AddError::PermissionDenied(position));
                }
            }
            match found.and_then(|at| history.get(at)) {
                Some(known) if known.item.hash == item.hash => {
                    out.push(AddExpect::Unchanged(item.id.clone(), item.version.clone()));
                }
                Some(_) => return Err(AddError::VersionConflict(position)),
                None => {
                    out.push(AddExpect::Added(item.id.clone(), item.version.clone()));
                    history.push(Version {
                        item,
                        created: step,
                        reclaimed: false,
                    });
                }
            }
        }
        self.ids = ids;
        Ok(out)
    }

    fn delete(&mut self, id: &str) -> bool {
        self.ids.remove(id).is_some_and(|history| !history.is_empty())
    }

    fn get(&self, query: &QuerySpec, session: Option<&str>, now: i64) -> Vec<ContextItem> {
        let mut out: Vec<ContextItem> = self
            .ids
            .values()
            .filter_map(|history| history.last())
            .filter(|latest| !latest.reclaimed)
            .map(|latest| &latest.item)
            .filter(|item| expired(item, now).is_none())
            .filter(|item| visible_to(&item.scope, session))
            .filter(|item| query.matches(item))
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.timestamp, &a.id).cmp(&(b.timestamp, &b.id)));
        if query.newest_first {
            out.reverse();
        }
        if let Some(n) = query.limit {
            out.truncate(n);
        }
        out
    }

    fn resolve(&self, refs: &[Ref], session: Option<&str>, now: i64) -> Vec<Resolution> {
        refs.iter()
            .map(|r| {
                let (id, version) = *r;
                let not_found = Resolution::NotFound { reference: ref_text(r) };
                let Some(latest) = self.ids.get(id).and_then(|history| history.last()) else {
                    return not_found;
                };
                if latest.reclaimed {
                    return not_found;
                }
                let latest = &latest.item;
                if !visible_to(&latest.scope, session) {
                    return not_found;
                }
                if let Some(at) = expired(latest, now) {
                    return Resolution::Expired {
                        id: id.to_owned(),
                        expired_at: at,
                    };
                }
                let known = |v: &str| self.ids.get(id).is_some_and(|h| h.iter().any(|k| k.item.version == v));
                match version {
                    None => Resolution::Found(latest.clone()),
                    Some(v) if v == latest.version => Resolution::Found(latest.clone()),
                    Some(v) if known(v) => Resolution::Superseded {
                        id: id.to_owned(),
                        requested_version: v.to_owned(),
                        latest: latest.clone(),
                    },
                    Some(_) => not_found,
                }
            })
            .collect()
    }

    /// Ids whose latest version is stored (expired or not): what `stats().items` counts.
    fn live_ids(&self) -> u64 {
        self.ids
            .values()
            .filter(|h| h.last().is_some_and(|latest| !latest.reclaimed))
            .count() as u64
    }

    /// The ids whose latest version `compact()` at `now` reclaims: expired, and seen by no view in
    /// `views` (steps of live snapshot handles and pins; a view sees the latest version if it was
    /// taken after the version was added).
    fn reclaimable(&self, now: i64, views: &[usize]) -> Vec<String> {
        self.ids
            .iter()
            .filter(|(_, history)| {
                history.last().is_some_and(|latest| {
                    !latest.reclaimed
                        && expired(&latest.item, now).is_some()
                        && !views.iter().any(|step| *step > latest.created)
                })
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn reclaim(&mut self, id: &str) {
        if let Some(latest) = self.ids.get_mut(id).and_then(|h| h.last_mut()) {
            latest.reclaimed = true;
        }
    }

    /// What `Snapshot::digest` gives for a view of this state.
    fn digest(&self, session: Option<&str>, now: i64) -> String {
        let mut items = self.get(&QuerySpec::everything(), session, now);
        items.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
        let mut hasher = Sha256::new();
        for item in &items {
            match serde_json::to_value(item) {
                Ok(value) => hasher.update(canonical_json(&value)),
                Err(e) => panic!("an item that does not serialize: {e}"),
            }
            hasher.update(b"\n");
        }
        let mut text = String::from("sha256:");
        for byte in hasher.finalize() {
            text.push_str(&format!("{byte:02x}"));
        }
        text
    }
}

/// A pinned snapshot: the model as it was when pinned, and what `snapshots()` must list.
#[derive(Clone, Debug, PartialEq)]
struct PinModel {
    model: Model,
    seq: u64,
    taken_at: i64,
    session: Option<&'static str>,
    step: usize,
}

/// What survives a power cut: the items and the pins.
#[derive(Clone, Debug, Default, PartialEq)]
struct State {
    model: Model,
    pins: BTreeMap<&'static str, PinModel>,
}

/// A live snapshot handle in the model.
#[derive(Clone, Debug, PartialEq)]
struct SnapModel {
    model: Model,
    taken_at: i64,
    session: Option<&'static str>,
    /// The step of the view (for an opened pin, of the pin): compaction keeps what it sees.
    step: usize,
}

/// One way the store may be: the states a power cut may bring back, from the last durable one
/// (first) to the current one (last), and the live snapshot handles.
#[derive(Clone, Debug, PartialEq)]
struct Candidate {
    history: Vec<State>,
    snaps: Vec<SnapModel>,
}

impl Candidate {
    fn current(&self) -> &State {
        match self.history.last() {
            Some(state) => state,
            None => panic!("a candidate without a state"),
        }
    }

    fn current_mut(&mut self) -> &mut State {
        match self.history.last_mut() {
            Some(state) => state,
            None => panic!("a candidate without a state"),
        }
    }

    /// The current state is durable: nothing before it can come back.
    fn make_durable(&mut self) {
        let keep = self.history.len().saturating_sub(1);
        self.history.drain(..keep);
    }

    /// The views compaction must keep: live handles and pins.
    fn views(&self) -> Vec<usize> {
        self.snaps
            .iter()
            .map(|snap| snap.step)
            .chain(self.current().pins.values().map(|pin| pin.step))
            .collect()
    }
}

/// Everything a store shows of its state: what is compared with the model after a power cut and a
/// reopen.
#[derive(Debug, PartialEq)]
struct Observation {
    items: Vec<ContextItem>,
    resolved: Vec<Resolution>,
    live_ids: u64,
    pins: Vec<(String, u64, i64, Option<String>)>,
    pinned: Vec<(Vec<ContextItem>, Vec<Resolution>)>,
}

fn expected_observation(state: &State, now: i64) -> Observation {
    let everything = QuerySpec::everything();
    let refs = all_refs();
    Observation {
        items: state.model.get(&everything, None, now),
        resolved: state.model.resolve(&refs, None, now),
        live_ids: state.model.live_ids(),
        pins: pin_list(&state.pins),
        pinned: state
            .pins
            .values()
            .map(|pin| {
                (
                    pin.model.get(&everything, pin.session, pin.taken_at),
                    pin.model.resolve(&refs, pin.session, pin.taken_at),
                )
            })
            .collect(),
    }
}

fn pin_list(pins: &BTreeMap<&'static str, PinModel>) -> Vec<(String, u64, i64, Option<String>)> {
    pins.iter()
        .map(|(name, pin)| {
            (
                (*name).to_owned(),
                pin.seq,
                pin.taken_at,
                pin.session.map(str::to_owned),
            )
        })
        .collect()
}

fn listed_pins(store: &Store) -> Vec<(String, u64, i64, Option<String>)> {
    store
        .snapshots()
        .into_iter()
        .map(|info| (info.name, info.seq, info.taken_at, info.session))
        .collect()
}

fn observe(store: &Store) -> crate::Result<Observation> {
    let everything = ContextQuery::new();
    let refs: Vec<String> = all_refs().iter().map(ref_text).collect();
    let pins = listed_pins(store);
    let mut pinned = Vec::new();
    for (name, ..) in &pins {
        let snapshot = store.open_snapshot(name)?;
        pinned.push((snapshot.get(&everything)?, snapshot.resolve(&refs)?));
    }
    Ok(Observation {
        items: store.get(&everything)?,
        resolved: store.resolve(&refs)?,
        live_ids: store.stats().items,
        pins,
        pinned,
    })
}

/// A short account of a state, for failure messages.
fn summary(state: &State) -> String {
    let items: Vec<String> = state
        .model
        .ids
        .iter()
        .map(|(id, history)| {
            let versions: Vec<String> = history
                .iter()
                .map(|v| {
                    let mut text = v.item.version.clone();
                    if let Some(ttl) = v.item.ttl_seconds {
                        text.push_str(&format!("(t{}+{ttl})", v.item.timestamp));
                    }
                    if v.reclaimed {
                        text.push_str("(reclaimed)");
                    }
                    text
                })
                .collect();
            format!("{id}:{}", versions.join(","))
        })
        .collect();
    let pins: Vec<String> = state
        .pins
        .iter()
        .map(|(name, pin)| format!("{name}@{}:{}", pin.seq, pin.model.ids.len()))
        .collect();
    format!("items [{}] pins [{}]", items.join(" "), pins.join(" "))
}

/// A short account of an observation, for failure messages: the items `get` shows, each reference's
/// resolution (`F` found, with the version; `S` superseded; `E` expired; `N` not found; `H` damaged),
/// `stats().items`, and the pins.
fn brief(seen: &Observation) -> String {
    let items: Vec<String> = seen
        .items
        .iter()
        .map(|item| format!("{}@{}", item.id, item.version))
        .collect();
    let resolved: Vec<String> = all_refs()
        .iter()
        .zip(&seen.resolved)
        .map(|(r, answer)| {
            let short = match answer {
                Resolution::Found(item) => format!("F{}", item.version),
                Resolution::Superseded { .. } => "S".to_owned(),
                Resolution::Expired { expired_at, .. } => format!("E{expired_at}"),
                Resolution::NotFound { .. } => "N".to_owned(),
                Resolution::HashMismatch { .. } => "H".to_owned(),
            };
            format!("{}:{short}", ref_text(r))
        })
        .collect();
    let pins: Vec<String> = seen
        .pins
        .iter()
        .zip(&seen.pinned)
        .map(|((name, seq, taken_at, session), (items, _))| {
            format!("{name}@{seq}/{taken_at}/{session:?}:{}", items.len())
        })
        .collect();
    format!(
        "items [{}] refs [{}] stats().items {} pins [{}]",
        items.join(" "),
        resolved.join(" "),
        seen.live_ids,
        pins.join(" ")
    )
}

fn dedup(candidates: &mut Vec<Candidate>) {
    let mut unique: Vec<Candidate> = Vec::with_capacity(candidates.len());
    for candidate in candidates.drain(..) {
        if !unique.contains(&candidate) {
            unique.push(candidate);
        }
    }
    *candidates = unique;
}

fn trace_on() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("CTXLOG_STATEFUL_TRACE").is_some())
}

/// One run: the store on its simulated disk, and the model's candidates.
struct Run {
    durability: Durability,
    /// `Options::compress_content`.
    compress: bool,
    clock: Arc<ManualClock>,
    disk: SimDisk,
    store: Option<Store>,
    /// Live snapshot handles, in the order of every candidate's `snaps`.
    handles: Vec<Snapshot>,
    worlds: Vec<Candidate>,
    last_seq: u64,
    /// The seed of an armed power cut.
    armed: Option<u64>,
    /// Counts power cuts: a snapshot handle taken before one is not kept.
    cuts: u64,
    step: usize,
}

impl Run {
    fn open(&self, disk: &SimDisk) -> crate::Result<Store> {
        Options::new()
            .storage(Arc::new(disk.clone()))
            .clock(Arc::clone(&self.clock) as Arc<dyn Clock>)
            .durability(self.durability)
            .compress_content(self.compress)
            .segment_size(SEGMENT_SIZE)
            .auto_compact(false)
            .open(DIR)
            .inspect(|store| {
                if let Some(problem) = super::opened_store_problem(store) {
                    panic!("{problem}");
                }
            })
    }

    fn store(&self) -> &Store {
        match &self.store {
            Some(store) => store,
            None => panic!("the store is closed between operations"),
        }
    }

    fn immediate(&self) -> bool {
        self.durability == Durability::Immediate
    }

    /// Settles an operation whose store answer is `actual`: with an answer, keeps the candidates
    /// whose `apply` (run on their current state) expects the same; with an error while the power is
    /// off, the operation was in flight: every candidate may now also be in the state `apply`
    /// leads to, and the power cut is played out. `changes` says whether the operation may change
    /// the state (reads do not).
    fn settle<A: PartialEq + Debug>(
        &mut self,
        what: &str,
        actual: crate::Result<A>,
        changes: bool,
        apply: impl Fn(&mut Candidate) -> A,
    ) {
        match actual {
            Ok(actual) => {
                let immediate = self.immediate();
                let mut refused = Vec::new();
                self.worlds.retain_mut(|candidate| {
                    if changes {
                        let state = candidate.current().clone();
                        candidate.history.push(state);
                    }
                    let expected = apply(candidate);
                    if expected != actual {
                        refused.push(format!("{expected:?}"));
                        return false;
                    }
                    if changes {
                        let len = candidate.history.len();
                        if immediate {
                            candidate.make_durable();
                        } else if len >= 2 && candidate.history.get(len - 1) == candidate.history.get(len - 2) {
                            candidate.history.pop();
                        }
                    }
                    true
                });
                if self.worlds.is_empty() {
                    panic!(
                        "step {}: {what}: the store answered {actual:?}; the model expected {}",
                        self.step,
                        refused.join(" or ")
                    );
                }
                dedup(&mut self.worlds);
            }
            Err(e) if self.disk.is_powered_off() => {
                if changes {
                    for candidate in &mut self.worlds {
                        let mut next = Candidate {
                            history: vec![candidate.current().clone()],
                            snaps: candidate.snaps.clone(),
                        };
                        let _ = apply(&mut next);
                        candidate.history.push(next.current().clone());
                    }
                }
                if trace_on() {
                    eprintln!("  {what} in flight at the power cut: {e}");
                }
                self.power_cut();
            }
            Err(e) => panic!("step {}: {what} failed with the power on: {e:?}", self.step),
        }
    }

    /// Plays out an armed (and reached) power cut.
    fn power_cut(&mut self) {
        let seed = self.armed.take().unwrap_or(0);
        self.crash(seed, None);
    }

    /// Cuts the power (if it is not off already), brings the disk back as `seed` decides, maybe
    /// cuts it again inside recovery, reopens, and checks that the store shows one of the states the
    /// candidates allow, and nothing else.
    fn crash(&mut self, seed: u64, recovery_cut: Option<(u64, u64)>) {
        self.armed = None;
        self.cuts += 1;
        let mut restored = self.disk.crash(seed);
        self.handles.clear();
        drop(self.store.take());
        if let Some((after, seed)) = recovery_cut {
            restored.cut_power_after(after);
            match self.open(&restored) {
                Ok(store) => drop(store),
                Err(e) if restored.is_powered_off() => drop(e),
                Err(e) => panic!("step {}: recovery failed with the power on: {e:?}", self.step),
            }
            restored = restored.crash(seed);
        }
        self.disk = restored;
        let store = match self.open(&self.disk) {
            Ok(store) => store,
            Err(e) => panic!("step {}: opening after a power cut failed: {e:?}", self.step),
        };
        let seen = match observe(&store) {
            Ok(seen) => seen,
            Err(e) => panic!("step {}: reading after a power cut failed: {e:?}", self.step),
        };
        let now = self.clock.now();
        let mut survivors = Vec::new();
        for candidate in &self.worlds {
            for state in &candidate.history {
                if expected_observation(state, now) == seen {
                    survivors.push(Candidate {
                        history: vec![state.clone()],
                        snaps: Vec::new(),
                    });
                }
            }
        }
        if survivors.is_empty() {
            let allowed: Vec<String> = self
                .worlds
                .iter()
                .flat_map(|c| c.history.iter())
                .map(|state| {
                    format!(
                        "{}\n   shows {}",
                        summary(state),
                        brief(&expected_observation(state, now))
                    )
                })
                .collect();
            panic!(
                "step {}: after a power cut the store shows a state the acknowledged operations do not allow\n \
                 seen: {}\n allowed: {allowed:#?}",
                self.step,
                brief(&seen)
            );
        }
        dedup(&mut survivors);
        self.worlds = survivors;
        self.check_files(&store, "after a power cut");
        self.last_seq = store.stats().seq;
        if trace_on() {
            eprintln!("  recovered: {:?}", store.stats().recovery);
            for candidate in &self.worlds {
                eprintln!("  state: {}", summary(candidate.current()));
            }
        }
        self.store = Some(store);
    }

    /// `verify()` finds nothing and no `.tmp` file is left.
    fn check_files(&self, store: &Store, when: &str) {
        match store.verify() {
            Ok(report) if report.is_ok() => {}
            Ok(report) => panic!("step {}: verify {when}: {:?}", self.step, report.problems),
            Err(e) => panic!("step {}: verify {when} failed: {e:?}", self.step),
        }
        let stray: Vec<String> = self
            .disk
            .file_names(Path::new(DIR))
            .into_iter()
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(stray.is_empty(), "step {}: {when}: files left: {stray:?}", self.step);
    }

    /// Keeps the candidates whose current state the store shows.
    fn check_current(&mut self, store: &Store, when: &str) {
        let seen = match observe(store) {
            Ok(seen) => seen,
            // An armed cut fell here: the power cut is played out next.
            Err(_) if self.disk.is_powered_off() => return,
            Err(e) => panic!("step {}: reading {when} failed: {e:?}", self.step),
        };
        let now = self.clock.now();
        let shows = |candidate: &Candidate| expected_observation(candidate.current(), now) == seen;
        if !self.worlds.iter().any(shows) {
            let expected: Vec<String> = self
                .worlds
                .iter()
                .map(|c| {
                    format!(
                        "{}\n   shows {}",
                        summary(c.current()),
                        brief(&expected_observation(c.current(), now))
                    )
                })
                .collect();
            panic!(
                "step {}: {when} the store shows {}\n the model expected one of {expected:#?}",
                self.step,
                brief(&seen)
            );
        }
        self.worlds.retain(shows);
    }

    fn op(&mut self, op: &Op) {
        let now = self.clock.now();
        let step = self.step;
        match op {
            Op::Add { view, items } => {
                let batch: Vec<ContextItem> = items.iter().map(ItemSpec::item).collect();
                let store = self.store();
                let result = match view {
                    None => store.add(batch.clone()),
                    Some(session) => store.session(session).add(batch.clone()),
                };
                let actual = match result {
                    Ok(outcomes) => {
                        let mut batch_seq = None;
                        let mut answer = Vec::new();
                        for outcome in outcomes {
                            match outcome {
                                AddOutcome::Added { id, version, seq } => {
                                    assert!(
                                        batch_seq.is_none_or(|b| b == seq),
                                        "step {step}: one batch, several seqs"
                                    );
                                    batch_seq = Some(seq);
                                    answer.push(AddExpect::Added(id, version));
                                }
                                AddOutcome::Unchanged { id, version } => {
                                    answer.push(AddExpect::Unchanged(id, version));
                                }
                            }
                        }
                        if let Some(seq) = batch_seq {
                            assert!(
                                seq > self.last_seq,
                                "step {step}: seq {seq} not after {}",
                                self.last_seq
                            );
                            self.last_seq = seq;
                        }
                        Ok(Ok(answer))
                    }
                    Err(Error::PermissionDenied { index: Some(i), .. }) => Ok(Err(AddError::PermissionDenied(i))),
                    Err(Error::VersionConflict { index: Some(i), .. }) => Ok(Err(AddError::VersionConflict(i))),
                    Err(e) => Err(e),
                };
                let denied = match &actual {
                    Ok(Err(AddError::PermissionDenied(position))) => Some(*position),
                    _ => None,
                };
                self.settle("add", actual, true, |c| {
                    c.current_mut().model.add(&batch, *view, step, denied)
                });
            }
            Op::Delete(id) => {
                let actual = self.store().delete(id);
                self.settle("delete", actual, true, |c| c.current_mut().model.delete(id));
            }
            Op::Get { view, query } => {
                let store = self.store();
                let actual = match view {
                    None => store.get(&query.query()),
                    Some(session) => store.session(session).get(&query.query()),
                };
                self.settle("get", actual, false, |c| c.current().model.get(query, *view, now));
            }
            Op::Resolve { view, refs } => {
                let texts: Vec<String> = refs.iter().map(ref_text).collect();
                let store = self.store();
                let actual = match view {
                    None => store.resolve(&texts),
                    Some(session) => store.session(session).resolve(&texts),
                };
                self.settle("resolve", actual, false, |c| {
                    c.current().model.resolve(refs, *view, now)
                });
            }
            Op::Snapshot { view } => {
                let store = self.store();
                let snapshot = match view {
                    None => store.snapshot(),
                    Some(session) => store.session(session).snapshot(),
                };
                assert_eq!(snapshot.taken_at(), now, "step {step}: taken_at");
                assert_eq!(snapshot.session(), *view, "step {step}: snapshot session");
                self.keep_snapshot(snapshot, |c| SnapModel {
                    model: c.current().model.clone(),
                    taken_at: now,
                    session: *view,
                    step,
                });
            }
            Op::ReadSnap { snap, query, refs } => {
                if self.handles.is_empty() {
                    return;
                }
                let at = snap % self.handles.len();
                let Some(handle) = self.handles.get(at) else { return };
                let texts: Vec<String> = refs.iter().map(ref_text).collect();
                let actual = handle
                    .get(&query.query())
                    .and_then(|items| Ok((items, handle.resolve(&texts)?)));
                self.settle("snapshot get and resolve", actual, false, |c| match c.snaps.get(at) {
                    Some(s) => (
                        s.model.get(query, s.session, s.taken_at),
                        s.model.resolve(refs, s.session, s.taken_at),
                    ),
                    None => panic!("a live snapshot the model does not have"),
                });
            }
            Op::Advance(secs) => self.clock.advance(*secs),
            Op::Compact => self.compact(now),
            Op::Pin { name, view } => {
                let store = self.store();
                let seq_before = store.stats().seq;
                let result = match view {
                    None => store.pin_snapshot(name),
                    Some(session) => store.session(session).snapshot().pin(name),
                };
                let actual = match result {
                    Ok(info) => {
                        assert_eq!(
                            (info.name.as_str(), info.seq, info.taken_at, info.session.as_deref()),
                            (*name, seq_before, now, *view),
                            "step {step}: pin info"
                        );
                        Ok(Ok(()))
                    }
                    Err(Error::Invalid { .. }) => {
                        assert_eq!(store.stats().seq, seq_before, "step {step}: a refused pin wrote");
                        Ok(Err("already pinned"))
                    }
                    Err(e) => Err(e),
                };
                let actual = actual.map(|answer| (answer, listed_pins(self.store())));
                self.settle("pin", actual, true, |c| {
                    let state = c.current_mut();
                    let answer = if state.pins.contains_key(name) {
                        Err("already pinned")
                    } else {
                        let pin = PinModel {
                            model: state.model.clone(),
                            seq: seq_before,
                            taken_at: now,
                            session: *view,
                            step,
                        };
                        state.pins.insert(name, pin);
                        Ok(())
                    };
                    (answer, pin_list(&state.pins))
                });
            }
            Op::Unpin(name) => {
                let store = self.store();
                let actual = store.unpin_snapshot(name).map(|existed| (existed, listed_pins(store)));
                self.settle("unpin", actual, true, |c| {
                    let state = c.current_mut();
                    (state.pins.remove(name).is_some(), pin_list(&state.pins))
                });
            }
            Op::OpenPinned { name, query, refs } => self.open_pinned(name, query, refs),
            Op::Flush => {
                let actual = self.store().flush();
                self.settle("flush", actual, false, |_| ());
                for candidate in &mut self.worlds {
                    candidate.make_durable();
                }
            }
            Op::Reopen => {
                self.handles.clear();
                drop(self.store.take());
                match self.open(&self.disk) {
                    Ok(store) => {
                        // A clean close syncs everything.
                        for candidate in &mut self.worlds {
                            candidate.snaps.clear();
                            candidate.make_durable();
                        }
                        dedup(&mut self.worlds);
                        self.check_current(&store, "after a clean reopen");
                        self.last_seq = store.stats().seq;
                        self.store = Some(store);
                    }
                    Err(e) if self.disk.is_powered_off() => {
                        if trace_on() {
                            eprintln!("  reopen in flight at the power cut: {e}");
                        }
                        self.power_cut();
                    }
                    Err(e) => panic!("step {step}: reopening failed with the power on: {e:?}"),
                }
            }
            Op::Crash { seed, recovery_cut } => self.crash(*seed, *recovery_cut),
            Op::CutPower { after, seed } => {
                if self.armed.is_none() {
                    self.disk.cut_power_after(*after);
                    self.armed = Some(*seed);
                }
            }
        }
    }

    /// Keeps a live snapshot handle, with its model in every candidate (made by `model`).
    fn keep_snapshot(&mut self, snapshot: Snapshot, model: impl Fn(&Candidate) -> SnapModel) {
        if self.handles.len() >= SNAPS_MAX {
            self.handles.remove(0);
            for candidate in &mut self.worlds {
                if !candidate.snaps.is_empty() {
                    candidate.snaps.remove(0);
                }
            }
        }
        self.handles.push(snapshot);
        for candidate in &mut self.worlds {
            let snap = model(candidate);
            candidate.snaps.push(snap);
        }
    }

    fn compact(&mut self, now: i64) {
        let actual = self.store().compact();
        match actual {
            Ok(report) => {
                let reclaimed = report.reclaimed_expired;
                self.settle("compact (expired versions reclaimed)", Ok(reclaimed), true, |c| {
                    let views = c.views();
                    let ids = c.current().model.reclaimable(now, &views);
                    for id in &ids {
                        c.current_mut().model.reclaim(id);
                    }
                    ids.len() as u64
                });
                if reclaimed > 0 {
                    // A compaction that rewrote syncs the log first, and its rewrite is durable.
                    for candidate in &mut self.worlds {
                        candidate.make_durable();
                    }
                }
                // (Not while a cut is armed: it could fall inside `verify`.)
                if self.armed.is_none() {
                    let store = self.store().clone();
                    self.check_files(&store, "after compact");
                }
            }
            Err(e) if self.disk.is_powered_off() => {
                // Segments are rewritten one after the other: any part of the reclaims may be done.
                for candidate in &mut self.worlds {
                    let views = candidate.views();
                    let base = candidate.current().clone();
                    let ids = base.model.reclaimable(now, &views);
                    for mask in 1u32..(1 << ids.len()) {
                        let mut state = base.clone();
                        for (i, id) in ids.iter().enumerate() {
                            if mask & (1 << i) != 0 {
                                state.model.reclaim(id);
                            }
                        }
                        candidate.history.push(state);
                    }
                }
                if trace_on() {
                    eprintln!("  compact in flight at the power cut: {e}");
                }
                self.power_cut();
            }
            Err(e) => panic!("step {}: compact failed with the power on: {e:?}", self.step),
        }
    }

    fn open_pinned(&mut self, name: &'static str, query: &QuerySpec, refs: &[Ref]) {
        let texts: Vec<String> = refs.iter().map(ref_text).collect();
        let cuts = self.cuts;
        let mut handle = None;
        let actual = match self.store().open_snapshot(name) {
            Err(Error::SnapshotNotFound { .. }) => Ok(None),
            Err(e) => Err(e),
            Ok(snapshot) => {
                let answer = snapshot.get(&query.query()).and_then(|items| {
                    Ok((
                        snapshot.seq(),
                        snapshot.taken_at(),
                        snapshot.session().map(str::to_owned),
                        items,
                        snapshot.resolve(&texts)?,
                        snapshot.digest()?,
                    ))
                });
                handle = Some(snapshot);
                answer.map(Some)
            }
        };
        self.settle("open_snapshot", actual, false, |c| {
            c.current().pins.get(name).map(|pin| {
                (
                    pin.seq,
                    pin.taken_at,
                    pin.session.map(str::to_owned),
                    pin.model.get(query, pin.session, pin.taken_at),
                    pin.model.resolve(refs, pin.session, pin.taken_at),
                    pin.model.digest(pin.session, pin.taken_at),
                )
            })
        });
        if let (Some(snapshot), true) = (handle, self.cuts == cuts) {
            self.keep_snapshot(snapshot, |c| match c.current().pins.get(name) {
                Some(pin) => SnapModel {
                    model: pin.model.clone(),
                    taken_at: pin.taken_at,
                    session: pin.session,
                    step: pin.step,
                },
                None => panic!("an opened pin the model does not have"),
            });
        }
    }

    /// The end of a run: the store shows a current state, closes cleanly into one checkpoint, and
    /// shows the same state when opened again.
    fn finish(&mut self) {
        if self.armed.take().is_some() {
            // Disarms a cut that was never reached.
            self.disk.cut_power_after(u64::MAX);
        }
        let store = self.store().clone();
        self.check_current(&store, "at the end");
        self.check_files(&store, "at the end");
        drop(store);
        self.handles.clear();
        drop(self.store.take());
        let names = self.disk.file_names(Path::new(DIR));
        let checkpoints = names.iter().filter(|name| name.starts_with("checkpoint-")).count();
        assert!(
            checkpoints == 1 && !names.iter().any(|name| name.ends_with(".tmp")),
            "after a clean close the files are {names:?}"
        );
        let store = match self.open(&self.disk) {
            Ok(store) => store,
            Err(e) => panic!("reopening at the end failed: {e:?}"),
        };
        self.check_current(&store, "after the last reopen");
    }
}

/// Runs the operations `data` encodes (see the module documentation) on a fresh simulated disk and
/// on the model, and panics at the first answer or recovered state the model does not allow.
pub fn run(data: &[u8]) {
    run_on(data, SimDisk::new());
}

/// [`run`] on `disk`, an empty simulated disk set up by the caller (for instance with its syncs
/// switched off, to check that the target notices).
pub fn run_on(data: &[u8], disk: SimDisk) {
    let (durability, compress, ops) = decode(data);
    let trace = trace_on();
    if trace {
        eprintln!("{durability:?}, compress {compress}, {} operations", ops.len());
    }
    // See the module documentation: unsynced writes may survive in any order.
    disk.set_reorder_unsynced(true);
    let mut run = Run {
        durability,
        compress,
        clock: Arc::new(ManualClock::new(START)),
        disk,
        store: None,
        handles: Vec::new(),
        worlds: vec![Candidate {
            history: vec![State::default()],
            snaps: Vec::new(),
        }],
        last_seq: 0,
        armed: None,
        cuts: 0,
        step: 0,
    };
    let store = match run.open(&run.disk) {
        Ok(store) => store,
        Err(e) => panic!("opening a fresh store failed: {e:?}"),
    };
    run.store = Some(store);
    for (step, op) in ops.iter().enumerate() {
        run.step = step;
        if trace {
            eprintln!("{step}: {op:?}");
        }
        run.op(op);
        if run.disk.is_powered_off() {
            run.power_cut();
        }
    }
    run.finish();
}
