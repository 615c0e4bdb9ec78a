//! The virtual clock's agenda: events ordered by due time, ties broken by the order they
//! were scheduled, so a run depends on nothing but the seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

struct Entry<E> {
    at: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Pending events of type `E`.
pub struct Agenda<E> {
    heap: BinaryHeap<Reverse<Entry<E>>>,
    seq: u64,
}

impl<E> Agenda<E> {
    /// An empty agenda.
    pub fn new() -> Self {
        Agenda {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: u64, event: E) {
        self.seq += 1;
        self.heap.push(Reverse(Entry {
            at,
            seq: self.seq,
            event,
        }));
    }

    /// When the next event is due.
    pub fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// Takes the next event.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        self.heap.pop().map(|Reverse(e)| (e.at, e.event))
    }

    /// Events still pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

impl<E> std::fmt::Debug for Agenda<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agenda")
            .field("pending", &self.heap.len())
            .field("scheduled", &self.seq)
            .finish()
    }
}

impl<E> Default for Agenda<E> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Agenda;

    #[test]
    fn time_order_then_schedule_order() {
        let mut a = Agenda::new();
        a.push(5, "late");
        a.push(1, "first");
        a.push(1, "second");
        assert_eq!(a.pop(), Some((1, "first")));
        assert_eq!(a.pop(), Some((1, "second")));
        assert_eq!(a.pop(), Some((5, "late")));
        assert!(a.is_empty());
    }
}
