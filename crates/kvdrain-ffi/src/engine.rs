//! The engine half: register, abort, gone, fence, advance, poll, counters and getters.

use core::mem::MaybeUninit;

use kvdrain::{
    AbortError, AgentId, BlockHandle, ClockError, Duration, EngineCounters, Expect, Instant,
    Quarantined, RegisterErrorKind, Registration,
};

use crate::decisions::{Out, kvdrain_decision, kvdrain_quarantined};
use crate::group::{EngineSide, kvdrain_engine, with_half};
use crate::status::kvdrain_status::{self, *};
use crate::status::{span, write_opt};
use crate::tickets::Lookup;

/// `uint64_t` for "no timer pending" (`kvdrain_engine_info.next_timer_ms`).
pub const KVDRAIN_NO_TIMER: u64 = u64::MAX;

/// A request to track.
///
/// Counting mode (vLLM's semantics): `agents_len` 0 and `count` in `1..=64` — the request
/// waits for `count` notices from anyone. Named-edge mode: `agents` lists `1..=8` distinct
/// producer agent ids and `count` is 0 — the request waits for exactly one notice from
/// each (duplicates and unexpected senders are detected).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvdrain_registration {
    /// The consumer's request id as it appears in completions: UTF-8 bytes, not
    /// NUL-terminated. Borrowed for the call.
    pub id: *const u8,
    /// Bytes in `id`.
    pub id_len: usize,
    /// Your handle on the request's destination blocks; handed back in `COMPLETED` or
    /// `RELEASED`.
    pub blocks: u64,
    /// Counting mode: notices to wait for (`1..=64`); 0 in named-edge mode.
    pub count: u32,
    /// Named-edge mode: the producer agents (`agents_len` of them); borrowed for the call.
    pub agents: *const u16,
    /// Agents in `agents`; 0 in counting mode.
    pub agents_len: usize,
    /// Milliseconds from now to the deadline; 0 uses the ledger's `deadline_ms`.
    pub deadline_ms: u64,
}

/// What the engine decided (one counter per outcome and cause).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct kvdrain_engine_counters {
    /// Registrations accepted.
    pub registered: u64,
    /// Registrations refused: table full.
    pub rejected_full: u64,
    /// Registrations refused: id tracked already.
    pub rejected_duplicate_id: u64,
    /// Registrations refused: bad count or edge list.
    pub rejected_invalid: u64,
    /// `COMPLETED` decisions.
    pub completed: u64,
    /// `FAILED` decisions.
    pub failed: u64,
    /// Aborts that quarantined a request.
    pub aborted: u64,
    /// `EXPIRED` decisions.
    pub expired: u64,
    /// `RELEASED` after every edge resolved.
    pub released: u64,
    /// `RELEASED` with `forced` (quarantine ran out).
    pub released_forced: u64,
    /// Aborts of unknown requests.
    pub abort_unknown: u64,
    /// Aborts of requests decided first.
    pub abort_late: u64,
    /// Named edges resolved as failed by a fence.
    pub fenced_edges: u64,
    /// Named edges resolved as failed by `kvdrain_engine_gone` (they settle).
    pub gone_edges: u64,
    /// Requests that started waiting for a failure notice or a gone to settle.
    pub settle_started: u64,
    /// Of those, how many were released when the settling ended (the others by their
    /// quarantine running out first; both are also counted in `released` or
    /// `released_forced`).
    pub settle_released: u64,
    /// Requests waiting to settle now (a gauge); each holds its slot and its blocks.
    pub settling: u64,
}

impl From<&EngineCounters> for kvdrain_engine_counters {
    fn from(c: &EngineCounters) -> Self {
        // Every field named, no `..`: a counter the core adds does not compile here until
        // the C ABI carries it too.
        let EngineCounters {
            registered,
            rejected_full,
            rejected_duplicate_id,
            rejected_invalid,
            completed,
            failed,
            aborted,
            expired,
            released,
            released_forced,
            abort_unknown,
            abort_late,
            fenced_edges,
            gone_edges,
            settle_started,
            settle_released,
            settling,
        } = *c;
        kvdrain_engine_counters {
            registered,
            rejected_full,
            rejected_duplicate_id,
            rejected_invalid,
            completed,
            failed,
            aborted,
            expired,
            released,
            released_forced,
            abort_unknown,
            abort_late,
            fenced_edges,
            gone_edges,
            settle_started,
            settle_released,
            settling,
        }
    }
}

