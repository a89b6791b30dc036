//! The facade's read views: the public [`Snapshot`] (a view fixed at a sequence number and a clock
//! time, or the store's current state), registered with the engine's shared state as a live view
//! so that compaction keeps what it sees; pins ([`SnapshotInfo`]); and, in [`receipts`], receipts,
//! replay and digests. Its reads lock the index and hand it to the read layer (`crate::read`).

use std::sync::Arc;

use serde::Serialize;

use crate::engine::commands::Op;
use crate::engine::shared::Shared;
use crate::error::{Error, Result};
use crate::index::Index;
use crate::item::{validate_name, ContextItem};
use crate::read::answer;
use crate::read::query::{ContextQuery, QueryStats};
use crate::read::record::Finish;
use crate::read::resolve::{self, parse_references, Answer};
use crate::read::runs::Reader;
use crate::read::view::View;
use crate::read::walk::{self, run_query};

mod export;
pub(crate) mod receipts;

pub use export::{Export, ExportOf, RawExport};

pub(crate) use receipts::replay;
pub use receipts::{Receipt, ReceiptAnswer};

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

    /// A view of the past at `seq`, judging TTL at `taken_at`, registered so that compaction keeps
    /// what it sees, if the floor admits it: checked under the registry's lock, which compaction
    /// holds while it raises the floor and installs a rewrite, so that no rewrite reclaims what
    /// the view shows between the check and the registration.
    pub(crate) fn of_past(shared: &Arc<Shared>, seq: u64, taken_at: i64) -> Result<Snapshot> {
        let mut live = shared.live_snapshots();
        let floor = shared.floor();
        if !floor.admits(seq, taken_at) {
            return Err(Error::HistoryCompacted {
                oldest_available: floor.seq,
            });
        }
        *live.entry(seq).or_insert(0) += 1;
        drop(live);
        let registration = Some(Arc::new(Registration {
            shared: Arc::clone(shared),
            seq,
        }));
        Ok(Snapshot {
            shared: Arc::clone(shared),
            seq,
            taken_at,
            session: None,
            current: false,
            _registration: registration,
        })
    }

    /// The view this snapshot reads at, given the locked index: for the current state, the index's
    /// sequence number and the clock's time now.
    pub(crate) fn view(&self, index: &Index) -> View<'_> {
        let (seq, now) = if self.current {
            (index.seq, self.shared.clock.now())
        } else {
            (self.seq, self.taken_at)
        };
        View::new(seq, now, self.session.as_deref())
    }

    /// The threads this snapshot's reads may use.
    fn reader(&self) -> Reader<'_> {
        Reader {
            workers: &self.shared.workers,
            threads: self.shared.read_threads,
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
        self.run_query(query, &walk::finish_item(query))
    }

    /// The items [`Snapshot::get`] returns, in the same order, as their JSON
    /// ([`RawItem`](crate::RawItem)), read without parsing their content (a query with `content_eq`
    /// parses it to compare, and still returns the stored bytes).
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    pub fn get_raw(&self, query: &ContextQuery) -> Result<Vec<answer::RawItem>> {
        let (items, _) = self.run_query(query, &walk::finish_raw(query))?;
        Ok(items)
    }

    /// Runs `query` at this view under the index lock ([`run_query`]), counting it in the store's
    /// stats once the walk is done.
    fn run_query<T: Send>(&self, query: &ContextQuery, finish: &Finish<'_, Option<T>>) -> Result<(Vec<T>, QueryStats)> {
        let index = self.shared.read_index_for_caller();
        let view = self.view(&index);
        run_query(&self.reader(), index, &view, query, finish, |examined| {
            self.shared.count_query(examined);
        })
    }

    /// Resolves each reference (`id` or `id@version`), one [`Resolution`](crate::Resolution) per
    /// reference, in order.
    ///
    /// # Errors
    /// `Invalid` (with the reference's position as `index`) for a reference that is not a valid id,
    /// optionally followed by `@` and a valid version; `Io` if reading fails.
    pub fn resolve<I, R>(&self, refs: I) -> Result<Vec<answer::Resolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.resolve_each(refs, &resolve::finish_item, Answer::into_resolution)
    }

    /// Resolves each reference as [`Snapshot::resolve`] does, with the same answer for each, but
    /// returns items as their JSON ([`RawItem`](crate::RawItem)), read without parsing their content.
    ///
    /// # Errors
    /// As [`Snapshot::resolve`].
    pub fn resolve_raw<I, R>(&self, refs: I) -> Result<Vec<answer::RawResolution>>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        self.resolve_each(refs, &resolve::finish_raw, Answer::into_raw_resolution)
    }

    /// Parses every reference, then answers them all under one hold of the index lock
    /// ([`resolve::resolve`]), reading the items with `read` and turning each answer into the
    /// caller's form with `answer`.
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
        let parsed = parse_references(&refs)?;
        let index = self.shared.read_index_for_caller();
        let view = self.view(&index);
        resolve::resolve(&self.reader(), index, &view, &refs, parsed, read, answer)
    }
}

/// Every pinned snapshot, with the bytes of records it keeps that the current state does not need.
pub(crate) fn pinned(shared: &Shared) -> Vec<SnapshotInfo> {
    let index = shared.read_index();
    let current = View::new(index.seq, shared.clock.now(), None);
    index
        .pins
        .iter()
        .map(|(name, pin)| {
            let bytes_kept = index
                .slots
                .iter()
                .filter(|v| v.is_stored() && index.visible_at(v, pin.seq))
                .filter(|v| !current.sees_live(&index, v))
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
