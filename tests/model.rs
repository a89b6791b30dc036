//! Model-based property test: random sequences of operations run against a real [`Store`] (in a
//! temp dir, `ManualClock`, 4 KiB segments so the log rotates, `Durability::Never`, no
//! auto-compaction) and against a plain in-memory model written from API.md, and every answer
//! must agree.
//!
//! Operations: `add` batches (through the store or a session view, with known and new
//! (id, version) pairs, same or other content, TTLs, confidences, every scope), `delete`, `get`
//! with random filters (types, time range, scopes, min_confidence, sources, content_eq,
//! newest_first, limit), `resolve` of `id` / `id@version` refs, snapshots (store or session
//! views) read later with `get` and `resolve`, clock advances, close-and-reopen, `compact()`,
//! `pin_snapshot` (through the store or a session view's snapshot), `unpin_snapshot`, and
//! `open_snapshot` followed by `get`, `resolve` and `digest` through the pinned view (the handle
//! is then kept as a live snapshot until the next reopen).
//!
//! What it proves, for every generated sequence: add outcomes (Added / Unchanged, one seq per
//! batch, seqs increasing) and errors (VersionConflict / PermissionDenied with the item's index)
//! match the model; a refused batch changes nothing; a delete answers whether the id had a history
//! and starts a fresh one; `get` returns exactly the latest version of each live, unexpired,
//! visible id that passes the filters, in `(timestamp, id)` order or its exact reverse, truncated to
//! the limit, with the full item (hash included) equal to what was added; `resolve` answers Found /
//! NotFound / Expired / Superseded as API.md says, with another session's ids NotFound; snapshots
//! keep answering as of their sequence number and `taken_at`; reopening loses nothing; and
//! `stats().items` and `verify()` agree with the model at the end.
//!
//! Compaction in the model: it changes nothing but this: an expired latest version that no live
//! snapshot handle of the test and no pin sees (a view sees it if it was taken after the version
//! was added, whatever its session or `taken_at`) is reclaimed, so that `resolve` answers NotFound
//! instead of Expired (for `id@version` refs too) and `stats().items` no longer counts the id.
//! Reclaimed and superseded versions still answer Unchanged / VersionConflict to the store handle;
//! a session is refused (`PermissionDenied`) a comparison with a version it may not see: another
//! session's, or a reclaimed one. Compaction also retires superseded versions that no view sees,
//! which the model does not follow: a session refused for an earlier superseded version of its own
//! or of a global scope tells the model that it was. `compact()` must
//! report exactly the model's newly reclaimed expired versions, and `verify()` must be clean after
//! it. Pins: `pin_snapshot` answers the current seq and clock (a name already pinned is `Invalid`
//! and writes nothing), `snapshots()` always lists exactly the model's pins, `unpin_snapshot`
//! answers whether the pin existed, `open_snapshot` of an unknown name is `SnapshotNotFound`, and a
//! pin answers `get`, `resolve` and `digest` (computed from the model) as the model did when it was
//! pinned, across compactions and reopens, until the end of the case.
//!
//! Runs 256 cases by default; set `PROPTEST_CASES` for more.

use std::collections::BTreeMap;
use std::sync::Arc;

