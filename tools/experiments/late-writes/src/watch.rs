//! The consumer's watcher: a thread that scans the destination pages about every
//! millisecond and notes every stamp that changes, when, and against which milestone.
//!
//! ```text
//!   landing ──(failure notice / disconnect / expiry: mark_event)──▶ late ──(Released: reuse,
//!   which writes the reuse stamps)──▶ any producer stamp landing now is a violation
//! ```
//!
//! Times are µs on the consumer's clock. A change is seen by the first scan that reads the
//! page after it happened, so it happened after the previous scan began: a page is *late*
//! (or a *violation*) only when that previous scan began after the event (or the release),
//! which never blames a landing that may precede its milestone. The last landing's time is
//! the end of the scan that saw it (an upper bound: gaps err long by at most one scan).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::stamp::{Stamp, StampedPages};

const NONE: u64 = u64::MAX;
/// Pause target between scan starts.
const SCAN_PERIOD: Duration = Duration::from_millis(1);

/// What the watcher saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchReport {
    /// Scans made.
    pub scans: u64,
    /// Median and worst scan duration, µs.
    pub scan_p50_us: u64,
    /// Worst scan duration, µs.
    pub scan_max_us: u64,
    /// Pages whose last word held the producer's stamp at the event.
    pub landed_at_event: u64,
    /// Pages whose last word ever held the producer's stamp.
    pub landed_total: u64,
    /// Pages that changed to a producer stamp after the event.
    pub late_pages: u64,
    /// When the last producer stamp landed, as `(lower, upper)` bounds in µs on the
    /// consumer's clock: the start of the scan before the one that saw it, and the end of
    /// the one that saw it (`None`: nothing landed while watched).
    pub last_landing_us: Option<(u64, u64)>,
    /// Pages a producer stamp landed on after D's ledger said `Released`: seen changing to
    /// it in a scan that began after the release, or holding it after D wrote its reuse
    /// stamps.
    pub violation_pages: u64,
    /// Last violation seen, µs after the release.
    pub last_violation_us: Option<u64>,
}

impl WatchReport {
    /// µs from `milestone` to the end of the scan that saw the last landing, when that scan
    /// ended at or after it (an upper bound: the landing may precede the milestone by up to
    /// a scan); `None` when everything landed before.
    pub fn gap_after(&self, milestone: u64) -> Option<u64> {
        let (_, upper) = self.last_landing_us?;
        (upper >= milestone).then(|| upper - milestone)
    }
}

struct Shared {
    pages: Arc<StampedPages>,
    first_page: usize,
    count: usize,
    generation: u16,
    epoch: Instant,
    event_us: AtomicU64,
    released_us: AtomicU64,
    reused_us: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }
}

