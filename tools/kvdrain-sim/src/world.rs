//! The simulated cluster and its event loop: producers push requests to consumers through
//! the real code (the shared producer driver on each producer rank, pairing, leases, retired
//! ids and plans included; the shared consumer driver on each decode rank, directory,
//! registration, heartbeats and producers reported gone included), faults are injected, and every invariant
//! is checked at the step that could break it.
//!
//! The loop is here ([`World::run`]: events in time order; between them the decode ranks
//! are polled whenever their drivers have work due). What each event does lives with its
//! side: the workload ([`super::workload`]: arrivals and the noise around them), the decode
//! side ([`super::decode`]), the producer side ([`super::producer`]), the deaths and aborts
//! injected ([`super::faults`]), and the checks at the end ([`super::checks`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvdrain::{AgentId, Config, Duration, Instant, producer::Topology};
use kvdrain_driver::consumer::{ConsumerConfig, RemoteProducer};
use kvdrain_driver::producer::{ProducerConfig, ProducerDriver};
use kvdrain_driver::transport::{Notification, WriteStatus};

use super::SimConfig;
use super::cluster::Cluster;
use super::decode::{DecodeRank, Should};
use super::decode_link::RequestPaths;
use super::faults::{Faults, Rates};
use super::link::SimWrite;
use super::memory::Breach;
use super::producer::Write;
use super::queue::Agenda;
use super::report::{Decisions, Report};
use super::requests::Request;
use super::rng::Rng;
use super::timing::{DEADLINE, LEASE, QUARANTINE};

/// Requests tracked at once per decode rank (bursts overflow it).
const CAPACITY: usize = 256;

/// KV blocks per decode rank.
pub(super) const BLOCKS: u32 = 4096;

#[derive(Debug)]
pub(super) enum Event {
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
    /// The replacement of a dead agent nobody reported (an unseen death) comes up.
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
    pub(super) config: SimConfig,
    pub(super) rates: Rates,
    pub(super) rng: Rng,
    pub(super) now: u64,
    pub(super) agenda: Agenda<Event>,
    pub(super) cluster: Cluster,
    pub(super) consumers: Vec<DecodeRank>,
    /// Per request in flight, the network's paths to its producer ranks.
    pub(super) paths: BTreeMap<u64, RequestPaths>,
    pub(super) requests: BTreeMap<u64, Request>,
    /// Per producer rank: the shared producer driver, its inbox, and the outcomes of its
    /// WRITEs that ended (read by its next status polls).
    pub(super) producers: Vec<ProducerDriver<SimWrite>>,
    pub(super) inboxes: Vec<Vec<Notification>>,
    pub(super) finished: Vec<BTreeMap<u64, WriteStatus>>,
    /// Per request, the physical blocks of each decode rank (what the transport writes).
    pub(super) targets: BTreeMap<u64, Vec<Vec<u32>>>,
    /// Requests whose producer aborted without sending what it owes.
    pub(super) silent: BTreeSet<u64>,
    /// Per producer rank: a tick is queued at the current virtual time.
    pub(super) tick_queued: Vec<bool>,
    /// Per producer rank: when the lease check queued last falls.
    pub(super) lease_check_at: Vec<u64>,
    pub(super) writes: BTreeMap<u64, Write>,
    pub(super) next_write: u64,
    pub(super) arrived: u64,
    pub(super) burst_left: u64,
    pub(super) finished_ids: VecDeque<String>,
    pub(super) breaches: Vec<Breach>,
    pub(super) faults: Faults,
    pub(super) decisions: Decisions,
    pub(super) report: Report,
}

/// The producer driver's configuration of simulated producer rank `rank`.
pub(super) fn producer_config(cluster: &Cluster, rank: usize) -> ProducerConfig {
    let r = &cluster.ranks[rank];
    let topology = cluster.engines[r.engine].topology;
    let mut config = ProducerConfig::new(&producer_engine(r.engine), r.tp, topology.p_tp);
    config.pp_stage = r.stage;
    config.pp_size = topology.p_pp;
    config.mla = topology.mla;
    config.lease = Duration::from_millis(LEASE);
    config
}

pub(super) fn producer_engine(engine: usize) -> String {
    format!("p{engine}")
}

/// The decode engine's id.
pub(super) const DECODE_ENGINE: &str = "d";

/// The consumer driver's configuration of decode rank `d`.
fn consumer_config(cluster: &Cluster, d: u16, ledger: Config) -> ConsumerConfig {
    ConsumerConfig {
        engine_id: DECODE_ENGINE.to_owned(),
        host: "sim".to_owned(),
        port: 0,
        tp_rank: d,
        tp_size: cluster.d_tp,
        lease: Duration::from_millis(LEASE),
        ledger,
    }
}

/// Prefill engine `engine` as the decode ranks know it: its shape and the agents they
/// believe run its ranks.
pub(super) fn known_engine(cluster: &Cluster, engine: usize) -> RemoteProducer {
    let Topology {
        p_tp, p_pp, mla, ..
    } = cluster.engines[engine].topology;
    RemoteProducer {
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
            deadline: Duration::from_millis(DEADLINE),
            quarantine: Duration::from_millis(QUARANTINE),
            settle: Duration::from_millis(config.settle_ms),
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
    /// of their drivers has work due (a producer to report gone, a heartbeat round, a timer).
    fn drain(&mut self) {
        loop {
            let at = match (self.agenda.next_at(), self.next_timer()) {
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
    fn next_timer(&mut self) -> Option<u64> {
        self.consumers
            .iter_mut()
            .filter_map(|c| c.driver.engine().next_timer().map(Instant::millis))
            .min()
            .map(|at| at.max(self.now + 1))
    }

    pub(super) fn violation(&mut self, what: String) {
        self.report.violation(self.report.steps, self.now, what);
    }

    fn flush_breaches(&mut self) {
        for breach in std::mem::take(&mut self.breaches) {
            self.violation(breach.to_string());
        }
    }

    /// Moves the clock: every decode rank polls its driver (scheduler step).
    fn advance(&mut self, to: u64) {
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

    pub(super) fn between(&mut self, (lo, hi): (u64, u64)) -> u64 {
        self.rng.between(lo, hi)
    }
}
