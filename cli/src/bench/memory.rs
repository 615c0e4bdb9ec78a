//! `kvdrain bench memory`: what a ledger weighs, in total and per tracked request.
//!
//! Everything is inline, so `size_of::<Ledger<N, E>>()` is the whole footprint. The
//! slot-equivalent is the marginal cost of one more request,
//! `(size_of::<Ledger<2N, E>>() - size_of::<Ledger<N, E>>()) / N`: every per-request
//! table (shared slot, two index buckets, four tombstone ways, ready-ring entry,
//! owner record, timer, free-list and batch entries). `core/tests/size.rs` pins the same
//! figures.

use std::fmt::Write as _;

use kvdrain::Ledger;

use super::{Failure, Flags};

fn per_request<const N: usize, const N2: usize, const E: usize>() -> usize {
    (size_of::<Ledger<N2, E>>() - size_of::<Ledger<N, E>>()) / N
}

fn entry<const N: usize, const E: usize>(out: &mut String) {
    let bytes = size_of::<Ledger<N, E>>();
    let _ = write!(
        out,
        "\"Ledger<{N}, {E}>\":{{\"bytes\":{bytes},\"bytes_per_request\":{:.1}}},",
        bytes as f64 / N as f64
    );
}

/// `kvdrain bench memory`.
pub fn main(flags: Flags) -> Result<(), Failure> {
    flags.finish()?;
    let mut out = String::from("{\"bench\":\"memory\",");
    let _ = write!(
        out,
        "\"slot_equivalent_bytes\":{{\"E=1\":{},\"E=8\":{},\"E=32\":{}}},",
        per_request::<1024, 2048, 1>(),
        per_request::<1024, 2048, 8>(),
        per_request::<1024, 2048, 32>(),
    );
    entry::<1024, 8>(&mut out);
    entry::<4096, 8>(&mut out);
    entry::<65536, 8>(&mut out);
    entry::<4096, 32>(&mut out);
    entry::<65536, 32>(&mut out);
    out.push_str("\"target_bytes_per_request\":256}");
    println!("{out}");
    Ok(())
}
