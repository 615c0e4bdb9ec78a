//! One decode rank of the simulation: the shared consumer driver
//! ([`ConsumerDriver`]: agent directory, registration, heartbeats, lost producers and decisions,
//! the code real NIXL runs) next to the rank's simulated KV blocks, and what the
//! simulation expects of it. No protocol rule lives here: the driver decides, its
//! transport ([`super::decode_link`]) carries, and this file only turns the driver's
//! events into the steps the event loop checks.
//!
//! The decode side of the event loop is here too: registering a request through a rank's
//! driver, delivering a notification and checking what the core made of it (`Should`),
//! polling a rank and applying its decisions (each checked against what the simulation
//! knows: one outcome per request, a completion only once every edge landed whole), the
//! client's aborts and the end of decoding.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kvdrain::{AgentId, BlockHandle, IgnoreReason, Instant, Noticed, Outstanding};
use kvdrain_driver::consumer::{
    ConsumerConfig, ConsumerDriver, ConsumerError, ConsumerEvent, EdgeMode, ReceiveSpec,
};
use kvdrain_driver::transport::Notification;

use super::Broken;
use super::cluster::Cluster;
use super::decode_link::{DecodeLink, ToProducer};
use super::link::request_number;
use super::memory::BlockPool;
use super::requests::{Outcome, RankPart, Request};
use super::timing::DECODE;
use super::world::{Event, World};

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
    undecided: BTreeSet<(u64, u64)>,
    deadlines: BTreeMap<u64, u64>,
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
    pub fn expect_outcome(&mut self, req: u64, deadline: u64) {
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
    pub fn overdue(&self, now: u64) -> Option<u64> {
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
                ConsumerEvent::Decode {
                    request, blocks, ..
                } => (request, Step::Completed, Some(blocks)),
                ConsumerEvent::Failed { request, .. } => (request, Step::Failed, None),
                ConsumerEvent::Expired { request, .. } => (request, Step::Expired, None),
                ConsumerEvent::Release {
                    request,
                    blocks,
                    forced,
                    ..
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

/// Ids of finished requests kept for "notice for an expired id" noise.
const FINISHED_KEPT: usize = 256;

/// What the consumer must do with an injected notification.
#[derive(Clone, Copy, Debug)]
pub(super) enum Should {
    /// A genuine notice from a producer: it may count or come late, but it is never
    /// malformed, producer-bound or from a stranger.
    Genuine,
    /// Noise: it must be ignored for one of these reasons.
    BeIgnored(&'static [&'static str]),
}

/// Records `outcome`; what is wrong if the request had one already (spec rule 2).
fn set_outcome(part: &mut RankPart, outcome: Outcome) -> Option<String> {
    let old = part.outcome.replace(outcome)?;
    Some(format!("{outcome:?} after {old:?}"))
}

impl World {
    /// Decode rank `d`'s driver and its view of the network, now.
    fn decode_rank(&mut self, d: usize) -> (&mut ConsumerDriver<SLOTS, EDGES>, DecodeLink<'_>) {
        let rank = &mut self.consumers[d];
        let link = DecodeLink {
            now: self.now,
            rng: &mut self.rng,
            cluster: &self.cluster,
            paths: &self.paths,
            inbox: &mut rank.inbox,
            gone: &mut rank.gone,
            registering: None,
            sent: Vec::new(),
        };
        (&mut rank.driver, link)
    }

    /// Registers a request on decode rank `d` through its driver (which sends `PUSH_REG`).
    pub(super) fn register(
        &mut self,
        d: usize,
        request: ReceiveSpec<'_>,
        mode: EdgeMode,
    ) -> Result<(), ConsumerError> {
        let now = self.now;
        let req = request_number(request.id);
        let (driver, mut link) = self.decode_rank(d);
        link.registering = req;
        let registered =
            driver
                .engine()
                .register_with(&mut link, request, mode, Instant::from_millis(now));
        let sent = link.sent;
        self.schedule_sent(d, sent);
        registered.map(|_| ())
    }

    /// One scheduler step of decode rank `d`: its driver drains what was delivered, reports
    /// the producers seen gone, advances its clock and heartbeats; its decisions are applied. Returns what the core
    /// made of each notification drained.
    pub(super) fn poll_decode(&mut self, d: usize) -> Vec<Result<Noticed, IgnoreReason>> {
        let now = self.now;
        let mut seen = Vec::new();
        let (driver, mut link) = self.decode_rank(d);
        // The virtual network never fails to drain.
        let _ = driver.poll_observed(&mut link, Instant::from_millis(now), |_, _, result| {
            seen.push(result.map_err(|ignored| ignored.reason));
        });
        let sent = link.sent;
        self.schedule_sent(d, sent);
        let mut wrong = Vec::new();
        let steps = self.consumers[d].take_steps(&mut wrong);
        for what in wrong {
            self.violation(format!("rank {d}: {what}"));
        }
        self.apply(d, steps);
        seen
    }

    /// Schedules what decode rank `from` sent.
    fn schedule_sent(&mut self, from: usize, sent: Vec<ToProducer>) {
        for m in sent {
            let event = Event::ToProducer {
                from,
                rank: m.rank,
                agent: m.agent,
                bytes: m.bytes,
            };
            self.agenda.push(m.at, event);
        }
    }

    /// A notification reaches decode rank `d`: its driver drains it at once.
    pub(super) fn deliver(&mut self, d: usize, agent: AgentId, bytes: Vec<u8>, should: Should) {
        let shown = String::from_utf8_lossy(&bytes).into_owned();
        self.consumers[d]
            .inbox
            .push((Cluster::agent_name(agent), bytes));
        let seen = self.poll_decode(d);
        let [result] = seen[..] else {
            self.violation(format!(
                "notification {shown:?} on rank {d}: {} results",
                seen.len()
            ));
            return;
        };
        if let Err(reason) = result {
            self.decisions.ignored(reason);
        }
        let fine = match should {
            Should::Genuine => !matches!(
                result,
                Err(IgnoreReason::Malformed(_)
                    | IgnoreReason::NotForConsumer
                    | IgnoreReason::UnexpectedSender)
            ),
            Should::BeIgnored(reasons) => {
                matches!(result, Err(r) if reasons.contains(&r.as_str()))
            }
        };
        if !fine {
            self.violation(format!(
                "notification {shown:?} from agent {} on rank {d}: {result:?}, expected {should:?}",
                agent.0
            ));
        }
    }

    pub(super) fn consumer_abort(&mut self, req: u64) {
        let mid_push = self.abort_everywhere(req);
        self.faults.aborted_mid_push += u64::from(mid_push);
        self.maybe_finish(req);
    }

    /// Aborts `req` on every rank still counting; whether writes or edges were still owed.
    fn abort_everywhere(&mut self, req: u64) -> bool {
        let Some(request) = self.requests.get_mut(&req) else {
            return false;
        };
        let mut mid_push = false;
        for (d, part) in request.ranks.iter_mut().enumerate() {
            let Ok(quarantined) = self.consumers[d].driver.engine().abort(&request.id) else {
                continue; // decided already
            };
            self.consumers[d].outcome_given(req);
            let outstanding = quarantined.outstanding();
            self.decisions.aborted += 1;
            mid_push |= part.in_flight > 0
                || match outstanding {
                    Outstanding::Count(n) => n > 0,
                    Outstanding::Edges(mask) => mask != 0,
                };
            if let Some(old) = part.outcome.replace(Outcome::Aborted) {
                self.report.violation(
                    self.report.steps,
                    self.now,
                    format!("request {req} aborted on rank {d} after {old:?}"),
                );
            }
            if self.config.broken == Some(Broken::ReleaseOnAbort) && !part.done {
                // The deliberately broken tracker: blocks go back at the abort.
                self.consumers[d]
                    .pool
                    .free(&part.blocks, req, &mut self.breaches);
                part.done = true;
            }
        }
        mid_push
    }

    pub(super) fn decode_done(&mut self, req: u64, d: usize) {
        if let Some(request) = self.requests.get_mut(&req) {
            let part = &mut request.ranks[d];
            self.consumers[d]
                .pool
                .free(&part.blocks, req, &mut self.breaches);
            part.done = true;
        }
        self.maybe_finish(req);
    }

    /// Acts on the tracker's decisions for decode rank `d`, checking each against what
    /// the simulation knows.
    fn apply(&mut self, d: usize, steps: Vec<(u64, Step)>) {
        for (req, step) in steps {
            let Some(request) = self.requests.get_mut(&req) else {
                self.violation(format!("decision {step:?} for unknown request {req}"));
                continue;
            };
            let incomplete = request.incomplete(d);
            let part = &mut request.ranks[d];
            let mut wrong = None;
            match step {
                Step::Completed => {
                    self.decisions.completed += 1;
                    wrong = set_outcome(part, Outcome::Completed);
                    if let Some(why) = incomplete {
                        wrong = Some(format!("completed but {why}"));
                    }
                    let at = self.now + self.between(DECODE);
                    self.agenda.push(at, Event::DecodeDone { req, d });
                }
                Step::Failed => {
                    self.decisions.failed += 1;
                    wrong = set_outcome(part, Outcome::Failed);
                    part.decided_at = self.now;
                }
                Step::Expired => {
                    self.decisions.expired += 1;
                    wrong = set_outcome(part, Outcome::Expired);
                    self.faults.deadline_expired_in_flight += u64::from(part.in_flight > 0);
                }
                Step::Released { forced } => {
                    if forced {
                        self.decisions.released_forced += 1;
                    } else {
                        self.decisions.released += 1;
                    }
                    if !matches!(
                        part.outcome,
                        Some(Outcome::Failed | Outcome::Aborted | Outcome::Expired)
                    ) || part.released
                    {
                        wrong = Some(format!(
                            "released after {:?} (released before: {})",
                            part.outcome, part.released
                        ));
                    }
                    part.released = true;
                    if part.outcome == Some(Outcome::Failed) {
                        // The cost of settling: blocks held after the request failed.
                        let held = self.now - part.decided_at;
                        self.report.held_after_failed_block_ms += held * part.blocks.len() as u64;
                    }
                    if !part.done {
                        self.consumers[d]
                            .pool
                            .free(&part.blocks, req, &mut self.breaches);
                        part.done = true;
                    }
                }
            }
            if let Some(what) = wrong {
                self.violation(format!("request {req} on rank {d}: {what}"));
            }
            self.maybe_finish(req);
        }
    }

    fn maybe_finish(&mut self, req: u64) {
        if self.requests.get(&req).is_some_and(Request::finished) {
            self.paths.remove(&req);
            if let Some(request) = self.requests.remove(&req) {
                if self.finished_ids.len() == FINISHED_KEPT {
                    self.finished_ids.pop_front();
                }
                self.finished_ids.push_back(request.id);
            }
        }
    }
}
