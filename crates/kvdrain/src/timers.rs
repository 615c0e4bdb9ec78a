//! Deadlines: an indexed binary min-heap of slots keyed by `(due, registration order)`,
//! plus a FIFO list for the common timer whose due time never decreases from one to the
//! next (the default deadline, `now + Config::deadline`).
//!
//! Each slot has at most one timer (its deadline while counting, its quarantine end while
//! aborted or expired), in the heap or in the list. Heap timers are set, moved and
//! cancelled in `O(log N)`; list timers are appended and cancelled in `O(1)`, which is
//! what keeps a registration and a decision from paying a heap sift (most requests are
//! decided long before their deadline, usually oldest first, i.e. from the heap's root).
//! The list stays sorted by `(due, order)` because its timers are appended in that order.
//! A clock advance costs `O(k log N)` for the `k` timers that fire, and nothing for the
//! others (catalogue F14: the sweep visits every due deadline because both structures are
//! ordered by the current deadline, not by insertion).

use crate::time::Instant;

const NONE: u32 = u32::MAX;
/// `pos` of a slot whose timer is in the FIFO list.
const LISTED: u32 = u32::MAX - 1;

#[derive(Debug)]
pub(crate) struct Timers<const N: usize> {
    heap: [u32; N],
    len: usize,
    /// Per slot, everything about its timer in one place (one cache line to touch).
    timer: [Timer; N],
    /// Ends of the FIFO list (`NONE` when empty).
    head: u32,
    tail: u32,
}

/// One slot's timer.
#[derive(Clone, Copy, Debug)]
struct Timer {
    due: Instant,
    order: u64,
    /// Position in `heap`, `LISTED`, or `NONE`.
    pos: u32,
    /// FIFO list links (`NONE` at the ends); the list is sorted by `(due, order)`.
    next: u32,
    prev: u32,
}

const UNARMED: Timer = Timer {
    due: Instant::ZERO,
    order: 0,
    pos: NONE,
    next: NONE,
    prev: NONE,
};

impl<const N: usize> Timers<N> {
    pub(crate) fn new() -> Self {
        Timers {
            heap: [0; N],
            len: 0,
            timer: [UNARMED; N],
            head: NONE,
            tail: NONE,
        }
    }

    fn less(&self, a: u32, b: u32) -> bool {
        let (a, b) = (a as usize, b as usize);
        (self.timer[a].due, self.timer[a].order) < (self.timer[b].due, self.timer[b].order)
    }

    fn place(&mut self, at: usize, slot: u32) {
        self.heap[at] = slot;
        self.timer[slot as usize].pos = at as u32;
    }

    fn sift_up(&mut self, mut at: usize) {
        let slot = self.heap[at];
        while at > 0 {
            let parent = (at - 1) / 2;
            if !self.less(slot, self.heap[parent]) {
                break;
            }
            self.place(at, self.heap[parent]);
            at = parent;
        }
        self.place(at, slot);
    }

    fn sift_down(&mut self, mut at: usize) {
        let slot = self.heap[at];
        loop {
            let left = 2 * at + 1;
            if left >= self.len {
                break;
            }
            let right = left + 1;
            let child = if right < self.len && self.less(self.heap[right], self.heap[left]) {
                right
            } else {
                left
            };
            if !self.less(self.heap[child], slot) {
                break;
            }
            self.place(at, self.heap[child]);
            at = child;
        }
        self.place(at, slot);
    }

    /// Arms (or moves) `slot`'s timer to fire at `due`; `order` breaks ties.
    pub(crate) fn set(&mut self, slot: u32, due: Instant, order: u64) {
        let s = slot as usize;
        if self.timer[s].pos == LISTED {
            self.unlink(slot);
        }
        self.timer[s].due = due;
        self.timer[s].order = order;
        if self.timer[s].pos == NONE {
            let at = self.len;
            self.len += 1;
            self.place(at, slot);
            self.sift_up(at);
        } else {
            let at = self.timer[s].pos as usize;
            self.sift_up(at);
            self.sift_down(self.timer[s].pos as usize);
        }
    }

    /// Arms `slot`'s timer (it has none) in the FIFO list: `O(1)`. `(due, order)` must
    /// not sort before that of any timer still in the list (true of `now + constant`
    /// with a clock that never goes back and increasing `order`).
    pub(crate) fn push_back(&mut self, slot: u32, due: Instant, order: u64) {
        let s = slot as usize;
        debug_assert_eq!(self.timer[s].pos, NONE, "slot already has a timer");
        debug_assert!(
            self.tail == NONE
                || (
                    self.timer[self.tail as usize].due,
                    self.timer[self.tail as usize].order
                ) <= (due, order),
            "FIFO timers must be appended in (due, order) order"
        );
        self.timer[s].due = due;
        self.timer[s].order = order;
        self.timer[s].pos = LISTED;
        self.timer[s].prev = self.tail;
        self.timer[s].next = NONE;
        match self.tail {
            NONE => self.head = slot,
            tail => self.timer[tail as usize].next = slot,
        }
        self.tail = slot;
    }

