//! The hub of live subscriptions: the writer hands it the changes of every group it published (only
//! while someone subscribes), and its dispatcher thread filters them into each subscriber's bounded
//! queue, once they are durable. A writer never waits for a subscriber: its hand-over is a send on
//! an unbounded channel, and a subscriber whose queue is full is cut off (lagged), not waited for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Weak;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::change::{Change, LiveChange};
use super::expiry::Expiries;
use super::feed::{each_change_view, frame_len_and_seq};
use super::filter::ChangeFilter;
use crate::engine::shared::Shared;
use crate::index::FastMap;
use crate::log::record::{split_batch, FRAME_HEADER_BYTES};

/// `Options::subscription_buffer`'s default.
pub(crate) const SUBSCRIPTION_BUFFER_DEFAULT: usize = 10_000;

/// A published batch's frame as the writer wrote it (a format 3 frame: header, then its records,
/// its sync mark first).
#[derive(Debug)]
pub(crate) struct WrittenFrame {
    pub(crate) seq: u64,
    pub(crate) bytes: Vec<u8>,
}

/// What the dispatcher thread is told.
enum Event {
    /// Batches published, in sequence order.
    Published(Vec<WrittenFrame>),
    /// The durable sequence number moved.
    Synced,
    /// The store is closing: deliver what is durable and stop.
    Close,
    /// The expiries to watch, built by a first subscriber from the index as of its start (every
    /// batch after it comes published).
    Watch(Expiries),
    /// Announce the expiries due by the clock now, and reply how many there were.
    ExpireDue(Sender<usize>),
}

/// How often the dispatcher looks at the clock while expiries wait: the clock counts whole
/// seconds, so an expiry is announced within this much of the second it names.
const EXPIRY_POLL: Duration = Duration::from_millis(200);

/// A subscriber's queue of live changes, filled by the dispatcher and emptied by its
/// subscription.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    pub(crate) changes: VecDeque<Arc<Change>>,
    /// Set when a batch did not fit: nothing more is queued.
    pub(crate) lagged: bool,
    /// Set when the store closed.
    pub(crate) closed: bool,
}

/// One subscriber as the hub keeps it.
#[derive(Debug)]
pub(crate) struct Subscriber {
    pub(crate) filter: ChangeFilter,
    /// The session the subscriber reads as (`None`: the store itself).
    pub(crate) session: Option<Arc<str>>,
    /// It receives live the batches above this sequence number (those up to it it reads from
    /// the log).
    pub(crate) live_after: u64,
    pub(crate) queue: Mutex<Queue>,
    pub(crate) ready: Condvar,
    /// Threads of the subscription waiting on `ready` (changed with `queue` locked): the
    /// dispatcher wakes them only when there are any (a wake-up is a system call, and a
    /// subscriber that polls, or is busy, needs none), and serves them first.
    pub(crate) waiting: AtomicU32,
}

impl Subscriber {
    /// A subscriber of `filter`, reading as `session`, receiving live the batches after `live_after`.
    pub(crate) fn new(filter: ChangeFilter, session: Option<Arc<str>>, live_after: u64) -> Subscriber {
        Subscriber {
            filter,
            session,
            live_after,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            waiting: AtomicU32::new(0),
        }
    }

    pub(crate) fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn matches(&self, live: &LiveChange) -> bool {
        self.filter.matches(
            &live.change,
            live.kind.as_deref(),
            live.scope.as_ref(),
            self.session.as_deref(),
        )
    }
}

#[derive(Default)]
struct HubState {
    subscribers: Vec<Arc<Subscriber>>,
    /// Which subscribers each change may concern, rebuilt as subscribers come and go.
    routes: Routes,
    dispatcher: Option<JoinHandle<()>>,
    closed: bool,
}

/// The subscribers (positions in [`HubState::subscribers`]) a change may concern, so that a
/// delivery looks only at those instead of every filter: a filter with ids is found by id, one
/// with types (and no ids) by type, and one with neither is looked at for every change. The
/// filter itself then decides (its scopes, the subscriber's session).
#[derive(Debug, Default)]
struct Routes {
    by_id: FastMap<String, Vec<usize>>,
    by_type: FastMap<String, Vec<usize>>,
    /// Every subscriber with types and no ids: for a change whose type is not known.
    typed: Vec<usize>,
    general: Vec<usize>,
}

