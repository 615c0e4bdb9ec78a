//! `producer_plan`: arbitrary topologies and post / land / fail / unreachable / retire /
//! notice outcomes on the [`PushPlan`]s of every producer rank of one request.
//!
//! * the topology's two views agree: the producers each consumer rank lists are exactly
//!   the producer ranks whose targets name it, as many as `expected_per_consumer_rank`;
//! * every step is accepted or refused as the plan's documented state machine says;
//! * the owed `PUSH_FAIL` list never holds more entries than the plan has unresolved,
//!   identifiable edges (invariant 3), names each edge at most once, and never names an
//!   edge that landed;
//! * a consumer [`Ledger`] of each rank, fed exactly the notices the producers sent
//!   (completions for landed edges, failure notices for noticed ones), decides when and
//!   only when every producer edge into it was resolved, in both registration modes.

use arbitrary::{Arbitrary, Unstructured};

use kvdrain::producer::{EdgeState, PlanError, PushPlan, Topology, TopologyError, WriteShape};
use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration,
};

/// Sizes to pick from: small ones, one that does not divide, and some too large.
const SIZES: [u16; 10] = [1, 2, 4, 1, 2, 8, 3, 0, 16, 128];

#[derive(Arbitrary, Debug)]
struct Input {
    p_tp: u8,
    p_pp: u8,
    d_tp: u8,
    mla: bool,
    steps: Vec<Step>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Step {
    Post { rank: u8, edge: u8, ok: bool },
    Land { rank: u8, edge: u8 },
    Fail { rank: u8, edge: u8 },
    Unreachable { rank: u8, edge: u8 },
    Notice { rank: u8, edge: u8 },
    Retire { rank: u8 },
}

/// Where an edge stands, kept by the harness from the outcomes it reported.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shadow {
    Planned,
    Posted,
    Landed,
    FailedUnposted,
    FailedPosted,
    Noticed,
    Unreachable,
}

struct Producer {
    agent: AgentId,
    plan: PushPlan,
    shadow: Vec<(u16, Shadow)>,
    retired: bool,
}

/// Runs one fuzz input.
pub fn producer_plan(data: &[u8]) {
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let topology = Topology {
        p_tp: SIZES[usize::from(input.p_tp) % SIZES.len()],
        p_pp: SIZES[usize::from(input.p_pp) % SIZES.len()].min(4),
        d_tp: SIZES[usize::from(input.d_tp) % SIZES.len()],
        mla: input.mla,
    };
    if !views_agree(&topology) {
        return;
    }
    let mut producers = Vec::new();
    for stage in 0..topology.p_pp {
        for rank in 0..topology.p_tp {
            let plan = PushPlan::new(&topology, stage, rank).expect("valid topology and rank");
            let shadow = plan
                .edges()
                .iter()
                .map(|e| (e.d_rank, Shadow::Planned))
                .collect();
            producers.push(Producer {
                agent: AgentId(producers.len() as u16),
                plan,
                shadow,
                retired: false,
            });
        }
    }
    for step in input.steps.iter().take(1024) {
        let at = match *step {
            Step::Post { rank, .. }
            | Step::Land { rank, .. }
            | Step::Fail { rank, .. }
            | Step::Unreachable { rank, .. }
            | Step::Notice { rank, .. }
            | Step::Retire { rank } => usize::from(rank) % producers.len(),
        };
        producers[at].apply(*step);
        producers[at].check();
    }
    consumers_agree(&topology, &producers);
}

/// Checks the topology's producer and consumer views; `false` if it is invalid.
fn views_agree(t: &Topology) -> bool {
    let valid = t.validate();
    if let Err(e) = valid {
        assert!(
            t.targets(0).is_err(),
            "{t:?}: targets of an invalid topology"
        );
        assert!(
            PushPlan::new(t, 0, 0).is_err(),
            "{t:?}: plan for an invalid topology ({e})"
        );
        assert_eq!(
            t.producers_of(0).count(),
            0,
            "{t:?}: producers of an invalid topology"
        );
        return false;
    }
    assert_eq!(t.targets(t.p_tp), Err(TopologyError::RankOutOfRange));
    assert!(
        PushPlan::new(t, t.p_pp, 0).is_err(),
        "{t:?}: stage out of range"
    );
    let k = (t.p_tp / t.d_tp).max(1);
    let expected = u32::from(t.p_pp) * u32::from(k);
    assert_eq!(
        t.expected_per_consumer_rank(),
        expected,
        "{t:?}: pp × max(1, P_tp / D_tp)"
    );
    let targets: Vec<Vec<(u16, WriteShape)>> = (0..t.p_tp)
        .map(|p| t.targets(p).expect("valid rank").into_iter().collect())
        .collect();
    for (p, list) in targets.iter().enumerate() {
        assert!(!list.is_empty(), "{t:?}: rank {p} writes nobody");
        for (i, &(d, shape)) in list.iter().enumerate() {
            assert!(d < t.d_tp, "{t:?}: rank {p} writes D rank {d}");
            assert!(
                list[..i].iter().all(|&(e, _)| e != d),
                "{t:?}: rank {p} writes {d} twice"
            );
            let whole = t.p_tp >= t.d_tp || t.mla;
            assert_eq!(
                whole,
                shape == WriteShape::Whole,
                "{t:?}: shape of {p} → {d}"
            );
        }
    }
    // The first ranks and the last one (all ranks of a 128-wide topology cost too much).
    for d in (0..t.d_tp.min(8)).chain([t.d_tp - 1]) {
        let listed: Vec<(u16, u16)> = t.producers_of(d).collect();
        let mut writers = Vec::new();
        for stage in 0..t.p_pp {
            for (p, list) in targets.iter().enumerate() {
                if list.iter().any(|&(e, _)| e == d) {
                    writers.push((stage, p as u16));
                }
            }
        }
        assert_eq!(listed, writers, "{t:?}: producers of D rank {d}");
        assert_eq!(
            listed.len() as u32,
            expected,
            "{t:?}: edges into D rank {d}"
        );
    }
    assert_eq!(
        t.producers_of(t.d_tp).count(),
        0,
        "{t:?}: D rank out of range"
    );
    true
}

