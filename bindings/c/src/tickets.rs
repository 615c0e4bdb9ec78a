//! Request keys to the core's `Counting` tickets.
//!
//! Rust callers hold each `Counting` ticket and give it up by value (abort) or see it end
//! in a decision; C callers hold a `uint64_t` key instead. This table keeps the ticket of
//! every key whose request is still counting, so that `abort(key)` can hand the real
//! ticket to the core, and so that a key whose ticket was used up reads as
//! `KVDRAIN_ERR_STALE` rather than reaching the core.
//!
//! Keys are the core's registration numbers (0, 1, 2, ...). The table is open addressing
//! with linear probing on `key & mask` (consecutive keys land in consecutive cells) and
//! backward-shift deletion; it has twice as many cells as the ledger's capacity, and a
//! ticket lives only while its request holds a slot, so it is at most half full. It is
//! allocated once, with the ledger.

use kvdrain::Counting;

#[derive(Debug, Default)]
struct Cell {
    /// `key + 1`; 0 marks an empty cell.
    tag: u64,
    ticket: Option<Counting>,
}

/// Tickets of the requests still counting, by key.
#[derive(Debug)]
pub(crate) struct Tickets {
    cells: Box<[Cell]>,
    mask: usize,
    len: usize,
    /// One past the highest key issued: keys at or above it were never issued.
    issued: u64,
}

/// What became of a key looked up for an abort.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The ticket, now removed from the table.
    Live(Counting),
    /// The key was issued, but its ticket was used up (aborted, or decided).
    Spent,
    /// No registration ever got this key.
    NeverIssued,
}

impl Tickets {
    /// A table for `capacity` tickets at most.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let cells = (2 * capacity.max(1)).next_power_of_two();
        Tickets {
            cells: (0..cells).map(|_| Cell::default()).collect(),
            mask: cells - 1,
            len: 0,
            issued: 0,
        }
    }

    /// Keeps the ticket of a fresh registration.
    ///
    /// # Panics
    /// If the table is full, which the capacity bound rules out (an internal invariant;
    /// the FFI boundary turns it into `KVDRAIN_ERR_PANIC`).
    pub(crate) fn insert(&mut self, ticket: Counting) {
        let key = ticket.key().get();
        assert!(self.len < self.cells.len(), "ticket table full");
        self.issued = self.issued.max(key + 1);
        let mut pos = key as usize & self.mask;
        while self.cells[pos].tag != 0 {
            pos = (pos + 1) & self.mask;
        }
        self.cells[pos] = Cell {
            tag: key + 1,
            ticket: Some(ticket),
        };
        self.len += 1;
    }

    /// Removes and returns the ticket of `key`.
    pub(crate) fn take(&mut self, key: u64) -> Lookup {
        if key >= self.issued {
            return Lookup::NeverIssued;
        }
        let mut pos = key as usize & self.mask;
        for _ in 0..self.cells.len() {
            let tag = self.cells[pos].tag;
            if tag == 0 {
                return Lookup::Spent;
            }
            if tag == key + 1 {
                let ticket = self.cells[pos].ticket.take();
                self.remove_at(pos);
                return ticket.map_or(Lookup::Spent, Lookup::Live);
            }
            pos = (pos + 1) & self.mask;
        }
        Lookup::Spent
    }

    /// Drops the ticket of a request that was decided (if it is still here).
    pub(crate) fn forget(&mut self, key: u64) {
        let _ = self.take(key);
    }

    /// Tickets held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Empties cell `hole` and shifts later cells of its probe run back, so every kept
    /// key stays reachable from its home cell without tombstones.
    fn remove_at(&mut self, mut hole: usize) {
        self.cells[hole].tag = 0;
        self.len -= 1;
        let mut pos = (hole + 1) & self.mask;
        loop {
            let tag = self.cells[pos].tag;
            if tag == 0 {
                return;
            }
            let home = (tag - 1) as usize & self.mask;
            // The cell may move into the hole if its home is not cyclically in
            // (hole, pos].
            let dist_home = pos.wrapping_sub(home) & self.mask;
            let dist_hole = pos.wrapping_sub(hole) & self.mask;
            if dist_home >= dist_hole {
                let moved = core::mem::take(&mut self.cells[pos]);
                self.cells[hole] = moved;
                hole = pos;
            }
            pos = (pos + 1) & self.mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvdrain::{BlockHandle, Config, Expect, Ledger, Registration};

    /// Real tickets from a small ledger (their fields are private to the core).
    fn tickets(ledger: &mut Ledger<64, 8>, n: usize) -> Vec<Counting> {
        (0..n)
            .map(|i| {
                ledger
                    .register(Registration {
                        id: &format!("r{i}"),
                        blocks: BlockHandle(i as u64),
                        expect: Expect::Count(1),
                        deadline_ms: None,
                    })
                    .expect("room")
            })
            .collect()
    }

    #[test]
    fn keys_come_back_once_then_read_as_spent() {
        let mut ledger = Ledger::<64, 8>::new(Config::with_capacity(64));
        let mut t = Tickets::with_capacity(4);
        for ticket in tickets(&mut ledger, 3) {
            t.insert(ticket);
        }
        assert_eq!(t.len(), 3);
        assert!(matches!(t.take(1), Lookup::Live(c) if c.key().get() == 1));
        assert_eq!(t.take(1), Lookup::Spent);
        assert_eq!(t.take(3), Lookup::NeverIssued);
        t.forget(0);
        assert_eq!(t.take(0), Lookup::Spent);
        assert!(matches!(t.take(2), Lookup::Live(_)));
        assert_eq!(t.len(), 0);
    }

    /// Keys that collide (same `key & mask`) and wrap around the end of the table stay
    /// reachable after any removal order: checked against a plain list.
    #[test]
    fn backward_shift_keeps_every_colliding_key_reachable() {
        let mut ledger = Ledger::<64, 8>::new(Config::with_capacity(64));
        let all = tickets(&mut ledger, 40);
        // 8 cells: keys k, k+8, k+16, ... share a home; 4 live at most.
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut t = Tickets::with_capacity(4);
        let mut live: Vec<u64> = Vec::new();
        for ticket in all {
            if live.len() == 4 {
                let victim = live.swap_remove(next() as usize % live.len());
                assert!(matches!(t.take(victim), Lookup::Live(c) if c.key().get() == victim));
            }
            live.push(ticket.key().get());
            t.insert(ticket);
            for &k in &live {
                let mut pos = k as usize & t.mask;
                while t.cells[pos].tag != k + 1 {
                    assert_ne!(t.cells[pos].tag, 0, "key {k} unreachable");
                    pos = (pos + 1) & t.mask;
                }
            }
            assert_eq!(t.len(), live.len());
        }
    }
}
