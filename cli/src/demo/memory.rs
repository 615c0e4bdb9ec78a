//! The demo's fallback transport: the producer ranks copy their blocks into D's memory with
//! `memcpy` and queue their notifications in memory. The tracker ([`Ledger`]) and the
//! producers' [`PushPlan`]s are the real ones; only NIXL is missing.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kvdrain::producer::{PushPlan, Topology};
use kvdrain::wire::Body;
use kvdrain::{AgentId, BlockHandle, Config, Decision, Expect, Ledger, Noticed, Registration};

use super::report::latency_histogram;
use super::{Options, P_TP, Percentiles, Progress, Summary, pattern};

/// Runs the demo without NIXL.
pub fn run(o: &Options) -> Summary {
    let start = Instant::now();
    let p_len = o.block_size / usize::from(P_TP);
    let request_len = o.blocks * o.block_size;
    let topology = Topology {
        p_tp: P_TP,
        p_pp: 1,
        d_tp: 1,
        mla: false,
    };
    let agents: Vec<AgentId> = (0..P_TP).map(AgentId).collect();
    // The copies here are synchronous and a failure notice is only sent for a write that
    // was never posted: nothing can land after it, so nothing needs to settle (rule 8).
    let mut ledger: Box<Ledger<1024, 8>> = Box::new(Ledger::new(Config {
        settle_ms: 0,
        ..Config::with_capacity(1024)
    }));
    let mut d_mem = vec![0u8; o.window * request_len];
    let mut free: Vec<u64> = (0..o.window as u64).rev().collect();
    let mut request_in_slot: HashMap<u64, u64> = HashMap::new();
    let mut wire: VecDeque<(AgentId, Vec<u8>)> = VecDeque::new();
    let mut latencies = latency_histogram();
    let mut s = Summary {
        transport: "in-process memcpy (no NIXL)".to_owned(),
        requests: o.requests,
        ..Summary::default()
    };
    let mut progress = Progress::new(o.requests);
    let mut next = 0u64;
    let mut decided = 0u64;
    let mut decisions = Vec::new();
    while decided < o.requests {
        while next < o.requests {
            let Some(slot) = free.pop() else { break };
            let n = next;
            next += 1;
            let id = format!("d-{n}");
            request_in_slot.insert(slot, n);
            let registered = ledger.register(Registration {
                id: &id,
                blocks: BlockHandle(slot),
                expect: Expect::Edges(&agents),
                deadline_ms: None,
            });
            if registered.is_err() {
                free.push(slot);
                s.unfinished += 1;
                decided += 1;
                continue;
            }
            for rank in 0..P_TP {
                let Ok(mut plan) = PushPlan::new(&topology, 0, rank) else {
                    continue;
                };
                let body = Body {
                    request_id: &id,
                    tp_size: P_TP,
                };
                for edge in plan.edges().to_vec() {
                    if o.fails(n, rank) {
                        let _ = plan.post_failed(edge.d_rank);
                        continue;
                    }
                    let base = slot as usize * request_len;
                    for b in 0..o.blocks {
                        let at = base + b * o.block_size + usize::from(rank) * p_len;
                        d_mem[at..at + p_len].copy_from_slice(&pattern(n, rank, b, p_len));
                    }
                    let _ = plan.posted(edge.d_rank);
                    let _ = plan.landed(edge.d_rank);
                    s.bytes += (o.blocks * p_len) as u64;
                    let mut msg = vec![0; body.encoded_len()];
                    let _ = body.encode(&mut msg);
                    wire.push_back((AgentId(rank), msg));
                }
                for d in plan.owed_notices().collect::<Vec<_>>() {
                    let mut msg =
                        vec![0; kvdrain::wire::PUSH_FAIL_PREFIX.len() + body.encoded_len()];
                    let _ = body.encode_failure(&mut msg);
                    wire.push_back((AgentId(rank), msg));
                    let _ = plan.noticed(d);
                }
            }
        }
        let received = Instant::now();
        while let Some((agent, msg)) = wire.pop_front() {
            if let Ok(Noticed::Decided) = ledger.handle_notification(agent, &msg) {
                ledger.poll(|d| decisions.push(d));
                latencies.saturating_record(received.elapsed().as_nanos() as u64);
            }
        }
        let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let _ = ledger.advance(now, |d| decisions.push(d));
        for d in decisions.drain(..) {
            match d {
                Decision::Completed(t) => {
                    let slot = t.into_decode().0;
                    let n = request_in_slot.get(&slot).copied().unwrap_or(u64::MAX);
                    let base = slot as usize * request_len;
                    let intact = (0..o.blocks).all(|b| {
                        (0..P_TP).all(|r| {
                            let at = base + b * o.block_size + usize::from(r) * p_len;
                            d_mem[at..at + p_len] == pattern(n, r, b, p_len)[..]
                        })
                    });
                    s.corrupt += u64::from(!intact);
                    s.completed += 1;
                    decided += 1;
                    free.push(slot);
                }
                Decision::Failed(_) => {
                    s.failed += 1;
                    decided += 1;
                }
                Decision::Expired(_) => {
                    s.expired += 1;
                    decided += 1;
                }
                Decision::Released(r) => {
                    s.forced += u64::from(r.forced());
                    free.push(r.into_free().0);
                }
            }
        }
        progress.update(decided);
    }
    progress.finish();
    let c = ledger.counters();
    s.completions = c.ingest.completions;
    s.failure_notices = c.ingest.failure_notices;
    s.latency = Percentiles::of(&latencies);
    s.wall = start.elapsed();
    s
}