/// `bytes` as UTF-8, with a fast path for ASCII (what request ids are in practice).
#[inline]
pub(crate) fn utf8(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is valid UTF-8.
        Some(unsafe { core::str::from_utf8_unchecked(bytes) })
    } else {
        core::str::from_utf8(bytes).ok()
    }
}

/// The most agents a registration may list before the core sees it (the core refuses
/// more than `KVDRAIN_MAX_EDGES` itself and counts the refusal).
const AGENT_LIST_MAX: usize = 64;

fn register(side: &mut EngineSide, r: &kvdrain_registration, key_out: *mut u64) -> kvdrain_status {
    // SAFETY: the caller's spans are valid for the call (contract of register).
    let (id, agents) = match unsafe { (span(r.id, r.id_len), span(r.agents, r.agents_len)) } {
        (Ok(id), Ok(agents)) => (id, agents),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let Some(id) = utf8(id) else {
        return KVDRAIN_ERR_INVALID;
    };
    // An id whose completions cannot exist on the wire would only ever expire.
    if kvdrain::wire::check_request_id(id).is_err() {
        return KVDRAIN_ERR_INVALID;
    }
    // Initialised only in named-edge mode: counting mode (the hot path) skips the copy.
    let list: [AgentId; AGENT_LIST_MAX];
    let expect = if agents.is_empty() {
        match u8::try_from(r.count) {
            Ok(n) => Expect::Count(n),
            Err(_) => return KVDRAIN_ERR_BAD_COUNT,
        }
    } else {
        if r.count != 0 {
            return KVDRAIN_ERR_INVALID;
        }
        if agents.len() > AGENT_LIST_MAX {
            return KVDRAIN_ERR_BAD_EDGES;
        }
        list = core::array::from_fn(|i| AgentId(agents.get(i).copied().unwrap_or(0)));
        Expect::Edges(&list[..agents.len()])
    };
    let registration = Registration {
        id,
        blocks: BlockHandle(r.blocks),
        expect,
        deadline: (r.deadline_ms != 0).then_some(Duration::from_millis(r.deadline_ms)),
    };
    // A ticket is forgotten when its decision is polled, so a caller that polls late
    // keeps the tickets of decided requests: where the core would take one more request
    // than the table holds, refuse as full (the core refuses everything else itself, in
    // its own order: a prompt poller never gets here).
    if side.tickets.len() >= side.capacity && side.engine.has_room() {
        return KVDRAIN_ERR_FULL;
    }
    match side.engine.register(registration) {
        Ok(ticket) => {
            let key = ticket.key().get();
            side.tickets.insert(ticket);
            // SAFETY: NULL or writable, per the contract.
            unsafe { write_opt(key_out, key) };
            KVDRAIN_OK
        }
        Err(e) => match e.kind {
            RegisterErrorKind::Full => KVDRAIN_ERR_FULL,
            RegisterErrorKind::DuplicateId => KVDRAIN_ERR_DUPLICATE_ID,
            RegisterErrorKind::BadCount => KVDRAIN_ERR_BAD_COUNT,
            RegisterErrorKind::BadEdges => KVDRAIN_ERR_BAD_EDGES,
        },
    }
}

/// Starts tracking a request; writes its key (registration order, from 0) to `*key_out`
/// unless `key_out` is NULL. Engine thread.
///
/// Errors (nothing changed): `KVDRAIN_ERR_FULL` (`capacity` requests tracked, or decided
/// requests wait for `kvdrain_engine_poll` with their slots), `KVDRAIN_ERR_DUPLICATE_ID`,
/// `KVDRAIN_ERR_BAD_COUNT`, `KVDRAIN_ERR_BAD_EDGES`, `KVDRAIN_ERR_INVALID` (id not UTF-8;
/// an id that can never complete: empty, `HB`, `HB:...`, `PUSH_REG:...`, `PUSH_FAIL:...`,
/// whose completion would read as another message; or both a count and agents),
/// `KVDRAIN_ERR_NULL`. (The core, and so `kvdrain replay`, accepts such ids: they expire.)
///
/// # Safety
/// `engine` is NULL or a live engine handle; `registration` is NULL or points to a
/// registration whose `id` and `agents` spans are readable for the call; `key_out` is NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_register(
    engine: *mut kvdrain_engine,
    registration: *const kvdrain_registration,
    key_out: *mut u64,
) -> kvdrain_status {
    // SAFETY: NULL or readable, per the contract.
    let Some(r) = (unsafe { registration.as_ref() }) else {
        return KVDRAIN_ERR_NULL;
    };
    // SAFETY: as documented.
    unsafe { with_half(engine, |side| register(side, r, key_out)) }
}

