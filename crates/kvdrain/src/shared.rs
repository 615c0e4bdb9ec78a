//! The part of the ledger both threads touch: slots' atomic halves, the id index, the
//! tombstones and the ready ring. Only atomics and immutable data live here.

use crate::fingerprint::{Fingerprint, Key};
use crate::index::{DELETED, EMPTY, Index};
use crate::ready::ReadyRing;
use crate::slot::SharedSlot;
use crate::state_word::{Phase, Snapshot};
use crate::sync::{AtomicU32, Ordering, fence};
use crate::tombstones::Tombstones;

/// Aligned to a cache line, so that where its tables' lines fall no longer depends on the
/// size of the owner's tables laid out before it in the [`Ledger`](crate::Ledger): the
/// refused holds' 1 KB ring in the owner moved it 1 056 bytes and cost the one-thread
/// ingest 5 % with the same instructions (`docs/performance.md`).
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Shared<const N: usize, const E: usize> {
    /// The fingerprint key, derived from `Config::seed`.
    pub(crate) key: Key,
    pub(crate) slots: [SharedSlot<E>; N],
    pub(crate) index: Index<N>,
    pub(crate) tombstones: Tombstones<N>,
    pub(crate) ready: ReadyRing<N>,
    /// The low 32 bits of the engine's clock, published by every `advance` (`Relaxed`) for
    /// the ingest thread to stamp failure notices with: a notice is never dated earlier
    /// than the engine's clock. The ingest half dates it at its arrival instead when it
    /// was given a later one (`Ingest::set_arrival`); without one, a notice handled
    /// between two advances counts as received at the earlier one. The owner turns a
    /// stamp back into a full time against its own clock (`stamp::read`).
    pub(crate) clock: AtomicU32,
}

/// A live request found by id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub(crate) slot: u32,
    /// The state word as validated (generation and phase).
    pub(crate) state: Snapshot,
    /// Named-edge count (0: counting mode).
    pub(crate) named: u32,
}

impl<const N: usize, const E: usize> Shared<N, E> {
    pub(crate) fn new(seed: u64) -> Self {
        Shared {
            key: Key::from_seed(seed),
            slots: core::array::from_fn(|_| SharedSlot::new()),
            index: Index::new(),
            tombstones: Tombstones::new(),
            ready: ReadyRing::new(),
            clock: AtomicU32::new(0),
        }
    }

    pub(crate) fn fingerprint(&self, id: &str) -> Fingerprint {
        Fingerprint::of(&self.key, id.as_bytes())
    }

    /// Finds the live request with fingerprint `fp`. Safe from any thread while the owner
    /// inserts and removes: each candidate slot is read seqlock-style (state, identity,
    /// `Acquire` fence, state again) and the lookup restarts if the slot was recycled
    /// under it. Lock-free: a restart means the owner made progress.
    ///
    /// `alone`: the caller holds the whole ledger (`&mut Ledger`), so no owner can recycle
    /// a slot during the lookup and the second read of the state word is skipped.
    #[inline(always)]
    pub(crate) fn find(&self, fp: Fingerprint, alone: bool) -> Option<Found> {
        'restart: loop {
            let mut pos = Index::<N>::home(fp);
            let tag = Index::<N>::tag(fp);
            for _ in 0..Index::<N>::BUCKETS {
                let b = self.index.bucket(pos).load(Ordering::Acquire);
                if b == EMPTY {
                    return None;
                }
                if b != DELETED && Index::<N>::tag_matches(b, tag) {
                    let slot = Index::<N>::slot(b);
                    let shared = &self.slots[slot as usize];
                    let before = shared.state.load(Ordering::Acquire);
                    if before.phase() != Phase::Free {
                        let (candidate, named) = shared.read_identity();
                        let state = if alone {
                            before
                        } else {
                            fence(Ordering::Acquire);
                            let after = shared.state.load(Ordering::Relaxed);
                            if !after.is_live(before.generation()) {
                                continue 'restart;
                            }
                            after
                        };
                        if candidate == fp {
                            return Some(Found { slot, state, named });
                        }
                    }
                }
                pos = Index::<N>::next(pos);
            }
            return None;
        }
    }
}
