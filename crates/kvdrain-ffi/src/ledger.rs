//! The ledger handle: create, split into the two halves, free.

use crate::config::kvdrain_config;
use crate::group::{self, Group, kvdrain_engine, kvdrain_ingest, kvdrain_ledger};
use crate::status::boundary;
use crate::status::kvdrain_status::{self, *};

/// Builds a ledger with `*config` and writes its handle to `*out`: `Ledger<65536, 8>` on
/// the heap (13.8 MiB whatever the capacity, its decision queue included) plus the
/// engine's key table (64–128 bytes per unit of capacity). Any thread. Free it with
/// `kvdrain_ledger_free`.
///
/// Errors: `KVDRAIN_ERR_NULL`, `KVDRAIN_ERR_INVALID` (capacity outside
/// `1..=KVDRAIN_MAX_CAPACITY`), `KVDRAIN_ERR_ALLOC` (no memory for the ledger or its key
/// table, or the construction thread, whose stack is about 71 MiB of address space,
/// could not start; nothing is left allocated and `*out` is not written).
///
/// # Safety
/// `config` is NULL or readable; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ledger_new(
    config: *const kvdrain_config,
    out: *mut *mut kvdrain_ledger,
) -> kvdrain_status {
    boundary(|| {
        // SAFETY: NULL or readable, per the contract.
        let Some(config) = (unsafe { config.as_ref() }) else {
            return KVDRAIN_ERR_NULL;
        };
        if out.is_null() {
            return KVDRAIN_ERR_NULL;
        }
        let core = match config.to_core() {
            Ok(c) => c,
            Err(e) => return e,
        };
        match Group::create(core) {
            Ok(ledger) => {
                // SAFETY: non-NULL and writable, per the contract.
                unsafe { out.write(ledger) };
                KVDRAIN_OK
            }
            Err(e) => e,
        }
    })
}

/// Hands out the ledger's two halves, once: `*ingest` for the thread that drains NIXL
/// notifications and `*engine` for the scheduler thread (or both on one thread). They
/// belong to the ledger: free each with its `*_free`; once the ledger handle is freed,
/// calls through them return `KVDRAIN_ERR_FREED`. A second split returns
/// `KVDRAIN_ERR_BUSY`. Any thread.
///
/// # Safety
/// `ledger` is NULL or a live ledger handle; `ingest` and `engine` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ledger_split(
    ledger: *mut kvdrain_ledger,
    ingest: *mut *mut kvdrain_ingest,
    engine: *mut *mut kvdrain_engine,
) -> kvdrain_status {
    boundary(|| {
        if ingest.is_null() || engine.is_null() {
            return KVDRAIN_ERR_NULL;
        }
        // SAFETY: as documented.
        match unsafe { group::split(ledger) } {
            Ok((i, e)) => {
                // SAFETY: both non-NULL and writable, per the contract.
                unsafe {
                    ingest.write(i);
                    engine.write(e);
                }
                KVDRAIN_OK
            }
            Err(e) => e,
        }
    })
}

/// Frees the ledger handle. NULL is accepted. The memory goes away with the last of the
/// ledger's three handles, in any order; until then a second free does nothing and calls
/// through a freed handle, or through a half of a freed ledger, return
/// `KVDRAIN_ERR_FREED`. Must not run concurrently with a call on this handle.
///
/// # Safety
/// `ledger` is NULL or a ledger handle whose group is still allocated (one of its three
/// handles not freed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ledger_free(ledger: *mut kvdrain_ledger) {
    // SAFETY: as documented.
    unsafe { group::free_ledger(ledger.cast_const()) }
}
