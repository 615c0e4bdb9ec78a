//! The producer side of the event loop: what reaches a producer rank (a decode rank's
//! `PUSH_REG` or `HB:`, the engine's offer), one tick of its shared producer driver over the
//! virtual network ([`super::link`]), the WRITEs it posts as the loop tracks them ([`Write`])
//! until they end (whole or in part, late landings included), the completions and notices
//! they carry, and each source release checked against them (F3).

use kvdrain::{AgentId, Instant};
use kvdrain_driver::producer::{Offer, ProducerEvent, notice_bytes};
use kvdrain_driver::transport::WriteStatus;

use super::Broken;
use super::decode::Should;
use super::link::{PostedWrite, SimLink, request_number};
use super::timing::{DUPLICATE, LATE_LANDING, NOTIFY_LATENCY, REORDER};
use super::workload::producer_request_id;
use super::world::{DECODE_ENGINE, Event, World};

/// A posted WRITE.
#[derive(Clone, Debug)]
pub struct Write {
    /// The request.
    pub req: u64,
    /// The producer rank that posted it.
    pub rank: usize,
    /// That rank's agent when it posted.
    pub agent: AgentId,
    /// The decode rank written.
    pub d: usize,
    /// The physical blocks written (the decode rank's blocks of the request when posted).
    pub blocks: Vec<u32>,
}

impl World {
    pub(super) fn alive_as(&self, rank: usize, agent: AgentId) -> bool {
        let r = &self.cluster.ranks[rank];
        r.alive && r.agent == agent
    }

    /// A decode rank's `PUSH_REG` or `HB:` reaches a producer rank (lost if the agent it
    /// was sent to is gone).
    pub(super) fn producer_hears(
        &mut self,
        from: usize,
        rank: usize,
        agent: AgentId,
        bytes: Vec<u8>,
    ) {
        if !self.alive_as(rank, agent) {
            return;
        }
        self.inboxes[rank].push((format!("{DECODE_ENGINE}-{from}"), bytes));
        self.want_tick(rank);
    }

    /// Prefill ended on `rank`: the engine offers the source blocks (not if the prefill
    /// engine aborted the request: vLLM frees its blocks at once then).
    pub(super) fn offer(&mut self, req: u64, rank: usize, agent: AgentId) {
        if !self.alive_as(rank, agent) || self.requests.get(&req).is_none_or(|r| r.producer_aborted)
        {
            return;
        }
        let offer = Offer {
            request_id: producer_request_id(req),
            transfer_id: None,
            block_ids: vec![Vec::new()],
        };
        if let Err(e) = self.producers[rank].offer(offer, Instant::from_millis(self.now)) {
            self.violation(format!("producer rank {rank} refused an offer: {e}"));
        }
        self.want_tick(rank);
    }

    /// Queues one tick of `rank` at the current time (after every event already queued for
    /// it, so inputs that arrive together are handled by one tick).
    pub(super) fn want_tick(&mut self, rank: usize) {
        if !self.tick_queued[rank] {
            self.tick_queued[rank] = true;
            let agent = self.cluster.ranks[rank].agent;
            self.agenda
                .push(self.now, Event::ProducerTick { rank, agent });
        }
    }

    /// One tick of `rank`'s producer driver over the virtual network, then what it asked
    /// for: WRITEs scheduled, notices sent, source releases checked (F3).
    pub(super) fn producer_tick(&mut self, rank: usize) {
        let agent = self.cluster.ranks[rank].agent;
        let before = self.producers[rank].counters();
        let mut link = SimLink {
            now: self.now,
            rng: &mut self.rng,
            rates: &self.rates,
            faults: &mut self.faults,
            inbox: &mut self.inboxes[rank],
            finished: &mut self.finished[rank],
            targets: &self.targets,
            silent: &self.silent,
            next_write: &mut self.next_write,
            posted: Vec::new(),
            sent: Vec::new(),
        };
        // The virtual network never fails to drain.
        let _ = self.producers[rank].tick(&mut link, Instant::from_millis(self.now));
        let SimLink { posted, sent, .. } = link;
        for p in posted {
            self.write_posted(rank, agent, p);
        }
        for (d, bytes) in sent {
            self.send(d, agent, bytes);
        }
        while let Some(event) = self.producers[rank].poll_event() {
            if let ProducerEvent::SourceReleased { request_id } = event {
                self.source_released(rank, &request_id);
            }
        }
        let after = self.producers[rank].counters();
        if after.leases_expired > before.leases_expired
            && self.writes.values().any(|w| w.rank == rank)
        {
            // F3: a lease ran out while this rank's WRITEs were in flight.
            self.faults.lease_expired_in_flight += 1;
        }
        if after.plan_errors > before.plan_errors {
            self.violation(format!("producer rank {rank}: plan step out of order"));
        }
        self.watch_leases(rank, agent);
    }

    /// Ticks `rank` again when its driver says a lease ends next (everything else it does
    /// follows an input, which queues a tick), unless a check at or before then is queued.
    fn watch_leases(&mut self, rank: usize, agent: AgentId) {
        let Some(at) = self.producers[rank].next_timer().map(Instant::millis) else {
            return;
        };
        let at = at.max(self.now + 1);
        let queued = self.lease_check_at[rank];
        if queued > self.now && queued <= at {
            return;
        }
        self.lease_check_at[rank] = at;
        self.agenda.push(at, Event::LeaseCheck { rank, agent });
    }

