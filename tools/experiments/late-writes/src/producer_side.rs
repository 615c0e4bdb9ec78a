//! P, the producer child of a run: one 256 MiB WRITE into D's pages (64 spans of 4 MiB, its
//! source pages stamped), the fault a random delay after the post, then the policy's report.
//!
//! P uses the agent primitives directly, so it controls exactly when it posts, polls,
//! invalidates, drops the handle and sends notices. Fault d (SIGKILL) comes from the
//! coordinator, timed from P's `P-POSTING` line. After the fault it keeps polling the
//! handle (unless the fault dropped it) until `Success` or an error, decides once what to
//! report ([`Policy::sends_push_fail`](crate::policy::Policy::sends_push_fail)) and keeps running (the progress thread keeps moving
//! bytes) until the coordinator says `EXIT`.

use std::process::Command;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use kvdrain::wire::{self, Body};
use kvdrain_nixl::agent::UcxAgent;
use kvdrain_nixl::testbed::{from_hex, to_hex};
use nixl_sys::{AgentConfig, MemType, OptArgs, XferDescList, XferOp, XferRequest, XferStatus};

use crate::clock::host_monotonic_us;
use crate::lines::{Fields, announce, expect_line};
use crate::policy::WriteEnd;
use crate::spec::{Fault, REQUEST_ID, RunSpec, SPANS, WRITE_PAGES};
use crate::stamp::{PAGE, Stamp, StampedPages};

const HANDSHAKE_LIMIT: Duration = Duration::from_secs(60);

/// Runs P for `spec`; hands the fields of the `P-RESULT` line to `publish` before tearing
/// NIXL down (fault d: killed first).
///
/// # Errors
/// A message when NIXL or the handshake fails.
pub fn run(
    spec: &RunSpec,
    input: &Receiver<String>,
    publish: &dyn Fn(&Fields),
) -> Result<(), String> {
    let epoch = Instant::now();
    let err = |e: kvdrain_nixl::agent::AgentError| e.to_string();
    let mut agent =
        UcxAgent::with_config(&format!("{}-p", spec.prefix), &AgentConfig::default(), &[])
            .map_err(err)?;
    let source = StampedPages::new(WRITE_PAGES);
    for page in 0..WRITE_PAGES {
        source.stamp(
            page,
            Stamp::Producer {
                generation: spec.generation,
                page: page as u32,
            },
        );
    }
    agent.register_dram(source.region()).map_err(err)?;
    let ready = expect_line(input, "D-READY ", HANDSHAKE_LIMIT)?;
    let (d_md, d_base) = ready.split_once(' ').ok_or("D-READY: two fields")?;
    let d_md = from_hex(d_md).ok_or("D-READY: bad hex")?;
    let d_base: usize = d_base.parse().map_err(|_| "D-READY: bad base")?;
    let d_name = agent.load_remote_metadata(&d_md).map_err(err)?;
    announce(&format!(
        "P-READY {}",
        to_hex(&agent.local_metadata().map_err(err)?)
    ));
    expect_line(input, "GO", HANDSHAKE_LIMIT)?;
    let nixl = agent.agent();
    nixl.make_connection(&d_name, None)
        .map_err(|e| format!("make_connection: {e}"))?;

    // One WRITE: 64 spans, the completion attached.
    let completion = Body {
        request_id: REQUEST_ID,
        tp_size: 1,
    };
    let mut body = vec![0; completion.encoded_len()];
    completion.encode(&mut body).map_err(|e| format!("{e:?}"))?;
    let mut local = XferDescList::new(MemType::Dram).map_err(|e| e.to_string())?;
    let mut remote = XferDescList::new(MemType::Dram).map_err(|e| e.to_string())?;
    let span = WRITE_PAGES / SPANS * PAGE;
    for i in 0..SPANS {
        let (src, dst) = spec.span_pages(i);
        local.add_desc(source.addr(src), span, 0);
        remote.add_desc(d_base + dst * PAGE, span, 0);
    }
    let mut args = OptArgs::new().map_err(|e| e.to_string())?;
    args.set_has_notification(true).map_err(|e| e.to_string())?;
    args.set_notification_message(&body)
        .map_err(|e| e.to_string())?;
    let req = nixl
        .create_xfer_req(XferOp::Write, &local, &remote, &d_name, Some(&args))
        .map_err(|e| format!("create_xfer_req: {e}"))?;

    let mut out = Fields::default();
    // TCP ports to reset for fault c, listed now: `ss -p` is slow, the fault should not be.
    let own_ports = if spec.fault == Fault::ResetTcp {
        own_tcp_ports()?
    } else {
        Vec::new()
    };
    announce("P-POSTING");
    let posted = Instant::now();
    let in_progress = nixl
        .post_xfer_req(&req, None)
        .map_err(|e| format!("post_xfer_req: {e}"))?;
    out.put("post_inline", !in_progress);
    let mut req: Option<XferRequest> = Some(req);
    let mut end: Option<(WriteEnd, Instant)> =
        (!in_progress).then_some((WriteEnd::Success, posted));

    // Until the fault: poll (the completion goes out from the poll that sees Success).
    let delay = Duration::from_micros(spec.fault_delay_us);
    while posted.elapsed() < delay {
        poll(nixl, req.as_ref(), &mut end);
        std::thread::sleep(Duration::from_micros(100));
    }
    out.put("write_done_before_fault", end.is_some());
    // On the host's clock, for D's landings to be put before or after it.
    out.put("fault_mono_us", host_monotonic_us());
    let fault_at = Instant::now();
    out.put("fault_after_post_us", (fault_at - posted).as_micros());
    match spec.fault {
        Fault::Invalidate => {
            let r = nixl.invalidate_remote_md(&d_name);
            out.put("invalidate", r.is_ok());
        }
        Fault::DropHandle => {
            drop(req.take());
            if end.is_none() {
                end = Some((WriteEnd::Dropped, Instant::now()));
            }
        }
        Fault::ResetTcp => {
            out.put("tcp_ports", own_ports.len());
            out.put("reset_sockets", reset_tcp(&own_ports)?);
        }
        // The coordinator sends SIGKILL `fault_delay_us` after `P-POSTING`: from outside,
        // so that it also hits a post that blocks (shared memory copies inside the post).
        Fault::Kill => {}
    }
    out.put("fault_us", (Instant::now() - fault_at).as_micros());

    // After the fault: poll to a terminal status, report once, keep running until EXIT.
    let mut reported = false;
    loop {
        poll(nixl, req.as_ref(), &mut end);
        if let (Some((how, at)), false) = (end, reported) {
            reported = true;
            out.put("end", how.name()).put(
                "end_after_fault_us",
                at.saturating_duration_since(fault_at).as_micros(),
            );
            let send = spec.policy.sends_push_fail(how);
            out.put("push_fail", send);
            if send {
                let sent = send_push_fail(&agent, &d_name, &d_md);
                out.put("push_fail_sent", sent.is_ok());
                if let Err(e) = sent {
                    out.put("push_fail_error", e.replace(' ', "_"));
                }
            }
        }
        match input.try_recv() {
            Ok(line) if line.contains("EXIT") => break,
            Err(TryRecvError::Disconnected) => break,
            _ => {}
        }
        if epoch.elapsed() > Duration::from_millis(spec.limit_ms()) {
            return Err("P: never told to exit".into());
        }
        // Heartbeats from D pile up otherwise.
        let _ = agent.drain_notifications();
        std::thread::sleep(Duration::from_micros(200));
    }
    if !reported {
        out.put("end", "in_progress");
    }
    publish(&out);
    // Requests before registrations before the agent.
    drop(req);
    drop(agent);
    Ok(())
}

