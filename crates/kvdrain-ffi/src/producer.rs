//! The producer side: one request's push plan on one producer rank (which edges it
//! writes, where each stands, which failure notices it owes), and the failure notice's
//! bytes.
//!
//! A posted write has four outcomes, kept apart because only `Success` proves a write is
//! over and only a backend error bounds it: `landed`, `backend_error` (one `PUSH_FAIL`
//! owed), `status_unknown` (nothing owed, not terminal: the source blocks stay fenced) and
//! `landed_after_unknown`. An edge never posted (`post_failed`, or planned when the plan
//! retires) is owed its `PUSH_FAIL` at once; an unreachable one is owed nothing.

use core::cell::UnsafeCell;
use core::sync::atomic::AtomicU32;
use std::panic::{AssertUnwindSafe, catch_unwind};

use kvdrain::producer::{EdgeState, PlanError, PushPlan, Topology};
use kvdrain::wire::{Body, EncodeError};

use crate::group::{HandleState, enter, leave};
use crate::status::kvdrain_status::{self, *};
use crate::status::{boundary, span, write_opt};

/// A prefill (P) → decode (D) topology.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvdrain_topology {
    /// Producer tensor-parallel size.
    pub p_tp: u16,
    /// Producer pipeline-parallel size.
    pub p_pp: u16,
    /// Consumer tensor-parallel size.
    pub d_tp: u16,
    /// Non-zero for MLA models (every consumer rank gets the whole latent KV).
    pub mla: u8,
}

/// The producer-side record of one request on one producer rank: which consumer ranks it
/// writes and where each write stands. One thread at a time (a call while another is
/// inside returns `KVDRAIN_ERR_BUSY`); free with `kvdrain_push_plan_free`.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct kvdrain_push_plan {
    /// Poisoned and busy bits, as a half's (`group::enter`).
    state: AtomicU32,
    plan: UnsafeCell<PushPlan>,
}

/// A failure notice this producer owes a consumer rank.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct kvdrain_owed_notice {
    /// The consumer TP rank to send `PUSH_FAIL:{id}:{tp}` to.
    pub d_rank: u16,
    /// 1 if the WRITE had been posted before it failed (some bytes may have landed;
    /// the consumer settles its blocks), 0 if it was never posted.
    pub posted: u8,
}

/// Where one edge (a WRITE into one consumer rank) of a push plan stands.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_edge_state {
    /// Planned, not attempted yet.
    KVDRAIN_EDGE_PLANNED = 0,
    /// Posted; not terminal.
    KVDRAIN_EDGE_POSTED = 1,
    /// The initiator saw it succeed.
    KVDRAIN_EDGE_LANDED = 2,
    /// Posted, then a backend error: a failure notice is owed.
    KVDRAIN_EDGE_FAILED_POSTED = 3,
    /// Never posted (post failed, or the plan retired first): a failure notice is owed.
    KVDRAIN_EDGE_FAILED_UNPOSTED = 4,
    /// Posted, status unreadable: nothing owed, not terminal (sources stay fenced).
    KVDRAIN_EDGE_UNKNOWN = 5,
    /// The failure notice was handed to the transport.
    KVDRAIN_EDGE_NOTICED = 6,
    /// The consumer rank cannot be named or reached: no notice can be sent.
    KVDRAIN_EDGE_UNREACHABLE = 7,
}

impl From<EdgeState> for kvdrain_edge_state {
    fn from(s: EdgeState) -> Self {
        use kvdrain_edge_state::*;
        match s {
            EdgeState::Planned => KVDRAIN_EDGE_PLANNED,
            EdgeState::Posted => KVDRAIN_EDGE_POSTED,
            EdgeState::Landed => KVDRAIN_EDGE_LANDED,
            EdgeState::Failed { posted: true } => KVDRAIN_EDGE_FAILED_POSTED,
            EdgeState::Failed { posted: false } => KVDRAIN_EDGE_FAILED_UNPOSTED,
            EdgeState::Unknown => KVDRAIN_EDGE_UNKNOWN,
            EdgeState::Noticed => KVDRAIN_EDGE_NOTICED,
            EdgeState::Unreachable => KVDRAIN_EDGE_UNREACHABLE,
        }
    }
}