fn abort_done(
    side: &mut EngineSide,
    result: Result<Quarantined, AbortError>,
    out: *mut kvdrain_quarantined,
) -> kvdrain_status {
    match result {
        Ok(q) => {
            side.tickets.forget(q.key().get());
            // SAFETY: NULL or writable, per the contract of the caller.
            unsafe { write_opt(out, kvdrain_quarantined::from(&q)) };
            KVDRAIN_OK
        }
        Err(AbortError::Late) => KVDRAIN_ERR_LATE,
        Err(AbortError::Unknown) => KVDRAIN_ERR_UNKNOWN,
    }
}

/// Aborts the request registered under `key`: it is over for the client now (`*out`
/// describes it unless NULL); its blocks stay fenced until a `RELEASED` comes from poll
/// (every edge resolved, or the quarantine ran out). Engine thread.
///
/// Errors: `KVDRAIN_ERR_LATE` (decided first: its decision comes from poll),
/// `KVDRAIN_ERR_STALE` (this key was aborted before, or its decision was taken from the
/// core already: it comes, or came, out of poll),
/// `KVDRAIN_ERR_UNKNOWN` (no registration got this key: it is above every key issued; a
/// made-up key below the last one issued reads as `KVDRAIN_ERR_STALE`).
///
/// # Safety
/// `engine` is NULL or a live engine handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_abort(
    engine: *mut kvdrain_engine,
    key: u64,
    out: *mut kvdrain_quarantined,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| match side.tickets.take(key) {
            Lookup::Live(ticket) => {
                let result = side.engine.abort(ticket);
                abort_done(side, result, out)
            }
            Lookup::Spent => KVDRAIN_ERR_STALE,
            Lookup::NeverIssued => KVDRAIN_ERR_UNKNOWN,
        })
    }
}

/// Aborts a request by id (UTF-8 bytes, borrowed for the call), for callers that keep ids
/// rather than keys. As `kvdrain_engine_abort`, with `KVDRAIN_ERR_UNKNOWN` for an id that
/// is neither tracked nor remembered and `KVDRAIN_ERR_LATE` for one decided already.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `id` is readable for `id_len` bytes; `out` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_abort_id(
    engine: *mut kvdrain_engine,
    id: *const u8,
    id_len: usize,
    out: *mut kvdrain_quarantined,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            let id = match span(id, id_len) {
                Ok(bytes) => match core::str::from_utf8(bytes) {
                    Ok(id) => id,
                    Err(_) => return KVDRAIN_ERR_INVALID,
                },
                Err(e) => return e,
            };
            let result = side.engine.abort_id(id);
            abort_done(side, result, out)
        })
    }
}

/// Pulls decisions from the core straight into the caller's array while it has room.
fn poll(side: &mut EngineSide, out: &mut Out<'_>) {
    while !out.is_full() {
        let Some(d) = side.engine.poll_decision() else {
            return;
        };
        let d = kvdrain_decision::from_core(d);
        if d.ends_ticket() {
            side.tickets.forget(d.key);
        }
        out.push(d);
    }
}