impl Producer {
    fn edge(&self, edge: u8) -> u16 {
        if edge == u8::MAX {
            return u16::MAX; // not an edge of this plan
        }
        self.shadow[usize::from(edge) % self.shadow.len()].0
    }

    fn shadow_of(&mut self, d: u16) -> Option<&mut Shadow> {
        self.shadow
            .iter_mut()
            .find(|(e, _)| *e == d)
            .map(|(_, s)| s)
    }

    /// Applies one step to the plan and to the shadow; both must agree on the result.
    fn apply(&mut self, step: Step) {
        let retired = self.retired;
        let (d, result, expected) = match step {
            Step::Post { edge, ok, .. } => {
                let d = self.edge(edge);
                let result = self.plan.may_post(d).and_then(|()| {
                    if ok {
                        self.plan.posted(d)
                    } else {
                        self.plan.post_failed(d)
                    }
                });
                let next = if ok {
                    Shadow::Posted
                } else {
                    Shadow::FailedUnposted
                };
                let expected = match self.shadow_of(d) {
                    _ if retired => Err(PlanError::Retired),
                    None => Err(PlanError::UnknownEdge(d)),
                    Some(s) if *s == Shadow::Planned => {
                        *s = next;
                        Ok(())
                    }
                    Some(_) => Err(PlanError::WrongState(d, EdgeState::Planned)),
                };
                (d, result, expected)
            }
            Step::Land { edge, .. } => {
                let d = self.edge(edge);
                let result = self.plan.landed(d);
                (
                    d,
                    result,
                    self.transition(d, |s| s == Shadow::Posted, Shadow::Landed),
                )
            }
            Step::Fail { edge, .. } => {
                let d = self.edge(edge);
                let result = self.plan.backend_error(d);
                let expected = self.transition(d, |s| s == Shadow::Posted, Shadow::FailedPosted);
                (d, result, expected)
            }
            Step::Unreachable { edge, .. } => {
                let d = self.edge(edge);
                let result = self.plan.unreachable(d);
                let allowed = |s| !matches!(s, Shadow::Landed | Shadow::Noticed | Shadow::Posted);
                (d, result, self.transition(d, allowed, Shadow::Unreachable))
            }
            Step::Notice { edge, .. } => {
                let d = self.edge(edge);
                let result = self.plan.noticed(d);
                let owed = |s| matches!(s, Shadow::FailedPosted | Shadow::FailedUnposted);
                (d, result, self.transition(d, owed, Shadow::Noticed))
            }
            Step::Retire { .. } => {
                self.plan.retire();
                self.retired = true;
                for (_, s) in &mut self.shadow {
                    if *s == Shadow::Planned {
                        *s = Shadow::FailedUnposted;
                    }
                }
                (0, Ok(()), Ok(()))
            }
        };
        // The error's reported state is informative only; compare the kind.
        let kind = |r: Result<(), PlanError>| match r {
            Ok(()) => 0,
            Err(PlanError::UnknownEdge(_)) => 1,
            Err(PlanError::WrongState(..)) => 2,
            Err(PlanError::Retired) => 3,
        };
        assert_eq!(
            kind(result),
            kind(expected),
            "{step:?} on edge {d}: {result:?}"
        );
    }

    fn transition(
        &mut self,
        d: u16,
        allowed: impl Fn(Shadow) -> bool,
        next: Shadow,
    ) -> Result<(), PlanError> {
        match self.shadow_of(d) {
            None => Err(PlanError::UnknownEdge(d)),
            Some(s) if allowed(*s) => {
                *s = next;
                Ok(())
            }
            Some(_) => Err(PlanError::WrongState(d, EdgeState::Planned)),
        }
    }

