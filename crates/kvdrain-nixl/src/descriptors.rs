//! The byte ranges of one WRITE: which source bytes of a producer rank go to which bytes of
//! one consumer rank's blocks, from the core's [`WriteShape`] and both block layouts.
//!
//! | shape | source range of a block | destination range of a block |
//! | --- | --- | --- |
//! | `Whole`, `P_tp ≤ D_tp` (or MLA) | whole block | whole block (equal block sizes) |
//! | `Whole`, `P_tp > D_tp`, `k = P_tp / D_tp` | whole block | slot `tp_rank % k` of `k` (D blocks are `k×` larger) |
//! | `HeadSlice { index, of }` | slice `index` of `of` | whole block (P blocks are `of×` larger) |
//!
//! On a partial prefix hit D registers only its uncached suffix, so the producer keeps the
//! **tail** of its block list (catalogue C3); it never has fewer blocks than D asks for.

use kvdrain::producer::{Topology, WriteShape};

use crate::block_layout::BlockLayout;

/// One contiguous copy: `len` bytes from local `src` to remote `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Local (source) address.
    pub src: usize,
    /// Remote (destination) address.
    pub dst: usize,
    /// Bytes.
    pub len: usize,
}

/// Why a WRITE could not be described (the edge is owed a failure notice, catalogue C2).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// Producer and consumer list a different number of KV-cache groups.
    #[error("{local} local block groups, {remote} remote")]
    GroupCount {
        /// Producer's groups.
        local: usize,
        /// Consumer's groups.
        remote: usize,
    },
    /// The producer holds fewer blocks than the consumer asks for in a group.
    #[error("group {group}: {local} local blocks for {remote} remote blocks")]
    TooFewBlocks {
        /// Group index.
        group: usize,
        /// Producer's blocks.
        local: usize,
        /// Consumer's blocks.
        remote: usize,
    },
    /// A block id outside its pool.
    #[error("{side} block id {id} is outside the pool")]
    OutOfRange {
        /// `"local"` or `"remote"`.
        side: &'static str,
        /// The id.
        id: u64,
    },
    /// Block sizes do not fit the shape.
    #[error("block sizes {local} (local) and {remote} (remote) do not fit {shape:?}")]
    Geometry {
        /// Local block length.
        local: usize,
        /// Remote block length.
        remote: usize,
        /// The write's shape.
        shape: WriteShape,
    },
}

/// The spans of the WRITE of producer TP rank `tp_rank` with shape `shape`.
///
/// # Errors
/// [`DescriptorError`] when the lists or layouts do not fit.
pub fn spans(
    topology: &Topology,
    tp_rank: u16,
    shape: WriteShape,
    local: (&BlockLayout, &[Vec<u64>]),
    remote: (&BlockLayout, &[Vec<u64>]),
) -> Result<Vec<Span>, DescriptorError> {
    let ((l, local_ids), (r, remote_ids)) = (local, remote);
    let geometry = || DescriptorError::Geometry {
        local: l.block_len,
        remote: r.block_len,
        shape,
    };
    // (offset in the source block, offset in the destination block, length)
    let (src_off, dst_off, len) = match shape {
        WriteShape::Whole if topology.p_tp > topology.d_tp && !topology.mla => {
            let k = usize::from(topology.p_tp / topology.d_tp.max(1));
            if r.block_len != k * l.block_len {
                return Err(geometry());
            }
            (0, usize::from(tp_rank) % k * l.block_len, l.block_len)
        }
        WriteShape::Whole => {
            if r.block_len != l.block_len {
                return Err(geometry());
            }
            (0, 0, l.block_len)
        }
        WriteShape::HeadSlice { index, of } => {
            if of == 0 || l.block_len != usize::from(of) * r.block_len {
                return Err(geometry());
            }
            (usize::from(index) * r.block_len, 0, r.block_len)
        }
    };
    if local_ids.len() != remote_ids.len() {
        return Err(DescriptorError::GroupCount {
            local: local_ids.len(),
            remote: remote_ids.len(),
        });
    }
    let mut out = Vec::new();
    for (group, (lg, rg)) in local_ids.iter().zip(remote_ids).enumerate() {
        let Some(skip) = lg.len().checked_sub(rg.len()) else {
            return Err(DescriptorError::TooFewBlocks {
                group,
                local: lg.len(),
                remote: rg.len(),
            });
        };
        for (&src_id, &dst_id) in lg[skip..].iter().zip(rg) {
            let src = l.addr(src_id).ok_or(DescriptorError::OutOfRange {
                side: "local",
                id: src_id,
            })?;
            let dst = r.addr(dst_id).ok_or(DescriptorError::OutOfRange {
                side: "remote",
                id: dst_id,
            })?;
            out.push(Span {
                src: src + src_off,
                dst: dst + dst_off,
                len,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(base: usize, block_len: usize) -> BlockLayout {
        BlockLayout {
            base,
            block_len,
            num_blocks: 16,
        }
    }

    fn topo(p_tp: u16, d_tp: u16) -> Topology {
        Topology {
            p_tp,
            p_pp: 1,
            d_tp,
            mla: false,
        }
    }

    #[test]
    fn tp2_to_tp1_writes_its_half_of_each_block_and_keeps_the_tail() {
        let (l, r) = (layout(0x1000, 64), layout(0x10_0000, 128));
        let local = vec![vec![1, 2, 3]];
        let remote = vec![vec![7, 9]];
        let s = spans(
            &topo(2, 1),
            1,
            WriteShape::Whole,
            (&l, &local),
            (&r, &remote),
        )
        .unwrap();
        assert_eq!(
            s,
            vec![
                Span {
                    src: 0x1000 + 2 * 64,
                    dst: 0x10_0000 + 7 * 128 + 64,
                    len: 64
                },
                Span {
                    src: 0x1000 + 3 * 64,
                    dst: 0x10_0000 + 9 * 128 + 64,
                    len: 64
                },
            ]
        );
    }

    #[test]
    fn head_slices_and_errors() {
        let (l, r) = (layout(0, 128), layout(0x8000, 64));
        let shape = WriteShape::HeadSlice { index: 1, of: 2 };
        let s = spans(&topo(1, 2), 0, shape, (&l, &[vec![2]]), (&r, &[vec![3]])).unwrap();
        assert_eq!(
            s,
            vec![Span {
                src: 2 * 128 + 64,
                dst: 0x8000 + 3 * 64,
                len: 64
            }]
        );
        assert!(matches!(
            spans(
                &topo(1, 1),
                0,
                WriteShape::Whole,
                (&l, &[vec![1]]),
                (&l, &[vec![1, 2]])
            ),
            Err(DescriptorError::TooFewBlocks { .. })
        ));
        assert!(matches!(
            spans(
                &topo(1, 1),
                0,
                WriteShape::Whole,
                (&l, &[vec![1]]),
                (&l, &[vec![99]])
            ),
            Err(DescriptorError::OutOfRange {
                side: "remote",
                id: 99
            })
        ));
        assert!(matches!(
            spans(
                &topo(1, 1),
                0,
                WriteShape::Whole,
                (&l, &[vec![1]]),
                (&r, &[vec![1]])
            ),
            Err(DescriptorError::Geometry { .. })
        ));
    }
}
