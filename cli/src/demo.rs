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

pub use report::{Progress, Summary};

const USAGE: &str = "\
usage: kvdrain demo [options]

  --requests N         requests to push (default 2000)
  --block-size BYTES   consumer KV block size, a multiple of 16 (default 65536);
                       each of the 2 producer ranks writes half of every block
  --blocks K           blocks per request (default 4)
  --fail-rate F        probability that a producer's write is refused by NIXL (an injected
                       bad descriptor: the producer sends PUSH_FAIL), 0..=1 (default 0.01)
  --window W           requests in flight at once, 1..=1024 (default 64)
  --seed S             fault-injection seed (default 1)
  --progress-thread    run NIXL's progress thread in each agent (default: off, the demo's
                       loop polls every agent; on a small machine the threads cost 5x)
  --in-process         skip NIXL: in-process transport
  --no-pump-thread     drain D's notifications on the loop's thread (default: a pump
                       thread feeds the consumer's lock-free ingest half)
";

/// Demo settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Requests to push.
    pub requests: u64,
    /// D block size in bytes (P blocks are half).
    pub block_size: usize,
    /// Blocks per request.
    pub blocks: usize,
    /// Probability of an injected write failure per producer edge.
    pub fail_rate: f64,
    /// Requests in flight at once.
    pub window: usize,
    /// Fault seed.
    pub seed: u64,
    /// Force the in-process transport.
    pub in_process: bool,
    /// Run NIXL's progress thread in each agent.
    pub progress_thread: bool,
    /// Drain D's notifications on a pump thread (the consumer driver split in two).
    pub pump_thread: bool,
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
    /// Parses the command line.
    ///
    /// # Errors
    /// A message naming the bad argument.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            match flag.as_str() {
                "--in-process" => {
                    o.in_process = true;
                    continue;
                }
                "--progress-thread" => {
                    o.progress_thread = true;
                    continue;
                }
                "--no-pump-thread" => {
                    o.pump_thread = false;
                    continue;
                }
                _ => {}
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let bad = || format!("bad value for {flag}: {value:?}");
            match flag.as_str() {
                "--requests" => o.requests = value.parse().map_err(|_| bad())?,
                "--block-size" => o.block_size = value.parse().map_err(|_| bad())?,
                "--blocks" => o.blocks = value.parse().map_err(|_| bad())?,
                "--fail-rate" => o.fail_rate = value.parse().map_err(|_| bad())?,
                "--window" => o.window = value.parse().map_err(|_| bad())?,
                "--seed" => o.seed = value.parse().map_err(|_| bad())?,
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        if o.block_size == 0 || o.block_size % 16 != 0 {
            return Err("--block-size must be a positive multiple of 16".into());
        }
        if !(0.0..=1.0).contains(&o.fail_rate) {
            return Err("--fail-rate must be within 0..=1".into());
        }
        if !(1..=1024).contains(&o.window) || o.blocks == 0 || o.requests == 0 {
            return Err("--window must be 1..=1024, --blocks and --requests positive".into());
        }
        Ok(o)
    }

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
/// its bytes, 1 otherwise, 2 on bad arguments.
pub fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let options = match Options::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("kvdrain demo: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let summary = run(&options);
    print!("{summary}");
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

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn parses_flags_and_refuses_nonsense() {
        let o = Options::parse(&args(
            "--requests 10 --block-size 4096 --fail-rate 0.5 --in-process",
        ))
        .unwrap();
        assert_eq!(
            (o.requests, o.block_size, o.fail_rate, o.in_process),
            (10, 4096, 0.5, true)
        );
        assert!(Options::parse(&args("--block-size 100")).is_err());
        assert!(Options::parse(&args("--fail-rate 2")).is_err());
        assert!(Options::parse(&args("--requests")).is_err());
        assert!(Options::parse(&args("--bogus 1")).is_err());
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
