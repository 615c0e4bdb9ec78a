//! Refused holds: the blocks of a registration the ledger refused, held for a quarantine
//! because a producer may write into them all the same. Why, and the ring's bound: see
//! [`RefusedHold`].

use crate::Engine;
use crate::time::{Duration, Instant};

/// Entries of the refused holds' ring: distinct hold ends (see [`RefusedHold`]). 64
/// entries of 16 bytes, a kilobyte per ledger whatever its `N`.
pub const REFUSED_HOLD_ENDS: usize = 64;

/// One refused hold: its number (the holds taken before it, ever) and when it ends.
///
/// A refused [`register`](crate::Engine::register) changes nothing in the table (the
/// spec's `rejected`). But a caller may have let producers write into those blocks by
/// another way: a decode engine of several ranks, say, where one rank's registration
/// sends the producers the block ids every rank shares, and another rank's ledger was
/// full. No edge of those writes is tracked, so nothing tells when the last one lands;
/// what bounds them is the producers' lease, which the caller keeps below the quarantine.
/// [`hold_refused`](crate::Engine::hold_refused) gives the ledger that wait: the hold
/// ends [`Config::quarantine`](crate::Config::quarantine) after the clock, and
/// [`poll_refused_release`](crate::Engine::poll_refused_release) hands each end out once
/// the clock reaches it (a forced release, like a quarantine's), oldest first.
///
/// The ledger keeps the times only: the caller keeps what is held, in the order it was
/// held (a queue), and matches each end to the front of it by its number. Every hold
/// lasts the same quarantine from a clock that never goes back, so holds end in the order
/// they began, and holds that end together share one entry of a fixed ring.
///
/// **The ring never refuses.** An end is rounded up to a multiple of the
/// [`granule`](Self::granule) (the quarantine over [`REFUSED_HOLD_ENDS`]` - 3`, at least
/// 1 ms), so a hold lasts at least the quarantine and less than one granule more: about
/// 1.7 % of it (exact up to a 61 ms quarantine; up to 983 ms late in a 60 s one). Holds
/// not over yet end within `(now, now + quarantine + granule)`: at most
/// `quarantine / granule + 2` multiples, `REFUSED_HOLD_ENDS - 1` at most. The holds
/// already over that nobody pulled yet collapse into one entry, and that makes the ring's
/// size. A ring that filled anyway (it cannot) would keep the new hold's blocks with the
/// last entry's: longer, never shorter.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RefusedHold {
    /// Holds are numbered from 0 in the order they were taken, and end in that order.
    pub number: u64,
    /// When the blocks come back: the clock at the hold plus the quarantine, rounded up
    /// to the [granule](RefusedHold::granule); [`Instant::MAX`] (never) past the end of time.
    pub until: Instant,
}

impl RefusedHold {
    /// What a refused hold's end is rounded up to, for a `quarantine` (see
    /// [`RefusedHold`]): `ceil(quarantine / (REFUSED_HOLD_ENDS - 3))`, at least 1 ms.
    pub const fn granule(quarantine: Duration) -> Duration {
        let ms = quarantine.millis().div_ceil(REFUSED_HOLD_ENDS as u64 - 3);
        Duration::from_millis(if ms == 0 { 1 } else { ms })
    }
}

/// The end of a hold taken at `now`.
fn end_of(now: Instant, quarantine: Duration) -> Instant {
    let g = RefusedHold::granule(quarantine).millis();
    now.checked_add(quarantine)
        .and_then(|end| end.millis().div_ceil(g).checked_mul(g))
        .map_or(Instant::MAX, Instant::from_millis)
}

/// The holds taken (`through`, a count: the holds numbered below it and at or above the
/// previous entry's) that end at `at`.
#[derive(Clone, Copy, Debug)]
struct End {
    through: u64,
    at: Instant,
}

/// The engine's refused holds: counts and a ring of their ends, oldest first.
#[derive(Debug)]
pub(crate) struct RefusedHolds {
    /// Holds taken, ever: the next hold's number.
    taken: u64,
    /// Holds handed out as ended, ever: the oldest hold on is numbered this.
    ended: u64,
    ring: [End; REFUSED_HOLD_ENDS],
    head: usize,
    len: usize,
}

impl RefusedHolds {
    pub(crate) const fn new() -> Self {
        RefusedHolds {
            taken: 0,
            ended: 0,
            ring: [End {
                through: 0,
                at: Instant::ZERO,
            }; REFUSED_HOLD_ENDS],
            head: 0,
            len: 0,
        }
    }

    /// When the oldest hold on ends, if one is.
    pub(crate) fn next_end(&self) -> Option<Instant> {
        (self.len > 0).then(|| self.ring[self.head].at)
    }

    /// Holds on: taken and not handed out as ended.
    pub(crate) fn len(&self) -> u64 {
        self.taken - self.ended
    }

    /// The ring index of the `i`-th entry from the oldest.
    fn nth(&self, i: usize) -> usize {
        (self.head + i) % REFUSED_HOLD_ENDS
    }

    fn take(&mut self, now: Instant, quarantine: Duration) -> RefusedHold {
        let until = end_of(now, quarantine);
        let number = self.taken;
        self.taken += 1;
        if self.len > 0 {
            let last = self.nth(self.len - 1);
            if self.ring[last].at == until {
                self.ring[last].through = self.taken;
                return RefusedHold { number, until };
            }
        }
        if self.len == REFUSED_HOLD_ENDS {
            self.collapse_over(now);
        }
        if self.len == REFUSED_HOLD_ENDS {
            // Unreachable (see `RefusedHold`); held with the last entry's, longer, if not.
            debug_assert!(false, "the refused holds' ring is full");
            let last = self.nth(self.len - 1);
            self.ring[last] = End {
                through: self.taken,
                at: until,
            };
            return RefusedHold { number, until };
        }
        let slot = self.nth(self.len);
        self.ring[slot] = End {
            through: self.taken,
            at: until,
        };
        self.len += 1;
        RefusedHold { number, until }
    }