    /// Takes `slot` (listed) out of the FIFO list.
    #[inline]
    fn unlink(&mut self, slot: u32) {
        let s = slot as usize;
        let (prev, next) = (self.timer[s].prev, self.timer[s].next);
        match prev {
            NONE => self.head = next,
            p => self.timer[p as usize].next = next,
        }
        match next {
            NONE => self.tail = prev,
            n => self.timer[n as usize].prev = prev,
        }
        self.timer[s].pos = NONE;
    }

    /// Disarms `slot`'s timer if it has one. Inlined: a decided request's timer is
    /// usually in the FIFO list, and unlinking it is a few stores.
    #[inline]
    pub(crate) fn cancel(&mut self, slot: u32) {
        match self.timer[slot as usize].pos {
            NONE => {}
            LISTED => self.unlink(slot),
            at => self.remove_from_heap(slot, at as usize),
        }
    }

    /// Takes `slot`, at `at` in the heap, out of it.
    fn remove_from_heap(&mut self, slot: u32, at: usize) {
        self.timer[slot as usize].pos = NONE;
        self.len -= 1;
        if at == self.len {
            return;
        }
        let last = self.heap[self.len];
        self.place(at, last);
        self.sift_up(at);
        self.sift_down(self.timer[last as usize].pos as usize);
    }

    /// The slot whose timer fires first: the heap's top or the list's head.
    fn first(&self) -> Option<u32> {
        match (self.heap[..self.len].first(), self.head) {
            (None, NONE) => None,
            (Some(&top), NONE) => Some(top),
            (None, head) => Some(head),
            (Some(&top), head) => Some(if self.less(head, top) { head } else { top }),
        }
    }

    /// Removes and returns a slot whose timer is due at `now`, earliest first.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<u32> {
        let first = self.first()?;
        if self.timer[first as usize].due > now {
            return None;
        }
        self.cancel(first);
        Some(first)
    }

    /// When `slot`'s timer fires, if it has one.
    pub(crate) fn due(&self, slot: u32) -> Option<Instant> {
        let t = &self.timer[slot as usize];
        (t.pos != NONE).then_some(t.due)
    }

    /// When the next timer fires, if any.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.first().map(|s| self.timer[s as usize].due)
    }
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::Timers;
    use crate::time::Instant;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn fires_in_due_then_order_and_skips_cancelled() {
        let mut t = Timers::<8>::new();
        t.set(0, at(50), 0);
        t.set(1, at(10), 1);
        t.set(2, at(10), 2);
        t.set(3, at(30), 3);
        t.set(4, at(5), 4);
        t.cancel(3);
        t.set(0, at(1), 0); // moved earlier
        assert_eq!(t.next_due(), Some(at(1)));
        let mut fired = std::vec::Vec::new();
        while let Some(s) = t.pop_due(at(20)) {
            fired.push(s);
        }
        assert_eq!(fired, [0, 4, 1, 2]);
        assert_eq!(t.pop_due(at(1000)), None);
    }

    #[test]
    fn random_operations_match_a_sorted_list() {
        let mut t = Timers::<64>::new();
        let mut model: std::vec::Vec<(u64, u64, u32)> = std::vec::Vec::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        // FIFO timers: `now + 300`, with `now` the last clock value popped at.
        let mut fifo_due = 0u64;
        let steps = if cfg!(miri) { 4_000 } else { 40_000u64 };
        for step in 0..steps {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let slot = (x % 64) as u32;
            match (x >> 8) % 4 {
                3 => {
                    if !model.iter().any(|e| e.2 == slot) {
                        t.push_back(slot, at(fifo_due), step);
                        model.push((fifo_due, step, slot));
                    }
                }
                0 => {
                    let due = (x >> 16) % 1000;
                    t.set(slot, at(due), step);
                    model.retain(|e| e.2 != slot);
                    model.push((due, step, slot));
                }
                1 => {
                    t.cancel(slot);
                    model.retain(|e| e.2 != slot);
                }
                _ => {
                    let now = (x >> 16) % 1000;
                    fifo_due = fifo_due.max(now + 300);
                    model.sort_unstable();
                    assert_eq!(t.next_due(), model.first().map(|e| at(e.0)));
                    while let Some(s) = t.pop_due(at(now)) {
                        assert_eq!(model.first().map(|e| e.2), Some(s));
                        model.remove(0);
                    }
                    assert!(model.first().is_none_or(|e| e.0 > now));
                }
            }
        }
    }
}
