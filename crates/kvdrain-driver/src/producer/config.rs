//! The configuration of one producer rank: its place in P's topology, the lease on a finished
//! request's source blocks, and the sizes of the driver's tables.

use kvdrain::Duration;

/// This producer rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerConfig {
    /// P's engine id.
    pub engine_id: String,
    /// This rank's TP index.
    pub tp_rank: u16,
    /// P's TP size (sent in every completion).
    pub tp_size: u16,
    /// This rank's PP stage.
    pub pp_stage: u16,
    /// P's PP size.
    pub pp_size: u16,
    /// MLA (the latent is written whole to each target).
    pub mla: bool,
    /// The lease on a finished request's source blocks, from its offer (vLLM
    /// `kv_lease_duration`, 30 s).
    pub lease: Duration,
    /// Requests offered or being pushed at once (an offer beyond it is refused and handed
    /// back), and registrations stashed at once.
    pub capacity: usize,
    /// Retired request ids remembered to refuse late registrations (F4).
    pub retired_capacity: usize,
}

impl ProducerConfig {
    /// vLLM's defaults: 30 s lease, 4096 requests, 4096 retired ids.
    pub fn new(engine_id: &str, tp_rank: u16, tp_size: u16) -> Self {
        ProducerConfig {
            engine_id: engine_id.to_owned(),
            tp_rank,
            tp_size,
            pp_stage: 0,
            pp_size: 1,
            mla: false,
            lease: Duration::from_secs(30),
            capacity: 4096,
            retired_capacity: 4096,
        }
    }

    /// How far a heartbeat pushes the lease: `lease · 2 / 3` (vLLM).
    pub fn lease_extension(&self) -> Duration {
        Duration::from_millis(self.lease.millis().saturating_mul(2) / 3)
    }
}