/// The running watcher.
pub struct Watch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<WatchReport>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl Watch {
    /// Starts watching pages `first_page .. first_page + count` of `pages` for stamps of
    /// `generation`; `epoch` is the consumer's clock.
    pub fn start(
        pages: Arc<StampedPages>,
        first_page: usize,
        count: usize,
        generation: u16,
        epoch: Instant,
    ) -> Self {
        let shared = Arc::new(Shared {
            pages,
            first_page,
            count,
            generation,
            epoch,
            event_us: AtomicU64::new(NONE),
            released_us: AtomicU64::new(NONE),
            reused_us: AtomicU64::new(NONE),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("late-writes-watch".into())
            .spawn(move || scan(&s))
            .expect("spawn the watcher thread");
        Watch {
            shared,
            thread: Some(thread),
        }
    }

    /// The failure event (first failure notice, disconnect or expiry) happened at `at_us`.
    pub fn mark_event(&self, at_us: u64) {
        let _ =
            self.shared
                .event_us
                .compare_exchange(NONE, at_us, Ordering::AcqRel, Ordering::Acquire);
    }

    /// D released the blocks: from now on a landing is a violation; writes the reuse stamp
    /// into every watched page, then also checks that every page keeps it. Returns when the
    /// stamps are written (µs on the consumer's clock).
    pub fn reuse(&self) -> u64 {
        let s = &self.shared;
        s.released_us.store(s.now_us(), Ordering::Release);
        for i in 0..s.count {
            s.pages
                .stamp(s.first_page + i, Stamp::Reused { page: i as u32 });
        }
        let at = s.now_us();
        s.reused_us.store(at, Ordering::Release);
        at
    }

    /// Stops the thread and returns what it saw.
    pub fn finish(mut self) -> WatchReport {
        self.shared.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn scan(s: &Shared) -> WatchReport {
    let mut last: Vec<(u64, u64)> = (0..s.count)
        .map(|i| s.pages.read(s.first_page + i))
        .collect();
    let mut ever_landed: Vec<bool> = last
        .iter()
        .map(|w| Stamp::decode(w.1).is_producer(s.generation))
        .collect();
    let mut violated = vec![false; s.count];
    let mut durations = Vec::new();
    let mut r = WatchReport::default();
    let mut landed_now = ever_landed.iter().filter(|&&l| l).count() as u64;
    let mut event_seen = false;
    let mut previous_start = s.now_us();
    while !s.stop.load(Ordering::Acquire) {
        let start = s.now_us();
        let event = s.event_us.load(Ordering::Acquire);
        let released = s.released_us.load(Ordering::Acquire);
        let reused = s.reused_us.load(Ordering::Acquire);
        if event != NONE && !event_seen {
            event_seen = true;
            r.landed_at_event = landed_now;
        }
        let mut late_here = 0;
        let mut landed_here = false;
        let mut violations_here = 0;
        let reuse_armed = reused != NONE && start >= reused;
        for (i, prev) in last.iter_mut().enumerate() {
            let now = s.pages.read(s.first_page + i);
            // Once the reuse stamps are in place, a page not holding its reuse stamp but a
            // producer stamp was written after D overwrote it, changed or not since the
            // previous scan.
            if reuse_armed && !violated[i] {
                let reuse = Stamp::Reused { page: i as u32 }.encode();
                let producer = |w: u64| Stamp::decode(w).is_producer(s.generation);
                if (now.0 != reuse || now.1 != reuse) && (producer(now.0) || producer(now.1)) {
                    violated[i] = true;
                    violations_here += 1;
                }
            }
            if now == *prev {
                continue;
            }
            // A landing is a word that changed *to* a producer stamp (a page caught half
            // overwritten by the reuse stamps changed too, but towards "reused").
            let to_producer =
                |new: u64, old: u64| new != old && Stamp::decode(new).is_producer(s.generation);
            let landed = to_producer(now.0, prev.0) || to_producer(now.1, prev.1);
            *prev = now;
            if Stamp::decode(now.1).is_producer(s.generation) && !ever_landed[i] {
                ever_landed[i] = true;
                landed_now += 1;
            }
            landed_here |= landed;
            // Unambiguous only when the previous read of the page (in the previous scan)
            // already came after the milestone: then so did the change.
            if landed && event != NONE && previous_start >= event {
                late_here += 1;
            }
            if landed && released != NONE && previous_start >= released && !violated[i] {
                violated[i] = true;
                violations_here += 1;
            }
        }
        let end = s.now_us();
        durations.push(end - start);
        r.scans += 1;
        r.late_pages += late_here;
        if landed_here {
            r.last_landing_us = Some((previous_start, end));
        }
        previous_start = start;
        if violations_here > 0 {
            r.violation_pages += violations_here;
            r.last_violation_us = Some(end - released);
        }
        let next = Duration::from_micros(start) + SCAN_PERIOD;
        let left = next.saturating_sub(Duration::from_micros(s.now_us()));
        if !left.is_zero() {
            std::thread::sleep(left);
        }
    }
    if !event_seen {
        r.landed_at_event = landed_now;
    }
    r.landed_total = landed_now;
    durations.sort_unstable();
    r.scan_p50_us = durations.get(durations.len() / 2).copied().unwrap_or(0);
    r.scan_max_us = durations.last().copied().unwrap_or(0);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_scans(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[test]
    fn late_changes_and_violations_are_seen_against_their_milestones() {
        let pages = Arc::new(StampedPages::new(8));
        let epoch = Instant::now();
        let w = Watch::start(Arc::clone(&pages), 2, 4, 5, epoch);
        let p = |page| Stamp::Producer {
            generation: 5,
            page,
        };
        pages.stamp(2, p(0));
        wait_scans(20);
        w.mark_event(epoch.elapsed().as_micros() as u64);
        wait_scans(20);
        pages.stamp(3, p(1));
        wait_scans(20);
        w.reuse();
        wait_scans(20);
        pages.stamp(4, p(2));
        // Outside the watched range: ignored.
        pages.stamp(7, p(9));
        wait_scans(20);
        let r = w.finish();
        assert!(r.scans > 10, "{r:?}");
        assert_eq!((r.landed_at_event, r.landed_total), (1, 3), "{r:?}");
        assert_eq!(r.late_pages, 2, "{r:?}");
        let (lo, hi) = r.last_landing_us.expect("landings");
        assert!(lo <= hi && hi >= 60_000, "{r:?}");
        assert_eq!(r.gap_after(hi + 1), None);
        assert!(r.gap_after(1000).is_some_and(|g| g >= 59_000), "{r:?}");
        assert_eq!(r.violation_pages, 1, "{r:?}");
        assert!(r.last_violation_us.is_some(), "{r:?}");
    }
}
