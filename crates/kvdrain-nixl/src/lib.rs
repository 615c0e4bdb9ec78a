//! `kvdrain-nixl`: the std glue between kvdrain and real NIXL. It moves bytes, reads the
//! clock, and calls the engine's hooks; every protocol decision is the core's or the
//! drivers' (`kvdrain-driver`): this crate implements their
//! [`Transport`](kvdrain_driver::Transport) over NIXL ([`transport`]) and drives them.
//!
//! NIXL is reached through `nixl-sys` built with `stub-api`: nothing links against NIXL at build
//! time, and the real `libnixl_capi.so` (from the `nixl-cu12` wheel, installed into `<repo>/.nixl`
//! by `scripts/setup-nixl.sh`) is loaded at runtime by [`loader::ensure_nixl`]. Call it (directly
//! or through [`agent::UcxAgent::new`]) before any other `nixl_sys` function: without the real
//! library those abort the process.
//!
//! | module | concept |
//! | --- | --- |
//! | [`loader`] | finds and loads the runtime, never aborts |
//! | [`agent`] | an agent with a UCX backend and DRAM registrations kept alive in drop order |
//! | [`consumer`] | D: the consumer driver over NIXL, decisions → [`consumer::BlockRelease`] |
//! | [`producer`] | P: the producer driver over NIXL, releases → [`producer::SourceBlocks`] |
//! | [`transport`] | the drivers' transport over NIXL: WRITEs, status polls, notifications, handshake cache |
//! | [`registration`] | (re-export from `kvdrain-driver`) the `PUSH_REG:` msgpack map |
//! | [`directory`] | (re-export from `kvdrain-driver`) producer agent names ↔ `AgentId`s |
//! | [`handshake`] | what P needs to write into a D rank, and where it comes from |
//! | [`descriptors`] | the byte spans of one WRITE |
//! | [`block_layout`] | where a rank's KV blocks are (published in the handshake, registered with NIXL) |
//! | `pool` | DRAM KV block pools for the testbed, the demo and the experiments (feature `testbed`) |
//! | [`metrics`] | one `prometheus-client` registry type (vLLM-style names), the latency's HDR histogram |
//! | `testbed` | P(TP=n) → D(TP=1) on real NIXL in one process, for tests and the demo (feature `testbed`, off by default) |
//!
//! Events go to `tracing` (install any subscriber; `kvdrain demo --log` uses
//! `tracing-subscriber`): a `debug` span per request on the consumer's registration and the
//! producer's push (target `kvdrain_nixl::consumer` / `::producer`), `debug` events for
//! notices, decisions and releases, and a `warn` event with a `cause` field for every
//! failure (`post`, `after_post`, `handshake`, `notice_unsendable`, `malformed_registration`,
//! `stash_full`, `unplannable`, `registration_unsent`, `heartbeat_unsent`, `disconnect`,
//! `gone`, `fence`, `transfer`, `deadline`, `quarantine`). Disabled levels cost one cached check.

pub mod agent;
pub mod block_layout;
pub mod consumer;
pub mod descriptors;
pub mod handshake;
pub mod loader;
pub mod metrics;
#[cfg(feature = "testbed")]
pub mod pool;
pub mod producer;
#[cfg(feature = "testbed")]
pub mod testbed;
pub mod transport;

pub use kvdrain_driver::{directory, registration};
pub use loader::{NixlLoadError, ensure_nixl};
pub use nixl_sys;
