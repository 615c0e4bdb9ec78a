//! `kvdrain demo`: P (TP = 2) → D (TP = 1) pushing KV blocks through the real drivers
//! and tracker, with injected failures, a progress bar on long runs and a summary table.
//!
//! With the `nixl` feature and the NIXL runtime installed (`make demo` does both) the bytes
//! move over real NIXL (UCX) between three agents in this process. Otherwise it says so in a
//! banner and runs the in-process transport (memcpy and mailboxes) through the same drivers.

mod memory;
#[cfg(feature = "nixl")]
mod nixl;
mod report;

use std::process::ExitCode;

pub use report::{Percentiles, Progress, Summary};

/// `kvdrain demo` arguments.
#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
Prints a summary table; exit status 0 if every request ended and every completed request
held its bytes, 1 otherwise, 2 on bad arguments. A progress bar is drawn on stderr when it
is a terminal.

Example:
  kvdrain demo --requests 20000 --fail-rate 0.02 --metrics
  kvdrain demo --requests 200 --log=debug
  make demo DEMO_ARGS='--requests 20000'")]
pub struct DemoArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub options: Options,
    /// Print the metrics (OpenMetrics text) after the summary.
    #[arg(long)]
    pub metrics: bool,
    /// Print the NIXL glue's tracing events on stderr, filtered by FILTER (tracing-subscriber
    /// env-filter syntax, e.g. `debug` for a span per request, `kvdrain_nixl=warn`).
    #[arg(long, value_name = "FILTER", num_args = 0..=1, require_equals = true, default_missing_value = "warn")]
    pub log: Option<String>,
}

/// Demo settings.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct Options {
    /// Requests to push.
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: u64,
    /// D block size in bytes, a multiple of 16 (P blocks are half: each of the 2 producer
    /// ranks writes half of every block).
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024, value_parser = block_size)]
    pub block_size: usize,
    /// Blocks per request.
    #[arg(long, value_name = "K", default_value_t = 4, value_parser = positive)]
    pub blocks: usize,
    /// Probability that a producer's write is refused by NIXL (an injected bad descriptor:
    /// the producer sends PUSH_FAIL), 0..=1.
    #[arg(long, value_name = "F", default_value_t = 0.01, value_parser = probability)]
    pub fail_rate: f64,
    /// Requests in flight at once, 1..=1024.
    #[arg(long, value_name = "W", default_value_t = 64, value_parser = window)]
    pub window: usize,
    /// Fault-injection seed.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,
    /// Skip NIXL: in-process transport (memcpy and a queue) through the same core.
    #[arg(long)]
    pub in_process: bool,
    /// Run NIXL's progress thread in each agent (default: the demo's loop polls every
    /// agent; on a small machine the threads cost 5x).
    #[arg(long)]
    pub progress_thread: bool,
    /// One loop drains D's notifications, decides and ticks the producers (default: the
    /// producers run on their own thread, a pump thread feeds the consumer driver's
    /// lock-free ingest half, and the engine thread parks until it publishes a decision).
    #[arg(long = "no-pump-thread", action = clap::ArgAction::SetFalse)]
    pub pump_thread: bool,
}

fn block_size(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 && n % 16 == 0 => Ok(n),
        Ok(_) => Err("must be a positive multiple of 16".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn window(text: &str) -> Result<usize, String> {
    match positive(text)? {
        n if n > 1024 => Err("must be at most 1024".into()),
        n => Ok(n),
    }
}

fn probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        Ok(_) => Err("must be within 0..=1".into()),
        Err(e) => Err(e.to_string()),
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            requests: 2000,
            block_size: 64 * 1024,
            blocks: 4,
            fail_rate: 0.01,
            window: 64,
            seed: 1,
            in_process: false,
            progress_thread: false,
            pump_thread: true,
        }
    }
}

/// Producer TP size of the demo (D is TP 1).
pub const P_TP: u16 = 2;

