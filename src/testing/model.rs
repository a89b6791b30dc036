//! The reference model of a store's observable behaviour, the one `tests/model.rs` (a property test)
//! and the `stateful` fuzz target ([`super::stateful`]) both drive: a plain in-memory account of
//! what the documented API promises (the `///` docs of `Store`, `SessionView`, `Snapshot` and
//! `CompactionReport`, docs/ARCHITECTURE.md, docs/TESTING.md "Session isolation"), and of what a
//! store shows of its state ([`Observation`]).
//!
//! The drivers draw their operations from one vocabulary (`vocabulary.rs`: [`ItemSpec`],
//! [`QuerySpec`], [`Ref`]), and read the store's answers in the model's terms (`observe.rs`:
//! [`StoreAdd`], [`pin_in_store`], [`Observation`]). [`Model`] holds per id its history since the
//! last delete:
//!
//! - `add`: validation (a session's own scope or `GlobalWritable` for every item) before anything
//!   else; a session adds versions only to ids whose latest version, while its record is stored,
//!   is in a scope it may write, checked before versions are compared; a session compares only with
//!   versions it may see (not another session's, nor a retired one, whose scope the store no longer
//!   keeps): such a version number is `PermissionDenied` whatever the content; otherwise an
//!   (id, version) already stored answers `Unchanged` for the same content hash and
//!   `VersionConflict` for another, and a new one is `Added`. A refused batch changes nothing.
//! - `delete` answers whether the id had a history since its last delete, and starts a fresh one.
//! - Reads at a time `now` (the clock, or a snapshot's `taken_at`) and for a session or none: `get`
//!   is the latest version of each id, unless retired, expired (`timestamp + ttl <= now`) or in a
//!   scope the session may not see, that passes the filters, in `(timestamp, id)` order or its
//!   reverse, cut to the limit; `resolve` answers `NotFound` for an unknown id, a retired latest
//!   version and another session's; `Expired` for an expired latest version (`id@version` refs of
//!   the id too); `Found` for the id or its latest version; `Superseded` for an earlier version of
//!   the history (retired ones included); `NotFound` for any other version.
//! - Compaction retires (reclaims the content of) every version that the current state does not
//!   need and no view sees (a live snapshot handle or a pin, whatever its session or `taken_at`,
//!   sees a version if it was taken after the version was added and before a later one replaced
//!   it): an expired latest version, which then resolves `NotFound` instead of `Expired` and is no
//!   longer counted by `stats().items`; and a superseded version, which a session may then no longer
//!   compare with. Retired versions still answer `Unchanged` / `VersionConflict` to the store
//!   handle, and `Superseded` to `id@version`. `compact()` reports both counts. A compaction cut
//!   short by a power cut may have done any part of this.
//!
//! A [`State`] is the model with its pins, a [`View`] a snapshot of the model (live handle or pin).
//! Steps (the position of an operation in its sequence) order versions and views as sequence
//! numbers do.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::{canonical_json, Change, ContextItem, Resolution, Scope};

mod observe;
mod vocabulary;

pub use observe::{listed_pins, observe, pin_in_store, Observation, Pinned, StoreAdd};
pub use vocabulary::{
    all_refs, content_of, eq_value_of, ref_text, scope_of, ItemSpec, QuerySpec, Ref, CONFIDENCES, IDS, KINDS,
    MIN_CONFIDENCES, PATHS, PIN_NAMES, QUERY_KINDS, SOURCES, START, VERSIONS, VIEWS,
};

fn hex_sha256(bytes: impl AsRef<[u8]>) -> String {
    let mut text = String::from("sha256:");
    for byte in Sha256::digest(bytes) {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// What an add did to one item, as the model says it.
#[derive(Clone, Debug, PartialEq)]
pub enum AddExpect {
    /// `AddOutcome::Added` of (id, version).
    Added(String, String),
    /// `AddOutcome::Unchanged` of (id, version).
    Unchanged(String, String),
}

/// Why an add was refused, with the position of the refused item.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AddError {
    /// `Error::PermissionDenied`.
    PermissionDenied(usize),
    /// `Error::VersionConflict`.
    VersionConflict(usize),
}

/// The answer to an add: every item's outcome, or the refusal of the batch.
pub type AddAnswer = Result<Vec<AddExpect>, AddError>;

/// The position the store refused with `PermissionDenied`, if it did (for [`Model::add`]).
#[must_use]
pub fn denied_at(answer: &AddAnswer) -> Option<usize> {
    match answer {
        Err(AddError::PermissionDenied(position)) => Some(*position),
        _ => None,
    }
}

/// Whether a version's record is still stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Record {
    /// The full record: the item can be read.
    Stored,
    /// Compaction retired it: its content is reclaimed, and a retired record keeps only its
    /// (id, version, hash), no scope.
    Retired,
    /// A compaction cut short by a power cut may have retired it (a superseded version, in a
    /// segment that may or may not have been rewritten): a session's `PermissionDenied` for it
    /// tells that it was (see [`Model::add`]), and the next compaction retires it for sure.
    MaybeRetired,
}

