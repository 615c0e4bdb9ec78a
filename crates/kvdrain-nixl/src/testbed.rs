//! A P(TP = n) → D(TP = 1) deployment on real NIXL, for the integration tests and the demo:
//! one consumer rank and n producer ranks, each with its own agent, UCX backend and DRAM block
//! pool. The halves can live in one process ([`Testbed`]) or in two ([`ConsumerSide`] and
//! [`ProducerSide`], with the handshake shipped as text lines).
//!
//! Blocks: a D block is `n ×` a P block; P rank `r` writes slot `r` of each D block.

use std::collections::VecDeque;

use kvdrain::{BlockHandle, Config, Duration, Outstanding};
use nixl_sys::AgentConfig;

use crate::agent::{AgentError, UcxAgent};
use crate::block_layout::BlockLayout;
use crate::consumer::{
    BlockRelease, Consumer, ConsumerConfig, DecisionRecord, NixlConsumerError, RemoteProducer,
    TrackedRequest,
};
use crate::handshake::{ConsumerRank, StaticHandshake};
use crate::pool::DramPool;
use crate::producer::{ProducerConfig, Pusher, SourceBlocks};

/// Requests a testbed consumer tracks at once.
pub const CAPACITY: usize = 1024;
/// D's engine id in a testbed.
pub const D_ENGINE: &str = "engine-d";
/// P's engine id in a testbed.
pub const P_ENGINE: &str = "engine-p";

/// Shape and timing of a testbed.
#[derive(Clone, Debug)]
pub struct TestbedConfig {
    /// Agent name prefix; unique per process and run (agents are identified by name).
    pub prefix: String,
    /// Producer TP size (D is TP 1).
    pub p_tp: u16,
    /// Bytes per P block (D blocks are `p_tp ×` larger); a multiple of 8.
    pub p_block_len: usize,
    /// Blocks in each pool.
    pub blocks: usize,
    /// Producers' lease in ms (D heartbeats every `lease_ms / 6`).
    pub lease_ms: u64,
    /// D's default deadline in ms.
    pub deadline_ms: u64,
    /// D's quarantine in ms.
    pub quarantine_ms: u64,
    /// Run NIXL's progress thread in every agent (else only the owners' polls progress).
    pub progress_thread: bool,
}

impl TestbedConfig {
    /// TP 2 → TP 1, 4 KiB P blocks, 256 blocks per pool, lease 3 s, deadline 5 s,
    /// quarantine 6 s, progress threads on.
    pub fn new(prefix: &str) -> Self {
        TestbedConfig {
            prefix: prefix.to_owned(),
            p_tp: 2,
            p_block_len: 4096,
            blocks: 256,
            lease_ms: 3000,
            deadline_ms: 5000,
            quarantine_ms: 6000,
            progress_thread: true,
        }
    }
}

fn agent(cfg: &TestbedConfig, role: &str) -> Result<UcxAgent, AgentError> {
    let config = AgentConfig {
        enable_prog_thread: cfg.progress_thread,
        ..AgentConfig::default()
    };
    UcxAgent::with_config(&format!("{}-{role}", cfg.prefix), &config, &[])
}

/// The D rank: agent, pool, pump.
#[derive(Debug)]
pub struct ConsumerSide {
    /// The pump (owns the agent).
    pub consumer: Consumer<CAPACITY>,
    /// D's KV blocks (dropped after the agent that registered them).
    pub pool: DramPool,
}

impl ConsumerSide {
    /// Creates the agent, registers the pool.
    ///
    /// # Errors
    /// [`AgentError`] from NIXL.
    pub fn new(cfg: &TestbedConfig) -> Result<Self, AgentError> {
        let pool = DramPool::new(cfg.p_block_len * usize::from(cfg.p_tp), cfg.blocks);
        let mut agent = agent(cfg, "d0")?;
        agent.register_dram(pool.layout().region())?;
        let config = ConsumerConfig {
            engine_id: D_ENGINE.to_owned(),
            host: "127.0.0.1".to_owned(),
            port: 5600,
            tp_rank: 0,
            tp_size: 1,
            lease: Duration::from_millis(cfg.lease_ms),
            ledger: Config {
                deadline: Duration::from_millis(cfg.deadline_ms),
                quarantine: Duration::from_millis(cfg.quarantine_ms),
                // The tests expect `failed` and the release together (vLLM's behaviour);
                // settling a failure notice (rule 8) is the core's and tested there.
                settle: Duration::ZERO,
                ..Config::with_capacity(CAPACITY)
            },
        };
        Ok(ConsumerSide {
            consumer: Consumer::new(agent, config),
            pool,
        })
    }

    /// What producers need to write here.
    ///
    /// # Errors
    /// [`AgentError`] from NIXL.
    pub fn rank(&self) -> Result<ConsumerRank, AgentError> {
        Ok(ConsumerRank {
            metadata: self.consumer.agent().local_metadata()?,
            layout: self.pool.layout(),
        })
    }

    /// Loads the producers' metadata (notification-only handshake).
    ///
    /// # Errors
    /// [`NixlConsumerError`] if a blob does not load.
    pub fn add_producers(
        &mut self,
        p_tp: u16,
        metadata: &[Vec<u8>],
    ) -> Result<(), NixlConsumerError> {
        let engine = RemoteProducer {
            engine_id: P_ENGINE.to_owned(),
            host: "127.0.0.1".to_owned(),
            port: 5601,
            tp_size: p_tp,
            pp_size: 1,
            mla: false,
            agents: Vec::new(),
        };
        self.consumer.add_producer_engine(engine, metadata)?;
        Ok(())
    }
}