impl Routes {
    fn of(subscribers: &[Arc<Subscriber>]) -> Routes {
        let mut routes = Routes::default();
        for (at, subscriber) in subscribers.iter().enumerate() {
            routes.add(at, subscriber);
        }
        routes
    }

    /// Routes to the subscriber at position `at`.
    fn add(&mut self, at: usize, subscriber: &Subscriber) {
        let filter = &subscriber.filter;
        if !filter.ids.is_empty() {
            for id in &filter.ids {
                self.by_id.entry(id.clone()).or_default().push(at);
            }
        } else if !filter.types.is_empty() {
            for kind in &filter.types {
                self.by_type.entry(kind.clone()).or_default().push(at);
            }
            self.typed.push(at);
        } else {
            self.general.push(at);
        }
    }

    /// Calls `each` with every subscriber a change of `id` (if it has one) and `kind` (if known)
    /// may concern, each once.
    fn each_candidate(&self, id: Option<&str>, kind: Option<&str>, mut each: impl FnMut(usize)) {
        if let Some(id) = id {
            self.by_id.get(id).into_iter().flatten().copied().for_each(&mut each);
        }
        match kind {
            Some(kind) => self
                .by_type
                .get(kind)
                .into_iter()
                .flatten()
                .copied()
                .for_each(&mut each),
            // A change of an unknown type passes every type filter.
            None => self.typed.iter().copied().for_each(&mut each),
        }
        self.general.iter().copied().for_each(each);
    }
}

/// The live subscriptions of a store.
pub(crate) struct Hub {
    /// Subscribers registered: the writer hands over nothing while there are none.
    count: AtomicUsize,
    /// The last sequence number known durable (set after each sync that succeeded).
    durable: AtomicU64,
    /// Whether a batch waits for its sync before it is delivered (`Durability::Periodic`).
    hold: AtomicBool,
    /// Live changes a subscriber may have queued and not received.
    buffer: AtomicUsize,
    /// The dispatcher's inbox, once it started (by the first subscription).
    events: OnceLock<Sender<Event>>,
    state: Mutex<HubState>,
}

impl Hub {
    /// The hub of a store whose last sequence number (durable) is `last`.
    pub(crate) fn new(last: u64) -> Hub {
        Hub {
            count: AtomicUsize::new(0),
            durable: AtomicU64::new(last),
            hold: AtomicBool::new(false),
            buffer: AtomicUsize::new(SUBSCRIPTION_BUFFER_DEFAULT),
            events: OnceLock::new(),
            state: Mutex::new(HubState::default()),
        }
    }

    /// Sets whether batches wait for their sync (`hold`) and the subscribers' buffer.
    pub(crate) fn configure(&self, hold: bool, buffer: usize) {
        self.hold.store(hold, Ordering::Relaxed);
        self.buffer.store(buffer.max(1), Ordering::Relaxed);
    }

