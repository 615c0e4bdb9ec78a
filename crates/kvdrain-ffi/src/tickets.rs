//! Request keys to the core's `Pending` tickets.
//!
//! Rust callers hold each `Pending` ticket and give it up by value (abort) or see it end
//! in a decision; C callers hold a `uint64_t` key instead. This table keeps the ticket of
//! every key whose request is still counting, so that `abort(key)` can hand the real
//! ticket to the core, and so that a key whose ticket was used up reads as
//! `KVDRAIN_ERR_STALE` rather than reaching the core.
//!
//! Keys are the core's: a registration number above the request's slot in the low 16
//! bits (so that the core finds a record by key). Keys above every key issued read as
//! never issued; a made-up key below the last one issued cannot be told from a spent one
//! (the table keeps no history) and reads as spent. The table is open addressing on
//! `key & mask`, which is the slot: slots are reused last-freed first, so the live keys
//! sit in the low cells, mostly consecutive, with Robin Hood
//! ordering (along a probe run, cells sit no farther from home than the cells before them
//! allow) and backward-shift deletion. The ordering matters here: the live keys form one
//! long run of occupied cells, so a plain linear-probing table would scan the whole run on
//! every removal and every miss; with it a lookup stops at the first cell closer to its
//! home than the probe, and a removal at the first cell already at home, which with
//! mostly consecutive keys is the next one. The table has twice as many cells as the
//! ledger's capacity, and a ticket lives only while its request holds a slot, so it is at
//! most half full. It is allocated once, with the ledger.

use kvdrain::Pending;

/// Tickets of the requests still counting, by key.
#[derive(Debug)]
pub(crate) struct Tickets {
    /// `key + 1` per cell; 0 marks an empty cell. Probes read only this array. (Both
    /// arrays are reserved fallibly at their full length and never grown.)
    tags: Vec<u64>,
    /// The ticket of each occupied cell.
    tickets: Vec<Option<Pending>>,
    mask: usize,
    len: usize,
    /// One past the highest key issued: keys at or above it were never issued.
    issued: u64,
}

/// What became of a key looked up for an abort.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The ticket, now removed from the table.
    Live(Pending),
    /// The key was issued, but its ticket was used up (aborted, or decided).
    Spent,
    /// No registration ever got this key.
    NeverIssued,
}

impl Tickets {
    /// A table for `capacity` tickets at most, or `None` if its memory cannot be had.
    pub(crate) fn try_with_capacity(capacity: usize) -> Option<Self> {
        let cells = (2 * capacity.max(1)).next_power_of_two();
        let mut tags = Vec::new();
        tags.try_reserve_exact(cells).ok()?;
        tags.resize(cells, 0);
        let mut tickets = Vec::new();
        tickets.try_reserve_exact(cells).ok()?;
        tickets.resize_with(cells, || None);
        Some(Tickets {
            tags,
            tickets,
            mask: cells - 1,
            len: 0,
            issued: 0,
        })
    }

