//! `kvdrain`: replay traces through the tracker, simulate clusters under faults, measure it,
//! and run it over real NIXL. `kvdrain --help` lists the commands.

use std::process::ExitCode;

// Counts allocations for `kvdrain bench` (its timed loops must make none).
#[global_allocator]
static GLOBAL: kvdrain_cli::bench::alloc::CountingAlloc = kvdrain_cli::bench::alloc::CountingAlloc;

fn main() -> ExitCode {
    kvdrain_cli::command::main(std::env::args_os())
}
