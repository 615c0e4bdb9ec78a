//! `ledger_ops`: an `Arbitrary` sequence of operations applied to the real [`Ledger`] and
//! to the reference [`Model`]; any difference in an outcome is a crash, and the spec's
//! rules are checked after every step.
//!
//! Ids come from a small alphabet (so operations collide on the same requests) that
//! includes ids with `:`; notification bytes are either built from the alphabet (valid,
//! with edge-case TP sizes) or raw fuzzer bytes. Times are small so deadlines and
//! quarantines fire within a run.
//!
//! `Defer` switches between a caller that pulls after every `advance`, `fence` and `gone` (the
//! replay model) and one that pulls late: the model's decisions then wait in the harness
//! until the next pull, which must hand out the same decisions in the same order, and a
//! registration may be refused as full only where the slots held by those decisions
//! leave none free.
//!
//! Every registration refused as full is held (`hold_refused`), as one rank of several
//! would: each pull first takes the holds the clock ended, which must come in number
//! order, none before its quarantine, and none over but kept; at the end none is left.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};

use crate::model::{
    MAbortError, MConfig, MDecision, MExpect, MIgnore, MNoticed, MOutstanding, MReject, Model,
};
use crate::spec_parse::{SpecMessage, spec_parse};
use kvdrain::{
    AbortError, AgentId, BlockHandle, Config, Decision, Duration, Expect, IgnoreReason, Instant,
    Ledger, Noticed, Outstanding, Pending, Quarantined, RefusedHold, RegisterErrorKind,
    Registration, RequestKey,
};

/// Slots of the fuzzed ledger (small, so full tables are easy to reach).
const N: usize = 16;
/// Named edges per request.
const E: usize = 4;
/// Agents `0..AGENTS`; more than `E`, so edge lists can be too long.
const AGENTS: u8 = 6;

/// Request ids the operations pick from (`a:b` and `x:1:2` test the last-`:` rule).
const IDS: [&str; 10] = [
    "r0",
    "r1",
    "r2",
    "r3",
    "a:b",
    "x:1:2",
    "cmpl-0",
    "cmpl-1",
    "PUSH_FAIL",
    "\u{fc}",
];

#[derive(Arbitrary, Debug)]
struct Setup {
    capacity: u8,
    deadline_ms: u8,
    quarantine_ms: u8,
    settle_ms: u8,
}

#[derive(Arbitrary, Debug)]
enum Message {
    Completion { id: u8, tp: u16 },
    Failure { id: u8, tp: u16 },
    Heartbeat,
    Registration(Vec<u8>),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Op {
    RegisterCount {
        id: u8,
        count: u8,
        deadline_ms: Option<u8>,
    },
    RegisterEdges {
        id: u8,
        agents: Vec<u8>,
        deadline_ms: Option<u8>,
    },
    Notify {
        agent: u8,
        message: Message,
    },
    AbortId {
        id: u8,
    },
    AbortTicket {
        nth: u8,
    },
    Fence {
        agent: u8,
    },
    /// The agent was seen gone (rule 9): its edges fail and settle.
    Gone {
        agent: u8,
    },
    Tick {
        ms: u8,
    },
    /// An absolute time, possibly in the past (must be refused).
    AdvanceTo {
        ms: u16,
    },
    /// Every decision through the `decisions` iterator.
    Poll,
    /// `poll_decision` until it returns `None`.
    Pull,
    /// From now on, pull late (or again after every event): `advance`, `fence` and `gone` leave
    /// their decisions queued until a `Poll`, `Pull`, or an `advance`, `fence` or `gone` after
    /// the next `Defer`.
    Defer,
}

fn id(i: u8) -> &'static str {
    IDS[usize::from(i) % IDS.len()]
}

/// Mostly small counts, sometimes the edges of `1..=64`.
fn count(c: u8) -> u8 {
    match c {
        250 => 0,
        251 => 64,
        252 => 65,
        253 => 255,
        254 => 63,
        _ => c % 3 + 1,
    }
}

fn tp(t: u16) -> u16 {
    // 0 is malformed; keep a few large sizes.
    if t >= 0xFFF0 { t } else { t % 9 }
}

