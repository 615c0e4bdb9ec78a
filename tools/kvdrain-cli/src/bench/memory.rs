//! `kvdrain bench memory`: what a ledger weighs, in total and per tracked request.
//!
//! Everything is inline, so `size_of::<Ledger<N, E>>()` is the whole footprint. The
//! slot-equivalent is the marginal cost of one more request,
//! `(size_of::<Ledger<2N, E>>() - size_of::<Ledger<N, E>>()) / N`: every per-request
//! table (shared slot, two index buckets, four tombstone ways, ready-ring entry,
//! owner record, timer, free-list and batch entries). `crates/kvdrain/tests/size.rs` pins the same
//! figures.

use kvdrain::Ledger;
use serde_json::Value;

use super::{Failure, Line};

fn per_request<const N: usize, const N2: usize, const E: usize>() -> usize {
    (size_of::<Ledger<N2, E>>() - size_of::<Ledger<N, E>>()) / N
}

fn entry<const N: usize, const E: usize>(line: &mut Line) {
    let bytes = size_of::<Ledger<N, E>>();
    let per_request = (bytes as f64 / N as f64 * 10.0).round() / 10.0;
    let mut sizes = Line::new();
    sizes
        .put("bytes", bytes)
        .put("bytes_per_request", Value::from(per_request));
    line.put(format!("Ledger<{N}, {E}>"), sizes.into_map());
}

/// `kvdrain bench memory`.
pub fn main() -> Result<(), Failure> {
    let mut line = Line::new();
    let mut slot = Line::new();
    slot.put("E=1", per_request::<1024, 2048, 1>())
        .put("E=8", per_request::<1024, 2048, 8>())
        .put("E=32", per_request::<1024, 2048, 32>());
    line.put("bench", "memory")
        .put("slot_equivalent_bytes", slot.into_map());
    entry::<1024, 8>(&mut line);
    entry::<4096, 8>(&mut line);
    entry::<65536, 8>(&mut line);
    entry::<4096, 32>(&mut line);
    entry::<65536, 32>(&mut line);
    line.put("target_bytes_per_request", 256);
    line.print();
    Ok(())
}