/// One version: the item (with its hash as the store fills it in), the step of the operation that
/// added it, and its record.
#[derive(Clone, Debug, PartialEq)]
struct Version {
    item: ContextItem,
    created: usize,
    record: Record,
}

impl Version {
    fn retired(&self) -> bool {
        self.record == Record::Retired
    }
}

/// The model: per id, its current history (since its last delete), in the order added; the last
/// entry is the latest version. Retired versions stay in the history: the store remembers their
/// (id, version, hash), so they still answer `Unchanged` / `VersionConflict` to the store handle
/// and `Superseded` to `id@version`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    ids: BTreeMap<String, Vec<Version>>,
}

/// What `compact()` reclaims, as its `CompactionReport` counts it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reclaimed {
    /// `reclaimed_expired`: expired latest versions.
    pub expired: u64,
    /// `reclaimed_superseded`, at least: superseded versions whose records were stored.
    pub superseded: u64,
    /// Superseded versions a compaction cut short may have retired already: `reclaimed_superseded`
    /// counts those it retires now, up to this many more.
    pub superseded_maybe: u64,
}

impl Reclaimed {
    /// Whether a compaction that reports `expired` and `superseded` reclaimed versions did this.
    #[must_use]
    pub fn allows(&self, expired: u64, superseded: u64) -> bool {
        expired == self.expired && (self.superseded..=self.superseded + self.superseded_maybe).contains(&superseded)
    }
}

/// Whether a session view of `session` may write `scope`.
fn writable_by(scope: &Scope, session: &str) -> bool {
    match scope {
        Scope::Session(owner) => owner == session,
        Scope::GlobalWritable => true,
        Scope::GlobalReadonly => false,
    }
}

/// Whether a reader of `session` (`None`: the store handle) may see `scope`.
fn visible_to(scope: &Scope, session: Option<&str>) -> bool {
    match (scope, session) {
        (Scope::Session(owner), Some(reader)) => owner == reader,
        _ => true,
    }
}

/// When `item` expired, if it has by `now`.
fn expired(item: &ContextItem, now: i64) -> Option<i64> {
    let at = item.timestamp + i64::try_from(item.ttl_seconds?).ok()?;
    (at <= now).then_some(at)
}

/// Whether a view taken at one of the steps `views` sees a version added at step `created` and
/// superseded at step `ended` (`None` while it is the latest): a view sees what was added before it
/// and not yet replaced, whatever its session and its `taken_at`.
fn seen(views: &[usize], created: usize, ended: Option<usize>) -> bool {
    views
        .iter()
        .any(|step| *step > created && ended.is_none_or(|ended| *step <= ended))
}

impl Model {
    /// The answer to `items` added by `session` (`None`: the store handle) at `step`, applied to
    /// the model when accepted. `denied` is the position the store refused with `PermissionDenied`,
    /// if it did: it settles the one case the model cannot know, whether a compaction cut short by
    /// a power cut retired a superseded version (see below).
    pub fn add(
        &mut self,
        items: &[ContextItem],
        session: Option<&str>,
        step: usize,
        denied: Option<usize>,
    ) -> AddAnswer {
        if let Some(session) = session {
            // Validation (permissions included) comes before any version is compared.
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
            // not retired, is in a scope it may write; this is checked before versions are compared.
            if let Some(session) = session {
                if history
                    .last()
                    .is_some_and(|latest| !latest.retired() && !writable_by(&latest.item.scope, session))
                {
                    return Err(AddError::PermissionDenied(position));
                }
            }
            let found = history.iter().position(|known| known.item.version == item.version);
            if let (Some(session), Some((at, known))) = (session, found.and_then(|at| Some((at, history.get(at)?)))) {
                // A session compares only with versions it may see: not another session's, nor a
                // retired one (whose scope the store no longer keeps). Whether a compaction cut short
                // retired a superseded version, the store's refusal tells, unless the version's scope
                // already explains it.
                let visible = visible_to(&known.item.scope, Some(session));
                let retired = match known.record {
                    Record::Stored => false,
                    Record::Retired => true,
                    Record::MaybeRetired => visible && denied == Some(position),
                };
                if retired || !visible {
                    if retired {
                        if let Some(kept) = self.ids.get_mut(&item.id).and_then(|h| h.get_mut(at)) {
                            kept.record = Record::Retired;
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
                        record: Record::Stored,
                    });
                }
            }
        }
        self.ids = ids;
        Ok(out)
    }

