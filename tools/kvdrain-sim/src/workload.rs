//! The client workload: requests arrive (in bursts at times); each picks a prefill engine, a
//! mode (named edges or counting), its blocks and maybe a short deadline, is registered on
//! every decode rank and offered by every producer rank of its engine, and rolls its faults
//! (aborts, a duplicate registration, a producer's death, a full table); garbage, strays and
//! misdirected notices are delivered around it.

use kvdrain::{AgentId, BlockHandle, Duration, RegisterErrorKind};
use kvdrain_driver::consumer::{ConsumerError, EdgeMode, ReceiveSpec};
use kvdrain_driver::producer::notice_bytes;

use super::decode::Should;
use super::decode_link::RequestPaths;
use super::requests::{EdgeTrack, RankPart, Request};
use super::timing::{
    ABORT_AFTER, ARRIVAL_GAP, BURST, DEADLINE, DUPLICATE, NOTIFY_LATENCY, PREFILL,
    PRODUCER_ABORT_AFTER, SHORT_DEADLINE,
};
use super::world::{Event, World, producer_engine};

/// Blocks a request holds on each decode rank.
const BLOCKS_PER_REQUEST: (u64, u64) = (1, 4);

/// Share of requests registered in named-edge mode (the rest count, as vLLM does).
const NAMED_PPM: u32 = 700_000;

/// P's id of request `req`: vLLM randomizes ids per engine, so P's differs from D's
/// (`req-N`) by an 8-hex-digit suffix and the drivers pair them by base id.
pub(super) fn producer_request_id(req: u64) -> String {
    format!("req-{req}-{:08x}", req.wrapping_mul(0x9e37_79b9) as u32)
}

impl World {
    pub(super) fn arrive(&mut self) {
        let req = self.arrived;
        self.arrived += 1;
        if self.arrived < self.config.requests {
            let gap = if self.burst_left > 0 {
                self.burst_left -= 1;
                0
            } else {
                self.rng.between(0, ARRIVAL_GAP)
            };
            self.agenda.push(self.now + gap, Event::Arrive);
        }
        if self.rng.chance(self.rates.burst) {
            self.burst_left = self.between(BURST);
        }
        let engine = self.rng.below(self.cluster.engines.len() as u64) as usize;
        let topology = self.cluster.engines[engine].topology;
        let named = self.rng.chance(NAMED_PPM);
        let id = format!("req-{req}");
        let blocks = self.between(BLOCKS_PER_REQUEST) as usize;
        let deadline_ms = self
            .rng
            .chance(self.rates.short_deadline)
            .then(|| self.between(SHORT_DEADLINE));
        // Rule 4: a notice that arrives before its registration counts for nothing.
        if self.rng.chance(self.rates.unknown_id / 2) {
            self.faults.unknown_id += 1;
            let bytes = notice_bytes(&id, topology.p_tp, false);
            let agent = self.cluster.ranks[self.cluster.ranks_of(engine).start].known;
            self.deliver(0, agent, bytes, Should::BeIgnored(&["unknown"]));
        }
        let mut ranks = Vec::new();
        for d in 0..self.cluster.d_tp {
            let edges = topology
                .producers_of(d)
                .map(|(stage, tp)| EdgeTrack {
                    rank: self.cluster.rank_of(engine, stage, tp),
                    landed: false,
                    spoiled: false,
                })
                .collect();
            let pool = &mut self.consumers[usize::from(d)].pool;
            let Some(blocks) = pool.alloc(blocks, req, &mut self.breaches) else {
                self.violation(format!(
                    "decode rank {d} ran out of blocks (simulation sizing)"
                ));
                return;
            };
            ranks.push(RankPart {
                blocks,
                edges,
                in_flight: 0,
                outcome: None,
                decided_at: 0,
                released: false,
                done: false,
            });
        }
        let mut request = Request {
            id,
            engine,
            named,
            arrived: self.now,
            ranks,
            producer_aborted: false,
            producer_silent: false,
        };
        let p_id = producer_request_id(req);
        let engine_id = producer_engine(engine);
        let push = |blocks: u64| ReceiveSpec {
            id: &request.id,
            producer_engine: &engine_id,
            remote_request_id: &p_id,
            transfer_id: None,
            blocks: BlockHandle(blocks),
            block_ids: vec![Vec::new()],
            deadline: deadline_ms.map(Duration::from_millis),
        };
        // A full table on any rank: the request is not pushed (the engine would prefill it
        // locally). The full rank's driver must say so; no rank registers, so no slot is
        // tied up by a request nobody will write.
        if let Some(d) = self
            .consumers
            .iter_mut()
            .position(|c| c.driver.engine().is_full())
        {
            self.faults.table_full += 1;
            let registered = self.register(d, push(req), EdgeMode::Count);
            match registered {
                Err(ConsumerError::Rejected {
                    kind: RegisterErrorKind::Full,
                    ..
                }) => self.decisions.rejected_full += 1,
                other => self.violation(format!("registration on full rank {d}: {other:?}")),
            }
            for (d, part) in request.ranks.iter_mut().enumerate() {
                self.consumers[d]
                    .pool
                    .free(&part.blocks, req, &mut self.breaches);
                part.done = true;
            }
            return;
        }
        // The network's paths to the engine's ranks for this request: F6 (one rank missed)
        // and slow paths, applied by each decode rank's transport.
        let producers = self.cluster.ranks_of(engine);
        let paths = RequestPaths::roll(
            &mut self.rng,
            &self.rates,
            &mut self.faults,
            producers.clone(),
        );
        self.paths.insert(req, paths);
        self.targets.insert(
            req,
            request.ranks.iter().map(|p| p.blocks.clone()).collect(),
        );
        for rank in producers {
            // Prefill ends and the rank offers its source blocks (its lease starts).
            let agent = self.cluster.ranks[rank].agent;
            let at = self.now + self.between(PREFILL);
            self.agenda.push(at, Event::Offer { req, rank, agent });
        }
        // Every decode rank's driver registers the request and sends `PUSH_REG` to every
        // producer agent of the engine; heartbeats follow until its decision.
        let mode = if named {
            EdgeMode::Named
        } else {
            EdgeMode::Count
        };
        for d in 0..self.consumers.len() {
            match self.register(d, push(req), mode) {
                Ok(_) => {
                    let deadline = self.now + deadline_ms.unwrap_or(DEADLINE);
                    self.consumers[d].expect_outcome(req, deadline);
                }
                Err(e) => {
                    self.violation(format!("registration of {} on rank {d}: {e}", request.id))
                }
            }
        }
        if self.rng.chance(self.rates.duplicate_registration) {
            self.faults.duplicate_registration += 1;
            match self.register(0, push(u64::MAX), EdgeMode::Count) {
                Err(ConsumerError::Rejected {
                    kind: RegisterErrorKind::DuplicateId,
                    ..
                }) => self.decisions.rejected_duplicate_id += 1,
                other => {
                    self.violation(format!("second registration of {}: {other:?}", request.id))
                }
            }
        }
        if self.rng.chance(self.rates.consumer_abort) {
            let at = self.now + self.between(ABORT_AFTER);
            self.agenda.push(at, Event::ConsumerAbort { req });
        }
        if self.rng.chance(self.rates.producer_abort) {
            let at = self.now + self.between(PRODUCER_ABORT_AFTER);
            self.agenda.push(at, Event::ProducerAbort { req });
        }
        self.noise(&request, topology.p_tp);
        self.requests.insert(req, request);
        if self.rng.chance(self.rates.producer_death) {
            let rank = self.rng.below(self.cluster.ranks.len() as u64) as usize;
            self.agenda.push(self.now, Event::Death { rank });
        }
    }

