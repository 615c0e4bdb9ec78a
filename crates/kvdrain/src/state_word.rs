//! The per-request atomic state word, shared by the ingest and engine threads.
//!
//! In the style of tokio's task state: one `AtomicU32`, named bit fields, one private CAS
//! loop ([`StateWord::transition`]) and a `#[must_use]` outcome per transition that tells
//! the caller what to do next.
//!
//! ```text
//!  31                   11  10  9   8   7   6          0
//! +-----------------------+---+-------+---+------------+
//! |      GENERATION       | S | PHASE | F | OUTSTANDING|
//! +-----------------------+---+-------+---+------------+
//! ```
//!
//! Invariants:
//! * `OUTSTANDING` is the number of edges not yet resolved; it only decreases while the
//!   generation stays the same, and the transition that makes it 0 is the request's
//!   decision point (exactly one transition can do that).
//! * `F` (failed) is sticky: once an edge resolved as failed, no later success clears it.
//! * `S` (settle) is sticky like `F` and set with it when the edge was resolved by a
//!   failure notice (not by a fence): the request's blocks must settle before release
//!   (rule 8). The time of the notice is in the slot's failure stamp (`slot.rs`), stored
//!   before the CAS that sets `S`, so whoever sees `S` sees the stamp.
//! * An edge that `gone` resolved settles too, but sets only `F` here: the engine thread
//!   resolves it and keeps its time in its own record of the request (`owner.rs`), so the
//!   failure stamp keeps its one writer, the ingest thread.
//! * `PHASE` is `Free` only while the slot holds no request; it goes
//!   `Free → Counting → (Aborted | Expired)?` and back to `Free` only through the owner.
//! * `GENERATION` changes exactly when the slot is freed, so a notice that looked a slot up
//!   before it was recycled fails its CAS instead of counting for the next request (ABA).
//!   21 bits: a stale reader would need the same slot recycled 2 097 152 times between its
//!   lookup and its CAS.

use crate::sync::{AtomicU32, Ordering};

const OUTSTANDING_MASK: u32 = 0x7F;
const PHASE_SHIFT: u32 = 8;
const PHASE_MASK: u32 = 0b11 << PHASE_SHIFT;
const GENERATION_SHIFT: u32 = 11;

bitflags::bitflags! {
    /// The sticky flag bits of the state word, at their places in the packed word (`F`
    /// and `S` in the diagram above); the other fields are numbers, not flags.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(crate) struct Flags: u32 {
        /// `F`: an edge resolved as failed.
        const FAILED = 1 << 7;
        /// `S`: a failure notice resolved an edge; the blocks settle before release.
        const SETTLE = 1 << 10;
    }
}

// The flags sit between the fields and overlap none of them.
const _: () = assert!(
    Flags::all().bits() & (OUTSTANDING_MASK | PHASE_MASK | (u32::MAX << GENERATION_SHIFT)) == 0
);

/// Where a slot's request is in its life.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Phase {
    /// No request.
    Free = 0,
    /// Registered, waiting for its edges.
    Counting = 1,
    /// Aborted by the engine; blocks fenced until every edge resolves or quarantine ends.
    Aborted = 2,
    /// Deadline passed; blocks fenced as for `Aborted`.
    Expired = 3,
}

/// A value of the state word.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Snapshot(u32);

impl Snapshot {
    #[inline]
    pub(crate) fn new(generation: u32, phase: Phase, outstanding: u32) -> Self {
        Snapshot((generation << GENERATION_SHIFT) | ((phase as u32) << PHASE_SHIFT) | outstanding)
    }
    #[inline]
    pub(crate) fn outstanding(self) -> u32 {
        self.0 & OUTSTANDING_MASK
    }
    /// The flag bits set in this value.
    #[inline]
    pub(crate) fn flags(self) -> Flags {
        Flags::from_bits_truncate(self.0)
    }
    #[inline]
    pub(crate) fn failed(self) -> bool {
        self.flags().contains(Flags::FAILED)
    }
    /// A failure notice resolved one of the edges: the blocks settle before release.
    #[inline]
    pub(crate) fn settles(self) -> bool {
        self.flags().contains(Flags::SETTLE)
    }
    #[inline]
    pub(crate) fn phase(self) -> Phase {
        match (self.0 & PHASE_MASK) >> PHASE_SHIFT {
            0 => Phase::Free,
            1 => Phase::Counting,
            2 => Phase::Aborted,
            _ => Phase::Expired,
        }
    }
    #[inline]
    pub(crate) fn generation(self) -> u32 {
        self.0 >> GENERATION_SHIFT
    }
    /// Live (not `Free`) and of generation `generation`.
    #[inline]
    pub(crate) fn is_live(self, generation: u32) -> bool {
        self.phase() != Phase::Free && self.generation() == generation
    }
    #[inline]
    fn with_phase(self, phase: Phase) -> Self {
        Snapshot((self.0 & !PHASE_MASK) | ((phase as u32) << PHASE_SHIFT))
    }
}

