//! The ingest half: notifications in, one at a time or in batches.

use kvdrain::{AgentId, IgnoreReason, Ignored, IngestCounters, Instant, Noticed};

use crate::group::{CoreIngest, kvdrain_ingest, with_half};
use crate::status::kvdrain_status::{self, *};
use crate::status::{span, write_opt};

/// What one notification did. Ignored notices are data, not errors: the call still
/// returns `KVDRAIN_OK`, nothing else changed, and the matching counter went up.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_notice {
    /// It resolved an edge; others are still outstanding.
    KVDRAIN_NOTICE_COUNTED = 0,
    /// It resolved the request's last edge: a decision waits for `kvdrain_engine_poll`.
    KVDRAIN_NOTICE_DECIDED = 1,
    /// Ignored: not a push-mode message (or a TP field out of range, or an id not UTF-8).
    KVDRAIN_IGNORED_MALFORMED = 2,
    /// Ignored: `HB:` or `PUSH_REG:`, producer-bound messages.
    KVDRAIN_IGNORED_NOT_FOR_CONSUMER = 3,
    /// Ignored: no such request tracked or remembered; no state was created.
    KVDRAIN_IGNORED_UNKNOWN = 4,
    /// Ignored: the request was decided already.
    KVDRAIN_IGNORED_LATE = 5,
    /// Ignored (named-edge mode): this agent's edge was resolved already.
    KVDRAIN_IGNORED_DUPLICATE = 6,
    /// Ignored (named-edge mode): the agent is not one of the request's edges.
    KVDRAIN_IGNORED_UNEXPECTED_SENDER = 7,
}

impl kvdrain_notice {
    fn of(result: Result<Noticed, Ignored<'_>>) -> Self {
        use kvdrain_notice::*;
        match result {
            Ok(Noticed::Counted) => KVDRAIN_NOTICE_COUNTED,
            Ok(Noticed::Decided) => KVDRAIN_NOTICE_DECIDED,
            Err(ignored) => match ignored.reason {
                IgnoreReason::Malformed(_) => KVDRAIN_IGNORED_MALFORMED,
                IgnoreReason::NotForConsumer => KVDRAIN_IGNORED_NOT_FOR_CONSUMER,
                IgnoreReason::Unknown => KVDRAIN_IGNORED_UNKNOWN,
                IgnoreReason::Late => KVDRAIN_IGNORED_LATE,
                IgnoreReason::Duplicate => KVDRAIN_IGNORED_DUPLICATE,
                IgnoreReason::UnexpectedSender => KVDRAIN_IGNORED_UNEXPECTED_SENDER,
            },
        }
    }
}

fn feed(ingest: &mut CoreIngest, agent: u16, bytes: &[u8]) -> kvdrain_notice {
    kvdrain_notice::of(ingest.handle_notification(AgentId(agent), bytes))
}

/// Feeds one NIXL notification: `len` raw bytes from producer agent `agent` (your number
/// for the sender), borrowed for the call. Writes what it did to `*outcome` unless NULL.
/// Never blocks, never allocates. Ingest thread.
///
/// After `KVDRAIN_NOTICE_DECIDED`, the engine thread should call `kvdrain_engine_poll`.
///
/// # Safety
/// `ingest` is NULL or a live ingest handle; `bytes` is readable for `len` bytes (NULL
/// with `len` 0 is an empty message); `outcome` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ingest_feed(
    ingest: *mut kvdrain_ingest,
    agent: u16,
    bytes: *const u8,
    len: usize,
    outcome: *mut kvdrain_notice,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(ingest, |half| {
            let bytes = match span(bytes, len) {
                Ok(b) => b,
                Err(e) => return e,
            };
            write_opt(outcome, feed(half, agent, bytes));
            KVDRAIN_OK
        })
    }
}

