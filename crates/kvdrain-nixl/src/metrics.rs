//! Metrics: the core's counters and the glue's, as one `prometheus-client` registry that an
//! engine hands in ([`Metrics::register`]) or scrapes ([`Metrics::encode`], OpenMetrics
//! text), plus the notification → decision latency ([`Latency`], an HDR histogram).
//!
//! Names are modelled on vLLM's NIXL connector metrics (`vllm:nixl_num_failed_transfers`,
//! …). Each is defined once, here, with one meaning; a transfer failure is never mixed with
//! an expiry (catalogue F15). Counters get OpenMetrics' `_total` suffix in the exposition.
//! The values are snapshots: the glue keeps plain counters on its paths and
//! [`Metrics::observe_consumer`] / [`Metrics::observe_producers`] copy them in before a
//! scrape, so nothing is added to the hot path.
//!
//! | name | labels | meaning |
//! | --- | --- | --- |
//! | `kvdrain:nixl_num_registered_reqs` | | requests a consumer registered for pushed KV |
//! | `kvdrain:nixl_num_completed_reqs` | | requests whose every write landed (decode may start) |
//! | `kvdrain:nixl_num_failed_reqs` | | requests failed because a write did not land (`PUSH_FAIL`, a producer gone, or a fence); not expiries, not aborts |
//! | `kvdrain:nixl_num_kv_expired_reqs` | | requests whose deadline passed with writes outstanding |
//! | `kvdrain:nixl_num_aborted_reqs` | | requests the engine aborted while writes were outstanding |
//! | `kvdrain:nixl_num_released_reqs` | `forced` | requests whose blocks were given back for reuse (`forced="true"`: the quarantine ran out) |
//! | `kvdrain:nixl_num_fenced_edges` | | producer edges resolved as failed by a fence (the transport proved nothing more lands) |
//! | `kvdrain:nixl_num_gone_edges` | | producer edges resolved as failed because their producer was seen gone (they settle) |
//! | `kvdrain:nixl_num_rejected_registrations` | `reason` | registrations the tracker refused (`full`, `duplicate_id`, `invalid`) |
//! | `kvdrain:nixl_num_completions` | | completion notifications that resolved an edge |
//! | `kvdrain:nixl_num_failure_notices` | | `PUSH_FAIL` notices that resolved an edge (consumer) |
//! | `kvdrain:nixl_num_ignored_notifications` | `side`, `reason` | notifications that changed nothing: consumer reasons as in the trace spec; producer reason `not_for_producer` |
//! | `kvdrain:nixl_num_sent_notifications` | `side`, `kind` | notifications sent: consumer `push_reg`, `heartbeat`; producer `push_fail` |
//! | `kvdrain:nixl_num_failed_notifications` | `side`, `kind` | notifications that could not be sent (same kinds) |
//! | `kvdrain:nixl_num_producer_disconnects` | | producer agents a consumer found disconnected and reported gone |
//! | `kvdrain:nixl_num_notifications_from_strangers` | | notifications from agents never introduced |
//! | `kvdrain:nixl_notif_to_decision_seconds` | (histogram) | time from draining the deciding notification to handing its decision to the engine |
//! | `kvdrain:nixl_num_registrations` | `outcome` | `PUSH_REG` received by producers (`decoded`, `malformed`, `duplicate`, `dropped`, `retired`) |
//! | `kvdrain:nixl_num_heartbeats` | | heartbeat ids producers passed to the engine |
//! | `kvdrain:nixl_num_posted_writes` | | writes posted |
//! | `kvdrain:nixl_num_landed_writes` | | writes that landed |
//! | `kvdrain:nixl_num_failed_transfers` | `cause` | writes that did not land, or not known to: `post` (could not be described or posted, C2), `after_post` (a backend error after posting, F7), `status_unknown` (NIXL lost the handle's status: no `PUSH_FAIL`, sources stay fenced, F7), `handshake` (F8) |
//! | `kvdrain:nixl_num_expired_leases` | | producer leases that ran out with no write in flight (the sources went back) |
//! | `kvdrain:nixl_num_released_sources` | | requests whose source blocks producers handed back |
//! | `kvdrain:nixl_num_unplannable_registrations` | | registrations whose topology could not be planned |
//!
//! `side` is `consumer` or `producer`. Producer figures are summed over the ranks passed
//! to [`Metrics::observe_producers`].

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use kvdrain::Counters;
use kvdrain_driver::consumer::ConsumerCounters;
use kvdrain_driver::producer::ProducerCounters;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;
type Counters_ = Family<Labels, Counter>;

