//! The hub of live subscriptions: the writer hands it the changes of every group it published (only
//! while someone subscribes), and its dispatcher thread filters them into each subscriber's bounded
//! queue, once they are durable. A writer never waits for a subscriber: its hand-over is a send on
//! an unbounded channel, and a subscriber whose queue is full is cut off (lagged), not waited for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::change::Change;
use super::filter::ChangeFilter;

/// `Options::subscription_buffer`'s default.
pub(crate) const SUBSCRIPTION_BUFFER_DEFAULT: usize = 10_000;

/// One change of a published batch, with the type of its item where the change does not say it
/// (`None`: not known, as for a deletion).
#[derive(Debug, Clone)]
pub(crate) struct LiveChange {
    pub(crate) change: Change,
    pub(crate) kind: Option<String>,
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
}

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
        self.filter
            .matches(&live.change, live.kind.as_deref(), self.session.as_deref())
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
    /// index's read lock, so that no batch above `subscriber.live_after` is published meanwhile.
    /// `None` once the store is closing.
    pub(crate) fn register(self: &Arc<Self>, subscriber: Arc<Subscriber>) -> std::io::Result<Option<()>> {
        let mut state = self.state();
        if state.closed {
            return Ok(None);
        }
        if self.events.get().is_none() {
            let (events, inbox) = crossbeam_channel::unbounded();
            let hub = Arc::clone(self);
            let thread = std::thread::Builder::new()
                .name("ctxlog-subscriptions".into())
                .spawn(move || hub.dispatch(&inbox))?;
            let _ = self.events.set(events);
            state.dispatcher = Some(thread);
        }
        state.subscribers.push(subscriber);
        self.count.fetch_add(1, Ordering::AcqRel);
        Ok(Some(()))
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
    /// holds batches), until the hub closes.
    fn dispatch(&self, inbox: &Receiver<Event>) {
        let mut pending: VecDeque<LiveBatch> = VecDeque::new();
        for event in inbox {
            match event {
                Event::Published(batches) => pending.extend(batches),
                Event::Synced => {}
                // The writer has stopped, after its last sync.
                Event::Close => {
                    self.deliver_durable(&mut pending);
                    return;
                }
            }
            self.deliver_durable(&mut pending);
        }
    }

    fn deliver_durable(&self, pending: &mut VecDeque<LiveBatch>) {
        let durable = if self.holds() { self.durable() } else { u64::MAX };
        let ready = pending.iter().take_while(|batch| batch.seq <= durable).count();
        if ready > 0 {
            let batches: Vec<LiveBatch> = pending.drain(..ready).collect();
            self.deliver(&batches);
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
