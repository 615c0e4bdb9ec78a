//! Time as the ledger reads it: an [`Instant`] is a point on the caller's monotonic clock,
//! a [`Duration`] the distance between two, both in whole milliseconds.
//!
//! The core reads no clock. The caller picks the epoch (process start, boot, a simulation's
//! zero: anything that never goes back) and hands the time in through
//! [`advance`](crate::Engine::advance); every deadline, quarantine end and settle end is an
//! `Instant` on that same clock. Each type is one `u64` (`#[repr(transparent)]`), so they
//! cost nothing over the raw integer; the point of having two is that a deadline cannot be
//! passed where a lease is expected, and that `Instant + Instant` does not compile.
//!
//! Arithmetic that can overflow saturates: `Instant + Duration` stops at [`Instant::MAX`],
//! which no clock reaches (2^64 ms is 584 million years), so a deadline of
//! `now + Duration::MAX` means "never" instead of wrapping into the past and firing at
//! once. [`Instant::checked_add`] says when that happened, for a caller that must know. A
//! distance is taken with [`Instant::saturating_duration_since`], which is
//! [`Duration::ZERO`] when the other instant is later, never a panic.

use core::fmt;
use core::ops::{Add, AddAssign};

/// A point on the caller's monotonic clock, in milliseconds from an epoch of the caller's
/// choosing.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct Instant(u64);

/// A span of time, in milliseconds.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct Duration(u64);

impl Instant {
    /// The epoch: where a new ledger's clock starts.
    pub const ZERO: Instant = Instant(0);
    /// The last representable instant, which no clock reaches: "never".
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: u64) -> Instant {
        Instant(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn millis(self) -> u64 {
        self.0
    }

    /// `self + d`, or `None` past [`Instant::MAX`].
    pub const fn checked_add(self, d: Duration) -> Option<Instant> {
        match self.0.checked_add(d.0) {
            Some(ms) => Some(Instant(ms)),
            None => None,
        }
    }

    /// `self - d`, stopping at [`Instant::ZERO`].
    pub const fn saturating_sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(d.0))
    }

    /// How long after `earlier` this instant is; [`Duration::ZERO`] if it is not after it.
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration(0);
    /// The longest representable span: added to any instant, it gives [`Instant::MAX`].
    pub const MAX: Duration = Duration(u64::MAX);

    /// A span of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Duration {
        Duration(ms)
    }

    /// A span of `s` seconds (saturating at [`Duration::MAX`]).
    pub const fn from_secs(s: u64) -> Duration {
        Duration(s.saturating_mul(1000))
    }

    /// The span in milliseconds.
    pub const fn millis(self) -> u64 {
        self.0
    }

    /// `self + other`, or `None` past [`Duration::MAX`].
    pub const fn checked_add(self, other: Duration) -> Option<Duration> {
        match self.0.checked_add(other.0) {
            Some(ms) => Some(Duration(ms)),
            None => None,
        }
    }
}

/// Saturates at [`Instant::MAX`] ("never"), see the module doc.
impl Add<Duration> for Instant {
    type Output = Instant;
    #[inline(always)]
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }
}

/// Saturates at [`Instant::MAX`], like `+`.
impl AddAssign<Duration> for Instant {
    #[inline(always)]
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

/// Saturates at [`Duration::MAX`].
impl Add for Duration {
    type Output = Duration;
    #[inline(always)]
    fn add(self, other: Duration) -> Duration {
        Duration(self.0.saturating_add(other.0))
    }
}

/// Saturates at [`Duration::MAX`], like `+`.
impl AddAssign for Duration {
    #[inline(always)]
    fn add_assign(&mut self, other: Duration) {
        *self = *self + other;
    }
}

/// Milliseconds since the epoch, as `1234ms`.
impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// As `1234ms`.
impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::{Duration, Instant};

    #[test]
    fn adding_saturates_at_never_and_checked_add_says_so() {
        let t = Instant::from_millis(u64::MAX - 5);
        assert_eq!(t + Duration::from_millis(5), Instant::MAX);
        assert_eq!(t + Duration::from_millis(6), Instant::MAX);
        assert_eq!(Instant::ZERO + Duration::MAX, Instant::MAX);
        assert_eq!(t.checked_add(Duration::from_millis(5)), Some(Instant::MAX));
        assert_eq!(t.checked_add(Duration::from_millis(6)), None);
        let mut u = Instant::from_millis(10);
        u += Duration::from_millis(20);
        assert_eq!(u.millis(), 30);
        assert_eq!(Duration::MAX.checked_add(Duration::from_millis(1)), None);
        assert_eq!(Duration::MAX + Duration::from_millis(1), Duration::MAX);
        assert_eq!(Duration::from_secs(30), Duration::from_millis(30_000));
        assert_eq!(Duration::from_secs(u64::MAX), Duration::MAX);
    }

    #[test]
    fn distances_and_subtraction_stop_at_zero() {
        let (a, b) = (Instant::from_millis(100), Instant::from_millis(250));
        assert_eq!(b.saturating_duration_since(a), Duration::from_millis(150));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert_eq!(a.saturating_sub(Duration::from_millis(40)).millis(), 60);
        assert_eq!(a.saturating_sub(Duration::from_millis(400)), Instant::ZERO);
    }

    #[test]
    fn display_and_order() {
        assert_eq!(std::format!("{}", Instant::from_millis(1234)), "1234ms");
        assert_eq!(std::format!("{}", Duration::from_millis(5)), "5ms");
        assert!(Instant::ZERO < Instant::from_millis(1));
        assert!(Duration::ZERO < Duration::from_millis(1));
        assert_eq!(Instant::default(), Instant::ZERO);
        assert_eq!(Duration::default(), Duration::ZERO);
    }
}