impl Options {
    /// Whether producer rank `rank`'s write of request `n` is injected to fail
    /// (deterministic in the seed).
    pub fn fails(&self, n: u64, rank: u16) -> bool {
        let mut x = (n ^ self.seed.rotate_left(17) ^ u64::from(rank) << 48)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 29;
        (x >> 11) as f64 / (1u64 << 53) as f64 <= self.fail_rate && self.fail_rate > 0.0
    }
}

/// Deterministic block contents: block `index` of request `n` on producer rank `rank`.
pub fn pattern(n: u64, rank: u16, index: usize, len: usize) -> Vec<u8> {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (u64::from(rank) << 32 | index as u64) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `kvdrain demo` entry point: 0 if every request ended and every completed request held
/// its bytes, 1 otherwise.
pub fn main(args: &DemoArgs) -> ExitCode {
    if let Some(filter) = &args.log {
        match tracing_subscriber::EnvFilter::try_new(filter) {
            Ok(filter) => tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .init(),
            Err(e) => {
                eprintln!("kvdrain demo: --log={filter}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let summary = run(&args.options);
    print!("{summary}");
    if args.metrics {
        if summary.metrics.is_empty() {
            eprintln!(
                "kvdrain demo: --metrics: the in-process transport has no NIXL glue, so no metrics"
            );
        }
        print!("{}", summary.metrics);
    }
    if summary.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the demo over real NIXL when possible, else in-process (with a banner).
pub fn run(options: &Options) -> Summary {
    let why_not = if options.in_process {
        "--in-process was given".to_owned()
    } else {
        match try_nixl(options) {
            Ok(summary) => return summary,
            Err(why) => why,
        }
    };
    eprintln!(
        "\n  ************************************************************************\n  \
         *  NIXL not used: {why_not}\n  \
         *  Running the IN-PROCESS transport: bytes are memcpy'd and notifications\n  \
         *  queued in memory; the drivers and the tracker are the real ones. \n  \
         *  For real NIXL: `make demo` (scripts/setup-nixl.sh, then --features nixl).\n  \
         ************************************************************************\n"
    );
    memory::run(options)
}

#[cfg(feature = "nixl")]
fn try_nixl(options: &Options) -> Result<Summary, String> {
    nixl::run(options)
}

#[cfg(not(feature = "nixl"))]
fn try_nixl(_: &Options) -> Result<Summary, String> {
    Err("this kvdrain was built without the `nixl` feature".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Options, clap::Error> {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Demo {
            #[command(flatten)]
            options: Options,
        }
        Demo::try_parse_from(std::iter::once("demo").chain(s.split_whitespace())).map(|d| d.options)
    }

    #[test]
    fn parses_flags_and_refuses_nonsense() {
        let o = parse("--requests 10 --block-size 4096 --fail-rate 0.5 --in-process").unwrap();
        assert_eq!(
            (o.requests, o.block_size, o.fail_rate, o.in_process),
            (10, 4096, 0.5, true)
        );
        assert_eq!(parse("").unwrap(), Options::default());
        assert!(parse("--block-size 100").is_err());
        assert!(parse("--fail-rate 2").is_err());
        assert!(parse("--window 1025").is_err());
        assert!(parse("--requests").is_err());
        assert!(parse("--bogus 1").is_err());
    }

    #[test]
    fn injected_failure_rate_is_about_right() {
        let o = Options {
            fail_rate: 0.1,
            ..Options::default()
        };
        let n = (0..10_000).filter(|&n| o.fails(n, 0)).count();
        assert!((800..1200).contains(&n), "{n}");
        let none = Options {
            fail_rate: 0.0,
            ..Options::default()
        };
        assert!((0..1000).all(|n| !none.fails(n, 1)));
    }

    #[test]
    fn in_process_demo_runs_and_accounts_for_every_request() {
        let o = Options {
            requests: 300,
            block_size: 1024,
            fail_rate: 0.05,
            window: 16,
            in_process: true,
            ..Options::default()
        };
        let s = run(&o);
        assert!(s.ok(), "{s}");
        assert_eq!(s.completed + s.failed + s.expired, 300);
        assert!(s.failed > 0 && s.completed > 0);
        assert_eq!(s.corrupt, 0);
    }
}