impl Message {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Message::Completion { id: i, tp: t } | Message::Failure { id: i, tp: t } => {
                let body = format!("{}:{}", id(*i), tp(*t));
                match self {
                    Message::Failure { .. } => format!("PUSH_FAIL:{body}").into_bytes(),
                    _ => body.into_bytes(),
                }
            }
            Message::Heartbeat => b"HB:r0,r1".to_vec(),
            Message::Registration(payload) => [b"PUSH_REG:".as_slice(), payload].concat(),
            Message::Raw(bytes) => bytes.clone(),
        }
    }
}

/// Runs one fuzz input.
pub fn ledger_ops(data: &[u8]) {
    alphabet_fits_tombstones();
    let mut u = Unstructured::new(data);
    let Ok(setup) = Setup::arbitrary(&mut u) else {
        return;
    };
    let Ok(ops) = Vec::<Op>::arbitrary(&mut u) else {
        return;
    };
    // `KVDRAIN_FUZZ_TRACE=1 cargo fuzz run ledger_ops ARTIFACT` prints the operations.
    if std::env::var_os("KVDRAIN_FUZZ_TRACE").is_some() {
        std::eprintln!("{setup:?}");
        for (step, op) in ops.iter().enumerate() {
            std::eprintln!("{step}: {op:?}");
        }
    }
    let mut h = Harness::new(&setup);
    for (step, op) in ops.iter().take(512).enumerate() {
        h.apply(op);
        h.check_rules(step, op);
    }
    // Run every clock out: each request ends and every slot comes back.
    let end = h.model.now() + 2 * 256 + 1;
    h.advance(end);
    h.poll();
    assert_eq!(h.ledger.len(), 0, "requests left after every timer ran out");
    assert_eq!(
        h.ledger.refused_holds(),
        0,
        "holds left after every timer ran out"
    );
    h.check_rules(usize::MAX, &Op::Poll);
}

/// Exactness of `late` vs `unknown` needs every alphabet id to fit in the tombstone table
/// at once (the model remembers decided ids forever). Checked once, black-box.
fn alphabet_fits_tombstones() {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        let mut ledger: Ledger<N, E> = Ledger::new(config(N, 10, 0, 0));
        for (i, id) in IDS.iter().enumerate() {
            let registration = Registration {
                id,
                blocks: BlockHandle(i as u64),
                expect: Expect::Count(1),
                deadline: None,
            };
            let _ticket = ledger.register(registration).expect("room");
            let _quarantined = ledger.abort_id(id).expect("tracked");
            ledger.advance(Instant::ZERO).expect("clock");
            for _released in ledger.decisions() {}
        }
        assert!(ledger.is_empty());
        for id in IDS {
            assert_eq!(
                ledger.abort_id(id),
                Err(AbortError::Late),
                "fuzz alphabet does not fit the tombstone table: pick other ids"
            );
        }
    });
}

fn config(capacity: usize, deadline_ms: u64, quarantine_ms: u64, settle_ms: u64) -> Config {
    Config {
        capacity,
        deadline: Duration::from_millis(deadline_ms),
        quarantine: Duration::from_millis(quarantine_ms),
        settle: Duration::from_millis(settle_ms),
        ..Config::with_capacity(capacity)
    }
}

/// What the spec lets an observer of the real ledger's outputs know about a request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Terminal {
    Completed,
    Failed,
    Aborted,
    Expired,
}

#[derive(Debug)]
struct Seen {
    deadline: u64,
    blocks: u64,
    /// The outcome and when it was taken.
    terminal: Option<(Terminal, u64)>,
    /// `Some(forced)` once released.
    released: Option<bool>,
    /// When the last failure notice that resolved one of its edges came (rule 8).
    last_failure_notice: Option<u64>,
}

struct Harness {
    ledger: Ledger<N, E>,
    model: Model,
    tickets: Vec<Option<Pending>>,
    seen: BTreeMap<u64, Seen>,
    deadline_ms: u64,
    quarantine_ms: u64,
    settle_ms: u64,
    notices_counted: u64,
    notices_failed: u64,
    last_edges: u64,
    /// Edges the real ledger said its fences and gones resolved (checked against the
    /// model per call, and against the counters here).
    fenced_edges: u64,
    gone_edges: u64,
    /// Pulling late: `advance`, `fence` and `gone` leave their decisions queued.
    defer: bool,
    /// The model's decisions taken and not pulled from the real ledger yet, in order.
    deferred: Vec<MDecision>,
    /// Every registration refused as full is held (`hold_refused`, as a rank of several
    /// would): per hold number, the clock it was taken at and the end it was told.
    holds: Vec<(u64, u64)>,
    /// Holds whose end the real ledger handed out.
    holds_out: usize,
}

