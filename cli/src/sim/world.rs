//! The simulated cluster and its event loop: producers push requests to consumers through
//! the real code (the shared producer driver on each producer rank, pairing, leases, retired
//! ids and plans included; the `Ledger` on each decode rank), faults are injected, and every
//! invariant is checked at the step that could break it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvdrain::{AgentId, Config, Expect, IgnoreReason, Millis, Outstanding, RegisterErrorKind};
use kvdrain_driver::producer::{
    Offer, ProducerConfig, ProducerDriver, ProducerEvent, notice_bytes,
};
use kvdrain_driver::registration::PushRegistration;
use kvdrain_driver::transport::{Notification, WriteStatus};

use super::cluster::Cluster;
use super::consumer::{Consumer, Step};
use super::faults::{Faults, Rates};
use super::link::{PostedWrite, SimLink, SimWrite, request_number};
use super::memory::Breach;
use super::producer::Write;
use super::queue::Agenda;
use super::report::{Decisions, Report};
use super::requests::{EdgeTrack, Outcome, RankPart, Request};
use super::rng::Rng;
use super::timing::*;
use super::{Broken, SimConfig};

/// Requests tracked at once per decode rank (bursts overflow it).
const CAPACITY: usize = 256;
/// KV blocks per decode rank.
const BLOCKS: u32 = 4096;
/// Blocks a request holds on each decode rank.
const BLOCKS_PER_REQUEST: (u64, u64) = (1, 4);
/// Share of requests registered in named-edge mode (the rest count, as vLLM does).
const NAMED_PPM: u32 = 700_000;
/// Ids of finished requests kept for "notice for an expired id" noise.
const FINISHED_KEPT: usize = 256;

/// What the consumer must do with an injected notification.
#[derive(Clone, Copy, Debug)]
enum Should {
    /// A genuine notice from a producer: it may count or come late, but it is never
    /// malformed, producer-bound or from a stranger.
    Genuine,
    /// Noise: it must be ignored for one of these reasons.
    BeIgnored(&'static [&'static str]),
}

#[derive(Debug)]
enum Event {
    /// The next client request arrives at the decode engine.
    Arrive,
    /// `PUSH_REG` reaches a producer rank.
    Registration {
        rank: usize,
        agent: AgentId,
        bytes: Vec<u8>,
    },
    /// Prefill ends on a producer rank: it offers the request's source blocks.
    Offer {
        req: u64,
        rank: usize,
        agent: AgentId,
    },
    /// A producer rank's driver runs one tick, once for every input that arrived at this
    /// virtual time.
    ProducerTick { rank: usize, agent: AgentId },
    /// A lease on a producer rank may have ended: tick it.
    LeaseCheck { rank: usize, agent: AgentId },
    /// A posted WRITE becomes terminal (`unknown`: its producer cannot read its status).
    WriteDone { write: u64, ok: bool, unknown: bool },
    /// A notification reaches a decode rank.
    Deliver {
        d: usize,
        agent: AgentId,
        bytes: Vec<u8>,
        should: Should,
    },
    /// The client cancels: the decode engine aborts.
    ConsumerAbort { req: u64 },
    /// The prefill engine aborts.
    ProducerAbort { req: u64 },
    /// A producer rank dies.
    Death { rank: usize },
    /// The transport sees the dead agent gone (peer gone); its replacement comes up.
    DeathSeen { rank: usize, agent: AgentId },
    /// `settle_ms` after its death was seen, the consumers fence the dead agent: bytes it
    /// had in flight may land until then (the consumer driver's rule, issue 9).
    Fence { agent: AgentId },
    /// The replacement of an unfenced dead agent comes up.
    Rediscover { rank: usize },
    /// Decoding ends: the blocks of a completed request go back.
    DecodeDone { req: u64, d: usize },
    /// The last bytes of an errored WRITE land, after its producer saw the error.
    LateLanding {
        req: u64,
        d: usize,
        blocks: Vec<u32>,
    },
}