    fn check(&self) {
        let owed: Vec<u16> = self.plan.owed_notices().collect();
        let unresolved = self
            .shadow
            .iter()
            .filter(|(_, s)| !matches!(s, Shadow::Landed | Shadow::Noticed | Shadow::Unreachable))
            .count();
        assert!(
            owed.len() <= unresolved,
            "owes {owed:?} with {unresolved} unresolved edges"
        );
        for (i, d) in owed.iter().enumerate() {
            assert!(!owed[..i].contains(d), "owes {d} twice");
        }
        let want: Vec<u16> = self
            .shadow
            .iter()
            .filter(|(_, s)| matches!(s, Shadow::FailedPosted | Shadow::FailedUnposted))
            .map(|&(d, _)| d)
            .collect();
        assert_eq!(owed, want, "owed notices");
        let terminal = self
            .shadow
            .iter()
            .all(|(_, s)| !matches!(s, Shadow::Planned | Shadow::Posted));
        assert_eq!(self.plan.is_terminal(), terminal, "is_terminal");
        let landed = self.shadow.iter().all(|(_, s)| *s == Shadow::Landed);
        assert_eq!(self.plan.all_landed(), landed, "all_landed");
        for (edge, &(d, s)) in self.plan.edges().iter().zip(&self.shadow) {
            assert_eq!(edge.d_rank, d);
            let state = match s {
                Shadow::Planned => EdgeState::Planned,
                Shadow::Posted => EdgeState::Posted,
                Shadow::Landed => EdgeState::Landed,
                Shadow::FailedUnposted => EdgeState::Failed { posted: false },
                Shadow::FailedPosted => EdgeState::Failed { posted: true },
                Shadow::Noticed => EdgeState::Noticed,
                Shadow::Unreachable => EdgeState::Unreachable,
            };
            assert_eq!(edge.state, state, "edge {d}");
        }
    }
}

/// Feeds every consumer rank the notices the producers sent and checks its decision.
fn consumers_agree(t: &Topology, producers: &[Producer]) {
    let expected = t.expected_per_consumer_rank();
    for d in 0..t.d_tp.min(8) {
        let mut notices = Vec::new();
        let mut resolved = 0;
        let mut all_landed = true;
        for p in producers {
            for &(e, s) in &p.shadow {
                if e != d {
                    continue;
                }
                match s {
                    Shadow::Landed => notices.push((p.agent, false)),
                    Shadow::Noticed => notices.push((p.agent, true)),
                    _ => {}
                }
                resolved += u32::from(matches!(s, Shadow::Landed | Shadow::Noticed));
                all_landed &= s == Shadow::Landed;
            }
        }
        // Never more notices than the consumer rank expects (invariant 3).
        assert!(
            notices.len() as u32 <= expected,
            "{t:?}: D rank {d} got {notices:?}"
        );
        if expected > 64 {
            continue;
        }
        let agents: Vec<AgentId> = t
            .producers_of(d)
            .map(|(stage, p)| AgentId(stage * t.p_tp + p))
            .collect();
        let modes = [Expect::Edges(&agents), Expect::Count(expected as u8)];
        for expect in modes {
            let decision = deliver(t, expect, &notices);
            let want = match (resolved == expected, all_landed) {
                (false, _) => "none",
                (true, true) => "completed",
                (true, false) => "failed",
            };
            assert_eq!(
                decision, want,
                "{t:?}: D rank {d} {expect:?} after {notices:?}"
            );
        }
    }
}

fn deliver(t: &Topology, expect: Expect<'_>, notices: &[(AgentId, bool)]) -> &'static str {
    let mut ledger: Ledger<2, 64> = Ledger::new(Config::with_capacity(2));
    let _ticket = ledger
        .register(Registration {
            id: "req",
            blocks: BlockHandle(1),
            expect,
            deadline: None,
        })
        .expect("a valid registration");
    for &(agent, failed) in notices {
        let bytes = if failed {
            format!("PUSH_FAIL:req:{}", t.p_tp)
        } else {
            format!("req:{}", t.p_tp)
        };
        let _ = ledger
            .handle_notification(agent, bytes.as_bytes())
            .expect("a producer's notice counts");
    }
    let decisions: Vec<Decision> = ledger.decisions().collect();
    match decisions.as_slice() {
        [] => "none",
        [Decision::Completed(_)] => "completed",
        // A failure notice settles (rule 8) before the blocks come back, at the default
        // settle end (every notice came at 0).
        [Decision::Failed(_)] if notices.iter().any(|&(_, failed)| failed) => {
            let settle_end = Instant::ZERO + Config::with_capacity(2).settle;
            ledger
                .advance(settle_end.saturating_sub(Duration::from_millis(1)))
                .expect("clock");
            let released: Vec<Decision> = ledger.decisions().collect();
            assert!(
                released.is_empty(),
                "released before settling: {released:?}"
            );
            ledger.advance(settle_end).expect("clock");
            let released: Vec<Decision> = ledger.decisions().collect();
            match released.as_slice() {
                [Decision::Released(r)] if !r.forced() => "failed",
                other => panic!("unexpected settle-end decisions {other:?}"),
            }
        }
        other => panic!("unexpected decisions {other:?}"),
    }
}