/// Plans every edge of producer rank `(pp_stage, tp_rank)` of `*topology` before anything
/// is posted, and writes the plan's handle to `*out`. Any thread.
///
/// Errors: `KVDRAIN_ERR_NULL`, `KVDRAIN_ERR_INVALID` (a size is 0, TP sizes that do not
/// divide, too many targets, a rank outside the topology).
///
/// # Safety
/// `topology` is NULL or readable; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_new(
    topology: *const kvdrain_topology,
    pp_stage: u16,
    tp_rank: u16,
    out: *mut *mut kvdrain_push_plan,
) -> kvdrain_status {
    boundary(|| {
        // SAFETY: NULL or readable, per the contract.
        let Some(t) = (unsafe { topology.as_ref() }) else {
            return KVDRAIN_ERR_NULL;
        };
        if out.is_null() {
            return KVDRAIN_ERR_NULL;
        }
        let topology = Topology {
            p_tp: t.p_tp,
            p_pp: t.p_pp,
            d_tp: t.d_tp,
            mla: t.mla != 0,
        };
        match PushPlan::new(&topology, pp_stage, tp_rank) {
            Ok(plan) => {
                let handle = Box::into_raw(Box::new(kvdrain_push_plan {
                    state: AtomicU32::new(0),
                    plan: UnsafeCell::new(plan),
                }));
                // SAFETY: non-NULL and writable, per the contract.
                unsafe { out.write(handle) };
                KVDRAIN_OK
            }
            Err(_) => KVDRAIN_ERR_INVALID,
        }
    })
}

/// Frees a plan. NULL is accepted.
///
/// # Safety
/// `plan` is NULL or a plan from `kvdrain_push_plan_new` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_free(plan: *mut kvdrain_push_plan) {
    if !plan.is_null() {
        // SAFETY: from `Box::into_raw` in `kvdrain_push_plan_new`, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(plan) })));
    }
}

/// Runs `f` on the plan behind `plan` inside the panic boundary: a poisoned plan is
/// refused (`KVDRAIN_ERR_PANIC`), a panic in `f` poisons it, and a call while another is
/// inside returns `KVDRAIN_ERR_BUSY`.
///
/// # Safety
/// `plan` is NULL or a live plan.
unsafe fn with_plan(
    plan: *mut kvdrain_push_plan,
    f: impl FnOnce(&mut PushPlan) -> kvdrain_status,
) -> kvdrain_status {
    // SAFETY: NULL or live, per the contract (shared: other threads may hold it too).
    let Some(handle) = (unsafe { plan.as_ref() }) else {
        return KVDRAIN_ERR_NULL;
    };
    if let Err(status) = enter(&handle.state) {
        return status;
    }
    // SAFETY: `enter` let this call alone in until `leave`.
    let p = unsafe { &mut *handle.plan.get() };
    let status = match catch_unwind(AssertUnwindSafe(|| f(p))) {
        Ok(status) => status,
        Err(_) => {
            HandleState::POISONED.raise(&handle.state);
            KVDRAIN_ERR_PANIC
        }
    };
    leave(&handle.state);
    status
}

/// [`with_plan`] for the tests of the panic boundary.
///
/// # Safety
/// As [`with_plan`].
#[cfg(test)]
pub(crate) unsafe fn with_plan_for_tests(
    plan: *mut kvdrain_push_plan,
    f: impl FnOnce(&mut PushPlan) -> kvdrain_status,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, f) }
}

fn status(result: Result<(), PlanError>) -> kvdrain_status {
    match result {
        Ok(()) => KVDRAIN_OK,
        Err(PlanError::UnknownEdge(_)) => KVDRAIN_ERR_UNKNOWN,
        Err(PlanError::WrongState(..)) => KVDRAIN_ERR_WRONG_STATE,
        Err(PlanError::Retired) => KVDRAIN_ERR_RETIRED,
    }
}

