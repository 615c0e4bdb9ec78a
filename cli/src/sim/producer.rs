//! The producer side of one request on one producer rank: the real [`PushPlan`], the
//! WRITEs it posted that still read the rank's source blocks, and its lease.

use kvdrain::AgentId;
use kvdrain::producer::PushPlan;

/// One request being pushed by one producer rank.
#[derive(Debug)]
pub struct Push {
    /// The plan (from the core crate) that decides what may be posted and what is owed.
    pub plan: PushPlan,
    /// The decode blocks each target rank named in its registration.
    pub targets: Vec<(usize, Vec<u32>)>,
    /// Posted WRITEs not terminal yet: each still reads the source blocks.
    pub reading: u32,
    /// The lease ended: the request is over on this producer (nothing new is posted).
    pub lease_over: bool,
    /// The source blocks went back to the producer's pool.
    pub source_released: bool,
    /// The retired plan is kept as a tombstone that refuses late posts (F4) until this is
    /// set, then forgotten.
    pub forget_scheduled: bool,
}

impl Push {
    /// A fresh push for `plan`, writing into `targets`.
    pub fn new(plan: PushPlan, targets: Vec<(usize, Vec<u32>)>) -> Self {
        Push {
            plan,
            targets,
            reading: 0,
            lease_over: false,
            source_released: false,
            forget_scheduled: false,
        }
    }

    /// The decode blocks of target rank `d`.
    pub fn blocks(&self, d: usize) -> Option<&[u32]> {
        self.targets
            .iter()
            .find(|(t, _)| *t == d)
            .map(|(_, b)| b.as_slice())
    }
}

/// A posted WRITE.
#[derive(Clone, Debug)]
pub struct Write {
    /// The request.
    pub req: u64,
    /// The producer rank that posted it.
    pub rank: usize,
    /// That rank's agent when it posted.
    pub agent: AgentId,
    /// The decode rank written.
    pub d: usize,
    /// The physical blocks written (the decode rank's blocks of the request when posted).
    pub blocks: Vec<u32>,
}
