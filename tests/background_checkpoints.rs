//! The background checkpoint waits for a lull in the store's use, but not forever.
//!
//! A store opened with `checkpoint_every(1 MiB)` is given more than 1 MiB of log, so that a
//! checkpoint is due, while a trickle of small durable adds (one every 3 ms) goes on from another
//! thread. Then:
//! 1. while the trickle goes on, no checkpoint is written (2.5 s, two rounds of the maintenance
//!    thread), unless the trickle itself paused for a lull's length (50 ms without a commit), which
//!    a loaded machine may cause and which makes a checkpoint right;
//! 2. once the log since the last checkpoint reaches twice `checkpoint_every`, a checkpoint is
//!    written although the trickle goes on;
//! 3. with a checkpoint due again and the trickle going on, none is written, and once the trickle
//!    stops, one is;
//! 4. the same with a trickle of reads and queries instead of adds.
//!
//! In every case the checkpoint written is whole: the store reopens from it to the same items.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ctxlog::*;
use serde_json::json;

const NOW: i64 = 1_700_000_000;
const EVERY: u64 = 1 << 20;
/// The longest pause in the trickle that is not yet a lull (a lull is 50 ms without a commit; the
/// trickle's pauses are measured between the returns of its adds, a little less than that).
const NOT_A_LULL: Duration = Duration::from_millis(40);

fn checkpoint_seqs(dir: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = std::fs::read_dir(dir)
        .expect("list store")
        .filter_map(|e| {
            let name = e.expect("dir entry").file_name().to_string_lossy().into_owned();
            name.strip_prefix("checkpoint-")?.strip_suffix(".idx")?.parse().ok()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

fn newest_checkpoint(dir: &Path) -> Option<u64> {
    checkpoint_seqs(dir).last().copied()
}

/// Adds `bytes` of incompressible content in items of 4 KiB, in batches of 32.
fn add_bulk(store: &Store, tag: &str, bytes: u64) {
    let items: Vec<ContextItem> = (0..bytes.div_ceil(4096))
        .map(|n| {
            item(
                &format!("bulk-{tag}-{n:05}"),
                NOW,
                "1",
                json!({ "text": incompressible(&format!("{tag}{n}"), 4096) }),
            )
        })
        .collect();
    for chunk in items.chunks(32) {
        store.add(chunk.to_vec()).expect("bulk add");
    }
}

/// Small durable adds (or reads), one every 3 ms, until `stop`; the instants they returned.
struct Trickle {
    stop: Arc<AtomicBool>,
    returns: Arc<Mutex<Vec<Instant>>>,
    handle: Option<std::thread::JoinHandle<u64>>,
}

/// What a trickle does every 3 ms.
#[derive(Clone, Copy)]
enum Work {
    /// A durable add of a small item.
    Add,
    /// A resolve, then a query of one item.
    Read,
}

impl Trickle {
    fn start(store: &Store, work: Work) -> Trickle {
        let stop = Arc::new(AtomicBool::new(false));
        let returns = Arc::new(Mutex::new(Vec::new()));
        let handle = {
            let (store, stop, returns) = (store.clone(), Arc::clone(&stop), Arc::clone(&returns));
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    match work {
                        Work::Add => {
                            store
                                .add([item(&format!("trickle-{n:06}"), NOW, "1", json!({ "n": n }))])
                                .expect("trickle add");
                        }
                        Work::Read => {
                            let id = format!("bulk-a-{:05}", n % 100);
                            assert!(matches!(
                                store.resolve([&id]).expect("resolve")[0],
                                Resolution::Found { .. }
                            ));
                            assert_eq!(store.get(&ContextQuery::new().limit(1)).expect("query").len(), 1);
                        }
                    }
                    returns.lock().expect("returns").push(Instant::now());
                    n += 1;
                    std::thread::sleep(Duration::from_millis(3));
                }
                n
            })
        };
        Trickle {
            stop,
            returns,
            handle: Some(handle),
        }
    }

    /// The longest pause between two returns of the trickle's adds in `from..to`.
    fn longest_pause(&self, from: Instant, to: Instant) -> Duration {
        let returns = self.returns.lock().expect("returns");
        let inside: Vec<Instant> = returns.iter().copied().filter(|t| *t >= from && *t <= to).collect();
        inside
            .windows(2)
            .map(|pair| pair[1].duration_since(pair[0]))
            .max()
            .unwrap_or(Duration::MAX)
    }

    fn stop(&mut self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.handle.take().map_or(0, |h| h.join().expect("trickle thread"))
    }
}

