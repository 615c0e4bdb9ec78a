//! The id → slot index: open addressing over `2N` buckets of one atomic word each.
//!
//! A bucket holds `EMPTY`, `DELETED`, or `slot + 1`. Only the owner (engine thread) writes
//! buckets; readers (the ingest thread) probe concurrently. Entries never move, so a
//! reader cannot miss an entry that stays put while it probes: a concurrent insert or
//! removal of *another* id can only turn a bucket it passes into `DELETED`, which it skips.
//! A `DELETED` bucket turns back into `EMPTY` only when the bucket after it is `EMPTY`,
//! i.e. when no probe chain runs through it.
//!
//! Load factor is at most ½ (`N` live requests in `2N` buckets), so expected probe length
//! is below 1.5 for hits and 2.5 for misses.

use crate::fingerprint::Fingerprint;
use crate::sync::{AtomicU32, Ordering};

pub(crate) const EMPTY: u32 = 0;
pub(crate) const DELETED: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Index<const N: usize> {
    /// `2N` buckets as two halves (const generics cannot say `2 * N`).
    halves: [[AtomicU32; N]; 2],
}

impl<const N: usize> Index<N> {
    pub(crate) fn new() -> Self {
        Index {
            halves: [crate::sync::zeroed(), crate::sync::zeroed()],
        }
    }

    pub(crate) const BUCKETS: usize = 2 * N;

    pub(crate) fn home(fp: Fingerprint) -> usize {
        (fp.lo as usize) & (Self::BUCKETS - 1)
    }

    pub(crate) fn next(pos: usize) -> usize {
        (pos + 1) & (Self::BUCKETS - 1)
    }

    pub(crate) fn bucket(&self, pos: usize) -> &AtomicU32 {
        &self.halves[pos / N][pos % N]
    }

    /// Owner: stores `slot` in the first reusable bucket of `fp`'s chain (the caller has
    /// checked the id is not present). Returns the bucket position.
    pub(crate) fn insert(&self, fp: Fingerprint, slot: u32) -> usize {
        let mut pos = Self::home(fp);
        // At most N of the 2N buckets are live, so a reusable bucket exists.
        loop {
            let b = self.bucket(pos).load(Ordering::Relaxed);
            if b == EMPTY || b == DELETED {
                self.bucket(pos).store(slot + 1, Ordering::Release);
                return pos;
            }
            pos = Self::next(pos);
        }
    }

    /// Owner: removes the entry at `pos`, then turns trailing `DELETED` buckets back into
    /// `EMPTY` where no chain can run through them.
    pub(crate) fn remove(&self, pos: usize) {
        self.bucket(pos).store(DELETED, Ordering::Release);
        if self.bucket(Self::next(pos)).load(Ordering::Relaxed) != EMPTY {
            return;
        }
        let mut p = pos;
        for _ in 0..Self::BUCKETS {
            if self.bucket(p).load(Ordering::Relaxed) != DELETED {
                break;
            }
            self.bucket(p).store(EMPTY, Ordering::Release);
            p = (p + Self::BUCKETS - 1) & (Self::BUCKETS - 1);
        }
    }
}
