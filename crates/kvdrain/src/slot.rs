//! The shared half of a request slot: what the ingest thread reads and writes.
//!
//! Everything here is an atomic. The owner (engine thread) writes the identity and the
//! edge words only while the slot is `Free`, then publishes the state word with `Release`;
//! the ingest thread reads them after an `Acquire` load of the state word and validates
//! the read by loading the state word again after an `Acquire` fence (a seqlock whose data
//! is atomic, so a racing reader sees stale values, never undefined behaviour).

use crate::fingerprint::Fingerprint;
use crate::state_word::StateWord;
use crate::sync::{AtomicU32, Ordering, fence};
use crate::ticket::AgentId;

/// Edge word: `AGENT(16) | GENERATION(13) | CAUSE(2) | RESOLVED`.
///
/// `CAUSE` says how a resolved edge ended (`EdgeCause`): written by the one CAS (or
/// store) that resolves it, so the cause is never apart from the resolution and costs no
/// store of its own. A completion and a failure notice set the same bits as when the
/// word held only `RESOLVED` and `FAILED`; a `gone` or a `fence` (the engine thread, on
/// its rare path) sets the other two causes. The generation tag is the state word's
/// generation modulo 2^13: a reader that validated generation `g` and then stalls while
/// its slot is recycled 8 192 times could claim an edge of the slot's next request, whose
/// state-word CAS (21 bits of generation) then refuses the count.
const EDGE_GEN_SHIFT: u32 = 3;
const EDGE_GEN_MASK: u32 = 0x1FFF;
const AGENT_SHIFT: u32 = 16;
const RESOLVED: u32 = 1;
const CAUSE_SHIFT: u32 = 1;
const CAUSE_MASK: u32 = 0b11 << CAUSE_SHIFT;

/// How a resolved edge ended: the `CAUSE` field of its edge word.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum EdgeCause {
    /// Its completion notice came.
    Landed = 0,
    /// Its producer's failure notice (`PUSH_FAIL:`).
    FailureNotice = 1,
    /// [`Engine::gone`](crate::Engine::gone) of its agent.
    Gone = 2,
    /// [`Engine::fence`](crate::Engine::fence) of its agent.
    Fenced = 3,
}

impl EdgeCause {
    /// The bits a claim with this cause sets.
    #[inline(always)]
    const fn bits(self) -> u32 {
        RESOLVED | ((self as u32) << CAUSE_SHIFT)
    }

    fn of(word: u32) -> Self {
        match (word & CAUSE_MASK) >> CAUSE_SHIFT {
            0 => EdgeCause::Landed,
            1 => EdgeCause::FailureNotice,
            2 => EdgeCause::Gone,
            _ => EdgeCause::Fenced,
        }
    }
}

// The flags sit below the generation tag, and a notice sets the bits it always set.
const _: () = assert!(CAUSE_SHIFT + 2 == EDGE_GEN_SHIFT && RESOLVED < 1 << CAUSE_SHIFT);
const _: () = assert!(EDGE_GEN_SHIFT + 13 == AGENT_SHIFT && EDGE_GEN_MASK == (1 << 13) - 1);
const _: () = assert!(EdgeCause::Landed.bits() == 0b01 && EdgeCause::FailureNotice.bits() == 0b11);

fn edge_tag(generation: u32) -> u32 {
    (generation & EDGE_GEN_MASK) << EDGE_GEN_SHIFT
}

/// Outcome of claiming a named edge.
#[must_use]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum EdgeClaim {
    /// This notice resolved the agent's edge; now resolve it in the state word.
    Claimed,
    /// The agent's edge was already resolved.
    Duplicate,
    /// The agent is not one of the request's edges (valid only if the generation is still
    /// the same afterwards: the caller re-validates).
    NotAnEdge,
    /// The slot was recycled while we looked.
    Recycled,
}

/// Shared state of one slot; `E` is the most named edges a request may have.
#[derive(Debug)]
pub(crate) struct SharedSlot<const E: usize> {
    pub(crate) state: StateWord,
    fingerprint: [AtomicU32; 4],
    /// Number of named edges; 0 in counting mode.
    named: AtomicU32,
    edges: [AtomicU32; E],
    /// When a failure notice last resolved one of this request's edges, as a stamp
    /// (`stamp.rs`): the later of the published clock (`Shared::clock`) and the notice's
    /// arrival; meaningful only while the state word's `S` bit is set.
    failure_noticed_at: AtomicU32,
}

impl<const E: usize> SharedSlot<E> {
    pub(crate) fn new() -> Self {
        SharedSlot {
            state: StateWord::new(),
            fingerprint: crate::sync::zeroed(),
            named: AtomicU32::new(0),
            edges: crate::sync::zeroed(),
            failure_noticed_at: AtomicU32::new(0),
        }
    }

    /// Owner, slot `Free`: writes the identity and edges of the next request.
    pub(crate) fn write(&self, fp: Fingerprint, generation: u32, agents: &[AgentId]) {
        // Orders the `Free` store that ended the previous request before these writes: a
        // reader that sees any of them and then fences sees the slot as recycled.
        fence(Ordering::Release);
        for (word, value) in self.fingerprint.iter().zip(fp.words()) {
            word.store(value, Ordering::Relaxed);
        }
        self.named.store(agents.len() as u32, Ordering::Relaxed);
        for (word, agent) in self.edges.iter().zip(agents) {
            word.store(
                (u32::from(agent.0) << AGENT_SHIFT) | edge_tag(generation),
                Ordering::Relaxed,
            );
        }
    }