/// The model's key for a real one. The model numbers registrations 0, 1, 2, …; the core's
/// keys carry that sequence above the request's slot (its low 16 bits, `N <= 65 536`), so
/// that `Engine::record` finds a request by key.
fn model_key(key: RequestKey) -> u64 {
    key.get() >> 16
}

fn real_outstanding(o: Outstanding) -> MOutstanding {
    match o {
        Outstanding::Count(n) => MOutstanding::Count(n),
        Outstanding::Edges(mask) => MOutstanding::Edges(mask),
    }
}

fn real_decision(d: Decision) -> MDecision {
    match d {
        Decision::Completed(done) => {
            let key = model_key(done.key());
            MDecision::Completed {
                key,
                blocks: done.into_decode().0,
            }
        }
        Decision::Failed(f) => MDecision::Failed {
            key: model_key(f.key()),
        },
        Decision::Expired(q) => MDecision::Expired {
            key: model_key(q.key()),
            outstanding: real_outstanding(q.outstanding()),
        },
        Decision::Released(r) => {
            let (key, forced) = (model_key(r.key()), r.forced());
            MDecision::Released {
                key,
                blocks: r.into_free().0,
                forced,
            }
        }
    }
}

fn real_ignore(reason: IgnoreReason) -> MIgnore {
    match reason {
        IgnoreReason::Malformed(_) => MIgnore::Malformed,
        IgnoreReason::NotForConsumer => MIgnore::NotForConsumer,
        IgnoreReason::Unknown => MIgnore::Unknown,
        IgnoreReason::Late => MIgnore::Late,
        IgnoreReason::Duplicate => MIgnore::Duplicate,
        IgnoreReason::UnexpectedSender => MIgnore::UnexpectedSender,
    }
}

impl Harness {
    fn new(setup: &Setup) -> Self {
        let capacity = usize::from(setup.capacity % (N as u8 + 2));
        let deadline_ms = u64::from(setup.deadline_ms % 64);
        let quarantine_ms = u64::from(setup.quarantine_ms % 64);
        // 0 (vLLM's behaviour) a quarter of the time.
        let settle_ms = u64::from(setup.settle_ms % 64).saturating_sub(16);
        Harness {
            ledger: Ledger::new(config(capacity, deadline_ms, quarantine_ms, settle_ms)),
            model: Model::new(MConfig {
                capacity: capacity.min(N),
                deadline_ms,
                quarantine_ms,
                settle_ms,
                max_edges: E,
            }),
            tickets: Vec::new(),
            seen: BTreeMap::new(),
            deadline_ms,
            quarantine_ms,
            settle_ms,
            notices_counted: 0,
            notices_failed: 0,
            last_edges: 0,
            fenced_edges: 0,
            gone_edges: 0,
            defer: false,
            deferred: Vec::new(),
            holds: Vec::new(),
            holds_out: 0,
        }
    }

    /// Slots the real ledger holds for decided requests whose last decision (`Completed`
    /// or `Released`) waits to be pulled.
    fn slots_held(&self) -> usize {
        self.deferred
            .iter()
            .filter(|d| matches!(d, MDecision::Completed { .. } | MDecision::Released { .. }))
            .count()
    }

    /// Whether the real ledger has no free slot although the model has room: only
    /// decisions not pulled yet can do that.
    fn starved(&self) -> bool {
        self.model.len() < self.model.capacity() && N - self.model.len() == self.slots_held()
    }