/// Every kvdrain metric, registered under the names listed in the module doc. Cheap to
/// clone: clones share the values.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    registered: Counter,
    completed: Counter,
    failed_reqs: Counter,
    expired: Counter,
    aborted: Counter,
    released: Counters_,
    fenced_edges: Counter,
    gone_edges: Counter,
    rejected: Counters_,
    completions: Counter,
    failure_notices: Counter,
    ignored: Counters_,
    sent: Counters_,
    unsent: Counters_,
    disconnects: Counter,
    from_strangers: Counter,
    latency: SharedLatency,
    registrations: Counters_,
    heartbeats: Counter,
    posted: Counter,
    landed: Counter,
    failed_transfers: Counters_,
    released_sources: Counter,
    unplannable: Counter,
    expired_leases: Counter,
}

fn set(counter: &Counter, value: u64) {
    counter.inner().store(value, Ordering::Relaxed);
}

fn set_in(family: &Counters_, labels: &[(&'static str, &'static str)], value: u64) {
    set(&family.get_or_create(&labels.to_vec()), value);
}

impl Metrics {
    /// All metrics at zero, registered nowhere yet.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Registers every metric in `registry` (an engine's, or a fresh one).
    pub fn register(&self, registry: &mut Registry) {
        let m = self.clone();
        let counters: [(&str, &str, Counter); 17] = [
            (
                "kvdrain:nixl_num_registered_reqs",
                "Requests a consumer registered for pushed KV",
                m.registered,
            ),
            (
                "kvdrain:nixl_num_completed_reqs",
                "Requests whose every write landed (decode may start)",
                m.completed,
            ),
            (
                "kvdrain:nixl_num_failed_reqs",
                "Requests failed because a write did not land (PUSH_FAIL or fence); not expiries, not aborts",
                m.failed_reqs,
            ),
            (
                "kvdrain:nixl_num_kv_expired_reqs",
                "Requests whose deadline passed with writes outstanding",
                m.expired,
            ),
            (
                "kvdrain:nixl_num_aborted_reqs",
                "Requests the engine aborted while writes were outstanding",
                m.aborted,
            ),
            (
                "kvdrain:nixl_num_fenced_edges",
                "Producer edges resolved as failed by a fence",
                m.fenced_edges,
            ),
            (
                "kvdrain:nixl_num_gone_edges",
                "Producer edges resolved as failed because their producer was seen gone",
                m.gone_edges,
            ),
            (
                "kvdrain:nixl_num_completions",
                "Completion notifications that resolved an edge",
                m.completions,
            ),
            (
                "kvdrain:nixl_num_failure_notices",
                "PUSH_FAIL notices that resolved an edge",
                m.failure_notices,
            ),
            (
                "kvdrain:nixl_num_producer_disconnects",
                "Producer agents a consumer found disconnected and reported gone",
                m.disconnects,
            ),
            (
                "kvdrain:nixl_num_notifications_from_strangers",
                "Notifications from agents never introduced",
                m.from_strangers,
            ),
            (
                "kvdrain:nixl_num_heartbeats",
                "Heartbeat ids producers passed to the engine",
                m.heartbeats,
            ),
            ("kvdrain:nixl_num_posted_writes", "Writes posted", m.posted),
            (
                "kvdrain:nixl_num_landed_writes",
                "Writes that landed",
                m.landed,
            ),
            (
                "kvdrain:nixl_num_released_sources",
                "Requests whose source blocks producers handed back",
                m.released_sources,
            ),
            (
                "kvdrain:nixl_num_unplannable_registrations",
                "Registrations whose topology could not be planned",
                m.unplannable,
            ),
            (
                "kvdrain:nixl_num_expired_leases",
                "Producer leases that ran out with no write in flight",
                m.expired_leases,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter);
        }
        let families: [(&str, &str, Counters_); 7] = [
            (
                "kvdrain:nixl_num_released_reqs",
                "Requests whose blocks were given back for reuse, by whether the quarantine forced it",
                m.released,
            ),
            (
                "kvdrain:nixl_num_rejected_registrations",
                "Registrations the tracker refused, by reason",
                m.rejected,
            ),
            (
                "kvdrain:nixl_num_ignored_notifications",
                "Notifications that changed nothing, by side and reason",
                m.ignored,
            ),
            (
                "kvdrain:nixl_num_sent_notifications",
                "Notifications sent, by side and kind",
                m.sent,
            ),
            (
                "kvdrain:nixl_num_failed_notifications",
                "Notifications that could not be sent, by side and kind",
                m.unsent,
            ),
            (
                "kvdrain:nixl_num_registrations",
                "PUSH_REG received by producers, by outcome",
                m.registrations,
            ),
            (
                "kvdrain:nixl_num_failed_transfers",
                "Writes that did not land, by cause",
                m.failed_transfers,
            ),
        ];
        for (name, help, family) in families {
            registry.register(name, help, family);
        }
        registry.register(
            "kvdrain:nixl_notif_to_decision_seconds",
            "Time from draining the deciding notification to handing its decision to the engine",
            m.latency,
        );
    }

