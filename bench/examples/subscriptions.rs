//! The change feed and live subscriptions under load, each figure beside a baseline measured in the
//! same run (medians of RUNS runs, default 5):
//!
//! 1. write throughput with 1,000 filtered subscribers (3 ids each, drained by 4 threads) against
//!    none: bulk adds (batches of 5,000 W1 items) and 8 threads of single durable adds;
//! 2. delivery latency of single durable adds to a subscriber, alone and among 999 others (matching
//!    nothing, then matching everything), against a crossbeam-channel fan-out of the same change;
//! 3. catch-up: `changes(0)` and a subscription's replay over a loaded store, against SQLite polling
//!    a table of the same rows 1,000 at a time;
//! 4. the index's bytes per item before, during and after 1,000 subscriptions;
//! 5. a stalled subscriber (never receives) beside 8 writer threads: throughput with and without
//!    it, its `Lagged { resume_after }`, and a resume from there that must receive exactly what it
//!    missed.
//!
//! `cargo run --release -p ctxlog-bench --example subscriptions -- [--quick] [--runs R]` (`--quick`:
//! one run, small sizes).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use ctxlog::{Change, ChangeFilter, ContextItem, Error, Store, Subscription};

use ctxlog_bench::w1;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Subscribers in the "many" cases.
const SUBSCRIBERS: u64 = 1000;
/// Ids each filtered subscriber asks for.
const IDS_EACH: u64 = 3;
/// Threads draining the many subscriptions.
const DRAINERS: usize = 4;
/// Writer threads of single durable adds.
const THREADS: u64 = 8;
/// Items per bulk batch (and per loading batch).
const BATCH: u64 = 5000;

struct Sizes {
    runs: usize,
    bulk: u64,
    per_thread: u64,
    latency_adds: u64,
    catch_up: u64,
    stall_per_thread: u64,
}

