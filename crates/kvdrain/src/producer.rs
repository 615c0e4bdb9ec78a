//! The producer (P) side: which consumer ranks a producer rank writes, how many notices each
//! consumer rank expects, and which `PUSH_FAIL` notices a producer owes.
//!
//! Topology rules (vLLM `push_worker`; `docs/protocol.md#expected-count`, which also
//! states the catalogue ids and invariants cited below):
//!
//! | shape | P rank `p` writes D ranks | each D rank expects |
//! | --- | --- | --- |
//! | `P_tp = D_tp` | `p` | `pp` |
//! | `P_tp > D_tp`, `k = P_tp / D_tp` | `p / k` | `pp × k` |
//! | `P_tp < D_tp`, `k = D_tp / P_tp` | `p·k … p·k+k−1` (head slices; MLA: the whole latent to each) | `pp` |
//!
//! A [`PushPlan`] follows one request on one producer rank: every edge (target D rank) is
//! planned before anything is posted (catalogue C2), moves through posted → landed or
//! failed, and the plan lists exactly the failure notices owed — one per edge that did not
//! land and whose consumer can be reached, never one for an edge it cannot identify, never
//! two for one edge (invariant 3). Source blocks may be released only when every edge is
//! terminal ([`PushPlan::is_terminal`], catalogue F3), and a retired plan refuses new
//! posts (F4).
//!
//! ```text
//!            posted             status Success
//! Planned ───────────▶ Posted ─────────────────────────────▶ Landed
//!    │                  │  │ backend error (this write or     ▲
//!    │ post_failed,     │  │ another one to the same peer)    │ Success after all
//!    │ retire           │  ▼                                  │
//!    │                  │ Failed{posted: true} ◀─── Unknown ──┘
//!    ▼                  │        │        backend error  ▲
//! Failed{posted: false} │        │ noticed              │ status_unknown (NOT_FOUND
//!    │  noticed         │        ▼                      │ the producer did not cause)
//!    └──────────────────┼──▶ Noticed                    │
//!                       └───────────────────────────────┘
//! ```
//!
//! Only `Success` proves a write is over, and only a backend error bounds it (protocol
//! catalogue F7). So the plan keeps three failure outcomes apart: an edge **never posted**
//! ([`post_failed`](PushPlan::post_failed), [`retire`](PushPlan::retire)) is owed a
//! `PUSH_FAIL` at once; a **posted** edge is owed one only after a **backend error**
//! ([`backend_error`](PushPlan::backend_error)); a posted edge whose status is **unknown**
//! ([`status_unknown`](PushPlan::status_unknown): NOT_FOUND the producer did not cause) is
//! owed nothing and stays non-terminal, so its source blocks stay fenced and the consumer's
//! deadline decides.

use core::fmt;

use heapless::Vec;

/// Most consumer ranks one producer rank can write to.
pub const MAX_TARGETS: usize = 64;

/// Parallel layout of a producer/consumer pair.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Topology {
    /// Producer tensor-parallel size.
    pub p_tp: u16,
    /// Producer pipeline-parallel size (each stage writes its own layers and notifies).
    pub p_pp: u16,
    /// Consumer tensor-parallel size (decode-side PP is not supported, as in vLLM).
    pub d_tp: u16,
    /// MLA: the latent is replicated, so a producer writes it whole to each of its targets.
    pub mla: bool,
}

/// Why a topology or rank is unusable.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TopologyError {
    /// A size is 0.
    ZeroSize,
    /// The larger TP size is not a multiple of the smaller.
    Indivisible,
    /// A producer rank would write more than [`MAX_TARGETS`] consumer ranks.
    TooManyTargets,
    /// The producer rank is outside `0..p_tp` (or the stage outside `0..p_pp`).
    RankOutOfRange,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TopologyError::ZeroSize => "a parallel size is 0",
            TopologyError::Indivisible => "TP sizes are not multiples of each other",
            TopologyError::TooManyTargets => "a producer rank would write too many consumer ranks",
            TopologyError::RankOutOfRange => "producer rank outside the topology",
        })
    }
}

impl core::error::Error for TopologyError {}

/// What one WRITE carries into its consumer rank.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WriteShape {
    /// The producer's whole KV (equal TP, more producers than consumers, or MLA).
    Whole,
    /// Head slice `index` of `of` of the producer's KV (`P_tp < D_tp`, not MLA).
    HeadSlice {
        /// Which slice.
        index: u16,
        /// How many slices.
        of: u16,
    },
}

