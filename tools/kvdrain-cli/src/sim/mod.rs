//! `kvdrain sim`: the command-line front of the simulator (crate `kvdrain-sim`).

mod args;

use std::process::ExitCode;

use kvdrain_sim::run;

pub use args::SimArgs;

/// Above this many requests `kvdrain sim` shows a progress spinner (on a terminal).
pub const PROGRESS_ABOVE: u64 = 100_000;

/// `kvdrain sim` entry point: 0 without violations, 1 with, 2 on bad arguments.
pub fn main(args: &SimArgs) -> ExitCode {
    let config = args.config();
    let progress = (config.requests > PROGRESS_ABOVE).then(|| {
        crate::progress::spinner(format!(
            "simulating {} requests (seed {})",
            config.requests, config.seed
        ))
    });
    let report = run(config);
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("kvdrain sim: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{}", report.to_json());
    if report.violations == 0 {
        return ExitCode::SUCCESS;
    }
    for v in &report.first_violations {
        eprintln!("kvdrain sim: seed {}: violation at {v}", config.seed);
    }
    if report.violations > report.first_violations.len() as u64 {
        eprintln!("kvdrain sim: ... {} violations in all", report.violations);
    }
    eprintln!("kvdrain sim: reproduce with: {}", args.command_line());
    ExitCode::from(1)
}
