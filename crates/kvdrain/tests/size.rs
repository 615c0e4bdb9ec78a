//! Memory footprint, pinned: `Ledger<N, E>` is all inline, so `size_of` is the whole cost.
//! A change that makes a tracked request heavier must update these bounds on purpose
//! (and the figures `kvdrain bench memory` prints and `bench/RESULTS.md` quotes).
//!
//! Today (x86_64, `kvdrain bench memory`): 253 bytes per request at `E = 8` — shared slot
//! 60 (state word 4, fingerprint 16, edge count 4, 8 edge words 32, failure-notice stamp
//! 4), index 8, tombstones 32 + 1, ready ring 4, owner record 64 (one cache line: the
//! decisions' fields, with the registration time, deadline and expected count a `Record`
//! reads) + its history 32 (written only when something goes wrong: what was owed at the
//! deadline, 8, for the `Expired` decision built at hand-out, five 4-byte stamps, a count,
//! the flags), timer 32 + heap index 4, free list 4, batch 4, decided queue 8 (two 4-byte
//! entries) — and 349 at `E = 32`.
//! The budget is 256 bytes per tracked request.

use kvdrain::Ledger;

/// The target.
const BUDGET_PER_REQUEST: usize = 256;
/// Pinned per-request cost at `E = 8` (253 today, with the record's history: the budget
/// itself, so no new field fits without taking bytes from another).
const PER_REQUEST_E8: usize = 256;
/// Pinned per-request cost at `E = 32` (349 today: 24 more edge words of 4 bytes).
const PER_REQUEST_E32: usize = 352;
/// Pinned fixed part (1.6 KB today, `kvdrain bench memory`: the refused holds' ring,
/// `REFUSED_HOLD_ENDS` ends of 16 bytes, is 1 KB of it, whatever `N`).
const FIXED: usize = 2048;

/// Marginal bytes of one more request: every per-request table, no fixed fields.
fn per_request<const N: usize, const N2: usize, const E: usize>() -> usize {
    (size_of::<Ledger<N2, E>>() - size_of::<Ledger<N, E>>()) / (N2 - N)
}

#[test]
fn a_tracked_request_costs_at_most_the_pinned_bytes() {
    let e8 = per_request::<1024, 2048, 8>();
    assert!(e8 <= PER_REQUEST_E8, "{e8} bytes per request at E = 8");
    assert!(e8 <= BUDGET_PER_REQUEST);
    // Linear in N: the same marginal cost at every size.
    assert_eq!(per_request::<64, 128, 8>(), e8);
    assert_eq!(per_request::<32768, 65536, 8>(), e8);
    let e32 = per_request::<1024, 2048, 32>();
    assert!(e32 <= PER_REQUEST_E32, "{e32} bytes per request at E = 32");
}

#[test]
fn ledgers_fit_the_budget_at_1024_4096_and_65536_requests() {
    fn check<const N: usize>() {
        let bytes = size_of::<Ledger<N, 8>>();
        assert!(
            bytes <= N * PER_REQUEST_E8 + FIXED,
            "Ledger<{N}, 8> is {bytes} bytes"
        );
        assert!(
            bytes <= N * BUDGET_PER_REQUEST,
            "Ledger<{N}, 8> is over the 256-byte budget"
        );
    }
    check::<1024>();
    check::<4096>();
    check::<65536>();
    // 15.8 MiB for the largest table.
    assert!(size_of::<Ledger<65536, 8>>() <= 65536 * PER_REQUEST_E8 + FIXED);
}