/// Takes decisions out, oldest first: `*n` is the room in `out` on entry and the number
/// written on return. Nothing is allocated. When `*n` comes back equal to the room given,
/// more may wait: call again. Engine thread.
///
/// Every decision comes out here, in the order it was taken: those `kvdrain_engine_advance`,
/// `kvdrain_engine_gone` and `kvdrain_engine_fence` took (they wait in the core, in fixed room allocated with
/// the ledger), then `COMPLETED`, `FAILED` and `RELEASED` of requests whose last notice
/// the ingest half fed (decided by this call). Poll until fewer than asked come back
/// after every call that can decide: a decided request keeps its slot until its last
/// decision (`COMPLETED` or `RELEASED`) is taken out, so a caller that polls late may see
/// `KVDRAIN_ERR_FULL` with fewer than `capacity` requests tracked.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `n` is NULL or points to the room in `out`;
/// `out` is writable for that many decisions (it may be NULL when the room is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_poll(
    engine: *mut kvdrain_engine,
    out: *mut kvdrain_decision,
    n: *mut usize,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            let Some(room) = n.as_mut() else {
                return KVDRAIN_ERR_NULL;
            };
            let slots: &mut [MaybeUninit<kvdrain_decision>] = if *room == 0 {
                &mut []
            } else if out.is_null() {
                return KVDRAIN_ERR_NULL;
            } else if *room > isize::MAX as usize / size_of::<kvdrain_decision>() {
                return KVDRAIN_ERR_INVALID;
            } else {
                core::slice::from_raw_parts_mut(out.cast(), *room)
            };
            let mut out = Out::new(slots);
            poll(side, &mut out);
            *room = out.len();
            KVDRAIN_OK
        })
    }
}

/// Advances the clock to `now_ms` (your monotonic clock, in ms) and decides every deadline,
/// settle end and quarantine end at or before it, in registration order: `EXPIRED`, and a
/// forced `RELEASED` when a quarantine is over (or `RELEASED` when a failure notice or a
/// gone has settled).
/// The decisions wait for `kvdrain_engine_poll`. Engine thread.
///
/// Errors (nothing changed): `KVDRAIN_ERR_CLOCK_BACKWARDS`.
///
/// # Safety
/// `engine` is NULL or a live engine handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_advance(
    engine: *mut kvdrain_engine,
    now_ms: u64,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            match side.engine.advance(Instant::from_millis(now_ms)) {
                Ok(()) => KVDRAIN_OK,
                Err(ClockError::Backwards { .. }) => KVDRAIN_ERR_CLOCK_BACKWARDS,
            }
        })
    }
}

/// The transport saw `agent` go away (a send or heartbeat to it failed, its connection
/// was reset, its process died, its metadata was invalidated) but cannot prove that none
/// of its bytes already on the way can land: resolves, as failed, every outstanding named
/// edge of `agent` now, exactly as a failure notice from `agent` for each of those
/// requests would. Requests whose last edge this resolves are decided now (`FAILED`); their
/// blocks settle for `settle_ms` from now (`RELEASED` comes from a later
/// `kvdrain_engine_advance`, at once with `settle_ms` 0; an aborted or expired request gets
/// only its `RELEASED`, forced if its quarantine ends first). Edges already resolved,
/// counting-mode requests and requests registered later are not touched. The decisions
/// wait for `kvdrain_engine_poll`. Writes the number of edges resolved to `*resolved`
/// unless NULL. Engine thread.
///
/// Report a lost producer with this, never with `kvdrain_engine_fence`, unless the
/// transport can prove that nothing of it can still land.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `resolved` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_gone(
    engine: *mut kvdrain_engine,
    agent: u16,
    resolved: *mut u32,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            let n = side.engine.gone(AgentId(agent));
            write_opt(resolved, n);
            KVDRAIN_OK
        })
    }
}

/// The transport proves that `agent` can no longer write into this node (nothing of it is
/// in flight and none of it can land): resolves, as failed, every outstanding named edge
/// of `agent`, with no settling (counting-mode requests are not touched). Requests whose
/// last edge this resolves are decided now (`FAILED` then `RELEASED` unless a failure
/// notice or gone of another edge still settles, or `RELEASED` for aborted/expired ones);
/// the decisions wait for `kvdrain_engine_poll`. Writes the number of edges resolved to
/// `*resolved` unless NULL. Engine thread. A peer merely seen gone (dead, reset,
/// invalidated) proves nothing of the kind: use `kvdrain_engine_gone`.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `resolved` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_fence(
    engine: *mut kvdrain_engine,
    agent: u16,
    resolved: *mut u32,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            let n = side.engine.fence(AgentId(agent));
            write_opt(resolved, n);
            KVDRAIN_OK
        })
    }
}

