//! Decisions out of the engine half: [`poll_decision`](crate::Engine::poll_decision) (the
//! queued ones first, then the requests the ingest half drained, a completion handed out
//! at once), [`poll_recorded`](crate::Engine::poll_recorded) (each with its record), and
//! the queued ones alone.

use crate::Engine;
use crate::decided::Kind;
use crate::record::{Recorded, Split};
use crate::state_word::{Phase, Snapshot};
use crate::sync::Ordering;
use crate::ticket::{
    BlockHandle, Decision, Drained, Failed, Outstanding, QuarantineCause, Quarantined, Released,
    RequestKey,
};

impl<const N: usize, const E: usize> Engine<'_, N, E> {
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

    /// [`poll_decision`](Self::poll_decision), opt-in, with the record of the decision's
    /// request ([`Record`](crate::Record)) built as the decision is handed out, before
    /// anything can reuse its slot: every decision comes with its record, none is missing.
    /// Costs one [`record`](Self::record) per decision (`O(E)`, the owner's tables and
    /// the slot's edge words); `poll_decision` stays record-free.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, EdgeOutcome, Expect, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config::with_capacity(16));
    /// let (p0, p1) = (AgentId(0), AgentId(1));
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Edges(&[p0, p1]), deadline: None }).unwrap();
    /// let (mut ingest, mut engine) = ledger.split();
    /// let _ = ingest.handle_notification(p0, b"PUSH_FAIL:r:2");
    /// engine.gone(p1);
    /// let failed = engine.poll_recorded().expect("decided by the gone");
    /// assert!(matches!(failed.decision, Decision::Failed(_)));
    /// assert_eq!(
    ///     failed.record.edges.named(),
    ///     &[(p0, EdgeOutcome::FailureNotice), (p1, EdgeOutcome::Gone)]
    /// );
    /// ```
    #[inline]
    pub fn poll_recorded(&mut self) -> Option<Recorded<E>> {
        let decision = self.poll_decision()?;
        Some(self.recorded(decision))
    }

    /// [`poll_decision`](Self::poll_decision), opt-in, for a caller that wants the record
    /// of every decision but a completion: a `Completed` comes out as it does there, with
    /// no record built (the fast path), and any other decision with its record, as
    /// [`poll_recorded`](Self::poll_recorded) gives it.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, EdgeOutcome, Expect, Ledger, Registration, Split};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config::with_capacity(16));
    /// # for id in ["a", "b"] { let _ = ledger.register(Registration { id, blocks: BlockHandle(1),
    /// #     expect: Expect::Edges(&[AgentId(0)]), deadline: None }).unwrap(); }
    /// let (mut ingest, mut engine) = ledger.split();
    /// let _ = ingest.handle_notification(AgentId(0), b"a:1");
    /// let _ = ingest.handle_notification(AgentId(0), b"PUSH_FAIL:b:1");
    /// assert!(matches!(engine.poll_split(), Some(Split::Completed(_))));
    /// let Some(Split::Other(failed)) = engine.poll_split() else { panic!() };
    /// assert_eq!(failed.record.edges.named(), &[(AgentId(0), EdgeOutcome::FailureNotice)]);
    /// ```
    #[inline(always)]
    pub fn poll_split(&mut self) -> Option<Split<E>> {
        match self.poll_decision()? {
            Decision::Completed(done) => Some(Split::Completed(done)),
            other => Some(Split::Other(self.recorded(other))),
        }
    }

    /// The next decision [`drain_queued`](Self::drain_queued) would hand out, with its
    /// record, as [`poll_recorded`](Self::poll_recorded) gives it.
    pub fn poll_queued_recorded(&mut self) -> Option<Recorded<E>> {
        let decision = self.pop_queued()?;
        Some(self.recorded(decision))
    }

    /// A decision just handed out, with its request's record: its slot still holds it
    /// (a slot is reused only by a later registration).
    fn recorded(&self, decision: Decision) -> Recorded<E> {
        let slot = (decision.key().0 & 0xFFFF) as u32;
        Recorded {
            record: self.record_at(slot),
            decision,
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
    pub(crate) fn decide_ready(&mut self, slot: u32) -> Option<Decision> {
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
    pub(crate) fn complete(&mut self, slot: u32, s: Snapshot) {
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
    pub(crate) fn hand_out(&mut self, slot: u32, kind: Kind) -> Decision {
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
}