impl Topology {
    /// Checks sizes and divisibility.
    ///
    /// # Errors
    /// [`TopologyError`] naming the first problem.
    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.p_tp == 0 || self.p_pp == 0 || self.d_tp == 0 {
            return Err(TopologyError::ZeroSize);
        }
        let (hi, lo) = (self.p_tp.max(self.d_tp), self.p_tp.min(self.d_tp));
        if hi % lo != 0 {
            return Err(TopologyError::Indivisible);
        }
        if self.d_tp / self.p_tp.min(self.d_tp) > MAX_TARGETS as u16 && self.d_tp > self.p_tp {
            return Err(TopologyError::TooManyTargets);
        }
        Ok(())
    }

    /// Notices each consumer rank waits for: `pp × max(1, P_tp / D_tp)`.
    pub fn expected_per_consumer_rank(&self) -> u32 {
        u32::from(self.p_pp) * u32::from((self.p_tp / self.d_tp.max(1)).max(1))
    }

    /// The consumer ranks producer TP rank `p_rank` writes, with the shape of each write.
    ///
    /// # Errors
    /// [`TopologyError`] if the topology is invalid or `p_rank >= p_tp`.
    pub fn targets(
        &self,
        p_rank: u16,
    ) -> Result<Vec<(u16, WriteShape), MAX_TARGETS>, TopologyError> {
        self.validate()?;
        if p_rank >= self.p_tp {
            return Err(TopologyError::RankOutOfRange);
        }
        let mut out = Vec::new();
        if self.p_tp >= self.d_tp {
            let k = self.p_tp / self.d_tp;
            out.push((p_rank / k, WriteShape::Whole))
                .map_err(|_| TopologyError::TooManyTargets)?;
        } else {
            let k = self.d_tp / self.p_tp;
            for i in 0..k {
                let shape = if self.mla {
                    WriteShape::Whole
                } else {
                    WriteShape::HeadSlice { index: i, of: k }
                };
                out.push((p_rank * k + i, shape))
                    .map_err(|_| TopologyError::TooManyTargets)?;
            }
        }
        Ok(out)
    }

    /// The producer `(pp stage, tp rank)` pairs that write consumer rank `d_rank`, in order:
    /// the named edges a consumer rank registers.
    pub fn producers_of(&self, d_rank: u16) -> impl Iterator<Item = (u16, u16)> + '_ {
        let valid = self.validate().is_ok() && d_rank < self.d_tp;
        let tp_ranks = move |stage| {
            (0..self.p_tp)
                .filter(move |&p| {
                    self.targets(p)
                        .is_ok_and(|t| t.iter().any(|&(d, _)| d == d_rank))
                })
                .map(move |p| (stage, p))
        };
        (0..if valid { self.p_pp } else { 0 }).flat_map(tp_ranks)
    }
}

/// Where one edge of a plan stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum EdgeState {
    /// Resolved before anything is posted; not attempted yet.
    Planned,
    /// WRITE posted with its completion attached; not terminal.
    Posted,
    /// Initiator saw success: the completion is delivered (or on its way).
    Landed,
    /// Did not land: never posted (post or descriptor failure, loop unwound, plan retired)
    /// or failed after posting with a backend error. A `PUSH_FAIL` is owed.
    Failed {
        /// Whether the WRITE had been posted (some data may have landed).
        posted: bool,
    },
    /// Posted, and its status can no longer be read (NOT_FOUND the producer did not
    /// cause): it may still be landing. Nothing is owed and the edge is not terminal: the
    /// source blocks stay fenced and the consumer's deadline decides.
    Unknown,
    /// The failure notice went out.
    Noticed,
    /// The consumer rank cannot be named or reached (no agent metadata): no notice can be
    /// sent; the consumer's deadline ends its wait.
    Unreachable,
}

/// A mistake in driving a [`PushPlan`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PlanError {
    /// No edge to that consumer rank in this plan.
    UnknownEdge(u16),
    /// The edge is not in a state that allows this step.
    WrongState(u16, EdgeState),
    /// The request ended on this producer: nothing more may be posted (F4).
    Retired,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::UnknownEdge(d) => write!(f, "no edge to consumer rank {d}"),
            PlanError::WrongState(d, s) => write!(f, "edge to consumer rank {d} is {s:?}"),
            PlanError::Retired => f.write_str("request retired on the producer; no new writes"),
        }
    }
}

impl core::error::Error for PlanError {}

/// One edge: a WRITE from this producer rank into consumer rank `d_rank`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Edge {
    /// Target consumer TP rank.
    pub d_rank: u16,
    /// What the write carries.
    pub shape: WriteShape,
    /// Where it stands.
    pub state: EdgeState,
}