    /// Reads identity and edge count (validate with a second state load after an
    /// `Acquire` fence before trusting it).
    pub(crate) fn read_identity(&self) -> (Fingerprint, u32) {
        let w = [0, 1, 2, 3].map(|i| self.fingerprint[i].load(Ordering::Relaxed));
        (
            Fingerprint::from_words(w),
            self.named.load(Ordering::Relaxed),
        )
    }

    /// Claims `agent`'s edge among the first `named` edges of generation `generation` for
    /// a notice, a failure notice if `failed`. `alone`: the caller holds the whole ledger
    /// (`&mut Ledger`), so the word it read is current and the claim is a plain store
    /// rather than a CAS.
    #[inline]
    pub(crate) fn claim_edge(
        &self,
        named: u32,
        generation: u32,
        agent: AgentId,
        failed: bool,
        alone: bool,
    ) -> EdgeClaim {
        let cause = if failed {
            EdgeCause::FailureNotice
        } else {
            EdgeCause::Landed
        };
        self.claim(named, generation, agent, cause, alone)
    }

    /// Owner: claims `agent`'s edge for a `gone` or a `fence` (`cause`), racing the ingest
    /// thread's notices with a CAS: whichever claims first writes its cause, in the same
    /// atomic step as the resolution.
    pub(crate) fn end_edge(
        &self,
        named: u32,
        generation: u32,
        agent: AgentId,
        cause: EdgeCause,
    ) -> EdgeClaim {
        debug_assert!(matches!(cause, EdgeCause::Gone | EdgeCause::Fenced));
        self.claim(named, generation, agent, cause, false)
    }

    #[inline(always)]
    fn claim(
        &self,
        named: u32,
        generation: u32,
        agent: AgentId,
        cause: EdgeCause,
        alone: bool,
    ) -> EdgeClaim {
        let tag = edge_tag(generation);
        for word in self.edges.iter().take(named as usize) {
            let mut current = word.load(Ordering::Acquire);
            if current >> AGENT_SHIFT != u32::from(agent.0) {
                continue;
            }
            loop {
                if current & (EDGE_GEN_MASK << EDGE_GEN_SHIFT) != tag {
                    return EdgeClaim::Recycled;
                }
                if current & RESOLVED != 0 {
                    return EdgeClaim::Duplicate;
                }
                let next = current | cause.bits();
                if alone {
                    word.store(next, Ordering::Release);
                    return EdgeClaim::Claimed;
                }
                match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return EdgeClaim::Claimed,
                    Err(actual) => current = actual,
                }
            }
        }
        EdgeClaim::NotAnEdge
    }

    /// Bit `i` set for each of the first `named` edges not yet resolved.
    pub(crate) fn unresolved_edges(&self, named: u32, generation: u32) -> u64 {
        let tag = edge_tag(generation);
        let mut mask = 0u64;
        for (i, word) in self.edges.iter().take(named as usize).enumerate() {
            let w = word.load(Ordering::Acquire);
            if w & (EDGE_GEN_MASK << EDGE_GEN_SHIFT) == tag && w & RESOLVED == 0 {
                mask |= 1 << i;
            }
        }
        mask
    }

    /// Owner: the first `named` edges of generation `generation`, each with its agent and
    /// how it stands, its cause read from its word (an edge word of another generation
    /// reads as outstanding), for a [`Record`](crate::Record).
    pub(crate) fn edge_outcomes(
        &self,
        named: u32,
        generation: u32,
    ) -> [(AgentId, crate::record::EdgeOutcome); E] {
        use crate::record::EdgeOutcome;
        let tag = edge_tag(generation);
        let mut out = [(AgentId(0), EdgeOutcome::Outstanding); E];
        for (entry, word) in out.iter_mut().zip(self.edges.iter().take(named as usize)) {
            let w = word.load(Ordering::Acquire);
            let outcome = if w & (EDGE_GEN_MASK << EDGE_GEN_SHIFT) != tag || w & RESOLVED == 0 {
                EdgeOutcome::Outstanding
            } else {
                match EdgeCause::of(w) {
                    EdgeCause::Landed => EdgeOutcome::Landed,
                    EdgeCause::FailureNotice => EdgeOutcome::FailureNotice,
                    EdgeCause::Gone => EdgeOutcome::Gone,
                    EdgeCause::Fenced => EdgeOutcome::Fenced,
                }
            };
            *entry = (AgentId((w >> AGENT_SHIFT) as u16), outcome);
        }
        out
    }

    /// Ingest: a failure notice is about to resolve an edge of this slot at `at` (a stamp:
    /// the later of the last published clock and the notice's arrival). Stored before the
    /// state-word CAS that sets `S`, which releases it to whoever sees `S`. Only the one
    /// ingest thread stores here, and neither the clock it reads nor its arrival time
    /// goes back, so the word holds the latest notice's time. A notice whose CAS then fails (its request ended under it and the slot was
    /// recycled) leaves its time here; the next request can only read a time at or after
    /// its own last failure notice from it, so the stray store can delay a release but
    /// never advance one.
    pub(crate) fn stamp_failure_notice(&self, at: u32) {
        self.failure_noticed_at.store(at, Ordering::Relaxed);
    }

    /// Owner, after seeing `S` in the state word (`Acquire`): the stamp of the last failure
    /// notice.
    pub(crate) fn failure_noticed_at(&self) -> u32 {
        self.failure_noticed_at.load(Ordering::Relaxed)
    }

    /// Owner: the named-edge count written at registration.
    pub(crate) fn named(&self) -> u32 {
        self.named.load(Ordering::Relaxed)
    }
}
