//! # kvdrain-ffi: kvdrain for C and C++
//!
//! The C ABI of [`kvdrain`]: opaque handles, status codes, borrowed byte spans and
//! caller-owned output arrays. The header `include/kvdrain.h` is generated from this crate
//! by cbindgen (`make c-header`) and checked in CI (`make c-header-check`).
//!
//! ## States (as in the core)
//!
//! ```text
//!              register                 last edge resolved, none failed
//!  (pending) ───────────▶ COUNTING ─────────────────────────────────────▶ COMPLETED
//!                            │  │       last edge resolved, ≥1 failed
//!                            │  └───────────────────────────────────────▶ FAILED ──┐
//!                     abort  │  deadline                                           │
//!                            ▼  ▼                                                  ▼
//!                    aborted / EXPIRED ── every edge resolved ───────────▶ (SETTLING) ─▶ RELEASED
//!                       (quarantined)    (late notice, gone, fence)     settle end     ▲
//!                            │                    │ quarantine end first               │
//!                            └── quarantine_ms ran out, edges outstanding ─────────────┘ (forced)
//! ```
//!
//! `SETTLING` is passed through at once unless a failure notice (`PUSH_FAIL:`) or a
//! `kvdrain_engine_gone` of its agent resolved one of the request's edges less than
//! `settle_ms` ago: the write it reports may still be landing, so `RELEASED` comes from the
//! `kvdrain_engine_advance` that reaches `settle_ms` after the last of them (or, for an
//! aborted or expired request, its quarantine end if that comes first: forced, never
//! delayed). `kvdrain_engine_info.next_timer_ms` names the next settle end as it names
//! deadlines and quarantine ends. A settling request is decided but still holds its slot.
//!
//! ## Drive contract
//!
//! **Time enters through `kvdrain_engine_advance` (the engine's clock) and
//! `kvdrain_ingest_set_arrival` (when a batch of notifications arrived); events through
//! `kvdrain_ingest_feed[_batch]`, `kvdrain_engine_register`, `_abort`, `_gone` and
//! `_fence`; decisions leave through `kvdrain_engine_poll`, into your array.**
//!
//! 1. `kvdrain_config_default`, adjust, `kvdrain_ledger_new`, `kvdrain_ledger_split`.
//! 2. Per request: `kvdrain_engine_register` (id bytes, your `uint64_t` block handle, a
//!    count or a list of agents, optional deadline); keep the key.
//! 3. Per NIXL notification: `kvdrain_ingest_feed` (sender's agent number, raw bytes), or
//!    `kvdrain_ingest_feed_batch` with parallel arrays. Per batch, first
//!    `kvdrain_ingest_set_arrival(now_ms)` with the time it was drained, on the engine's
//!    clock: a `PUSH_FAIL:` then settles from its arrival, not from the engine's last
//!    advance (up to a scheduler step earlier).
//! 4. On `KVDRAIN_NOTICE_DECIDED` or each scheduler step: `kvdrain_engine_poll` until it
//!    returns fewer decisions than asked; act on each. To log what happened to a request
//!    (its edges, first failure, settle end, release), `kvdrain_engine_record(key)` for
//!    its decision before the next `kvdrain_engine_register`.
//! 5. Each scheduler step: `kvdrain_engine_advance(now_ms)`, then poll (settle ends fire
//!    here too).
//! 6. Client cancel: `kvdrain_engine_advance(now_ms)`, then `kvdrain_engine_abort(key)`:
//!    an abort is dated at the engine's clock, and its quarantine runs from there.
//! 7. A producer lost or invalidated (a failed send or heartbeat, a reset connection, a dead
//!    process, invalidated metadata): `kvdrain_engine_advance(now_ms)` then
//!    `kvdrain_engine_gone(agent)`, then poll: its edges fail now and their blocks settle,
//!    because its bytes already handed to the transport keep landing.
//!    `kvdrain_engine_fence` only when the transport proves nothing more of it can land.
//! 8. A registration refused whose blocks producers may write into all the same (another
//!    rank's registration let them): `kvdrain_engine_hold_refused`, your blocks handle
//!    kept in a queue; after each advance, `kvdrain_engine_poll_refused_releases`: each
//!    hold it hands out frees the front of the queue, a quarantine after the refusal.
//!
//! ## Threads
//!
//! | handle | who may call |
//! | --- | --- |
//! | `kvdrain_ingest` | one thread at a time (the NIXL draining thread) |
//! | `kvdrain_engine` | one thread at a time (the scheduler), concurrently with the ingest half |
//! | `kvdrain_ledger` | any thread, one call at a time |
//! | `kvdrain_push_plan` | one thread at a time |
//!
//! "One thread at a time" is checked: a call into a half or a push plan while another
//! call is inside it returns `KVDRAIN_ERR_BUSY` and does nothing (one atomic
//! read-modify-write per call, which also reads the freed and poisoned bits). A free
//! waits for a call still inside that handle. What stays undefined: any call through a
//! handle after the last of its ledger's three handles was freed (the memory is gone),
//! including one that races that last free, and a call on a push plan racing its free.
//! | `kvdrain_status_str`, `kvdrain_version`, `kvdrain_config_default`, `kvdrain_encode_failure_notice` | any thread |
//!
//! ## What the binding adds to the core, and why
//!
//! * **One instantiation**, `Ledger<65536, 8>` built on the heap (13.8 MiB, decisions
//!   queued in it, plus 64–128 B per unit of capacity for the key table; capacity,
//!   deadline, quarantine and seed are run-time configuration). Its memory and the key
//!   table's are allocated with a check, so no memory is `KVDRAIN_ERR_ALLOC`, not an
//!   abort; it is built into that memory on a thread with a big stack, because
//!   `Ledger::new` returns the ledger by value.
//! * **Ownership** (`group.rs`): the halves borrow the ledger; the three handles live in
//!   one heap allocation that goes away with the last of them, in any free order. A call
//!   through a freed handle (while another handle lives) or through a half of a freed
//!   ledger returns `KVDRAIN_ERR_FREED`.
//! * **Keys for tickets** (`tickets.rs`): the engine keeps each `Pending` ticket under
//!   its key; a key used up returns `KVDRAIN_ERR_STALE` where Rust would not compile.
//! * **Decisions pulled into your array** (`decisions.rs`): `kvdrain_engine_poll` pulls
//!   the core's queued decisions one at a time, only as many as your array holds; the rest
//!   wait in the core.
//! * **Records by key** (`record.rs`): `kvdrain_engine_record` copies the core's record
//!   of a request into a plain struct, a call apart so that `kvdrain_decision` stays 32
//!   bytes and a caller that never asks pays nothing.
//! * **A panic boundary** on every entry point: a panic becomes `KVDRAIN_ERR_PANIC` and
//!   poisons the handle (halves and push plans alike); nothing unwinds into C. NULL pointers and bad lengths are status
//!   codes.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod config;
mod decisions;
mod engine;
mod group;
mod ingest;
mod ledger;
mod producer;
mod record;
mod refused_hold;
mod status;
mod tickets;