/// Polls `req` once and notes its first terminal status.
fn poll(agent: &nixl_sys::Agent, req: Option<&XferRequest>, end: &mut Option<(WriteEnd, Instant)>) {
    let (Some(req), None) = (req, end.as_ref()) else {
        return;
    };
    match agent.get_xfer_status(req) {
        Ok(XferStatus::Success) => *end = Some((WriteEnd::Success, Instant::now())),
        Ok(XferStatus::InProgress) => {}
        Err(e) => *end = Some((WriteEnd::of_error(&e), Instant::now())),
    }
}

/// `PUSH_FAIL:{id}:1` to D; after a `NotFound` (D's metadata was invalidated, by P or by
/// NIXL after a disconnect) reloads D's metadata once and retries, as the pre-fix glue's
/// re-handshake did.
fn send_push_fail(agent: &UcxAgent, d_name: &str, d_md: &[u8]) -> Result<(), String> {
    let completion = Body {
        request_id: REQUEST_ID,
        tp_size: 1,
    };
    let mut body = vec![0; wire::PUSH_FAIL_PREFIX.len() + completion.encoded_len()];
    completion
        .encode_failure(&mut body)
        .map_err(|e| format!("{e:?}"))?;
    let nixl = agent.agent();
    match nixl.send_notification(d_name, &body, None) {
        Ok(()) => Ok(()),
        Err(_) => {
            let _ = nixl.invalidate_remote_md(d_name);
            agent
                .load_remote_metadata(d_md)
                .map_err(|e| e.to_string())?;
            nixl.send_notification(d_name, &body, None)
                .map_err(|e| format!("send_notification after reload: {e}"))
        }
    }
}

/// Resets every established TCP socket with one of these local `ports` with `ss -K`
/// (SOCK_DESTROY: the local socket is aborted and the peer gets an RST). Returns how many it
/// destroyed.
fn reset_tcp(ports: &[u16]) -> Result<usize, String> {
    if ports.is_empty() {
        return Ok(0);
    }
    let filter = ports
        .iter()
        .map(|p| format!("sport = :{p}"))
        .collect::<Vec<_>>()
        .join(" or ");
    let out = Command::new("ss")
        .args(["-K", "-t", "-n", "-H", "state", "established"])
        .arg(format!("( {filter} )"))
        .output()
        .map_err(|e| format!("ss -K: {e}"))?;
    let killed = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    Ok(killed)
}

/// Local ports of this process's established TCP sockets (`ss -tnpH`).
fn own_tcp_ports() -> Result<Vec<u16>, String> {
    let out = Command::new("ss")
        .args(["-t", "-n", "-p", "-H", "state", "established"])
        .output()
        .map_err(|e| format!("ss: {e}"))?;
    let me = format!("pid={},", std::process::id());
    let mut ports: Vec<u16> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&me))
        .filter_map(|l| {
            // Recv-Q Send-Q Local:Port Peer:Port Process
            let local = l.split_whitespace().nth(2)?;
            local.rsplit_once(':')?.1.parse().ok()
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    Ok(ports)
}
