//! The scrub: a thread that reads every segment of the store again and again, at a bounded rate,
//! and checks what `Store::verify` checks in them (every frame's CRC, every record's CRC, every
//! put's content against its SHA-256). Reads check a record's CRC; the scrub also finds damage
//! where no read goes (records nobody asks for, sealed segments a checkpoint spares opening from
//! reading) and damage a CRC cannot see (a record whose content was changed and its CRC made
//! again). What it finds goes to the log (`tracing::error!`) and to `Stats::scrub`; it never
//! blocks a writer: it holds no lock while it reads, only the segments' mappings, and it makes no
//! storage call of its own (it reads the mappings sealed segments have, and the active segment's
//! read window).

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::engine::check::{check_segment, Problem};
use crate::engine::shared::Shared;
use crate::error::{Error, Result};

/// Problems the scrub keeps for `Stats::scrub` (the log has every one).
const PROBLEMS_KEPT: usize = 1000;

/// What the scrub has done and found since the store was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScrubStats {
    /// The bytes per second it reads at the most (0: it is off).
    pub bytes_per_sec: u64,
    /// Whole passes over every segment.
    pub passes: u64,
    /// Segment bytes checked.
    pub bytes_checked: u64,
    /// Records whose CRC (and, for items, content hash) was checked.
    pub records_checked: u64,
    /// Distinct problems found (the first thousand), each once however many passes find it.
    pub problems: Vec<Problem>,
}

/// The scrub's figures, shared between its thread and `Store::stats`.
pub(crate) type ScrubReport = Arc<Mutex<ScrubStats>>;
/// The scrub thread: dropping the sender stops it.
pub(crate) type ScrubThread = (Sender<()>, JoinHandle<()>);

/// Starts the scrub thread: reading at `bytes_per_sec` at the most, a pass starting `interval`
/// after opening and each next one `interval` after the one before started (or when it ends, if
/// later). It stops when the returned sender is dropped. `None` when `bytes_per_sec` is 0.
pub(crate) fn start_scrub(
    shared: Arc<Shared>,
    bytes_per_sec: u64,
    interval: Duration,
) -> Result<(ScrubReport, Option<ScrubThread>)> {
    let report: ScrubReport = Arc::new(Mutex::new(ScrubStats {
        bytes_per_sec,
        ..ScrubStats::default()
    }));
    if bytes_per_sec == 0 {
        return Ok((report, None));
    }
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    let scrub = Scrub {
        shared,
        report: Arc::clone(&report),
        bytes_per_sec,
    };
    let handle = std::thread::Builder::new()
        .name("ctxlog-scrub".into())
        .spawn(move || scrub.run(&stopped, interval))
        .map_err(|e| Error::io("starting the scrub thread", e))?;
    Ok((report, Some((stop, handle))))
}

struct Scrub {
    shared: Arc<Shared>,
    report: ScrubReport,
    bytes_per_sec: u64,
}

/// Waits `duration`; false if the store is closing.
fn wait(stopped: &Receiver<()>, duration: Duration) -> bool {
    matches!(stopped.recv_timeout(duration), Err(RecvTimeoutError::Timeout))
}

impl Scrub {
    fn run(self, stopped: &Receiver<()>, interval: Duration) {
        let mut next = Instant::now() + interval;
        loop {
            if !wait(stopped, next.saturating_duration_since(Instant::now())) {
                return;
            }
            let started = Instant::now();
            if !self.pass(stopped) {
                return;
            }
            next = started + interval;
        }
    }

    /// One pass over every segment; false if the store began closing during it.
    fn pass(&self, stopped: &Receiver<()>) -> bool {
        let segments: Vec<_> = self.shared.read_index().segments.values().cloned().collect();
        let started = Instant::now();
        let mut done = 0u64;
        for segment in segments {
            // No storage call of its own: what is mapped already (the active segment's bytes
            // once the writer maps them for reads; until then it is read by the next pass).
            let Some(bytes) = segment.mapped_bytes() else {
                continue;
            };
            let published = crate::num::usize_from_u64(segment.published_len()).min(bytes.len());
            let bytes = bytes.get(..published).unwrap_or_default();
            let mut reached = 0usize;
            // Sleeps while the pass is ahead of its rate; says no once the store is closing.
            let mut pace = |offset: usize| {
                done += offset.saturating_sub(reached) as u64;
                reached = offset;
                #[allow(clippy::cast_precision_loss)]
                let due = Duration::from_secs_f64(done as f64 / self.bytes_per_sec as f64);
                let ahead = due.saturating_sub(started.elapsed());
                ahead.is_zero() || wait(stopped, ahead)
            };
            // Each segment is checked alone: the scrub looks for damaged bytes, and a segment it
            // mapped before a compaction beside one it mapped after need not continue each other.
            let findings = check_segment(&segment.path, bytes, None, &mut pace);
            let mut report = self.report.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            report.bytes_checked += if findings.stopped { reached } else { published } as u64;
            report.records_checked += findings.records;
            for problem in findings.problems {
                if !report.problems.contains(&problem) {
                    tracing::error!(
                        "scrub: {} at offset {}: {}",
                        problem.file.display(),
                        problem.offset,
                        problem.reason
                    );
                    if report.problems.len() < PROBLEMS_KEPT {
                        report.problems.push(problem);
                    }
                }
            }
            if findings.stopped {
                return false;
            }
        }
        self.report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .passes += 1;
        true
    }
}
