//! Abort on the engine half, by ticket or by id: the request enters quarantine (its blocks
//! stay fenced until every edge resolves or the quarantine runs out).

use crate::Engine;
use crate::error::AbortError;
use crate::owner::HistoryFlags;
use crate::register::Probe;
use crate::stamp;
use crate::state_word::{Phase, Quarantine, Snapshot};
use crate::ticket::{Outstanding, Pending, QuarantineCause, Quarantined, RequestKey};

impl<const N: usize, const E: usize> Engine<'_, N, E> {
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

    pub(crate) fn abort_slot(&mut self, slot: u32) -> Result<Quarantined, AbortError> {
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

    pub(crate) fn quarantined(
        &self,
        slot: u32,
        s: Snapshot,
        cause: QuarantineCause,
    ) -> Quarantined {
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
}