/// Feeds `n` notifications in order, from parallel arrays: message `i` came from
/// `agents[i]` and is `lens[i]` bytes at `msgs[i]`. Fits an engine that receives
/// notifications grouped per sender (TensorRT-LLM's `unordered_map<string,
/// vector<msg>>`): flatten the map into the three arrays. Writes each message's outcome
/// to `outcomes[i]` unless `outcomes` is NULL, and the number of `DECIDED` outcomes to
/// `*decided` unless NULL. Every pointer is checked before the first message is fed:
/// on an error, nothing was fed. Ingest thread.
///
/// # Safety
/// `ingest` is NULL or a live ingest handle; `agents`, `msgs` and `lens` are readable
/// for `n` entries and each `msgs[i]` for `lens[i]` bytes; `outcomes` is NULL or writable
/// for `n` entries; `decided` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ingest_feed_batch(
    ingest: *mut kvdrain_ingest,
    n: usize,
    agents: *const u16,
    msgs: *const *const u8,
    lens: *const usize,
    outcomes: *mut kvdrain_notice,
    decided: *mut usize,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(ingest, |half| {
            let (agents, msgs, lens) = match (span(agents, n), span(msgs, n), span(lens, n)) {
                (Ok(a), Ok(m), Ok(l)) => (a, m, l),
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return e,
            };
            if let Some(bad) = msgs.iter().zip(lens).find_map(|(&m, &l)| span(m, l).err()) {
                return bad;
            }
            let mut count = 0;
            for i in 0..n {
                let Ok(bytes) = span(msgs[i], lens[i]) else {
                    return KVDRAIN_ERR_NULL; // checked above
                };
                let outcome = feed(half, agents[i], bytes);
                count += usize::from(outcome == kvdrain_notice::KVDRAIN_NOTICE_DECIDED);
                if !outcomes.is_null() {
                    outcomes.add(i).write(outcome);
                }
            }
            write_opt(decided, count);
            KVDRAIN_OK
        })
    }
}

/// Tells the ingest half when the notifications fed from now on arrived: `now_ms`, on
/// the clock `kvdrain_engine_advance` is given, at which the ingest thread took them from
/// the transport. Call it once per batch, before feeding it. A failure notice
/// (`PUSH_FAIL:`) is then dated at the later of this time and the engine's clock, so its
/// blocks settle for `settle_ms` from its arrival rather than from the engine's last
/// advance (which an engine that advances once per step leaves up to a step behind).
/// Without a call, a failure notice is dated at the engine's last advance, as before.
/// Completions are not dated. A time earlier than one given before is ignored (the later
/// one stays, which can only delay a release): not an error. Give a time with every
/// batch or never: one left more than 2^31 ms (24.8 days) behind the engine's clock reads
/// as ahead of it and dates notices up to that much late (a delay, never an early
/// release). Never blocks, never allocates. Ingest thread.
///
/// # Safety
/// `ingest` is NULL or a live ingest handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ingest_set_arrival(
    ingest: *mut kvdrain_ingest,
    now_ms: u64,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(ingest, |half| {
            half.set_arrival(Instant::from_millis(now_ms));
            KVDRAIN_OK
        })
    }
}

/// What the ingest half saw (one counter per outcome).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct kvdrain_ingest_counters {
    /// Completions that resolved an edge.
    pub completions: u64,
    /// Failure notices (`PUSH_FAIL:`) that resolved an edge.
    pub failure_notices: u64,
    /// Notices that resolved a request's last edge.
    pub last_edges: u64,
    /// Ignored: malformed.
    pub malformed: u64,
    /// Ignored: not for a consumer.
    pub not_for_consumer: u64,
    /// Ignored: unknown id.
    pub unknown: u64,
    /// Ignored: late.
    pub late: u64,
    /// Ignored: duplicate.
    pub duplicate: u64,
    /// Ignored: unexpected sender.
    pub unexpected_sender: u64,
    /// Invariant violations of the ready ring (always 0).
    pub ready_overflow: u64,
}

impl From<&IngestCounters> for kvdrain_ingest_counters {
    fn from(c: &IngestCounters) -> Self {
        // Every field named, no `..`: a counter the core adds does not compile here until
        // the C ABI carries it too.
        let IngestCounters {
            completions,
            failure_notices,
            last_edges,
            malformed,
            not_for_consumer,
            unknown,
            late,
            duplicate,
            unexpected_sender,
            ready_overflow,
        } = *c;
        kvdrain_ingest_counters {
            completions,
            failure_notices,
            last_edges,
            malformed,
            not_for_consumer,
            unknown,
            late,
            duplicate,
            unexpected_sender,
            ready_overflow,
        }
    }
}

/// Copies the ingest half's counters into `*out`. Ingest thread.
///
/// # Safety
/// `ingest` is NULL or a live ingest handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ingest_get_counters(
    ingest: *mut kvdrain_ingest,
    out: *mut kvdrain_ingest_counters,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(ingest, |half| {
            if out.is_null() {
                return KVDRAIN_ERR_NULL;
            }
            write_opt(out, kvdrain_ingest_counters::from(half.counters()));
            KVDRAIN_OK
        })
    }
}

/// Frees the ingest half. NULL is accepted; a second free does nothing while another
/// handle of the ledger lives. A call still inside this handle (another thread's) is
/// waited for; later calls through it return `KVDRAIN_ERR_FREED` while another handle of
/// the ledger lives.
///
/// # Safety
/// `ingest` is NULL or an ingest handle whose ledger group is still allocated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_ingest_free(ingest: *mut kvdrain_ingest) {
    // SAFETY: as documented.
    unsafe { crate::group::free_half(ingest.cast_const()) }
}
