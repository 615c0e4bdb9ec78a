//! Virtual-time constants of the simulated cluster, in milliseconds.
//!
//! The safety argument the memory model checks rests on one inequality: every WRITE of a
//! request is posted before its producer lease ends ([`LEASE`] after the registration
//! reaches the producer, which is at most [`REG_LATENCY`] after it was sent) and is
//! terminal at most [`WRITE_MAX`] later; the consumer's quarantine ([`QUARANTINE`]) starts
//! at the abort or the deadline, never before the registration, and is longer than
//! `REG_LATENCY + LEASE + WRITE_MAX`. Heartbeats renew the lease only until the decode
//! rank's decision or abort (F9), so the last renewal ends `LEASE · 2/3` after a heartbeat
//! sent before the quarantine started (checked below). A forced release therefore never
//! frees a block a WRITE may still land in — and if the tracker forced it earlier, the
//! model would say so.

/// Client requests arrive every 0..=`ARRIVAL_GAP` ms (bursts aside).
pub const ARRIVAL_GAP: u64 = 2;
/// Requests in one burst.
pub const BURST: (u64, u64) = (120, 260);
/// `PUSH_REG` from decode to a producer rank.
pub const REG_LATENCY: u64 = 3;
/// Prefill before a producer rank posts its first WRITE.
pub const PREFILL: (u64, u64) = (0, 20);
/// Prefill of a slow producer, so that its lease ends mid-push.
pub const SLOW_PREFILL: (u64, u64) = (150, 260);
/// Between two posts of one producer rank.
pub const POST_GAP: u64 = 3;
/// A WRITE is terminal 1..=`WRITE_MAX` ms after it was posted.
pub const WRITE_MAX: u64 = 40;
/// A notification's flight.
pub const NOTIFY_LATENCY: u64 = 3;
/// Extra delay of a reordered notification.
pub const REORDER: (u64, u64) = (5, 40);
/// A duplicate's delay after the original.
pub const DUPLICATE: (u64, u64) = (1, 60);
/// The producer's hold on a request from its offer; each decode rank's heartbeats (every
/// `LEASE / 6`, until its decision) push it to `LEASE · 2/3` after they arrive. A slow path
/// loses the request's heartbeats, so its lease there is never renewed.
pub const LEASE: u64 = 200;
/// How long a producer remembers a request that ended there, refusing late posts (F4;
/// vLLM keeps retired ids 300 s).
pub const PRODUCER_TOMBSTONE: u64 = 300;
/// The consumer's default deadline.
pub const DEADLINE: u64 = 1_000;
/// A short deadline that falls mid-push.
pub const SHORT_DEADLINE: (u64, u64) = (5, 40);
/// The consumer's quarantine.
pub const QUARANTINE: u64 = 600;
/// When a consumer abort comes, after the arrival.
pub const ABORT_AFTER: (u64, u64) = (0, 60);
/// When a producer abort comes, after the arrival.
pub const PRODUCER_ABORT_AFTER: (u64, u64) = (0, 40);
/// From a producer's death to the transport seeing it gone (a death seen gone). Each
/// decode rank's driver then reports the dead agent gone to the core at its next poll:
/// its edges fail at once and their blocks settle for [`SETTLE`].
pub const GONE_AFTER: (u64, u64) = (1, 20);
/// From a death nobody reports (an unseen death) to the replacement agent being known.
pub const REDISCOVER_AFTER: u64 = 20;
/// An errored WRITE keeps landing for up to this long after its producer saw the error
/// (the late-landing fault; measured over UCX TCP: up to 0.8 s for 256 MiB,
/// `docs/nixl.md#late-writes`).
pub const LATE_LANDING: u64 = 50;
/// How long the consumer lets a failure notice settle before it releases the blocks
/// (`Config::settle_ms`, rule 8; the real default is 5 s). Longer than [`WRITE_MAX`], so
/// it covers a write that errored after posting and keeps landing until it is terminal,
/// and longer than [`LATE_LANDING`] plus a notice's flight, so the late-landing fault is
/// harmless.
pub const SETTLE: u64 = 100;

/// Decoding a completed request before its blocks go back.
pub const DECODE: (u64, u64) = (5, 50);

const _: () = assert!(QUARANTINE > REG_LATENCY + LEASE + WRITE_MAX);
// Heartbeats stop at the decision or abort, where the quarantine starts: the last one
// extends the lease at most REG_LATENCY + LEASE·2/3 past it, and a WRITE posted before
// that ends WRITE_MAX later (plus LATE_LANDING for an errored one).
const _: () = assert!(QUARANTINE > REG_LATENCY + LEASE * 2 / 3 + WRITE_MAX + LATE_LANDING);
const _: () = assert!(SETTLE > WRITE_MAX);
const _: () = assert!(SETTLE > LATE_LANDING + NOTIFY_LATENCY + REORDER.1);
// A dead producer's last bytes land at most LATE_LANDING after its death; the blocks of
// its edges come back at least GONE_AFTER.0 + SETTLE after it (seen gone, then settled).
const _: () = assert!(GONE_AFTER.0 + SETTLE > LATE_LANDING);