/// The whole simulated cluster.
pub struct World {
    config: SimConfig,
    rates: Rates,
    rng: Rng,
    now: Millis,
    agenda: Agenda<Event>,
    cluster: Cluster,
    consumers: Vec<Consumer>,
    requests: BTreeMap<u64, Request>,
    /// Per producer rank: the shared producer driver, its inbox, and the outcomes of its
    /// WRITEs that ended (read by its next status polls).
    producers: Vec<ProducerDriver<SimWrite>>,
    inboxes: Vec<Vec<Notification>>,
    finished: Vec<BTreeMap<u64, WriteStatus>>,
    /// Per request, the physical blocks of each decode rank (what the transport writes).
    targets: BTreeMap<u64, Vec<Vec<u32>>>,
    /// Requests whose producer aborted without sending what it owes.
    silent: BTreeSet<u64>,
    /// Per producer rank: a tick is queued at the current virtual time.
    tick_queued: Vec<bool>,
    writes: BTreeMap<u64, Write>,
    next_write: u64,
    arrived: u64,
    burst_left: u64,
    finished_ids: VecDeque<String>,
    breaches: Vec<Breach>,
    faults: Faults,
    decisions: Decisions,
    report: Report,
}

/// The producer driver's configuration of simulated producer rank `rank`.
fn producer_config(cluster: &Cluster, rank: usize) -> ProducerConfig {
    let r = &cluster.ranks[rank];
    let topology = cluster.engines[r.engine].topology;
    let mut config = ProducerConfig::new(&producer_engine(r.engine), r.tp, topology.p_tp);
    config.pp_stage = r.stage;
    config.pp_size = topology.p_pp;
    config.mla = topology.mla;
    config.lease_ms = LEASE;
    config
}

fn producer_engine(engine: usize) -> String {
    format!("p{engine}")
}

/// P's id of request `req`: vLLM randomizes ids per engine, so P's differs from D's
/// (`req-N`) by an 8-hex-digit suffix and the drivers pair them by base id.
fn producer_request_id(req: u64) -> String {
    format!("req-{req}-{:08x}", req.wrapping_mul(0x9e37_79b9) as u32)
}

/// Records `outcome`; what is wrong if the request had one already (spec rule 2).
fn set_outcome(part: &mut RankPart, outcome: Outcome) -> Option<String> {
    let old = part.outcome.replace(outcome)?;
    Some(format!("{outcome:?} after {old:?}"))
}

impl World {
    /// Builds the cluster of `config`.
    ///
    /// # Errors
    /// Why the topology cannot be simulated.
    pub fn new(config: SimConfig) -> Result<Self, String> {
        let mut rng = Rng::new(config.seed);
        let cluster = Cluster::new(config.shape, &mut rng)?;
        let tracker = Config {
            capacity: CAPACITY,
            deadline_ms: DEADLINE,
            quarantine_ms: QUARANTINE,
            settle_ms: config.settle_ms,
            seed: rng.next_u64(),
        };
        let consumers = (0..cluster.d_tp)
            .map(|_| Consumer::new(tracker, BLOCKS))
            .collect();
        let report = Report {
            requests: config.requests,
            seed: config.seed,
            topology: cluster.describe(),
            settle_ms: config.settle_ms,
            ..Report::default()
        };
        let producers = (0..cluster.ranks.len())
            .map(|rank| ProducerDriver::new(producer_config(&cluster, rank)))
            .collect();
        Ok(World {
            rates: config.rates,
            config,
            rng,
            now: 0,
            agenda: Agenda::new(),
            producers,
            inboxes: vec![Vec::new(); cluster.ranks.len()],
            finished: vec![BTreeMap::new(); cluster.ranks.len()],
            targets: BTreeMap::new(),
            silent: BTreeSet::new(),
            tick_queued: vec![false; cluster.ranks.len()],
            cluster,
            consumers,
            requests: BTreeMap::new(),
            writes: BTreeMap::new(),
            next_write: 0,
            arrived: 0,
            burst_left: 0,
            finished_ids: VecDeque::new(),
            breaches: Vec::new(),
            faults: Faults::default(),
            decisions: Decisions::default(),
            report,
        })
    }