/// The producer-side record of one request on one producer rank.
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PushPlan {
    edges: Vec<Edge, MAX_TARGETS>,
    retired: bool,
}

impl PushPlan {
    /// Plans every edge of producer rank `(pp_stage, tp_rank)` before anything is posted.
    ///
    /// # Errors
    /// [`TopologyError`] for an invalid topology or rank.
    pub fn new(topology: &Topology, pp_stage: u16, tp_rank: u16) -> Result<Self, TopologyError> {
        if pp_stage >= topology.p_pp {
            return Err(TopologyError::RankOutOfRange);
        }
        let mut edges = Vec::new();
        for (d_rank, shape) in topology.targets(tp_rank)? {
            let _ = edges.push(Edge {
                d_rank,
                shape,
                state: EdgeState::Planned,
            });
        }
        Ok(PushPlan {
            edges,
            retired: false,
        })
    }

    /// The edges, in target order.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// The edge to consumer rank `d_rank`, if this plan writes it.
    pub fn edge(&self, d_rank: u16) -> Option<&Edge> {
        self.edges.iter().find(|e| e.d_rank == d_rank)
    }

    /// Whether the request ended on this producer ([`retire`](Self::retire)): nothing more
    /// may be posted.
    pub fn is_retired(&self) -> bool {
        self.retired
    }

    fn step(
        &mut self,
        d_rank: u16,
        f: impl FnOnce(EdgeState) -> Option<EdgeState>,
    ) -> Result<(), PlanError> {
        let edge = self
            .edges
            .iter_mut()
            .find(|e| e.d_rank == d_rank)
            .ok_or(PlanError::UnknownEdge(d_rank))?;
        edge.state = f(edge.state).ok_or(PlanError::WrongState(d_rank, edge.state))?;
        Ok(())
    }

    /// Asks to post the WRITE of `d_rank`; `Ok` means go ahead, then report
    /// [`posted`](Self::posted) or [`post_failed`](Self::post_failed).
    ///
    /// # Errors
    /// [`PlanError::Retired`] once the request ended here (F4); `WrongState` unless planned.
    pub fn may_post(&self, d_rank: u16) -> Result<(), PlanError> {
        if self.retired {
            return Err(PlanError::Retired);
        }
        match self.edge(d_rank) {
            None => Err(PlanError::UnknownEdge(d_rank)),
            Some(e) if e.state == EdgeState::Planned => Ok(()),
            Some(e) => Err(PlanError::WrongState(d_rank, e.state)),
        }
    }

    /// The WRITE was posted.
    ///
    /// # Errors
    /// As [`may_post`](Self::may_post).
    pub fn posted(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.may_post(d_rank)?;
        self.step(d_rank, |_| Some(EdgeState::Posted))
    }

    /// The WRITE could not be described or posted (C2): nothing was sent.
    ///
    /// # Errors
    /// `WrongState` unless the edge is planned.
    pub fn post_failed(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.step(d_rank, |s| {
            (s == EdgeState::Planned).then_some(EdgeState::Failed { posted: false })
        })
    }

    /// The initiator saw the WRITE succeed.
    ///
    /// # Errors
    /// `WrongState` unless the edge is posted.
    pub fn landed(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.step(d_rank, |s| {
            (s == EdgeState::Posted).then_some(EdgeState::Landed)
        })
    }

    /// The initiator saw the WRITE succeed.
    ///
    /// Same as [`landed`](Self::landed) but also accepted from [`EdgeState::Unknown`]: a
    /// handle whose status was unreadable that later reports `Success`.
    ///
    /// # Errors
    /// `WrongState` unless the edge is posted or unknown.
    pub fn landed_after_unknown(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.step(d_rank, |s| {
            matches!(s, EdgeState::Posted | EdgeState::Unknown).then_some(EdgeState::Landed)
        })
    }

    /// The posted WRITE ended with a backend error (its own, or another transfer's to the
    /// same peer): nothing more of it lands, so a `PUSH_FAIL` is owed (F7).
    ///
    /// # Errors
    /// `WrongState` unless the edge is posted or unknown.
    pub fn backend_error(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.step(d_rank, |s| {
            matches!(s, EdgeState::Posted | EdgeState::Unknown)
                .then_some(EdgeState::Failed { posted: true })
        })
    }

    /// The posted WRITE's status cannot be read (NOT_FOUND the producer did not cause): it
    /// may still land. No notice is owed and the edge stays non-terminal (F7).
    ///
    /// # Errors
    /// `WrongState` unless the edge is posted (or already unknown, which is a no-op).
    pub fn status_unknown(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.step(d_rank, |s| {
            matches!(s, EdgeState::Posted | EdgeState::Unknown).then_some(EdgeState::Unknown)
        })
    }

