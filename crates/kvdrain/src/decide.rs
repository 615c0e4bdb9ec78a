//! Deciding on the engine half: a request whose every edge resolved is decided, settles
//! (rule 8) if a failure notice or a `gone` says so, and is released; a quarantine that
//! runs out forces the release; a released request is retired from the index and timers.

use crate::Engine;
use crate::decided::Kind;
use crate::owner::{HistoryFlags, Owner};
use crate::stamp;
use crate::state_word::{ForceFree, Phase, Snapshot};
use crate::time::Instant;

impl<const N: usize, const E: usize> Engine<'_, N, E> {
    /// Every edge of `slot` is resolved (`s.outstanding() == 0`): decide, then release and
    /// free at once or, if a failure notice has not settled yet (rule 8), when it has.
    pub(crate) fn decide_drained(&mut self, slot: u32, s: Snapshot) {
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
    pub(crate) fn settle_end(&self, slot: u32, s: Snapshot) -> Instant {
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
    pub(crate) fn stamped_at(&self, stamp: u32) -> Instant {
        stamp::read(stamp, self.owner.now)
    }

    /// Releases and frees drained `slot` (`s.outstanding() == 0`).
    // Out of line, like `force_release`: with `retire` inlined they would make `advance`
    // a larger function whose every call, idle ones too, saves more registers.
    #[inline(never)]
    pub(crate) fn release_drained(&mut self, slot: u32, s: Snapshot, forced: bool) {
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
    pub(crate) fn force_release(&mut self, slot: u32) {
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

    /// Remembers the id and unlinks it from the index and the timers (the caller frees the
    /// state word and queues the last decision; the slot goes back to the free list when
    /// that decision is handed out, so its record stays valid until then).
    #[inline(always)]
    pub(crate) fn retire(&mut self, slot: u32) {
        let o = &mut *self.owner;
        let r = &mut o.requests[slot as usize];
        self.shared.tombstones.insert(&mut o.ages, r.fp);
        self.shared.index.remove(r.bucket as usize);
        o.timers.cancel(slot);
        r.live = false;
        r.settling = false;
        o.live -= 1;
    }

    pub(crate) fn sort_batch(&mut self, len: usize) {
        let Owner {
            batch, requests, ..
        } = &mut *self.owner;
        batch[..len].sort_unstable_by_key(|&slot| requests[slot as usize].key);
    }
}