    fn state(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether anyone subscribes: the writer builds and hands over changes only then.
    #[inline]
    pub(crate) fn has_subscribers(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// Whether a change must be durable before it is delivered.
    pub(crate) fn holds(&self) -> bool {
        self.hold.load(Ordering::Relaxed)
    }

    /// The last sequence number known durable.
    pub(crate) fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Everything up to `seq` is durable now.
    pub(crate) fn set_durable(&self, seq: u64) {
        let before = self.durable.fetch_max(seq, Ordering::AcqRel);
        if before < seq && self.holds() && self.has_subscribers() {
            self.send(Event::Synced);
        }
    }

    /// Hands published batches (in sequence order) to the dispatcher.
    pub(crate) fn publish(&self, batches: Vec<WrittenFrame>) {
        if !batches.is_empty() {
            self.send(Event::Published(batches));
        }
    }

    fn send(&self, event: Event) {
        if let Some(events) = self.events.get() {
            // The dispatcher ends only when the hub closes: a failed send is a closing store.
            let _ = events.send(event);
        }
    }

    /// Registers a subscriber, starting the dispatcher with the first one. The caller holds the
    /// index's read lock, so that no batch above `subscriber.live_after` is published meanwhile;
    /// `watch` builds, from that index, the expiries to watch, which a first subscriber (of the
    /// store, or since the last one left) hands to the dispatcher. `None` once the store is
    /// closing.
    pub(crate) fn register(
        self: &Arc<Self>,
        subscriber: Arc<Subscriber>,
        shared: Weak<Shared>,
        watch: impl FnOnce() -> Expiries,
    ) -> std::io::Result<Option<()>> {
        let mut state = self.state();
        if state.closed {
            return Ok(None);
        }
        if self.events.get().is_none() {
            let (events, inbox) = crossbeam_channel::unbounded();
            let hub = Arc::clone(self);
            let thread = std::thread::Builder::new()
                .name("ctxlog-subscriptions".into())
                .spawn(move || hub.dispatch(&inbox, &shared))?;
            let _ = self.events.set(events);
            state.dispatcher = Some(thread);
        }
        let first = state.subscribers.is_empty();
        let at = state.subscribers.len();
        state.routes.add(at, &subscriber);
        state.subscribers.push(subscriber);
        self.count.fetch_add(1, Ordering::AcqRel);
        if first {
            // Counted first: the dispatcher drops what it watches whenever it finds nobody
            // subscribed, and must not find that after taking this.
            self.send(Event::Watch(watch()));
        }
        Ok(Some(()))
    }

    /// Announces the expiries due by the clock now to the live subscriptions (after the batches
    /// handed over before), and returns how many there were: 0 while nobody subscribes, as no
    /// expiry is watched then.
    pub(crate) fn expire_due(&self) -> usize {
        if !self.has_subscribers() {
            return 0;
        }
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.send(Event::ExpireDue(reply));
        answer.recv().unwrap_or(0)
    }

    /// Removes a subscriber (its subscription was dropped, or it lagged).
    pub(crate) fn unregister(&self, subscriber: &Arc<Subscriber>) {
        let mut state = self.state();
        remove(&mut state, &self.count, subscriber);
    }

    /// The store is closing (its writer has stopped): the dispatcher delivers what is durable and
    /// stops, and every subscriber is told.
    pub(crate) fn close(&self) {
        let dispatcher = {
            let mut state = self.state();
            state.closed = true;
            state.dispatcher.take()
        };
        if dispatcher.is_some() {
            self.send(Event::Close);
        }
        if let Some(thread) = dispatcher {
            if thread.join().is_err() {
                tracing::error!("the subscriptions' dispatcher thread panicked");
            }
        }
        let mut state = self.state();
        for subscriber in state.subscribers.drain(..) {
            subscriber.queue().closed = true;
            subscriber.ready.notify_all();
        }
        self.count.store(0, Ordering::Release);
    }

    /// The dispatcher thread: delivers each batch once it is durable (at once unless the hub
    /// holds batches), and each expiry once the clock reaches it, until the hub closes.
    fn dispatch(&self, inbox: &Receiver<Event>, shared: &Weak<Shared>) {
        let mut pending: VecDeque<WrittenFrame> = VecDeque::new();
        let mut expiries: Option<Expiries> = None;
        loop {
            let watching = expiries.as_ref().is_some_and(|expiries| expiries.len() > 0);
            let event = if watching {
                match inbox.recv_timeout(EXPIRY_POLL) {
                    Ok(event) => Some(event),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match inbox.recv() {
                    Ok(event) => Some(event),
                    Err(_) => return,
                }
            };
            let mut reply = None;
            match event {
                Some(Event::Published(batches)) => pending.extend(batches),
                Some(Event::Synced) | None => {}
                // The writer has stopped, after its last sync.
                Some(Event::Close) => {
                    self.deliver_durable(&mut pending, expiries.as_mut());
                    return;
                }
                Some(Event::Watch(watched)) => expiries = Some(watched),
                Some(Event::ExpireDue(answer)) => reply = Some(answer),
            }
            self.deliver_durable(&mut pending, expiries.as_mut());
            if !self.has_subscribers() {
                // Nobody to tell: the next first subscriber builds them again.
                expiries = None;
            }
            let found = match (expiries.as_mut(), shared.upgrade()) {
                (Some(expiries), Some(shared)) => self.announce_expiries(expiries, &shared),
                _ => 0,
            };
            if let Some(answer) = reply {
                let _ = answer.send(found);
            }
        }
    }

    /// Announces the expiries due by the store's clock; returns how many.
    fn announce_expiries(&self, expiries: &mut Expiries, shared: &Shared) -> usize {
        let now = shared.clock.now();
        if expiries.next().is_none_or(|at| at > now) {
            return 0;
        }
        let expired = expiries.take_due(&shared.read_index(), now);
        let found = expired.len();
        if found > 0 {
            // No sequence number: every live subscriber is past it.
            self.deliver(&expired);
        }
        found
    }

    /// Delivers the pending batches that are durable, and watches the expiries they add.
    fn deliver_durable(&self, pending: &mut VecDeque<WrittenFrame>, expiries: Option<&mut Expiries>) {
        let durable = if self.holds() { self.durable() } else { u64::MAX };
        let ready = pending.iter().take_while(|batch| batch.seq <= durable).count();
        if ready > 0 {
            let frames: Vec<WrittenFrame> = pending.drain(..ready).collect();
            self.deliver_frames(&frames, expiries);
        }
    }

    /// Delivers the changes of `frames` (see [`Hub::queue`]), reading each record in place: a
    /// change is built only once a subscriber it may concern is found ([`Routes`]), so that a
    /// batch nobody wants costs no allocation per change.
    fn deliver_frames(&self, frames: &[WrittenFrame], mut expiries: Option<&mut Expiries>) {
        let mut state = self.state();
        let mut matched = Matched::default();
        for (at, frame) in frames.iter().enumerate() {
            // Bytes the writer encoded a moment ago, never read back from a disk: no CRC to check.
            let (len, _) = frame_len_and_seq(&frame.bytes);
            let payload = frame
                .bytes
                .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + crate::num::usize_from_u32(len))
                .unwrap_or_default();
            let records = match split_batch(payload) {
                Ok(records) => records,
                Err(reason) => {
                    // The writer encoded it a moment ago: a bug, not damage on a disk.
                    tracing::error!(
                        "batch {} cannot be decoded for its subscribers: {}",
                        frame.seq,
                        reason.0
                    );
                    continue;
                }
            };
            // Decoded one record at a time, as the changes are handed out: a batch of thousands is
            // never copied into a second array of decoded records.
            let decoded_each = records.iter().map_while(|record| match record.decode_encoded() {
                Ok(view) => Some(view),
                Err(reason) => {
                    tracing::error!(
                        "batch {} cannot be decoded for its subscribers: {}",
                        frame.seq,
                        reason.0
                    );
                    None
                }
            });
            let state = &*state;
            let decoded = each_change_view(frame.seq, decoded_each, |view| {
                if let (Some(expiries), Some(expires_at)) = (expiries.as_deref_mut(), view.expires_at()) {
                    expiries.note(expires_at, view.id());
                }
                let mut built: Option<LiveChange> = None;
                state.routes.each_candidate(Some(view.id()), view.kind(), |position| {
                    let Some(subscriber) = state.subscribers.get(position) else {
                        return;
                    };
                    if frame.seq <= subscriber.live_after {
                        return;
                    }
                    let live = built.get_or_insert_with(|| LiveChange {
                        change: Arc::new(view.to_change(frame.seq)),
                        kind: view.deleted_kind().map(str::to_owned),
                        scope: None,
                    });
                    if subscriber.matches(live) {
                        add_match(&mut matched, position, at, &live.change);
                    }
                });
            });
            if let Err(reason) = decoded {
                tracing::error!("batch {} cannot be decoded for its subscribers: {reason}", frame.seq);
            }
        }
        self.queue(&mut state, matched);
    }

    /// Delivers changes that no batch committed (expiries) to every subscriber they concern.
    fn deliver(&self, changes: &[LiveChange]) {
        let mut state = self.state();
        let mut matched = Matched::default();
        for live in changes {
            let kind = match &*live.change {
                Change::Added { kind, .. } => Some(kind.as_str()),
                _ => live.kind.as_deref(),
            };
            state.routes.each_candidate(live.change.id(), kind, |position| {
                if state
                    .subscribers
                    .get(position)
                    .is_some_and(|subscriber| subscriber.matches(live))
                {
                    add_match(&mut matched, position, 0, &live.change);
                }
            });
        }
        self.queue(&mut state, matched);
    }

    /// Queues each subscriber's matching changes, batch by batch, all of a batch or none: a
    /// subscriber they would take past its buffer is lagged (nothing more is queued to it) and
    /// leaves the hub. Each queue is locked once.
    fn queue(&self, state: &mut HubState, mut matched: Matched) {
        let buffer = self.buffer.load(Ordering::Relaxed);
        let mut lagged = Vec::new();
        // Grouped by subscriber (a stable sort keeps each one's changes in order), those blocked
        // in `recv` first: they wait for it; one that polls finds its changes when it next looks.
        let polls = |position: usize| {
            state
                .subscribers
                .get(position)
                .is_none_or(|subscriber| subscriber.waiting.load(Ordering::Relaxed) == 0)
        };
        matched.sort_by_key(|(position, _, _)| (polls(*position), *position));
        for mine in matched.chunk_by(|a, b| a.0 == b.0) {
            let Some(subscriber) = mine
                .first()
                .and_then(|(position, _, _)| state.subscribers.get(*position))
            else {
                continue;
            };
            let mut queue = subscriber.queue();
            if queue.lagged {
                continue;
            }
            for batch in mine.chunk_by(|a, b| a.1 == b.1) {
                if queue.changes.len() + batch.len() > buffer {
                    queue.lagged = true;
                    lagged.push(Arc::clone(subscriber));
                    break;
                }
                queue
                    .changes
                    .extend(batch.iter().map(|(_, _, change)| Arc::clone(change)));
            }
            let wake = subscriber.waiting.load(Ordering::Relaxed) > 0;
            drop(queue);
            if wake {
                subscriber.ready.notify_all();
            }
        }
        for subscriber in &lagged {
            remove(state, &self.count, subscriber);
        }
    }
}

/// What a delivery matched, in the order found: (subscriber position, batch index, change).
type Matched = Vec<(usize, usize, Arc<Change>)>;

/// Adds `change` of batch `batch` to what `position` is to receive.
fn add_match(matched: &mut Matched, position: usize, batch: usize, change: &Arc<Change>) {
    matched.push((position, batch, Arc::clone(change)));
}

fn remove(state: &mut HubState, count: &AtomicUsize, subscriber: &Arc<Subscriber>) {
    if let Some(at) = state.subscribers.iter().position(|s| Arc::ptr_eq(s, subscriber)) {
        state.subscribers.swap_remove(at);
        state.routes = Routes::of(&state.subscribers);
        count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::Scope;

    fn subscriber(filter: ChangeFilter) -> Arc<Subscriber> {
        Arc::new(Subscriber::new(filter, None, 0))
    }

    fn live(id: &str, kind: Option<&str>, added: bool) -> LiveChange {
        let change = if added {
            Change::Added {
                seq: 1,
                committed_at: 0,
                id: id.into(),
                version: "1".into(),
                hash: String::new(),
                kind: kind.unwrap_or("none").into(),
                scope: Scope::GlobalWritable,
                timestamp: 0,
            }
        } else {
            Change::Deleted {
                seq: 1,
                committed_at: 0,
                id: id.into(),
                scope: Scope::GlobalWritable,
            }
        };
        LiveChange {
            change: Arc::new(change),
            kind: if added { None } else { kind.map(str::to_owned) },
            scope: None,
        }
    }

    /// Every subscriber whose filter passes a change is among its candidates, once; the others
    /// are left out unless their filter sets neither ids nor types.
    #[test]
    fn routes_find_every_subscriber_a_change_concerns_once() {
        let subscribers = vec![
            subscriber(ChangeFilter::new().ids(["a", "b"])),
            subscriber(ChangeFilter::new().types(["t1", "t2"])),
            subscriber(ChangeFilter::new()),
            subscriber(ChangeFilter::new().ids(["c"]).types(["t1"])),
            subscriber(ChangeFilter::new().types(["t3"])),
            subscriber(ChangeFilter::new().scopes([Scope::GlobalReadonly])),
        ];
        let routes = Routes::of(&subscribers);
        let cases = [
            live("a", Some("t1"), true),
            live("b", Some("t3"), true),
            live("c", Some("t2"), true),
            live("z", Some("t9"), true),
            live("a", None, false),
            live("c", Some("t1"), false),
        ];
        for change in &cases {
            let mut found = Vec::new();
            let kind = match &*change.change {
                Change::Added { kind, .. } => Some(kind.as_str()),
                _ => change.kind.as_deref(),
            };
            routes.each_candidate(change.change.id(), kind, |at| found.push(at));
            let mut unique = found.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), found.len(), "{change:?}: a subscriber twice");
            for (at, subscriber) in subscribers.iter().enumerate() {
                if subscriber.matches(change) {
                    assert!(found.contains(&at), "{change:?}: subscriber {at} missed");
                }
            }
            assert!(found.contains(&2) && found.contains(&5), "{change:?}: the general ones");
        }
    }
}