/// How an edge was resolved.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Resolution {
    /// Its completion arrived: the write landed.
    Landed,
    /// A failure notice (`PUSH_FAIL:`): failed, and the write may still drain (rule 8).
    FailureNotice,
    /// A fence: failed, and the transport knows nothing more can land.
    Fenced,
    /// A `gone`: failed, and the write may still drain (rule 8, from the `gone`); the
    /// engine keeps its time, so only `F` is set here.
    Gone,
}

impl Resolution {
    /// The flags an edge resolved this way sets (sticky: no resolution clears one).
    #[inline]
    fn flags(self) -> Flags {
        match self {
            Resolution::Landed => Flags::empty(),
            Resolution::FailureNotice => Flags::FAILED.union(Flags::SETTLE),
            Resolution::Fenced | Resolution::Gone => Flags::FAILED,
        }
    }
}

/// Outcome of resolving one edge.
#[must_use]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Resolved {
    /// Counted; other edges are still outstanding.
    Counted,
    /// This was the last outstanding edge: the caller took the decision and must hand the
    /// slot to whoever decides (the ingest thread pushes it on the ready ring).
    LastEdge,
    /// Every edge was already resolved: the request is decided; the notice is late.
    AlreadyDrained,
    /// The slot no longer holds that generation: the request is gone; look it up again.
    Recycled,
}

/// Outcome of moving a counting request into quarantine (abort or deadline).
#[must_use]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Quarantine {
    /// Done; the snapshot taken at the transition (outstanding edges > 0).
    Entered(Snapshot),
    /// The last edge resolved first: the request is decided and waits on the ready ring.
    AlreadyDrained,
    /// Already aborted or expired.
    AlreadyQuarantined,
    /// Not that request any more.
    Recycled,
}

/// Outcome of ending a quarantine by force.
#[must_use]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ForceFree {
    /// The slot is free now; edges were still outstanding.
    Freed,
    /// The last edge resolved first: a normal release waits on the ready ring.
    AlreadyDrained,
    /// Not that request any more.
    Recycled,
}

/// The transition of resolving one edge of generation `generation` as `how` says: one
/// outstanding edge fewer and `how`'s flags, or why not.
#[inline(always)]
fn resolve(generation: u32, how: Resolution) -> impl Fn(Snapshot) -> Result<Snapshot, Resolved> {
    let flags = how.flags();
    move |s| {
        if !s.is_live(generation) {
            return Err(Resolved::Recycled);
        }
        if s.outstanding() == 0 {
            return Err(Resolved::AlreadyDrained);
        }
        Ok(Snapshot((s.0 - 1) | flags.bits()))
    }
}

/// The atomic state word of one slot.
#[derive(Debug)]
pub(crate) struct StateWord(AtomicU32);

impl StateWord {
    #[inline]
    pub(crate) fn new() -> Self {
        StateWord(AtomicU32::new(0))
    }

    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> Snapshot {
        Snapshot(self.0.load(order))
    }

    /// The single CAS loop. `f` sees the current value and returns the new one, or `Err`
    /// with the outcome to report without writing.
    #[inline]
    fn transition<T>(&self, f: impl FnMut(Snapshot) -> Result<Snapshot, T>) -> Result<Snapshot, T> {
        self.transition_from(self.load(Ordering::Acquire), f)
    }

    /// [`transition`](Self::transition) from `seen`, a value of this word the caller
    /// loaded moments ago, instead of loading it again: if the word changed since, the
    /// first CAS fails and the loop goes on from the value the CAS found, as after any
    /// lost race. (The CAS is `AcqRel` either way; the first load's `Acquire` only ever
    /// ordered what `f` reads, and `f` reads the value alone.)
    #[inline]
    fn transition_from<T>(
        &self,
        seen: Snapshot,
        mut f: impl FnMut(Snapshot) -> Result<Snapshot, T>,
    ) -> Result<Snapshot, T> {
        let mut current = seen.0;
        loop {
            let next = f(Snapshot(current))?;
            match self
                .0
                .compare_exchange_weak(current, next.0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(next),
                Err(actual) => current = actual,
            }
        }
    }

