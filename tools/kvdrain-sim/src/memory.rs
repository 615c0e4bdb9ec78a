//! The simulated memory of one decode rank: per block, which request owns it and how many
//! posted WRITEs into it may still land. This is what turns "no block is reused while a
//! write into it may land" into a direct check rather than an inference from the
//! tracker's decisions.
//!
//! The free list is last-in first-out, so a block given back too early is the first one
//! handed to the next request: an early release shows up at once.

use std::fmt;

/// A breach of the memory invariant.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Breach {
    /// A block was given back while `writes` posted WRITEs into it may still land.
    FreedInFlight {
        /// The block.
        block: u32,
        /// WRITEs in flight.
        writes: u32,
    },
    /// A block was handed to a new request while WRITEs into it may still land.
    ReusedInFlight {
        /// The block.
        block: u32,
        /// WRITEs in flight.
        writes: u32,
    },
    /// A WRITE for `writer` landed in a block that `owner` holds (or nobody, if free).
    LandedForeign {
        /// The block.
        block: u32,
        /// Who holds it now.
        owner: Option<u64>,
        /// The request the WRITE was for.
        writer: u64,
    },
    /// A request gave back a block it does not hold.
    FreedForeign {
        /// The block.
        block: u32,
        /// Who holds it.
        owner: Option<u64>,
        /// Who gave it back.
        by: u64,
    },
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Breach::FreedInFlight { block, writes } => write!(
                f,
                "block {block} released while {writes} write(s) into it may still land"
            ),
            Breach::ReusedInFlight { block, writes } => write!(
                f,
                "block {block} reused while {writes} write(s) into it may still land"
            ),
            Breach::LandedForeign {
                block,
                owner,
                writer,
            } => write!(
                f,
                "write for request {writer} landed in block {block} held by {owner:?}"
            ),
            Breach::FreedForeign { block, owner, by } => {
                write!(f, "request {by} released block {block} held by {owner:?}")
            }
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Block {
    owner: Option<u64>,
    in_flight: u32,
}

/// The KV blocks of one decode rank.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    free: Vec<u32>,
}

impl BlockPool {
    /// `n` free blocks.
    pub fn new(n: u32) -> Self {
        BlockPool {
            blocks: vec![Block::default(); n as usize],
            free: (0..n).rev().collect(),
        }
    }

    /// Blocks not held by any request.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// WRITEs that may still land anywhere in this rank.
    pub fn writes_in_flight(&self) -> u64 {
        self.blocks.iter().map(|b| u64::from(b.in_flight)).sum()
    }

    /// Gives `n` blocks to `req`, or `None` (nothing taken) if fewer are free.
    pub fn alloc(&mut self, n: usize, req: u64, breaches: &mut Vec<Breach>) -> Option<Vec<u32>> {
        if self.free.len() < n {
            return None;
        }
        let taken = self.free.split_off(self.free.len() - n);
        for &b in &taken {
            let block = &mut self.blocks[b as usize];
            if block.in_flight > 0 {
                breaches.push(Breach::ReusedInFlight {
                    block: b,
                    writes: block.in_flight,
                });
            }
            block.owner = Some(req);
        }
        Some(taken)
    }

    /// A WRITE into `blocks` was posted: from now on it may land.
    pub fn write_posted(&mut self, blocks: &[u32]) {
        for &b in blocks {
            self.blocks[b as usize].in_flight += 1;
        }
    }

    /// Data of a WRITE for `req` lands in `blocks` (all of it, or part before a failure).
    pub fn write_lands(&mut self, blocks: &[u32], req: u64, breaches: &mut Vec<Breach>) {
        for &b in blocks {
            let owner = self.blocks[b as usize].owner;
            if owner != Some(req) {
                breaches.push(Breach::LandedForeign {
                    block: b,
                    owner,
                    writer: req,
                });
            }
        }
    }

    /// The WRITE into `blocks` is terminal: nothing more of it can land.
    pub fn write_ended(&mut self, blocks: &[u32]) {
        for &b in blocks {
            let block = &mut self.blocks[b as usize];
            block.in_flight = block.in_flight.saturating_sub(1);
        }
    }

    /// `req` gives its blocks back for reuse.
    pub fn free(&mut self, blocks: &[u32], req: u64, breaches: &mut Vec<Breach>) {
        for &b in blocks {
            let block = &mut self.blocks[b as usize];
            if block.owner != Some(req) {
                breaches.push(Breach::FreedForeign {
                    block: b,
                    owner: block.owner,
                    by: req,
                });
                continue;
            }
            if block.in_flight > 0 {
                breaches.push(Breach::FreedInFlight {
                    block: b,
                    writes: block.in_flight,
                });
            }
            block.owner = None;
            self.free.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BlockPool, Breach};

    #[test]
    fn early_release_and_reuse_are_caught() {
        let mut pool = BlockPool::new(4);
        let mut breaches = Vec::new();
        let a = pool.alloc(2, 1, &mut breaches).unwrap();
        pool.write_posted(&a);
        pool.free(&a, 1, &mut breaches);
        assert!(matches!(breaches[0], Breach::FreedInFlight { .. }));
        let b = pool.alloc(2, 2, &mut breaches).unwrap();
        assert_eq!(a, b, "last in, first out");
        assert!(matches!(breaches[2], Breach::ReusedInFlight { .. }));
        pool.write_lands(&a, 1, &mut breaches);
        assert!(matches!(
            breaches[4],
            Breach::LandedForeign { owner: Some(2), .. }
        ));
    }

    #[test]
    fn clean_lifecycle_has_no_breach() {
        let mut pool = BlockPool::new(2);
        let mut breaches = Vec::new();
        let a = pool.alloc(2, 7, &mut breaches).unwrap();
        assert!(pool.alloc(1, 8, &mut breaches).is_none());
        pool.write_posted(&a);
        pool.write_lands(&a, 7, &mut breaches);
        pool.write_ended(&a);
        pool.free(&a, 7, &mut breaches);
        assert!(breaches.is_empty());
        assert_eq!(pool.free_blocks(), 2);
    }
}