    /// The exposition of these metrics alone (OpenMetrics text, ending in `# EOF`).
    pub fn encode(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }

    /// Copies one consumer rank's figures in: the core's counters, the glue's, and the
    /// latency histogram.
    pub fn observe_consumer(&self, core: &Counters, glue: &ConsumerCounters, latency: &Latency) {
        let (i, e) = (&core.ingest, &core.engine);
        set(&self.registered, e.registered);
        set(&self.completed, e.completed);
        set(&self.failed_reqs, e.failed);
        set(&self.expired, e.expired);
        set(&self.aborted, e.aborted);
        set_in(&self.released, &[("forced", "false")], e.released);
        set_in(&self.released, &[("forced", "true")], e.released_forced);
        set(&self.fenced_edges, e.fenced_edges);
        set(&self.gone_edges, e.gone_edges);
        for (reason, n) in [
            ("full", e.rejected_full),
            ("duplicate_id", e.rejected_duplicate_id),
            ("invalid", e.rejected_invalid),
        ] {
            set_in(&self.rejected, &[("reason", reason)], n);
        }
        set(&self.completions, i.completions);
        set(&self.failure_notices, i.failure_notices);
        for (reason, n) in [
            ("malformed", i.malformed),
            ("not_for_consumer", i.not_for_consumer),
            ("unknown", i.unknown),
            ("late", i.late),
            ("duplicate", i.duplicate),
            ("unexpected_sender", i.unexpected_sender),
        ] {
            set_in(
                &self.ignored,
                &[("side", "consumer"), ("reason", reason)],
                n,
            );
        }
        for (kind, sent, unsent) in [
            (
                "push_reg",
                glue.registrations_sent,
                glue.registrations_failed,
            ),
            ("heartbeat", glue.heartbeats_sent, glue.heartbeats_failed),
        ] {
            let labels = [("side", "consumer"), ("kind", kind)];
            set_in(&self.sent, &labels, sent);
            set_in(&self.unsent, &labels, unsent);
        }
        set(&self.disconnects, glue.disconnects);
        set(&self.from_strangers, glue.from_strangers);
        *self.latency.lock() = latency.clone();
    }

