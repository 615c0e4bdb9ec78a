//! The simulator behind `kvdrain sim`: a deterministic simulation of prefill producers pushing KV into decode
//! consumers through the real core, under every failure class of the protocol catalogue
//! (`docs/protocol.md#catalogue`), with the spec's invariants checked at every step.
//!
//! * **Deterministic**: one seeded generator ([`rng`]), a virtual clock and an agenda of
//!   events ([`queue`]); no threads, no wall time, no hash-map iteration. A seed replays
//!   the same run, so a violation is reproduced by its seed and step.
//! * **Real code**: producer ranks run the shared producer driver
//!   ([`kvdrain_driver::producer::ProducerDriver`]: pairing by base id, leases, retired ids,
//!   [`kvdrain::producer::PushPlan`], owed notices, source release) over the virtual network
//!   ([`link`]); decode ranks run the shared consumer driver
//!   ([`kvdrain_driver::consumer::ConsumerDriver`]: agent directory, registration, the
//!   heartbeat schedule, a producer seen gone reported to the core at once, its edges
//!   failed and their blocks settling for `settle_ms`, decisions) over their own view of
//!   it ([`decode_link`]), as one thin adapter per rank ([`decode`]); they exchange vLLM-format notification bytes ([`kvdrain::wire`], `PUSH_REG` msgpack
//!   and `HB:` included).
//! * **Checked directly**: a memory model ([`memory`]) records, per block, who owns it
//!   and how many WRITEs into it may still land, so a release or reuse while a write may
//!   land is seen when it happens; a `completed` is checked against the edges that really
//!   landed whole; every request must get exactly one outcome by its deadline and give all
//!   its blocks back by the end.
//!
//! The run ends with one JSON line (`{"requests":N,"violations":0,"faults":{…},
//! "decisions":{…},…}`); any violation is printed with its step, and the command exits
//! non-zero. `--broken release-on-abort` swaps in a deliberately wrong consumer that
//! frees blocks at the abort, `--broken duplicate-counting` repeats notices to
//! counting-mode requests, and `--broken no-settle` releases at a failure notice while
//! every failed WRITE keeps landing, to show the checks can fail. `--late-landing` turns on
//! the late-landing fault (failed WRITEs land up to `timing::LATE_LANDING` ms after their
//! error), which the consumers' settling (`settle_ms`) must absorb.

mod checks;
pub mod cluster;
pub mod decode;
pub mod decode_link;
pub mod faults;
pub mod link;
pub mod memory;
pub mod producer;
pub mod queue;
pub mod report;
pub mod requests;
pub mod rng;
pub mod timing;
mod workload;
mod world;

pub use cluster::Shape;
pub use faults::{Faults, Rates};
pub use report::{Decisions, Report, Violation};

/// A deliberately broken consumer, to prove the checks can fail (tests only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// Hands the blocks back at the abort instead of waiting for `released`.
    ReleaseOnAbort,
    /// Sends repeated notices to counting-mode requests too: vLLM's counting semantics,
    /// which cannot tell a repeat from a sibling's notice, complete while a WRITE is still
    /// in flight (spec rule 6; the reason named-edge mode exists).
    DuplicateCounting,
    /// No settling (`settle_ms = 0`, vLLM's behaviour) while every failed WRITE keeps
    /// landing after its error: blocks are released while bytes still land.
    NoSettle,
}

/// What to simulate.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// The seed of everything random.
    pub seed: u64,
    /// Client requests to simulate.
    pub requests: u64,
    /// The topology.
    pub shape: Shape,
    /// A broken consumer variant, if any.
    pub broken: Option<Broken>,
    /// Fault injection rates.
    pub rates: Rates,
    /// The consumers' settling after a failure notice or a producer's death seen, in
    /// virtual ms.
    pub settle_ms: u64,
}

impl SimConfig {
    /// `requests` requests on `shape` with the default fault rates.
    pub fn new(seed: u64, requests: u64, shape: Shape) -> Self {
        SimConfig {
            seed,
            requests,
            shape,
            broken: None,
            rates: Rates::default(),
            settle_ms: timing::SETTLE,
        }
    }

    /// Turns the late-landing fault on (every other failed WRITE keeps landing).
    pub fn with_late_landing(mut self) -> Self {
        self.rates.late_landing = 500_000;
        self
    }

    /// Swaps in a broken variant (and what it needs to show).
    pub fn with_broken(mut self, broken: Broken) -> Self {
        self.broken = Some(broken);
        if broken == Broken::NoSettle {
            self.settle_ms = 0;
            self.rates.late_landing = 1_000_000;
        }
        self
    }
}

/// Runs a simulation.
///
/// # Errors
/// Why the topology cannot be simulated.
pub fn run(config: SimConfig) -> Result<Report, String> {
    Ok(world::World::new(config)?.run())
}
