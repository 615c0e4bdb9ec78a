//! What the simulation knows about each client request, independently of the tracker:
//! per decode rank, its blocks, which producer edges landed whole, which WRITEs are still
//! in flight, and the one outcome the tracker gave it. The checks on decisions read this.

/// The one outcome a request gets on a decode rank.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Outcome {
    /// `completed`.
    Completed,
    /// `failed`.
    Failed,
    /// `aborted`.
    Aborted,
    /// `expired`.
    Expired,
}

/// One producer edge into one decode rank.
#[derive(Clone, Copy, Debug)]
pub struct EdgeTrack {
    /// Producer rank index in the cluster.
    pub rank: usize,
    /// Its WRITE landed whole.
    pub landed: bool,
    /// A WRITE of it failed or was cut: some data may be missing or partial.
    pub spoiled: bool,
}

/// A request on one decode rank.
#[derive(Clone, Debug)]
pub struct RankPart {
    /// Its blocks (kept after release: WRITEs in flight still target them).
    pub blocks: Vec<u32>,
    /// The producer edges writing this rank.
    pub edges: Vec<EdgeTrack>,
    /// Posted WRITEs into this rank not terminal yet.
    pub in_flight: u32,
    /// The tracker's outcome.
    pub outcome: Option<Outcome>,
    /// When the outcome came (for the hold after a `failed`).
    pub decided_at: u64,
    /// The tracker released the blocks.
    pub released: bool,
    /// The blocks are back in the pool (released, or decode finished).
    pub done: bool,
}

/// A client request.
#[derive(Clone, Debug)]
pub struct Request {
    /// The consumer's request id.
    pub id: String,
    /// The prefill engine that pushes it.
    pub engine: usize,
    /// Named-edge mode (else counting mode).
    pub named: bool,
    /// When it arrived.
    pub arrived: u64,
    /// Per decode rank.
    pub ranks: Vec<RankPart>,
    /// The producer side aborted it.
    pub producer_aborted: bool,
    /// ... and sends none of the failure notices it owes.
    pub producer_silent: bool,
}

impl Request {
    /// Whether every rank has its blocks back.
    pub fn finished(&self) -> bool {
        self.ranks.iter().all(|r| r.done)
    }

    /// The edge of producer rank `rank` into decode rank `d`.
    pub fn edge_mut(&mut self, d: usize, rank: usize) -> Option<&mut EdgeTrack> {
        self.ranks
            .get_mut(d)?
            .edges
            .iter_mut()
            .find(|e| e.rank == rank)
    }

    /// Why a `completed` on rank `d` would be wrong, if it would.
    pub fn incomplete(&self, d: usize) -> Option<String> {
        let part = &self.ranks[d];
        if part.in_flight > 0 {
            return Some(format!("{} write(s) still in flight", part.in_flight));
        }
        let missing: Vec<usize> = part
            .edges
            .iter()
            .filter(|e| !e.landed || e.spoiled)
            .map(|e| e.rank)
            .collect();
        (!missing.is_empty())
            .then(|| format!("edges of producer ranks {missing:?} not landed whole"))
    }
}