    /// Garbage, strays and misdirected notices around a request.
    fn noise(&mut self, request: &Request, tp: u16) {
        let id = &request.id;
        let d = self.rng.below(u64::from(self.cluster.d_tp)) as usize;
        let agent = self.rng.pick(&self.cluster.ranks).known;
        let latency = self.rng.between(0, NOTIFY_LATENCY);
        let send = |world: &mut World, bytes: Vec<u8>, should: Should| {
            let event = Event::Deliver {
                d,
                agent,
                bytes,
                should,
            };
            world.agenda.push(world.now + latency, event);
        };
        if self.rng.chance(self.rates.malformed) {
            self.faults.malformed += 1;
            let bytes = match self.rng.below(9) {
                0 => id.clone().into_bytes(),
                1 => format!("{id}:0").into_bytes(),
                2 => format!("{id}:65536").into_bytes(),
                3 => format!("{id}:2x").into_bytes(),
                4 => b":2".to_vec(),
                5 => b"PUSH_FAIL:".to_vec(),
                6 => format!("PUSH_FAIL:{id}").into_bytes(),
                7 => Vec::new(),
                _ => [b"\xff\xfe".as_slice(), format!("{id}:{tp}").as_bytes()].concat(),
            };
            send(self, bytes, Should::BeIgnored(&["malformed"]));
        }
        if self.rng.chance(self.rates.misrouted) {
            self.faults.misrouted += 1;
            let bytes = if self.rng.chance(500_000) {
                format!("HB:{id},{id}").into_bytes()
            } else {
                b"PUSH_REG:\x81\xaarequest_id\xa1r".to_vec()
            };
            send(self, bytes, Should::BeIgnored(&["not_for_consumer"]));
        }
        if self.rng.chance(self.rates.unknown_id / 2) {
            self.faults.unknown_id += 1;
            let ghost = format!("ghost-{}", self.rng.below(1 << 20));
            let failure = self.rng.chance(500_000);
            send(
                self,
                notice_bytes(&ghost, tp, failure),
                Should::BeIgnored(&["unknown"]),
            );
        }
        if self.rng.chance(self.rates.expired_id) && !self.finished_ids.is_empty() {
            self.faults.expired_id += 1;
            let i = self.rng.below(self.finished_ids.len() as u64) as usize;
            let bytes = notice_bytes(&self.finished_ids[i], tp, self.rng.chance(300_000));
            send(self, bytes, Should::BeIgnored(&["late", "unknown"]));
        }
        // Named-edge mode only: in counting mode a notice counts whoever sent it (rule 6).
        if request.named && self.rng.chance(self.rates.wrong_sender) {
            self.faults.wrong_sender += 1;
            let event = Event::Deliver {
                d,
                agent: AgentId::STRANGER,
                bytes: notice_bytes(id, tp, false),
                should: Should::BeIgnored(&["unexpected_sender", "late", "unknown"]),
            };
            let at = self.now + self.between(DUPLICATE);
            self.agenda.push(at, event);
        }
    }
}