fn sizes() -> Res<Sizes> {
    let mut args = std::env::args().skip(1);
    let mut sizes = Sizes {
        runs: 5,
        bulk: 200_000,
        per_thread: 2000,
        latency_adds: 2000,
        catch_up: 1_000_000,
        stall_per_thread: 2000,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => {
                sizes = Sizes {
                    runs: 1,
                    bulk: 20_000,
                    per_thread: 400,
                    latency_adds: 300,
                    catch_up: 100_000,
                    // 12,000 changes: past the default buffer of 10,000.
                    stall_per_thread: 1500,
                };
            }
            "--runs" => sizes.runs = args.next().ok_or("--runs needs a number")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if sizes.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    Ok(sizes)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// Item `n`'s number, from its W1 id (`item-{n:08}`).
fn number(id: &str) -> Option<usize> {
    id.strip_prefix("item-")?.parse().ok()
}

fn id(n: u64) -> String {
    format!("item-{n:08}")
}

/// The ids subscriber `k` of [`SUBSCRIBERS`] asks for when `count` items from `first` on are written:
/// [`IDS_EACH`] consecutive ones, each subscriber its own.
fn ids_of(k: u64, first: u64, count: u64) -> Vec<String> {
    let stride = (count / SUBSCRIBERS).max(IDS_EACH);
    (0..IDS_EACH).map(|j| id(first + k * stride + j)).collect()
}

/// [`SUBSCRIBERS`] subscriptions, each to a few ids of the `count` items from `first` on, and how
/// many changes they will receive in all once those items are added.
fn filtered(store: &Store, first: u64, count: u64) -> Res<(Vec<Subscription>, u64)> {
    let mut subs = Vec::new();
    let mut expected = 0;
    for k in 0..SUBSCRIBERS {
        let ids = ids_of(k, first, count);
        expected += ids
            .iter()
            .filter_map(|id| number(id))
            .filter(|n| (first..first + count).contains(&(*n as u64)))
            .count() as u64;
        subs.push(store.subscribe(ChangeFilter::new().ids(ids))?);
    }
    Ok((subs, expected))
}

/// Threads that drain a share of some subscriptions (or channels) each: a pass of `try_recv` over
/// its share, and a 1 ms sleep after a pass that found nothing.
struct Drain {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    threads: Vec<JoinHandle<Result<(), Error>>>,
}

trait Drainable: Send + 'static {
    /// Takes what is ready; the count taken.
    fn take(&mut self) -> Result<u64, Error>;
}

impl Drainable for Subscription {
    fn take(&mut self) -> Result<u64, Error> {
        let mut got = 0;
        while let Some(change) = self.try_recv()? {
            std::hint::black_box(change);
            got += 1;
        }
        Ok(got)
    }
}

impl Drainable for Receiver<Change> {
    fn take(&mut self) -> Result<u64, Error> {
        let mut got = 0;
        while let Ok(change) = self.try_recv() {
            std::hint::black_box(change);
            got += 1;
        }
        Ok(got)
    }
}

impl Drain {
    fn start<T: Drainable>(all: Vec<T>) -> Drain {
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let mut shares: Vec<Vec<T>> = (0..DRAINERS).map(|_| Vec::new()).collect();
        for (i, one) in all.into_iter().enumerate() {
            shares[i % DRAINERS].push(one);
        }
        let threads = shares
            .into_iter()
            .map(|mut share| {
                let (stop, received) = (Arc::clone(&stop), Arc::clone(&received));
                std::thread::spawn(move || -> Result<(), Error> {
                    while !stop.load(Ordering::Relaxed) {
                        let mut got = 0;
                        for one in &mut share {
                            got += one.take()?;
                        }
                        if got == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        } else {
                            received.fetch_add(got, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        Drain {
            stop,
            received,
            threads,
        }
    }

    /// Waits (up to a minute) until `expected` changes were received in all.
    fn wait_for(&self, expected: u64) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.received.load(Ordering::Relaxed) < expected {
            if Instant::now() > deadline {
                return Err(format!(
                    "the drainers received {} changes of {expected} in a minute",
                    self.received.load(Ordering::Relaxed)
                )
                .into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    fn stop(self) -> Res<()> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().map_err(|_| "a draining thread panicked")??;
        }
        Ok(())
    }
}

/// Adds `items` from one thread per list at once (they meet at a barrier after they have their
/// items), each item a single durable add; the wall time of the adds.
fn threads_add(store: &Store, items: &[Vec<ContextItem>]) -> Res<Duration> {
    let start_line = Arc::new(Barrier::new(items.len() + 1));
    let threads: Vec<_> = items
        .iter()
        .map(|mine| {
            let (store, start_line, mine) = (store.clone(), Arc::clone(&start_line), mine.clone());
            std::thread::spawn(move || -> Result<(), Error> {
                start_line.wait();
                for item in mine {
                    store.add([item])?;
                }
                Ok(())
            })
        })
        .collect();
    start_line.wait();
    let started = Instant::now();
    for thread in threads {
        thread.join().map_err(|_| "an adding thread panicked")??;
    }
    Ok(started.elapsed())
}

/// Items `first..first + THREADS * per_thread`, one list per writer thread.
fn thread_items(first: u64, per_thread: u64) -> Vec<Vec<ContextItem>> {
    (0..THREADS)
        .map(|t| {
            let from = first + t * per_thread;
            (from..from + per_thread).map(w1::item).collect()
        })
        .collect()
}

/// What [`Subs::start`] started: the drainers with the changes they will receive, and the
/// subscriptions nobody receives from.
type Started = (Option<(Drain, u64)>, Vec<Subscription>);

/// The subscribers of case 1.
#[derive(Clone, Copy)]
enum Subs {
    None,
    /// The [`filtered`] subscribers, never received from (each gets at most [`IDS_EACH`] changes):
    /// the hub's cost alone.
    Idle,
    /// The [`filtered`] subscribers, drained by [`DRAINERS`] threads.
    Drained,
}

impl Subs {
    const ALL: [Subs; 3] = [Subs::None, Subs::Idle, Subs::Drained];

    /// Subscribes for `count` items from 0 on: the drainers and the changes they will receive, or
    /// the idle subscriptions.
    fn start(self, store: &Store, count: u64) -> Res<Started> {
        Ok(match self {
            Subs::None => (None, Vec::new()),
            Subs::Idle => (None, filtered(store, 0, count)?.0),
            Subs::Drained => {
                let (subs, expected) = filtered(store, 0, count)?;
                (Some((Drain::start(subs), expected)), Vec::new())
            }
        })
    }
}

/// 1a: bulk adds of `items` in batches of [`BATCH`], with or without the filtered subscribers:
/// items/s of the adds, and (with them) items/s until the subscribers received every change
/// they asked for.
fn bulk(items: &[ContextItem], subs: Subs) -> Res<(f64, Option<f64>)> {
    let dir = tempfile::tempdir()?;
    let store = w1::open_durable(dir.path())?;
    let count = items.len() as u64;
    let (drain, _idle) = subs.start(&store, count)?;
    let batches: Vec<Vec<ContextItem>> = items
        .chunks(usize::try_from(BATCH)?)
        .map(<[ContextItem]>::to_vec)
        .collect();
    let started = Instant::now();
    for batch in batches {
        store.add(batch)?;
    }
    let written = started.elapsed().as_secs_f64();
    let delivered = match drain {
        Some((drain, expected)) => {
            drain.wait_for(expected)?;
            let delivered = started.elapsed().as_secs_f64();
            drain.stop()?;
            Some(count as f64 / delivered)
        }
        None => None,
    };
    Ok((count as f64 / written, delivered))
}

/// 1b: single durable adds from [`THREADS`] threads, with or without the filtered subscribers:
/// adds/s, and (with them) adds/s until every change asked for was received.
fn durable_threads(items: &[Vec<ContextItem>], subs: Subs) -> Res<(f64, Option<f64>)> {
    let dir = tempfile::tempdir()?;
    let store = w1::open_durable(dir.path())?;
    let count: u64 = items.iter().map(|list| list.len() as u64).sum();
    let (drain, _idle) = subs.start(&store, count)?;
    let started = Instant::now();
    let written = threads_add(&store, items)?.as_secs_f64();
    let delivered = match drain {
        Some((drain, expected)) => {
            drain.wait_for(expected)?;
            let delivered = started.elapsed().as_secs_f64();
            drain.stop()?;
            Some(count as f64 / delivered)
        }
        None => None,
    };
    Ok((count as f64 / written, delivered))
}

/// Who shares the hub (or the fan-out) with the measured subscriber.
#[derive(Clone, Copy, PartialEq)]
enum Others {
    Alone,
    /// 999 subscribers to ids never written.
    MatchNothing,
    /// 999 subscribers to everything, drained by [`DRAINERS`] threads.
    MatchAll,
}

impl Others {
    const ALL: [Others; 3] = [Others::Alone, Others::MatchNothing, Others::MatchAll];

    fn label(self) -> &'static str {
        match self {
            Others::Alone => "1 subscriber",
            Others::MatchNothing => "1 of 1,000 (999 match nothing)",
            Others::MatchAll => "1 of 1,000 (999 match all)",
        }
    }

    fn others(self) -> u64 {
        if self == Others::Alone {
            0
        } else {
            SUBSCRIBERS - 1
        }
    }
}

/// Latencies (seconds) of one run of single durable adds to a subscriber: from `add` returning Ok
/// to the subscriber having the change (0 where it had it first), and from the call of `add`; and
/// how many the subscriber had before `add` returned.
struct Latencies {
    after_return: Vec<f64>,
    from_call: Vec<f64>,
    /// The adds' own latencies, from the call to the return.
    add: Vec<f64>,
    early: usize,
}

/// 2: single durable adds of `items` from one thread, each timed to its delivery to a subscriber
/// to everything (registered last), beside `others`; the next add waits until the subscriber has
/// the change.
fn store_latency(items: &[ContextItem], others: Others) -> Res<Latencies> {
    let dir = tempfile::tempdir()?;
    let store = w1::open_durable(dir.path())?;
    let mut drain = None;
    let mut idle = Vec::new();
    match others {
        Others::Alone => {}
        Others::MatchNothing => {
            for k in 0..others.others() {
                idle.push(store.subscribe(ChangeFilter::new().ids([format!("absent-{k}")]))?);
            }
        }
        Others::MatchAll => {
            let subs = (0..others.others())
                .map(|_| store.subscribe(ChangeFilter::new()))
                .collect::<Result<Vec<_>, _>>()?;
            drain = Some(Drain::start(subs));
        }
    }
    let mut measured = store.subscribe(ChangeFilter::new())?;
    let adds = items.len();
    let (ack, acks) = crossbeam_channel::bounded::<()>(1);
    let receiver = std::thread::spawn(move || -> Result<Vec<(usize, Instant)>, Error> {
        let mut got = Vec::with_capacity(adds);
        while got.len() < adds {
            if let Change::Added { id, .. } = measured.recv()? {
                let at = Instant::now();
                got.push((number(&id).unwrap_or(usize::MAX), at));
                let _ = ack.send(());
            }
        }
        Ok(got)
    });
    let mut sent = Vec::with_capacity(adds);
    for item in items.iter().cloned() {
        let called = Instant::now();
        store.add([item])?;
        sent.push((called, Instant::now()));
        // One change in flight at a time, as in the fan-out: latency, not a backlog.
        acks.recv_timeout(Duration::from_secs(10))?;
    }
    let got = receiver.join().map_err(|_| "the receiving thread panicked")??;
    if let Some(drain) = drain {
        drain.stop()?;
    }
    drop(idle);
    let mut latencies = Latencies {
        after_return: Vec::with_capacity(adds),
        from_call: Vec::with_capacity(adds),
        add: sent
            .iter()
            .map(|(called, returned)| returned.duration_since(*called).as_secs_f64())
            .collect(),
        early: 0,
    };
    for (n, at) in got {
        let (called, returned) = sent.get(n).copied().ok_or("a change of an item never added")?;
        if at < returned {
            latencies.early += 1;
        }
        latencies
            .after_return
            .push(at.saturating_duration_since(returned).as_secs_f64());
        latencies.from_call.push(at.duration_since(called).as_secs_f64());
    }
    Ok(latencies)
}

/// The change the store delivers for `item` at `seq`.
fn change_of(item: &ContextItem, seq: u64) -> Change {
    Change::Added {
        seq,
        committed_at: w1::BASE_TS,
        id: item.id.clone(),
        version: item.version.clone(),
        hash: item.hash.clone().unwrap_or_default(),
        kind: item.kind.clone(),
        scope: item.scope.clone(),
        timestamp: item.timestamp,
    }
}

/// 2, baseline: a hand-rolled fan-out of the same changes over crossbeam channels: one sender
/// checks each receiver's id filter and sends a clone to those it passes (the measured receiver,
/// which takes everything, last), and waits for the measured receiver's acknowledgment before the
/// next; seconds from the start of the send to the measured receiver having it.
fn fanout_latency(items: &[ContextItem], others: Others) -> Res<Vec<f64>> {
    let changes: Vec<Change> = items.iter().zip(1..).map(|(item, seq)| change_of(item, seq)).collect();
    let mut outs: Vec<(Option<BTreeSet<String>>, Sender<Change>)> = Vec::new();
    let mut drained = Vec::new();
    for k in 0..others.others() {
        let (sender, receiver) = crossbeam_channel::unbounded();
        let filter = (others == Others::MatchNothing).then(|| BTreeSet::from([format!("absent-{k}")]));
        outs.push((filter, sender));
        drained.push(receiver);
    }
    let drain = (others == Others::MatchAll).then(|| Drain::start(drained));
    let (sender, measured) = crossbeam_channel::unbounded::<Change>();
    outs.push((None, sender));
    let (ack, acks) = crossbeam_channel::bounded::<()>(1);
    let count = changes.len();
    let receiver = std::thread::spawn(move || -> Vec<Instant> {
        let mut got = Vec::with_capacity(count);
        while let Ok(change) = measured.recv() {
            got.push(Instant::now());
            std::hint::black_box(change);
            if ack.send(()).is_err() {
                break;
            }
        }
        got
    });
    let mut started = Vec::with_capacity(count);
    for change in &changes {
        let Change::Added { id, .. } = change else {
            continue;
        };
        started.push(Instant::now());
        for (filter, out) in &outs {
            if filter.as_ref().is_none_or(|ids| ids.contains(id)) {
                out.send(change.clone())?;
            }
        }
        acks.recv()?;
    }
    drop(outs);
    let got = receiver.join().map_err(|_| "the receiving thread panicked")?;
    if let Some(drain) = drain {
        drain.stop()?;
    }
    Ok(got
        .iter()
        .zip(&started)
        .map(|(at, start)| at.duration_since(*start).as_secs_f64())
        .collect())
}

/// 3 and 4: catch-up rates (changes/s: the feed, a subscription's replay, SQLite polling) and the
/// index's bytes per item before, during and after 1,000 subscriptions.
struct CatchUp {
    feed: Vec<f64>,
    replay: Vec<f64>,
    sqlite: Vec<f64>,
    changes: u64,
    index: [f64; 3],
}

fn catch_up(n: u64, runs: usize) -> Res<CatchUp> {
    let dir = tempfile::tempdir()?;
    let store = w1::open_durable(dir.path())?;
    let mut next = 0;
    while next < n {
        let end = n.min(next + BATCH);
        store.add((next..end).map(w1::item))?;
        next = end;
    }
    let before = store.stats().index_bytes_per_item;
    let (subs, _) = filtered(&store, 0, n)?;
    let during = store.stats().index_bytes_per_item;
    drop(subs);
    let after = store.stats().index_bytes_per_item;

    // SQLite: the same rows, one per change.
    let db = rusqlite::Connection::open(dir.path().join("changes.sqlite"))?;
    db.execute_batch(
        "CREATE TABLE changes(seq INTEGER PRIMARY KEY, id TEXT NOT NULL, version TEXT NOT NULL, \
         hash TEXT NOT NULL, kind TEXT NOT NULL, ts INTEGER NOT NULL)",
    )?;
    {
        let tx = db.unchecked_transaction()?;
        let mut insert = tx.prepare("INSERT INTO changes VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?;
        let mut row = 0i64;
        for change in store.changes(0)? {
            if let Change::Added {
                id,
                version,
                hash,
                kind,
                timestamp,
                ..
            } = change?
            {
                row += 1;
                insert.execute(rusqlite::params![row, id, version, hash, kind, timestamp])?;
            }
        }
        drop(insert);
        tx.commit()?;
    }

    let mut result = CatchUp {
        feed: Vec::new(),
        replay: Vec::new(),
        sqlite: Vec::new(),
        changes: 0,
        index: [before, during, after],
    };
    for _ in 0..runs {
        let started = Instant::now();
        let mut count = 0u64;
        for change in store.changes(0)? {
            std::hint::black_box(change?);
            count += 1;
        }
        result.feed.push(count as f64 / started.elapsed().as_secs_f64());
        result.changes = count;

        let started = Instant::now();
        let mut sub = store.subscribe(ChangeFilter::new().after(0))?;
        let mut replayed = 0u64;
        while let Some(change) = sub.try_recv()? {
            std::hint::black_box(change);
            replayed += 1;
        }
        result.replay.push(replayed as f64 / started.elapsed().as_secs_f64());
        drop(sub);
        if replayed != count {
            return Err(format!("the replay gave {replayed} changes, the feed {count}").into());
        }

        let started = Instant::now();
        let mut polled = 0u64;
        let mut last = 0i64;
        let mut select = db.prepare_cached(
            "SELECT seq, id, version, hash, kind, ts FROM changes WHERE seq > ?1 ORDER BY seq LIMIT 1000",
        )?;
        loop {
            let mut rows = select.query([last])?;
            let mut got = 0;
            while let Some(row) = rows.next()? {
                last = row.get(0)?;
                let fields: (String, String, String, String, i64) =
                    (row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?);
                std::hint::black_box(fields);
                got += 1;
            }
            if got == 0 {
                break;
            }
            polled += got;
        }
        result.sqlite.push(polled as f64 / started.elapsed().as_secs_f64());
        if polled != count {
            return Err(format!("SQLite gave {polled} rows, the feed {count}").into());
        }
    }
    Ok(result)
}

/// 5: what the stalled subscriber saw.
struct Stall {
    resume_after: u64,
    missed: u64,
    resumed: u64,
    lag_wait: Duration,
}

/// 5: single durable adds from [`THREADS`] threads, with or without a subscriber to everything
/// that receives nothing until they stop: adds/s, and the stalled one's outcome.
fn stalled(items: &[Vec<ContextItem>], stall: bool) -> Res<(f64, Option<Stall>)> {
    let dir = tempfile::tempdir()?;
    let store = w1::open_durable(dir.path())?;
    let mut sub = if stall {
        Some(store.subscribe(ChangeFilter::new())?)
    } else {
        None
    };
    let count: u64 = items.iter().map(|list| list.len() as u64).sum();
    let rate = count as f64 / threads_add(&store, items)?.as_secs_f64();
    let Some(sub) = sub.as_mut() else {
        return Ok((rate, None));
    };
    // The dispatcher may still be delivering: wait until it has found the subscriber lagging.
    let stopped = Instant::now();
    while !sub.is_lagged() {
        if stopped.elapsed() > Duration::from_secs(60) {
            return Err("the stalled subscriber was not lagged within a minute".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let lag_wait = stopped.elapsed();
    let mut before_lag = 0u64;
    let resume_after = loop {
        match sub.try_recv() {
            Err(Error::Lagged { resume_after }) => break resume_after,
            Ok(Some(_)) => before_lag += 1,
            Ok(None) => return Err("a lagged subscription had nothing and no Lagged".into()),
            Err(e) => return Err(e.into()),
        }
    };
    let missed = store.changes(resume_after)?.count() as u64;
    if missed + before_lag != count {
        return Err(format!("{missed} changes after resume_after and {before_lag} received, of {count}").into());
    }
    let mut resumed_sub = store.subscribe(ChangeFilter::new().after(resume_after))?;
    let mut resumed = 0u64;
    while let Some(change) = resumed_sub.try_recv()? {
        if change.seq().is_some_and(|seq| seq <= resume_after) {
            return Err(format!("the resume delivered seq {:?}, not after {resume_after}", change.seq()).into());
        }
        resumed += 1;
    }
    Ok((
        rate,
        Some(Stall {
            resume_after,
            missed,
            resumed,
            lag_wait,
        }),
    ))
}

#[derive(Default)]
struct Figures {
    /// No subscriber, idle ones, drained ones.
    bulk: [Vec<f64>; 3],
    bulk_delivered: Vec<f64>,
    durable: [Vec<f64>; 3],
    durable_delivered: Vec<f64>,
    /// Per case: p50 and p99 (after `add` returned), p50 and p99 (from the call), early share,
    /// p50 and p99 of the adds themselves.
    store_latency: [[Vec<f64>; 7]; 3],
    fanout_latency: [[Vec<f64>; 2]; 3],
    stall: [Vec<f64>; 2],
    stall_outcomes: Vec<Stall>,
}

/// The ratio of the medians of `with` and `without`, and (in brackets) the median of the ratios of
/// each run's pair, which a machine whose speed drifts from run to run disturbs less.
fn ratio(with: &[f64], without: &[f64]) -> String {
    let pairs: Vec<f64> = with.iter().zip(without).map(|(w, o)| w / o).collect();
    format!("{:.2} ({:.2})", median(with) / median(without), median(&pairs))
}

fn us(sorted: &[f64], q: f64) -> f64 {
    w1::quantile_ms(sorted, q) * 1e3
}

/// The three rows of a throughput case: without subscribers against 1,000 filtered ones drained,
/// never received from, and the rate until every matching change was received.
fn throughput_rows(what: &str, unit: &str, runs: &[Vec<f64>; 3], delivered: &[f64]) {
    let (none, idle, drained) = (median(&runs[0]), median(&runs[1]), median(&runs[2]));
    println!(
        "| {what} (no subscriber / 1,000 filtered, drained) | {none:.0} | {drained:.0} | {} | >= 0.90 | {} |",
        ratio(&runs[2], &runs[0]),
        met(drained / none >= 0.9)
    );
    println!(
        "| ... 1,000 filtered, never received from (the hub alone) | {none:.0} | {idle:.0} | {} | | |",
        ratio(&runs[1], &runs[0])
    );
    println!(
        "| ... until every matching change was received, {unit} | {none:.0} | {:.0} | {} | | |",
        median(delivered),
        ratio(delivered, &runs[0])
    );
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn main() -> Res<()> {
    let sizes = sizes()?;
    let total = Instant::now();
    println!(
        "runs {}, bulk {} items, {THREADS} threads x {} durable adds, {} latency adds, catch-up over {} items, \
         stall {THREADS} x {}",
        sizes.runs, sizes.bulk, sizes.per_thread, sizes.latency_adds, sizes.catch_up, sizes.stall_per_thread
    );
    let bulk_items: Vec<ContextItem> = (0..sizes.bulk).map(w1::item).collect();
    let durable_items = thread_items(0, sizes.per_thread);
    let latency_items: Vec<ContextItem> = (0..sizes.latency_adds).map(w1::item).collect();
    let stall_items = thread_items(0, sizes.stall_per_thread);
    let mut figures = Figures::default();

    for run in 0..sizes.runs {
        // Alternate which goes first, so neither always meets a fresher page cache.
        let order = if run % 2 == 0 { [false, true] } else { [true, false] };
        let mut cases = [0, 1, 2];
        if run % 2 == 1 {
            cases.reverse();
        }
        for case in cases {
            let (rate, delivered) = bulk(&bulk_items, Subs::ALL[case])?;
            figures.bulk[case].push(rate);
            figures.bulk_delivered.extend(delivered);
        }
        for case in cases {
            let (rate, delivered) = durable_threads(&durable_items, Subs::ALL[case])?;
            figures.durable[case].push(rate);
            figures.durable_delivered.extend(delivered);
        }
        for (case, others) in Others::ALL.into_iter().enumerate() {
            let mut lat = store_latency(&latency_items, others)?;
            lat.after_return.sort_by(f64::total_cmp);
            lat.from_call.sort_by(f64::total_cmp);
            lat.add.sort_by(f64::total_cmp);
            let row = &mut figures.store_latency[case];
            row[0].push(us(&lat.after_return, 0.5));
            row[1].push(us(&lat.after_return, 0.99));
            row[2].push(us(&lat.from_call, 0.5));
            row[3].push(us(&lat.from_call, 0.99));
            row[4].push(lat.early as f64 / lat.from_call.len().max(1) as f64);
            row[5].push(us(&lat.add, 0.5));
            row[6].push(us(&lat.add, 0.99));
            let mut floor = fanout_latency(&latency_items, others)?;
            floor.sort_by(f64::total_cmp);
            figures.fanout_latency[case][0].push(us(&floor, 0.5));
            figures.fanout_latency[case][1].push(us(&floor, 0.99));
        }
        for with in order {
            let (rate, outcome) = stalled(&stall_items, with)?;
            figures.stall[usize::from(with)].push(rate);
            figures.stall_outcomes.extend(outcome);
        }
        println!(
            "run {}: bulk {:.0} / {:.0} / {:.0} items/s, durable {:.0} / {:.0} / {:.0} adds/s (none / idle / \
             drained), stall {:.0} / {:.0} adds/s (without / with), {:.0} s so far",
            run + 1,
            figures.bulk[0][run],
            figures.bulk[1][run],
            figures.bulk[2][run],
            figures.durable[0][run],
            figures.durable[1][run],
            figures.durable[2][run],
            figures.stall[0][run],
            figures.stall[1][run],
            total.elapsed().as_secs_f64()
        );
    }
    let catch = catch_up(sizes.catch_up, sizes.runs)?;

    let m = |v: &Vec<f64>| median(v);
    println!();
    println!(
        "medians of {} runs; load average now {}",
        sizes.runs,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    println!();
    println!("| measure | baseline | with subscriptions | ratio (paired) | target | met? |");
    println!("|---|---:|---:|---:|---|---|");
    throughput_rows(
        "1a bulk adds, items/s",
        "items/s",
        &figures.bulk,
        &figures.bulk_delivered,
    );
    throughput_rows(
        &format!("1b {THREADS} threads of durable adds, adds/s"),
        "adds/s",
        &figures.durable,
        &figures.durable_delivered,
    );
    for (case, others) in Others::ALL.into_iter().enumerate() {
        let row = &figures.store_latency[case];
        let floor = &figures.fanout_latency[case];
        let (p50, p99) = (m(&row[0]), m(&row[1]));
        let (f50, f99) = (m(&floor[0]), m(&floor[1]));
        println!(
            "| 2 latency after add returned, {}: p50 / p99 us (crossbeam fan-out floor) | {f50:.1} / {f99:.1} | {p50:.1} / {p99:.1} | | p50 < 50, p99 < 1000 | {} |",
            others.label(),
            met(p50 < 50.0 && p99 < 1000.0)
        );
        println!(
            "| 2 ... from the call of add, p50 / p99 us (the add alone: {:.1} / {:.1}; delivered before add returned: {:.0}%) | | {:.1} / {:.1} | | | |",
            m(&row[5]),
            m(&row[6]),
            m(&row[4]) * 100.0,
            m(&row[2]),
            m(&row[3])
        );
    }
    let (feed, replay, sqlite) = (m(&catch.feed), m(&catch.replay), m(&catch.sqlite));
    println!(
        "| 3 catch-up, changes(0) over {} changes, changes/s (SQLite polling) | {sqlite:.0} | {feed:.0} | {} | >= 1,000,000/s | {} |",
        catch.changes,
        ratio(&catch.feed, &catch.sqlite),
        met(feed >= 1e6)
    );
    println!(
        "| 3 catch-up, subscribe(after(0)) replay, changes/s (SQLite polling) | {sqlite:.0} | {replay:.0} | {} | >= 1,000,000/s | {} |",
        ratio(&catch.replay, &catch.sqlite),
        met(replay >= 1e6)
    );
    let [before, during, after] = catch.index;
    println!(
        "| 4 index bytes per item: none / 1,000 subscribed / after unsubscribing | {before:.1} | {during:.1} / {after:.1} | {:.3} | unchanged | {} |",
        after / before,
        met((during - before).abs() < f64::EPSILON && (after - before).abs() < f64::EPSILON)
    );
    let (s0, s1) = (m(&figures.stall[0]), m(&figures.stall[1]));
    println!(
        "| 5 {THREADS} threads of durable adds, adds/s (no subscriber / one stalled) | {s0:.0} | {s1:.0} | {} | not slowed | |",
        ratio(&figures.stall[1], &figures.stall[0])
    );
    let exact = figures.stall_outcomes.iter().all(|s| s.resumed == s.missed);
    let last = figures.stall_outcomes.last().ok_or("no stalled run")?;
    println!(
        "| 5 stalled: Lagged {{ resume_after: {} }} ({:.0} ms after the writers stopped); resumed after it: {} changes of {} missed | | | | exact | {} |",
        last.resume_after,
        last.lag_wait.as_secs_f64() * 1e3,
        last.resumed,
        last.missed,
        met(exact)
    );
    println!();
    println!("total {:.0} s", total.elapsed().as_secs_f64());
    Ok(())
}
