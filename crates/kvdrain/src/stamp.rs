//! Stamps: the time of a failure notice or a `gone`, kept as the low 32 bits of its
//! milliseconds, and how the engine reads one back as an [`Instant`].
//!
//! A stamp is 32 bits because the ingest thread stores it in an atomic that every target
//! has (a Cortex-M4F has no 64-bit atomics), next to the engine's published clock
//! (`Shared::clock`), which is 32 bits for the same reason. Both ends of a stamp know
//! where it lies only relative to another time on the same clock, so both compare by
//! *signed distance*: two stamps less than 2^31 ms (24.8 days) apart are ordered exactly
//! whatever their low bits, and the engine reads a stamp within 2^31 ms of its clock, on
//! either side of it, as exactly the time it was taken.
//!
//! Outside that window a stamp is misread by a multiple of 2^32 ms. The window is placed
//! so that the one misreading that can happen in practice errs late: a stamp far *behind*
//! the clock (a failure notice that waited more than 24.8 days for its request's last
//! edge, or an arrival time left more than 24.8 days stale, see
//! [`Ingest::set_arrival`](crate::Ingest::set_arrival)) reads as later than it was, which
//! only delays a release. A stamp 2^31 ms or more *ahead* of the clock would read as
//! earlier; it needs an engine that has not advanced for 24.8 days while notices arrived,
//! which the drive contract (advance on every step) rules out.

use crate::time::{Duration, Instant};

/// The stamp of `t`: its milliseconds' low 32 bits.
#[inline(always)]
pub(crate) const fn of(t: Instant) -> u32 {
    t.millis() as u32
}

/// The later of two stamps taken less than 2^31 ms apart (see the module doc). On the
/// failure-notice path: one subtraction and one compare.
#[inline(always)]
pub(crate) const fn later(a: u32, b: u32) -> u32 {
    if (b.wrapping_sub(a) as i32) > 0 { b } else { a }
}

/// The time `stamp` was taken, read against the clock `now`: the instant with those low
/// bits nearest to `now`, `now - 2^31` ms included and `now + 2^31` ms excluded (stopping
/// at [`Instant::ZERO`]: a stamp cannot predate the epoch).
#[inline]
pub(crate) fn read(stamp: u32, now: Instant) -> Instant {
    let distance = stamp.wrapping_sub(of(now)) as i32;
    let by = Duration::from_millis(u64::from(distance.unsigned_abs()));
    if distance >= 0 {
        now + by
    } else {
        now.saturating_sub(by)
    }
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::{later, of, read};
    use crate::time::Instant;

    const HALF: u64 = 1 << 31;
    const WRAP: u64 = 1 << 32;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn a_stamp_near_the_clock_reads_exactly_on_either_side() {
        for now in [0, 10, 600, HALF, WRAP - 1, WRAP, WRAP + 5, 7 * WRAP + 123] {
            for delta in [0, 1, 500, HALF - 1] {
                let ahead = now + delta;
                assert_eq!(read(of(at(ahead)), at(now)), at(ahead), "{now} + {delta}");
                if let Some(behind) = now.checked_sub(delta) {
                    assert_eq!(read(of(at(behind)), at(now)), at(behind), "{now} - {delta}");
                }
            }
            // Exactly 2^31 behind is still in the window.
            if let Some(behind) = now.checked_sub(HALF) {
                assert_eq!(read(of(at(behind)), at(now)), at(behind));
            }
        }
    }

    #[test]
    fn a_stamp_too_far_behind_reads_later_never_earlier() {
        let now = 10 * WRAP + 77;
        for age in [HALF + 1, WRAP - 1, WRAP, WRAP + 1, 3 * WRAP + HALF + 9] {
            let taken = now - age;
            let got = read(of(at(taken)), at(now));
            assert!(got > at(taken), "age {age}: read {got}");
            assert_eq!((got.millis() - taken) % WRAP, 0, "age {age}");
        }
    }

    #[test]
    fn before_the_epoch_stops_at_zero() {
        // Clock 5, stamp "1 ms before the epoch" (2^32 - 1): nothing predates zero.
        assert_eq!(read(u32::MAX, at(5)), Instant::ZERO);
    }

    #[test]
    fn later_orders_stamps_across_the_wrap() {
        assert_eq!(later(10, 600), 600);
        assert_eq!(later(600, 10), 600);
        assert_eq!(later(7, 7), 7);
        // 2^32 - 10 and 20 are 30 ms apart across the wrap: 20 is the later.
        assert_eq!(later(u32::MAX - 9, 20), 20);
        assert_eq!(later(20, u32::MAX - 9), 20);
        let half = HALF as u32;
        assert_eq!(later(0, half - 1), half - 1);
        assert_eq!(later(half - 1, 0), half - 1);
    }
}