/// Copies the engine half's counters into `*out`. Engine thread.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_get_counters(
    engine: *mut kvdrain_engine,
    out: *mut kvdrain_engine_counters,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            if out.is_null() {
                return KVDRAIN_ERR_NULL;
            }
            write_opt(out, kvdrain_engine_counters::from(side.engine.counters()));
            KVDRAIN_OK
        })
    }
}

/// A snapshot of the engine's clock and load.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct kvdrain_engine_info {
    /// The clock: the last `kvdrain_engine_advance`.
    pub now_ms: u64,
    /// When the next deadline, settle end (of a failure notice or a gone) or quarantine end
    /// falls, or `KVDRAIN_NO_TIMER`: the time to advance to next if nothing else comes.
    pub next_timer_ms: u64,
    /// Requests tracked now (quarantined ones included).
    pub tracked: usize,
    /// Decisions `kvdrain_engine_advance`, `_gone` and `_fence` took that wait for
    /// `kvdrain_engine_poll` (those of requests the ingest half drained are taken by the
    /// poll and not counted).
    pub queued_decisions: usize,
    /// Keys whose requests are still counting (abortable).
    pub live_keys: usize,
}

/// Writes the engine's clock, next timer and load into `*out`. Engine thread.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_get_info(
    engine: *mut kvdrain_engine,
    out: *mut kvdrain_engine_info,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            if out.is_null() {
                return KVDRAIN_ERR_NULL;
            }
            let info = kvdrain_engine_info {
                now_ms: side.engine.now().millis(),
                next_timer_ms: side
                    .engine
                    .next_timer()
                    .map_or(KVDRAIN_NO_TIMER, Instant::millis),
                tracked: side.engine.len(),
                queued_decisions: side.engine.queued_decisions(),
                live_keys: side.tickets.len(),
            };
            write_opt(out, info);
            KVDRAIN_OK
        })
    }
}

/// Frees the engine half. NULL is accepted; a second free does nothing while another
/// handle of the ledger lives. A call still inside this handle (another thread's) is
/// waited for; later calls through it return `KVDRAIN_ERR_FREED` while another handle of
/// the ledger lives.
///
/// # Safety
/// `engine` is NULL or an engine handle whose ledger group is still allocated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_free(engine: *mut kvdrain_engine) {
    // SAFETY: as documented.
    unsafe { crate::group::free_half(engine.cast_const()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C counters are the core's, field for field: every core counter set to a
    /// distinct value comes out under its own name, and the structs have the same size
    /// (all `u64`), so the C struct holds nothing the core does not count.
    #[test]
    fn engine_counters_are_the_cores_field_for_field() {
        let core = EngineCounters {
            registered: 1,
            rejected_full: 2,
            rejected_duplicate_id: 3,
            rejected_invalid: 4,
            completed: 5,
            failed: 6,
            aborted: 7,
            expired: 8,
            released: 9,
            released_forced: 10,
            abort_unknown: 11,
            abort_late: 12,
            fenced_edges: 13,
            gone_edges: 14,
            settle_started: 15,
            settle_released: 16,
            settling: 17,
        };
        let c = kvdrain_engine_counters::from(&core);
        assert_eq!(
            [
                c.registered,
                c.rejected_full,
                c.rejected_duplicate_id,
                c.rejected_invalid,
                c.completed,
                c.failed,
                c.aborted,
                c.expired,
                c.released,
                c.released_forced,
                c.abort_unknown,
                c.abort_late,
                c.fenced_edges,
                c.gone_edges,
                c.settle_started,
                c.settle_released,
                c.settling,
            ],
            core::array::from_fn::<u64, 17, _>(|i| i as u64 + 1)
        );
        assert_eq!(
            size_of::<kvdrain_engine_counters>(),
            size_of::<EngineCounters>()
        );
    }
}
