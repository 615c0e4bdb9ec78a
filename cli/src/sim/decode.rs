//! One decode rank of the simulation: the shared consumer driver
//! ([`ConsumerDriver`]: agent directory, registration, heartbeats, lost producers and decisions,
//! the code real NIXL runs) next to the rank's simulated KV blocks, and what the
//! simulation expects of it. No protocol rule lives here: the driver decides, its
//! transport ([`super::decode_link`]) carries, and this file only turns the driver's
//! events into the steps the event loop checks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvdrain::{BlockHandle, Millis};
use kvdrain_driver::consumer::{ConsumerConfig, ConsumerDriver, ConsumerEvent};
use kvdrain_driver::transport::Notification;

use super::link::request_number;
use super::memory::BlockPool;

/// Slots per decode rank's ledger.
pub const SLOTS: usize = 256;
/// Named edges per request (the most any topology of the simulation needs).
pub const EDGES: usize = 64;

/// What the driver decided about one request on this rank.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Step {
    /// Every edge landed: decode may start.
    Completed,
    /// Every edge resolved, at least one failed (`Released` follows).
    Failed,
    /// The deadline passed with edges outstanding.
    Expired,
    /// The blocks are safe to reuse.
    Released {
        /// Released by the quarantine running out.
        forced: bool,
    },
}

/// A decode rank.
#[derive(Debug)]
pub struct DecodeRank {
    /// The consumer driver.
    pub driver: ConsumerDriver<SLOTS, EDGES>,
    /// Its KV blocks.
    pub pool: BlockPool,
    /// Notifications delivered and not drained yet.
    pub inbox: Vec<Notification>,
    /// Producer agents its transport saw gone, not reported yet.
    pub gone: VecDeque<String>,
    /// `(deadline, request)` of registrations without an outcome yet.
    undecided: BTreeSet<(Millis, u64)>,
    deadlines: BTreeMap<u64, Millis>,
}

impl DecodeRank {
    /// A rank with `blocks` KV blocks and a driver configured by `config`.
    pub fn new(config: ConsumerConfig, blocks: u32) -> Self {
        DecodeRank {
            driver: ConsumerDriver::new(config),
            pool: BlockPool::new(blocks),
            inbox: Vec::new(),
            gone: VecDeque::new(),
            undecided: BTreeSet::new(),
            deadlines: BTreeMap::new(),
        }
    }

    /// `req` was registered: it must have an outcome by `deadline` (spec rule 2).
    pub fn expect_outcome(&mut self, req: u64, deadline: Millis) {
        self.undecided.insert((deadline, req));
        self.deadlines.insert(req, deadline);
    }

    /// `req` has its outcome (a decision, or the engine's abort).
    pub fn outcome_given(&mut self, req: u64) {
        if let Some(deadline) = self.deadlines.remove(&req) {
            self.undecided.remove(&(deadline, req));
        }
    }

    /// The earliest registration whose deadline is at or before `now` and that has no
    /// outcome yet (spec rule 2 says there is none after a poll at `now`).
    pub fn overdue(&self, now: Millis) -> Option<u64> {
        self.undecided
            .first()
            .filter(|&&(deadline, _)| deadline <= now)
            .map(|&(_, req)| req)
    }

    /// Every decision the driver queued, as `(request, step)`; what is wrong with one
    /// the simulation cannot place goes to `wrong`.
    pub fn take_steps(&mut self, wrong: &mut Vec<String>) -> Vec<(u64, Step)> {
        let mut steps = Vec::new();
        while let Some(event) = self.driver.engine().poll_event() {
            let (request, step, blocks) = match event {
                ConsumerEvent::Decode { request, blocks } => {
                    (request, Step::Completed, Some(blocks))
                }
                ConsumerEvent::Failed { request } => (request, Step::Failed, None),
                ConsumerEvent::Expired { request, .. } => (request, Step::Expired, None),
                ConsumerEvent::Release {
                    request,
                    blocks,
                    forced,
                } => (request, Step::Released { forced }, Some(blocks)),
            };
            let Some(req) = request_number(&request.id) else {
                wrong.push(format!("decision {step:?} for unknown id {:?}", request.id));
                continue;
            };
            if let Some(BlockHandle(handle)) = blocks.filter(|&BlockHandle(h)| h != req) {
                wrong.push(format!(
                    "decision {step:?} for request {req} handed over blocks {handle}"
                ));
            }
            if !matches!(step, Step::Released { .. }) {
                self.outcome_given(req);
            }
            steps.push((req, step));
        }
        steps
    }
}