    /// [`transition`](Self::transition) for a caller that holds the whole ledger
    /// (`&mut Ledger`, one thread): `seen` is the word's current value, since no other
    /// thread can write it, so the new value is stored as is, without a CAS and its
    /// `lock` prefix. (A plain store to an atomic: never undefined behaviour; it could
    /// only lose a racing update, and the caller's exclusive borrow rules those out.)
    #[inline]
    fn transition_alone<T>(
        &self,
        seen: Snapshot,
        f: impl FnOnce(Snapshot) -> Result<Snapshot, T>,
    ) -> Result<Snapshot, T> {
        let next = f(seen)?;
        self.0.store(next.0, Ordering::Release);
        Ok(next)
    }

    /// Resolves one edge of generation `generation` as `how` says.
    #[inline]
    pub(crate) fn resolve_edge(&self, generation: u32, how: Resolution) -> Resolved {
        self.resolve_edge_from(self.load(Ordering::Acquire), generation, how)
    }

    /// [`resolve_edge`](Self::resolve_edge) with the CAS started from `seen`, the value a
    /// lookup just validated (the ingest path: saves loading and checking the word again;
    /// see [`transition_from`](Self::transition_from)).
    #[inline]
    pub(crate) fn resolve_edge_from(
        &self,
        seen: Snapshot,
        generation: u32,
        how: Resolution,
    ) -> Resolved {
        Self::resolved(self.transition_from(seen, resolve(generation, how)))
    }

    /// [`resolve_edge_from`](Self::resolve_edge_from) for a caller that holds the whole
    /// ledger: `seen` is current, and the new value is stored without a CAS (see
    /// [`transition_alone`](Self::transition_alone)).
    #[inline]
    pub(crate) fn resolve_edge_alone(
        &self,
        seen: Snapshot,
        generation: u32,
        how: Resolution,
    ) -> Resolved {
        Self::resolved(self.transition_alone(seen, resolve(generation, how)))
    }

    #[inline]
    fn resolved(outcome: Result<Snapshot, Resolved>) -> Resolved {
        match outcome {
            Ok(s) if s.outstanding() == 0 => Resolved::LastEdge,
            Ok(_) => Resolved::Counted,
            Err(r) => r,
        }
    }

    /// Moves a counting request of `generation` with edges outstanding into `to`.
    #[inline]
    pub(crate) fn quarantine(&self, generation: u32, to: Phase) -> Quarantine {
        match self.transition(|s| {
            if !s.is_live(generation) {
                Err(Quarantine::Recycled)
            } else if s.outstanding() == 0 {
                Err(Quarantine::AlreadyDrained)
            } else if s.phase() != Phase::Counting {
                Err(Quarantine::AlreadyQuarantined)
            } else {
                Ok(s.with_phase(to))
            }
        }) {
            Ok(s) => Quarantine::Entered(s),
            Err(q) => q,
        }
    }

    /// Frees a slot whose edges are still outstanding (quarantine ran out).
    #[inline]
    pub(crate) fn force_free(&self, generation: u32) -> ForceFree {
        match self.transition(|s| {
            if !s.is_live(generation) {
                Err(ForceFree::Recycled)
            } else if s.outstanding() == 0 {
                Err(ForceFree::AlreadyDrained)
            } else {
                Ok(Snapshot::new(
                    generation.wrapping_add(1) & GEN_MASK,
                    Phase::Free,
                    0,
                ))
            }
        }) {
            Ok(_) => ForceFree::Freed,
            Err(f) => f,
        }
    }

    /// Frees a drained slot (owner only; no other thread writes a word with 0 outstanding).
    #[inline]
    pub(crate) fn free_drained(&self, s: Snapshot) {
        debug_assert_eq!(s.outstanding(), 0);
        let next = Snapshot::new(s.generation().wrapping_add(1) & GEN_MASK, Phase::Free, 0);
        self.0.store(next.0, Ordering::Release);
    }

    /// Publishes a new request in a free slot (owner only).
    #[inline]
    pub(crate) fn publish(&self, generation: u32, outstanding: u32) {
        let s = Snapshot::new(generation, Phase::Counting, outstanding);
        self.0.store(s.0, Ordering::Release);
    }
}