/// Asks to post the WRITE into consumer rank `d_rank`: `KVDRAIN_OK` means go ahead,
/// then report `posted` or `post_failed`. `KVDRAIN_ERR_RETIRED` once the request ended
/// here; `KVDRAIN_ERR_WRONG_STATE` unless planned; `KVDRAIN_ERR_UNKNOWN` for a rank
/// this plan does not write.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_may_post(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.may_post(d_rank))) }
}

/// The WRITE into `d_rank` was posted (errors as `kvdrain_push_plan_may_post`).
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_posted(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.posted(d_rank))) }
}

/// The WRITE into `d_rank` could not be described or posted: nothing was sent; a
/// failure notice is owed (never posted). `KVDRAIN_ERR_WRONG_STATE` unless planned.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_post_failed(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.post_failed(d_rank))) }
}

/// The initiator saw the WRITE into `d_rank` succeed. `KVDRAIN_ERR_WRONG_STATE` unless
/// posted (after `kvdrain_push_plan_status_unknown`, use
/// `kvdrain_push_plan_landed_after_unknown`).
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_landed(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.landed(d_rank))) }
}

/// The posted WRITE into `d_rank` ended with a backend error (its own, or another
/// transfer's to the same consumer agent): nothing more of it lands, so a failure notice
/// is owed (`posted = 1`: bytes may have landed). Also accepted after
/// `kvdrain_push_plan_status_unknown`: the error bounds the unknown write.
/// `KVDRAIN_ERR_WRONG_STATE` unless posted or unknown.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_backend_error(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.backend_error(d_rank))) }
}

/// The older name of `kvdrain_push_plan_backend_error`, kept so existing callers build.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_failed(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.backend_error(d_rank))) }
}

/// The posted WRITE into `d_rank` can no longer report its status (NIXL `NOT_FOUND` the
/// producer did not cause): it may still be landing. Nothing is owed, the edge is not
/// terminal (the source blocks stay fenced) and the consumer's deadline decides, unless
/// a later `Success` (`kvdrain_push_plan_landed_after_unknown`) or backend error
/// (`kvdrain_push_plan_backend_error`) settles it. Repeating it is a no-op.
/// `KVDRAIN_ERR_WRONG_STATE` unless posted or unknown.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_status_unknown(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.status_unknown(d_rank))) }
}

/// The WRITE into `d_rank`, posted and perhaps reported unknown, was later seen to
/// succeed: it landed, nothing is owed. `KVDRAIN_ERR_WRONG_STATE` unless posted or
/// unknown.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_landed_after_unknown(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.landed_after_unknown(d_rank))) }
}

/// Writes where the edge into consumer rank `d_rank` stands to `*state`.
/// `KVDRAIN_ERR_UNKNOWN` for a rank this plan does not write.
///
/// # Safety
/// `plan` is NULL or a live plan; `state` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_edge_state(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
    state: *mut kvdrain_edge_state,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_plan(plan, |p| {
            if state.is_null() {
                return KVDRAIN_ERR_NULL;
            }
            match p.edges().iter().find(|e| e.d_rank == d_rank) {
                Some(e) => {
                    // Written through the pointer: `*state` may be uninitialised (or not
                    // a valid enum value) on entry, so no reference to it is made.
                    write_opt(state, kvdrain_edge_state::from(e.state));
                    KVDRAIN_OK
                }
                None => KVDRAIN_ERR_UNKNOWN,
            }
        })
    }
}

/// Consumer rank `d_rank` cannot be named or reached: no notice can be sent for it.
/// `KVDRAIN_ERR_WRONG_STATE` if the edge is posted, unknown, landed or noticed.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_unreachable(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.unreachable(d_rank))) }
}

/// The `PUSH_FAIL` for `d_rank` was handed to the transport. `KVDRAIN_ERR_WRONG_STATE`
/// unless a notice is owed for it.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_noticed(
    plan: *mut kvdrain_push_plan,
    d_rank: u16,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe { with_plan(plan, |p| status(p.noticed(d_rank))) }
}

/// The request ended on this producer (finished, aborted, lease gone): nothing more may
/// be posted, and every edge not yet attempted is owed a failure notice.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_retire(plan: *mut kvdrain_push_plan) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_plan(plan, |p| {
            p.retire();
            KVDRAIN_OK
        })
    }
}

