//! # kvdrain for Python
//!
//! The extension module `kvdrain._kvdrain` of the Python package `kvdrain` (the rest of
//! the package is pure Python: `kvdrain/__init__.py`, the exceptions, the vLLM adapter).
//!
//! ```text
//!            register(id, blocks, expect)            every edge landed
//!  Python ─────────────────────────────▶ COUNTING ──────────────────────▶ Decision("completed")
//!   engine thread                          │  │    all resolved, ≥1 failed
//!                                          │  └──────────────────────────▶ "failed" ─▶ "released"
//!   writer thread: feed(get_new_notifs())  │  abort / deadline                            ▲
//!   ─────────────────────────────────────▶ ▼                                              │
//!                                     "aborted" / "expired" ── edges resolved / quarantine ┘
//! ```
//!
//! Drive contract (the core's, seen from Python): the writer thread calls
//! `Ledger.feed` (`src/ledger.rs`) with each batch NIXL hands over; the engine thread
//! registers, calls `poll` and `advance(now_ms)` every step, and `abort`/`gone`/`fence` when it
//! must. Decisions come back as `kvdrain.Decision` objects carrying the caller's own
//! `request_id` and `blocks` objects.
//!
//! Threads: the pyclass is `frozen`; the ledger's ingest half and engine half are each
//! behind their own lock (`src/tracker.rs`), so feeding and deciding never wait for each
//! other's lock; a thread that must wait does so with the GIL released, no Python code
//! runs under a lock (a finalizer may call back in), and a long `feed` runs its core loop
//! without the GIL (`src/lock.rs` says exactly what holds).
//!
//! Memory: the ledger is a `kvdrain::Ledger<N, 8>` in memory reserved fallibly (no memory
//! raises `kvdrain.AllocError`, a `MemoryError`, instead of aborting), built there on a
//! thread with a stack large enough for it, and split once; the ledger and its two halves
//! live together in a self-referential holder (`ouroboros`), so no hand-written `unsafe`
//! is needed (`deny(unsafe_code)`). `N` is picked from the capacity at run time among
//! 1024, 4096, 16 384 and 65 536; deadlines, quarantine and settling are run-time
//! arguments.

#![deny(unsafe_code)]

mod agents;
mod args;
mod decision;
mod errors;
mod feed;
mod ledger;
mod lock;
mod producer;
mod record;
mod requests;
mod tracker;
mod wire;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _kvdrain(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ledger::PyLedger>()?;
    m.add_class::<decision::Decision>()?;
    m.add_class::<record::PyRecord>()?;
    m.add_class::<producer::PyPushPlan>()?;
    m.add_function(wrap_pyfunction!(producer::producers_of, m)?)?;
    m.add_function(wrap_pyfunction!(wire::encode_cancel, m)?)?;
    m.add_function(wrap_pyfunction!(wire::parse_cancel, m)?)?;
    m.add("TABLE_SIZES", ledger::TABLE_SIZES.to_vec())?;
    m.add("MAX_EDGES", tracker::EDGES)?;
    // The crate's version, which maturin also writes into the wheel's metadata: one
    // number for the crates, the wheel, the C header and the `kvdrain` command.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
