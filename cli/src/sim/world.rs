//! The simulated cluster and its event loop: producers push requests to consumers through
//! the real core (`PushPlan` on each producer rank, `Ledger` on each decode rank), faults
//! are injected, and every invariant is checked at the step that could break it.

use std::collections::{BTreeMap, VecDeque};

use kvdrain::producer::{PlanError, PushPlan};
use kvdrain::wire::{self, Completion, Message};
use kvdrain::{AgentId, Config, Expect, IgnoreReason, Millis, Outstanding, RegisterErrorKind};

use super::cluster::Cluster;
use super::consumer::{Consumer, Step};
use super::faults::{Faults, Rates};
use super::memory::Breach;
use super::producer::{Push, Write};
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
        req: u64,
        rank: usize,
        agent: AgentId,
        bytes: Vec<u8>,
    },
    /// A producer rank posts the WRITE of edge `edge` of its plan.
    Post {
        req: u64,
        rank: usize,
        agent: AgentId,
        edge: usize,
    },
    /// A posted WRITE becomes terminal.
    WriteDone { write: u64, ok: bool },
    /// A producer rank forgets a request that ended there (its tombstone expires).
    Forget {
        req: u64,
        rank: usize,
        agent: AgentId,
    },
    /// A producer rank's lease on a request ends.
    LeaseEnd {
        req: u64,
        rank: usize,
        agent: AgentId,
    },
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
    /// The transport fences the dead agent; its replacement comes up.
    Fence { rank: usize, agent: AgentId },
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