    /// Folds the entries already over at `now` into their last: each ends no later for it.
    fn collapse_over(&mut self, now: Instant) {
        let over = (0..self.len)
            .take_while(|&i| self.ring[self.nth(i)].at <= now)
            .count();
        if over > 1 {
            self.head = self.nth(over - 1);
            self.len -= over - 1;
        }
    }

    fn pop_over(&mut self, now: Instant) -> Option<RefusedHold> {
        if self.len == 0 {
            return None;
        }
        let front = self.ring[self.head];
        if front.at > now {
            return None;
        }
        let number = self.ended;
        self.ended += 1;
        if self.ended == front.through {
            self.head = self.nth(1);
            self.len -= 1;
        }
        Some(RefusedHold {
            number,
            until: front.at,
        })
    }
}

impl<const N: usize, const E: usize> Engine<'_, N, E> {
    /// Holds the blocks of a registration this ledger refused, which a producer may write
    /// into all the same (see [`RefusedHold`]), until the clock (the last
    /// [`advance`](Self::advance)) plus [`Config::quarantine`](crate::Config::quarantine),
    /// rounded up to the [granule](RefusedHold::granule). Keep what is held in a queue,
    /// in this order: [`poll_refused_release`](Self::poll_refused_release) hands the ends
    /// out in it. Never refuses, and changes no request.
    pub fn hold_refused(&mut self) -> RefusedHold {
        let (now, quarantine) = (self.owner.now, self.owner.config.quarantine);
        self.owner.refused.take(now, quarantine)
    }

    /// The oldest refused hold whose end the clock has reached, if any: its blocks are
    /// free (a forced release: nothing tracked whether a write was still on its way).
    /// Pull until `None` after each [`advance`](Self::advance); the ends are in the
    /// numbers' order, so this is always the front of the caller's queue.
    pub fn poll_refused_release(&mut self) -> Option<RefusedHold> {
        let now = self.owner.now;
        self.owner.refused.pop_over(now)
    }

    /// Refused holds taken and not handed out as released.
    pub fn refused_holds(&self) -> u64 {
        self.owner.refused.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn granules_are_the_quarantine_over_61_and_at_least_a_millisecond() {
        assert_eq!(RefusedHold::granule(Duration::ZERO).millis(), 1);
        assert_eq!(RefusedHold::granule(Duration::from_millis(61)).millis(), 1);
        assert_eq!(RefusedHold::granule(Duration::from_millis(62)).millis(), 2);
        assert_eq!(RefusedHold::granule(Duration::from_secs(60)).millis(), 984);
        assert_eq!(
            RefusedHold::granule(Duration::MAX).millis(),
            u64::MAX.div_ceil(61)
        );
    }

    #[test]
    fn an_end_is_the_quarantine_rounded_up_and_never_wraps() {
        let q = Duration::from_millis(1_500); // granule 25
        assert_eq!(end_of(ms(0), q), ms(1_500));
        assert_eq!(end_of(ms(1), q), ms(1_525));
        assert_eq!(end_of(ms(u64::MAX - 10), q), Instant::MAX);
        assert_eq!(end_of(ms(5), Duration::MAX), Instant::MAX);
        assert_eq!(end_of(ms(7), Duration::ZERO), ms(7));
    }

    #[test]
    fn holds_end_in_order_one_at_a_time() {
        let q = Duration::from_millis(100);
        let mut h = RefusedHolds::new();
        assert_eq!(h.take(ms(0), q).until, ms(100));
        assert_eq!(h.take(ms(0), q).until, ms(100));
        assert_eq!(h.take(ms(10), q).until, ms(110));
        assert_eq!((h.len(), h.len), (3, 2));
        assert_eq!(h.next_end(), Some(ms(100)));
        assert_eq!(h.pop_over(ms(99)), None);
        let n = |h: &mut RefusedHolds, now| h.pop_over(ms(now)).map(|r| r.number);
        assert_eq!(n(&mut h, 105), Some(0));
        assert_eq!(n(&mut h, 105), Some(1));
        assert_eq!(n(&mut h, 105), None);
        assert_eq!(h.next_end(), Some(ms(110)));
        assert_eq!(n(&mut h, 110), Some(2));
        assert_eq!((h.len(), h.next_end()), (0, None));
    }

    #[test]
    fn a_full_ring_folds_the_ends_nobody_pulled() {
        let q = Duration::from_millis(61); // granule 1
        let mut h = RefusedHolds::new();
        for t in 0..REFUSED_HOLD_ENDS as u64 {
            h.take(ms(t), q);
        }
        assert_eq!(h.len, REFUSED_HOLD_ENDS);
        // At 200 every end is over: they fold into one, and the new hold gets its own.
        let late = h.take(ms(200), q);
        assert_eq!((late.number, late.until, h.len), (64, ms(261), 2));
        let mut numbers = 0..;
        while let Some(r) = h.pop_over(ms(200)) {
            assert_eq!(Some(r.number), numbers.next());
            assert_eq!(r.until, ms(124)); // the last folded end: over already
        }
        assert_eq!(h.len(), 1);
        assert_eq!(h.pop_over(ms(261)).map(|r| r.number), Some(64));
    }
}
