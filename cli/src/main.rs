//! `kvdrain`: replay traces through the tracker, simulate clusters under faults, measure it,
//! and run it over real NIXL.

use std::process::ExitCode;

use kvdrain_cli::replay;

const USAGE: &str = "\
usage: kvdrain <command> [args]

commands:
  replay FILE|-     print the decisions the tracker takes for a trace (spec/replay-trace.md)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    match command.as_str() {
        "replay" => replay::main(rest),
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
