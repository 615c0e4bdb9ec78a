//! `kvdrain experiment late-writes`: does a WRITE that the producer saw fail keep landing in
//! the consumer's memory, and does the consumer release its blocks before it stops? P and D
//! run as two processes (this binary re-executed with the hidden `experiment
//! late-writes-child d|p` subcommand) over real NIXL; see `kvdrain_late_writes` for what
//! is measured.
//!
//! Prints one JSON line per run, then a table (standard error) and a JSON summary: per fault
//! and transport the distribution of "last late byte after the failure notice / disconnect /
//! expiry", and the violation count. Needs the `nixl` feature and the NIXL runtime
//! (`make setup`), and root for fault `c` (`ss -K`).

use std::process::ExitCode;

/// `kvdrain experiment ...`.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum ExperimentCommand {
    /// P and D processes over real NIXL: does a failed write land after D released its
    /// blocks? One JSON line per run, then the distributions and the violation count.
    LateWrites(LateWritesArgs),
    /// One side of a run (started by `late-writes`, reads its orders on standard input).
    #[command(hide = true)]
    LateWritesChild {
        /// `d` (the consumer) or `p` (the producer).
        role: String,
    },
}

/// Flags of `kvdrain experiment late-writes`.
#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
Example:
  kvdrain experiment late-writes --runs 8 --fault a --transport tcp --policy old --settle-ms 0

Faults: a = P invalidates D's metadata mid-write, b = P drops the handle, c = P's TCP
connections are reset with `ss -K` (tcp only, needs root), d = P is killed (SIGKILL).
Needs the `nixl` feature (`make demo` builds it) and the NIXL runtime (`make setup`).")]
pub struct LateWritesArgs {
    /// Runs, spread round-robin over every fault x transport.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// The fault injected a random delay after the post.
    #[arg(long, value_enum, default_value_t = FaultArg::All)]
    pub fault: FaultArg,
    /// UCX over TCP on loopback, shared memory, or both.
    #[arg(long, value_enum, default_value_t = TransportArg::All)]
    pub transport: TransportArg,
    /// What P reports after a posted write ends without `Success`: `old` (PUSH_FAIL after
    /// any error: the negative control) or `new` (the producer driver's F7 rule).
    #[arg(long, value_enum, default_value_t = PolicyArg::New)]
    pub policy: PolicyArg,
    /// D's settling of failure notices and of a producer reported gone (a disconnect), ms.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub settle_ms: u64,
    /// D's deadline for the request, ms.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    pub deadline_ms: u64,
    /// D's quarantine after an expiry, ms.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub quarantine_ms: u64,
    /// D watches this long after the first failure event and after the release, ms.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub observe_ms: u64,
    /// Fault delay after the post, uniform in LO..=HI microseconds.
    #[arg(long, value_name = "LO:HI", default_value = "1000:1000000", value_parser = delay_range)]
    pub delay_us: (u64, u64),
    /// Randomization seed.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,
}

/// `--fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultArg {
    /// P invalidates D's metadata mid-write.
    A,
    /// P drops the transfer handle mid-write.
    B,
    /// P's TCP connections are reset (`ss -K`; tcp only, root).
    C,
    /// P is killed (SIGKILL).
    D,
    /// Every fault.
    All,
}

/// `--transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// UCX TCP on loopback.
    Tcp,
    /// UCX shared memory.
    Shm,
    /// Both.
    All,
}

/// `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// PUSH_FAIL after any error (the pre-fix glue, the negative control).
    Old,
    /// The producer driver's F7 rule: PUSH_FAIL only after a backend error.
    New,
}

