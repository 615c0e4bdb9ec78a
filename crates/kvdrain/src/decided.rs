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

/// The kind of a queued decision, packed with its slot in one entry. Bit 2 set: the
/// slot's last decision.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// `Failed`: a `Released` follows.
    Failed = 0,
    /// `Expired` in counting mode: a `Released` follows; the count owed is in the slot's
    /// record.
    ExpiredCount = 1,
    /// `Expired` in named-edge mode: a `Released` follows; the mask of agents owed is in
    /// the slot's record.
    ExpiredEdges = 2,
    /// `Completed`: the slot's last decision.
    Completed = LAST,
    /// `Released` after every edge resolved: the slot's last decision.
    Released = LAST | 1,
    /// `Released` because the quarantine ran out: the slot's last decision.
    ReleasedForced = LAST | 2,
}

const LAST: isize = 0b100;
const KIND_BITS: u32 = 3;
const KIND_MASK: u32 = (1 << KIND_BITS) - 1;

impl Kind {
    #[inline]
    fn from_bits(bits: u32) -> Kind {
        match bits {
            0 => Kind::Failed,
            1 => Kind::ExpiredCount,
            2 => Kind::ExpiredEdges,
            4 => Kind::Completed,
            5 => Kind::Released,
            _ => Kind::ReleasedForced,
        }
    }

    /// Whether this is the slot's last decision (the slot is recycled when it is handed
    /// out).
    #[inline]
    pub(crate) fn is_last(self) -> bool {
        self as isize & LAST != 0
    }
}

// A slot (< 65 536) and a kind fit one entry.
const _: () = assert!(65_536u64 << KIND_BITS <= u32::MAX as u64);

/// A FIFO of `(slot, kind)` entries with room for `2·N` (`N` a power of two, as every
/// [`Ledger`](crate::Ledger) has).
#[derive(Debug)]
pub(crate) struct Decided<const N: usize> {
    /// Position `p` (`0..2N`) lives at `entries[p / 2][p % 2]`.
    entries: [[u32; 2]; N],
    /// Next position to hand out, counting up and wrapping.
    head: u32,
    /// Next position to fill, counting up and wrapping.
    tail: u32,
}

impl<const N: usize> Decided<N> {
    /// Positions wrap at `2N`.
    const MASK: u32 = {
        assert!(N.is_power_of_two() && N <= 65_536);
        (2 * N - 1) as u32
    };

    pub(crate) fn new() -> Self {
        let _ = Self::MASK;
        Decided {
            entries: [[0; 2]; N],
            head: 0,
            tail: 0,
        }
    }

    /// Queues a decision of `slot` behind every earlier one.
    #[inline]
    pub(crate) fn push(&mut self, slot: u32, kind: Kind) {
        if self.len() == 2 * N {
            debug_assert!(
                false,
                "a slot made more than two decisions before its last one was handed out"
            );
            return;
        }
        let at = self.tail & Self::MASK;
        self.entries[(at >> 1) as usize][(at & 1) as usize] = (slot << KIND_BITS) | kind as u32;
        self.tail = self.tail.wrapping_add(1);
    }

    /// The oldest queued decision.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(u32, Kind)> {
        if self.head == self.tail {
            return None;
        }
        let at = self.head & Self::MASK;
        let entry = self.entries[(at >> 1) as usize][(at & 1) as usize];
        self.head = self.head.wrapping_add(1);
        Some((entry >> KIND_BITS, Kind::from_bits(entry & KIND_MASK)))
    }

    /// Decisions queued.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head) as usize
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
            Kind::ExpiredEdges,
            Kind::ReleasedForced,
            Kind::ExpiredCount,
            Kind::Completed,
        ];
        for round in 0..3u32 {
            let kinds = &kinds[round as usize % 3..][..4];
            for (i, &k) in kinds.iter().enumerate() {
                q.push(round * 10 + i as u32, k);
            }
            assert_eq!(q.len(), 4);
            for (i, &k) in kinds.iter().enumerate() {
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
        assert!(!Kind::ExpiredCount.is_last());
        assert!(!Kind::ExpiredEdges.is_last());
        for k in [0, 1, 2, 4, 5, 6] {
            assert_eq!(Kind::from_bits(k) as u32, k);
        }
    }
}
