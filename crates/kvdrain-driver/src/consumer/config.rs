//! The configuration of one consumer rank (its place in D's topology, the producers' lease,
//! the core's settings) and the description of a producer engine it receives from.

use kvdrain::{Config, Duration};

/// This D rank.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// D's engine id.
    pub engine_id: String,
    /// D's side-channel host (sent in registrations).
    pub host: String,
    /// D's side-channel port.
    pub port: u16,
    /// This rank.
    pub tp_rank: u16,
    /// D's TP size.
    pub tp_size: u16,
    /// The producers' lease: heartbeats go out every `lease / 6` (vLLM).
    pub lease: Duration,
    /// The core's settings (capacity, default deadline, quarantine).
    pub ledger: Config,
}

impl ConsumerConfig {
    /// How often heartbeats go out: `lease / 6` (vLLM), at least 1 ms.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis((self.lease.millis() / 6).max(1))
    }
}

/// A remote producer engine as D knows it: where it listens, its shape, and its agents'
/// names (added with [`ConsumerDriver::add_producer_engine`](super::ConsumerDriver::add_producer_engine)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteProducer {
    /// P's engine id.
    pub engine_id: String,
    /// P's side-channel host.
    pub host: String,
    /// P's side-channel port.
    pub port: u16,
    /// P's TP size.
    pub tp_size: u16,
    /// P's PP size.
    pub pp_size: u16,
    /// MLA (the latent is replicated to every consumer rank).
    pub mla: bool,
    /// Agent names, index `pp_stage * tp_size + tp_rank`.
    pub agents: Vec<String>,
}
