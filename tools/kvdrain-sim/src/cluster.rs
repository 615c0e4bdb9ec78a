//! The cluster's shape: one decode engine of `d_tp` ranks and one or more prefill engines,
//! each a (P TP × P PP) grid of producer ranks, each rank one NIXL agent at a time. A
//! producer that dies comes back as a new agent (a new NIXL agent name).

use kvdrain::AgentId;
use kvdrain::producer::Topology;

use super::rng::Rng;

/// How the topology is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One prefill engine of `p_tp × p_pp` ranks writing a decode engine of `d_tp` ranks.
    Fixed {
        /// Producer TP size.
        p_tp: u16,
        /// Producer PP size.
        p_pp: u16,
        /// Consumer TP size.
        d_tp: u16,
    },
    /// From the seed: a decode engine of 1, 2 or 4 ranks and three prefill engines of
    /// different shapes (TP 1–8, PP 1–2, MLA or not); each request picks one.
    Random,
}

/// One producer rank.
#[derive(Clone, Debug)]
pub struct ProducerRank {
    /// Its engine.
    pub engine: usize,
    /// PP stage.
    pub stage: u16,
    /// TP rank.
    pub tp: u16,
    /// Its current NIXL agent.
    pub agent: AgentId,
    /// Whether that agent is running.
    pub alive: bool,
    /// The agent the decode side believes it is (stale between a death and the report or
    /// rediscovery that tells it).
    pub known: AgentId,
}

/// A prefill engine.
#[derive(Clone, Debug)]
pub struct Engine {
    /// Its topology towards the decode engine.
    pub topology: Topology,
    /// Its ranks' indices in [`Cluster::ranks`], stage-major.
    pub first_rank: usize,
}

/// The whole cluster.
#[derive(Debug)]
pub struct Cluster {
    /// Decode TP size.
    pub d_tp: u16,
    /// Prefill engines.
    pub engines: Vec<Engine>,
    /// Every producer rank of every engine.
    pub ranks: Vec<ProducerRank>,
    next_agent: u16,
}

impl Cluster {
    /// Builds the cluster for `shape`.
    ///
    /// # Errors
    /// Why the fixed topology cannot be simulated.
    pub fn new(shape: Shape, rng: &mut Rng) -> Result<Self, String> {
        let (d_tp, topologies) = match shape {
            Shape::Fixed { p_tp, p_pp, d_tp } => (
                d_tp,
                vec![Topology {
                    p_tp,
                    p_pp,
                    d_tp,
                    mla: false,
                }],
            ),
            Shape::Random => {
                let d_tp = *rng.pick(&[1, 2, 4]);
                let engines = (0..3)
                    .map(|_| Topology {
                        p_tp: *rng.pick(&[1, 2, 4, 8]),
                        p_pp: *rng.pick(&[1, 2]),
                        d_tp,
                        mla: rng.chance(500_000),
                    })
                    .collect();
                (d_tp, engines)
            }
        };
        let mut cluster = Cluster {
            d_tp,
            engines: Vec::new(),
            ranks: Vec::new(),
            next_agent: 0,
        };
        for topology in topologies {
            topology
                .validate()
                .map_err(|e| format!("topology {topology:?}: {e}"))?;
            let edges = topology.expected_per_consumer_rank();
            if edges as usize > super::decode::EDGES {
                return Err(format!(
                    "topology {topology:?}: {edges} edges per decode rank, at most {}",
                    super::decode::EDGES
                ));
            }
            let engine = cluster.engines.len();
            cluster.engines.push(Engine {
                topology,
                first_rank: cluster.ranks.len(),
            });
            for stage in 0..topology.p_pp {
                for tp in 0..topology.p_tp {
                    let agent = cluster.fresh_agent();
                    cluster.ranks.push(ProducerRank {
                        engine,
                        stage,
                        tp,
                        agent,
                        alive: true,
                        known: agent,
                    });
                }
            }
        }
        Ok(cluster)
    }

    /// The index in [`Cluster::ranks`] of `(stage, tp)` of `engine`.
    pub fn rank_of(&self, engine: usize, stage: u16, tp: u16) -> usize {
        let e = &self.engines[engine];
        e.first_rank + usize::from(stage) * usize::from(e.topology.p_tp) + usize::from(tp)
    }

    /// The rank indices of `engine`.
    pub fn ranks_of(&self, engine: usize) -> std::ops::Range<usize> {
        let e = &self.engines[engine];
        let n = usize::from(e.topology.p_tp) * usize::from(e.topology.p_pp);
        e.first_rank..e.first_rank + n
    }

    /// A new incarnation of `rank` comes up, and the decode side learns its agent.
    pub fn restart(&mut self, rank: usize) {
        let agent = self.fresh_agent();
        let r = &mut self.ranks[rank];
        r.agent = agent;
        r.known = agent;
        r.alive = true;
    }

    /// Agent ids are handed out in order and wrap long after any request naming an old
    /// one has ended; `u16::MAX` is kept for strangers.
    fn fresh_agent(&mut self) -> AgentId {
        let agent = AgentId(self.next_agent);
        self.next_agent = (self.next_agent + 1) % u16::MAX;
        agent
    }

    /// The NIXL agent name of `agent`: what the decode ranks' drivers know it by, and the
    /// sender name its notifications carry.
    pub fn agent_name(agent: AgentId) -> String {
        format!("agent-{}", agent.0)
    }

    /// The agent `name` stands for, if it is an agent name at all.
    pub fn agent_named(name: &str) -> Option<AgentId> {
        name.strip_prefix("agent-")?.parse().ok().map(AgentId)
    }

    /// The rank `agent` is the current incarnation of (alive or not); `None` for an
    /// incarnation that was replaced, or a stranger.
    pub fn rank_running(&self, agent: AgentId) -> Option<usize> {
        self.ranks.iter().position(|r| r.agent == agent)
    }

    /// `p_tp/p_pp/d_tp` of each engine, for the report.
    pub fn describe(&self) -> String {
        let engines: Vec<String> = self
            .engines
            .iter()
            .map(|e| {
                let t = e.topology;
                let mla = if t.mla { "+mla" } else { "" };
                format!("P{}x{}{mla}", t.p_tp, t.p_pp)
            })
            .collect();
        format!("{}->D{}", engines.join(","), self.d_tp)
    }
}