    /// F3: the source blocks of a request go back only when none of its WRITEs reads them.
    fn source_released(&mut self, rank: usize, request_id: &str) {
        let Some(req) = request_number(request_id) else {
            self.violation(format!("source release of unknown request {request_id}"));
            return;
        };
        let reading = self
            .writes
            .values()
            .filter(|w| w.rank == rank && w.req == req)
            .count();
        if reading > 0 {
            self.violation(format!(
                "producer rank {rank} released the source blocks of request {req} \
                 while {reading} WRITE(s) read them"
            ));
        }
    }

    fn write_posted(&mut self, rank: usize, agent: AgentId, p: PostedWrite) {
        if let Some(request) = self.requests.get_mut(&p.req) {
            request.ranks[p.d].in_flight += 1;
        }
        self.consumers[p.d].pool.write_posted(&p.blocks);
        let w = Write {
            req: p.req,
            rank,
            agent,
            d: p.d,
            blocks: p.blocks,
        };
        self.writes.insert(p.id, w);
        let event = Event::WriteDone {
            write: p.id,
            ok: p.ok,
            unknown: p.unknown,
        };
        self.agenda.push(p.done_at, event);
    }

    pub(super) fn write_done(&mut self, write: u64, ok: bool, unknown: bool) {
        let Some(w) = self.writes.remove(&write) else {
            return; // cut by its producer's death
        };
        self.end_write(&w, ok);
        if ok {
            self.completion_sent(&w);
        } else {
            // F7: a backend error after posting; the driver owes the notice.
            self.faults.failed_after_post += 1;
        }
        // A write whose status is unknown may be bounded later by a backend error to the same
        // rank, and then owes a PUSH_FAIL even if it landed: a second notice for one edge,
        // which only named-edge mode can tell apart (spec rule 6, like error_after_completion).
        let repeats_ok = self.requests.get(&w.req).is_none_or(|r| r.named);
        let unknown = unknown && (!ok || repeats_ok);
        if self.alive_as(w.rank, w.agent) {
            let status = if unknown {
                // F7: the producer reads NOT_FOUND; from now on the handle stays in progress.
                self.faults.status_unknown += 1;
                WriteStatus::Unknown
            } else if ok {
                WriteStatus::Success
            } else {
                WriteStatus::BackendError
            };
            self.finished[w.rank].insert(write, status);
            self.want_tick(w.rank);
        }
    }

    /// A WRITE is terminal for its producer: all of it landed (`whole`), or part of it may
    /// have — and an errored one may keep landing for up to [`LATE_LANDING`] ms (the
    /// late-landing fault: TCP socket buffers drained after the error, `docs/nixl.md#late-writes`).
    pub(super) fn end_write(&mut self, w: &Write, whole: bool) {
        let late = !whole && self.rng.chance(self.rates.late_landing);
        let pool = &mut self.consumers[w.d].pool;
        if whole || self.rng.chance(self.rates.partial_data) {
            pool.write_lands(&w.blocks, w.req, &mut self.breaches);
        }
        if late {
            self.faults.late_landing += 1;
            let at = self.now + self.rng.between(1, LATE_LANDING);
            let event = Event::LateLanding {
                req: w.req,
                d: w.d,
                blocks: w.blocks.clone(),
            };
            self.agenda.push(at, event);
        } else {
            pool.write_ended(&w.blocks);
        }
        if let Some(request) = self.requests.get_mut(&w.req) {
            request.ranks[w.d].in_flight -= 1;
            if let Some(edge) = request.edge_mut(w.d, w.rank) {
                if whole {
                    edge.landed = true;
                } else {
                    edge.spoiled = true;
                }
            }
        }
    }

    /// The completion attached to a landed WRITE travels to the consumer, perhaps twice,
    /// perhaps followed by a `PUSH_FAIL` for the same edge.
    fn completion_sent(&mut self, w: &Write) {
        let Some(request) = self.requests.get(&w.req) else {
            return; // the consumer is done with it; nobody listens
        };
        let tp = self.cluster.engines[request.engine].topology.p_tp;
        let repeats = request.named || self.config.broken == Some(Broken::DuplicateCounting);
        let bytes = notice_bytes(&request.id, tp, false);
        let failure = notice_bytes(&request.id, tp, true);
        self.send(w.d, w.agent, bytes.clone());
        // Counting mode cannot tell a second notice from a sibling's (spec rule 6): repeats
        // go only to named-edge requests.
        if repeats && self.rng.chance(self.rates.duplicate) {
            self.faults.duplicated += 1;
            let at = self.now + self.between(DUPLICATE);
            self.deliver_at(at, w.d, w.agent, bytes);
        }
        if repeats && self.rng.chance(self.rates.error_after_completion) {
            self.faults.error_after_completion += 1;
            let at = self.now + self.between(DUPLICATE);
            self.deliver_at(at, w.d, w.agent, failure);
        }
    }

    fn send(&mut self, d: usize, agent: AgentId, bytes: Vec<u8>) {
        let mut at = self.now + self.rng.between(0, NOTIFY_LATENCY);
        if self.rng.chance(self.rates.reorder) {
            self.faults.reordered += 1;
            at += self.between(REORDER);
        }
        self.deliver_at(at, d, agent, bytes);
    }

    fn deliver_at(&mut self, at: u64, d: usize, agent: AgentId, bytes: Vec<u8>) {
        let should = Should::Genuine;
        self.agenda.push(
            at,
            Event::Deliver {
                d,
                agent,
                bytes,
                should,
            },
        );
    }
}
