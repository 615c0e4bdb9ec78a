//! The one place atomics come from.
//!
//! Every atomic in the crate is imported from here, never from `core::sync::atomic`
//! directly, so that building with `RUSTFLAGS="--cfg kvdrain_loom"` swaps all of them for
//! [loom](https://docs.rs/loom)'s model-checked versions at once. The cfg is namespaced
//! (`kvdrain_loom`, not `loom`) so that an engine running its own `--cfg loom` suite does
//! not change kvdrain under its feet.
//!
//! Only 32-bit atomics are used: they exist on every target kvdrain supports, including
//! `thumbv7em-none-eabihf`.
//!
//! What each atomic protects, and the orderings used:
//!
//! | atomic | written by | protects | orderings |
//! | --- | --- | --- | --- |
//! | slot state word (`state_word.rs`) | both, by CAS (a plain `Release` store when one thread holds `&mut Ledger`) | outstanding count, failed and settle flags, phase, generation | `AcqRel` CAS; `Release` publish/free by the owner; `Acquire` loads |
//! | shared clock (`shared.rs`) | owner, at each `advance` | the low 32 bits of the engine's time, for stamping failure notices | `Relaxed` store and load: a stale read stamps a notice with an earlier advance's time, which is the time the engine believed it was (or with the notice's arrival, if later) |
//! | failure stamp (`slot.rs`) | ingest, before the CAS that resolves an edge by a failure notice | when the last failure notice came: the later of the clock it read and its arrival time (the ingest half's own, no atomic) | `Relaxed` store sequenced before the `AcqRel` CAS that sets the state word's settle bit; the owner reads it after seeing that bit (`Acquire`); a `gone`'s time is no atomic: the engine keeps it in its own record of the request |
//! | slot identity (fingerprint, edge count) | owner, while the slot is free | which request the slot holds | `Relaxed` stores after a `Release` fence; readers validate with an `Acquire` fence and a second state load (seqlock) |
//! | edge words (`slot.rs`) | owner at registration; both by CAS (a plain store with `&mut Ledger`) | per-agent resolution, tagged with the generation | `AcqRel` CAS, `Acquire` loads |
//! | index buckets (`index.rs`) | owner | id → slot | `Release` stores, `Acquire` loads |
//! | ready ring (`ready.rs`) | ingest (tail), engine (head) | slots whose last edge a notice resolved | SPSC: `Release` publish, `Acquire` observe |
//! | tombstones (`tombstones.rs`) | owner | `late` vs `unknown` labels only | stored in a ring of the last 16 first (its `hi` word `Release`, read `Acquire`), ordered before the `Release` that frees the slot or unlinks the id, so a notice that finds the id gone finds its tombstone; each full ring is written to the 4-way sets (`Relaxed`) before its entries are replaced; a torn read can only relabel one ignored notice |

#[cfg(kvdrain_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering, fence};

#[cfg(not(kvdrain_loom))]
pub(crate) use core::sync::atomic::{AtomicU32, Ordering, fence};

/// Builds an array of zeroed atomics (loom's atomics are not `const`).
pub(crate) fn zeroed<const N: usize>() -> [AtomicU32; N] {
    core::array::from_fn(|_| AtomicU32::new(0))
}
