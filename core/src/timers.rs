//! Deadlines: an indexed binary min-heap of slots keyed by `(due, registration order)`.
//!
//! Each slot has at most one timer (its deadline while counting, its quarantine end while
//! aborted or expired). Setting, moving and cancelling a timer are `O(log N)`; a clock
//! advance costs `O(k log N)` for the `k` timers that fire, and nothing for the others
//! (catalogue F14: the sweep visits every due deadline because the heap is ordered by the
//! current deadline, not by insertion).

use crate::Millis;

const NONE: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Timers<const N: usize> {
    heap: [u32; N],
    len: usize,
    /// Position of each slot in `heap`, or `NONE`.
    pos: [u32; N],
    due: [Millis; N],
    order: [u64; N],
}

impl<const N: usize> Timers<N> {
    pub(crate) fn new() -> Self {
        Timers {
            heap: [0; N],
            len: 0,
            pos: [NONE; N],
            due: [0; N],
            order: [0; N],
        }
    }

    fn less(&self, a: u32, b: u32) -> bool {
        let (a, b) = (a as usize, b as usize);
        (self.due[a], self.order[a]) < (self.due[b], self.order[b])
    }

    fn place(&mut self, at: usize, slot: u32) {
        self.heap[at] = slot;
        self.pos[slot as usize] = at as u32;
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
    pub(crate) fn set(&mut self, slot: u32, due: Millis, order: u64) {
        let s = slot as usize;
        self.due[s] = due;
        self.order[s] = order;
        if self.pos[s] == NONE {
            let at = self.len;
            self.len += 1;
            self.place(at, slot);
            self.sift_up(at);
        } else {
            let at = self.pos[s] as usize;
            self.sift_up(at);
            self.sift_down(self.pos[s] as usize);
        }
    }

    /// Disarms `slot`'s timer if it has one.
    pub(crate) fn cancel(&mut self, slot: u32) {
        let at = self.pos[slot as usize];
        if at == NONE {
            return;
        }
        self.pos[slot as usize] = NONE;
        self.len -= 1;
        let at = at as usize;
        if at == self.len {
            return;
        }
        let last = self.heap[self.len];
        self.place(at, last);
        self.sift_up(at);
        self.sift_down(self.pos[last as usize] as usize);
    }

    /// Removes and returns a slot whose timer is due at `now`, earliest first.
    pub(crate) fn pop_due(&mut self, now: Millis) -> Option<u32> {
        let top = *self.heap[..self.len].first()?;
        if self.due[top as usize] > now {
            return None;
        }
        self.cancel(top);
        Some(top)
    }

    /// When the next timer fires, if any.
    pub(crate) fn next_due(&self) -> Option<Millis> {
        self.heap[..self.len].first().map(|&s| self.due[s as usize])
    }
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::Timers;

    #[test]
    fn fires_in_due_then_order_and_skips_cancelled() {
        let mut t = Timers::<8>::new();
        t.set(0, 50, 0);
        t.set(1, 10, 1);
        t.set(2, 10, 2);
        t.set(3, 30, 3);
        t.set(4, 5, 4);
        t.cancel(3);
        t.set(0, 1, 0); // moved earlier
        assert_eq!(t.next_due(), Some(1));
        let mut fired = std::vec::Vec::new();
        while let Some(s) = t.pop_due(20) {
            fired.push(s);
        }
        assert_eq!(fired, [0, 4, 1, 2]);
        assert_eq!(t.pop_due(1000), None);
    }

    #[test]
    fn random_operations_match_a_sorted_list() {
        let mut t = Timers::<64>::new();
        let mut model: std::vec::Vec<(u64, u64, u32)> = std::vec::Vec::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let slot = (x % 64) as u32;
            match (x >> 8) % 3 {
                0 => {
                    let due = (x >> 16) % 1000;
                    t.set(slot, due, step);
                    model.retain(|e| e.2 != slot);
                    model.push((due, step, slot));
                }
                1 => {
                    t.cancel(slot);
                    model.retain(|e| e.2 != slot);
                }
                _ => {
                    let now = (x >> 16) % 1000;
                    model.sort_unstable();
                    while let Some(s) = t.pop_due(now) {
                        assert_eq!(model.first().map(|e| e.2), Some(s));
                        model.remove(0);
                    }
                    assert!(model.first().is_none_or(|e| e.0 > now));
                }
            }
        }
    }
}
