#![doc = include_str!("../README.md")]
//!
//! ## States
//!
//! ```text
//!              register                 last edge resolved, none failed
//!  (pending) ───────────▶ COUNTING ─────────────────────────────────────▶ completed
//!                            │  │       last edge resolved, ≥1 failed
//!                            │  └───────────────────────────────────────▶ failed ──┐
//!                     abort  │  deadline                                           │
//!                            ▼  ▼                                                  ▼
//!                    ABORTED / EXPIRED ── every edge resolved ───────────▶ (SETTLING) ─▶ released
//!                       (quarantined)    (late notice, fence, gone)     settle end     ▲
//!                            │                    │ quarantine end first               │
//!                            └── quarantine ran out, edges outstanding ────────────────┘ (forced)
//! ```
//!
//! `SETTLING` (rule 8) is passed through at once, with no wait, unless a failure notice
//! (`PUSH_FAIL:`) or a [`gone`](Engine::gone) of its agent resolved one of the request's
//! edges less than [`settle`](Config::settle) ago: the write it reports may have
//! failed after it was posted and still be landing, so the blocks stay held until
//! `settle` after the last such notice or `gone` (or, for an aborted or expired
//! request, until its quarantine ends, if that comes first: a forced release is never
//! delayed). A settling request is decided
//! (`failed` was handed out, notices for it are `late`) but still holds its slot.
//!
//! An *edge* is one producer write that the request waits for: in counting mode (vLLM's
//! semantics) `n` notices from anyone; in named-edge mode one notice from each named
//! producer agent. An edge is *resolved* by its completion, by a `PUSH_FAIL:` notice, or
//! (named edges only) by a [`gone`](Engine::gone) or a [`fence`](Engine::fence) of its
//! agent. `completed` and `released` free the slot at
//! once; what the ledger remembers of decided ids (for `late`) lives in a separate
//! tombstone table that costs no capacity.
//!
//! The rules kept (the repository's `docs/replay-trace.md` writes them out with the replay
//! format that tests them): no block is released while a write may still land; every
//! request reaches exactly one of completed / failed / aborted / expired, at the latest at
//! the first clock advance that reaches its deadline; a failure never cuts the count short;
//! unknown ids create no state; bad input is reported and disturbs no other request;
//! terminal outcomes are sticky; a failure notice or a `gone` settles for `settle`
//! before its request's blocks are released (completions and fences need no settling); a
//! peer seen gone is not a peer that can no longer write.
//!
//! ## Drive contract
//!
//! **Time enters only through [`advance`](Engine::advance); events enter through
//! `handle_notification`, `register`, `abort`, `gone` and `fence`; decisions leave through
//! one pull, [`poll_decision`](Engine::poll_decision) (or the
//! [`decisions`](Engine::decisions) iterator over it), in the order they were taken.**
//! `advance`, `gone` and `fence` make their transitions at once (a deadline expires at the advance that reaches it, not at the
//! pull) and queue the decisions; a request whose last edge a notice resolved is decided
//! at the pull. The queue has fixed room (two decisions per slot, no allocation): a
//! decided request keeps its slot until its last decision is handed out.
//!
//! 1. Create a [`Ledger`] with a [`Config`]; [`split`](Ledger::split) it if notifications
//!    are drained on another thread.
//! 2. For each request that will be pushed to: [`register`](Engine::register) a
//!    [`Registration`] and keep the [`Pending`] ticket.
//! 3. For every NIXL notification: [`handle_notification`](Ingest::handle_notification)
//!    with the sender's [`AgentId`] and the raw bytes. If the thread that drains NIXL can
//!    read the engine's clock, give it the time of each batch first with
//!    [`set_arrival`](Ingest::set_arrival), so that a failure notice settles from when
//!    it arrived, not from the last `advance` (up to one engine step earlier).
//! 4. When it returns [`Noticed::Decided`] (or on each scheduler step), pull each
//!    [`Decision`] with [`poll_decision`](Engine::poll_decision) until `None` and act on
//!    it.
//! 5. On each scheduler step, [`advance`](Engine::advance) to the current monotonic time
//!    (an [`Instant`], see [Time](#time)) ([`next_timer`](Engine::next_timer) says when it matters next), then pull:
//!    deadlines, quarantine ends and settle ends fire at the advance, so a `Released` that
//!    waits for a failure notice or a `gone` to settle is decided there. What is dated
//!    when: see [Time](#time).
//! 6. On client cancel, [`abort`](Engine::abort).
//! 7. When the transport loses a producer or its metadata becomes invalid (a failed send
//!    or heartbeat, a reset connection, a dead process, an invalidated remote), report it
//!    with [`gone`](Engine::gone), then pull: its outstanding named edges fail now, as if
//!    it had sent a failure notice for each, and their blocks settle, because the bytes
//!    already handed to its transport keep landing. Use [`fence`](Engine::fence), which
//!    releases without settling, only when the transport can prove that nothing more of
//!    that producer's can land.
//! 8. When a registration was refused but producers may write into its blocks anyway
//!    (another rank's registration of the same request let them), hand the ledger the
//!    wait with [`hold_refused`](Engine::hold_refused), keep the blocks in a queue, and
//!    after each `advance` pull [`poll_refused_release`](Engine::poll_refused_release)
//!    until `None`: each end frees the front of the queue, a quarantine after the
//!    refusal. A hold changes no request, and the spec's `rejected` stays true.
//!
//! Pull after every event and the ledger behaves as if decisions left the moment they were
//! taken. A caller that pulls later gets the same decisions in the same order, but a
//! decided request holds its slot until its last decision (`Completed` or `Released`) is
//! handed out: `register` may refuse `Full` ([`Ledger::is_full`] says so) while
//! [`len`](Ledger::len) counts fewer than `capacity` requests.
//!
//! ```
//! use kvdrain::{AgentId, BlockHandle, Config, Decision, Expect, Instant, Ledger, Registration};
//!
//! let mut ledger: Ledger<1024, 8> = Ledger::new(Config::with_capacity(1024));
//! let (p0, p1) = (AgentId(0), AgentId(1));
//! let ticket = ledger
//!     .register(Registration {
//!         id: "cmpl-42-0",
//!         blocks: BlockHandle(7),
//!         expect: Expect::Edges(&[p0, p1]),
//!         deadline: None,
//!     })
//!     .expect("room in the table");
//! // p1 could not post its write: the failure waits for p0's write to land.
//! let _ = ledger.handle_notification(p1, b"PUSH_FAIL:cmpl-42-0:2");
//! let _ = ledger.handle_notification(p0, b"cmpl-42-0:2");
//! match ledger.poll_decision() {
//!     Some(Decision::Failed(f)) => assert_eq!(f.key(), ticket.key()),
//!     other => panic!("unexpected {other:?}"),
//! }
//! // p1's write may have failed after it was posted: its blocks settle first (rule 8).
//! ledger.advance(Instant::from_millis(4_999)).expect("clock forward");
//! assert_eq!(ledger.poll_decision(), None);
//! ledger.advance(Instant::from_millis(5_000)).expect("clock forward");
//! match ledger.poll_decision() {
//!     Some(Decision::Released(r)) => assert_eq!(r.into_free(), BlockHandle(7)),
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```
//!
//! ## Time
//!
//! The core reads no clock: the caller's monotonic clock enters as an [`Instant`] (a
//! point, in ms from an epoch the caller picks) through [`advance`](Engine::advance), and
//! every span the ledger is configured with or asked for is a [`Duration`] (ms):
//! [`Config::deadline`], [`Config::quarantine`], [`Config::settle`] and a
//! [`Registration::deadline`], which is relative to the registration. What the ledger
//! reports back is on the same clock: [`now`](Engine::now),
//! [`next_timer`](Engine::next_timer), and the two instants of a [`ClockError`]. Both
//! types are one `u64` (`#[repr(transparent)]`, `Copy`), so they cost nothing over the
//! integer; they exist so that a point and a span cannot be mixed up, and `Instant +
//! Duration` saturates at [`Instant::MAX`] ("never") rather than wrap into the past. Inside,
//! the atomics stay integers: the shared clock the ingest thread stamps failure notices
//! with holds the low 32 bits of the last `advance`'s milliseconds, converted at the edge.
//! The names are smoltcp's, not `std::time`'s (whose `Instant` reads a clock and whose
//! `Duration` counts nanoseconds): where both are in scope, name these `kvdrain::Instant`
//! and `kvdrain::Duration`.
//!
//! **What is dated when.** Every input is dated on the engine's clock; the core reads
//! none, so each date is a time it was given:
//!
//! | input | dated at |
//! | --- | --- |
//! | [`register`](Engine::register) | the clock (the last `advance`): its deadline counts from there |
//! | completion notice | not dated: it needs no settling |
//! | failure notice (`PUSH_FAIL:`) | the later of the clock and the ingest half's arrival time ([`set_arrival`](Ingest::set_arrival)), the clock if none was given; its request settles until then + `settle` |
//! | [`abort`](Engine::abort), [`abort_id`](Engine::abort_id) | the clock: the quarantine ends then + `quarantine` |
//! | [`gone`](Engine::gone) | the clock: settles until then + `settle` |
//! | [`fence`](Engine::fence) | the clock (a fence needs no settling: only its decisions' order depends on it) |
//! | deadline passing | the deadline itself (the clock at registration + the deadline), acted on at the first `advance` that reaches it; the quarantine ends at the deadline + `quarantine` |
//! | settle end, quarantine end | fire at the first `advance` that reaches them |
//!
//! So to date an abort, a `gone` or a registration at the moment it happened, `advance`
//! to that moment first (the Python and C bindings offer this as an optional time on the
//! call). The clock and the arrival time are kept as stamps of 32 bits in the shared
//! half: exact while a notice's date is within 2^31 ms (24.8 days) of the clock; one
//! further behind reads as later, which only delays a release.
//!
//! Where time leaves Rust it is an integer in ms again, because a text format, a C header
//! and a Python signature have no such types: the replay format (`at MS`, `deadline=MS`,
//! `config settle_ms=MS`), the C ABI (`uint64_t` ms) and the Python module (`int` ms)
//! convert at their boundary with [`Instant::from_millis`] / [`Duration::from_millis`] and
//! [`millis`](Instant::millis). A caller in Rust converts once, where it reads its clock.
//!
//! ## Threads
//!
//! [`Ledger::split`] gives an [`Ingest`] (the thread that drains NIXL notifications) and an
//! [`Engine`] (the scheduler thread). `Ingest::handle_notification` takes no lock and never
//! waits for the engine; every other operation belongs to the `Engine`. Both halves may
//! also live on one thread, which is what the `Ledger` convenience methods do; holding
//! `&mut Ledger`, [`Ledger::handle_notification`] knows no other thread can touch the
//! ledger, so it resolves an edge with plain stores where the split halves use a CAS.
//!
//! | thread | methods |
//! | --- | --- |
//! | ingest ([`Ingest`]) | [`handle_notification`](Ingest::handle_notification), [`set_arrival`](Ingest::set_arrival), [`arrival`](Ingest::arrival), [`counters`](Ingest::counters) |
//! | engine ([`Engine`]) | [`register`](Engine::register), [`abort`](Engine::abort), [`abort_id`](Engine::abort_id), [`gone`](Engine::gone), [`fence`](Engine::fence), [`advance`](Engine::advance), [`poll_decision`](Engine::poll_decision), [`decisions`](Engine::decisions), and the getters |
//! | either, not split ([`Ledger`]) | all of the above, one at a time (`&mut self`) |
//!
//! **One ingest thread per ledger.** `Ingest` is neither `Clone` nor `Copy` and `split`
//! takes `&mut self`, so a second ingest half cannot exist; the ready ring is single-producer
//! and the ingest counters are the half's own. An engine that drains notifications on
//! several threads funnels them to one, or keeps one ledger per draining thread. The same
//! holds for the engine half.
//!
//! The halves borrow the ledger: run them under `std::thread::scope`, or split a ledger
//! that lives as long as the process (a `static`, or `Box::leak`) to get `'static` halves
//! for `std::thread::spawn`.
//!
//! What each atomic protects, and the orderings used: the table in `src/sync.rs`, the
//! one place the crate's atomics come from.
//!
//! Why these orderings: the `Release`/`Acquire` pairs carry the owner's plain-data writes
//! (identity, edges, tombstones) to the ingest thread, and the ingest thread's last edge
//! (and whatever the producer wrote before its notice) to the engine through the ready
//! ring, so a decision taken by the engine happens after every notice that led to it. The
//! state word's `AcqRel` CAS makes each transition see the previous one whoever made it.
//! Nothing needs `SeqCst`: no decision depends on the order of two different atomics
//! seen from two threads.
//!
//! The decision point of a request is the single CAS that makes its outstanding count 0
//! (a notice, a `gone` or a fence) or that moves it out of `Counting` (abort, deadline): whichever
//! wins, the other sees the result and stands down, so each request gets exactly one
//! decision. A slot is reused only after its generation changed, and every CAS names the
//! generation it read, so a notice for a finished request can never count for the next one
//! (ABA). Every race is model-checked with loom (`tests/loom.rs`, built with
//! `RUSTFLAGS="--cfg kvdrain_loom"` against the patched loom in `vendor/loom`), and a
//! two-thread stress test checks the same rules on real threads
//! (`tests/tests/stress.rs` in the workspace).
//!
//! ## Capacities
//!
//! `Ledger<N, E>`: `N` requests (power of two ≤ 65 536), `E` named edges per request
//! (≤ [`MAX_EDGES`] = 64, default 8). Tombstones remember the last ~`4·N` decided ids. Everything is inline;
//! [`Ledger::new`] builds the value on the stack, so put large ledgers in a `static` or
//! construct them on a thread with a big enough stack.

