//! The hub of live subscriptions: the writer hands it the changes of every group it published (only
//! while someone subscribes), and its dispatcher thread filters them into each subscriber's bounded
//! queue, once they are durable. A writer never waits for a subscriber: its hand-over is a send on
//! an unbounded channel, and a subscriber whose queue is full is cut off (lagged), not waited for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Weak;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::change::Change;
use super::expiry::Expiries;
use super::filter::ChangeFilter;
use crate::engine::shared::Shared;
use crate::item::Scope;

/// `Options::subscription_buffer`'s default.
pub(crate) const SUBSCRIPTION_BUFFER_DEFAULT: usize = 10_000;

/// One change of a published batch (or an expiry), with what a filter needs that the change does
/// not say.
#[derive(Debug, Clone)]
pub(crate) struct LiveChange {
    pub(crate) change: Change,
    /// The type of its item where the change does not carry it (`None`: not known).
    pub(crate) kind: Option<String>,
    /// The scope of an expired item (the other changes carry theirs).
    pub(crate) scope: Option<Scope>,
    /// When an added version expires (`None`: never, or not an add).
    pub(crate) expires_at: Option<i64>,
}

/// The changes of one published batch, in its order.
#[derive(Debug, Clone)]
pub(crate) struct LiveBatch {
    pub(crate) seq: u64,
    pub(crate) changes: Vec<LiveChange>,
}

/// What the dispatcher thread is told.
enum Event {
    /// Batches published, in sequence order.
    Published(Vec<LiveBatch>),
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
    pub(crate) changes: VecDeque<Change>,
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
}

impl Subscriber {
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
    dispatcher: Option<JoinHandle<()>>,
    closed: bool,
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
    pub(crate) fn publish(&self, batches: Vec<LiveBatch>) {
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
        if state.subscribers.is_empty() {
            self.send(Event::Watch(watch()));
        }
        state.subscribers.push(subscriber);
        self.count.fetch_add(1, Ordering::AcqRel);
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
        let mut pending: VecDeque<LiveBatch> = VecDeque::new();
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
            self.deliver(&[LiveBatch {
                seq: u64::MAX,
                changes: expired,
            }]);
        }
        found
    }

    /// Delivers the pending batches that are durable, and watches the expiries they add.
    fn deliver_durable(&self, pending: &mut VecDeque<LiveBatch>, expiries: Option<&mut Expiries>) {
        let durable = if self.holds() { self.durable() } else { u64::MAX };
        let ready = pending.iter().take_while(|batch| batch.seq <= durable).count();
        if ready > 0 {
            let batches: Vec<LiveBatch> = pending.drain(..ready).collect();
            self.deliver(&batches);
            if let Some(expiries) = expiries {
                for batch in &batches {
                    expiries.note(batch);
                }
            }
        }
    }

    /// Queues each batch's matching changes to each subscriber, all of a batch or none: a
    /// subscriber they would take past its buffer is lagged (nothing more is queued to it) and
    /// leaves the hub.
    fn deliver(&self, batches: &[LiveBatch]) {
        let buffer = self.buffer.load(Ordering::Relaxed);
        let mut state = self.state();
        let mut lagged = Vec::new();
        for subscriber in &state.subscribers {
            let mut queue = subscriber.queue();
            let before = queue.changes.len();
            for batch in batches.iter().filter(|batch| batch.seq > subscriber.live_after) {
                let matching = batch.changes.iter().filter(|live| subscriber.matches(live));
                let count = matching.clone().count();
                if count == 0 {
                    continue;
                }
                if queue.changes.len() + count > buffer {
                    queue.lagged = true;
                    lagged.push(Arc::clone(subscriber));
                    break;
                }
                queue.changes.extend(matching.map(|live| live.change.clone()));
            }
            let woke = queue.lagged || queue.changes.len() > before;
            drop(queue);
            if woke {
                subscriber.ready.notify_all();
            }
        }
        for subscriber in &lagged {
            remove(&mut state, &self.count, subscriber);
        }
    }
}

fn remove(state: &mut HubState, count: &AtomicUsize, subscriber: &Arc<Subscriber>) {
    if let Some(at) = state.subscribers.iter().position(|s| Arc::ptr_eq(s, subscriber)) {
        state.subscribers.swap_remove(at);
        count.fetch_sub(1, Ordering::AcqRel);
    }
}
