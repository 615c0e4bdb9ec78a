//! The clock on the engine half: [`advance`](crate::Engine::advance) publishes it for the
//! ingest thread's failure-notice stamps and fires every timer due (deadlines, settle
//! ends, quarantine ends) in registration order.

use crate::Engine;
use crate::decided::Kind;
use crate::error::ClockError;
use crate::owner::HistoryFlags;
use crate::stamp;
use crate::state_word::{Phase, Quarantine};
use crate::sync::Ordering;
use crate::ticket::{Outstanding, QuarantineCause};
use crate::time::Instant;

impl<const N: usize, const E: usize> Engine<'_, N, E> {
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
    pub(crate) fn fire_due(&mut self, now: Instant) {
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
}
