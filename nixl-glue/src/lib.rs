//! `kvdrain-nixl`: the std glue between kvdrain and real NIXL. It moves bytes, calls the core
//! and calls the engine's hooks; every protocol decision is the core's.
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
//! | [`consumer`] | D: notifications → core → [`consumer::BlockRelease`]; `PUSH_REG`, `HB`, fences |
//! | [`producer`] | P: one WRITE per edge, polled to the end, `PUSH_FAIL` as the plan says |
//! | [`registration`] | the `PUSH_REG:` msgpack map with vLLM's field names |
//! | [`directory`] | producer agent names ↔ the core's `AgentId`s |
//! | [`handshake`] | what P needs to write into a D rank, and where it comes from |
//! | [`descriptors`] | the byte spans of one WRITE |
//! | [`pool`] | DRAM KV block pools (tests, demo) |
//! | [`metrics`] | counters and latency, vLLM-style names |
//! | [`testbed`] | P(TP=n) → D(TP=1) on real NIXL in one process (tests, demo) |
//! | [`experiment`] | late writes after a failed WRITE, P and D as two processes (issue 9) |

pub mod agent;
pub mod consumer;
pub mod descriptors;
pub mod directory;
pub mod experiment;
pub mod handshake;
pub mod loader;
pub mod metrics;
pub mod pool;
pub mod producer;
pub mod registration;
pub mod testbed;

pub use loader::{NixlLoadError, ensure_nixl};
pub use nixl_sys;
