//! Tombstones: fingerprints of recently decided requests, so a late notice is reported as
//! `late` rather than `unknown`. They live outside the request slots and cost no capacity.
//!
//! `N` sets of 4 ways (4·N entries, one 32-byte line per set); a set is chosen by
//! fingerprint bits and its ways are replaced in turn, oldest insertion first. Entries are
//! 64-bit fingerprint halves stored as two atomics: the ingest thread reads them while the
//! owner writes, and a torn read can only turn one `late` into `unknown` (both create no
//! state and change no request).
//!
//! An insertion first goes to `recent`, a ring of the last [`RECENT`] insertions (two warm
//! lines), and reaches its set only when the ring is full, together with the other
//! [`RECENT`]. With many requests in flight a set is a cold line, and writing it at once
//! cost one exposed miss per decided request (likely because the next notice's `lock
//! cmpxchg`, a full barrier on x86, waited for it). Written in a batch, the sets' misses
//! overlap. A lookup checks the ring and then the set, so every fingerprint
//! inserted is found in one or the other until its set's ways are reused (an entry leaves
//! the ring only after the batch that wrote it to its set, which the ring's `Release`
//! stores order before it).

use crate::fingerprint::Fingerprint;
use crate::sync::{AtomicU32, Ordering};

const WAYS: usize = 4;

/// Insertions buffered in the ring before their sets are written.
pub(crate) const RECENT: usize = 16;

#[derive(Debug)]
pub(crate) struct Tombstones<const N: usize> {
    /// `[lo, hi]` halves of `fp.hi | 1` (never 0, so 0 means an empty way).
    ways: [[[AtomicU32; 2]; WAYS]; N],
    /// The last insertions, `[lo, hi]` as in `ways`; `hi` is stored `Release` after `lo`
    /// and after the batch that moved the entry it replaces into its set.
    recent: [[AtomicU32; 2]; RECENT],
}

/// Owner-only: the way of each set that the next insertion replaces (its oldest), and the
/// ring's fill.
#[derive(Debug)]
pub(crate) struct TombstoneAges<const N: usize> {
    next: [u8; N],
    /// Entries of `recent` filled since the last batch; the next insertion goes there.
    recent_len: usize,
}

impl<const N: usize> TombstoneAges<N> {
    pub(crate) fn new() -> Self {
        TombstoneAges {
            next: [0; N],
            recent_len: 0,
        }
    }
}

fn key(fp: Fingerprint) -> u64 {
    fp.hi | 1
}

fn set_of<const N: usize>(fp_hi: u64) -> usize {
    ((fp_hi >> 40) as usize) & (N - 1)
}

fn matches([lo, hi]: &[AtomicU32; 2], k: u64) -> bool {
    hi.load(Ordering::Acquire) == (k >> 32) as u32 && lo.load(Ordering::Relaxed) == k as u32
}

impl<const N: usize> Tombstones<N> {
    pub(crate) fn new() -> Self {
        Tombstones {
            ways: core::array::from_fn(|_| core::array::from_fn(|_| crate::sync::zeroed())),
            recent: core::array::from_fn(|_| crate::sync::zeroed()),
        }
    }

    fn find_in_set(&self, k: u64) -> Option<usize> {
        let set = &self.ways[set_of::<N>(k)];
        set.iter().position(|[lo, hi]| {
            lo.load(Ordering::Relaxed) == k as u32 && hi.load(Ordering::Relaxed) == (k >> 32) as u32
        })
    }

    /// Any thread: whether `fp` was decided recently.
    pub(crate) fn contains(&self, fp: Fingerprint) -> bool {
        let k = key(fp);
        self.recent.iter().any(|entry| matches(entry, k)) || self.find_in_set(k).is_some()
    }

    /// Owner: remembers `fp` (inserting one that is remembered already takes no other way
    /// of its set). Inlined: the ring store is a few instructions; the batch, once in
    /// [`RECENT`] insertions, is a call.
    #[inline]
    pub(crate) fn insert(&self, ages: &mut TombstoneAges<N>, fp: Fingerprint) {
        if ages.recent_len == RECENT {
            self.write_sets(ages);
            ages.recent_len = 0;
        }
        let k = key(fp);
        let [lo, hi] = &self.recent[ages.recent_len];
        lo.store(k as u32, Ordering::Relaxed);
        // Orders this entry's `lo` and the batch that wrote the entry it replaces to its
        // set before a reader that sees this `hi`.
        hi.store((k >> 32) as u32, Ordering::Release);
        ages.recent_len += 1;
    }

    /// Owner: writes every entry of the full ring to its set, oldest first (a no-op for a
    /// key its set holds already).
    #[inline(never)]
    fn write_sets(&self, ages: &mut TombstoneAges<N>) {
        for [lo, hi] in &self.recent {
            let k = u64::from(lo.load(Ordering::Relaxed))
                | (u64::from(hi.load(Ordering::Relaxed)) << 32);
            if self.find_in_set(k).is_some() {
                continue;
            }
            let set = set_of::<N>(k);
            let way = usize::from(ages.next[set]);
            ages.next[set] = ((way + 1) % WAYS) as u8;
            let [lo, hi] = &self.ways[set][way];
            lo.store(k as u32, Ordering::Relaxed);
            hi.store((k >> 32) as u32, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_last_four_of_a_set() {
        // The ids under test share set 0; a filler in set 1 pushes them through the ring.
        let t = Tombstones::<2>::new();
        let mut ages = TombstoneAges::new();
        let fps: std::vec::Vec<_> = (0..6u64)
            .map(|i| Fingerprint { lo: i, hi: i << 8 })
            .collect();
        let filler = Fingerprint { lo: 0, hi: 1 << 40 };
        for &fp in &fps[..4] {
            t.insert(&mut ages, fp);
            t.insert(&mut ages, fp); // re-inserting does not take another way
        }
        t.insert(&mut ages, fps[4]);
        t.insert(&mut ages, fps[5]);
        // All six are in the ring still.
        assert!(fps.iter().all(|&fp| t.contains(fp)));
        // The batch of the first `RECENT` insertions writes them to set 0, then fillers
        // replace them in the ring: only the set remembers them now.
        for _ in 0..2 * RECENT - 10 {
            t.insert(&mut ages, filler);
        }
        assert!(!t.contains(fps[0]) && !t.contains(fps[1]));
        assert!(fps[2..].iter().all(|&fp| t.contains(fp)));
        assert!(t.contains(filler));
    }

    #[test]
    fn every_insertion_is_found_while_its_set_keeps_it() {
        // 8 sets of 4 ways, one key per set in turn: a key stays in its set for the next
        // 31 insertions after its batch, and is found in the ring or the set until then,
        // across every batch boundary; after that its set has reused its way.
        const SETS: u64 = 8;
        const KEPT: u64 = SETS * WAYS as u64;
        let t = Tombstones::<{ SETS as usize }>::new();
        let mut ages = TombstoneAges::new();
        let fp = |i: u64| Fingerprint {
            lo: i,
            hi: ((i % SETS) << 40) | (i << 1),
        };
        let insertions = if cfg!(miri) { 120 } else { 1000u64 };
        for i in 0..insertions {
            t.insert(&mut ages, fp(i));
            for j in i.saturating_sub(KEPT - 1)..=i {
                assert!(t.contains(fp(j)), "insertion {j} lost after {i}");
            }
            if i >= KEPT + RECENT as u64 {
                assert!(!t.contains(fp(i - KEPT - RECENT as u64)));
            }
        }
    }
}