    /// Whether an edge's write is posted and its status unknown.
    pub fn has_unknown(&self) -> bool {
        self.edges.iter().any(|e| e.state == EdgeState::Unknown)
    }

    /// The consumer rank cannot be named or reached: no notice can be sent for it.
    ///
    /// # Errors
    /// `WrongState` if the edge already landed or its notice went out.
    pub fn unreachable(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.step(d_rank, |s| match s {
            EdgeState::Landed | EdgeState::Noticed | EdgeState::Posted | EdgeState::Unknown => None,
            _ => Some(EdgeState::Unreachable),
        })
    }

    /// The request ended on this producer (finished, aborted, lease gone, handshake
    /// failed): no new WRITE may be posted, and every edge not yet attempted is owed a
    /// failure notice (including ranks never reached because the loop unwound).
    pub fn retire(&mut self) {
        self.retired = true;
        for e in self
            .edges
            .iter_mut()
            .filter(|e| e.state == EdgeState::Planned)
        {
            e.state = EdgeState::Failed { posted: false };
        }
    }

    /// Consumer ranks owed a `PUSH_FAIL` now, one per failed, reachable edge not yet
    /// noticed.
    pub fn owed_notices(&self) -> impl Iterator<Item = u16> + '_ {
        self.edges
            .iter()
            .filter(|e| matches!(e.state, EdgeState::Failed { .. }))
            .map(|e| e.d_rank)
    }

    /// The `PUSH_FAIL` for `d_rank` was handed to the transport.
    ///
    /// # Errors
    /// `WrongState` unless a notice is owed for that edge.
    pub fn noticed(&mut self, d_rank: u16) -> Result<(), PlanError> {
        self.step(d_rank, |s| {
            matches!(s, EdgeState::Failed { .. }).then_some(EdgeState::Noticed)
        })
    }

    /// No WRITE of this request is in flight or still to be posted: the source blocks may
    /// be released (never before, whatever the lease says: F3).
    pub fn is_terminal(&self) -> bool {
        self.edges.iter().all(|e| {
            !matches!(
                e.state,
                EdgeState::Planned | EdgeState::Posted | EdgeState::Unknown
            )
        })
    }

    /// Whether every edge landed.
    pub fn all_landed(&self) -> bool {
        self.edges.iter().all(|e| e.state == EdgeState::Landed)
    }
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::*;

    fn topo(p_tp: u16, p_pp: u16, d_tp: u16, mla: bool) -> Topology {
        Topology {
            p_tp,
            p_pp,
            d_tp,
            mla,
        }
    }

    fn ranks(t: &Topology, p: u16) -> std::vec::Vec<(u16, WriteShape)> {
        t.targets(p).expect("valid topology").into_iter().collect()
    }

    use WriteShape::{HeadSlice, Whole};

    /// (topology, expected per D rank, targets of each P tp rank)
    type Case<'a> = (Topology, u32, &'a [&'a [(u16, WriteShape)]]);

    #[test]
    fn table_of_topologies() {
        // (P tp, P pp, D tp, MLA) → expected per D rank, targets of each P tp rank.
        let cases: &[Case<'_>] = &[
            (topo(1, 1, 1, false), 1, &[&[(0, Whole)]]),
            (topo(2, 1, 1, false), 2, &[&[(0, Whole)], &[(0, Whole)]]),
            (
                topo(4, 1, 2, false),
                2,
                &[&[(0, Whole)], &[(0, Whole)], &[(1, Whole)], &[(1, Whole)]],
            ),
            (
                topo(1, 1, 2, false),
                1,
                &[&[
                    (0, HeadSlice { index: 0, of: 2 }),
                    (1, HeadSlice { index: 1, of: 2 }),
                ]],
            ),
            (topo(1, 1, 2, true), 1, &[&[(0, Whole), (1, Whole)]]),
            (topo(1, 2, 1, false), 2, &[&[(0, Whole)]]),
            (
                topo(4, 2, 2, false),
                4,
                &[&[(0, Whole)], &[(0, Whole)], &[(1, Whole)], &[(1, Whole)]],
            ),
        ];
        for (t, expected, targets) in cases {
            assert_eq!(t.expected_per_consumer_rank(), *expected, "{t:?}");
            for (p, want) in targets.iter().enumerate() {
                assert_eq!(ranks(t, p as u16), *want, "{t:?} rank {p}");
            }
            // The consumer side agrees: each D rank has exactly `expected` producer edges.
            for d in 0..t.d_tp {
                assert_eq!(t.producers_of(d).count() as u32, *expected, "{t:?} d{d}");
            }
        }
    }

    #[test]
    fn bad_topologies_are_errors() {
        assert_eq!(
            topo(0, 1, 1, false).validate(),
            Err(TopologyError::ZeroSize)
        );
        assert_eq!(
            topo(3, 1, 2, false).validate(),
            Err(TopologyError::Indivisible)
        );
        assert_eq!(
            topo(2, 1, 1, false).targets(2),
            Err(TopologyError::RankOutOfRange)
        );
        assert_eq!(
            PushPlan::new(&topo(1, 2, 1, false), 2, 0),
            Err(TopologyError::RankOutOfRange)
        );
        assert_eq!(
            topo(1, 1, 128, false).validate(),
            Err(TopologyError::TooManyTargets)
        );
    }

    #[test]
    fn c2_unposted_edges_and_unwound_loop_are_owed_once() {
        let t = topo(1, 1, 4, false);
        let mut plan = PushPlan::new(&t, 0, 0).unwrap();
        plan.posted(0).unwrap();
        plan.post_failed(1).unwrap(); // C2
        assert!(!plan.is_retired());
        assert_eq!(
            plan.edge(1).map(|e| e.state),
            Some(EdgeState::Failed { posted: false })
        );
        plan.retire(); // the loop unwound: ranks 2 and 3 never attempted
        assert!(plan.is_retired());
        assert_eq!(plan.may_post(2), Err(PlanError::Retired)); // F4
        assert_eq!(
            plan.edge(2).map(|e| e.state),
            Some(EdgeState::Failed { posted: false })
        );
        assert_eq!(plan.edge(0).map(|e| e.state), Some(EdgeState::Posted));
        assert!(
            plan.edge(4).is_none(),
            "no edge to a rank this plan does not write"
        );
        assert!(plan.owed_notices().eq([1, 2, 3]));
        assert!(!plan.is_terminal()); // rank 0 still in flight: keep the source blocks (F3)
        plan.landed(0).unwrap();
        assert!(plan.is_terminal());
        for d in [1, 2, 3] {
            plan.noticed(d).unwrap();
        }
        assert_eq!(plan.owed_notices().count(), 0);
        assert_eq!(
            plan.noticed(1),
            Err(PlanError::WrongState(1, EdgeState::Noticed))
        );
    }

    #[test]
    fn f7_failure_after_post_owes_a_notice_and_unreachable_owes_none() {
        let t = topo(1, 1, 2, true);
        let mut plan = PushPlan::new(&t, 0, 0).unwrap();
        plan.posted(0).unwrap();
        plan.backend_error(0).unwrap();
        plan.unreachable(1).unwrap();
        assert!(plan.owed_notices().eq([0]));
        assert!(plan.is_terminal());
        assert_eq!(
            plan.landed(0),
            Err(PlanError::WrongState(0, EdgeState::Failed { posted: true }))
        );
        assert_eq!(plan.posted(9), Err(PlanError::UnknownEdge(9)));
    }

    #[test]
    fn f7_unknown_status_owes_nothing_and_keeps_sources_fenced() {
        let t = topo(1, 1, 2, true);
        let mut plan = PushPlan::new(&t, 0, 0).unwrap();
        plan.posted(0).unwrap();
        plan.posted(1).unwrap();
        // NOT_FOUND we did not cause: unknown, nothing owed, not terminal.
        plan.status_unknown(0).unwrap();
        plan.landed(1).unwrap();
        assert_eq!(plan.owed_notices().count(), 0);
        assert!(
            !plan.is_terminal(),
            "an unknown write keeps the sources fenced"
        );
        assert!(plan.has_unknown());
        assert_eq!(
            plan.unreachable(0),
            Err(PlanError::WrongState(0, EdgeState::Unknown))
        );
        // Retiring does not turn an unknown posted edge into a notice.
        plan.retire();
        assert_eq!(plan.owed_notices().count(), 0);
        // A later backend error (this or another transfer to the same peer) bounds it.
        plan.backend_error(0).unwrap();
        assert!(plan.owed_notices().eq([0]));
        assert!(plan.is_terminal());

        // Or the handle reports Success after all.
        let mut plan = PushPlan::new(&t, 0, 0).unwrap();
        plan.posted(0).unwrap();
        plan.status_unknown(0).unwrap();
        assert_eq!(
            plan.landed(0),
            Err(PlanError::WrongState(0, EdgeState::Unknown))
        );
        plan.landed_after_unknown(0).unwrap();
        assert_eq!(plan.edges()[0].state, EdgeState::Landed);
    }
}