    /// Copies the figures of every producer rank in, summed.
    pub fn observe_producers<'a>(&self, ranks: impl IntoIterator<Item = &'a ProducerCounters>) {
        let mut sum = ProducerCounters::default();
        for c in ranks {
            sum.registrations += c.registrations;
            sum.registrations_malformed += c.registrations_malformed;
            sum.registrations_duplicate += c.registrations_duplicate;
            sum.registrations_dropped += c.registrations_dropped;
            sum.registrations_retired += c.registrations_retired;
            sum.heartbeats += c.heartbeats;
            sum.ignored += c.ignored;
            sum.posted += c.posted;
            sum.landed += c.landed;
            sum.post_failures += c.post_failures;
            sum.failed_after_post += c.failed_after_post;
            sum.handshake_failures += c.handshake_failures;
            sum.notices_sent += c.notices_sent;
            sum.notices_unsendable += c.notices_unsendable;
            sum.released += c.released;
            sum.unplannable += c.unplannable;
            sum.status_unknown += c.status_unknown;
            sum.leases_expired += c.leases_expired;
        }
        let c = sum;
        for (outcome, n) in [
            ("decoded", c.registrations),
            ("malformed", c.registrations_malformed),
            ("duplicate", c.registrations_duplicate),
            ("dropped", c.registrations_dropped),
            ("retired", c.registrations_retired),
        ] {
            set_in(&self.registrations, &[("outcome", outcome)], n);
        }
        set(&self.heartbeats, c.heartbeats);
        set_in(
            &self.ignored,
            &[("side", "producer"), ("reason", "not_for_producer")],
            c.ignored,
        );
        set(&self.posted, c.posted);
        set(&self.landed, c.landed);
        for (cause, n) in [
            ("post", c.post_failures),
            ("after_post", c.failed_after_post),
            ("status_unknown", c.status_unknown),
            ("handshake", c.handshake_failures),
        ] {
            set_in(&self.failed_transfers, &[("cause", cause)], n);
        }
        let labels = [("side", "producer"), ("kind", "push_fail")];
        set_in(&self.sent, &labels, c.notices_sent);
        set_in(&self.unsent, &labels, c.notices_unsendable);
        set(&self.released_sources, c.released);
        set(&self.unplannable, c.unplannable);
        set(&self.expired_leases, c.leases_expired);
    }
}

/// Notification → decision latency: an HDR histogram of nanoseconds (1 ns to 60 s, three
/// significant digits) and the exact sum.
#[derive(Clone, Debug)]
pub struct Latency {
    histogram: Histogram<u64>,
    sum_ns: u64,
}

impl Default for Latency {
    fn default() -> Self {
        let histogram = Histogram::new_with_bounds(1, Latency::HIGHEST_NS, 3)
            .or_else(|_| Histogram::new(3))
            .unwrap_or_else(|e| unreachable!("valid HDR histogram bounds: {e}"));
        Latency {
            histogram,
            sum_ns: 0,
        }
    }
}

impl Latency {
    /// Largest latency told apart (longer ones count as this).
    pub const HIGHEST_NS: u64 = 60_000_000_000;

    /// Records one sample.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(ns);
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The `q`-quantile (`0.0..=1.0`), to three significant digits; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        (!self.histogram.is_empty())
            .then(|| Duration::from_nanos(self.histogram.value_at_quantile(q.clamp(0.0, 1.0))))
    }

    /// The largest sample, to three significant digits; `None` when empty.
    pub fn max(&self) -> Option<Duration> {
        (!self.histogram.is_empty()).then(|| Duration::from_nanos(self.histogram.max()))
    }

    /// The histogram itself (nanoseconds).
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.histogram
    }
}

/// Upper bounds (seconds) of the exposition's histogram buckets; `+Inf` follows.
const BUCKETS_S: [f64; 18] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1, 1.0, 10.0,
];

