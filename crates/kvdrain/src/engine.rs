//! The engine half: registration, abort, fence and gone, clock and decisions. Owns every table
//! the ingest thread only reads.

use crate::counters::EngineCounters;
use crate::decided::Kind;
use crate::error::{AbortError, ClockError, RegisterError, RegisterErrorKind};
use crate::fingerprint::Fingerprint;
use crate::index::{DELETED, EMPTY, Index};
use crate::owner::{History, HistoryFlags, Owner, Request};
use crate::record::{Ended, Record, RecordedEdges};
use crate::shared::Shared;
use crate::slot::EdgeClaim;
use crate::stamp;
use crate::state_word::{ForceFree, Phase, Quarantine, Resolution, Resolved, Snapshot};
use crate::sync::Ordering;
use crate::ticket::{
    AgentId, BlockHandle, Decision, Drained, Expect, Failed, Outstanding, Pending, QuarantineCause,
    Quarantined, Registration, Released, RequestKey,
};
use crate::time::Instant;

/// Where an id is in the index, as the owner sees it.
enum Probe {
    /// Tracked in this slot.
    Tracked(u32),
    /// Not tracked; this bucket is free for it.
    Vacant(usize),
}

/// The engine half of a [`Ledger`](crate::Ledger): registration, abort, fence and gone,
/// clock and decisions. One per ledger, on the scheduler thread.
#[derive(Debug)]
pub struct Engine<'l, const N: usize, const E: usize> {
    shared: &'l Shared<N, E>,
    owner: &'l mut Owner<N>,
}

fn valid_expect<const E: usize>(expect: &Expect<'_>) -> Result<(), RegisterErrorKind> {
    match *expect {
        Expect::Count(n) if (1..=crate::MAX_EDGES).contains(&usize::from(n)) => Ok(()),
        Expect::Count(_) => Err(RegisterErrorKind::BadCount),
        Expect::Edges(agents) => {
            let distinct = agents
                .iter()
                .enumerate()
                .all(|(i, a)| !agents[..i].contains(a));
            let named = !agents.contains(&AgentId::STRANGER);
            if agents.is_empty() || agents.len() > E || !distinct || !named {
                Err(RegisterErrorKind::BadEdges)
            } else {
                Ok(())
            }
        }
    }
}

impl<'l, const N: usize, const E: usize> Engine<'l, N, E> {
    pub(crate) fn new(shared: &'l Shared<N, E>, owner: &'l mut Owner<N>) -> Self {
        Engine { shared, owner }
    }