fn delay_range(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("expected LO:HI microseconds with LO <= HI, got {s:?}");
    let (lo, hi) = s.split_once(':').ok_or_else(bad)?;
    let (lo, hi): (u64, u64) = (
        lo.parse().map_err(|_| bad())?,
        hi.parse().map_err(|_| bad())?,
    );
    if lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// Entry point of `kvdrain experiment`.
pub fn main(command: &ExperimentCommand) -> ExitCode {
    match command {
        ExperimentCommand::LateWrites(args) => late_writes(args),
        ExperimentCommand::LateWritesChild { role } => child(role),
    }
}

#[cfg(feature = "nixl")]
fn late_writes(args: &LateWritesArgs) -> ExitCode {
    use kvdrain_late_writes::coordinator::{Role, run_once};
    use kvdrain_late_writes::summary::Summary;

    let plan = plan(args);
    let specs = plan.specs();
    if specs.is_empty() {
        eprintln!("kvdrain experiment late-writes: no run fits: fault c needs --transport tcp");
        return ExitCode::from(2);
    }
    if let Err(e) = kvdrain_nixl::ensure_nixl() {
        eprintln!("kvdrain experiment late-writes: {e}");
        return ExitCode::FAILURE;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("kvdrain experiment late-writes: no path to this binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let launch = |role: Role| {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["experiment", "late-writes-child", role.letter()]);
        cmd
    };
    let bar = crate::progress::bar(specs.len() as u64, "runs");
    let mut records = Vec::new();
    let mut errors = 0;
    for spec in &specs {
        match run_once(spec, &launch) {
            Ok(r) => {
                bar.suspend(|| println!("{}", r.to_json()));
                records.push(r);
            }
            Err(e) => {
                errors += 1;
                bar.suspend(|| eprintln!("run {}: {e}", spec.run));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let summary = Summary::of(&records);
    eprint!("{}", summary.table());
    println!("{}", summary.to_json());
    if errors > 0 {
        eprintln!("{errors} of {} runs failed to run", specs.len());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(feature = "nixl")]
fn plan(args: &LateWritesArgs) -> kvdrain_late_writes::spec::Plan {
    use kvdrain_late_writes::policy::Policy;
    use kvdrain_late_writes::spec::{Fault, Plan, Transport};

    let faults = match args.fault {
        FaultArg::A => vec![Fault::Invalidate],
        FaultArg::B => vec![Fault::DropHandle],
        FaultArg::C => vec![Fault::ResetTcp],
        FaultArg::D => vec![Fault::Kill],
        FaultArg::All => Fault::ALL.to_vec(),
    };
    let transports = match args.transport {
        TransportArg::Tcp => vec![Transport::Tcp],
        TransportArg::Shm => vec![Transport::Shm],
        TransportArg::All => vec![Transport::Tcp, Transport::Shm],
    };
    Plan {
        runs: args.runs,
        faults,
        transports,
        policy: match args.policy {
            PolicyArg::Old => Policy::Old,
            PolicyArg::New => Policy::New,
        },
        settle_ms: args.settle_ms,
        deadline_ms: args.deadline_ms,
        quarantine_ms: args.quarantine_ms,
        observe_ms: args.observe_ms,
        fault_delay_us: args.delay_us,
        seed: args.seed,
        prefix: format!("kvd-late-{}", std::process::id()),
    }
}

#[cfg(feature = "nixl")]
fn child(role: &str) -> ExitCode {
    use kvdrain_late_writes::coordinator::{Role, child_main};
    let Some(role) = Role::parse(role) else {
        eprintln!("kvdrain experiment late-writes-child d|p");
        return ExitCode::from(2);
    };
    match child_main(role) {
        0 => ExitCode::SUCCESS,
        n => ExitCode::from(u8::try_from(n).unwrap_or(1)),
    }
}

#[cfg(not(feature = "nixl"))]
fn late_writes(_: &LateWritesArgs) -> ExitCode {
    eprintln!(
        "kvdrain experiment late-writes needs real NIXL: build with `--features nixl` \
         (and `make setup` for the runtime)"
    );
    ExitCode::from(2)
}

#[cfg(not(feature = "nixl"))]
fn child(_: &str) -> ExitCode {
    eprintln!("kvdrain experiment late-writes-child needs real NIXL: build with `--features nixl`");
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::command::{Cli, Command};

    use super::{ExperimentCommand, FaultArg, PolicyArg};

    #[test]
    fn flags_parse_and_bad_ranges_are_refused() {
        let cli = Cli::try_parse_from([
            "kvdrain",
            "experiment",
            "late-writes",
            "--fault",
            "a",
            "--policy",
            "old",
            "--delay-us",
            "5:10",
        ]);
        let Ok(Cli {
            command:
                Command::Experiment {
                    what: ExperimentCommand::LateWrites(a),
                },
        }) = cli
        else {
            panic!("not parsed: {cli:?}");
        };
        assert_eq!(
            (a.fault, a.policy, a.delay_us),
            (FaultArg::A, PolicyArg::Old, (5, 10))
        );
        assert_eq!((a.runs, a.settle_ms), (200, 5000));
        for bad in [["--delay-us", "10:5"], ["--runs", "0"]] {
            let args = ["kvdrain", "experiment", "late-writes", bad[0], bad[1]];
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?}");
        }
    }
}
