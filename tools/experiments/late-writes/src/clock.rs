//! The host's monotonic clock (`CLOCK_MONOTONIC`, the clock under `std::time::Instant` on
//! Linux), which every process on the host reads alike: the one clock on which P's fault
//! and D's page landings can be put in order.

/// Now on the host's monotonic clock, µs (0 if the clock cannot be read, which Linux never
/// reports for `CLOCK_MONOTONIC`).
pub fn host_monotonic_us() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` into `now`, which outlives the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    secs * 1_000_000 + nanos / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_clock_is_the_clock_under_instant() {
        // Bracketed reads of one clock: the host interval lies between the inner and the
        // outer `Instant` interval however long the thread is descheduled between reads.
        let outer = std::time::Instant::now();
        let a = host_monotonic_us();
        let inner = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let inner_us = inner.elapsed().as_micros() as u64;
        let b = host_monotonic_us();
        let outer_us = outer.elapsed().as_micros() as u64;
        assert!(a > 0 && inner_us >= 5000, "{a} {inner_us}");
        // 1 µs: each side is truncated to whole microseconds.
        assert!(
            inner_us <= b - a + 1 && b - a <= outer_us + 1,
            "{inner_us} <= {} <= {outer_us}",
            b - a
        );
    }
}
