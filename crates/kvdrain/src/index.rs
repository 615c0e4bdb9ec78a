//! The id → slot index: open addressing over `2N` buckets of one atomic word each.
//!
//! A bucket holds `EMPTY`, `DELETED`, or `tag << 17 | (slot + 1)`, where the tag is 15
//! bits of the id's fingerprint: a probe passes over other ids' buckets without reading
//! their slots (1 in 32 768 false matches, which the full fingerprint check in
//! `Shared::find` then rejects). Only the owner (engine thread) writes
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

/// Bits of a bucket that hold `slot + 1` (`N <= 65536`, so `slot + 1 <= 0x1_0000`; the
/// low bits of `DELETED`, `0x1_FFFF`, are never a slot).
const SLOT_BITS: u32 = 17;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
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

    /// Bucket `pos` (taken modulo `2N`): the halves are one contiguous run of `2N` words,
    /// so this is one masked index, whose bounds check the compiler removes.
    #[inline(always)]
    pub(crate) fn bucket(&self, pos: usize) -> &AtomicU32 {
        &self.halves.as_flattened()[pos & (Self::BUCKETS - 1)]
    }

    /// The bits of a live bucket that `fp`'s bucket has.
    #[inline]
    pub(crate) fn tag(fp: Fingerprint) -> u32 {
        ((fp.hi >> (64 - (32 - SLOT_BITS))) as u32) << SLOT_BITS
    }

    /// Whether live bucket `b` may be `fp`'s (its tag matches).
    #[inline]
    pub(crate) fn tag_matches(b: u32, tag: u32) -> bool {
        b & !SLOT_MASK == tag
    }

    /// The slot of live bucket `b`.
    #[inline]
    pub(crate) fn slot(b: u32) -> u32 {
        (b & SLOT_MASK) - 1
    }

    /// Owner: stores `slot` for `fp` in bucket `pos` (an `EMPTY` or `DELETED` bucket of
    /// `fp`'s chain, from [`Engine`](crate::Engine)'s probe).
    pub(crate) fn insert_at(&self, pos: usize, fp: Fingerprint, slot: u32) {
        self.bucket(pos)
            .store(Self::tag(fp) | (slot + 1), Ordering::Release);
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
