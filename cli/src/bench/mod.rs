//! `kvdrain bench`: what kvdrain costs, measured next to what users run today.
//!
//! | command | prints |
//! | --- | --- |
//! | `bench ingest` | ns per notification through the real [`kvdrain::Ledger`] (parse, lookup, count, decide, poll, re-register) |
//! | `bench floor` | the same stream through a pre-sized `FxHashMap` counter: one hash, one update |
//! | `bench compare` | kvdrain, the floor (interleaved, same thread) and `bench/vllm_baseline.py`, with the ratios |
//! | `bench sweep` | `bench ingest` for R = 64 … 65 536 × E = 1, 2, 8, 32, and how flat it is |
//! | `bench tick` | cost of one [`advance`](kvdrain::Ledger::advance) with many requests in flight and few expiring |
//! | `bench memory` | `size_of` of the ledger and per tracked request |
//! | `bench c-api` | ns per notification through the C ABI (`kvdrain-ffi`) next to the Rust API, and the ratio |
//! | `bench stream` | the message stream, one a line (to `cmp` against the Python generator) |
//!
//! Every command prints JSON lines. The message stream ([`stream`]) is byte-identical to
//! the one `bench/vllm_baseline.py` generates; messages are prepared before timing; each
//! repetition starts from a fresh table and times one pass over all of them; figures are
//! medians over `--reps` with the quartiles and extremes next to them.

pub mod alloc;
pub mod floor;
pub mod ingest;
pub mod stream;

mod c_api;
mod compare;
mod memory;
mod sweep;
mod tick;

use std::fmt::Write as _;
use std::process::ExitCode;

pub use ingest::Mode;

const USAGE: &str = "\
usage: kvdrain bench <what> [flags]

  ingest  --inflight R --edges E --notifications M [--mode counting|named]
          [--fail-share 0.01] [--reps 11] [--seed S]
  floor   --inflight R --edges E --notifications M [--fail-share F] [--reps K] [--seed S]
  compare --inflight R --edges E --notifications M [--mode ..] [--fail-share F] [--reps K]
          [--seed S] [--python python3] [--python-script PATH] [--python-reps 3] [--no-python]
  sweep   [--notifications 1000000] [--edges-list 1,2,8,32] [--min-inflight 64]
          [--max-inflight 65536] [--mode ..] [--fail-share F] [--reps K] [--seed S]
  tick    [--inflight 65536] [--expiring 4] [--ticks 4096] [--reps K]
  memory
  c-api   --inflight R --edges E [--notifications 2000000] [--mode ..] [--fail-share F]
          [--reps 11] [--seed S] [--target 1.10]
  stream  --inflight R --edges E --notifications M [--fail-share F] [--seed S]

numbers accept `_` separators and a 0x prefix; every command prints JSON lines.
";