/// The P ranks: one pusher (agent) and one pool each.
#[derive(Debug)]
pub struct ProducerSide {
    /// One per TP rank (own their agents).
    pub pushers: Vec<Pusher>,
    /// Source blocks, per rank (dropped after the agents).
    pub pools: Vec<DramPool>,
}

impl ProducerSide {
    /// Creates `p_tp` agents and registers their pools.
    ///
    /// # Errors
    /// [`AgentError`] from NIXL.
    pub fn new(cfg: &TestbedConfig) -> Result<Self, AgentError> {
        let mut pushers = Vec::new();
        let mut pools = Vec::new();
        for r in 0..cfg.p_tp {
            let pool = DramPool::new(cfg.p_block_len, cfg.blocks);
            let mut agent = agent(cfg, &format!("p{r}"))?;
            agent.register_dram(pool.layout().region())?;
            let mut config = ProducerConfig::new(P_ENGINE, r, cfg.p_tp);
            config.lease = Duration::from_millis(cfg.lease_ms);
            pushers.push(Pusher::new(agent, config, pool.layout()));
            pools.push(pool);
        }
        Ok(ProducerSide { pushers, pools })
    }

    /// Every rank's metadata, in rank order.
    ///
    /// # Errors
    /// [`AgentError`] from NIXL.
    pub fn metadata(&self) -> Result<Vec<Vec<u8>>, AgentError> {
        self.pushers
            .iter()
            .map(|p| p.agent().local_metadata())
            .collect()
    }

    /// Every rank's pool layout, in rank order.
    pub fn layouts(&self) -> Vec<BlockLayout> {
        self.pools.iter().map(DramPool::layout).collect()
    }
}

/// P(TP = n) → D(TP = 1) in one process, handshakes done.
#[derive(Debug)]
pub struct Testbed {
    /// D.
    pub d: ConsumerSide,
    /// P.
    pub p: ProducerSide,
    /// The in-memory side channel P handshakes through.
    pub handshake: StaticHandshake,
}

impl Testbed {
    /// Creates every agent and exchanges metadata.
    ///
    /// # Errors
    /// [`NixlConsumerError`] from NIXL or the pump.
    pub fn new(cfg: &TestbedConfig) -> Result<Self, NixlConsumerError> {
        let mut d = ConsumerSide::new(cfg)?;
        let p = ProducerSide::new(cfg)?;
        d.add_producers(cfg.p_tp, &p.metadata()?)?;
        let mut handshake = StaticHandshake::default();
        handshake.publish(D_ENGINE, 0, d.rank()?);
        Ok(Testbed { d, p, handshake })
    }
}

/// Deterministic bytes for block `index` of request `request` on P rank `rank`.
pub fn pattern(request: u64, rank: u16, index: usize, len: usize) -> Vec<u8> {
    let mut x = request
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(u64::from(rank) << 32 | index as u64)
        | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // xorshift64, eight bytes a step
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// What the engine saw, for assertions (implements both engine traits).
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every event, in order: `("decode" | "failed" | "expired" | "release" | "forced" |
    /// "source", request id)`.
    pub events: VecDeque<(&'static str, String)>,
    /// Blocks handed to decode or released, with the request id.
    pub blocks: Vec<(String, u64)>,
    /// The record of every decision, in order, with the request id.
    pub records: Vec<(String, DecisionRecord)>,
}

impl Recorder {
    /// Takes the events so far.
    pub fn take(&mut self) -> Vec<(&'static str, String)> {
        self.events.drain(..).collect()
    }

    /// Whether `event` was seen for `id`.
    pub fn saw(&self, event: &str, id: &str) -> bool {
        self.events.iter().any(|(e, i)| *e == event && i == id)
    }
}

impl BlockRelease for Recorder {
    fn decode(&mut self, request: &TrackedRequest, blocks: BlockHandle) {
        self.events.push_back(("decode", request.id.clone()));
        self.blocks.push((request.id.clone(), blocks.0));
    }
    fn release(&mut self, request: &TrackedRequest, blocks: BlockHandle, forced: bool) {
        let e = if forced { "forced" } else { "release" };
        self.events.push_back((e, request.id.clone()));
        self.blocks.push((request.id.clone(), blocks.0));
    }
    fn failed(&mut self, request: &TrackedRequest) {
        self.events.push_back(("failed", request.id.clone()));
    }
    fn expired(&mut self, request: &TrackedRequest, _outstanding: Outstanding) {
        self.events.push_back(("expired", request.id.clone()));
    }
    fn record(&mut self, request: &TrackedRequest, record: &DecisionRecord) {
        self.records.push((request.id.clone(), record.clone()));
    }
}

impl SourceBlocks for Recorder {
    fn release(&mut self, request: &str) {
        self.events.push_back(("source", request.to_owned()));
    }
    fn heartbeat(&mut self, request: &str) {
        self.events.push_back(("heartbeat", request.to_owned()));
    }
}

/// Lowercase hex (for shipping metadata over text pipes).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`to_hex`] output.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
