//! The reference model for the `ledger_ops` differential target: the consumer-side rules of
//! `docs/replay-trace.md` plus the crate's documented drive contract, written as plainly as
//! possible with std collections. It shares no code with the tracker (not even the message
//! parser) and does no clever bookkeeping: every operation scans a `Vec` of live requests
//! kept in registration order.
//!
//! The documented API adds one thing to the spec's replay view: a request whose last edge
//! was resolved by a notification is *decided* at once but its decision is handed out by
//! the next `poll` (the ready queue). Until then it still holds its slot and its id, later
//! notices and aborts for it are `late`, and its timers no longer matter.
//!
//! Rule 8 (settling): a failure notice that resolves an edge is remembered with the time
//! of the last clock advance (the only clock there is); once every edge is resolved the
//! request is decided but keeps its slot and its id until `settle_ms` after the last such
//! notice — or, if aborted or expired, until its quarantine end if that comes first.
//!
//! Rule 9: `gone` resolves an agent's outstanding named edges as a failure notice from
//! it would, so it is a `fence` that also stamps each request it touches as a failure
//! notice at the current clock.

use std::collections::{BTreeSet, VecDeque};

use crate::spec_parse::{SpecMessage, spec_parse};

/// What a registration waits for.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum MExpect {
    Count(u8),
    Edges(Vec<u16>),
}

/// Why a registration is refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MReject {
    BadCount,
    BadEdges,
    DuplicateId,
    Full,
}

/// Why a notification changed nothing (the spec's `ignored` reasons).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MIgnore {
    Malformed,
    NotForConsumer,
    Unknown,
    Late,
    Duplicate,
    UnexpectedSender,
}

/// What an accepted notification did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MNoticed {
    Counted,
    Decided,
}

/// Edges still owed: a count, or a bit per registered agent (registration order).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MOutstanding {
    Count(u8),
    Edges(u64),
}

/// Why an abort changed nothing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MAbortError {
    Unknown,
    Late,
}

/// A decision, with the request's registration number as its key.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum MDecision {
    Completed { key: u64, blocks: u64 },
    Failed { key: u64 },
    Expired { key: u64, outstanding: MOutstanding },
    Released { key: u64, blocks: u64, forced: bool },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Counting,
    Aborted,
    Expired,
}

#[derive(Clone, Debug)]
enum Owed {
    Count(u8),
    /// `(agent, resolved)` in registration order.
    Edges(Vec<(u16, bool)>),
}

#[derive(Clone, Debug)]
struct Request {
    key: u64,
    id: String,
    blocks: u64,
    owed: Owed,
    failed: bool,
    phase: Phase,
    deadline: u64,
    /// When the blocks are released anyway (aborted or expired only).
    quarantine_end: u64,
    /// Every edge resolved by a notice; the decision waits for `poll`.
    ready: bool,
    /// When the last failure notice that resolved one of its edges came.
    last_failure_notice: Option<u64>,
    /// Decided, waiting for its failure notices to settle until this time.
    settle_end: Option<u64>,
}

impl Request {
    fn all_resolved(&self) -> bool {
        match &self.owed {
            Owed::Count(n) => *n == 0,
            Owed::Edges(edges) => edges.iter().all(|&(_, resolved)| resolved),
        }
    }

    fn outstanding(&self) -> MOutstanding {
        match &self.owed {
            Owed::Count(n) => MOutstanding::Count(*n),
            Owed::Edges(edges) => {
                let mut mask = 0;
                for (i, &(_, resolved)) in edges.iter().enumerate() {
                    if !resolved {
                        mask |= 1 << i;
                    }
                }
                MOutstanding::Edges(mask)
            }
        }
    }

    /// Decided and no longer waiting for anything but the clock.
    fn decided(&self) -> bool {
        self.ready || self.settle_end.is_some()
    }

    /// When a settling request's blocks come back: its settle end, or its quarantine end
    /// if that is earlier.
    fn settling_due(&self) -> Option<u64> {
        let end = self.settle_end?;
        Some(match self.phase {
            Phase::Counting => end,
            Phase::Aborted | Phase::Expired => end.min(self.quarantine_end),
        })
    }
}

