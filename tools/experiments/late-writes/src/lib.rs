//! `kvdrain-late-writes`: the late-writes experiment (`docs/nixl.md#late-writes`). Does a
//! WRITE that P saw fail keep landing in D's memory, for how long, and does D's ledger
//! release the blocks before it stops?
//!
//! It sits on top of the drivers (`kvdrain-driver`) and the NIXL glue (`kvdrain-nixl`: the
//! agent, the consumer over NIXL, the transport's status mapping) and adds no protocol rule
//! of its own: D is the shipped consumer, P's reporting is either the producer driver's
//! rule or the negative control. Not published: nothing an engine links depends on it. The
//! `kvdrain experiment late-writes` command and `tests/late_writes.rs` drive it; the long
//! series it produced are in `tools/experiments/late-writes/results/`.
//!
//! P and D run as separate processes over real NIXL (UCX TCP on loopback, or shared
//! memory). P writes 256 MiB whose every 4 KiB page carries a stamp ([`stamp`]); D tracks the
//! request with the shipped consumer (the glue's `Consumer`: the `ConsumerDriver` over
//! NIXL, one named edge, [`consumer_side`]) and a watcher thread scans the
//! destination pages about every millisecond ([`watch`]). A random delay after the post P
//! injects a fault ([`spec::Fault`]: invalidate D's metadata, drop the handle, reset its TCP
//! connections, die) and reports as its policy says ([`policy`]: `old` = the pre-fix glue,
//! the negative control; `new` = the F7 rule).
//!
//! ```text
//!  D:  registered ──▶ event (failure notice │ gone on a failed heartbeat │ expiry)
//!                        ──▶ Released ──▶ pages overwritten with "reused" stamps
//!  measured: last page landing after the event (the drain), and any producer stamp
//!            after the reuse stamps (a violation: a block reused while a write landed)
//! ```
//!
//! | module | concept |
//! | --- | --- |
//! | [`clock`] | the host's monotonic clock, on which P's fault and D's landings compare |
//! | [`stamp`] | page stamps and the stamped memory |
//! | [`watch`] | the consumer's scanning thread |
//! | [`policy`] | what P reports after a posted write ends without `Success` |
//! | [`spec`] | one run's parameters, the faults, the transports, the randomized plan |
//! | [`consumer_side`] | D's process |
//! | [`producer_side`] | P's process |
//! | [`coordinator`] | spawns both per run, relays the handshake, collects a [`coordinator::RunRecord`] |
//! | [`lines`] | the line protocol between them |
//! | [`summary`] | distributions per fault and transport, the supported `settle_ms` |
//!
//! Drive contract: a caller builds a [`spec::Plan`], and for each of its
//! [`specs`](spec::Plan::specs) calls [`coordinator::run_once`] with a
//! [`Launch`](coordinator::Launch) that starts a child process of this same binary in a
//! [`Role`](coordinator::Role); the child calls [`coordinator::child_main`] and exits with
//! its code. [`ensure_nixl`](kvdrain_nixl::ensure_nixl) must have succeeded in every
//! process that touches NIXL (the children call it through the glue's agent).

pub mod clock;
pub mod consumer_side;
pub mod coordinator;
pub mod lines;
pub mod policy;
pub mod producer_side;
pub mod spec;
pub mod stamp;
pub mod summary;
pub mod watch;
