//! A WRITE posted by a producer rank, as the event loop tracks it until it ends (the
//! producer side itself is the shared producer driver, see [`super::link`]).

use kvdrain::AgentId;

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