    /// Runs every request to its end, then checks that nothing leaked.
    pub fn run(mut self) -> Report {
        if self.config.requests > 0 {
            self.agenda.push(0, Event::Arrive);
        }
        self.drain();
        // Let every deadline, quarantine and settling run out.
        let end = self.now + DEADLINE + QUARANTINE + self.config.settle_ms + 1;
        self.advance(end);
        self.drain();
        self.final_checks();
        self.report.faults = self.faults;
        self.report.decisions = self.decisions;
        self.report.virtual_ms = self.now;
        self.report
    }

    fn drain(&mut self) {
        while let Some(at) = self.agenda.next_at() {
            if at > self.now {
                self.advance(at);
            }
            let Some((_, event)) = self.agenda.pop() else {
                break;
            };
            self.report.steps += 1;
            self.handle(event);
            self.flush_breaches();
        }
    }

    fn violation(&mut self, what: String) {
        self.report.violation(self.report.steps, self.now, what);
    }

    fn flush_breaches(&mut self) {
        for breach in std::mem::take(&mut self.breaches) {
            self.violation(breach.to_string());
        }
    }

    /// Moves the clock: every decode rank advances its tracker (scheduler step).
    fn advance(&mut self, to: Millis) {
        self.now = to;
        for d in 0..self.consumers.len() {
            let mut steps = Vec::new();
            self.consumers[d].advance(to, &mut steps);
            self.apply(d, steps);
            // Spec rule 2: by the first advance reaching its deadline, a request has its
            // outcome.
            if let Some(req) = self.consumers[d].overdue(to) {
                self.violation(format!(
                    "request {req} on rank {d} has no outcome after its deadline"
                ));
            }
        }
        self.flush_breaches();
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Arrive => self.arrive(),
            Event::Registration { rank, agent, bytes } => self.registration(rank, agent, bytes),
            Event::Offer { req, rank, agent } => self.offer(req, rank, agent),
            Event::ProducerTick { rank, agent } => {
                self.tick_queued[rank] = false;
                if self.alive_as(rank, agent) {
                    self.producer_tick(rank);
                }
            }
            Event::LeaseCheck { rank, agent } => {
                if self.alive_as(rank, agent) {
                    self.want_tick(rank);
                }
            }
            Event::WriteDone { write, ok, unknown } => self.write_done(write, ok, unknown),
            Event::Deliver {
                d,
                agent,
                bytes,
                should,
            } => self.deliver(d, agent, &bytes, should),
            Event::ConsumerAbort { req } => self.consumer_abort(req),
            Event::ProducerAbort { req } => self.producer_abort(req),
            Event::Death { rank } => self.death(rank),
            Event::DeathSeen { rank, agent } => self.death_seen(rank, agent),
            Event::Fence { agent } => self.fence(agent),
            Event::Rediscover { rank } => self.cluster.restart(rank),
            Event::DecodeDone { req, d } => self.decode_done(req, d),
            Event::LateLanding { req, d, blocks } => {
                let pool = &mut self.consumers[d].pool;
                pool.write_lands(&blocks, req, &mut self.breaches);
                pool.write_ended(&blocks);
            }
        }
    }

    fn between(&mut self, (lo, hi): (u64, u64)) -> u64 {
        self.rng.between(lo, hi)
    }

    // ----- decode side -------------------------------------------------------------------

    fn arrive(&mut self) {
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
            self.deliver(0, agent, &bytes, Should::BeIgnored(&["unknown"]));
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
        let expected = topology.expected_per_consumer_rank() as u8;
        // A full table on any rank: the request is not pushed (the engine would prefill it
        // locally). The full rank's ledger must say so; no rank registers, so no slot is
        // tied up by a request nobody will write.
        if let Some(d) = self.consumers.iter().position(Consumer::is_full) {
            self.faults.table_full += 1;
            let registered = self.consumers[d].register(
                req,
                &request.id,
                Expect::Count(expected),
                deadline_ms,
                DEADLINE,
            );
            match registered {
                Err(RegisterErrorKind::Full) => self.decisions.rejected_full += 1,
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
        for (d, part) in request.ranks.iter_mut().enumerate() {
            let agents: Vec<AgentId> = part
                .edges
                .iter()
                .map(|e| self.cluster.ranks[e.rank].known)
                .collect();
            let expect = if named {
                Expect::Edges(&agents)
            } else {
                Expect::Count(expected)
            };
            let registered =
                self.consumers[d].register(req, &request.id, expect, deadline_ms, DEADLINE);
            if let Err(e) = registered {
                let what = format!("registration of {} on rank {d}: {e:?}", request.id);
                self.report.violation(self.report.steps, self.now, what);
            }
        }
        if self.rng.chance(self.rates.duplicate_registration) {
            self.faults.duplicate_registration += 1;
            match self.consumers[0].register(u64::MAX, &request.id, Expect::Count(1), None, 0) {
                Err(RegisterErrorKind::DuplicateId) => self.decisions.rejected_duplicate_id += 1,
                other => {
                    self.violation(format!("second registration of {}: {other:?}", request.id))
                }
            }
        }
        // PUSH_REG to every producer rank of the engine; F6: one of them is missed.
        let producers = self.cluster.ranks_of(engine);
        let missed = self
            .rng
            .chance(self.rates.partial_registration)
            .then(|| producers.start + self.rng.below(producers.len() as u64) as usize);
        self.faults.partial_registration += u64::from(missed.is_some());
        let registration = PushRegistration {
            request_id: request.id.clone(),
            decode_engine_id: "d".to_owned(),
            decode_host: "sim".to_owned(),
            decode_port: 0,
            decode_tp_size: self.cluster.d_tp,
            local_block_ids: vec![Vec::new()],
            remote_engine_id: producer_engine(engine),
            remote_host: "sim".to_owned(),
            remote_port: 0,
            remote_tp_size: topology.p_tp,
            remote_pp_size: topology.p_pp,
            transfer_id: None,
        }
        .to_notification();
        self.targets.insert(
            req,
            request.ranks.iter().map(|p| p.blocks.clone()).collect(),
        );
        for rank in producers {
            // Prefill ends and the rank offers its source blocks (its lease starts).
            let agent = self.cluster.ranks[rank].agent;
            let at = self.now + self.between(PREFILL);
            self.agenda.push(at, Event::Offer { req, rank, agent });
            if Some(rank) == missed {
                continue;
            }
            // A slow path delays the registration past most of the lease: the lease may end
            // mid-write (F3) or before the registration arrives (F4).
            let delay = if self.rng.chance(self.rates.slow_producer) {
                self.between(SLOW_PREFILL)
            } else {
                self.rng.between(0, REG_LATENCY)
            };
            let event = Event::Registration {
                rank,
                agent: self.cluster.ranks[rank].known,
                bytes: registration.clone(),
            };
            self.agenda.push(self.now + delay, event);
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
                agent: Cluster::STRANGER,
                bytes: notice_bytes(id, tp, false),
                should: Should::BeIgnored(&["unexpected_sender", "late", "unknown"]),
            };
            let at = self.now + self.between(DUPLICATE);
            self.agenda.push(at, event);
        }
    }

    fn deliver(&mut self, d: usize, agent: AgentId, bytes: &[u8], should: Should) {
        let mut steps = Vec::new();
        let result = self.consumers[d].notify(agent, bytes, &mut steps);
        if let Err(reason) = result {
            self.decisions.ignored(reason);
        }
        let fine = match should {
            Should::Genuine => !matches!(
                result,
                Err(IgnoreReason::Malformed(_)
                    | IgnoreReason::NotForConsumer
                    | IgnoreReason::UnexpectedSender)
            ),
            Should::BeIgnored(reasons) => {
                matches!(result, Err(r) if reasons.contains(&r.as_str()))
            }
        };
        if !fine {
            self.violation(format!(
                "notification {:?} from agent {} on rank {d}: {result:?}, expected {should:?}",
                String::from_utf8_lossy(bytes),
                agent.0
            ));
        }
        self.apply(d, steps);
    }

    fn consumer_abort(&mut self, req: u64) {
        let mid_push = self.abort_everywhere(req);
        self.faults.aborted_mid_push += u64::from(mid_push);
        self.maybe_finish(req);
    }

    /// Aborts `req` on every rank still counting; whether writes or edges were still owed.
    fn abort_everywhere(&mut self, req: u64) -> bool {
        let Some(request) = self.requests.get_mut(&req) else {
            return false;
        };
        let mut mid_push = false;
        for (d, part) in request.ranks.iter_mut().enumerate() {
            let Some(outstanding) = self.consumers[d].abort(req) else {
                continue;
            };
            self.decisions.aborted += 1;
            mid_push |= part.in_flight > 0
                || match outstanding {
                    Outstanding::Count(n) => n > 0,
                    Outstanding::Edges(mask) => mask != 0,
                };
            if let Some(old) = part.outcome.replace(Outcome::Aborted) {
                self.report.violation(
                    self.report.steps,
                    self.now,
                    format!("request {req} aborted on rank {d} after {old:?}"),
                );
            }
            if self.config.broken == Some(Broken::ReleaseOnAbort) && !part.done {
                // The deliberately broken tracker: blocks go back at the abort.
                self.consumers[d]
                    .pool
                    .free(&part.blocks, req, &mut self.breaches);
                part.done = true;
            }
        }
        mid_push
    }

    fn decode_done(&mut self, req: u64, d: usize) {
        if let Some(request) = self.requests.get_mut(&req) {
            let part = &mut request.ranks[d];
            self.consumers[d]
                .pool
                .free(&part.blocks, req, &mut self.breaches);
            part.done = true;
        }
        self.maybe_finish(req);
    }

    /// Acts on the tracker's decisions for decode rank `d`, checking each against what
    /// the simulation knows.
    fn apply(&mut self, d: usize, steps: Vec<(u64, Step)>) {
        for (req, step) in steps {
            let Some(request) = self.requests.get_mut(&req) else {
                self.violation(format!("decision {step:?} for unknown request {req}"));
                continue;
            };
            let incomplete = request.incomplete(d);
            let part = &mut request.ranks[d];
            let mut wrong = None;
            match step {
                Step::Completed => {
                    self.decisions.completed += 1;
                    wrong = set_outcome(part, Outcome::Completed);
                    if let Some(why) = incomplete {
                        wrong = Some(format!("completed but {why}"));
                    }
                    let at = self.now + self.between(DECODE);
                    self.agenda.push(at, Event::DecodeDone { req, d });
                }
                Step::Failed => {
                    self.decisions.failed += 1;
                    wrong = set_outcome(part, Outcome::Failed);
                    part.decided_at = self.now;
                }
                Step::Expired => {
                    self.decisions.expired += 1;
                    wrong = set_outcome(part, Outcome::Expired);
                    self.faults.deadline_expired_in_flight += u64::from(part.in_flight > 0);
                }
                Step::Released { forced } => {
                    if forced {
                        self.decisions.released_forced += 1;
                    } else {
                        self.decisions.released += 1;
                    }
                    if !matches!(
                        part.outcome,
                        Some(Outcome::Failed | Outcome::Aborted | Outcome::Expired)
                    ) || part.released
                    {
                        wrong = Some(format!(
                            "released after {:?} (released before: {})",
                            part.outcome, part.released
                        ));
                    }
                    part.released = true;
                    if part.outcome == Some(Outcome::Failed) {
                        // The cost of settling: blocks held after the request failed.
                        let held = self.now - part.decided_at;
                        self.report.held_after_failed_block_ms += held * part.blocks.len() as u64;
                    }
                    if !part.done {
                        self.consumers[d]
                            .pool
                            .free(&part.blocks, req, &mut self.breaches);
                        part.done = true;
                    }
                }
            }
            if let Some(what) = wrong {
                self.violation(format!("request {req} on rank {d}: {what}"));
            }
            self.maybe_finish(req);
        }
    }

    fn maybe_finish(&mut self, req: u64) {
        if self.requests.get(&req).is_some_and(Request::finished) {
            if let Some(request) = self.requests.remove(&req) {
                if self.finished_ids.len() == FINISHED_KEPT {
                    self.finished_ids.pop_front();
                }
                self.finished_ids.push_back(request.id);
            }
        }
    }

    // ----- producer side -----------------------------------------------------------------

    fn alive_as(&self, rank: usize, agent: AgentId) -> bool {
        let r = &self.cluster.ranks[rank];
        r.alive && r.agent == agent
    }

    /// `PUSH_REG` reaches a producer rank (lost if the agent it was sent to is gone).
    fn registration(&mut self, rank: usize, agent: AgentId, bytes: Vec<u8>) {
        if !self.alive_as(rank, agent) {
            return;
        }
        self.inboxes[rank].push(("d".to_owned(), bytes));
        self.want_tick(rank);
    }

    /// Prefill ended on `rank`: the engine offers the source blocks (not if the prefill
    /// engine aborted the request: vLLM frees its blocks at once then).
    fn offer(&mut self, req: u64, rank: usize, agent: AgentId) {
        if !self.alive_as(rank, agent) || self.requests.get(&req).is_none_or(|r| r.producer_aborted)
        {
            return;
        }
        let offer = Offer {
            request_id: producer_request_id(req),
            transfer_id: None,
            block_ids: vec![Vec::new()],
        };
        if let Err(e) = self.producers[rank].offer(offer, self.now) {
            self.violation(format!("producer rank {rank} refused an offer: {e}"));
        }
        self.want_tick(rank);
        // The lease may end: look then.
        self.agenda
            .push(self.now + LEASE + 1, Event::LeaseCheck { rank, agent });
    }

    /// Queues one tick of `rank` at the current time (after every event already queued for
    /// it, so inputs that arrive together are handled by one tick).
    fn want_tick(&mut self, rank: usize) {
        if !self.tick_queued[rank] {
            self.tick_queued[rank] = true;
            let agent = self.cluster.ranks[rank].agent;
            self.agenda
                .push(self.now, Event::ProducerTick { rank, agent });
        }
    }

    /// One tick of `rank`'s producer driver over the virtual network, then what it asked
    /// for: WRITEs scheduled, notices sent, source releases checked (F3).
    fn producer_tick(&mut self, rank: usize) {
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
        let _ = self.producers[rank].tick(&mut link, self.now);
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

    fn write_done(&mut self, write: u64, ok: bool, unknown: bool) {
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
    /// late-landing fault: TCP socket buffers drained after the error, issue 9).
    fn end_write(&mut self, w: &Write, whole: bool) {
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

    fn deliver_at(&mut self, at: Millis, d: usize, agent: AgentId, bytes: Vec<u8>) {
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

    fn producer_abort(&mut self, req: u64) {
        let silent = self.rng.chance(self.rates.producer_abort_silent);
        let Some(request) = self.requests.get_mut(&req) else {
            return;
        };
        // F5: the producer aborts too; a silent one never sends what it owes.
        request.producer_aborted = true;
        request.producer_silent = silent;
        if silent {
            self.silent.insert(req);
        }
        self.faults.producer_abort += 1;
        let p_id = producer_request_id(req);
        for rank in self.cluster.ranks_of(request.engine) {
            if self.cluster.ranks[rank].alive {
                self.producers[rank].retire(&p_id);
                self.want_tick(rank);
            }
        }
    }

    fn death(&mut self, rank: usize) {
        if !self.cluster.ranks[rank].alive {
            return;
        }
        self.cluster.ranks[rank].alive = false;
        let agent = self.cluster.ranks[rank].agent;
        // Its WRITEs stop: part of each may have landed, nothing more will.
        let cut: Vec<u64> = self
            .writes
            .iter()
            .filter(|(_, w)| w.agent == agent)
            .map(|(&id, _)| id)
            .collect();
        for id in cut {
            if let Some(w) = self.writes.remove(&id) {
                self.end_write(&w, false);
            }
        }
        // Everything the dead incarnation knew is gone with it.
        self.producers[rank] = ProducerDriver::new(producer_config(&self.cluster, rank));
        self.inboxes[rank].clear();
        self.finished[rank].clear();
        if self.rng.chance(self.rates.fenced) {
            self.faults.producer_death_fenced += 1;
            let at = self.now + self.between(FENCE_AFTER);
            self.agenda.push(at, Event::DeathSeen { rank, agent });
        } else {
            self.faults.producer_death_unfenced += 1;
            self.agenda
                .push(self.now + REDISCOVER_AFTER, Event::Rediscover { rank });
        }
    }

    /// The transport reports `agent` gone: its replacement comes up at once, but the
    /// consumers fence it only `settle_ms` later, as the consumer driver does
    /// (`to_fence`): a dead producer's errored WRITEs keep landing for a while after its
    /// death is seen (the late-landing fault; 173 ms measured over UCX TCP), and a fence
    /// at once would release blocks they still land in.
    fn death_seen(&mut self, rank: usize, agent: AgentId) {
        self.cluster.restart(rank);
        let at = self.now + self.config.settle_ms;
        self.agenda.push(at, Event::Fence { agent });
    }

    fn fence(&mut self, agent: AgentId) {
        for d in 0..self.consumers.len() {
            let mut steps = Vec::new();
            self.decisions.fenced_edges += u64::from(self.consumers[d].fence(agent, &mut steps));
            self.apply(d, steps);
        }
    }

    // ----- the end -----------------------------------------------------------------------

    fn final_checks(&mut self) {
        let leftovers: Vec<String> = self
            .requests
            .iter()
            .map(|(req, r)| {
                let ranks: Vec<String> = r
                    .ranks
                    .iter()
                    .map(|p| format!("{:?}/released={}/done={}", p.outcome, p.released, p.done))
                    .collect();
                format!(
                    "request {req} (arrived {} ms) never gave all its blocks back: {}",
                    r.arrived,
                    ranks.join(", ")
                )
            })
            .collect();
        for what in leftovers {
            self.violation(what);
        }
        for d in 0..self.consumers.len() {
            let c = &self.consumers[d];
            let (free, in_flight, tracked) =
                (c.pool.free_blocks(), c.pool.writes_in_flight(), c.tracked());
            if free != BLOCKS as usize || in_flight != 0 || tracked != 0 {
                self.violation(format!(
                    "rank {d} at the end: {free} of {BLOCKS} blocks free, \
                     {in_flight} writes in flight, {tracked} requests tracked"
                ));
            }
        }
        // A request with a WRITE of unknown status keeps its sources fenced until a backend
        // error to the same decode rank bounds it (F7); at the end none may be held otherwise.
        let held: usize = self
            .producers
            .iter()
            .map(|p| p.in_flight() - p.fenced_unknown())
            .sum();
        if held != 0 || !self.writes.is_empty() {
            self.violation(format!(
                "producers at the end: {held} requests held, {} writes pending",
                self.writes.len()
            ));
        }
        self.faults.deferred_post_refused = self
            .producers
            .iter()
            .map(|p| p.counters().registrations_retired)
            .sum();
        if self.arrived != self.config.requests {
            self.violation(format!(
                "{} of {} requests arrived",
                self.arrived, self.config.requests
            ));
        }
    }
}