/// Generation values wrap within 22 bits.
pub(crate) const GEN_MASK: u32 = u32::MAX >> GENERATION_SHIFT;

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let s = Snapshot::new(GEN_MASK, Phase::Expired, 64);
        assert_eq!(
            (s.generation(), s.phase(), s.outstanding(), s.flags()),
            (GEN_MASK, Phase::Expired, 64, Flags::empty())
        );
    }

    #[test]
    fn flags_sit_at_their_places_in_the_word() {
        // The packed layout of the diagram: F is bit 7, S is bit 10.
        assert_eq!(Flags::FAILED.bits(), 0x080);
        assert_eq!(Flags::SETTLE.bits(), 0x400);
        let w = StateWord::new();
        w.publish(3, 2);
        assert_eq!(
            w.resolve_edge(3, Resolution::FailureNotice),
            Resolved::Counted
        );
        let s = w.load(Ordering::Relaxed);
        assert_eq!(s.flags(), Flags::FAILED | Flags::SETTLE);
        assert_eq!(
            (s.generation(), s.phase(), s.outstanding()),
            (3, Phase::Counting, 1)
        );
    }

    #[test]
    fn last_edge_is_reported_once_and_failure_sticks() {
        let w = StateWord::new();
        w.publish(5, 2);
        assert_eq!(
            w.resolve_edge(5, Resolution::FailureNotice),
            Resolved::Counted
        );
        assert_eq!(w.resolve_edge(5, Resolution::Landed), Resolved::LastEdge);
        let s = w.load(Ordering::Relaxed);
        assert!(s.failed() && s.settles());
        assert_eq!(
            w.resolve_edge(5, Resolution::Landed),
            Resolved::AlreadyDrained
        );
    }

    #[test]
    fn a_fence_fails_without_settling() {
        let w = StateWord::new();
        w.publish(GEN_MASK, 2);
        assert_eq!(
            w.resolve_edge(GEN_MASK, Resolution::Fenced),
            Resolved::Counted
        );
        assert_eq!(
            w.resolve_edge(GEN_MASK, Resolution::Landed),
            Resolved::LastEdge
        );
        let s = w.load(Ordering::Relaxed);
        assert!(s.failed() && !s.settles());
        assert_eq!(s.generation(), GEN_MASK);
    }

    #[test]
    fn a_gone_fails_and_leaves_the_settle_bit_to_failure_notices() {
        let w = StateWord::new();
        w.publish(7, 2);
        assert_eq!(w.resolve_edge(7, Resolution::Gone), Resolved::Counted);
        let s = w.load(Ordering::Relaxed);
        // `S` stays clear: the engine keeps the `gone`'s time in its own record.
        assert_eq!(s.flags(), Flags::FAILED);
        assert_eq!(
            w.resolve_edge(7, Resolution::FailureNotice),
            Resolved::LastEdge
        );
        assert_eq!(
            w.load(Ordering::Relaxed).flags(),
            Flags::FAILED | Flags::SETTLE
        );
    }

    #[test]
    fn stale_generation_never_counts() {
        let w = StateWord::new();
        w.publish(5, 1);
        assert_eq!(w.resolve_edge(4, Resolution::Landed), Resolved::Recycled);
        assert_eq!(w.quarantine(6, Phase::Aborted), Quarantine::Recycled);
        assert_eq!(w.force_free(4), ForceFree::Recycled);
        assert_eq!(w.load(Ordering::Relaxed).outstanding(), 1);
    }

    #[test]
    fn quarantine_then_force_free_bumps_generation() {
        let w = StateWord::new();
        w.publish(GEN_MASK, 1);
        assert!(matches!(
            w.quarantine(GEN_MASK, Phase::Aborted),
            Quarantine::Entered(_)
        ));
        assert_eq!(
            w.quarantine(GEN_MASK, Phase::Expired),
            Quarantine::AlreadyQuarantined
        );
        assert_eq!(w.force_free(GEN_MASK), ForceFree::Freed);
        let s = w.load(Ordering::Relaxed);
        assert_eq!((s.phase(), s.generation()), (Phase::Free, 0));
    }

    #[test]
    fn drained_request_cannot_be_quarantined_or_forced() {
        let w = StateWord::new();
        w.publish(1, 1);
        assert_eq!(w.resolve_edge(1, Resolution::Landed), Resolved::LastEdge);
        assert_eq!(w.quarantine(1, Phase::Expired), Quarantine::AlreadyDrained);
        assert_eq!(w.force_free(1), ForceFree::AlreadyDrained);
    }
}
