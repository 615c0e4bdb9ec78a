//! The fuzz harnesses of kvdrain and the reference model they check the core against.
//!
//! Each target in `fuzz/targets/fuzz_targets/` is one line calling a function of this crate, so the
//! harness logic builds and is linted with the rest of the workspace (and its unit tests run
//! the committed seeds on stable), while libFuzzer stays in `fuzz/`. Everything here goes
//! through the public API of `kvdrain` and `kvdrain-replay`: what the harnesses check is the
//! contract, and the production crates carry no fuzz-only code.
//!
//! | target | harness | what a crash means |
//! | --- | --- | --- |
//! | `wire` | [`wire`] | a panic in the parser, a parse → emit → parse round trip that changes the message, or a parse that disagrees with the spec's rules |
//! | `ledger_ops` | [`ledger_ops`] | the real [`Ledger`](kvdrain::Ledger) and the reference model (`fuzz/harness/src/model.rs`) disagree on any outcome, or a spec rule broke after a step |
//! | `producer_plan` | [`producer_plan`] | a [`PushPlan`](kvdrain::producer::PushPlan) owes more `PUSH_FAIL`s than it has unresolved edges, or producer and consumer sides disagree on a topology |
//! | `replay` | [`replay`] | the trace front end (`kvdrain-replay`, which `kvdrain replay` runs) panicked, wrote something other than whole decision lines, or reported a trace error on a line that does not exist |

mod ledger_ops;
mod model;
mod producer_plan;
mod replay;
mod spec_parse;
mod wire;

pub use ledger_ops::ledger_ops;
pub use producer_plan::producer_plan;
pub use replay::replay;
pub use wire::wire;