use core::ffi::c_char;

pub use config::{
    KVDRAIN_MAX_CAPACITY, KVDRAIN_MAX_COUNT, KVDRAIN_MAX_EDGES, kvdrain_config,
    kvdrain_config_default,
};
pub use decisions::{
    kvdrain_decision, kvdrain_decision_kind, kvdrain_quarantine_cause, kvdrain_quarantined,
};
pub use engine::{
    KVDRAIN_NO_TIMER, kvdrain_engine_abort, kvdrain_engine_abort_id, kvdrain_engine_advance,
    kvdrain_engine_counters, kvdrain_engine_fence, kvdrain_engine_free,
    kvdrain_engine_get_counters, kvdrain_engine_get_info, kvdrain_engine_info, kvdrain_engine_poll,
    kvdrain_engine_register, kvdrain_registration,
};
pub use group::{kvdrain_engine, kvdrain_ingest, kvdrain_ledger};
pub use ingest::{
    kvdrain_ingest_counters, kvdrain_ingest_feed, kvdrain_ingest_feed_batch, kvdrain_ingest_free,
    kvdrain_ingest_get_counters, kvdrain_ingest_set_arrival, kvdrain_notice,
};
pub use ledger::{kvdrain_ledger_free, kvdrain_ledger_new, kvdrain_ledger_split};
pub use producer::{
    kvdrain_edge_state, kvdrain_encode_failure_notice, kvdrain_owed_notice, kvdrain_push_plan,
    kvdrain_push_plan_backend_error, kvdrain_push_plan_edge_state, kvdrain_push_plan_failed,
    kvdrain_push_plan_free, kvdrain_push_plan_landed, kvdrain_push_plan_landed_after_unknown,
    kvdrain_push_plan_may_post, kvdrain_push_plan_new, kvdrain_push_plan_noticed,
    kvdrain_push_plan_owed, kvdrain_push_plan_post_failed, kvdrain_push_plan_posted,
    kvdrain_push_plan_retire, kvdrain_push_plan_state, kvdrain_push_plan_status_unknown,
    kvdrain_push_plan_unreachable, kvdrain_topology,
};
pub use record::{
    KVDRAIN_NO_TIME, kvdrain_engine_record, kvdrain_failure_cause, kvdrain_record,
    kvdrain_record_edge, kvdrain_record_edge_outcome, kvdrain_record_ended,
};
pub use refused_hold::{
    kvdrain_engine_hold_refused, kvdrain_engine_poll_refused_releases, kvdrain_refused_hold,
};
pub use status::{kvdrain_status, kvdrain_status_str};

/// The library's version, `MAJOR.MINOR.PATCH`, as a static NUL-terminated string. Any
/// thread. (It returns a constant: there is no code in it that could panic.)
#[unsafe(no_mangle)]
pub extern "C" fn kvdrain_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
