#![doc = include_str!("../README.md")]
//!
//! ## The two sides
//!
//! ```text
//!        PRODUCER rank (ProducerDriver)                    CONSUMER rank (ConsumerDriver)
//!  offer ─▶ OFFERED ─┐                                 register ─▶ core Ledger (edges from
//!                    │◀──────── PUSH_REG ──────────────── the topology: named or count)
//!  pair: exact id,   ▼                                      │  HB: P ids, every lease/6,
//!  transfer_id,  PUSHING: PushPlan per request               │◀─ until the decision (F9)
//!  base id       │  WRITE + completion ─────── data ───────▶│
//!                │  Success ─────────── completion ────────▶│ notices → core → Decode,
//!                │  never posted / backend error: PUSH_FAIL ▶│ Failed, Expired, Release
//!                │  status unknown: nothing (D's deadline)   │
//!                ▼  every WRITE terminal                     │ peer gone → core gone (its
//!          SourceReleased ─▶ RETIRED (late PUSH_REG: PUSH_FAIL, F4)    edges fail, settle)
//! ```
//!
//! ## Drive contract
//!
//! **Time enters as a [`kvdrain::Instant`] (`now`, one monotonic clock); bytes enter and
//! leave only through the [`Transport`] passed to each call; decisions leave through
//! `poll_event`.** No method blocks, spawns, sleeps or reads a clock.
//!
//! Time uses the core's types: every point on the engine's clock (`now`, a
//! [`TrackedRequest::registered_at`](consumer::TrackedRequest::registered_at), a
//! `next_timer`) is an [`Instant`](kvdrain::Instant) and every span (the producers'
//! `lease`, a request's `deadline`, the heartbeat interval) a
//! [`Duration`](kvdrain::Duration), both whole milliseconds in one `u64`. The caller picks
//! the epoch and converts once, where it reads its clock
//! ([`Instant::from_millis`](kvdrain::Instant::from_millis)); the wire carries no time, so
//! nothing else converts. The C ABI and the Python module, which keep integer ms, convert
//! at their boundary.
//!
//! Producer rank ([`producer::ProducerDriver`]):
//! 1. [`offer`](producer::ProducerDriver::offer) each finished request's source blocks
//!    (starts its lease);
//! 2. call [`tick`](producer::ProducerDriver::tick) on every scheduler step: it drains
//!    `PUSH_REG` and `HB:`, pairs, posts, polls every WRITE, sends owed `PUSH_FAIL`s,
//!    retires requests whose lease ran out (a failed drain is returned after the rest of
//!    the round ran, as the consumer driver does);
//! 3. take [`poll_event`](producer::ProducerDriver::poll_event) until `None`: free the
//!    source blocks of each `SourceReleased`;
//! 4. [`retire`](producer::ProducerDriver::retire) a request the engine aborts.
//!
//! Consumer rank ([`consumer::ConsumerDriver`], which hands out its two halves:
//! [`ConsumerIngest`](consumer::ConsumerIngest) for notifications and
//! [`ConsumerEngine`](consumer::ConsumerEngine) for the rest; on one thread take the
//! engine half with [`engine`](consumer::ConsumerDriver::engine), on two
//! [`split`](consumer::ConsumerDriver::split) after step 1):
//! 1. [`add_producer_engine`](consumer::ConsumerDriver::add_producer_engine) with the agent
//!    names the transport loaded;
//! 2. [`register`](consumer::ConsumerEngine::register) each request to be pushed into
//!    ([`register_with`](consumer::ConsumerEngine::register_with) to ask for vLLM's
//!    count instead of named edges);
//! 3. on one thread, call [`poll`](consumer::ConsumerDriver::poll) on every scheduler step
//!    (it drains, ingests and runs the engine half's round); on two, the ingest thread
//!    drains and [`ingest`](consumer::ConsumerIngest::ingest)s each notification, and the
//!    engine thread calls the engine half's [`poll`](consumer::ConsumerEngine::poll).
//!    Between rounds, nothing is due before
//!    [`next_timer`](consumer::ConsumerEngine::next_timer) unless a notification
//!    arrives (one thread) or the ingest half decides a request (two). A failed drain
//!    leaves the rest of the round done;
//! 4. take [`poll_event`](consumer::ConsumerEngine::poll_event) until `None`: decode, fail,
//!    or reuse blocks;
//! 5. [`abort`](consumer::ConsumerEngine::abort) on client cancel;
//!    [`gone`](consumer::ConsumerEngine::gone) when the control plane
//!    sees a producer go away (the driver does it itself for a failed send or a peer the
//!    transport reports gone); [`fence`](consumer::ConsumerEngine::fence)
//!    only when the transport proves nothing more of the producer's can land.
//!
//! ## Why `std`
//!
//! The drivers key requests by the engines' string ids, pair by three string keys (exact,
//! `transfer_id`, base id: [`pairing`]), name agents by NIXL's agent-name strings and decode
//! msgpack registrations: that needs owned strings and maps. The per-request state machines
//! that fit `no_std` stay in the core: the [`kvdrain::Ledger`] (consumer) and
//! [`kvdrain::producer::PushPlan`] (producer). The per-request tables have a fixed capacity
//! set at construction (hash tables reserved up front): offers and pushes together, stashed
//! registrations, retired ids, and the consumer's in-flight requests (the ledger's `N`); a
//! full table refuses and hands the item back, and nothing is evicted but retired ids
//! (oldest first). What is allocated per request is the engine's own data, copied in: ids
//! and block-id lists; per-peer maps grow with the number of peers. The short lists a
//! request carries — its producers and their `AgentId`s, its WRITEs in flight, the
//! `PUSH_FAIL`s it owes — are [`PerRequest`] lists, inline up to eight entries.
//!
//! | module | concept |
//! | --- | --- |
//! | [`transport`] | the one trait a driver needs from the wire |
//! | [`producer`] | P: offers, pairing, posts, status polls, stale peers, notices, retired ids |
//! | [`consumer`] | D: directory, registration, heartbeats, lost producers, decisions |
//! | [`pairing`] | the producer's exact / `transfer_id` / base-id pairing tables |
//! | [`registration`] | the `PUSH_REG:` msgpack map, decoded as vLLM's msgspec does |
//! | [`directory`] | producer agent names ↔ the core's `AgentId`s |
//! | [`memory`] | the in-process transport |

pub mod consumer;
pub mod directory;
pub mod memory;
pub use producer::pairing;
pub mod producer;
pub mod registration;
pub mod transport;

pub use transport::Transport;

/// A list with one entry per producer, edge or consumer rank of one request: inline up to
/// [`PER_REQUEST_INLINE`] entries (vLLM's TP × PP fan-in and fan-out stay within that in
/// practice), on the heap beyond.
pub type PerRequest<T> = smallvec::SmallVec<[T; PER_REQUEST_INLINE]>;

/// How many entries a [`PerRequest`] list holds without a heap allocation.
pub const PER_REQUEST_INLINE: usize = 8;
