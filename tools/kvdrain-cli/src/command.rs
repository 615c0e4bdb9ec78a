//! The `kvdrain` command line (clap derive): one subcommand per front end, each with its
//! flags, their defaults and an example in `--help`.
//!
//! Exit statuses: 0 ok; 2 for clap's usage errors (unknown flag, bad value, missing
//! argument), for every subcommand; each subcommand documents its own on top (`replay`:
//! 1 unreadable input, 2 trace error — a trace error also says `trace error at line L`).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::bench::BenchCommand;
use crate::demo::DemoArgs;
use crate::experiment::ExperimentCommand;
use crate::replay::ReplayArgs;
use crate::sim::SimArgs;

/// Track KV-cache pushes of disaggregated prefill/decode serving: replay traces through
/// the tracker, simulate clusters under faults, measure it, and run it over real NIXL.
#[derive(Debug, Parser)]
#[command(
    name = "kvdrain",
    version,
    propagate_version = true,
    after_help = "Example:\n  kvdrain replay tests/traces/story_mixed_node.trace\n\n\
Run `kvdrain <COMMAND> --help` for a command's flags."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the decisions the tracker takes for a trace, one JSON line each.
    Replay(ReplayArgs),
    /// Simulate P->D clusters under every fault class; one JSON line.
    Sim(SimArgs),
    /// Push KV from P (TP=2) to D (TP=1) over real NIXL, with a summary.
    Demo(DemoArgs),
    /// Measure ingest, sweep, tick and memory next to the floor and vLLM; JSON lines.
    Bench {
        /// What to measure.
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Run P and D over real NIXL under faults and measure what the tracker promises.
    Experiment {
        /// Which experiment.
        #[command(subcommand)]
        what: ExperimentCommand,
    },
}

/// Parses `args` (the program name first) and runs the command.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let args: Vec<_> = args.into_iter().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.exit_code() {
                0 => ExitCode::SUCCESS,
                code => ExitCode::from(u8::try_from(code).unwrap_or(2)),
            };
        }
    };
    match cli.command {
        Command::Replay(a) => crate::replay::main(&a),
        Command::Sim(a) => crate::sim::main(&a),
        Command::Demo(a) => crate::demo::main(&a),
        Command::Bench { what } => crate::bench::main(what),
        Command::Experiment { what } => crate::experiment::main(&what),
    }
}

/// `--help` of `kvdrain` (no subcommand) or of a subcommand path such as `["bench",
/// "ingest"]`, as the command prints it.
pub fn help(path: &[&str]) -> Option<String> {
    let args = std::iter::once("kvdrain")
        .chain(path.iter().copied())
        .chain(["--help"]);
    match Cli::try_parse_from(args) {
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => Some(e.render().to_string()),
        _ => None,
    }
}

/// Every command path with its own usage line, in `--help` order.
pub const PATHS: [&[&str]; 12] = [
    &["replay"],
    &["sim"],
    &["demo"],
    &["bench", "ingest"],
    &["bench", "floor"],
    &["bench", "compare"],
    &["bench", "sweep"],
    &["bench", "tick"],
    &["bench", "memory"],
    &["bench", "stream"],
    &["bench", "latency"],
    &["experiment", "late-writes"],
];

/// The usage text docs/commands.md carries: `kvdrain --help`, then the usage line of every
/// command (`kvdrain COMMAND --help` for the rest).
pub fn readme_usage() -> String {
    let mut text = help(&[]).unwrap_or_default();
    text.push('\n');
    let mut cmd = Cli::command();
    cmd.build();
    for path in PATHS {
        let mut at = &mut cmd;
        for name in path {
            match at.find_subcommand_mut(name) {
                Some(sub) => at = sub,
                None => return text,
            }
        }
        text.push_str(&at.render_usage().to_string());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn every_subcommand_has_an_example() {
        for path in super::PATHS {
            let help = super::help(path).unwrap_or_default();
            assert!(help.contains("Example"), "{path:?}: {help}");
        }
    }
}
