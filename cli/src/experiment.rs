//! `kvdrain experiment late-writes`: does a WRITE that the producer saw fail keep landing in
//! the consumer's memory, and does the consumer release its blocks before it stops? P and D
//! run as two processes (this binary re-executed with the hidden `late-writes-child d|p`
//! subcommand) over real NIXL; see `kvdrain_nixl::experiment` for what is measured.
//!
//! Prints one JSON line per run, then a table and a JSON summary: per fault and transport
//! the distribution of "last late byte after the failure notice / fence / expiry", and the
//! violation count. Needs the `nixl` feature and the NIXL runtime (`make setup`), and root
//! for fault `c` (`ss -K`).

use std::process::ExitCode;

const USAGE: &str = "\
usage: kvdrain experiment late-writes [options]

  --runs N             runs, spread round-robin over every fault x transport (default 200)
  --fault F            a (P invalidates D's metadata), b (P drops the handle), c (P's TCP
                       connections are reset, tcp only), d (P is killed), or all (default)
  --transport T        tcp (UCX TCP on loopback), shm (UCX shared memory), or all (default)
  --policy P           old (PUSH_FAIL after any error: the negative control) or new (the
                       F7 rule: PUSH_FAIL only after a backend error) (default new)
  --settle-ms MS       D's failure-notice settling, passed to the core (default 5000)
  --deadline-ms MS     D's deadline for the request (default 5000)
  --quarantine-ms MS   D's quarantine after an expiry (default 2000)
  --observe-ms MS      D watches this long after the event and after the release (default 1000)
  --delay-us LO:HI     fault delay after the post, uniform (default 1000:1000000)
  --seed S             randomization seed (default 1)
";

/// Entry point of `kvdrain experiment`.
pub fn main(args: &[String]) -> ExitCode {
    match args.split_first() {
        Some((cmd, rest)) if cmd == "late-writes" => {
            if rest.iter().any(|a| a == "-h" || a == "--help") {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            late_writes(rest)
        }
        Some((cmd, rest)) if cmd == "late-writes-child" => child(rest),
        _ => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

#[cfg(feature = "nixl")]
fn late_writes(args: &[String]) -> ExitCode {
    use kvdrain_nixl::experiment::coordinator::{Role, run_once};
    use kvdrain_nixl::experiment::summary::Summary;

    let plan = match parse(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kvdrain experiment late-writes: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
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
    let specs = plan.specs();
    let mut records = Vec::new();
    let mut errors = 0;
    for spec in &specs {
        match run_once(spec, &launch) {
            Ok(r) => {
                println!("{}", r.to_json());
                records.push(r);
            }
            Err(e) => {
                errors += 1;
                eprintln!("run {}: {e}", spec.run);
            }
        }
    }
    let summary = Summary::of(&records);
    print!("{}", summary.table());
    println!("{}", summary.to_json());
    if errors > 0 {
        eprintln!("{errors} of {} runs failed to run", specs.len());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(feature = "nixl")]
fn parse(args: &[String]) -> Result<kvdrain_nixl::experiment::spec::Plan, String> {
    use kvdrain_nixl::experiment::policy::Policy;
    use kvdrain_nixl::experiment::spec::{Fault, Plan, Transport};

    let mut plan = Plan {
        runs: 200,
        faults: Fault::ALL.to_vec(),
        transports: vec![Transport::Tcp, Transport::Shm],
        policy: Policy::New,
        settle_ms: 5000,
        deadline_ms: 5000,
        quarantine_ms: 2000,
        observe_ms: 1000,
        fault_delay_us: (1000, 1_000_000),
        seed: 1,
        prefix: format!("kvd-late-{}", std::process::id()),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = || format!("bad value for {flag}: {value:?}");
        match flag.as_str() {
            "--runs" => plan.runs = value.parse().map_err(|_| bad())?,
            "--fault" if value == "all" => plan.faults = Fault::ALL.to_vec(),
            "--fault" => plan.faults = vec![Fault::parse(value).ok_or_else(bad)?],
            "--transport" if value == "all" => {
                plan.transports = vec![Transport::Tcp, Transport::Shm];
            }
            "--transport" => plan.transports = vec![Transport::parse(value).ok_or_else(bad)?],
            "--policy" => plan.policy = Policy::parse(value).ok_or_else(bad)?,
            "--settle-ms" => plan.settle_ms = value.parse().map_err(|_| bad())?,
            "--deadline-ms" => plan.deadline_ms = value.parse().map_err(|_| bad())?,
            "--quarantine-ms" => plan.quarantine_ms = value.parse().map_err(|_| bad())?,
            "--observe-ms" => plan.observe_ms = value.parse().map_err(|_| bad())?,
            "--delay-us" => {
                let (lo, hi) = value.split_once(':').ok_or_else(bad)?;
                plan.fault_delay_us = (
                    lo.parse().map_err(|_| bad())?,
                    hi.parse().map_err(|_| bad())?,
                );
                if plan.fault_delay_us.0 > plan.fault_delay_us.1 {
                    return Err(bad());
                }
            }
            "--seed" => plan.seed = value.parse().map_err(|_| bad())?,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if plan.specs().is_empty() {
        return Err("no run fits: fault c needs --transport tcp".into());
    }
    Ok(plan)
}

#[cfg(feature = "nixl")]
fn child(args: &[String]) -> ExitCode {
    use kvdrain_nixl::experiment::coordinator::{Role, child_main};
    let Some(role) = args.first().and_then(|r| Role::parse(r)) else {
        eprintln!("kvdrain experiment late-writes-child d|p");
        return ExitCode::from(2);
    };
    match child_main(role) {
        0 => ExitCode::SUCCESS,
        n => ExitCode::from(u8::try_from(n).unwrap_or(1)),
    }
}

#[cfg(not(feature = "nixl"))]
fn late_writes(_: &[String]) -> ExitCode {
    eprintln!(
        "kvdrain experiment late-writes needs real NIXL: build with `--features nixl` \
         (and `make setup` for the runtime)"
    );
    ExitCode::from(2)
}

#[cfg(not(feature = "nixl"))]
fn child(_: &[String]) -> ExitCode {
    late_writes(&[])
}