#![cfg_attr(not(any(test, kvdrain_loom)), no_std)]
#![forbid(unsafe_code)]
#![deny(unused_must_use)]
#![warn(missing_docs)]

mod abort;
#[cfg(kvdrain_loom)]
mod broken;
mod clock;
mod config;
mod counters;
mod decide;
mod decided;
mod engine;
mod error;
mod fingerprint;
mod index;
mod ingest;
mod ledger;
mod lost_agent;
mod owner;
mod poll;
pub mod producer;
mod ready;
mod record;
mod refused_hold;
mod register;
mod shared;
mod slot;
mod stamp;
mod state_word;
mod sync;
mod ticket;
mod time;
mod timers;
mod tombstones;
pub mod wire;

pub use config::Config;
pub use counters::{Counters, EngineCounters, IngestCounters};
pub use engine::Engine;
pub use error::{AbortError, ClockError, IgnoreReason, Ignored, RegisterError, RegisterErrorKind};
pub use ingest::{Ingest, Noticed};
pub use ledger::Ledger;
pub use record::{EdgeOutcome, Ended, FailureCause, Record, Recorded, RecordedEdges, Split};
pub use refused_hold::{REFUSED_HOLD_ENDS, RefusedHold};
pub use ticket::{
    AgentId, BlockHandle, Decision, Drained, Expect, Failed, Outstanding, Pending, QuarantineCause,
    Quarantined, Registration, Released, RequestKey,
};
pub use time::{Duration, Instant};

/// The most edges one request may wait for: the largest `Expect::Count`, the largest
/// `E` of a [`Ledger<N, E>`](Ledger), and the width of [`Outstanding::Edges`]' mask.
pub const MAX_EDGES: usize = 64;
// The state word's outstanding field (7 bits) and the edge mask (`u64`) hold it.
const _: () = assert!(MAX_EDGES < 128 && MAX_EDGES <= u64::BITS as usize);

// Both halves must be able to move to their threads.
static_assertions::assert_impl_all!(Ingest<'static, 64, 8>: Send);
static_assertions::assert_impl_all!(Engine<'static, 64, 8>: Send);
static_assertions::assert_impl_all!(Ledger<64, 8>: Send, Sync);
