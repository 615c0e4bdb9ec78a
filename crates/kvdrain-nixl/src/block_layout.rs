//! Where a rank's KV blocks are: what a consumer publishes in its handshake so producers
//! can address its blocks, and what the glue registers with NIXL.

use crate::agent::DramRegion;

/// Where a pool's blocks are: `num_blocks` blocks of `block_len` bytes from `base`. This is
/// what a consumer rank publishes in its handshake so producers can address its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    /// Address of block 0.
    pub base: usize,
    /// Bytes per block.
    pub block_len: usize,
    /// Number of blocks.
    pub num_blocks: usize,
}

impl BlockLayout {
    /// Address of block `id`, or `None` outside the pool.
    pub fn addr(&self, id: u64) -> Option<usize> {
        let id = usize::try_from(id).ok().filter(|&i| i < self.num_blocks)?;
        Some(self.base + id * self.block_len)
    }

    /// The whole pool as one region.
    pub fn region(&self) -> DramRegion {
        DramRegion::new(self.base, self.block_len * self.num_blocks)
    }
}
