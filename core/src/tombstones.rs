//! Tombstones: fingerprints of recently decided requests, so a late notice is reported as
//! `late` rather than `unknown`. They live outside the request slots and cost no capacity.
//!
//! `N` sets of 4 ways (4·N entries, one 32-byte line per set); a set is chosen by
//! fingerprint bits and its ways are replaced in turn, oldest insertion first. Entries are
//! 64-bit fingerprint halves stored as two atomics: the ingest thread reads them while the
//! owner writes, and a torn read can only turn one `late` into `unknown` (both create no
//! state and change no request).

use crate::fingerprint::Fingerprint;
use crate::sync::{AtomicU32, Ordering};

const WAYS: usize = 4;

#[derive(Debug)]
pub(crate) struct Tombstones<const N: usize> {
    /// `[lo, hi]` halves of `fp.hi | 1` (never 0, so 0 means an empty way).
    ways: [[[AtomicU32; 2]; WAYS]; N],
}

/// Owner-only: the way of each set that the next insertion replaces (its oldest).
#[derive(Debug)]
pub(crate) struct TombstoneAges<const N: usize> {
    next: [u8; N],
}

impl<const N: usize> TombstoneAges<N> {
    pub(crate) fn new() -> Self {
        TombstoneAges { next: [0; N] }
    }
}

fn key(fp: Fingerprint) -> u64 {
    fp.hi | 1
}

fn set_of<const N: usize>(fp: Fingerprint) -> usize {
    ((fp.hi >> 40) as usize) & (N - 1)
}

impl<const N: usize> Tombstones<N> {
    pub(crate) fn new() -> Self {
        Tombstones {
            ways: core::array::from_fn(|_| core::array::from_fn(|_| crate::sync::zeroed())),
        }
    }

    fn find(&self, fp: Fingerprint) -> Option<usize> {
        let k = key(fp);
        let set = &self.ways[set_of::<N>(fp)];
        set.iter().position(|[lo, hi]| {
            lo.load(Ordering::Relaxed) == k as u32 && hi.load(Ordering::Relaxed) == (k >> 32) as u32
        })
    }

    /// Any thread: whether `fp` was decided recently.
    pub(crate) fn contains(&self, fp: Fingerprint) -> bool {
        self.find(fp).is_some()
    }

    /// Owner: remembers `fp` (a no-op if it is remembered already).
    pub(crate) fn insert(&self, ages: &mut TombstoneAges<N>, fp: Fingerprint) {
        if self.find(fp).is_some() {
            return;
        }
        let set = set_of::<N>(fp);
        let way = usize::from(ages.next[set]);
        ages.next[set] = ((way + 1) % WAYS) as u8;
        let k = key(fp);
        let [lo, hi] = &self.ways[set][way];
        lo.store(k as u32, Ordering::Relaxed);
        hi.store((k >> 32) as u32, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_four_of_a_set() {
        let t = Tombstones::<1>::new();
        let mut ages = TombstoneAges::new();
        let fps: std::vec::Vec<_> = (0..6u64)
            .map(|i| Fingerprint { lo: i, hi: i << 8 })
            .collect();
        for &fp in &fps[..4] {
            t.insert(&mut ages, fp);
            t.insert(&mut ages, fp); // re-inserting does not take another way
        }
        assert!(fps[..4].iter().all(|&fp| t.contains(fp)));
        t.insert(&mut ages, fps[4]);
        t.insert(&mut ages, fps[5]);
        assert!(!t.contains(fps[0]) && !t.contains(fps[1]));
        assert!(fps[2..].iter().all(|&fp| t.contains(fp)));
    }
}
