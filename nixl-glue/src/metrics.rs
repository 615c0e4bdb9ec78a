//! Metrics: the core's counters and the glue's, under names modelled on vLLM's NIXL
//! connector metrics (`vllm:nixl_num_failed_transfers`, …), one counter per cause (catalogue
//! F15: transfer failures are never mixed with expiries), plus the notification → decision
//! latency.

use std::fmt::Write as _;
use std::time::Duration;

use kvdrain::Counters;

/// One exported sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    /// Metric name, e.g. `kvdrain:nixl_num_failed_transfers`.
    pub name: &'static str,
    /// One-line help text.
    pub help: &'static str,
    /// An optional `(label, value)` pair.
    pub label: Option<(&'static str, &'static str)>,
    /// The value.
    pub value: f64,
}

const fn counter(name: &'static str, help: &'static str, value: u64) -> Metric {
    Metric {
        name,
        help,
        label: None,
        value: value as f64,
    }
}

const fn labelled(
    name: &'static str,
    help: &'static str,
    label: (&'static str, &'static str),
    value: u64,
) -> Metric {
    Metric {
        name,
        help,
        label: Some(label),
        value: value as f64,
    }
}

/// The core's counters of one consumer rank.
pub fn core_metrics(c: &Counters) -> Vec<Metric> {
    let (i, e) = (&c.ingest, &c.engine);
    const IGNORED: &str = "kvdrain:nixl_num_ignored_notifications";
    const IGNORED_HELP: &str = "Notifications that changed nothing, by reason";
    const REJECTED: &str = "kvdrain:nixl_num_rejected_registrations";
    const REJECTED_HELP: &str = "Registrations the tracker refused, by reason";
    const RELEASED: &str = "kvdrain:nixl_num_released_reqs";
    const RELEASED_HELP: &str = "Requests whose blocks were given back for reuse";
    vec![
        counter(
            "kvdrain:nixl_num_registered_reqs",
            "Requests registered for pushed KV",
            e.registered,
        ),
        counter(
            "kvdrain:nixl_num_completed_reqs",
            "Requests whose every write landed (decode may start)",
            e.completed,
        ),
        counter(
            "kvdrain:nixl_num_failed_transfers",
            "Requests failed by a transfer failure (PUSH_FAIL or fence); not expiries",
            e.failed,
        ),
        counter(
            "kvdrain:nixl_num_kv_expired_reqs",
            "Requests whose deadline passed with writes outstanding",
            e.expired,
        ),
        counter(
            "kvdrain:nixl_num_aborted_reqs",
            "Requests aborted by the engine while writes were outstanding",
            e.aborted,
        ),
        labelled(RELEASED, RELEASED_HELP, ("forced", "false"), e.released),
        labelled(
            RELEASED,
            RELEASED_HELP,
            ("forced", "true"),
            e.released_forced,
        ),
        counter(
            "kvdrain:nixl_num_fenced_edges",
            "Producer edges resolved as failed by a fence",
            e.fenced_edges,
        ),
        labelled(REJECTED, REJECTED_HELP, ("reason", "full"), e.rejected_full),
        labelled(
            REJECTED,
            REJECTED_HELP,
            ("reason", "duplicate_id"),
            e.rejected_duplicate_id,
        ),
        labelled(
            REJECTED,
            REJECTED_HELP,
            ("reason", "invalid"),
            e.rejected_invalid,
        ),
        counter(
            "kvdrain:nixl_num_completions",
            "Completion notifications that resolved an edge",
            i.completions,
        ),
        counter(
            "kvdrain:nixl_num_failure_notices",
            "PUSH_FAIL notices that resolved an edge",
            i.failure_notices,
        ),
        labelled(IGNORED, IGNORED_HELP, ("reason", "malformed"), i.malformed),
        labelled(
            IGNORED,
            IGNORED_HELP,
            ("reason", "not_for_consumer"),
            i.not_for_consumer,
        ),
        labelled(IGNORED, IGNORED_HELP, ("reason", "unknown"), i.unknown),
        labelled(IGNORED, IGNORED_HELP, ("reason", "late"), i.late),
        labelled(IGNORED, IGNORED_HELP, ("reason", "duplicate"), i.duplicate),
        labelled(
            IGNORED,
            IGNORED_HELP,
            ("reason", "unexpected_sender"),
            i.unexpected_sender,
        ),
    ]
}

/// Latency samples (kept up to a cap; later samples still count but are not stored).
#[derive(Clone, Debug, Default)]
pub struct Latency {
    samples: Vec<u64>,
    count: u64,
    sorted: bool,
}

impl Latency {
    /// Samples kept for percentiles.
    pub const KEPT: usize = 1 << 20;

    /// Records one sample.
    pub fn record(&mut self, d: Duration) {
        self.count += 1;
        if self.samples.len() < Self::KEPT {
            self.samples
                .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            self.sorted = false;
        }
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `q`-quantile (`0.0..=1.0`, nearest rank) of the kept samples.
    pub fn quantile(&mut self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        if !self.sorted {
            self.samples.sort_unstable();
            self.sorted = true;
        }
        let rank = (q.clamp(0.0, 1.0) * self.samples.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.samples.len()) - 1;
        Some(Duration::from_nanos(self.samples[i]))
    }

    /// The latency as a summary (`quantile` 0.5 and 0.99, in seconds).
    pub fn metrics(&mut self, name: &'static str, help: &'static str) -> Vec<Metric> {
        let q = |this: &mut Self, q| this.quantile(q).map_or(0.0, |d| d.as_secs_f64());
        vec![
            Metric {
                name,
                help,
                label: Some(("quantile", "0.5")),
                value: q(self, 0.5),
            },
            Metric {
                name,
                help,
                label: Some(("quantile", "0.99")),
                value: q(self, 0.99),
            },
        ]
    }
}

/// Prometheus text exposition (`# HELP` once per name, then one line per sample).
pub fn render(metrics: &[Metric]) -> String {
    let mut out = String::new();
    let mut last = "";
    for m in metrics {
        if m.name != last {
            let _ = writeln!(out, "# HELP {} {}", m.name, m.help);
            last = m.name;
        }
        match m.label {
            Some((k, v)) => {
                let _ = writeln!(out, "{}{{{k}=\"{v}\"}} {}", m.name, m.value);
            }
            None => {
                let _ = writeln!(out, "{} {}", m.name, m.value);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_and_expiries_are_apart_and_render() {
        let mut c = Counters::default();
        c.engine.failed = 3;
        c.engine.expired = 5;
        let m = core_metrics(&c);
        let text = render(&m);
        assert!(text.contains("kvdrain:nixl_num_failed_transfers 3\n"));
        assert!(text.contains("kvdrain:nixl_num_kv_expired_reqs 5\n"));
        assert!(text.contains("kvdrain:nixl_num_ignored_notifications{reason=\"late\"} 0\n"));
        assert_eq!(
            text.matches("# HELP kvdrain:nixl_num_ignored_notifications")
                .count(),
            1
        );
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut l = Latency::default();
        assert_eq!(l.quantile(0.5), None);
        for us in 1..=100 {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.quantile(0.5), Some(Duration::from_micros(50)));
        assert_eq!(l.quantile(0.99), Some(Duration::from_micros(99)));
        assert_eq!(l.quantile(1.0), Some(Duration::from_micros(100)));
    }
}