/// The latency as the registry sees it: the last observed [`Latency`], exposed as an
/// OpenMetrics histogram.
#[derive(Clone, Debug, Default)]
struct SharedLatency(Arc<Mutex<Latency>>);

impl SharedLatency {
    fn lock(&self) -> std::sync::MutexGuard<'_, Latency> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl TypedMetric for SharedLatency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for SharedLatency {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), fmt::Error> {
        let latency = self.lock().clone();
        let mut buckets: Vec<(f64, u64)> = BUCKETS_S.iter().map(|&b| (b, 0)).collect();
        buckets.push((f64::INFINITY, 0));
        for v in latency.histogram.iter_recorded() {
            let seconds = v.value_iterated_to() as f64 * 1e-9;
            let i = BUCKETS_S
                .iter()
                .position(|&b| seconds <= b)
                .unwrap_or(BUCKETS_S.len());
            buckets[i].1 += v.count_at_value();
        }
        encoder.encode_histogram::<NoLabelSet>(
            latency.sum_ns as f64 * 1e-9,
            latency.count(),
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_and_expiries_are_apart_and_every_name_once() {
        let mut c = Counters::default();
        c.engine.failed = 3;
        c.engine.expired = 5;
        let m = Metrics::new();
        let mut latency = Latency::default();
        latency.record(Duration::from_micros(30));
        m.observe_consumer(&c, &ConsumerCounters::default(), &latency);
        let p = ProducerCounters {
            post_failures: 2,
            ..ProducerCounters::default()
        };
        m.observe_producers([&p, &p]);
        let text = m.encode();
        assert!(
            text.contains("kvdrain:nixl_num_failed_reqs_total 3\n"),
            "{text}"
        );
        assert!(text.contains("kvdrain:nixl_num_kv_expired_reqs_total 5\n"));
        assert!(text.contains("kvdrain:nixl_num_failed_transfers_total{cause=\"post\"} 4\n"));
        assert!(text.contains(
            "kvdrain:nixl_num_ignored_notifications_total{side=\"consumer\",reason=\"late\"} 0\n"
        ));
        assert!(text.contains("kvdrain:nixl_notif_to_decision_seconds_count 1\n"));
        assert!(
            text.contains("kvdrain:nixl_notif_to_decision_seconds_bucket{le=\"5e-5\"} 1\n")
                || text
                    .contains("kvdrain:nixl_notif_to_decision_seconds_bucket{le=\"0.00005\"} 1\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap_or_default())
            .collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "a family declared twice");
        assert_eq!(all, 25);
    }

    #[test]
    fn an_engine_hands_in_its_registry() {
        let mut registry = Registry::default();
        let engine_counter = Counter::<u64>::default();
        registry.register(
            "vllm:num_requests_running",
            "The engine's own",
            engine_counter,
        );
        let m = Metrics::new();
        m.register(&mut registry);
        let mut c = Counters::default();
        c.engine.completed = 7;
        // Observed after registration: the registry sees the shared values.
        m.observe_consumer(&c, &ConsumerCounters::default(), &Latency::default());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains("# TYPE vllm:num_requests_running counter\n"));
        assert!(
            text.contains("kvdrain:nixl_num_completed_reqs_total 7\n"),
            "{text}"
        );
        assert!(text.contains("kvdrain:nixl_notif_to_decision_seconds_count 0\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
    }

    #[test]
    fn quantiles_to_three_digits() {
        let mut l = Latency::default();
        assert_eq!(l.quantile(0.5), None);
        for us in 1..=100 {
            l.record(Duration::from_micros(us));
        }
        let near = |d: Option<Duration>, us: u64| {
            d.is_some_and(|d| (d.as_nanos() as u64).abs_diff(us * 1000) <= us)
        };
        assert!(near(l.quantile(0.5), 50));
        assert!(near(l.quantile(0.99), 99));
        assert!(near(l.quantile(1.0), 100));
        assert!(near(l.max(), 100));
        assert_eq!(l.count(), 100);
    }
}
