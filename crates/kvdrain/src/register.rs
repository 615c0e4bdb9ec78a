//! Registration on the engine half: the expectation checked, the owner's id probe, a free
//! slot written and published, the deadline's timer set. A registration writes no
//! history line (`record.rs`).

use crate::Engine;
use crate::error::{RegisterError, RegisterErrorKind};
use crate::fingerprint::Fingerprint;
use crate::index::{DELETED, EMPTY, Index};
use crate::owner::Request;
use crate::stamp;
use crate::sync::Ordering;
use crate::ticket::{AgentId, Expect, Pending, Registration, RequestKey};

/// Where an id is in the index, as the owner sees it.
pub(crate) enum Probe {
    /// Tracked in this slot.
    Tracked(u32),
    /// Not tracked; this bucket is free for it.
    Vacant(usize),
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

impl<const N: usize, const E: usize> Engine<'_, N, E> {
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
    pub(crate) fn refuse<'r>(
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

    /// The owner's id lookup: one probe of the index that either finds the tracked
    /// request with `fp` or the bucket where it would go. Cheaper than
    /// [`Shared::find`]: the owner is the only writer of buckets and identities, so it
    /// compares its own plain copies without seqlock validation.
    pub(crate) fn probe(&self, fp: Fingerprint) -> Probe {
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
}
