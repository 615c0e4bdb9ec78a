//! D, the consumer child of a run: registers the destination pages, tracks the one pushed
//! request with the shipped consumer (the glue's [`Consumer`], i.e. the
//! `kvdrain_driver::consumer::ConsumerDriver` over NIXL, P as a one-rank producer engine:
//! one named edge), watches the pages, and once the driver releases the blocks overwrites
//! them with reuse stamps.
//!
//! Drive loop (every 200 µs): one [`Consumer::poll`]: notifications into the core,
//! heartbeats to P every `lease / 6` = 20 ms while the request waits (a failed one is
//! the driver's peer-death probe: it reports P gone to the core at once, P's edge fails and
//! its blocks settle for `settle_ms`), the clock, the decisions. No protocol rule is
//! written here: the experiment measures the driver and core that ship. The first failure
//! notice, disconnect or expiry is the run's *event*; D keeps watching until `observe_ms`
//! after the event and after the release.

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use kvdrain::{BlockHandle, Config, Outstanding};
use kvdrain_nixl::agent::UcxAgent;
use kvdrain_nixl::consumer::{
    BlockRelease, Consumer, ConsumerConfig, ReceiveSpec, RemoteProducer, TrackedRequest,
};
use kvdrain_nixl::testbed::{from_hex, to_hex};
use nixl_sys::AgentConfig;

use crate::clock::host_monotonic_us;
use crate::lines::{Fields, announce, expect_line};
use crate::spec::{REQUEST_ID, RunSpec, SLACK_PAGES, WRITE_PAGES};
use crate::stamp::StampedPages;
use crate::watch::Watch;

/// P's engine id as D's driver knows it.
const P_ENGINE: &str = "late-writes-p";
/// P's lease: the driver heartbeats every `lease / 6` = 20 ms.
const LEASE_MS: u64 = 120;
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(60);

/// The ledger's configuration for a run.
pub fn ledger_config(spec: &RunSpec) -> Config {
    Config {
        deadline: kvdrain::Duration::from_millis(spec.deadline_ms),
        quarantine: kvdrain::Duration::from_millis(spec.quarantine_ms),
        settle: kvdrain::Duration::from_millis(spec.settle_ms),
        ..Config::with_capacity(4)
    }
}

/// D's driver configuration for a run: one decode rank, the ledger of [`ledger_config`].
pub fn consumer_config(spec: &RunSpec) -> ConsumerConfig {
    ConsumerConfig {
        engine_id: format!("{}-d", spec.prefix),
        host: "127.0.0.1".into(),
        port: 0,
        tp_rank: 0,
        tp_size: 1,
        lease: kvdrain::Duration::from_millis(LEASE_MS),
        ledger: ledger_config(spec),
    }
}

/// What D saw of its request, in µs since the run's epoch, filled in by the driver's
/// decisions; a release overwrites the pages with reuse stamps at once.
struct Seen<'w> {
    epoch: Instant,
    watch: &'w Watch,
    /// The first failure event: `notice`, `disconnect` or `expiry`.
    event: &'static str,
    event_us: Option<u64>,
    completed_us: Option<u64>,
    failed_us: Option<u64>,
    expired_us: Option<u64>,
    released_us: Option<u64>,
    reused_us: Option<u64>,
    forced: bool,
}

impl Seen<'_> {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Now, noted as the run's event if it is the first; returns the time.
    fn event_at(&mut self, what: &'static str) -> u64 {
        let at = self.now_us();
        if self.event_us.is_none() {
            (self.event, self.event_us) = (what, Some(at));
            self.watch.mark_event(at);
        }
        at
    }
}

impl BlockRelease for Seen<'_> {
    fn decode(&mut self, _request: &TrackedRequest, _blocks: BlockHandle) {
        self.completed_us = Some(self.now_us());
    }

    fn release(&mut self, _request: &TrackedRequest, _blocks: BlockHandle, forced: bool) {
        // No event yet: a failure notice resolved the one edge (see `failed`).
        let _ = self.event_at("notice");
        self.forced = forced;
        self.released_us = Some(self.now_us());
        self.reused_us = Some(self.watch.reuse());
    }

    fn failed(&mut self, _request: &TrackedRequest) {
        // With no event yet the failure can only be P's failure notice, drained in this
        // round: a disconnect is marked when its round returns, before the driver reports
        // P gone in the next one, and an expiry is not a failure. Marked here, before the
        // release that may follow in the same round.
        self.failed_us = Some(self.event_at("notice"));
    }

    fn expired(&mut self, _request: &TrackedRequest, _outstanding: Outstanding) {
        self.expired_us = Some(self.event_at("expiry"));
    }
}