/// A notification to send from a producer.
struct Outgoing {
    d: usize,
    agent: AgentId,
    bytes: Vec<u8>,
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
    /// Per producer rank: the requests it is pushing.
    pushes: Vec<BTreeMap<u64, Push>>,
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

fn completion_bytes(id: &str, tp: u16, failure: bool) -> Vec<u8> {
    let c = Completion {
        request_id: id,
        tp_size: tp,
    };
    let mut buf = vec![0; wire::PUSH_FAIL_PREFIX.len() + c.encoded_len()];
    let n = if failure {
        c.encode_failure(&mut buf)
    } else {
        c.encode(&mut buf)
    };
    buf.truncate(n.unwrap_or(0));
    buf
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
            seed: rng.next_u64(),
            // MERGE(settle_ms): once `Config` has the field, add `settle_ms: config.settle_ms,`
        };
        let consumers = (0..cluster.d_tp)
            .map(|_| Consumer::new(tracker, BLOCKS))
            .collect();
        let report = Report {
            requests: config.requests,
            seed: config.seed,
            topology: cluster.describe(),
            ..Report::default()
        };
        Ok(World {
            rates: config.rates,
            config,
            rng,
            now: 0,
            agenda: Agenda::new(),
            pushes: (0..cluster.ranks.len()).map(|_| BTreeMap::new()).collect(),
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
        // Let every deadline and quarantine run out.
        let end = self.now + DEADLINE + QUARANTINE + 1;
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
            Event::Registration {
                req,
                rank,
                agent,
                bytes,
            } => self.registration(req, rank, agent, &bytes),
            Event::Post {
                req,
                rank,
                agent,
                edge,
            } => self.post(req, rank, agent, edge),
            Event::WriteDone { write, ok } => self.write_done(write, ok),
            Event::LeaseEnd { req, rank, agent } => self.lease_end(req, rank, agent),
            Event::Forget { req, rank, agent } => {
                if self.alive_as(rank, agent) {
                    self.pushes[rank].remove(&req);
                }
            }
            Event::Deliver {
                d,
                agent,
                bytes,
                should,
            } => self.deliver(d, agent, &bytes, should),
            Event::ConsumerAbort { req } => self.consumer_abort(req),
            Event::ProducerAbort { req } => self.producer_abort(req),
            Event::Death { rank } => self.death(rank),
            Event::Fence { rank, agent } => self.fence(rank, agent),
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
            let bytes = completion_bytes(&id, topology.p_tp, false);
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
        for rank in producers {
            if Some(rank) == missed {
                continue;
            }
            let mut bytes = vec![0; wire::PUSH_REG_PREFIX.len() + 8];
            let n = wire::encode_registration(&req.to_le_bytes(), &mut bytes);
            bytes.truncate(n.unwrap_or(0));
            let event = Event::Registration {
                req,
                rank,
                agent: self.cluster.ranks[rank].known,
                bytes,
            };
            let at = self.now + self.rng.between(0, REG_LATENCY);
            self.agenda.push(at, event);
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
                completion_bytes(&ghost, tp, failure),
                Should::BeIgnored(&["unknown"]),
            );
        }
        if self.rng.chance(self.rates.expired_id) && !self.finished_ids.is_empty() {
            self.faults.expired_id += 1;
            let i = self.rng.below(self.finished_ids.len() as u64) as usize;
            let bytes = completion_bytes(&self.finished_ids[i], tp, self.rng.chance(300_000));
            send(self, bytes, Should::BeIgnored(&["late", "unknown"]));
        }
        // Named-edge mode only: in counting mode a notice counts whoever sent it (rule 6).
        if request.named && self.rng.chance(self.rates.wrong_sender) {
            self.faults.wrong_sender += 1;
            let event = Event::Deliver {
                d,
                agent: Cluster::STRANGER,
                bytes: completion_bytes(id, tp, false),
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

    fn registration(&mut self, req: u64, rank: usize, agent: AgentId, bytes: &[u8]) {
        if !self.alive_as(rank, agent) {
            return; // sent to an agent that is gone: lost
        }
        match wire::parse(bytes) {
            Ok(Message::Registration(payload)) if payload == req.to_le_bytes() => {}
            other => {
                self.violation(format!(
                    "producer cannot read PUSH_REG {bytes:?}: {other:?}"
                ));
                return;
            }
        }
        let Some(request) = self.requests.get(&req) else {
            return;
        };
        let r = &self.cluster.ranks[rank];
        let topology = self.cluster.engines[request.engine].topology;
        let plan = match PushPlan::new(&topology, r.stage, r.tp) {
            Ok(plan) => plan,
            Err(e) => {
                self.violation(format!("no plan for producer rank {rank}: {e}"));
                return;
            }
        };
        let aborted = request.producer_aborted;
        let targets = plan
            .edges()
            .iter()
            .map(|e| {
                let d = usize::from(e.d_rank);
                (d, request.ranks[d].blocks.clone())
            })
            .collect();
        self.pushes[rank].insert(req, Push::new(plan, targets));
        if aborted {
            self.end_on_producer(req, rank);
            return;
        }
        let delay = if self.rng.chance(self.rates.slow_producer) {
            self.between(SLOW_PREFILL)
        } else {
            self.between(PREFILL)
        };
        self.agenda.push(
            self.now + delay,
            Event::Post {
                req,
                rank,
                agent,
                edge: 0,
            },
        );
        self.agenda
            .push(self.now + LEASE, Event::LeaseEnd { req, rank, agent });
    }

    fn post(&mut self, req: u64, rank: usize, agent: AgentId, edge: usize) {
        if !self.alive_as(rank, agent) {
            return;
        }
        let post_fail = self.rng.chance(self.rates.post_fail);
        let unwind = self.rng.chance(self.rates.unwind);
        let ok = !self.rng.chance(self.rates.write_fail);
        let Some(push) = self.pushes[rank].get_mut(&req) else {
            return;
        };
        let Some(d) = push.plan.edges().get(edge).map(|e| e.d_rank) else {
            return;
        };
        let next = Event::Post {
            req,
            rank,
            agent,
            edge: edge + 1,
        };
        match push.plan.may_post(d) {
            Ok(()) => {}
            Err(PlanError::Retired) => {
                // F4: the request ended on this producer; nothing new is posted.
                self.faults.deferred_post_refused += 1;
                return;
            }
            Err(_) => {
                let at = self.now + self.rng.between(0, POST_GAP);
                self.agenda.push(at, next);
                return;
            }
        }
        if post_fail {
            // C2: the WRITE did not post. Its notice is owed now; the loop may unwind.
            self.faults.post_failed += 1;
            if push.plan.post_failed(d).is_err() {
                self.violation(format!("plan refused post_failed({d})"));
            }
            if unwind {
                self.faults.loop_unwound += 1;
                self.end_on_producer(req, rank);
                return;
            }
            self.send_owed(req, rank);
        } else {
            if let Err(e) = push.plan.posted(d) {
                self.violation(format!("plan refused posted({d}): {e}"));
                return;
            }
            push.reading += 1;
            let d = usize::from(d);
            let blocks = push.blocks(d).unwrap_or_default().to_vec();
            if let Some(request) = self.requests.get_mut(&req) {
                request.ranks[d].in_flight += 1;
            }
            self.consumers[d].pool.write_posted(&blocks);
            let write = self.next_write;
            self.next_write += 1;
            let w = Write {
                req,
                rank,
                agent,
                d,
                blocks,
            };
            self.writes.insert(write, w);
            let at = self.now + self.rng.between(1, WRITE_MAX);
            self.agenda.push(at, Event::WriteDone { write, ok });
        }
        let at = self.now + self.rng.between(0, POST_GAP);
        self.agenda.push(at, next);
    }

    fn write_done(&mut self, write: u64, ok: bool) {
        let Some(w) = self.writes.remove(&write) else {
            return; // cut by its producer's death
        };
        self.end_write(&w, ok);
        let Some(push) = self.pushes[w.rank].get_mut(&w.req) else {
            self.violation(format!("write of request {} ended after its push", w.req));
            return;
        };
        push.reading -= 1;
        let d = w.d as u16;
        if ok {
            if let Err(e) = push.plan.landed(d) {
                self.violation(format!("plan refused landed({d}): {e}"));
            }
            self.completion_sent(&w);
        } else {
            // F7: failed after posting; the notice is owed once the handle is terminal.
            self.faults.failed_after_post += 1;
            if let Err(e) = push.plan.failed(d) {
                self.violation(format!("plan refused failed({d}): {e}"));
            }
            self.send_owed(w.req, w.rank);
        }
        self.settle(w.req, w.rank);
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
        let bytes = completion_bytes(&request.id, tp, false);
        let failure = completion_bytes(&request.id, tp, true);
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

    /// Sends the failure notices the plan owes now.
    fn send_owed(&mut self, req: u64, rank: usize) {
        let (id, tp, silent) = match self.requests.get(&req) {
            Some(r) => (
                r.id.clone(),
                self.cluster.engines[r.engine].topology.p_tp,
                r.producer_aborted && r.producer_silent,
            ),
            None => (String::new(), 1, true),
        };
        let agent = self.cluster.ranks[rank].agent;
        let Some(push) = self.pushes[rank].get_mut(&req) else {
            return;
        };
        let owed: Vec<u16> = push.plan.owed_notices().collect();
        let mut outgoing = Vec::new();
        let mut problems = Vec::new();
        for d in owed {
            let lost = silent || self.rng.chance(self.rates.notice_lost);
            let step = if lost {
                self.faults.notice_lost += u64::from(!silent);
                push.plan.unreachable(d)
            } else {
                outgoing.push(Outgoing {
                    d: usize::from(d),
                    agent,
                    bytes: completion_bytes(&id, tp, true),
                });
                push.plan.noticed(d)
            };
            if let Err(e) = step {
                problems.push(format!("plan refused to settle owed notice {d}: {e}"));
            }
        }
        for o in outgoing {
            self.send(o.d, o.agent, o.bytes);
        }
        for p in problems {
            self.violation(p);
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

    /// The request ended on this producer (lease, abort, unwound loop): nothing new is
    /// posted and every edge not attempted is owed a notice.
    fn end_on_producer(&mut self, req: u64, rank: usize) {
        if let Some(push) = self.pushes[rank].get_mut(&req) {
            push.lease_over = true;
            push.plan.retire();
        }
        self.send_owed(req, rank);
        self.settle(req, rank);
    }

    /// Releases the source blocks once the plan is terminal (never while a WRITE still
    /// reads them: F3), and forgets the push once the request ended here too.
    fn settle(&mut self, req: u64, rank: usize) {
        let Some(push) = self.pushes[rank].get_mut(&req) else {
            return;
        };
        if push.plan.is_terminal() && !push.source_released {
            push.source_released = true;
            let reading = push.reading;
            if reading > 0 {
                self.violation(format!(
                    "producer rank {rank} released the source blocks of request {req} \
                     while {reading} WRITE(s) read them"
                ));
            }
        }
        let Some(push) = self.pushes[rank].get_mut(&req) else {
            return;
        };
        if push.source_released && push.lease_over && !push.forget_scheduled {
            push.forget_scheduled = true;
            let agent = self.cluster.ranks[rank].agent;
            let at = self.now + PRODUCER_TOMBSTONE;
            self.agenda.push(at, Event::Forget { req, rank, agent });
        }
    }

    fn lease_end(&mut self, req: u64, rank: usize, agent: AgentId) {
        if !self.alive_as(rank, agent) {
            return;
        }
        let Some(push) = self.pushes[rank].get(&req) else {
            return;
        };
        if !push.plan.is_terminal() {
            // F3: the lease ran out mid-push; in-flight WRITEs keep the source blocks.
            self.faults.lease_expired_in_flight += 1;
        }
        self.end_on_producer(req, rank);
    }

    fn producer_abort(&mut self, req: u64) {
        let silent = self.rng.chance(self.rates.producer_abort_silent);
        let Some(request) = self.requests.get_mut(&req) else {
            return;
        };
        // F5: the producer aborts too; a silent one never sends what it owes.
        request.producer_aborted = true;
        request.producer_silent = silent;
        self.faults.producer_abort += 1;
        for rank in self.cluster.ranks_of(request.engine) {
            if self.pushes[rank].contains_key(&req) {
                self.end_on_producer(req, rank);
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
        self.pushes[rank].clear();
        if self.rng.chance(self.rates.fenced) {
            self.faults.producer_death_fenced += 1;
            let at = self.now + self.between(FENCE_AFTER);
            self.agenda.push(at, Event::Fence { rank, agent });
        } else {
            self.faults.producer_death_unfenced += 1;
            self.agenda
                .push(self.now + REDISCOVER_AFTER, Event::Rediscover { rank });
        }
    }

    fn fence(&mut self, rank: usize, agent: AgentId) {
        for d in 0..self.consumers.len() {
            let mut steps = Vec::new();
            self.decisions.fenced_edges += u64::from(self.consumers[d].fence(agent, &mut steps));
            self.apply(d, steps);
        }
        self.cluster.restart(rank);
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
        let held: usize = self
            .pushes
            .iter()
            .map(|p| p.values().filter(|p| !p.source_released).count())
            .sum();
        if held != 0 || !self.writes.is_empty() {
            self.violation(format!(
                "producers at the end: {held} pushes hold source blocks, {} writes pending",
                self.writes.len()
            ));
        }
        if self.arrived != self.config.requests {
            self.violation(format!(
                "{} of {} requests arrived",
                self.arrived, self.config.requests
            ));
        }
    }
}
