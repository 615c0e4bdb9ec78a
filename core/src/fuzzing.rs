//! Fuzz harnesses, compiled only under `cfg(fuzzing)` (which `cargo fuzz` sets). Each
//! target in `fuzz/fuzz_targets/` is one line calling a function of this module, so the
//! harness logic is compiled with the crate's own lints and stays next to the code it
//! checks. The harnesses use only the public API: what they check is the contract.
//!
//! | target | harness | what a crash means |
//! | --- | --- | --- |
//! | `wire` | [`wire`] | a panic in the parser, a parse → emit → parse round trip that changes the message, or a parse that disagrees with the spec's rules |
//! | `ledger_ops` | [`ledger_ops`] | the real [`Ledger`](crate::Ledger) and the reference model (`fuzzing/model.rs`) disagree on any outcome, or a spec rule broke after a step |
//! | `producer_plan` | [`producer_plan`] | a [`PushPlan`](crate::producer::PushPlan) owes more `PUSH_FAIL`s than it has unresolved edges, or producer and consumer sides disagree on a topology |
//!
//! The `replay` target lives in the cli crate (`kvdrain_cli::fuzzing`).

mod ledger_ops;
mod model;
mod producer_plan;
mod spec_parse;
mod wire;

pub use ledger_ops::ledger_ops;
pub use producer_plan::producer_plan;
pub use wire::wire;