    /// Starts tracking a request: it now waits for its edges until its deadline.
    ///
    /// # Errors
    /// The registration comes back unchanged inside [`RegisterError`] when the id is
    /// tracked already (`DuplicateId`), the table holds `capacity` requests (`Full`:
    /// nothing else changes, no request is evicted), or the expectation is invalid.
    // Always inlined: out of line, a registration paid ~55 instructions for the call (six
    // callee-saved registers, the result written through memory and matched again by the
    // caller), a quarter of its cost. The refusals are a cold call.
    #[inline(always)]
    pub fn register<'r>(
        &mut self,
        registration: Registration<'r>,
    ) -> Result<Pending, RegisterError<'r>> {
        if let Err(kind) = valid_expect::<E>(&registration.expect) {
            return Err(self.refuse(kind, registration));
        }
        let fp = self.shared.fingerprint(registration.id);
        let vacancy = match self.probe(fp) {
            Probe::Tracked(_) => {
                return Err(self.refuse(RegisterErrorKind::DuplicateId, registration));
            }
            Probe::Vacant(pos) => pos,
        };
        if self.owner.live >= self.owner.config.capacity || self.owner.free_len == 0 {
            return Err(self.refuse(RegisterErrorKind::Full, registration));
        }
        self.owner.free_len -= 1;
        let slot = self.owner.free[self.owner.free_len];
        let shared = &self.shared.slots[slot as usize];
        let generation = shared.state.load(Ordering::Relaxed).generation();
        let (agents, outstanding): (&[AgentId], u32) = match registration.expect {
            Expect::Count(n) => (&[], u32::from(n)),
            Expect::Edges(agents) => (agents, agents.len() as u32),
        };
        shared.write(fp, generation, agents);
        shared.state.publish(generation, outstanding);
        self.shared.index.insert_at(vacancy, fp, slot);
        let bucket = vacancy as u32;
        // The slot in the low 16 bits (`N <= 65 536`), so that `record` finds it; the
        // sequence above keeps keys unique and in registration order.
        let key = (self.owner.next_key << 16) | u64::from(slot);
        self.owner.next_key += 1;
        let deadline = self.owner.now + registration.deadline.unwrap_or(self.owner.config.deadline);
        self.owner.requests[slot as usize] = Request {
            key,
            blocks: registration.blocks.0,
            due: deadline,
            fp,
            generation,
            bucket,
            gone_at: 0,
            registered_at: stamp::of(self.owner.now),
            deadline: stamp::of(deadline),
            expected: outstanding as u8,
            live: true,
            settling: false,
            has_history: false,
        };
        if registration.deadline.is_none() {
            // `now + Config::deadline` never decreases: the O(1) FIFO timer.
            self.owner.timers.push_back(slot, deadline, key);
        } else {
            self.owner.timers.set(slot, deadline, key);
        }
        self.owner.live += 1;
        self.owner.counters.registered += 1;
        Ok(Pending {
            key: RequestKey(key),
            slot,
        })
    }

    /// Counts a refused registration and hands it back.
    #[inline]
    fn refuse<'r>(
        &mut self,
        kind: RegisterErrorKind,
        registration: Registration<'r>,
    ) -> RegisterError<'r> {
        let c = &mut self.owner.counters;
        match kind {
            RegisterErrorKind::DuplicateId => c.rejected_duplicate_id += 1,
            RegisterErrorKind::Full => c.rejected_full += 1,
            RegisterErrorKind::BadCount | RegisterErrorKind::BadEdges => {
                c.rejected_invalid += 1;
            }
        }
        RegisterError { kind, registration }
    }

    /// Aborts the request of `ticket`: it is over for the client now; its blocks stay
    /// fenced until every edge resolves (a `Released` that a notice, a
    /// [`fence`](Self::fence) or a [`gone`](Self::gone) decides, once it settled) or [`Config::quarantine`](crate::Config::quarantine) runs out (a forced `Released`
    /// that [`advance`](Self::advance) decides); [`poll_decision`](Self::poll_decision)
    /// hands it out.
    ///
    /// # Errors
    /// [`AbortError::Late`] if the request was decided first.
    pub fn abort(&mut self, ticket: Pending) -> Result<Quarantined, AbortError> {
        let r = &self.owner.requests[ticket.slot as usize];
        if !r.live || r.key != ticket.key.0 {
            self.owner.counters.abort_late += 1;
            return Err(AbortError::Late);
        }
        self.abort_slot(ticket.slot)
    }

    /// Aborts a request by id (for callers that keep ids rather than tickets).
    ///
    /// # Errors
    /// [`AbortError::Unknown`] if no such request is tracked or remembered,
    /// [`AbortError::Late`] if it was decided already.
    pub fn abort_id(&mut self, id: &str) -> Result<Quarantined, AbortError> {
        let fp = self.shared.fingerprint(id);
        match self.probe(fp) {
            Probe::Tracked(slot) => self.abort_slot(slot),
            Probe::Vacant(_) if self.shared.tombstones.contains(fp) => {
                self.owner.counters.abort_late += 1;
                Err(AbortError::Late)
            }
            Probe::Vacant(_) => {
                self.owner.counters.abort_unknown += 1;
                Err(AbortError::Unknown)
            }
        }
    }

    /// The owner's id lookup: one probe of the index that either finds the tracked
    /// request with `fp` or the bucket where it would go. Cheaper than
    /// [`Shared::find`]: the owner is the only writer of buckets and identities, so it
    /// compares its own plain copies without seqlock validation.
    fn probe(&self, fp: Fingerprint) -> Probe {
        let tag = Index::<N>::tag(fp);
        let mut pos = Index::<N>::home(fp);
        let mut vacancy = None;
        for _ in 0..Index::<N>::BUCKETS {
            let b = self.shared.index.bucket(pos).load(Ordering::Relaxed);
            if b == EMPTY {
                return Probe::Vacant(vacancy.unwrap_or(pos));
            }
            if b == DELETED {
                vacancy.get_or_insert(pos);
            } else if Index::<N>::tag_matches(b, tag) {
                let slot = Index::<N>::slot(b);
                let r = &self.owner.requests[slot as usize];
                if r.live && r.fp == fp {
                    return Probe::Tracked(slot);
                }
            }
            pos = Index::<N>::next(pos);
        }
        // No `EMPTY` bucket at all: at most N of the 2N buckets are live, so a `DELETED`
        // one was seen.
        Probe::Vacant(vacancy.unwrap_or(pos))
    }

    fn abort_slot(&mut self, slot: u32) -> Result<Quarantined, AbortError> {
        let r = self.owner.requests[slot as usize];
        match self.shared.slots[slot as usize]
            .state
            .quarantine(r.generation, Phase::Aborted)
        {
            Quarantine::Entered(s) => {
                let end = self.owner.now + self.owner.config.quarantine;
                self.owner.timers.set(slot, end, r.key);
                self.owner.counters.aborted += 1;
                let now = stamp::of(self.owner.now);
                let h = self.history(slot);
                h.ended_at = now;
                h.flags |= HistoryFlags::ABORTED;
                Ok(self.quarantined(slot, s, QuarantineCause::Aborted))
            }
            Quarantine::AlreadyDrained | Quarantine::AlreadyQuarantined => {
                self.owner.counters.abort_late += 1;
                Err(AbortError::Late)
            }
            Quarantine::Recycled => {
                // Only the owner recycles a slot, and its record says this one is live.
                debug_assert!(false, "a live request's slot was recycled");
                self.owner.counters.abort_late += 1;
                Err(AbortError::Late)
            }
        }
    }

    fn quarantined(&self, slot: u32, s: Snapshot, cause: QuarantineCause) -> Quarantined {
        let r = &self.owner.requests[slot as usize];
        let shared = &self.shared.slots[slot as usize];
        let named = shared.named();
        let outstanding = if named == 0 {
            Outstanding::Count(s.outstanding() as u8)
        } else {
            Outstanding::Edges(shared.unresolved_edges(named, r.generation))
        };
        Quarantined {
            key: RequestKey(r.key),
            cause,
            outstanding,
        }
    }

    /// The transport confirmed that `agent` can no longer write here: resolves, as
    /// failed, every outstanding named edge of `agent` now, with no settling (nothing of
    /// the agent's can still land). Counting-mode requests are not touched (nobody knows
    /// which notices the agent still owed), and neither are requests registered later.
    /// Requests whose last edge this resolves are decided at once, in registration order;
    /// their decisions wait for [`poll_decision`](Self::poll_decision). Returns the number
    /// of edges resolved. `O(N·E)`: fences are rare.
    ///
    /// Only for a transport that can prove it: a peer seen gone (a failed send or
    /// heartbeat, a reset connection, a dead process, invalidated metadata) proves
    /// nothing of the kind, since bytes already handed to its transport keep landing.
    /// Report that with [`gone`](Self::gone).
    pub fn fence(&mut self, agent: AgentId) -> u32 {
        let resolved = self.resolve_agent(agent, Resolution::Fenced);
        self.owner.counters.fenced_edges += u64::from(resolved);
        resolved
    }

    /// The transport saw `agent` go away (a send or heartbeat to it failed, its
    /// connection was reset, its process died, its metadata was invalidated) but cannot
    /// confirm that none of its bytes already on the way can still land: resolves, as
    /// failed, every outstanding named edge of `agent` now, exactly as a failure notice
    /// from `agent` for each of those requests would (rule 8): the decision is taken at
    /// once and the blocks settle for [`Config::settle`](crate::Config::settle) from now. An edge already resolved is
    /// left as it is; counting-mode requests and requests registered later are not
    /// touched, as with [`fence`](Self::fence). Requests whose last edge this resolves are
    /// decided at once, in registration order (`Failed`; `Released` for an aborted or
    /// expired request, once it settled or its quarantine ended); their decisions wait for
    /// [`poll_decision`](Self::poll_decision). Returns the number of edges resolved.
    /// `O(N·E)`.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config { settle: Duration::from_millis(100), ..Config::with_capacity(16) });
    /// let (p0, p1) = (AgentId(0), AgentId(1));
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Edges(&[p0, p1]), deadline: None }).unwrap();
    /// let _ = ledger.handle_notification(p0, b"r:2");
    /// ledger.advance(Instant::from_millis(20)).expect("clock forward");
    /// // p1's heartbeat failed: the request fails now, its blocks settle until 20 + 100.
    /// assert_eq!(ledger.gone(p1), 1);
    /// assert!(matches!(ledger.poll_decision(), Some(Decision::Failed(_))));
    /// ledger.advance(Instant::from_millis(119)).expect("clock forward");
    /// assert_eq!(ledger.poll_decision(), None);
    /// ledger.advance(Instant::from_millis(120)).expect("clock forward");
    /// assert!(matches!(ledger.poll_decision(), Some(Decision::Released(_))));
    /// ```
    pub fn gone(&mut self, agent: AgentId) -> u32 {
        let resolved = self.resolve_agent(agent, Resolution::Gone);
        self.owner.counters.gone_edges += u64::from(resolved);
        resolved
    }

    /// Resolves, as `how` says (a fence or a `gone`), every outstanding named edge of
    /// `agent` among the live requests, and decides those whose last edge it was, in
    /// registration order. Returns the number of edges resolved.
    fn resolve_agent(&mut self, agent: AgentId, how: Resolution) -> u32 {
        let mut resolved = 0;
        let mut batch = 0;
        let now = stamp::of(self.owner.now);
        let slots = &self.shared.slots;
        for slot in 0..N as u32 {
            let r = &mut self.owner.requests[slot as usize];
            let shared = &slots[slot as usize];
            let generation = r.generation;
            if !r.live || shared.named() == 0 {
                continue;
            }
            if shared.claim_edge(shared.named(), generation, agent, true, false)
                != EdgeClaim::Claimed
            {
                continue;
            }
            resolved += 1;
            if how == Resolution::Gone {
                // Before the state word: whoever decides (here, or a pull after the
                // ingest side resolved the last edge) reads it on this thread.
                r.gone_at = now;
                self.history(slot).flags |= HistoryFlags::GONE;
            }
            if how == Resolution::Fenced {
                let h = self.history(slot);
                h.fenced_at = now;
                h.flags |= HistoryFlags::FENCED;
            }
            if shared.state.resolve_edge(generation, how) == Resolved::LastEdge {
                self.owner.batch[batch] = slot;
                batch += 1;
            }
        }
        self.sort_batch(batch);
        for i in 0..batch {
            let slot = self.owner.batch[i];
            let s = self.shared.slots[slot as usize]
                .state
                .load(Ordering::Acquire);
            self.decide_drained(slot, s);
        }
        resolved
    }

    /// Advances the clock to `now` and fires every deadline, settle end and quarantine end
    /// at or before it, request by request in registration order: `Expired` (edges still
    /// outstanding at the deadline), then a forced `Released` if the quarantine is over
    /// too; `Released` at a settle end. The transitions happen here (an expiry is at the
    /// advance, not at the pull); the decisions wait for
    /// [`poll_decision`](Self::poll_decision). Costs `O(k log N)` for the `k` timers that
    /// fire.
    ///
    /// # Errors
    /// [`ClockError::Backwards`] if `now` is earlier than the clock; nothing changes.
    pub fn advance(&mut self, now: Instant) -> Result<(), ClockError> {
        if now < self.owner.now {
            return Err(ClockError::Backwards {
                last: self.owner.now,
                now,
            });
        }
        self.owner.now = now;
        // For the ingest thread's failure-notice stamps (rule 8); see `Shared::clock`.
        self.shared
            .clock
            .store(now.millis() as u32, Ordering::Relaxed);
        if self.owner.timers.next_due().is_some_and(|due| due <= now) {
            self.fire_due(now);
        }
        Ok(())
    }

    /// Fires every timer due at `now` (see [`advance`](Self::advance)). Out of line: most
    /// advances have nothing due and pay only the check above.
    #[inline(never)]
    fn fire_due(&mut self, now: Instant) {
        let mut batch = 0;
        while let Some(slot) = self.owner.timers.pop_due(now) {
            self.owner.batch[batch] = slot;
            batch += 1;
        }
        self.sort_batch(batch);
        for i in 0..batch {
            let slot = self.owner.batch[i];
            let r = self.owner.requests[slot as usize];
            let state = &self.shared.slots[slot as usize].state;
            if r.settling {
                // Settle end or quarantine end, whichever came first (a tie is the settle
                // end: not forced).
                let s = state.load(Ordering::Acquire);
                self.release_drained(slot, s, r.due > now);
                continue;
            }
            match state.load(Ordering::Acquire).phase() {
                Phase::Counting => {
                    if let Quarantine::Entered(s) = state.quarantine(r.generation, Phase::Expired) {
                        self.owner.counters.expired += 1;
                        let (owed, kind) = match self
                            .quarantined(slot, s, QuarantineCause::Expired)
                            .outstanding
                        {
                            Outstanding::Count(n) => (u64::from(n), Kind::ExpiredCount),
                            Outstanding::Edges(mask) => (mask, Kind::ExpiredEdges),
                        };
                        let h = self.history(slot);
                        h.owed_at_expiry = owed;
                        h.ended_at = stamp::of(now);
                        h.flags |= HistoryFlags::EXPIRED;
                        self.owner.decided.push(slot, kind);
                        let end = r.due + self.owner.config.quarantine;
                        if end <= now {
                            self.force_release(slot);
                        } else {
                            self.owner.timers.set(slot, end, r.key);
                        }
                    }
                    // AlreadyDrained: the decision waits on the ready ring; a pull takes it.
                }
                Phase::Aborted | Phase::Expired => self.force_release(slot),
                // Only the owner frees a slot, and it cancels the slot's timer when it does.
                Phase::Free => debug_assert!(false, "a timer fired for a free slot"),
            }
        }
    }

    /// Hands out the oldest decision not handed out yet, `None` when there is none.
    ///
    /// Decisions come out in the order they were taken: those of [`advance`](Self::advance)
    /// [`fence`](Self::fence) and [`gone`](Self::gone) (taken there, in registration order), then those of the
    /// requests whose last edge the ingest side resolved (decided here, in the order the
    /// notices resolved them): `Completed`; or `Failed` then `Released` (later, from an
    /// `advance`, if a failure notice has to settle first, rule 8); or, for an aborted or
    /// expired request, `Released`. A request's decisions always come out in that order.
    ///
    /// Pull until `None` after every call that can decide (a notice that returned
    /// [`Noticed::Decided`](crate::Noticed::Decided), `advance`, `fence`, `gone`), or at least on
    /// every scheduler step: a decided request keeps its slot until its last decision
    /// (`Completed` or `Released`) is handed out, so a caller that pulls late sees
    /// `register` refuse `Full` (and [`has_room`](Self::has_room) say `false`) while
    /// decided requests wait in the queue, though [`len`](Self::len) no longer counts
    /// them. Ids, tombstones and timers do not wait: a decided id is `late` and may be
    /// registered again at once.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, Expect, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config::with_capacity(16));
    /// let (_ingest, mut engine) = ledger.split();
    /// # let _t = engine.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Count(1), deadline: None }).unwrap();
    /// # let (mut ingest, mut engine) = ledger.split();
    /// # let _ = ingest.handle_notification(AgentId(0), b"r:1");
    /// while let Some(decision) = engine.poll_decision() {
    ///     match decision {
    ///         Decision::Completed(done) => assert_eq!(done.into_decode(), BlockHandle(1)),
    ///         other => panic!("{other:?}"),
    ///     }
    /// }
    /// ```
    #[must_use = "a decision carries blocks or an outcome the engine must act on"]
    #[inline(always)]
    pub fn poll_decision(&mut self) -> Option<Decision> {
        loop {
            if let Some((slot, kind)) = self.owner.decided.pop() {
                return Some(self.hand_out(slot, kind));
            }
            // Inline up to here: a pull that finds nothing costs two loads of the ring.
            let slot = self.shared.ready.pop()?;
            if let Some(completed) = self.decide_ready(slot) {
                return Some(completed);
            }
        }
    }

    /// Decides a slot popped from the ready ring, if it still holds the drained request
    /// that pushed it. The common case, every edge landed, is handed out at once as
    /// `Completed`: the queue is empty when a pull reaches the ring, so that is the
    /// decision it would pop next, and pushing it only to pop it costs a round trip. Any
    /// other decision goes to the queue. Always inlined: out of line it cost ~40
    /// instructions per request, and `#[inline]` stops sufficing once a crate
    /// has two callers of `poll_decision`.
    #[inline(always)]
    fn decide_ready(&mut self, slot: u32) -> Option<Decision> {
        let s = self.shared.slots[slot as usize]
            .state
            .load(Ordering::Acquire);
        let r = &self.owner.requests[slot as usize];
        if s.outstanding() != 0 || !s.is_live(r.generation) {
            return None;
        }
        if s.phase() != Phase::Counting || s.failed() {
            self.decide_drained(slot, s);
            return None;
        }
        debug_assert_eq!(self.owner.decided.len(), 0);
        let done = Drained {
            key: RequestKey(r.key),
            blocks: BlockHandle(r.blocks),
        };
        self.complete(slot, s);
        self.owner.recycle(slot);
        Some(Decision::Completed(done))
    }

    /// Every edge of drained `slot` landed: retires it and frees its state word. The
    /// caller hands out (or queues) `Completed`; the slot is recycled at hand-out.
    #[inline(always)]
    fn complete(&mut self, slot: u32, s: Snapshot) {
        self.retire(slot);
        self.shared.slots[slot as usize].state.free_drained(s);
        self.owner.counters.completed += 1;
        // Its record: retired with its history not closed says it completed, and `due`
        // (the deadline, which nothing reads any more) says when. No history line touched.
        self.owner.requests[slot as usize].due = self.owner.now;
    }

    /// Every decision not handed out yet, one [`poll_decision`](Self::poll_decision) per
    /// item, until there is none.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config::with_capacity(16));
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Count(1), deadline: Some(Duration::from_millis(10)) }).unwrap();
    /// let (_ingest, mut engine) = ledger.split();
    /// engine.advance(Instant::from_millis(10)).expect("clock forward");
    /// for decision in engine.decisions() {
    ///     assert!(matches!(decision, Decision::Expired(_)));
    /// }
    /// ```
    pub fn decisions(&mut self) -> impl Iterator<Item = Decision> + '_ {
        core::iter::from_fn(move || self.poll_decision())
    }

    /// The decisions already queued, in order, and none other: those `advance`, `fence`,
    /// `gone` or an earlier pull took, exactly [`queued_decisions`](Self::queued_decisions)
    /// of them. Decisions of requests the ingest half drained since stay for the next
    /// [`poll_decision`](Self::poll_decision), so a caller can hand out what a timer or a
    /// fence decided before it looks at the ready ring.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config::with_capacity(16));
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Count(1), deadline: Some(Duration::from_millis(10)) }).unwrap();
    /// # let _u = ledger.register(Registration { id: "u", blocks: BlockHandle(2),
    /// #     expect: Expect::Count(1), deadline: None }).unwrap();
    /// let (mut ingest, mut engine) = ledger.split();
    /// engine.advance(Instant::from_millis(10)).expect("clock forward");
    /// let _ = ingest.handle_notification(AgentId(0), b"u:1"); // u is drained
    /// let queued: Vec<_> = engine.drain_queued().collect();
    /// assert!(matches!(queued[..], [Decision::Expired(_)]));
    /// assert!(matches!(engine.poll_decision(), Some(Decision::Completed(_))));
    /// ```
    pub fn drain_queued(&mut self) -> impl Iterator<Item = Decision> + '_ {
        core::iter::from_fn(move || self.pop_queued())
    }

    /// The next queued decision, never one of the ready ring.
    pub(crate) fn pop_queued(&mut self) -> Option<Decision> {
        let (slot, kind) = self.owner.decided.pop()?;
        Some(self.hand_out(slot, kind))
    }

    /// Builds the decision of a queued entry from the slot's record and, if it is the
    /// slot's last, returns the slot to the free list.
    fn hand_out(&mut self, slot: u32, kind: Kind) -> Decision {
        let r = self.owner.requests[slot as usize];
        let key = RequestKey(r.key);
        if kind.is_last() {
            self.owner.recycle(slot);
        }
        match kind {
            Kind::Completed => Decision::Completed(Drained {
                key,
                blocks: BlockHandle(r.blocks),
            }),
            Kind::Failed => Decision::Failed(Failed { key }),
            Kind::ExpiredCount => Decision::Expired(Quarantined {
                key,
                cause: QuarantineCause::Expired,
                outstanding: Outstanding::Count(self.history_of(slot).owed_at_expiry as u8),
            }),
            Kind::ExpiredEdges => Decision::Expired(Quarantined {
                key,
                cause: QuarantineCause::Expired,
                outstanding: Outstanding::Edges(self.history_of(slot).owed_at_expiry),
            }),
            Kind::Released | Kind::ReleasedForced => Decision::Released(Released {
                key,
                blocks: BlockHandle(r.blocks),
                forced: kind == Kind::ReleasedForced,
            }),
        }
    }

    /// What the ledger knows of the request `key` names ([`Record`]): while it is
    /// tracked, and after its last decision until its slot takes the next registration.
    /// To keep the record of every decision, read it right after
    /// [`poll_decision`](Self::poll_decision) hands the decision out, before registering
    /// again. `None` once the slot holds another request. Reads the slot's edge words and
    /// the owner's record: `O(E)`, nothing on the notification path.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, EdgeOutcome, Expect, FailureCause, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config::with_capacity(16));
    /// let (p0, p1) = (AgentId(0), AgentId(1));
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Edges(&[p0, p1]), deadline: None }).unwrap();
    /// ledger.advance(Instant::from_millis(5)).expect("clock forward");
    /// let _ = ledger.handle_notification(p0, b"r:2");
    /// let _ = ledger.handle_notification(p1, b"PUSH_FAIL:r:2");
    /// let (_ingest, mut engine) = ledger.split();
    /// let Some(Decision::Failed(failed)) = engine.poll_decision() else { panic!() };
    /// let record = engine.record(failed.key()).expect("not reused yet");
    /// assert_eq!(record.edges.named(), &[(p0, EdgeOutcome::Landed), (p1, EdgeOutcome::Failed)]);
    /// assert_eq!(record.first_failure(), Some(FailureCause::Notice(Instant::from_millis(5))));
    /// ```
    pub fn record(&self, key: RequestKey) -> Option<Record<E>> {
        let slot = (key.0 & 0xFFFF) as usize;
        let r = self.owner.requests.get(slot)?;
        if r.key != key.0 || r.expected == 0 {
            return None;
        }
        let h = self.history_of(slot as u32);
        // Retired without a closed history: it completed, at `due` (`complete`).
        let completed = !r.live && !h.flags.contains(HistoryFlags::CLOSED);
        let shared = &self.shared.slots[slot];
        let at =
            |stamp: u32, set: HistoryFlags| h.flags.contains(set).then(|| self.stamped_at(stamp));
        let s = shared.state.load(Ordering::Acquire);
        // Until it is freed the state word says how it stands; after, what was kept of it
        // when it was (the word then belongs to the slot's next generation).
        let (outstanding, failed, notice) = if completed {
            (0, false, None)
        } else if h.flags.contains(HistoryFlags::CLOSED) {
            (
                h.outstanding,
                h.flags.contains(HistoryFlags::FAILED),
                at(h.notice_at, HistoryFlags::NOTICE),
            )
        } else if s.is_live(r.generation) {
            (
                s.outstanding() as u8,
                s.failed(),
                s.settles()
                    .then(|| self.stamped_at(shared.failure_noticed_at())),
            )
        } else {
            return None;
        };
        let named = shared.named();
        let edges = if named == 0 {
            RecordedEdges::Count {
                expected: r.expected,
                outstanding,
                failed,
            }
        } else {
            RecordedEdges::Named {
                edges: shared.edge_outcomes(named, r.generation),
                len: named as u8,
            }
        };
        let ended = at(h.ended_at, HistoryFlags::ABORTED)
            .map(|t| (Ended::Aborted, t))
            .or_else(|| at(h.ended_at, HistoryFlags::EXPIRED).map(|t| (Ended::Expired, t)));
        Some(Record {
            key,
            registered_at: self.stamped_at(r.registered_at),
            deadline: self.stamped_at(r.deadline),
            edges,
            failure_notice_at: notice,
            gone_at: at(r.gone_at, HistoryFlags::GONE),
            fenced_at: at(h.fenced_at, HistoryFlags::FENCED),
            ended,
            decided_at: if completed {
                Some(r.due)
            } else {
                at(h.decided_at, HistoryFlags::DECIDED)
            },
            settle_end: h.flags.contains(HistoryFlags::SETTLED).then_some(r.due),
            released: if completed {
                Some((r.due, false))
            } else {
                at(h.released_at, HistoryFlags::RELEASED)
                    .map(|t| (t, h.flags.contains(HistoryFlags::FORCED)))
            },
        })
    }

    /// The clock.
    pub fn now(&self) -> Instant {
        self.owner.now
    }

    /// When the next deadline, settle end or quarantine end falls: the time to
    /// [`advance`](Self::advance) to next, if nothing else happens first.
    pub fn next_timer(&self) -> Option<Instant> {
        self.owner.timers.next_due()
    }

    /// Counters of this half.
    pub fn counters(&self) -> &EngineCounters {
        &self.owner.counters
    }

    /// Requests tracked now: registered and not yet completed or released (decided
    /// requests whose decisions wait to be handed out are not counted).
    pub fn len(&self) -> usize {
        self.owner.live
    }

    /// Decisions taken by `advance`, `fence`, `gone` or an earlier pull and not handed out yet
    /// (decisions of requests the ingest side drained are taken at the pull and not
    /// counted until then).
    pub fn queued_decisions(&self) -> usize {
        self.owner.decided.len()
    }

    /// Whether a registration would find room: fewer than `capacity` requests tracked and
    /// a slot free. A decided request frees its slot when its last decision is handed out.
    pub fn has_room(&self) -> bool {
        self.owner.has_room()
    }

    /// Whether no request is tracked.
    pub fn is_empty(&self) -> bool {
        self.owner.live == 0
    }

    fn sort_batch(&mut self, len: usize) {
        let Owner {
            batch, requests, ..
        } = &mut *self.owner;
        batch[..len].sort_unstable_by_key(|&slot| requests[slot as usize].key);
    }

    /// Every edge of `slot` is resolved (`s.outstanding() == 0`): decide, then release and
    /// free at once or, if a failure notice has not settled yet (rule 8), when it has.
    fn decide_drained(&mut self, slot: u32, s: Snapshot) {
        let r = self.owner.requests[slot as usize];
        let now = self.owner.now;
        match s.phase() {
            Phase::Counting if !s.failed() => {
                // Not reached today (`poll_decision` hands a landed request out at once and
                // a fence marks its edge failed), kept so a drained request is always
                // decided.
                self.complete(slot, s);
                self.owner.decided.push(slot, Kind::Completed);
                return;
            }
            Phase::Counting => {
                self.owner.counters.failed += 1;
                self.owner.decided.push(slot, Kind::Failed);
                let h = self.history(slot);
                h.decided_at = stamp::of(now);
                h.flags |= HistoryFlags::DECIDED;
            }
            Phase::Aborted | Phase::Expired => {}
            Phase::Free => {
                debug_assert!(false, "a drained slot is live");
                return;
            }
        }
        let settle_end = self.settle_end(slot, s);
        if settle_end > Instant::ZERO {
            self.owner.requests[slot as usize].due = settle_end;
            self.history(slot).flags |= HistoryFlags::SETTLED;
        }
        if settle_end <= now {
            return self.release_drained(slot, s, false);
        }
        // Aborted or expired: the quarantine end (its timer) bounds the wait. `None`: the
        // quarantine timer already fired while this decision waited on the ready ring.
        let quarantine_end = match s.phase() {
            Phase::Counting => Instant::MAX,
            _ => self.owner.timers.due(slot).unwrap_or(now),
        };
        if quarantine_end <= now {
            return self.release_drained(slot, s, true);
        }
        let o = &mut *self.owner;
        o.requests[slot as usize].settling = true;
        o.requests[slot as usize].due = settle_end;
        o.timers.set(slot, settle_end.min(quarantine_end), r.key);
        o.counters.settle_started += 1;
        o.counters.settling += 1;
    }

    /// When the blocks of drained `slot` may be released as far as rule 8 goes: the time
    /// of the last failure notice or `gone` that resolved one of its edges, plus
    /// [`Config::settle`](crate::Config::settle); [`Instant::ZERO`] if neither did.
    fn settle_end(&self, slot: u32, s: Snapshot) -> Instant {
        let r = &self.owner.requests[slot as usize];
        let notice = s
            .settles()
            .then(|| self.shared.slots[slot as usize].failure_noticed_at());
        let gone = self
            .history_of(slot)
            .flags
            .contains(HistoryFlags::GONE)
            .then_some(r.gone_at);
        notice
            .into_iter()
            .chain(gone)
            .map(|stamp| self.stamped_at(stamp))
            .max()
            .map_or(Instant::ZERO, |at| at + self.owner.config.settle)
    }

    /// The full time of a stamp (a failure notice's or a `gone`'s), read against the
    /// clock (`stamp::read`). A failure notice's may be ahead of the clock: it is dated at
    /// its arrival when the ingest half was given a later one than the last `advance`
    /// ([`Ingest::set_arrival`](crate::Ingest::set_arrival)). Exact within 2^31 ms (24.8
    /// days) of the clock on either side; a stamp further behind reads as later, which
    /// can only delay a release.
    fn stamped_at(&self, stamp: u32) -> Instant {
        stamp::read(stamp, self.owner.now)
    }

    /// Releases and frees drained `slot` (`s.outstanding() == 0`).
    // Out of line, like `force_release`: with `retire` inlined they would make `advance`
    // a larger function whose every call, idle ones too, saves more registers.
    #[inline(never)]
    fn release_drained(&mut self, slot: u32, s: Snapshot, forced: bool) {
        debug_assert_eq!(s.outstanding(), 0);
        let r = self.owner.requests[slot as usize];
        self.close_history(slot);
        self.retire(slot);
        self.shared.slots[slot as usize].state.free_drained(s);
        self.released(slot, forced);
        let c = &mut self.owner.counters;
        if r.settling {
            c.settling -= 1;
            c.settle_released += u64::from(!forced);
        }
        if forced {
            c.released_forced += 1;
            self.owner.decided.push(slot, Kind::ReleasedForced);
        } else {
            c.released += 1;
            self.owner.decided.push(slot, Kind::Released);
        }
    }

    /// Quarantine over with edges outstanding: free the slot anyway.
    #[inline(never)]
    fn force_release(&mut self, slot: u32) {
        let r = self.owner.requests[slot as usize];
        // Remember the id before the slot can be seen free (the CAS below releases this
        // store): a notice that finds the slot free then finds the tombstone and is
        // `late`, not `unknown` (found by `tests/loom.rs`). `retire` refreshes it.
        self.shared.tombstones.insert(&mut self.owner.ages, r.fp);
        self.close_history(slot);
        if self.shared.slots[slot as usize]
            .state
            .force_free(r.generation)
            == ForceFree::Freed
        {
            self.retire(slot);
            self.owner.counters.released_forced += 1;
            self.owner.decided.push(slot, Kind::ReleasedForced);
            self.released(slot, true);
        }
        // AlreadyDrained: the ingest side resolved the last edge; a pull releases it.
    }

    /// The history of the request in `slot`, emptied first if it still holds an earlier
    /// request's: only the paths where something went wrong call it.
    #[inline]
    fn history(&mut self, slot: u32) -> &mut History {
        let o = &mut *self.owner;
        let (r, h) = (
            &mut o.requests[slot as usize],
            &mut o.histories[slot as usize],
        );
        if !r.has_history {
            *h = History::EMPTY;
            r.has_history = true;
        }
        h
    }

    /// The history of the request in `slot`, as [`history`](Self::history) would see it.
    fn history_of(&self, slot: u32) -> History {
        match self.owner.requests[slot as usize].has_history {
            true => self.owner.histories[slot as usize],
            false => History::EMPTY,
        }
    }

    /// Keeps, for [`record`](Self::record), how the request's state word stands before
    /// it is freed: what it still owes, whether it failed, and the last failure notice's
    /// time. Owner-only; the word may still move under a forced release (a notice that
    /// lands before the free), which changes the record, never a decision.
    fn close_history(&mut self, slot: u32) {
        let generation = self.owner.requests[slot as usize].generation;
        let shared = &self.shared.slots[slot as usize];
        let s = shared.state.load(Ordering::Acquire);
        let notice = shared.failure_noticed_at();
        let h = self.history(slot);
        if !s.is_live(generation) || h.flags.contains(HistoryFlags::CLOSED) {
            return;
        }
        h.outstanding = s.outstanding() as u8;
        h.notice_at = notice;
        h.flags |= HistoryFlags::CLOSED;
        h.flags.set(HistoryFlags::FAILED, s.failed());
        h.flags.set(HistoryFlags::NOTICE, s.settles());
    }

    /// Notes in the history that the blocks came back now.
    fn released(&mut self, slot: u32, forced: bool) {
        let now = stamp::of(self.owner.now);
        let h = self.history(slot);
        h.released_at = now;
        h.flags |= HistoryFlags::RELEASED;
        h.flags.set(HistoryFlags::FORCED, forced);
    }

    /// Remembers the id and unlinks it from the index and the timers (the caller frees the
    /// state word and queues the last decision; the slot goes back to the free list when
    /// that decision is handed out, so its record stays valid until then).
    #[inline(always)]
    fn retire(&mut self, slot: u32) {
        let o = &mut *self.owner;
        let r = &mut o.requests[slot as usize];
        self.shared.tombstones.insert(&mut o.ages, r.fp);
        self.shared.index.remove(r.bucket as usize);
        o.timers.cancel(slot);
        r.live = false;
        r.settling = false;
        o.live -= 1;
    }
}