    /// The scope of `id`'s latest version since its last delete, if it has one.
    #[must_use]
    pub fn latest_scope(&self, id: &str) -> Option<Scope> {
        self.ids.get(id)?.last().map(|latest| latest.item.scope.clone())
    }

    /// Deletes `id`: whether it had a history since its last delete.
    pub fn delete(&mut self, id: &str) -> bool {
        self.ids.remove(id).is_some_and(|history| !history.is_empty())
    }

    /// What `get` answers for a reader of `session` at time `now`.
    #[must_use]
    pub fn get(&self, query: &QuerySpec, session: Option<&str>, now: i64) -> Vec<ContextItem> {
        let mut out: Vec<ContextItem> = self
            .ids
            .values()
            .filter_map(|history| history.last())
            .filter(|latest| !latest.retired())
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

    /// What `resolve` answers for a reader of `session` at time `now`.
    #[must_use]
    pub fn resolve(&self, refs: &[Ref], session: Option<&str>, now: i64) -> Vec<Resolution> {
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
                // A retired latest version answers NotFound, `id@version` refs included.
                if latest.retired() {
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
    #[must_use]
    pub fn live_ids(&self) -> u64 {
        self.ids
            .values()
            .filter(|h| h.last().is_some_and(|latest| !latest.retired()))
            .count() as u64
    }

    /// The ids whose latest version `compact()` at `now` retires: expired, and seen by no view in
    /// `views` (steps of live snapshot handles and pins).
    #[must_use]
    pub fn reclaimable(&self, now: i64, views: &[usize]) -> Vec<String> {
        self.ids
            .iter()
            .filter(|(_, history)| {
                history.last().is_some_and(|latest| {
                    latest.record == Record::Stored
                        && expired(&latest.item, now).is_some()
                        && !seen(views, latest.created, None)
                })
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Retires the latest version of `id` (one of [`Model::reclaimable`]).
    pub fn reclaim(&mut self, id: &str) {
        if let Some(latest) = self.ids.get_mut(id).and_then(|h| h.last_mut()) {
            latest.record = Record::Retired;
        }
    }

    /// Marks every superseded version that no view in `views` sees, and that is not retired, as
    /// `record`; returns how many there were, and how many of them were [`Record::MaybeRetired`].
    fn retire_superseded(&mut self, views: &[usize], record: Record) -> (u64, u64) {
        let (mut stored, mut maybe) = (0, 0);
        for history in self.ids.values_mut() {
            let ends: Vec<usize> = history.iter().skip(1).map(|next| next.created).collect();
            for (version, ended) in history.iter_mut().zip(ends) {
                if version.retired() || seen(views, version.created, Some(ended)) {
                    continue;
                }
                match version.record {
                    Record::Stored => stored += 1,
                    _ => maybe += 1,
                }
                version.record = record;
            }
        }
        (stored, maybe)
    }

    /// What `compact()` does at `now` with the views `views` (the steps of live snapshot handles
    /// and pins): it retires every version no view sees and the current state does not need, that
    /// is, every [`Model::reclaimable`] latest version, and every superseded version no view saw
    /// between its addition and the one that replaced it (`compact()` seals the active segment
    /// first when it holds any of them, and rewrites every segment that does).
    pub fn compact(&mut self, now: i64, views: &[usize]) -> Reclaimed {
        let ids = self.reclaimable(now, views);
        for id in &ids {
            self.reclaim(id);
        }
        let (superseded, superseded_maybe) = self.retire_superseded(views, Record::Retired);
        Reclaimed {
            expired: ids.len() as u64,
            superseded,
            superseded_maybe,
        }
    }

    /// Every model a `compact()` at `now` cut short by a power cut may leave: segments are
    /// rewritten one after the other, so any part of its reclaims may be done: any subset of the
    /// [`Model::reclaimable`] latest versions retired, and each superseded version it would retire
    /// maybe retired. This model itself (nothing done) is not among them.
    #[must_use]
    pub fn compact_cut_short(&self, now: i64, views: &[usize]) -> Vec<Model> {
        let ids = self.reclaimable(now, views);
        let mut base = self.clone();
        base.retire_superseded(views, Record::MaybeRetired);
        (0u32..(1 << ids.len()))
            .map(|mask| {
                let mut model = base.clone();
                for (i, id) in ids.iter().enumerate() {
                    if mask & (1 << i) != 0 {
                        model.reclaim(id);
                    }
                }
                model
            })
            .filter(|model| model != self)
            .collect()
    }

    /// What `Snapshot::digest` gives for a view of this state: SHA-256 over the canonical JSON of
    /// every item `get` shows, ordered by (id, version), each followed by a newline.
    #[must_use]
    pub fn digest(&self, session: Option<&str>, now: i64) -> String {
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

/// A snapshot in the model (a live handle, or what a pin shows): the model as it was, the time it
/// judges TTL at, its session, and its step (compaction keeps what it sees).
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// The model when the snapshot was taken.
    pub model: Model,
    /// `Snapshot::taken_at`.
    pub taken_at: i64,
    /// `Snapshot::session`.
    pub session: Option<&'static str>,
    /// The step the snapshot was taken at (for a handle of a pin, the pin's).
    pub step: usize,
}

impl View {
    /// What the snapshot's `get` answers.
    #[must_use]
    pub fn get(&self, query: &QuerySpec) -> Vec<ContextItem> {
        self.model.get(query, self.session, self.taken_at)
    }

    /// What the snapshot's `resolve` answers.
    #[must_use]
    pub fn resolve(&self, refs: &[Ref]) -> Vec<Resolution> {
        self.model.resolve(refs, self.session, self.taken_at)
    }

    /// What the snapshot's `digest` answers.
    #[must_use]
    pub fn digest(&self) -> String {
        self.model.digest(self.session, self.taken_at)
    }

    /// What the snapshot answers to `query` and `refs` (see [`snapshot_answers`]).
    #[must_use]
    pub fn answers(&self, query: &QuerySpec, refs: &[Ref]) -> Answers {
        (self.taken_at, self.get(query), self.resolve(refs), self.digest())
    }
}

/// A snapshot's `taken_at`, and what its `get` of a query, `resolve` of refs and `digest` answer.
pub type Answers = (i64, Vec<ContextItem>, Vec<Resolution>, String);

/// What `snapshot` answers to `query` and `refs`, to compare with [`View::answers`].
///
/// # Errors
/// The store's, from any of the three reads.
pub fn snapshot_answers(snapshot: &crate::Snapshot, query: &QuerySpec, refs: &[Ref]) -> crate::Result<Answers> {
    let texts: Vec<String> = refs.iter().map(ref_text).collect();
    Ok((
        snapshot.taken_at(),
        snapshot.get(&query.query())?,
        snapshot.resolve(&texts)?,
        snapshot.digest()?,
    ))
}

/// A pinned snapshot: what it shows, and its sequence number (what `snapshots()` lists).
#[derive(Clone, Debug, PartialEq)]
pub struct PinModel {
    /// `SnapshotInfo::seq`: the store's seq when it was pinned.
    pub seq: u64,
    /// What it shows.
    pub view: View,
}

/// A pin as `snapshots()` lists it: name, seq, `taken_at`, session.
pub type PinListing = (String, u64, i64, Option<String>);

/// `pin_snapshot` of a name already pinned (refused with `Invalid`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AlreadyPinned;

/// What survives a reopen: the items, the pins and the change feed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    /// The items.
    pub model: Model,
    /// The pins, by name.
    pub pins: BTreeMap<&'static str, PinModel>,
    /// Every change committed, in order: what `Store::changes(0)` lists while compaction has
    /// removed none of them.
    pub feed: Vec<Change>,
}

impl State {
    /// Records the changes of an accepted add of `items`, answered `expects`, committed by the
    /// batch `seq` at `committed_at`: one `Added` per item added, in the batch's order.
    pub fn record_add(&mut self, items: &[ContextItem], expects: &[AddExpect], seq: u64, committed_at: i64) {
        for (item, expect) in items.iter().zip(expects) {
            if let AddExpect::Added(..) = expect {
                self.feed.push(Change::Added {
                    seq,
                    committed_at,
                    id: item.id.clone(),
                    version: item.version.clone(),
                    hash: hex_sha256(canonical_json(&item.content)),
                    kind: item.kind.clone(),
                    scope: item.scope.clone(),
                    timestamp: item.timestamp,
                });
            }
        }
    }

    /// Records the delete of `id`, whose latest version was in `scope`, committed by the batch
    /// `seq` at `committed_at`.
    pub fn record_delete(&mut self, id: &str, scope: Scope, seq: u64, committed_at: i64) {
        self.feed.push(Change::Deleted {
            seq,
            committed_at,
            id: id.to_owned(),
            scope,
        });
    }

    /// The changes committed after `after`, as `Store::changes(after)` lists them.
    #[must_use]
    pub fn feed_after(&self, after: u64) -> Vec<Change> {
        self.feed
            .iter()
            .filter(|change| change.seq() > Some(after))
            .cloned()
            .collect()
    }

    /// Pins a snapshot of now (the store's seq `seq`, the clock `now`, through a session view if
    /// `session`) under `name` at `step`, unless the name is pinned already.
    pub fn pin(
        &mut self,
        name: &'static str,
        seq: u64,
        now: i64,
        session: Option<&'static str>,
        step: usize,
    ) -> Result<(), AlreadyPinned> {
        if self.pins.contains_key(name) {
            return Err(AlreadyPinned);
        }
        let view = View {
            model: self.model.clone(),
            taken_at: now,
            session,
            step,
        };
        self.pins.insert(name, PinModel { seq, view });
        Ok(())
    }

    /// Ends the pin `name`: whether it existed.
    pub fn unpin(&mut self, name: &str) -> bool {
        self.pins.remove(name).is_some()
    }

    /// What `snapshots()` lists.
    #[must_use]
    pub fn pin_list(&self) -> Vec<PinListing> {
        self.pins
            .iter()
            .map(|(name, pin)| {
                (
                    (*name).to_owned(),
                    pin.seq,
                    pin.view.taken_at,
                    pin.view.session.map(str::to_owned),
                )
            })
            .collect()
    }

    /// The steps of the views compaction must keep: the live handles `live` and the pins.
    pub fn views<'a>(&self, live: impl IntoIterator<Item = &'a View>) -> Vec<usize> {
        live.into_iter()
            .map(|view| view.step)
            .chain(self.pins.values().map(|pin| pin.view.step))
            .collect()
    }

    /// What a store in this state shows at time `now` (see [`observe`]).
    #[must_use]
    pub fn observation(&self, now: i64) -> Observation {
        let everything = QuerySpec::everything();
        let refs = all_refs();
        Observation {
            items: self.model.get(&everything, None, now),
            resolved: self.model.resolve(&refs, None, now),
            live_ids: self.model.live_ids(),
            pins: self.pin_list(),
            pinned: self
                .pins
                .values()
                .map(|pin| Pinned {
                    seq: pin.seq,
                    taken_at: pin.view.taken_at,
                    session: pin.view.session.map(str::to_owned),
                    items: pin.view.get(&everything),
                    resolved: pin.view.resolve(&refs),
                    digest: pin.view.digest(),
                })
                .collect(),
        }
    }

    /// A short account of the state, for failure messages: each id's versions (with
    /// `t<timestamp>+<ttl>` for those that expire, and retired ones marked), and each pin's seq and
    /// number of ids.
    #[must_use]
    pub fn summary(&self) -> String {
        let items: Vec<String> = self
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
                        match v.record {
                            Record::Stored => {}
                            Record::Retired => text.push_str("(retired)"),
                            Record::MaybeRetired => text.push_str("(retired?)"),
                        }
                        text
                    })
                    .collect();
                format!("{id}:{}", versions.join(","))
            })
            .collect();
        let pins: Vec<String> = self
            .pins
            .iter()
            .map(|(name, pin)| format!("{name}@{}:{}", pin.seq, pin.view.model.ids.len()))
            .collect();
        format!("items [{}] pins [{}]", items.join(" "), pins.join(" "))
    }
}
