//! The demo's progress bar, latency percentiles and summary table.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::ProgressBar;

/// What a demo run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// How the bytes moved.
    pub transport: String,
    /// Requests pushed.
    pub requests: u64,
    /// `completed` (every write landed and the bytes were checked).
    pub completed: u64,
    /// `failed` (a producer sent `PUSH_FAIL`).
    pub failed: u64,
    /// `expired` (deadline passed).
    pub expired: u64,
    /// Releases forced by the quarantine running out.
    pub forced: u64,
    /// Completed requests whose blocks did not hold the expected bytes.
    pub corrupt: u64,
    /// Requests that never reached a decision.
    pub unfinished: u64,
    /// Bytes of writes that landed.
    pub bytes: u64,
    /// Completion notices counted by the tracker.
    pub completions: u64,
    /// `PUSH_FAIL` notices counted by the tracker.
    pub failure_notices: u64,
    /// Notification → decision latency.
    pub latency: Percentiles,
    /// With a pump thread: drain → the decision point in the ingest half (kvdrain's own
    /// part, before the hand-off to the engine thread); `None` without one.
    pub ingest_latency: Option<Percentiles>,
    /// With a pump thread: the decision point in the ingest half → the engine thread
    /// pulled the decision (the hand-off between the two threads); `None` without one.
    pub handoff_latency: Option<Percentiles>,
    /// The producers offered the request (prefill done, source blocks written) → its
    /// decision was handed to the engine: the producers' tick, NIXL's write and
    /// notification delivery, and kvdrain; `None` where not measured.
    pub end_to_end: Option<Percentiles>,
    /// The request's last write was posted → its decision was handed to the engine:
    /// NIXL's write and notification delivery, the pump's drain, and kvdrain; `None`
    /// where not measured.
    pub post_to_decision: Option<Percentiles>,
    /// Wall time of the run.
    pub wall: Duration,
    /// The metrics exposition (OpenMetrics text; empty where the transport has none).
    pub metrics: String,
}

/// Latency percentiles read from an HDR histogram of nanoseconds (`None` when empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<Duration>,
    /// 99th percentile.
    pub p99: Option<Duration>,
    /// 99.9th percentile.
    pub p999: Option<Duration>,
    /// Largest sample.
    pub max: Option<Duration>,
}

impl Percentiles {
    /// Of `histogram` (values in nanoseconds).
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        if histogram.is_empty() {
            return Percentiles::default();
        }
        let at = |q: f64| Some(Duration::from_nanos(histogram.value_at_quantile(q)));
        Percentiles {
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
            max: Some(Duration::from_nanos(histogram.max())),
        }
    }
}

/// An empty histogram for latencies in nanoseconds (1 ns to an hour, 3 significant
/// digits); record with `saturating_record`.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

impl Summary {
    /// Every request ended and every completed one held its bytes.
    pub fn ok(&self) -> bool {
        self.corrupt == 0
            && self.unfinished == 0
            && self.completed + self.failed + self.expired == self.requests
    }
}

fn micros(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.1} µs", d.as_secs_f64() * 1e6),
    )
}

fn quantiles(l: Percentiles) -> String {
    format!(
        "p50 {}   p99 {}   p99.9 {}   max {}",
        micros(l.p50),
        micros(l.p99),
        micros(l.p999),
        micros(l.max)
    )
}

/// `a − b`, where both are known (the same quantile of two histograms: an estimate).
fn minus(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    Some(a?.saturating_sub(b?))
}

fn per_sec(n: f64, wall: Duration) -> f64 {
    n / wall.as_secs_f64().max(1e-9)
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let notices = (self.completions + self.failure_notices) as f64;
        let rows: [(&str, String); 16] = [
            ("transport", self.transport.clone()),
            ("requests", self.requests.to_string()),
            ("completed", format!("{} (bytes checked)", self.completed)),
            (
                "failed",
                format!("{} (PUSH_FAIL from a producer)", self.failed),
            ),
            ("expired", self.expired.to_string()),
            (
                "notices",
                format!(
                    "{} completions + {} PUSH_FAIL",
                    self.completions, self.failure_notices
                ),
            ),
            (
                "bytes moved",
                format!("{:.1} MiB", self.bytes as f64 / (1 << 20) as f64),
            ),
            (
                "offer → decision",
                match self.end_to_end {
                    Some(l) => format!("{} (end to end)", quantiles(l)),
                    None => "(not measured)".to_owned(),
                },
            ),
            (
                "post → decision",
                match self.post_to_decision {
                    Some(l) => format!("{} (last write posted → pulled)", quantiles(l)),
                    None => "(not measured)".to_owned(),
                },
            ),
            (
                "  NIXL delivery",
                match self.post_to_decision {
                    // Two histograms: only the medians subtract to a fair estimate.
                    Some(l) => format!(
                        "≈ p50 {} (post → decision − notification → decision, medians)",
                        micros(minus(l.p50, self.latency.p50)),
                    ),
                    None => "-".to_owned(),
                },
            ),
            (
                "notification → decision",
                format!("{} (drained → pulled)", quantiles(self.latency)),
            ),
            (
                "  ingest half",
                match self.ingest_latency {
                    Some(l) => format!("{} (drained → decided, pump thread)", quantiles(l)),
                    None => "(no pump thread)".to_owned(),
                },
            ),
            (
                "  hand-off",
                match self.handoff_latency {
                    Some(l) => format!("{} (decided → pulled, engine thread)", quantiles(l)),
                    None => "(no pump thread)".to_owned(),
                },
            ),
            (
                "throughput",
                format!(
                    "{:.0} req/s   {:.0} notices/s   {:.1} MiB/s",
                    per_sec(self.requests as f64, self.wall),
                    per_sec(notices, self.wall),
                    per_sec(self.bytes as f64 / (1 << 20) as f64, self.wall)
                ),
            ),
            ("wall time", format!("{:.2} s", self.wall.as_secs_f64())),
            (
                "problems",
                if self.ok() {
                    "none".to_owned()
                } else {
                    format!(
                        "{} corrupt, {} unfinished, {} forced releases",
                        self.corrupt, self.unfinished, self.forced
                    )
                },
            ),
        ];
        writeln!(f)?;
        writeln!(f, "  {:-<26}+{:-<52}", "", "")?;
        for (k, v) in rows {
            writeln!(f, "  {k:<25} | {v}")?;
        }
        writeln!(f, "  {:-<26}+{:-<52}", "", "")
    }
}

/// The demo's progress bar (indicatif): drawn on standard error when it is a terminal,
/// silent otherwise.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for `total` requests.
    pub fn new(total: u64) -> Self {
        Progress {
            bar: crate::progress::bar(total, "requests"),
        }
    }

    /// `done` requests decided so far.
    pub fn update(&mut self, done: u64) {
        self.bar.set_position(done);
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Percentiles, latency_histogram};

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut h = latency_histogram();
        assert_eq!(Percentiles::of(&h), Percentiles::default());
        for us in 1..=1000 {
            h.saturating_record(us * 1000);
        }
        let p = Percentiles::of(&h);
        let near = |d: Option<Duration>, us: u64| {
            let ns = d.map_or(0, |d| d.as_nanos() as u64);
            ns.abs_diff(us * 1000) <= us // within 0.1 %
        };
        assert!(near(p.p50, 500), "{p:?}");
        assert!(near(p.p99, 990), "{p:?}");
        assert!(near(p.p999, 999), "{p:?}");
        assert!(near(p.max, 1000), "{p:?}");
    }
}
