//! `kvdrain-nixl`: the std glue between kvdrain and real NIXL.
//!
//! NIXL is reached through `nixl-sys` built with `stub-api`: nothing links against NIXL at build
//! time, and the real `libnixl_capi.so` (from the `nixl-cu12` wheel, installed into `<repo>/.nixl`
//! by `scripts/setup-nixl.sh`) is loaded at runtime by [`loader::ensure_nixl`]. Call it (directly
//! or through [`agent::UcxAgent::new`]) before any other `nixl_sys` function: without the real
//! library those abort the process.
//!
//! - [`loader`]: finds and loads the runtime, never aborts, typed [`loader::NixlLoadError`].
//! - [`agent`]: an agent with a UCX backend and DRAM registrations kept alive in drop order.

pub mod agent;
pub mod loader;

pub use loader::{NixlLoadError, ensure_nixl};
pub use nixl_sys;