/// The failure notices owed now, one per failed, reachable edge not yet noticed, in target
/// order: `*n` is the room in `out` on entry and the number written on return; when the
/// room is too small, `*n` is set to the number owed, nothing is written and the status is
/// `KVDRAIN_ERR_BUFFER_TOO_SMALL` (at most 64 are ever owed).
///
/// # Safety
/// `plan` is NULL or a live plan; `n` is NULL or points to the
/// room in `out`, which is writable for that many entries (NULL when the room is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_owed(
    plan: *mut kvdrain_push_plan,
    out: *mut kvdrain_owed_notice,
    n: *mut usize,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_plan(plan, |p| {
            let Some(room) = n.as_mut() else {
                return KVDRAIN_ERR_NULL;
            };
            let owed = p.edges().iter().filter_map(|e| match e.state {
                EdgeState::Failed { posted } => Some(kvdrain_owed_notice {
                    d_rank: e.d_rank,
                    posted: u8::from(posted),
                }),
                _ => None,
            });
            let count = owed.clone().count();
            if count > *room {
                *room = count;
                return KVDRAIN_ERR_BUFFER_TOO_SMALL;
            }
            if count > 0 && out.is_null() {
                return KVDRAIN_ERR_NULL;
            }
            for (i, notice) in owed.enumerate() {
                out.add(i).write(notice);
            }
            *room = count;
            KVDRAIN_OK
        })
    }
}

/// Writes whether no WRITE of this request is in flight, of unknown status, or still to be
/// posted (the source blocks may be released: never before) to `*terminal`, and whether every edge landed to
/// `*all_landed`; either may be NULL.
///
/// # Safety
/// `plan` is NULL or a live plan; the out-pointers are NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_push_plan_state(
    plan: *mut kvdrain_push_plan,
    terminal: *mut bool,
    all_landed: *mut bool,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_plan(plan, |p| {
            write_opt(terminal, p.is_terminal());
            write_opt(all_landed, p.all_landed());
            KVDRAIN_OK
        })
    }
}

/// Writes the failure notice `PUSH_FAIL:{id}:{tp_size}` (vLLM's bytes) into `out` (room
/// `*len` on entry, bytes written on return; no NUL is added). When the room is too
/// short, `*len` is set to the bytes needed and nothing is written
/// (`KVDRAIN_ERR_BUFFER_TOO_SMALL`). `KVDRAIN_ERR_INVALID` for an empty or non-UTF-8 id,
/// a TP size of 0, or an id that would read as another message. Any thread.
///
/// # Safety
/// `id` is readable for `id_len` bytes; `len` is NULL or points to the room in `out`,
/// which is writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_encode_failure_notice(
    id: *const u8,
    id_len: usize,
    tp_size: u16,
    out: *mut u8,
    len: *mut usize,
) -> kvdrain_status {
    boundary(|| {
        // SAFETY: as documented.
        let (id, room) = match unsafe { (span(id, id_len), len.as_mut()) } {
            (Ok(id), Some(room)) => (id, room),
            (Err(e), _) => return e,
            (_, None) => return KVDRAIN_ERR_NULL,
        };
        let Ok(request_id) = core::str::from_utf8(id) else {
            return KVDRAIN_ERR_INVALID;
        };
        let body = Body {
            request_id,
            tp_size,
        };
        let mut probe = [0u8; 0];
        let needed = match body.encode_failure(&mut probe) {
            Err(EncodeError::BufferTooSmall { needed }) => needed,
            Ok(n) => n,
            Err(_) => return KVDRAIN_ERR_INVALID,
        };
        if needed > *room {
            *room = needed;
            return KVDRAIN_ERR_BUFFER_TOO_SMALL;
        }
        if out.is_null() {
            return KVDRAIN_ERR_NULL;
        }
        // SAFETY: non-NULL and writable for `*room >= needed` bytes, per the contract.
        let buf = unsafe { core::slice::from_raw_parts_mut(out, needed) };
        match body.encode_failure(buf) {
            Ok(n) => {
                *room = n;
                KVDRAIN_OK
            }
            Err(_) => KVDRAIN_ERR_INVALID,
        }
    })
}