/// Settings of the model, as in [`Config`](kvdrain::Config).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MConfig {
    pub(crate) capacity: usize,
    pub(crate) deadline_ms: u64,
    pub(crate) quarantine_ms: u64,
    pub(crate) settle_ms: u64,
    /// Most named edges a registration may list (`E`).
    pub(crate) max_edges: usize,
}

/// The model tracker.
#[derive(Debug)]
pub(crate) struct Model {
    config: MConfig,
    now: u64,
    next_key: u64,
    /// Tracked requests (decided-but-not-polled and quarantined ones included), in
    /// registration order.
    live: Vec<Request>,
    /// Keys decided by a notice, in the order their last edge was resolved.
    ready: VecDeque<u64>,
    /// Ids of requests that were decided and left the table.
    remembered: BTreeSet<String>,
}

impl Model {
    pub(crate) fn new(config: MConfig) -> Self {
        Model {
            config,
            now: 0,
            next_key: 0,
            live: Vec::new(),
            ready: VecDeque::new(),
            remembered: BTreeSet::new(),
        }
    }

    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.config.capacity
    }

    /// Whether the request with this key waits in the ready queue.
    pub(crate) fn is_ready(&self, key: u64) -> bool {
        self.ready.contains(&key)
    }

    /// Whether the request with this key is decided and waits for its failure notices to
    /// settle.
    pub(crate) fn is_settling(&self, key: u64) -> bool {
        self.live
            .iter()
            .any(|r| r.key == key && r.settle_end.is_some())
    }

    /// Requests waiting to settle now.
    pub(crate) fn settling(&self) -> usize {
        self.live.iter().filter(|r| r.settle_end.is_some()).count()
    }

    /// The key of the tracked request with this id.
    pub(crate) fn key_of(&self, id: &str) -> Option<u64> {
        self.position(id).map(|at| self.live[at].key)
    }

    /// Whether the request with this key is still in the table.
    pub(crate) fn is_tracked(&self, key: u64) -> bool {
        self.live.iter().any(|r| r.key == key)
    }

    /// The earliest time a timer of a request still waiting on the clock falls.
    pub(crate) fn next_due(&self) -> Option<u64> {
        self.live
            .iter()
            .filter(|r| !r.ready)
            .map(|r| match (r.settling_due(), r.phase) {
                (Some(due), _) => due,
                (None, Phase::Counting) => r.deadline,
                (None, Phase::Aborted | Phase::Expired) => r.quarantine_end,
            })
            .min()
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.live.iter().position(|r| r.id == id)
    }

    /// Takes a request out of the table and remembers its id.
    fn retire(&mut self, at: usize) -> Request {
        let request = self.live.remove(at);
        self.remembered.insert(request.id.clone());
        request
    }

    pub(crate) fn register(
        &mut self,
        id: &str,
        blocks: u64,
        expect: &MExpect,
        deadline_ms: Option<u64>,
    ) -> Result<u64, MReject> {
        let owed = match expect {
            MExpect::Count(n) if (1..=64).contains(n) => Owed::Count(*n),
            MExpect::Count(_) => return Err(MReject::BadCount),
            MExpect::Edges(agents) => {
                let distinct: BTreeSet<u16> = agents.iter().copied().collect();
                if agents.is_empty()
                    || agents.len() > self.config.max_edges
                    || distinct.len() != agents.len()
                {
                    return Err(MReject::BadEdges);
                }
                Owed::Edges(agents.iter().map(|&a| (a, false)).collect())
            }
        };
        if self.position(id).is_some() {
            return Err(MReject::DuplicateId);
        }
        if self.live.len() >= self.config.capacity {
            return Err(MReject::Full);
        }
        let key = self.next_key;
        self.next_key += 1;
        self.live.push(Request {
            key,
            id: id.to_string(),
            blocks,
            owed,
            failed: false,
            phase: Phase::Counting,
            deadline: self
                .now
                .saturating_add(deadline_ms.unwrap_or(self.config.deadline_ms)),
            quarantine_end: 0,
            ready: false,
            last_failure_notice: None,
            settle_end: None,
        });
        Ok(key)
    }

    /// A notification from `agent`. On `Err`, the id the message named (if it parsed).
    pub(crate) fn notify(
        &mut self,
        agent: u16,
        bytes: &[u8],
    ) -> Result<MNoticed, (MIgnore, Option<String>)> {
        let (id, failed) = match spec_parse(bytes) {
            SpecMessage::Malformed => return Err((MIgnore::Malformed, None)),
            SpecMessage::NotForConsumer => return Err((MIgnore::NotForConsumer, None)),
            SpecMessage::Notice { id, failed, .. } => (id, failed),
        };
        let Some(at) = self.position(&id) else {
            let reason = if self.remembered.contains(&id) {
                MIgnore::Late
            } else {
                MIgnore::Unknown
            };
            return Err((reason, Some(id)));
        };
        let now = self.now;
        let request = &mut self.live[at];
        if request.decided() {
            return Err((MIgnore::Late, Some(id)));
        }
        match &mut request.owed {
            Owed::Count(n) => *n -= 1,
            Owed::Edges(edges) => match edges.iter_mut().find(|(a, _)| *a == agent) {
                None => return Err((MIgnore::UnexpectedSender, Some(id))),
                Some((_, true)) => return Err((MIgnore::Duplicate, Some(id))),
                Some((_, resolved)) => *resolved = true,
            },
        }
        request.failed |= failed;
        if failed {
            request.last_failure_notice = Some(now);
        }
        if request.all_resolved() {
            request.ready = true;
            self.ready.push_back(request.key);
            Ok(MNoticed::Decided)
        } else {
            Ok(MNoticed::Counted)
        }
    }

    fn abort_at(&mut self, at: usize) -> Result<(u64, MOutstanding), MAbortError> {
        let quarantine_end = self.now.saturating_add(self.config.quarantine_ms);
        let request = &mut self.live[at];
        if request.decided() || request.phase != Phase::Counting {
            return Err(MAbortError::Late);
        }
        request.phase = Phase::Aborted;
        request.quarantine_end = quarantine_end;
        Ok((request.key, request.outstanding()))
    }

    /// Abort by id.
    pub(crate) fn abort_id(&mut self, id: &str) -> Result<(u64, MOutstanding), MAbortError> {
        match self.position(id) {
            Some(at) => self.abort_at(at),
            None if self.remembered.contains(id) => Err(MAbortError::Late),
            None => Err(MAbortError::Unknown),
        }
    }

    /// Abort by the ticket of registration `key` (a ticket exists only for accepted
    /// registrations, so a request no longer tracked is `Late`).
    pub(crate) fn abort_key(&mut self, key: u64) -> Result<(u64, MOutstanding), MAbortError> {
        match self.live.iter().position(|r| r.key == key) {
            Some(at) => self.abort_at(at),
            None => Err(MAbortError::Late),
        }
    }

    /// Keys of the tracked requests with an outstanding named edge of `agent`.
    pub(crate) fn owing(&self, agent: u16) -> Vec<u64> {
        self.live
            .iter()
            .filter(|r| match &r.owed {
                Owed::Edges(edges) => edges.iter().any(|&(a, done)| a == agent && !done),
                Owed::Count(_) => false,
            })
            .map(|r| r.key)
            .collect()
    }

    /// `agent` can no longer write: its outstanding named edges fail now.
    pub(crate) fn fence(&mut self, agent: u16) -> (u32, Vec<MDecision>) {
        self.resolve_agent(agent, false)
    }

    /// `agent` was seen gone: its outstanding named edges fail now, as failure notices
    /// from it at this clock would (they settle).
    pub(crate) fn gone(&mut self, agent: u16) -> (u32, Vec<MDecision>) {
        self.resolve_agent(agent, true)
    }

    /// Fails every outstanding named edge of `agent`; `settles`: as a failure notice.
    fn resolve_agent(&mut self, agent: u16, settles: bool) -> (u32, Vec<MDecision>) {
        let now = self.now;
        let mut resolved = 0;
        let mut decisions = Vec::new();
        let mut at = 0;
        while at < self.live.len() {
            let request = &mut self.live[at];
            let mut hit = false;
            if let Owed::Edges(edges) = &mut request.owed {
                if let Some((_, done)) = edges.iter_mut().find(|(a, done)| *a == agent && !*done) {
                    *done = true;
                    hit = true;
                }
            }
            if hit {
                resolved += 1;
                request.failed = true;
                if settles {
                    request.last_failure_notice = Some(now);
                }
                if request.all_resolved() {
                    let stays = self.drain(at, &mut decisions);
                    at += usize::from(stays);
                    continue;
                }
            }
            at += 1;
        }
        (resolved, decisions)
    }

    /// Moves the clock; deadlines and quarantine ends at or before `now` fire, request by
    /// request in registration order. `Err` if the clock would go backwards.
    pub(crate) fn advance(&mut self, now: u64) -> Result<Vec<MDecision>, ()> {
        if now < self.now {
            return Err(());
        }
        self.now = now;
        let mut decisions = Vec::new();
        let mut at = 0;
        while at < self.live.len() {
            let quarantine_ms = self.config.quarantine_ms;
            let request = &mut self.live[at];
            if request.ready {
                at += 1;
                continue;
            }
            if let (Some(due), Some(end)) = (request.settling_due(), request.settle_end) {
                if due <= now {
                    // The settle end wins a tie: forced only if the quarantine came first.
                    let request = self.retire(at);
                    decisions.push(MDecision::Released {
                        key: request.key,
                        blocks: request.blocks,
                        forced: end > now,
                    });
                    continue;
                }
                at += 1;
                continue;
            }
            if request.phase == Phase::Counting && request.deadline <= now {
                request.phase = Phase::Expired;
                request.quarantine_end = request.deadline.saturating_add(quarantine_ms);
                decisions.push(MDecision::Expired {
                    key: request.key,
                    outstanding: request.outstanding(),
                });
            }
            if request.phase != Phase::Counting && request.quarantine_end <= now {
                let request = self.retire(at);
                decisions.push(MDecision::Released {
                    key: request.key,
                    blocks: request.blocks,
                    forced: true,
                });
                continue;
            }
            at += 1;
        }
        Ok(decisions)
    }

    /// Hands out the decisions of requests decided by notices, oldest first.
    pub(crate) fn poll(&mut self) -> Vec<MDecision> {
        let mut decisions = Vec::new();
        while let Some(key) = self.ready.pop_front() {
            let at = self
                .live
                .iter()
                .position(|r| r.key == key)
                .expect("a ready request stays tracked until polled");
            self.live[at].ready = false;
            let _stays = self.drain(at, &mut decisions);
        }
        decisions
    }

    /// The decisions of the request at `at`, whose every edge is resolved: its outcome
    /// (unless aborted or expired), then its release now, or none yet if a failure notice
    /// has not settled (it then stays, settling). Returns whether it stays in the table.
    fn drain(&mut self, at: usize, decisions: &mut Vec<MDecision>) -> bool {
        let now = self.now;
        let settle_ms = self.config.settle_ms;
        let request = &mut self.live[at];
        // Rule 1: nothing is released while an edge is outstanding.
        assert!(request.all_resolved(), "decided with edges outstanding");
        let (key, blocks) = (request.key, request.blocks);
        match request.phase {
            Phase::Counting if !request.failed => {
                self.retire(at);
                decisions.push(MDecision::Completed { key, blocks });
                return false;
            }
            Phase::Counting => decisions.push(MDecision::Failed { key }),
            Phase::Aborted | Phase::Expired => {}
        }
        let settle_end = request
            .last_failure_notice
            .map_or(0, |t| t.saturating_add(settle_ms));
        let quarantine_over = request.phase != Phase::Counting && request.quarantine_end <= now;
        if settle_end <= now || quarantine_over {
            self.retire(at);
            decisions.push(MDecision::Released {
                key,
                blocks,
                forced: settle_end > now,
            });
            return false;
        }
        request.settle_end = Some(settle_end);
        true
    }
}