/// Watches for a checkpoint newer than `than` for `watch`; the instant one was first seen.
fn watch_for_checkpoint(dir: &Path, than: Option<u64>, watch: Duration) -> Option<(Instant, u64)> {
    let started = Instant::now();
    while started.elapsed() < watch {
        if let Some(seq) = newest_checkpoint(dir).filter(|seq| Some(*seq) > than) {
            return Some((Instant::now(), seq));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Phase 1 and 3: with a checkpoint due and the trickle going on for `watch`, none is written, or
/// the trickle paused for a lull's length before it was.
fn assert_deferred(dir: &Path, trickle: &Trickle, than: Option<u64>, watch: Duration, phase: &str) -> Option<u64> {
    let from = Instant::now();
    let seen = watch_for_checkpoint(dir, than, watch);
    if let Some((at, seq)) = seen {
        let pause = trickle.longest_pause(from, at);
        assert!(
            pause >= NOT_A_LULL,
            "{phase}: checkpoint {seq} written {:?} into a trickle whose longest pause was {pause:?}",
            at.duration_since(from)
        );
        println!("{phase}: the trickle paused {pause:?}, and a checkpoint ({seq}) was written in that lull");
        return Some(seq);
    }
    println!("{phase}: no checkpoint in {watch:?} of trickle");
    than
}

/// Phases 3 and 4: with a checkpoint due, none is written while `trickle` goes on (see
/// [`assert_deferred`]), and one is within 5 s once it stops. Returns the trickle's operations.
fn deferred_until_stopped(dir: &Path, mut trickle: Trickle, than: Option<u64>, what: &str) -> u64 {
    let phase = format!("due, {what} going on");
    let deferred = assert_deferred(dir, &trickle, than, Duration::from_millis(2_500), &phase);
    let operations = trickle.stop();
    if deferred == than {
        let stopped = Instant::now();
        let (at, seq) = watch_for_checkpoint(dir, than, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no checkpoint within 5 s of the {what} stopping"));
        println!(
            "lull: checkpoint {seq} written {:?} after the {what} stopped",
            at.duration_since(stopped)
        );
    }
    operations
}

fn items_of(store: &Store) -> Vec<ContextItem> {
    store.get(&ContextQuery::new().limit(100_000)).expect("get everything")
}

fn reopen_from_checkpoint(dir: &PathBuf, seq: u64, want: &[ContextItem]) {
    let store = Options::new()
        .clock(Arc::new(ManualClock::new(NOW)) as Arc<dyn Clock>)
        .open(dir)
        .expect("reopen");
    let recovery = store.stats().recovery;
    assert_eq!(recovery.checkpoint_seq, Some(seq), "{recovery:?}");
    assert_eq!(items_of(&store), want);
}

#[test]
fn background_checkpoints_wait_for_a_lull_but_not_forever() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_path_buf();
    let store = Options::new()
        .clock(Arc::new(ManualClock::new(NOW)) as Arc<dyn Clock>)
        .auto_compact(false)
        .checkpoint_every(EVERY)
        .open(&path)
        .expect("open");
    assert_eq!(newest_checkpoint(&path), None);
    let trickle = Trickle::start(&store, Work::Add);

    // 1. Due, deferred while the trickle goes on.
    add_bulk(&store, "a", EVERY + EVERY / 4);
    let mut newest = assert_deferred(&path, &trickle, None, Duration::from_millis(2_500), "due");

    // 2. Twice `checkpoint_every` since the last checkpoint: written although the trickle goes on.
    add_bulk(&store, "b", 2 * EVERY + EVERY / 4);
    let before = Instant::now();
    let (at, seq) = watch_for_checkpoint(&path, newest, Duration::from_secs(5))
        .expect("no checkpoint within 5 s of the log reaching twice checkpoint_every");
    println!(
        "overdue: checkpoint {seq} written {:?} after the log reached twice checkpoint_every; the trickle's \
         longest pause meanwhile {:?}",
        at.duration_since(before),
        trickle.longest_pause(before, at)
    );
    assert!(!trickle.stop.load(Ordering::Acquire));
    newest = Some(seq);

    // 3. Due again: deferred while the trickle goes on, written once it stops.
    add_bulk(&store, "c", EVERY + EVERY / 4);
    let trickled = deferred_until_stopped(&path, trickle, newest, "adds");
    println!("{trickled} trickled adds");

    // 4. Due again, with reads and queries going on instead: deferred, and written once they stop.
    newest = newest_checkpoint(&path);
    add_bulk(&store, "d", EVERY + EVERY / 4);
    let read = deferred_until_stopped(&path, Trickle::start(&store, Work::Read), newest, "reads");
    println!("{read} trickled reads");

    // Whatever checkpoint the store wrote last, it opens to the same items (closing writes its own
    // checkpoint: set that one aside so that the background one is loaded).
    let want = items_of(&store);
    let newest = newest_checkpoint(&path).expect("a checkpoint");
    let background = std::fs::read(path.join(format!("checkpoint-{newest:020}.idx"))).expect("read checkpoint");
    drop(store);
    for seq in checkpoint_seqs(&path) {
        std::fs::remove_file(path.join(format!("checkpoint-{seq:020}.idx"))).expect("remove");
    }
    std::fs::write(path.join(format!("checkpoint-{newest:020}.idx")), background).expect("restore checkpoint");
    reopen_from_checkpoint(&path, newest, &want);
}