/// Runs D for `spec`: handshake over `input` / stdout, then one request to its end.
/// Hands the fields of the `D-RESULT` line to `publish` before tearing NIXL down (teardown
/// can hang after a peer died; the coordinator then kills the process).
///
/// # Errors
/// A message when NIXL or the handshake fails.
pub fn run(
    spec: &RunSpec,
    input: &Receiver<String>,
    publish: &dyn Fn(&Fields),
) -> Result<(), String> {
    let epoch = Instant::now();
    // The epoch on the host's clock: D's times plus this compare with P's.
    let epoch_mono_us = host_monotonic_us();
    let now_us = || epoch.elapsed().as_micros() as u64;
    let config = AgentConfig::default(); // progress thread on: bytes land while D sleeps
    let mut agent = UcxAgent::with_config(&format!("{}-d", spec.prefix), &config, &[])
        .map_err(|e| e.to_string())?;
    let pages = Arc::new(StampedPages::new(WRITE_PAGES + SLACK_PAGES));
    agent
        .register_dram(pages.region())
        .map_err(|e| e.to_string())?;
    let md = agent.local_metadata().map_err(|e| e.to_string())?;
    announce(&format!("D-READY {} {}", to_hex(&md), pages.addr(0)));
    let p_md = expect_line(input, "P-READY ", HANDSHAKE_LIMIT)?;
    let p_md = from_hex(&p_md).ok_or("P-READY: bad hex")?;
    // The shipped consumer: the glue's `Consumer` over this agent, i.e. the
    // `ConsumerDriver` over NIXL, with P as a producer engine of one rank.
    let mut consumer: Consumer<4, 1> = Consumer::new(agent, consumer_config(spec));
    consumer
        .add_producer_engine(
            RemoteProducer {
                engine_id: P_ENGINE.into(),
                host: "127.0.0.1".into(),
                port: 0,
                tp_size: 1,
                pp_size: 1,
                mla: false,
                agents: Vec::new(),
            },
            &[p_md],
        )
        .map_err(|e| e.to_string())?;
    // The deadline counts from now, not from the process start. The PUSH_REG it sends
    // goes to P, which ignores notifications.
    let now = consumer.now();
    let (mut engine, mut nixl) = consumer.engine();
    engine
        .register(
            &mut nixl,
            ReceiveSpec {
                id: REQUEST_ID,
                producer_engine: P_ENGINE,
                remote_request_id: REQUEST_ID,
                transfer_id: None,
                blocks: BlockHandle(0),
                block_ids: vec![Vec::new()],
                deadline: None,
            },
            now,
        )
        .map_err(|e| format!("register: {e}"))?;
    let watch = Watch::start(
        Arc::clone(&pages),
        spec.offset_pages,
        WRITE_PAGES,
        spec.generation,
        epoch,
    );
    announce("D-GO");

    let mut out = Fields::default();
    let mut seen = Seen {
        epoch,
        watch: &watch,
        event: "none",
        event_us: None,
        completed_us: None,
        failed_us: None,
        expired_us: None,
        released_us: None,
        reused_us: None,
        forced: false,
    };
    let (mut notice_us, mut disconnect_us) = (None::<u64>, None::<u64>);
    let limit = Duration::from_millis(spec.limit_ms());
    let observe = spec.observe_ms * 1000;
    loop {
        if epoch.elapsed() > limit {
            return Err(format!("D: no end after {limit:?}"));
        }
        // One driver round: P's completion or PUSH_FAIL in, heartbeats out (a failed one
        // reports P gone to the core at once), the clock, the decisions to `seen`.
        consumer.poll(&mut seen).map_err(|e| e.to_string())?;
        // What the round saw, from the counters. A failure notice decided the request
        // when it was drained (the event `failed` marked); one that came after another
        // event is noted now.
        if notice_us.is_none() && consumer.driver().core_counters().ingest.failure_notices > 0 {
            notice_us = match (seen.event, seen.event_us) {
                ("notice", Some(at)) => Some(at),
                _ => Some(now_us()),
            };
        }
        // When D learned P is gone: after the round whose heartbeat failed, before the
        // next round reports it to the core.
        if disconnect_us.is_none() && consumer.driver().counters().disconnects > 0 {
            disconnect_us = Some(seen.event_at("disconnect"));
        }
        let now = now_us();
        let done = match (seen.completed_us, seen.event_us, seen.reused_us) {
            (Some(c), _, _) => now >= c + 100_000,
            (None, Some(e), Some(r)) => now >= e + observe && now >= r + observe,
            _ => false,
        };
        if done {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let Seen {
        event,
        event_us,
        completed_us,
        failed_us,
        expired_us,
        released_us,
        forced,
        ..
    } = seen;
    let w = watch.finish();
    let rel = |t: Option<u64>| t.zip(event_us).map(|(t, e)| t.saturating_sub(e));
    // Gap from a milestone to the last landing: 0 when everything landed before it.
    let gap = |m: Option<u64>| m.map(|m| w.gap_after(m).unwrap_or(0));
    out.put(
        "outcome",
        if completed_us.is_some() {
            "completed"
        } else if failed_us.is_some() {
            "failed"
        } else if expired_us.is_some() {
            "expired"
        } else {
            "none"
        },
    )
    .put("event", event)
    .put_opt("notice_after_event_us", rel(notice_us))
    .put_opt("disconnect_after_event_us", rel(disconnect_us))
    .put_opt("released_after_event_us", rel(released_us))
    .put("forced_release", forced)
    .put("landed_pages_at_event", w.landed_at_event)
    .put("landed_pages_total", w.landed_total)
    .put("late_pages", w.late_pages)
    .put_opt(
        "last_landing_from_mono_us",
        w.last_landing_us.map(|(from, _)| epoch_mono_us + from),
    )
    .put_opt(
        "last_landing_to_mono_us",
        w.last_landing_us.map(|(_, to)| epoch_mono_us + to),
    )
    .put_opt("gap_after_event_us", gap(event_us))
    .put_opt("gap_after_notice_us", gap(notice_us))
    .put_opt("gap_after_disconnect_us", gap(disconnect_us))
    .put_opt("gap_after_expiry_us", gap(expired_us))
    .put_opt("gap_after_release_us", gap(released_us))
    .put("violation_pages", w.violation_pages)
    .put_opt("last_violation_after_release_us", w.last_violation_us)
    .put("scans", w.scans)
    .put("scan_p50_us", w.scan_p50_us)
    .put("scan_max_us", w.scan_max_us);
    publish(&out);
    // The agent (and its registration) outlive the watcher, which reads the pages.
    drop(consumer);
    Ok(())
}
