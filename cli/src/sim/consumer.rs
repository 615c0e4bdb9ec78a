//! One decode rank: the real [`Ledger`] plus its blocks, and the bookkeeping that maps the
//! ledger's keys and tickets back to simulated requests. Every decision comes from the
//! ledger; this file only routes it.

use std::collections::{BTreeMap, BTreeSet};

use kvdrain::{
    AbortError, AgentId, BlockHandle, Config, Decision, Expect, IgnoreReason, Ledger, Millis,
    Noticed, Outstanding, Pending, RegisterErrorKind, Registration, RequestKey,
};

use super::memory::BlockPool;

/// Slots per decode rank's ledger.
pub const SLOTS: usize = 256;
/// Named edges per request (the most any topology of the simulation needs).
pub const EDGES: usize = 64;

/// What the ledger decided about one request on this rank.
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
pub struct Consumer {
    ledger: Box<Ledger<SLOTS, EDGES>>,
    /// Its KV blocks.
    pub pool: BlockPool,
    /// Live registrations: ledger key → request.
    keys: BTreeMap<RequestKey, u64>,
    /// Tickets of requests still counting, for aborts.
    tickets: BTreeMap<u64, Pending>,
    /// `(deadline, request)` of registrations not decided yet.
    undecided: BTreeSet<(Millis, u64)>,
    deadlines: BTreeMap<u64, Millis>,
}

impl Consumer {
    /// A rank with `blocks` KV blocks and a tracker configured by `config`.
    pub fn new(config: Config, blocks: u32) -> Self {
        Consumer {
            ledger: Box::new(Ledger::new(config)),
            pool: BlockPool::new(blocks),
            keys: BTreeMap::new(),
            tickets: BTreeMap::new(),
            undecided: BTreeSet::new(),
            deadlines: BTreeMap::new(),
        }
    }

    /// Requests the ledger tracks.
    pub fn tracked(&self) -> usize {
        self.ledger.len()
    }

    /// Whether a registration would be refused as full.
    pub fn is_full(&self) -> bool {
        self.ledger.is_full()
    }

    /// Registers `req` (id `id`) with the ledger.
    ///
    /// # Errors
    /// The ledger's refusal.
    pub fn register(
        &mut self,
        req: u64,
        id: &str,
        expect: Expect<'_>,
        deadline_ms: Option<u64>,
        default_deadline_ms: u64,
    ) -> Result<(), RegisterErrorKind> {
        let registration = Registration {
            id,
            blocks: BlockHandle(req),
            expect,
            deadline_ms,
        };
        let ticket = self.ledger.register(registration).map_err(|e| e.kind)?;
        let deadline = self.ledger.now() + deadline_ms.unwrap_or(default_deadline_ms);
        self.keys.insert(ticket.key(), req);
        self.tickets.insert(req, ticket);
        self.undecided.insert((deadline, req));
        self.deadlines.insert(req, deadline);
        Ok(())
    }

    /// A notification arrives; decisions it made ready go to `out`.
    ///
    /// # Errors
    /// The ledger's reason for ignoring it.
    pub fn notify(
        &mut self,
        agent: AgentId,
        bytes: &[u8],
        out: &mut Vec<(u64, Step)>,
    ) -> Result<Noticed, IgnoreReason> {
        let result = self
            .ledger
            .handle_notification(agent, bytes)
            .map_err(|e| e.reason);
        if result == Ok(Noticed::Decided) {
            self.poll(out);
        }
        result
    }

    /// Aborts `req`: `Some(outstanding)` if the ledger quarantined it, `None` if it was
    /// decided already (or never registered here).
    pub fn abort(&mut self, req: u64) -> Option<Outstanding> {
        let ticket = self.tickets.remove(&req)?;
        match self.ledger.abort(ticket) {
            Ok(q) => {
                self.decided(req);
                Some(q.outstanding())
            }
            Err(AbortError::Late | AbortError::Unknown) => None,
        }
    }

    /// The transport fenced `agent`; returns the edges resolved.
    pub fn fence(&mut self, agent: AgentId, out: &mut Vec<(u64, Step)>) -> u32 {
        let n = self.ledger.fence(agent);
        self.poll(out);
        n
    }

    /// Advances the ledger's clock to `now` and takes every decision due.
    pub fn advance(&mut self, now: Millis, out: &mut Vec<(u64, Step)>) {
        if self.ledger.advance(now).is_err() {
            unreachable!("the virtual clock never goes back");
        }
        self.poll(out);
    }

    /// Takes every decision waiting (those `fence` or `advance` took, then those the
    /// ingest side made ready).
    pub fn poll(&mut self, out: &mut Vec<(u64, Step)>) {
        let decisions = self.ledger.decisions().collect();
        self.route(decisions, out);
    }

    /// The earliest registration whose deadline is at or before `now` and that has no
    /// outcome yet (spec rule 2 says there is none after an advance to `now`).
    pub fn overdue(&self, now: Millis) -> Option<u64> {
        self.undecided
            .first()
            .filter(|&&(deadline, _)| deadline <= now)
            .map(|&(_, req)| req)
    }

    fn decided(&mut self, req: u64) {
        self.tickets.remove(&req);
        if let Some(deadline) = self.deadlines.remove(&req) {
            self.undecided.remove(&(deadline, req));
        }
    }

    fn route(&mut self, decisions: Vec<Decision>, out: &mut Vec<(u64, Step)>) {
        for d in decisions {
            let key = d.key();
            let Some(&req) = self.keys.get(&key) else {
                unreachable!("the ledger decided about a key it never issued");
            };
            let step = match d {
                Decision::Completed(done) => {
                    let BlockHandle(blocks) = done.into_decode();
                    debug_assert_eq!(blocks, req);
                    self.keys.remove(&key);
                    Step::Completed
                }
                Decision::Failed(_) => Step::Failed,
                Decision::Expired(_) => Step::Expired,
                Decision::Released(r) => {
                    let forced = r.forced();
                    let BlockHandle(blocks) = r.into_free();
                    debug_assert_eq!(blocks, req);
                    self.keys.remove(&key);
                    Step::Released { forced }
                }
            };
            if !matches!(step, Step::Released { .. }) {
                self.decided(req);
            }
            out.push((req, step));
        }
    }
}
