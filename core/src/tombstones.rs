//! Tombstones: fingerprints of recently decided requests, so a late notice is reported as
//! `late` rather than `unknown`. They live outside the request slots and cost no capacity.
//!
//! `N` sets of 4 ways (4·N entries); a set is chosen by fingerprint bits and replaces its
//! oldest entry. Entries are 64-bit fingerprint halves stored as two atomics: the ingest
//! thread reads them while the owner writes, and a torn read can only turn one `late` into
//! `unknown` (both create no state and change no request).

use crate::fingerprint::Fingerprint;
use crate::sync::{AtomicU32, Ordering};

const WAYS: usize = 4;

#[derive(Debug)]
pub(crate) struct Tombstones<const N: usize> {
    /// `[lo, hi]` halves of `fp.hi | 1` (never 0, so 0 means an empty way).
    ways: [[[AtomicU32; 2]; WAYS]; N],
}

/// Owner-only insertion stamps of the tombstone ways, for oldest-first replacement.
#[derive(Debug)]
pub(crate) struct TombstoneAges<const N: usize> {
    stamps: [[u32; WAYS]; N],
    clock: u32,
}

impl<const N: usize> TombstoneAges<N> {
    pub(crate) fn new() -> Self {
        TombstoneAges {
            stamps: [[0; WAYS]; N],
            clock: 0,
        }
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

    /// Owner: remembers `fp` (refreshing it if present).
    pub(crate) fn insert(&self, ages: &mut TombstoneAges<N>, fp: Fingerprint) {
        ages.clock = ages.clock.wrapping_add(1);
        let set = set_of::<N>(fp);
        let way = match self.find(fp) {
            Some(way) => way,
            None => {
                let clock = ages.clock;
                let stamps = &ages.stamps[set];
                let oldest = (0..WAYS).max_by_key(|&w| clock.wrapping_sub(stamps[w]));
                let empty = (0..WAYS).find(|&w| self.ways[set][w][0].load(Ordering::Relaxed) == 0);
                let way = empty.or(oldest).unwrap_or(0);
                let k = key(fp);
                self.ways[set][way][0].store(k as u32, Ordering::Relaxed);
                self.ways[set][way][1].store((k >> 32) as u32, Ordering::Relaxed);
                way
            }
        };
        ages.stamps[set][way] = ages.clock;
    }
}