    /// `advance`, `fence` or `gone` took `model`: pull them now (with any left from pulling late),
    /// or leave them queued while pulling late. The rules are checked on them now, when
    /// they were taken.
    fn taken(&mut self, model: Vec<MDecision>, what: &str) {
        if self.defer {
            self.deferred.extend(model.iter().cloned());
        } else {
            let mut expected = core::mem::take(&mut self.deferred);
            expected.extend(model.iter().cloned());
            let real = self.pull_queued();
            assert_eq!(real, expected, "{what}: decisions");
        }
        self.observe(&model);
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::RegisterCount {
                id: i,
                count: c,
                deadline_ms,
            } => self.register(id(*i), MExpect::Count(count(*c)), *deadline_ms),
            Op::RegisterEdges {
                id: i,
                agents,
                deadline_ms,
            } => {
                let agents = agents.iter().map(|a| u16::from(a % AGENTS)).collect();
                self.register(id(*i), MExpect::Edges(agents), *deadline_ms);
            }
            Op::Notify { agent, message } => self.notify(u16::from(agent % AGENTS), message),
            Op::AbortId { id: i } => {
                let real = self.ledger.abort_id(id(*i));
                let model = self.model.abort_id(id(*i));
                self.compare_abort(real, model);
            }
            Op::AbortTicket { nth } => {
                if self.tickets.is_empty() {
                    return;
                }
                let at = usize::from(*nth) % self.tickets.len();
                let Some(ticket) = self.tickets[at].take() else {
                    return;
                };
                let key = model_key(ticket.key());
                let real = self.ledger.abort(ticket);
                let model = self.model.abort_key(key);
                self.compare_abort(real, model);
            }
            Op::Fence { agent } => {
                let agent = u16::from(agent % AGENTS);
                let resolved = self.ledger.fence(AgentId(agent));
                let (model_resolved, model) = self.model.fence(agent);
                assert_eq!(resolved, model_resolved, "fence {agent}: edges resolved");
                self.fenced_edges += u64::from(resolved);
                self.taken(model, &format!("fence {agent}"));
            }
            Op::Gone { agent } => {
                let agent = u16::from(agent % AGENTS);
                // Rule 8 from the gone: each request it resolves an edge of settles as
                // from a failure notice now.
                let now = self.model.now();
                for key in self.model.owing(agent) {
                    if let Some(seen) = self.seen.get_mut(&key) {
                        seen.last_failure_notice = Some(now);
                    }
                }
                let resolved = self.ledger.gone(AgentId(agent));
                let (model_resolved, model) = self.model.gone(agent);
                assert_eq!(resolved, model_resolved, "gone {agent}: edges resolved");
                self.gone_edges += u64::from(resolved);
                self.taken(model, &format!("gone {agent}"));
            }
            Op::Tick { ms } => self.advance(self.model.now() + u64::from(ms % 32)),
            Op::AdvanceTo { ms } => self.advance(u64::from(*ms % 1024)),
            Op::Poll => self.poll(),
            Op::Pull => self.pull(),
            Op::Defer => self.defer = !self.defer,
        }
    }

    fn register(&mut self, id: &str, expect: MExpect, deadline_ms: Option<u8>) {
        let deadline_ms = deadline_ms.map(|d| u64::from(d % 64));
        let blocks = 1000 + self.tickets.len() as u64 + self.seen.len() as u64 * 7;
        let agents: Vec<AgentId> = match &expect {
            MExpect::Edges(agents) => agents.iter().map(|&a| AgentId(a)).collect(),
            MExpect::Count(_) => Vec::new(),
        };
        let real_expect = match &expect {
            MExpect::Count(n) => Expect::Count(*n),
            MExpect::Edges(_) => Expect::Edges(&agents),
        };
        let registration = Registration {
            id,
            blocks: BlockHandle(blocks),
            expect: real_expect,
            deadline: deadline_ms.map(Duration::from_millis),
        };
        let starved = self.starved();
        let real = self.ledger.register(registration);
        if starved && matches!(&real, Err(e) if e.kind == RegisterErrorKind::Full) {
            // Decided requests hold every slot until their decisions are pulled; the model
            // frees slots with the decision. Documented for callers that pull late.
            return;
        }
        let model = self.model.register(id, blocks, &expect, deadline_ms);
        match (real, model) {
            (Ok(ticket), Ok(key)) => {
                assert_eq!(model_key(ticket.key()), key, "register {id}: key");
                let deadline = deadline_ms.unwrap_or(self.deadline_ms);
                self.seen.insert(
                    key,
                    Seen {
                        deadline: self.model.now().saturating_add(deadline),
                        blocks,
                        terminal: None,
                        released: None,
                        last_failure_notice: None,
                    },
                );
                self.tickets.push(Some(ticket));
            }
            (Err(e), Err(m)) => {
                let kind = match m {
                    MReject::BadCount => RegisterErrorKind::BadCount,
                    MReject::BadEdges => RegisterErrorKind::BadEdges,
                    MReject::DuplicateId => RegisterErrorKind::DuplicateId,
                    MReject::Full => RegisterErrorKind::Full,
                };
                assert_eq!(e.kind, kind, "register {id}: refusal");
                assert_eq!(
                    e.registration.id, id,
                    "a refused registration comes back whole"
                );
                assert_eq!(e.registration.blocks, BlockHandle(blocks));
                if e.kind == RegisterErrorKind::Full {
                    self.hold_refused();
                }
            }
            (real, model) => panic!("register {id}: real {real:?}, model {model:?}"),
        }
    }

    fn notify(&mut self, agent: u16, message: &Message) {
        let bytes = message.bytes();
        let len_before = self.ledger.len();
        // The request a failure notice would resolve an edge of, by the spec's parser.
        let failing = match spec_parse(&bytes) {
            SpecMessage::Notice {
                id, failed: true, ..
            } => self.model.key_of(&id),
            _ => None,
        };
        let real = self
            .ledger
            .handle_notification(AgentId(agent), &bytes)
            .map_err(|e| (real_ignore(e.reason), e.request_id.map(String::from)));
        let model = self.model.notify(agent, &bytes);
        let real = real.map(|n| match n {
            Noticed::Counted => MNoticed::Counted,
            Noticed::Decided => MNoticed::Decided,
        });
        assert_eq!(real, model, "notify from {agent}: {bytes:?}");
        match real {
            Ok(n) => {
                if bytes.starts_with(b"PUSH_FAIL:") {
                    self.notices_failed += 1;
                    let key = failing.expect("an accepted failure notice names a tracked request");
                    let now = self.model.now();
                    self.seen
                        .get_mut(&key)
                        .expect("registered")
                        .last_failure_notice = Some(now);
                } else {
                    self.notices_counted += 1;
                }
                self.last_edges += u64::from(n == MNoticed::Decided);
            }
            // Rule 4/5: an ignored notice changes nothing.
            Err(_) => assert_eq!(
                self.ledger.len(),
                len_before,
                "an ignored notice made state"
            ),
        }
    }

    fn compare_abort(
        &mut self,
        real: Result<Quarantined, AbortError>,
        model: Result<(u64, MOutstanding), MAbortError>,
    ) {
        match (real, model) {
            (Ok(q), Ok((key, outstanding))) => {
                assert_eq!(model_key(q.key()), key, "abort: key");
                assert_eq!(
                    real_outstanding(q.outstanding()),
                    outstanding,
                    "abort {key}"
                );
                self.terminal(key, Terminal::Aborted);
            }
            (Err(AbortError::Unknown), Err(MAbortError::Unknown))
            | (Err(AbortError::Late), Err(MAbortError::Late)) => {}
            (real, model) => panic!("abort: real {real:?}, model {model:?}"),
        }
    }

    /// The decisions `advance`, `fence` or `gone` queued, and not those of the ready ring (the
    /// model hands those out at its `poll`).
    fn pull_queued(&mut self) -> Vec<MDecision> {
        self.ledger.drain_queued().map(real_decision).collect()
    }

    fn advance(&mut self, now: u64) {
        let queued = self.ledger.queued_decisions();
        let result = self.ledger.advance(Instant::from_millis(now));
        match (result, self.model.advance(now)) {
            (Ok(()), Ok(model)) => self.taken(model, &format!("advance to {now}")),
            (Err(_), Err(())) => {
                assert_eq!(
                    self.ledger.queued_decisions(),
                    queued,
                    "a refused advance decided"
                );
                return;
            }
            (real, model) => panic!("advance to {now}: real {real:?}, model {model:?}"),
        }
        assert_eq!(self.ledger.now().millis(), now, "clock");
        // Rule 2: by the first advance reaching its deadline every request has its outcome
        // (or waits in the ready queue, its decision taken).
        for (&key, seen) in &self.seen {
            if seen.terminal.is_none() && seen.deadline <= now {
                assert!(self.model.is_ready(key), "{key} missed its deadline");
            }
        }
    }

    /// Holds the refused registration's blocks: the end is the quarantine from the clock,
    /// rounded up to less than a granule more.
    fn hold_refused(&mut self) {
        let now = self.model.now();
        let hold = self.ledger.hold_refused();
        assert_eq!(hold.number, self.holds.len() as u64, "hold number");
        let end = now + self.quarantine_ms;
        let granule = RefusedHold::granule(Duration::from_millis(self.quarantine_ms)).millis();
        let until = hold.until.millis();
        assert!(
            end <= until && until < end + granule,
            "hold until {until}, end {end}"
        );
        self.holds.push((now, until));
    }

    /// The refused holds the clock ended: in number order, none before its quarantine.
    fn pull_holds(&mut self) {
        let now = self.model.now();
        while let Some(out) = self.ledger.poll_refused_release() {
            assert_eq!(out.number, self.holds_out as u64, "hold out of order");
            let (taken_at, until) = self.holds[self.holds_out];
            assert!(now >= taken_at + self.quarantine_ms, "hold released early");
            assert!(out.until.millis() <= now && out.until.millis() >= until.min(now));
            self.holds_out += 1;
        }
        // What is still held is not over.
        if let Some(&(_, until)) = self.holds.get(self.holds_out) {
            assert!(until > now, "hold over at {now} but not handed out");
        }
    }

    fn poll(&mut self) {
        self.pull_holds();
        let real: Vec<MDecision> = self.ledger.decisions().map(real_decision).collect();
        let model = self.model.poll();
        let mut expected = core::mem::take(&mut self.deferred);
        expected.extend(model.iter().cloned());
        assert_eq!(real, expected, "poll");
        assert_eq!(self.ledger.queued_decisions(), 0, "poll: decisions left");
        self.observe(&model);
    }

    fn pull(&mut self) {
        self.pull_holds();
        let mut real = Vec::new();
        while let Some(d) = self.ledger.poll_decision() {
            real.push(real_decision(d));
        }
        let model = self.model.poll();
        let mut expected = core::mem::take(&mut self.deferred);
        expected.extend(model.iter().cloned());
        assert_eq!(real, expected, "poll_decision");
        self.observe(&model);
    }

    fn terminal(&mut self, key: u64, t: Terminal) {
        let now = self.model.now();
        let seen = self
            .seen
            .get_mut(&key)
            .expect("decision for a registered key");
        // Rule 2: exactly one of completed, failed, aborted, expired.
        assert_eq!(seen.terminal, None, "{key}: second outcome {t:?}");
        seen.terminal = Some((t, now));
    }

    /// Checks a batch of decisions against the spec's rules, in emission order.
    fn observe(&mut self, decisions: &[MDecision]) {
        for (i, d) in decisions.iter().enumerate() {
            match *d {
                MDecision::Completed { key, blocks } => {
                    self.terminal(key, Terminal::Completed);
                    assert_eq!(self.seen[&key].blocks, blocks, "{key}: blocks");
                }
                MDecision::Failed { key } => {
                    self.terminal(key, Terminal::Failed);
                    // `released` follows at once, unless a failure notice has not settled
                    // yet (rule 8): then the request holds its slot until it has.
                    let released = MDecision::Released {
                        key,
                        blocks: self.seen[&key].blocks,
                        forced: false,
                    };
                    let now = self.model.now();
                    let settles = self.seen[&key]
                        .last_failure_notice
                        .is_some_and(|t| t.saturating_add(self.settle_ms) > now);
                    if settles {
                        assert!(self.model.is_settling(key), "{key}: failed, not settling");
                    } else {
                        assert_eq!(
                            decisions.get(i + 1),
                            Some(&released),
                            "{key}: failed, then?"
                        );
                    }
                }
                MDecision::Expired { key, .. } => self.terminal(key, Terminal::Expired),
                MDecision::Released {
                    key,
                    blocks,
                    forced,
                } => {
                    let now = self.model.now();
                    let quarantine_ms = self.quarantine_ms;
                    let seen = self
                        .seen
                        .get_mut(&key)
                        .expect("release of a registered key");
                    assert_eq!(seen.blocks, blocks, "{key}: blocks");
                    assert_eq!(seen.released, None, "{key}: released twice");
                    seen.released = Some(forced);
                    let Some((t, since)) = seen.terminal else {
                        panic!("{key}: released before any outcome");
                    };
                    // Rule 8: an unforced release comes only after every failure notice
                    // has settled.
                    if let (false, Some(noticed)) = (forced, seen.last_failure_notice) {
                        assert!(
                            noticed.saturating_add(self.settle_ms) <= now,
                            "{key}: released before its failure notice at {noticed} settled"
                        );
                    }
                    assert_ne!(t, Terminal::Completed, "{key}: released after completed");
                    if forced {
                        // Rule 1: forced only when the quarantine ran out.
                        assert!(
                            matches!(t, Terminal::Aborted | Terminal::Expired),
                            "{key}: forced release of a {t:?} request"
                        );
                        // After the deadline (expired) or the abort.
                        let start = match t {
                            Terminal::Expired => seen.deadline,
                            _ => since,
                        };
                        assert!(
                            start.saturating_add(quarantine_ms) <= now,
                            "{key}: forced release before the quarantine ran out"
                        );
                    }
                }
            }
        }
    }

    /// The spec's rules that must hold between any two operations.
    fn check_rules(&mut self, step: usize, op: &Op) {
        let now = self.model.now();
        let ctx = || format!("after step {step} ({op:?}) at {now}");
        // Rule 7 and the capacity contract.
        assert_eq!(self.ledger.len(), self.model.len(), "tracked {}", ctx());
        assert!(
            self.ledger.len() <= self.model.capacity(),
            "over capacity {}",
            ctx()
        );
        // Pulling late, slots held by decisions not pulled yet count as taken.
        assert_eq!(
            self.ledger.is_full(),
            self.ledger.len() >= self.model.capacity()
                || N - self.ledger.len() == self.slots_held(),
            "is_full {}",
            ctx()
        );
        assert_eq!(
            self.ledger.queued_decisions(),
            self.deferred.len(),
            "decisions queued {}",
            ctx()
        );
        for (&key, seen) in &self.seen {
            // Rule 1: blocks that did not come back are still fenced by a tracked request.
            let holds_blocks = match seen.terminal {
                Some((Terminal::Completed, _)) => false,
                Some(_) => seen.released.is_none(),
                None => true,
            };
            assert_eq!(
                holds_blocks,
                self.model.is_tracked(key),
                "{key}: blocks held vs tracked {}",
                ctx()
            );
        }
        // The wake-up hint is never later than the next timer that matters.
        if let Some(due) = self.model.next_due() {
            let hint = self.ledger.next_timer().map(Instant::millis);
            assert!(
                hint.is_some_and(|t| t <= due),
                "next_timer {hint:?} later than {due} {}",
                ctx()
            );
        }
        // Refused holds: what the ledger holds is what was not handed out, and the
        // wake-up hint is never later than the next end.
        let held = self.holds.len() - self.holds_out;
        assert_eq!(self.ledger.refused_holds(), held as u64, "holds {}", ctx());
        if let Some(&(_, until)) = self.holds.get(self.holds_out) {
            let hint = self.ledger.next_timer().map(Instant::millis);
            assert!(
                hint.is_some_and(|t| t <= until),
                "next_timer {hint:?} {}",
                ctx()
            );
        }
        self.check_counters(&ctx());
    }

    fn check_counters(&self, ctx: &str) {
        let c = self.ledger.counters();
        assert_eq!(c.ingest.ready_overflow, 0, "ready ring overflow {ctx}");
        assert_eq!(
            c.ingest.completions, self.notices_counted,
            "completions {ctx}"
        );
        assert_eq!(
            c.ingest.failure_notices, self.notices_failed,
            "failures {ctx}"
        );
        assert_eq!(c.ingest.last_edges, self.last_edges, "last edges {ctx}");
        let mut completed = 0;
        let mut failed = 0;
        let mut aborted = 0;
        let mut expired = 0;
        let mut released = 0;
        let mut forced = 0;
        for seen in self.seen.values() {
            match seen.released {
                Some(true) => forced += 1,
                Some(false) => released += 1,
                None => {}
            }
            match seen.terminal {
                Some((Terminal::Completed, _)) => completed += 1,
                Some((Terminal::Failed, _)) => failed += 1,
                Some((Terminal::Aborted, _)) => aborted += 1,
                Some((Terminal::Expired, _)) => expired += 1,
                None => {}
            }
        }
        let e = c.engine;
        assert_eq!(e.registered, self.seen.len() as u64, "registered {ctx}");
        assert_eq!(e.completed, completed, "completed {ctx}");
        assert_eq!(e.failed, failed, "failed {ctx}");
        assert_eq!(e.aborted, aborted, "aborted {ctx}");
        assert_eq!(e.expired, expired, "expired {ctx}");
        assert_eq!(e.released, released, "released {ctx}");
        assert_eq!(e.released_forced, forced, "forced releases {ctx}");
        assert_eq!(e.settling, self.model.settling() as u64, "settling {ctx}");
        assert_eq!(e.fenced_edges, self.fenced_edges, "fenced edges {ctx}");
        assert_eq!(e.gone_edges, self.gone_edges, "gone edges {ctx}");
        assert!(
            e.settle_released <= e.settle_started
                && e.settle_started <= e.failed + e.aborted + e.expired,
            "settle counters {ctx}"
        );
    }
}
