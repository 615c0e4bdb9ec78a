//! The ready ring: slots whose last edge the ingest thread resolved, waiting for the
//! engine thread to take the decision out.
//!
//! Single producer (ingest), single consumer (engine). A slot is pushed at most once per
//! generation (only the transition that makes `OUTSTANDING` zero pushes it) and is freed
//! only after the engine popped it, so the ring never holds more than `N` entries and a
//! push cannot fail while that invariant holds; [`ReadyRing::push`] still reports a full
//! ring rather than overwrite.

use crate::sync::{AtomicU32, Ordering};

#[derive(Debug)]
pub(crate) struct ReadyRing<const N: usize> {
    entries: [AtomicU32; N],
    /// Next position the consumer reads (written by the engine only).
    head: AtomicU32,
    /// Next position the producer writes (written by the ingest thread only).
    tail: AtomicU32,
}

impl<const N: usize> ReadyRing<N> {
    pub(crate) fn new() -> Self {
        ReadyRing {
            entries: crate::sync::zeroed(),
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
        }
    }

    /// Producer side. Returns `false` if the ring is full (an invariant violation).
    pub(crate) fn push(&self, slot: u32) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        if tail.wrapping_sub(head) as usize >= N {
            return false;
        }
        self.entries[tail as usize % N].store(slot, Ordering::Relaxed);
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Consumer side.
    pub(crate) fn pop(&self) -> Option<u32> {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let slot = self.entries[head as usize % N].load(Ordering::Relaxed);
        self.head.store(head.wrapping_add(1), Ordering::Release);
        Some(slot)
    }
}