    /// [`try_with_capacity`](Self::try_with_capacity) for tests.
    #[cfg(test)]
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self::try_with_capacity(capacity).expect("memory for a test's ticket table")
    }

    /// How far the occupied cell at `pos` sits from its home cell.
    #[inline]
    fn displacement(&self, pos: usize) -> usize {
        pos.wrapping_sub((self.tags[pos] - 1) as usize) & self.mask
    }

    /// Keeps the ticket of a fresh registration.
    ///
    /// # Panics
    /// If the table is full, which the capacity bound rules out (an internal invariant;
    /// the FFI boundary turns it into `KVDRAIN_ERR_PANIC`).
    pub(crate) fn insert(&mut self, ticket: Pending) {
        let key = ticket.key().get();
        assert!(self.len < self.tags.len(), "ticket table full");
        self.issued = self.issued.max(key + 1);
        self.len += 1;
        let home = key as usize & self.mask;
        if self.tags[home] == 0 {
            // The common case: consecutive keys, the key `mask + 1` before this one gone.
            self.tags[home] = key + 1;
            self.tickets[home] = Some(ticket);
            return;
        }
        let mut tag = key + 1;
        let mut ticket = Some(ticket);
        let mut pos = key as usize & self.mask;
        let mut distance = 0;
        while self.tags[pos] != 0 {
            // Robin Hood: the cell closer to its home gives way to the one farther away.
            let theirs = self.displacement(pos);
            if theirs < distance {
                core::mem::swap(&mut self.tags[pos], &mut tag);
                core::mem::swap(&mut self.tickets[pos], &mut ticket);
                distance = theirs;
            }
            pos = (pos + 1) & self.mask;
            distance += 1;
        }
        self.tags[pos] = tag;
        self.tickets[pos] = ticket;
    }

    /// Removes and returns the ticket of `key`.
    pub(crate) fn take(&mut self, key: u64) -> Lookup {
        if key >= self.issued {
            return Lookup::NeverIssued;
        }
        let tag = key + 1;
        let mut pos = key as usize & self.mask;
        let mut distance = 0;
        loop {
            let here = self.tags[pos];
            if here == tag {
                let ticket = self.tickets[pos].take();
                self.remove_at(pos);
                return ticket.map_or(Lookup::Spent, Lookup::Live);
            }
            if here == 0 || self.displacement(pos) < distance || distance > self.mask {
                return Lookup::Spent;
            }
            pos = (pos + 1) & self.mask;
            distance += 1;
        }
    }

    /// Drops the ticket of a request that was decided (if it is still here).
    #[inline]
    pub(crate) fn forget(&mut self, key: u64) {
        let home = key as usize & self.mask;
        if self.tags[home] == key + 1 {
            // The common case: the ticket sits in its home cell and nothing after it
            // needs to shift back.
            self.tickets[home] = None;
            let next = (home + 1) & self.mask;
            if self.tags[next] == 0 || self.displacement(next) == 0 {
                self.tags[home] = 0;
                self.len -= 1;
            } else {
                self.remove_at(home);
            }
        } else {
            let _ = self.take(key);
        }
    }

    /// Tickets held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Empties cell `hole` and shifts the displaced cells after it back by one, up to the
    /// first empty cell or cell at home, so the Robin Hood order holds without
    /// tombstones.
    fn remove_at(&mut self, mut hole: usize) {
        self.len -= 1;
        loop {
            let next = (hole + 1) & self.mask;
            if self.tags[next] == 0 || self.displacement(next) == 0 {
                self.tags[hole] = 0;
                return;
            }
            self.tags[hole] = self.tags[next];
            self.tickets[hole] = self.tickets[next].take();
            hole = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvdrain::{BlockHandle, Config, Expect, Ledger, Registration};

    /// Real tickets from a small ledger (their fields are private to the core).
    fn tickets(ledger: &mut Ledger<64, 8>, n: usize) -> Vec<Pending> {
        (0..n)
            .map(|i| {
                ledger
                    .register(Registration {
                        id: &format!("r{i}"),
                        blocks: BlockHandle(i as u64),
                        expect: Expect::Count(1),
                        deadline: None,
                    })
                    .expect("room")
            })
            .collect()
    }

    #[test]
    fn keys_come_back_once_then_read_as_spent() {
        let mut ledger = Ledger::<64, 8>::new(Config::with_capacity(64));
        let mut t = Tickets::with_capacity(4);
        let mut keys = Vec::new();
        for ticket in tickets(&mut ledger, 3) {
            keys.push(ticket.key().get());
            t.insert(ticket);
        }
        assert_eq!(t.len(), 3);
        assert!(matches!(t.take(keys[1]), Lookup::Live(c) if c.key().get() == keys[1]));
        assert_eq!(t.take(keys[1]), Lookup::Spent);
        // The next registration number, in any slot, was never issued.
        assert_eq!(t.take((keys[2] | 0xFFFF) + 1), Lookup::NeverIssued);
        t.forget(keys[0]);
        assert_eq!(t.take(keys[0]), Lookup::Spent);
        assert!(matches!(t.take(keys[2]), Lookup::Live(_)));
        assert_eq!(t.len(), 0);
    }

    /// Keys that collide (same `key & mask`) and wrap around the end of the table stay
    /// reachable after any removal order, and spent keys read as spent: checked against a
    /// plain list.
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
                assert_eq!(t.take(victim), Lookup::Spent);
            }
            live.push(ticket.key().get());
            t.insert(ticket);
            for &k in &live {
                let mut pos = k as usize & t.mask;
                while t.tags[pos] != k + 1 {
                    assert_ne!(t.tags[pos], 0, "key {k} unreachable");
                    pos = (pos + 1) & t.mask;
                }
            }
            // The Robin Hood order: along a run, displacement grows by at most one.
            for pos in 0..t.tags.len() {
                let next = (pos + 1) & t.mask;
                if t.tags[next] != 0 && t.displacement(next) > 0 {
                    assert_ne!(t.tags[pos], 0, "displaced cell after a hole");
                    assert!(t.displacement(next) <= t.displacement(pos) + 1);
                }
            }
            assert_eq!(t.len(), live.len());
        }
    }
}
