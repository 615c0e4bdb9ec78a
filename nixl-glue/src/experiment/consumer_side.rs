//! D, the consumer child of a run: registers the destination pages, tracks the one pushed
//! request in a kvdrain [`Ledger`] (one named edge: P's agent), watches the pages, and once
//! the ledger says `Released` overwrites them with reuse stamps.
//!
//! Drive loop (every 200 µs): drain notifications into the ledger; heartbeat P every 20 ms;
//! when a send fails (the transport says P is gone) report it to the ledger with
//! [`gone`](Ledger::gone) at once, as the consumer driver does: P's edge fails now and its
//! blocks settle for `settle_ms` (no copy of that rule here); `advance` the clock; pull
//! every decision ([`poll_decision`](Ledger::poll_decision)). The first failure notice,
//! disconnect or expiry is the run's *event*; D keeps watching until `observe_ms` after
//! the event and after the release.

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use kvdrain::{AgentId, BlockHandle, Config, Decision, Expect, Ledger, Registration, wire};
use nixl_sys::AgentConfig;

use super::lines::{Fields, announce, expect_line};
use super::spec::{REQUEST_ID, RunSpec, SLACK_PAGES, WRITE_PAGES};
use super::stamp::StampedPages;
use super::watch::Watch;

use crate::agent::UcxAgent;
use crate::testbed::{from_hex, to_hex};

const P_AGENT: AgentId = AgentId(0);
const HEARTBEAT: Duration = Duration::from_millis(20);
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(60);

/// The ledger's configuration for a run.
pub fn ledger_config(spec: &RunSpec) -> Config {
    Config {
        deadline_ms: spec.deadline_ms,
        quarantine_ms: spec.quarantine_ms,
        settle_ms: spec.settle_ms,
        ..Config::with_capacity(4)
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
    let p_name = agent
        .load_remote_metadata(&p_md)
        .map_err(|e| e.to_string())?;

    let config = ledger_config(spec);
    let mut ledger: Box<Ledger<4, 1>> = Box::new(Ledger::new(config));
    // The deadline counts from now, not from the process start.
    ledger
        .advance(now_us() / 1000)
        .map_err(|e| format!("{e:?}"))?;
    let _ticket = ledger
        .register(Registration {
            id: REQUEST_ID,
            blocks: BlockHandle(0),
            expect: Expect::Edges(&[P_AGENT]),
            deadline_ms: None,
        })
        .map_err(|e| format!("register: {e:?}"))?;
    let watch = Watch::start(
        Arc::clone(&pages),
        spec.offset_pages,
        WRITE_PAGES,
        spec.generation,
        epoch,
    );
    announce("D-GO");

    let mut out = Fields::default();
    let (mut event, mut event_us) = ("none", None::<u64>);
    let (mut completed_us, mut failed_us, mut expired_us) = (None, None, None);
    let (mut notice_us, mut released_us, mut reused_us) = (None, None, None);
    let mut disconnect_us = None::<u64>;
    let mut forced = false;
    let mut last_heartbeat = Instant::now();
    let limit = Duration::from_millis(spec.limit_ms());
    let observe = spec.observe_ms * 1000;
    loop {
        if epoch.elapsed() > limit {
            return Err(format!("D: no end after {limit:?}"));
        }
        // Notifications: P's completion or PUSH_FAIL.
        for (sender, bytes) in agent.drain_notifications().map_err(|e| e.to_string())? {
            if sender != p_name {
                continue;
            }
            let failure = bytes.starts_with(wire::PUSH_FAIL_PREFIX);
            if failure && notice_us.is_none() {
                // When D learned it: after the drain returned.
                let at = now_us();
                notice_us = Some(at);
                if event_us.is_none() {
                    (event, event_us) = ("notice", Some(at));
                    watch.mark_event(at);
                }
            }
            let _ = ledger.handle_notification(P_AGENT, &bytes);
        }
        // Heartbeats double as the peer-death probe: a failed send says P is gone, which
        // the ledger hears at once (its bytes already on the way settle there).
        if disconnect_us.is_none() && last_heartbeat.elapsed() >= HEARTBEAT {
            last_heartbeat = Instant::now();
            if agent
                .agent()
                .send_notification(&p_name, b"HB:late-writes", None)
                .is_err()
            {
                let at = now_us();
                disconnect_us = Some(at);
                ledger.advance(at / 1000).map_err(|e| format!("{e:?}"))?;
                let _resolved = ledger.gone(P_AGENT);
                if event_us.is_none() {
                    (event, event_us) = ("disconnect", Some(at));
                    watch.mark_event(at);
                }
            }
        }
        ledger
            .advance(now_us() / 1000)
            .map_err(|e| format!("{e:?}"))?;
        while let Some(d) = ledger.poll_decision() {
            let at = now_us();
            match d {
                Decision::Completed(_) => completed_us = Some(at),
                Decision::Failed(_) => failed_us = Some(at),
                Decision::Expired(_) => {
                    expired_us = Some(at);
                    if event_us.is_none() {
                        (event, event_us) = ("expiry", Some(at));
                        watch.mark_event(at);
                    }
                }
                Decision::Released(r) => {
                    forced = r.forced();
                    released_us = Some(at);
                    let _blocks = r.into_free();
                    reused_us = Some(watch.reuse());
                }
            }
        }
        let now = now_us();
        let done = match (completed_us, event_us, reused_us) {
            (Some(c), _, _) => now >= c + 100_000,
            (None, Some(e), Some(r)) => now >= e + observe && now >= r + observe,
            _ => false,
        };
        if done {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
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
    drop(agent);
    Ok(())
}