/// `kvdrain bench` entry point.
pub fn main(args: &[String]) -> ExitCode {
    let Some((what, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let flags = match Flags::parse(rest) {
        Ok(f) => f,
        Err(e) => return usage_error(&e),
    };
    let result = match what.as_str() {
        "ingest" => ingest::main(flags),
        "floor" => ingest::floor_main(flags),
        "compare" => compare::main(flags),
        "sweep" => sweep::main(flags),
        "tick" => tick::main(flags),
        "memory" => memory::main(flags),
        "c-api" => c_api::main(flags),
        "stream" => ingest::stream_main(flags),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => Err(Failure::Usage(format!("unknown bench {other:?}"))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => usage_error(&e),
        Err(Failure::Check(e)) => {
            eprintln!("kvdrain bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(e: &str) -> ExitCode {
    eprintln!("kvdrain bench: {e}\n{USAGE}");
    ExitCode::from(2)
}

/// Why a bench command failed.
#[derive(Debug)]
pub enum Failure {
    /// Bad flags (exit 2).
    Usage(String),
    /// The run broke a check: allocations, a sanity count, a child process (exit 1).
    Check(String),
}

/// `--flag value`, `--flag=value` and bare `--flag` arguments, consumed by name.
#[derive(Debug, Default)]
pub struct Flags {
    items: Vec<(String, Option<String>)>,
}

impl Flags {
    /// Splits `args`; a flag followed by an argument that is not a flag takes it as its
    /// value.
    pub fn parse(args: &[String]) -> Result<Flags, String> {
        let mut items = Vec::new();
        let mut it = args.iter().peekable();
        while let Some(arg) = it.next() {
            let Some(body) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument {arg:?}"));
            };
            if let Some((name, value)) = body.split_once('=') {
                items.push((name.to_owned(), Some(value.to_owned())));
            } else if it.peek().is_some_and(|next| !next.starts_with("--")) {
                items.push((body.to_owned(), it.next().cloned()));
            } else {
                items.push((body.to_owned(), None));
            }
        }
        Ok(Flags { items })
    }

    fn take(&mut self, name: &str) -> Option<Option<String>> {
        let i = self.items.iter().position(|(n, _)| n == name)?;
        Some(self.items.remove(i).1)
    }

    /// A string flag.
    pub fn string(&mut self, name: &str) -> Result<Option<String>, Failure> {
        match self.take(name) {
            None => Ok(None),
            Some(Some(v)) => Ok(Some(v)),
            Some(None) => Err(Failure::Usage(format!("--{name} needs a value"))),
        }
    }

    /// A bare switch.
    pub fn switch(&mut self, name: &str) -> Result<bool, Failure> {
        match self.take(name) {
            None => Ok(false),
            Some(None) => Ok(true),
            Some(Some(v)) => Err(Failure::Usage(format!("--{name} takes no value ({v:?})"))),
        }
    }

    /// An unsigned integer flag (`_` separators and `0x` allowed).
    pub fn u64(&mut self, name: &str) -> Result<Option<u64>, Failure> {
        let Some(text) = self.string(name)? else {
            return Ok(None);
        };
        parse_u64(&text)
            .map(Some)
            .ok_or_else(|| Failure::Usage(format!("--{name}: invalid number {text:?}")))
    }

    /// An unsigned integer flag that must be at least 1.
    pub fn count(&mut self, name: &str, default: Option<usize>) -> Result<usize, Failure> {
        let value = match self.u64(name)? {
            Some(v) => usize::try_from(v).unwrap_or(usize::MAX),
            None => default.ok_or_else(|| Failure::Usage(format!("--{name} is required")))?,
        };
        if value == 0 {
            return Err(Failure::Usage(format!("--{name} must be >= 1")));
        }
        Ok(value)
    }

    /// A floating-point flag.
    pub fn f64(&mut self, name: &str, default: f64) -> Result<f64, Failure> {
        match self.string(name)? {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|_| Failure::Usage(format!("--{name}: invalid number {text:?}"))),
        }
    }

    /// Fails on any flag nobody took.
    pub fn finish(self) -> Result<(), Failure> {
        match self.items.first() {
            None => Ok(()),
            Some((name, _)) => Err(Failure::Usage(format!("unknown flag --{name}"))),
        }
    }
}

fn parse_u64(text: &str) -> Option<u64> {
    let clean: String = text.chars().filter(|&c| c != '_').collect();
    match clean
        .strip_prefix("0x")
        .or_else(|| clean.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => clean.parse().ok(),
    }
}

/// Median, quartiles and extremes of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// Smallest sample.
    pub min: f64,
    /// First quartile.
    pub q1: f64,
    /// Median.
    pub median: f64,
    /// Third quartile.
    pub q3: f64,
    /// Largest sample.
    pub max: f64,
}

impl Spread {
    /// Summarises `samples` (at least one).
    pub fn of(samples: &[f64]) -> Spread {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| {
            // Linear interpolation between closest ranks.
            let pos = q * (s.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
        };
        Spread {
            min: s[0],
            q1: at(0.25),
            median: at(0.5),
            q3: at(0.75),
            max: s[s.len() - 1],
        }
    }

    /// `"<median_key>":median,"<prefix>_min":..,"_q1","_q3","_max"` (without braces);
    /// `null` for values that are not finite.
    pub fn json(&self, out: &mut String, median_key: &str, prefix: &str) {
        let _ = write!(out, "\"{median_key}\":{}", Num(self.median));
        for (key, value) in [
            ("min", self.min),
            ("q1", self.q1),
            ("q3", self.q3),
            ("max", self.max),
        ] {
            let _ = write!(out, ",\"{prefix}_{key}\":{}", Num(value));
        }
    }
}

/// A JSON number with two decimals, or `null`.
#[derive(Clone, Copy, Debug)]
pub struct Num(pub f64);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_finite() {
            write!(f, "{:.2}", self.0)
        } else {
            f.write_str("null")
        }
    }
}

/// Wall-clock and thread-CPU time of a timed section. On a shared machine the wall time
/// also counts the time the thread spent descheduled; the CPU time does not (it still
/// includes what other processes do to the caches).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: std::time::Instant,
    cpu: Option<u64>,
}

/// What a [`Clock`] measured, per item.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Elapsed {
    /// Wall-clock nanoseconds per item.
    pub wall: f64,
    /// Thread-CPU nanoseconds per item (`NaN` where the platform has no such clock).
    pub cpu: f64,
}

