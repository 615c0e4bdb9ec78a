//! The decided queue: decisions the engine has taken (its state transitions are done) and
//! not handed out yet, oldest first.
//!
//! Each entry names a slot and the kind of decision; the [`Decision`](crate::Decision)
//! itself is built at hand-out from the slot's owner record, which stays valid because a
//! slot goes back to the free list only when its last decision (`Completed` or
//! `Released`) is handed out. A slot makes at most two decisions between registration and
//! that hand-out (`Completed`; `Failed`, `Released`; `Expired`, `Released`), so `2·N`
//! entries always suffice and a push cannot fail while that invariant holds.
//!
//! Owner-only (engine thread): plain integers, no atomics.

/// The kind of a queued decision, packed with its slot in one entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// `Completed`: the slot's last decision.
    Completed = 0,
    /// `Failed`: a `Released` follows.
    Failed = 1,
    /// `Expired`: a `Released` follows; the owed edges are in the slot's record.
    Expired = 2,
    /// `Released` after every edge resolved: the slot's last decision.
    Released = 3,
    /// `Released` because the quarantine ran out: the slot's last decision.
    ReleasedForced = 4,
}

const KIND_BITS: u32 = 3;
const KIND_MASK: u32 = (1 << KIND_BITS) - 1;

impl Kind {
    fn from_bits(bits: u32) -> Kind {
        match bits {
            0 => Kind::Completed,
            1 => Kind::Failed,
            2 => Kind::Expired,
            3 => Kind::Released,
            _ => Kind::ReleasedForced,
        }
    }

    /// Whether this is the slot's last decision (the slot is recycled when it is handed
    /// out).
    pub(crate) fn is_last(self) -> bool {
        matches!(
            self,
            Kind::Completed | Kind::Released | Kind::ReleasedForced
        )
    }
}

// A slot (< 65 536) and a kind fit one entry.
const _: () = assert!(65_536u64 << KIND_BITS <= u32::MAX as u64);

/// A FIFO of `(slot, kind)` entries with room for `2·N`.
#[derive(Debug)]
pub(crate) struct Decided<const N: usize> {
    /// Position `p` (`0..2N`) lives at `entries[p / 2][p % 2]`.
    entries: [[u32; 2]; N],
    /// Next position to hand out.
    head: usize,
    /// Entries queued.
    len: usize,
}

impl<const N: usize> Decided<N> {
    pub(crate) fn new() -> Self {
        Decided {
            entries: [[0; 2]; N],
            head: 0,
            len: 0,
        }
    }

    /// Queues a decision of `slot` behind every earlier one.
    #[inline]
    pub(crate) fn push(&mut self, slot: u32, kind: Kind) {
        debug_assert!(
            self.len < 2 * N,
            "a slot made more than two decisions before its last one was handed out"
        );
        if self.len == 2 * N {
            return;
        }
        let mut at = self.head + self.len;
        if at >= 2 * N {
            at -= 2 * N;
        }
        self.entries[at / 2][at % 2] = (slot << KIND_BITS) | kind as u32;
        self.len += 1;
    }

    /// The oldest queued decision.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(u32, Kind)> {
        if self.len == 0 {
            return None;
        }
        let entry = self.entries[self.head / 2][self.head % 2];
        self.head += 1;
        if self.head == 2 * N {
            self.head = 0;
        }
        self.len -= 1;
        Some((entry >> KIND_BITS, Kind::from_bits(entry & KIND_MASK)))
    }

    /// Decisions queued.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_in_push_order_across_the_wrap() {
        let mut q: Decided<2> = Decided::new();
        let kinds = [
            Kind::Failed,
            Kind::Released,
            Kind::Expired,
            Kind::ReleasedForced,
            Kind::Completed,
        ];
        for round in 0..3u32 {
            for (i, &k) in kinds.iter().enumerate().take(4) {
                q.push(round * 10 + i as u32, k);
            }
            assert_eq!(q.len(), 4);
            for (i, &k) in kinds.iter().enumerate().take(4) {
                assert_eq!(q.pop(), Some((round * 10 + i as u32, k)));
            }
            assert_eq!(q.pop(), None);
            q.push(65_535, Kind::Completed);
            assert_eq!(q.pop(), Some((65_535, Kind::Completed)));
        }
    }

    #[test]
    fn only_completed_and_released_are_last() {
        assert!(Kind::Completed.is_last());
        assert!(Kind::Released.is_last());
        assert!(Kind::ReleasedForced.is_last());
        assert!(!Kind::Failed.is_last());
        assert!(!Kind::Expired.is_last());
    }
}
