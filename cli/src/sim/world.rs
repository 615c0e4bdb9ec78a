//! The simulated cluster and its event loop: producers push requests to consumers through
//! the real code (the shared producer driver on each producer rank, pairing, leases, retired
//! ids and plans included; the shared consumer driver on each decode rank, directory,
//! registration, heartbeats and fences included), faults are injected, and every invariant
//! is checked at the step that could break it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvdrain::{AgentId, BlockHandle, Config, IgnoreReason, Millis, Noticed, Outstanding};
use kvdrain::{RegisterErrorKind, producer::Topology};
use kvdrain_driver::consumer::{
    ConsumerConfig, ConsumerDriver, ConsumerError, EdgeMode, ProducerEngine, PushRequest,
};
use kvdrain_driver::producer::{
    Offer, ProducerConfig, ProducerDriver, ProducerEvent, notice_bytes,
};
use kvdrain_driver::transport::{Notification, WriteStatus};

use super::cluster::Cluster;
use super::decode::{DecodeRank, EDGES, SLOTS, Step};
use super::decode_link::{DecodeLink, RequestPaths, ToProducer};
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
    /// A decode rank's `PUSH_REG` or `HB:` reaches a producer rank (sent to `agent`).
    ToProducer {
        from: usize,
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
    consumers: Vec<DecodeRank>,
    /// Per request in flight, the network's paths to its producer ranks.
    paths: BTreeMap<u64, RequestPaths>,
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
    /// Per producer rank: when the lease check queued last falls.
    lease_check_at: Vec<Millis>,
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

/// The decode engine's id.
const DECODE_ENGINE: &str = "d";

/// The consumer driver's configuration of decode rank `d`.
fn consumer_config(cluster: &Cluster, d: u16, ledger: Config) -> ConsumerConfig {
    ConsumerConfig {
        engine_id: DECODE_ENGINE.to_owned(),
        host: "sim".to_owned(),
        port: 0,
        tp_rank: d,
        tp_size: cluster.d_tp,
        lease_ms: LEASE,
        ledger,
    }
}

/// Prefill engine `engine` as the decode ranks know it: its shape and the agents they
/// believe run its ranks.
fn known_engine(cluster: &Cluster, engine: usize) -> ProducerEngine {
    let Topology {
        p_tp, p_pp, mla, ..
    } = cluster.engines[engine].topology;
    ProducerEngine {
        engine_id: producer_engine(engine),
        host: "sim".to_owned(),
        port: 0,
        tp_size: p_tp,
        pp_size: p_pp,
        mla,
        agents: cluster
            .ranks_of(engine)
            .map(|rank| Cluster::agent_name(cluster.ranks[rank].known))
            .collect(),
    }
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
        let mut consumers: Vec<DecodeRank> = (0..cluster.d_tp)
            .map(|d| DecodeRank::new(consumer_config(&cluster, d, tracker), BLOCKS))
            .collect();
        for rank in &mut consumers {
            for engine in 0..cluster.engines.len() {
                rank.driver
                    .add_producer_engine(known_engine(&cluster, engine))
                    .map_err(|e| e.to_string())?;
            }
        }
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
            lease_check_at: vec![0; cluster.ranks.len()],
            cluster,
            consumers,
            paths: BTreeMap::new(),
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

    /// Runs events in time order; between them, the decode ranks are polled whenever one
    /// of their drivers has work due (a fence, a heartbeat round, a timer).
    fn drain(&mut self) {
        loop {
            let at = match (self.agenda.next_at(), self.next_wakeup()) {
                (Some(event), Some(wakeup)) => event.min(wakeup),
                (Some(at), None) | (None, Some(at)) => at,
                (None, None) => break,
            };
            if at > self.now {
                self.advance(at);
            }
            if self.agenda.next_at().is_none_or(|at| at > self.now) {
                continue;
            }
            let Some((_, event)) = self.agenda.pop() else {
                break;
            };
            self.report.steps += 1;
            self.handle(event);
            self.flush_breaches();
        }
    }

    /// The earliest time a decode rank's driver has work due, after now.
    fn next_wakeup(&mut self) -> Option<Millis> {
        self.consumers
            .iter_mut()
            .filter_map(|c| c.driver.engine().next_wakeup_ms())
            .min()
            .map(|at| at.max(self.now + 1))
    }

    fn violation(&mut self, what: String) {
        self.report.violation(self.report.steps, self.now, what);
    }

    fn flush_breaches(&mut self) {
        for breach in std::mem::take(&mut self.breaches) {
            self.violation(breach.to_string());
        }
    }

    /// Moves the clock: every decode rank polls its driver (scheduler step).
    fn advance(&mut self, to: Millis) {
        self.now = to;
        for d in 0..self.consumers.len() {
            self.poll_decode(d);
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
            Event::ToProducer {
                from,
                rank,
                agent,
                bytes,
            } => self.producer_hears(from, rank, agent, bytes),
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
            } => self.deliver(d, agent, bytes, should),
            Event::ConsumerAbort { req } => self.consumer_abort(req),
            Event::ProducerAbort { req } => self.producer_abort(req),
            Event::Death { rank } => self.death(rank),
            Event::DeathSeen { rank, agent } => self.death_seen(rank, agent),
            Event::Rediscover { rank } => self.restart(rank),
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
        let push = |blocks: u64| PushRequest {
            id: &request.id,
            producer_engine: &engine_id,
            remote_request_id: &p_id,
            transfer_id: None,
            blocks: BlockHandle(blocks),
            block_ids: vec![Vec::new()],
            deadline_ms,
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

    /// Decode rank `d`'s driver and its view of the network, now.
    fn decode_rank(&mut self, d: usize) -> (&mut ConsumerDriver<SLOTS, EDGES>, DecodeLink<'_>) {
        let rank = &mut self.consumers[d];
        let link = DecodeLink {
            now: self.now,
            rng: &mut self.rng,
            cluster: &self.cluster,
            paths: &self.paths,
            inbox: &mut rank.inbox,
            gone: &mut rank.gone,
            registering: None,
            sent: Vec::new(),
        };
        (&mut rank.driver, link)
    }

    /// Registers a request on decode rank `d` through its driver (which sends `PUSH_REG`).
    fn register(
        &mut self,
        d: usize,
        request: PushRequest<'_>,
        mode: EdgeMode,
    ) -> Result<(), ConsumerError> {
        let now = self.now;
        let req = request_number(request.id);
        let (driver, mut link) = self.decode_rank(d);
        link.registering = req;
        let registered = driver.engine().register_with(&mut link, request, mode, now);
        let sent = link.sent;
        self.schedule_sent(d, sent);
        registered.map(|_| ())
    }

    /// One scheduler step of decode rank `d`: its driver drains what was delivered, fences,
    /// advances its clock and heartbeats; its decisions are applied. Returns what the core
    /// made of each notification drained.
    fn poll_decode(&mut self, d: usize) -> Vec<Result<Noticed, IgnoreReason>> {
        let now = self.now;
        let mut seen = Vec::new();
        let (driver, mut link) = self.decode_rank(d);
        // The virtual network never fails to drain.
        let _ = driver.poll_observed(&mut link, now, |_, _, result| {
            seen.push(result.map_err(|ignored| ignored.reason));
        });
        let sent = link.sent;
        self.schedule_sent(d, sent);
        let mut wrong = Vec::new();
        let steps = self.consumers[d].take_steps(&mut wrong);
        for what in wrong {
            self.violation(format!("rank {d}: {what}"));
        }
        self.apply(d, steps);
        seen
    }

    /// Schedules what decode rank `from` sent.
    fn schedule_sent(&mut self, from: usize, sent: Vec<ToProducer>) {
        for m in sent {
            let event = Event::ToProducer {
                from,
                rank: m.rank,
                agent: m.agent,
                bytes: m.bytes,
            };
            self.agenda.push(m.at, event);
        }
    }

    /// A notification reaches decode rank `d`: its driver drains it at once.
    fn deliver(&mut self, d: usize, agent: AgentId, bytes: Vec<u8>, should: Should) {
        let shown = String::from_utf8_lossy(&bytes).into_owned();
        self.consumers[d]
            .inbox
            .push((Cluster::agent_name(agent), bytes));
        let seen = self.poll_decode(d);
        let [result] = seen[..] else {
            self.violation(format!(
                "notification {shown:?} on rank {d}: {} results",
                seen.len()
            ));
            return;
        };
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
                "notification {shown:?} from agent {} on rank {d}: {result:?}, expected {should:?}",
                agent.0
            ));
        }
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
            let Ok(quarantined) = self.consumers[d].driver.engine().abort(&request.id) else {
                continue; // decided already
            };
            self.consumers[d].outcome_given(req);
            let outstanding = quarantined.outstanding();
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
            self.paths.remove(&req);
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

    /// A decode rank's `PUSH_REG` or `HB:` reaches a producer rank (lost if the agent it
    /// was sent to is gone).
    fn producer_hears(&mut self, from: usize, rank: usize, agent: AgentId, bytes: Vec<u8>) {
        if !self.alive_as(rank, agent) {
            return;
        }
        self.inboxes[rank].push((format!("{DECODE_ENGINE}-{from}"), bytes));
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
        self.watch_leases(rank, agent);
    }

    /// Ticks `rank` again when its driver says a lease ends next (everything else it does
    /// follows an input, which queues a tick), unless a check at or before then is queued.
    fn watch_leases(&mut self, rank: usize, agent: AgentId) {
        let Some(at) = self.producers[rank].next_wakeup_ms() else {
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
    /// late-landing fault: TCP socket buffers drained after the error, `docs/nixl.md#late-writes`).
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

    /// The transport sees `agent` gone: every decode rank's transport reports it (its
    /// driver reports it gone to the core, whose edges of it fail at once and settle for
    /// `settle_ms`: a dead producer's errored WRITEs keep landing for a while after its
    /// death is seen, the late-landing fault), and its replacement comes up at once.
    fn death_seen(&mut self, rank: usize, agent: AgentId) {
        for d in 0..self.consumers.len() {
            self.consumers[d].gone.push_back(Cluster::agent_name(agent));
        }
        self.restart(rank);
        for d in 0..self.consumers.len() {
            self.poll_decode(d);
        }
    }

    /// A new incarnation of `rank` comes up and every decode rank's driver learns its
    /// agent (`add_producer_engine` once per incarnation).
    fn restart(&mut self, rank: usize) {
        self.cluster.restart(rank);
        let engine = known_engine(&self.cluster, self.cluster.ranks[rank].engine);
        for d in 0..self.consumers.len() {
            if let Err(e) = self.consumers[d].driver.add_producer_engine(engine.clone()) {
                self.violation(format!("rank {d} cannot learn a restarted producer: {e}"));
            }
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
            let c = &mut self.consumers[d];
            let (free, in_flight, tracked) = (
                c.pool.free_blocks(),
                c.pool.writes_in_flight(),
                c.driver.engine().in_flight(),
            );
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
        self.decisions.fenced_edges = self
            .consumers
            .iter()
            .map(|c| c.driver.counters().fenced_edges)
            .sum();
        self.decisions.gone_edges = self
            .consumers
            .iter()
            .map(|c| c.driver.counters().gone_edges)
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