use ctxlog::{
    canonical_json, AddOutcome, Clock, ContextItem, ContextQuery, Durability, Error, ManualClock, Options, Resolution,
    Scope, Snapshot, Store, TimeRange,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const START: i64 = 1_000;
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
/// Pin names; "p3" is rarely pinned, so that opening and unpinning unknown names happen too.
const PIN_NAMES: [&str; 3] = ["p1", "p2", "p3"];

fn scope_of(i: usize) -> Scope {
    match i {
        0 => Scope::Session("s1".into()),
        1 => Scope::Session("s2".into()),
        2 => Scope::GlobalReadonly,
        _ => Scope::GlobalWritable,
    }
}

/// The content of an item: `None` is the usual content of its (id, version), so that most re-adds
/// are `Unchanged`; `Some(i)` picks from a small pool, so that conflicts happen too.
fn content_of(id: &str, version: &str, pick: Option<usize>) -> Value {
    match pick {
        None => {
            let k = if version == "2" { 2 } else { 1 };
            let x = if id < "d" { "y" } else { "z" };
            // About 200 bytes: a few dozen records fill a 4 KiB segment.
            json!({"id": id, "v": version, "k": k, "n": {"x": x}, "pad": "p".repeat(150)})
        }
        Some(0) => json!({"k": 1}),
        Some(1) => json!({"k": 2, "n": {"x": "y"}}),
        Some(2) => json!({"t": "é", "n": {"x": "z"}, "k": 1}),
        Some(3) => json!("plain"),
        Some(4) => json!([1, 2, 3]),
        // A segment of its own, nearly.
        Some(_) => json!({"big": "x".repeat(3000), "k": 2}),
    }
}

fn eq_value_of(i: usize) -> Value {
    [json!(1), json!(2), json!("y"), json!("z")][i % 4].clone()
}

fn hash_of(content: &Value) -> String {
    let digest = Sha256::digest(canonical_json(content));
    let mut text = String::from("sha256:");
    for byte in digest {
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
    /// No filter at all.
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
            q = q.time_range(TimeRange::new(start, end).expect("start <= end"));
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

#[derive(Clone, Debug)]
enum Op {
    /// `view`: `None` for the store, else a session view.
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
    Snapshot {
        view: Option<&'static str>,
    },
    /// Reads the snapshot `snap % count` (skipped when there is none).
    GetSnap {
        snap: usize,
        query: QuerySpec,
    },
    ResolveSnap {
        snap: usize,
        refs: Vec<Ref>,
    },
    Advance(i64),
    Reopen,
    /// `store.compact()`.
    Compact,
    /// Pins a snapshot of now, through the store (`None`) or a session view's snapshot.
    Pin {
        name: &'static str,
        view: Option<&'static str>,
    },
    Unpin(&'static str),
    /// `open_snapshot(name)`, then `get`, `resolve` and `digest` through it; the handle is kept
    /// (as a live snapshot that `GetSnap` / `ResolveSnap` read later) until the next reopen.
    OpenPinned {
        name: &'static str,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
}

fn item_spec() -> impl Strategy<Value = ItemSpec> {
    (
        prop::sample::select(&IDS[..]),
        prop::sample::select(&VERSIONS[..]),
        prop::option::weighted(0.15, 0..6usize),
        prop::sample::select(&KINDS[..]),
        prop::sample::select(&SOURCES[..]),
        START - 6..=START + 8,
        0..4usize,
        prop::option::weighted(0.35, 1..=12u64),
        prop::option::of(prop::sample::select(&CONFIDENCES[..])),
    )
        .prop_map(
            |(id, version, content, kind, source, timestamp, scope, ttl, confidence)| ItemSpec {
                id,
                version,
                content,
                kind,
                source,
                timestamp,
                scope,
                ttl,
                confidence,
            },
        )
}

fn query_spec() -> impl Strategy<Value = QuerySpec> {
    (
        // At least one type: what `.types([])` means is not settled by API.md (the store reads it as
        // "every type", while `.scopes([])` and `.sources([])` match nothing).
        prop::option::weighted(0.3, prop::sample::subsequence(&QUERY_KINDS[..], 1..=3)),
        prop::option::weighted(0.3, (START - 7..=START + 9, 0..8i64).prop_map(|(s, len)| (s, s + len))),
        prop::option::weighted(0.3, prop::sample::subsequence(vec![0usize, 1, 2, 3], 0..=3)),
        prop::option::weighted(0.3, prop::sample::select(&MIN_CONFIDENCES[..])),
        prop::option::weighted(0.3, prop::sample::subsequence(&SOURCES[..], 0..=2)),
        prop::option::weighted(0.3, (prop::sample::select(&PATHS[..]), 0..4usize)),
        any::<bool>(),
        prop::option::weighted(0.3, 0..5usize),
    )
        .prop_map(
            |(types, range, scopes, min_confidence, sources, content_eq, newest_first, limit)| QuerySpec {
                types,
                range,
                scopes,
                min_confidence,
                sources,
                content_eq,
                newest_first,
                limit,
            },
        )
}

fn refs() -> impl Strategy<Value = Vec<Ref>> {
    prop::collection::vec(
        (
            prop::sample::select(&IDS[..]),
            prop::option::of(prop::sample::select(&VERSIONS[..])),
        ),
        1..5,
    )
}

fn read_view() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![3 => Just(None), 2 => prop::sample::select(&VIEWS[..]).prop_map(Some)]
}

fn write_view() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![4 => Just(None), 1 => Just(Some("s1")), 1 => Just(Some("s2"))]
}

fn pin_name() -> impl Strategy<Value = &'static str> {
    prop_oneof![3 => Just(PIN_NAMES[0]), 2 => Just(PIN_NAMES[1]), 1 => Just(PIN_NAMES[2])]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (write_view(), prop::collection::vec(item_spec(), 1..=5))
            .prop_map(|(view, items)| Op::Add { view, items }),
        1 => prop::sample::select(&IDS[..]).prop_map(Op::Delete),
        3 => (read_view(), query_spec()).prop_map(|(view, query)| Op::Get { view, query }),
        3 => (read_view(), refs()).prop_map(|(view, refs)| Op::Resolve { view, refs }),
        1 => read_view().prop_map(|view| Op::Snapshot { view }),
        2 => (any::<usize>(), query_spec()).prop_map(|(snap, query)| Op::GetSnap { snap, query }),
        2 => (any::<usize>(), refs()).prop_map(|(snap, refs)| Op::ResolveSnap { snap, refs }),
        2 => (0..=6i64).prop_map(Op::Advance),
        1 => Just(Op::Reopen),
        2 => Just(Op::Compact),
        1 => (pin_name(), read_view()).prop_map(|(name, view)| Op::Pin { name, view }),
        1 => pin_name().prop_map(Op::Unpin),
        2 => (pin_name(), query_spec(), refs()).prop_map(|(name, query, refs)| Op::OpenPinned { name, query, refs }),
    ]
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

/// One version in the model: the item (with its hash as the store fills it in), the step of the
/// operation that added it (steps order versions and snapshots as sequence numbers do), and whether
/// compaction has reclaimed its content (the latest version once expired; an earlier version only
/// once a session's refused comparison showed it, see [`Model::add`]).
#[derive(Clone, Debug)]
struct Version {
    item: ContextItem,
    created: usize,
    reclaimed: bool,
}

/// The model: per id, its current history (since its last delete), in the order added; the last
/// entry is the latest version. Reclaimed versions stay in the history: the store remembers their
/// (id, version, hash), so they still answer Unchanged / VersionConflict.
#[derive(Clone, Debug, Default)]
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
    /// The answer to `items` added by `session` at `step`; `denied`, the position the store refused
    /// with `PermissionDenied` if it did, settles whether compaction retired a superseded version.
    fn add(
        &mut self,
        items: &[ContextItem],
        session: Option<&str>,
        step: usize,
        denied: Option<usize>,
    ) -> Result<Vec<AddExpect>, AddError> {
        if let Some(session) = session {
            // Validation (permissions included) comes before any conflict check.
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
            item.hash = Some(hash_of(&item.content));
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
                // Only versions the session may see are compared: not another session's, nor a
                // reclaimed one (the store keeps no scope for it). A refusal for a version the session
                // may see tells that compaction retired it; one it may not see is refused for its scope.
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
                let Some(history) = self.ids.get(id) else {
                    return not_found;
                };
                let Some(latest) = history.last() else {
                    return not_found;
                };
                // A reclaimed latest version answers NotFound, `id@version` refs included.
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
                match version {
                    None => Resolution::Found(latest.clone()),
                    Some(v) if v == latest.version => Resolution::Found(latest.clone()),
                    Some(v) if history.iter().any(|known| known.item.version == v) => Resolution::Superseded {
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

    /// What `compact()` does at `now`: every expired latest version that no view in `views`
    /// (steps of live snapshot handles and pins) sees is reclaimed. A view sees the latest version
    /// if it was taken after the version was added (the version is still the latest, so it was the
    /// latest at the view's seq), whatever its session and its `taken_at`. Returns how many
    /// versions were reclaimed.
    fn compact(&mut self, now: i64, views: &[usize]) -> u64 {
        let mut reclaimed = 0;
        for history in self.ids.values_mut() {
            let Some(latest) = history.last_mut() else { continue };
            let seen = views.iter().any(|step| *step > latest.created);
            if !latest.reclaimed && expired(&latest.item, now).is_some() && !seen {
                latest.reclaimed = true;
                reclaimed += 1;
            }
        }
        reclaimed
    }

    /// What `Snapshot::digest` gives for a view of this state: SHA-256 over the canonical JSON of
    /// every item `get` shows, ordered by (id, version), each followed by a newline.
    fn digest(&self, session: Option<&str>, now: i64) -> String {
        let mut items = self.get(&QuerySpec::everything(), session, now);
        items.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
        let mut hasher = Sha256::new();
        for item in &items {
            let value = serde_json::to_value(item).expect("an item serializes");
            hasher.update(canonical_json(&value));
            hasher.update(b"\n");
        }
        let mut text = String::from("sha256:");
        for byte in hasher.finalize() {
            text.push_str(&format!("{byte:02x}"));
        }
        text
    }
}

struct SnapModel {
    snapshot: Snapshot,
    model: Model,
    taken_at: i64,
    session: Option<&'static str>,
    /// The step of the view (for a reopened pin, of the pin): compaction keeps what it sees.
    step: usize,
}

/// A pinned snapshot: the model as it was when pinned, and what `snapshots()` must list.
#[derive(Clone, Debug)]
struct PinModel {
    model: Model,
    seq: u64,
    taken_at: i64,
    session: Option<&'static str>,
    step: usize,
}

/// Checks `snapshots()` against the model's pins.
fn check_pin_list(s: &Store, pins: &BTreeMap<&'static str, PinModel>, what: &str) -> Result<(), TestCaseError> {
    let listed: Vec<(String, u64, i64, Option<String>)> = s
        .snapshots()
        .into_iter()
        .map(|info| (info.name, info.seq, info.taken_at, info.session))
        .collect();
    let expected: Vec<(String, u64, i64, Option<String>)> = pins
        .iter()
        .map(|(name, pin)| {
            (
                (*name).to_owned(),
                pin.seq,
                pin.taken_at,
                pin.session.map(str::to_owned),
            )
        })
        .collect();
    prop_assert_eq!(listed, expected, "{}: snapshots()", what);
    Ok(())
}

/// Opens the pin `name` and checks that it answers `query`, `refs` and `digest` as the model of
/// the pin says; returns the handle.
fn check_pinned(
    s: &Store,
    name: &str,
    pin: &PinModel,
    query: &QuerySpec,
    refs: &[Ref],
    what: &str,
) -> Result<Snapshot, TestCaseError> {
    let snapshot = s.open_snapshot(name).map_err(|e| fail("open_snapshot", e))?;
    prop_assert_eq!(snapshot.seq(), pin.seq, "{}: pin {} seq", what, name);
    prop_assert_eq!(snapshot.taken_at(), pin.taken_at, "{}: pin {} taken_at", what, name);
    prop_assert_eq!(snapshot.session(), pin.session, "{}: pin {} session", what, name);
    let actual = snapshot.get(&query.query()).map_err(|e| fail("pinned get", e))?;
    prop_assert_eq!(
        actual,
        pin.model.get(query, pin.session, pin.taken_at),
        "{}: pin {} get",
        what,
        name
    );
    let texts: Vec<String> = refs.iter().map(ref_text).collect();
    let actual = snapshot.resolve(&texts).map_err(|e| fail("pinned resolve", e))?;
    prop_assert_eq!(
        actual,
        pin.model.resolve(refs, pin.session, pin.taken_at),
        "{}: pin {} resolve",
        what,
        name
    );
    let digest = snapshot.digest().map_err(|e| fail("pinned digest", e))?;
    prop_assert_eq!(
        digest,
        pin.model.digest(pin.session, pin.taken_at),
        "{}: pin {} digest",
        what,
        name
    );
    Ok(snapshot)
}

fn fail(what: &str, e: Error) -> TestCaseError {
    TestCaseError::fail(format!("{what} failed: {e}"))
}

fn open(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Result<Store, TestCaseError> {
    Options::new()
        .durability(Durability::Never)
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .segment_size(4096)
        .auto_compact(false)
        .open(dir)
        .map_err(|e| fail("open", e))
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(format!("tempdir: {e}")))?;
    let clock = Arc::new(ManualClock::new(START));
    let mut store = Some(open(dir.path(), &clock)?);
    let mut model = Model::default();
    let mut snaps: Vec<SnapModel> = Vec::new();
    let mut pins: BTreeMap<&'static str, PinModel> = BTreeMap::new();
    let mut last_seq = 0u64;

    for (step, op) in ops.iter().enumerate() {
        let s = store.as_ref().expect("store is open between steps");
        let now = clock.now();
        match op {
            Op::Add { view, items } => {
                let items: Vec<ContextItem> = items.iter().map(ItemSpec::item).collect();
                let actual = match view {
                    None => s.add(items.clone()),
                    Some(session) => s.session(session).add(items.clone()),
                };
                let denied = match &actual {
                    Err(Error::PermissionDenied { index, .. }) => *index,
                    _ => None,
                };
                let expected = model.add(&items, *view, step, denied);
                match (expected, actual) {
                    (Ok(expected), Ok(actual)) => {
                        let mut batch_seq = None;
                        let got: Vec<AddExpect> = actual
                            .into_iter()
                            .map(|outcome| match outcome {
                                AddOutcome::Added { id, version, seq } => {
                                    prop_assert!(
                                        batch_seq.is_none_or(|b| b == seq),
                                        "step {step}: one batch, several seqs"
                                    );
                                    batch_seq = Some(seq);
                                    Ok(AddExpect::Added(id, version))
                                }
                                AddOutcome::Unchanged { id, version } => Ok(AddExpect::Unchanged(id, version)),
                                other => Err(TestCaseError::fail(format!("unknown outcome {other:?}"))),
                            })
                            .collect::<Result<_, _>>()?;
                        prop_assert_eq!(got, expected, "step {}: add outcomes", step);
                        if let Some(seq) = batch_seq {
                            prop_assert!(seq > last_seq, "step {step}: seq {seq} not after {last_seq}");
                            last_seq = seq;
                        }
                    }
                    (Err(expected), Err(actual)) => {
                        let got = match &actual {
                            Error::PermissionDenied { index: Some(i), .. } => AddError::PermissionDenied(*i),
                            Error::VersionConflict { index: Some(i), .. } => AddError::VersionConflict(*i),
                            other => return Err(TestCaseError::fail(format!("step {step}: add error {other:?}"))),
                        };
                        prop_assert_eq!(got, expected, "step {}: add error ({})", step, actual);
                    }
                    (expected, actual) => {
                        return Err(TestCaseError::fail(format!(
                            "step {step}: add: expected {expected:?}, store answered {actual:?}"
                        )))
                    }
                }
            }
            Op::Delete(id) => {
                let expected = model.delete(id);
                let actual = s.delete(id).map_err(|e| fail("delete", e))?;
                prop_assert_eq!(actual, expected, "step {}: delete({})", step, id);
            }
            Op::Get { view, query } => {
                let expected = model.get(query, *view, now);
                let actual = match view {
                    None => s.get(&query.query()),
                    Some(session) => s.session(session).get(&query.query()),
                }
                .map_err(|e| fail("get", e))?;
                prop_assert_eq!(actual, expected, "step {}: get", step);
            }
            Op::Resolve { view, refs } => {
                let expected = model.resolve(refs, *view, now);
                let texts: Vec<String> = refs.iter().map(ref_text).collect();
                let actual = match view {
                    None => s.resolve(&texts),
                    Some(session) => s.session(session).resolve(&texts),
                }
                .map_err(|e| fail("resolve", e))?;
                prop_assert_eq!(actual, expected, "step {}: resolve", step);
            }
            Op::Snapshot { view } => {
                let snapshot = match view {
                    None => s.snapshot(),
                    Some(session) => s.session(session).snapshot(),
                };
                prop_assert_eq!(snapshot.taken_at(), now, "step {}: taken_at", step);
                prop_assert_eq!(snapshot.session(), *view, "step {}: snapshot session", step);
                snaps.push(SnapModel {
                    snapshot,
                    model: model.clone(),
                    taken_at: now,
                    session: *view,
                    step,
                });
            }
            Op::GetSnap { snap, query } => {
                if snaps.is_empty() {
                    continue;
                }
                let snap = &snaps[snap % snaps.len()];
                let expected = snap.model.get(query, snap.session, snap.taken_at);
                let actual = snap.snapshot.get(&query.query()).map_err(|e| fail("snapshot get", e))?;
                prop_assert_eq!(actual, expected, "step {}: snapshot get", step);
            }
            Op::ResolveSnap { snap, refs } => {
                if snaps.is_empty() {
                    continue;
                }
                let snap = &snaps[snap % snaps.len()];
                let expected = snap.model.resolve(refs, snap.session, snap.taken_at);
                let texts: Vec<String> = refs.iter().map(ref_text).collect();
                let actual = snap.snapshot.resolve(&texts).map_err(|e| fail("snapshot resolve", e))?;
                prop_assert_eq!(actual, expected, "step {}: snapshot resolve", step);
            }
            Op::Advance(secs) => clock.advance(*secs),
            Op::Reopen => {
                // Snapshots of the closed handle are not carried over.
                snaps.clear();
                drop(store.take());
                store = Some(open(dir.path(), &clock)?);
                // Pins survive.
                let s = store.as_ref().expect("store is open");
                check_pin_list(s, &pins, &format!("step {step}: after reopen"))?;
            }
            Op::Compact => {
                let views: Vec<usize> = snaps
                    .iter()
                    .map(|snap| snap.step)
                    .chain(pins.values().map(|pin| pin.step))
                    .collect();
                let expected = model.compact(now, &views);
                let report = s.compact().map_err(|e| fail("compact", e))?;
                prop_assert_eq!(
                    report.reclaimed_expired,
                    expected,
                    "step {}: expired versions reclaimed ({:?})",
                    step,
                    report
                );
                let verified = s.verify().map_err(|e| fail("verify after compact", e))?;
                prop_assert!(
                    verified.is_ok(),
                    "step {step}: verify after compact: {:?}",
                    verified.problems
                );
            }
            Op::Pin { name, view } => {
                let seq_before = s.stats().seq;
                let result = match view {
                    None => s.pin_snapshot(name),
                    Some(session) => s.session(session).snapshot().pin(name),
                };
                if pins.contains_key(name) {
                    prop_assert!(
                        matches!(result, Err(Error::Invalid { .. })),
                        "step {step}: pinning the pinned name {name} answered {result:?}"
                    );
                    prop_assert_eq!(s.stats().seq, seq_before, "step {}: a refused pin wrote", step);
                } else {
                    let info = result.map_err(|e| fail("pin", e))?;
                    prop_assert_eq!(
                        (info.name.as_str(), info.seq, info.taken_at, info.session.as_deref()),
                        (*name, seq_before, now, *view),
                        "step {}: pin info",
                        step
                    );
                    pins.insert(
                        name,
                        PinModel {
                            model: model.clone(),
                            seq: seq_before,
                            taken_at: now,
                            session: *view,
                            step,
                        },
                    );
                }
                check_pin_list(s, &pins, &format!("step {step}: after pin"))?;
            }
            Op::Unpin(name) => {
                let expected = pins.remove(name).is_some();
                let actual = s.unpin_snapshot(name).map_err(|e| fail("unpin", e))?;
                prop_assert_eq!(actual, expected, "step {}: unpin({})", step, name);
                check_pin_list(s, &pins, &format!("step {step}: after unpin"))?;
            }
            Op::OpenPinned { name, query, refs } => match pins.get(name) {
                None => {
                    let result = s.open_snapshot(name);
                    prop_assert!(
                        matches!(result, Err(Error::SnapshotNotFound { .. })),
                        "step {step}: open_snapshot of the unknown {name} answered {result:?}"
                    );
                }
                Some(pin) => {
                    let snapshot = check_pinned(s, name, pin, query, refs, &format!("step {step}"))?;
                    snaps.push(SnapModel {
                        snapshot,
                        model: pin.model.clone(),
                        taken_at: pin.taken_at,
                        session: pin.session,
                        step: pin.step,
                    });
                }
            },
        }
    }

    let s = store.as_ref().expect("store is open");
    prop_assert_eq!(s.stats().items, model.live_ids(), "stats().items at the end");
    let report = s.verify().map_err(|e| fail("verify", e))?;
    prop_assert!(report.is_ok(), "verify found problems: {:?}", report.problems);
    // Everything acknowledged survives one more reopen.
    snaps.clear();
    drop(store.take());
    let s = open(dir.path(), &clock)?;
    let everything = QuerySpec::everything();
    let now = clock.now();
    let actual = s.get(&everything.query()).map_err(|e| fail("final get", e))?;
    prop_assert_eq!(actual, model.get(&everything, None, now), "get after the final reopen");
    let all_refs: Vec<Ref> = IDS
        .iter()
        .flat_map(|id| std::iter::once((*id, None)).chain(VERSIONS.iter().map(move |v| (*id, Some(*v)))))
        .collect();
    let texts: Vec<String> = all_refs.iter().map(ref_text).collect();
    let actual = s.resolve(&texts).map_err(|e| fail("final resolve", e))?;
    prop_assert_eq!(
        actual,
        model.resolve(&all_refs, None, now),
        "resolve after the final reopen"
    );
    // Every pin survives, answering as when it was pinned.
    check_pin_list(&s, &pins, "after the final reopen")?;
    for (name, pin) in &pins {
        check_pinned(&s, name, pin, &everything, &all_refs, "after the final reopen")?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        // No regression files: this test may only touch tests/model.rs.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn store_matches_model(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }
}