impl Clock {
    /// Starts timing.
    pub fn start() -> Clock {
        let cpu = thread_cpu_ns();
        Clock {
            wall: std::time::Instant::now(),
            cpu,
        }
    }

    /// Stops timing; the times divided by `items`.
    pub fn per(self, items: usize) -> Elapsed {
        let wall = self.wall.elapsed().as_nanos() as f64;
        let cpu = match (self.cpu, thread_cpu_ns()) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64,
            _ => f64::NAN,
        };
        let n = items.max(1) as f64;
        Elapsed {
            wall: wall / n,
            cpu: cpu / n,
        }
    }
}

/// CPU time of the calling thread, in ns.
#[cfg(unix)]
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(not(unix))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// Runs `f` on a thread with a `bytes`-byte stack (the ledger lives on the stack).
pub fn on_big_stack<T: Send>(bytes: usize, f: impl FnOnce() -> T + Send) -> Result<T, Failure> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("kvdrain-bench".into())
            .stack_size(bytes)
            .spawn_scoped(scope, f)
            .map_err(|e| Failure::Check(format!("cannot start a {bytes}-byte stack: {e}")))?;
        handle
            .join()
            .map_err(|_| Failure::Check("bench thread panicked".into()))
    })
}

/// A stack that fits a few copies of a `ledger_bytes`-byte ledger plus the harness.
pub fn stack_for(ledger_bytes: usize) -> usize {
    4 * ledger_bytes + (16 << 20)
}

/// `"allocations":N` or `null` when the counting allocator is not installed.
pub fn allocations_json(out: &mut String, counting: bool, allocations: u64) {
    if counting {
        let _ = write!(out, "\"allocations\":{allocations}");
    } else {
        out.push_str("\"allocations\":null");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_take_values_and_switches() {
        let args: Vec<String> = ["--a", "1_000", "--b=0x10", "--c", "--d", "x"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let mut f = Flags::parse(&args).expect("parses");
        assert_eq!(f.u64("a").ok().flatten(), Some(1000));
        assert_eq!(f.u64("b").ok().flatten(), Some(16));
        assert!(f.switch("c").unwrap_or(false));
        assert_eq!(f.string("d").ok().flatten().as_deref(), Some("x"));
        assert!(f.finish().is_ok());
        let mut g = Flags::parse(&["--z".to_owned()]).expect("parses");
        assert!(g.count("n", None).is_err());
        assert!(g.finish().is_err());
    }

    #[test]
    fn spread_interpolates_quartiles() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(
            (s.min, s.q1, s.median, s.q3, s.max),
            (1.0, 2.0, 3.0, 4.0, 5.0)
        );
        assert_eq!(Spread::of(&[1.0, 2.0]).median, 1.5);
    }
}
