//! The demo's fallback transport: the same producer and consumer drivers as over NIXL,
//! driven through the in-process [`MemoryFabric`]; a landed WRITE is copied into D's memory
//! here (`memcpy`), and its completion travels through the fabric's mailboxes. Only NIXL
//! is missing.

use std::time::Instant;

use kvdrain::{BlockHandle, Config, Duration, Noticed};
use kvdrain_driver::Transport;
use kvdrain_driver::consumer::{
    ConsumerConfig, ConsumerDriver, ConsumerEvent, ReceiveSpec, RemoteProducer,
};
use kvdrain_driver::memory::{MemoryFabric, MemoryTransport, MemoryWrite, WriteFault};
use kvdrain_driver::producer::{Offer, ProducerConfig, ProducerDriver, ProducerEvent};

use super::report::latency_histogram;
use super::{Options, P_TP, Percentiles, Progress, Summary, pattern};

const P_ENGINE: &str = "demo-p";
const D_ENGINE: &str = "demo-d";

/// Runs the demo without NIXL.
pub fn run(o: &Options) -> Summary {
    let start = Instant::now();
    // The drivers' clock: ms since the demo started, read from the wall's monotonic clock.
    let now = || {
        kvdrain::Instant::from_millis(
            u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
        )
    };
    let p_len = o.block_size / usize::from(P_TP);
    let fabric = MemoryFabric::new();
    let mut dt = fabric.endpoint("d0");
    fabric.publish_consumer(D_ENGINE, 0, "d0");
    let failing = o.clone();
    fabric.set_fault_script(Some(Box::new(move |spec| {
        let n = spec
            .producer_request_id
            .strip_prefix("p-")
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX);
        if failing.fails(n, spec.tp_rank) {
            WriteFault::Descriptor
        } else {
            WriteFault::None
        }
    })));
    let mut d: Box<ConsumerDriver<1024, 8>> = Box::new(ConsumerDriver::new(ConsumerConfig {
        engine_id: D_ENGINE.into(),
        host: "127.0.0.1".into(),
        port: 0,
        tp_rank: 0,
        tp_size: 1,
        lease: Duration::from_secs(30),
        // The injected faults refuse a write before it is posted, so nothing can land after
        // its failure notice; settling would only hold slots of the window (`bench ingest`
        // and the NIXL testbed do the same).
        ledger: Config {
            settle: Duration::ZERO,
            ..Config::with_capacity(1024)
        },
    }));
    let mut producers: Vec<(ProducerDriver<MemoryWrite>, MemoryTransport)> = (0..P_TP)
        .map(|r| {
            let config = ProducerConfig::new(P_ENGINE, r, P_TP);
            (
                ProducerDriver::new(config),
                fabric.endpoint(&format!("p{r}")),
            )
        })
        .collect();
    let engine = RemoteProducer {
        engine_id: P_ENGINE.into(),
        host: "127.0.0.1".into(),
        port: 0,
        tp_size: P_TP,
        pp_size: 1,
        mla: false,
        agents: (0..P_TP).map(|r| format!("p{r}")).collect(),
    };
    let mut s = Summary {
        transport: "in-process memcpy (no NIXL), the same drivers".to_owned(),
        requests: o.requests,
        ..Summary::default()
    };
    if let Err(e) = d.add_producer_engine(engine) {
        eprintln!("kvdrain demo: {e}");
        s.unfinished = o.requests;
        return s;
    }
    let mut d_mem = vec![0u8; o.window * o.blocks * o.block_size];
    let mut free: Vec<u64> = (0..o.window as u64).rev().collect();
    let mut request_in_slot = vec![u64::MAX; o.window];
    let mut latencies = latency_histogram();
    let mut progress = Progress::new(o.requests);
    let mut batch = Vec::new();
    let (mut next, mut decided) = (0u64, 0u64);
    while decided < o.requests {
        while next < o.requests {
            let Some(slot) = free.pop() else { break };
            let n = next;
            next += 1;
            let (pid, did) = (format!("p-{n}"), format!("d-{n}"));
            request_in_slot[slot as usize] = n;
            let blocks: Vec<u64> = (slot * o.blocks as u64..(slot + 1) * o.blocks as u64).collect();
            for (p, _) in &mut producers {
                let offer = Offer {
                    request_id: pid.clone(),
                    transfer_id: None,
                    block_ids: vec![blocks.clone()],
                };
                // Ids are unique and the window is below the table's capacity.
                let _ = p.offer(offer, now());
            }
            let registered = d.engine().register(
                &mut dt,
                ReceiveSpec {
                    id: &did,
                    producer_engine: P_ENGINE,
                    remote_request_id: &pid,
                    transfer_id: Some(&pid),
                    blocks: BlockHandle(slot),
                    block_ids: vec![blocks],
                    deadline: None,
                },
                now(),
            );
            if registered.is_err() {
                free.push(slot);
                s.unfinished += 1;
                decided += 1;
            }
        }
        for (p, t) in &mut producers {
            // The memory transport never fails to drain.
            let _ = p.tick(t, now());
            while let Some(
                ProducerEvent::SourceReleased { .. } | ProducerEvent::LeaseExtended { .. },
            ) = p.poll_event()
            {}
        }
        for w in fabric.take_landed() {
            let n = request_in_slot
                .get(w.dest[0][0] as usize / o.blocks)
                .copied()
                .unwrap_or(u64::MAX);
            for (b, &block) in w.dest[0].iter().enumerate() {
                let at = block as usize * o.block_size + usize::from(w.tp_rank) * p_len;
                d_mem[at..at + p_len].copy_from_slice(&pattern(n, w.tp_rank, b, p_len));
            }
            s.bytes += (o.blocks * p_len) as u64;
        }
        batch.clear();
        let _ = dt.drain_notifications(&mut batch);
        let received = Instant::now();
        // Both halves on this thread: each decision is taken as its notice decides it.
        let (mut ingest, mut engine) = d.split();
        for (sender, bytes) in &batch {
            if let Ok(Noticed::Decided) = ingest.ingest(sender, bytes) {
                // Taken now so the latency is its own; the events below count it.
                let _ = engine.take_ready();
                latencies.saturating_record(
                    u64::try_from(received.elapsed().as_nanos()).unwrap_or(u64::MAX),
                );
            }
        }
        // Each ready request was taken as its notice decided it; the round's decisions
        // are counted from the events below.
        let _ = engine.poll(&mut dt, now());
        while let Some(event) = engine.poll_event() {
            match event {
                ConsumerEvent::Decode { blocks, .. } => {
                    let slot = blocks.0 as usize;
                    let n = request_in_slot[slot];
                    let intact = (0..o.blocks).all(|b| {
                        (0..P_TP).all(|r| {
                            let block = slot * o.blocks + b;
                            let at = block * o.block_size + usize::from(r) * p_len;
                            d_mem[at..at + p_len] == pattern(n, r, b, p_len)[..]
                        })
                    });
                    s.corrupt += u64::from(!intact);
                    s.completed += 1;
                    decided += 1;
                    free.push(blocks.0);
                }
                ConsumerEvent::Failed { .. } => {
                    s.failed += 1;
                    decided += 1;
                }
                ConsumerEvent::Expired { .. } => {
                    s.expired += 1;
                    decided += 1;
                }
                ConsumerEvent::Release { blocks, forced, .. } => {
                    s.forced += u64::from(forced);
                    free.push(blocks.0);
                }
            }
        }
        progress.update(decided);
    }
    progress.finish();
    let c = d.core_counters();
    s.completions = c.ingest.completions;
    s.failure_notices = c.ingest.failure_notices;
    s.latency = Percentiles::of(&latencies);
    s.wall = start.elapsed();
    s
}
