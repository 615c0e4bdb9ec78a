//! `kvdrain`: replay traces through the tracker, simulate clusters under faults, measure it,
//! and run it over real NIXL.

use std::process::ExitCode;

use kvdrain_cli::replay;

// Counts allocations for `kvdrain bench` (its timed loops must make none).
#[global_allocator]
static GLOBAL: kvdrain_cli::bench::alloc::CountingAlloc = kvdrain_cli::bench::alloc::CountingAlloc;

const USAGE: &str = "\
usage: kvdrain <command> [args]

commands:
  replay FILE|-     print the decisions the tracker takes for a trace (spec/replay-trace.md)
  sim --seed S --requests N [--p-tp A --p-pp B --d-tp C | --random-topology]
                    simulate P->D clusters under every fault class; one JSON line
  demo [options]    push KV from P (TP=2) to D (TP=1) over real NIXL, with a summary (demo --help)
  bench WHAT ...    measure ingest, sweep, tick and memory next to the floor and vLLM (bench --help)
  experiment late-writes [options]
                    P and D processes over real NIXL: do failed writes land after release?
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    match command.as_str() {
        "replay" => replay::main(rest),
        "sim" => kvdrain_cli::sim::main(rest),
        "demo" => kvdrain_cli::demo::main(rest),
        "bench" => kvdrain_cli::bench::main(rest),
        "experiment" => kvdrain_cli::experiment::main(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("kvdrain: unknown command {other:?}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
