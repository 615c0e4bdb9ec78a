//! A pool of equal-sized KV blocks in host memory (DRAM) that remote agents may write, for
//! the testbed, the demo and the experiments (feature `testbed`).
//!
//! Engines register their own KV cache and describe it with a
//! [`BlockLayout`]; tests and the demo use [`DramPool`]. The memory is
//! atomics because a NIXL peer writes it behind Rust's back: reading a block is only
//! meaningful once the core said its writes landed (`completed`), but it is never undefined
//! behaviour.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::block_layout::BlockLayout;

/// `num_blocks` blocks of `block_len` bytes (a multiple of 8), zeroed.
#[derive(Debug)]
pub struct DramPool {
    words: Box<[AtomicU64]>,
    block_len: usize,
}

impl DramPool {
    /// A zeroed pool.
    ///
    /// # Panics
    /// If `block_len` is 0 or not a multiple of 8, or `num_blocks` is 0.
    pub fn new(block_len: usize, num_blocks: usize) -> Self {
        assert!(
            block_len > 0 && block_len.is_multiple_of(8) && num_blocks > 0,
            "block_len must be a positive multiple of 8 and num_blocks positive"
        );
        let words = (0..block_len / 8 * num_blocks)
            .map(|_| AtomicU64::new(0))
            .collect();
        DramPool { words, block_len }
    }

    /// The pool's layout (register [`BlockLayout::region`] with the agent).
    pub fn layout(&self) -> BlockLayout {
        BlockLayout {
            base: self.words.as_ptr() as usize,
            block_len: self.block_len,
            num_blocks: self.words.len() * 8 / self.block_len,
        }
    }

    fn block(&self, id: u64) -> &[AtomicU64] {
        let w = self.block_len / 8;
        let i = usize::try_from(id).unwrap_or(usize::MAX);
        &self.words[i * w..(i + 1) * w]
    }

    /// Fills block `id` with `data` (exactly `block_len` bytes).
    ///
    /// # Panics
    /// If `id` is outside the pool or `data` has the wrong length.
    pub fn write(&self, id: u64, data: &[u8]) {
        assert_eq!(data.len(), self.block_len, "block data length");
        for (word, chunk) in self.block(id).iter().zip(data.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(b), Ordering::Release);
        }
    }

    /// Copies block `id` into `out` (exactly `block_len` bytes).
    ///
    /// # Panics
    /// If `id` is outside the pool or `out` has the wrong length.
    pub fn read_into(&self, id: u64, out: &mut [u8]) {
        assert_eq!(out.len(), self.block_len, "block buffer length");
        for (word, chunk) in self.block(id).iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&word.load(Ordering::Acquire).to_ne_bytes());
        }
    }

    /// Block `id` as a new vector.
    pub fn read(&self, id: u64) -> Vec<u8> {
        let mut out = vec![0; self.block_len];
        self.read_into(id, &mut out);
        out
    }

    /// Zeroes block `id`.
    pub fn clear(&self, id: u64) {
        for w in self.block(id) {
            w.store(0, Ordering::Release);
        }
    }
}
