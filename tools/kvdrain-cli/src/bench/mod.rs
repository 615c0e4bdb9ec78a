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
//! | `bench latency` | notification → decision latency (p50 … max) through the two-thread consumer, on one thread, and a bare hand-off between the two threads |
//! | `bench stream` | the message stream, one a line (to `cmp` against the Python generator) |
//!
//! Every command prints JSON lines. The message stream ([`stream`]) is byte-identical to
//! the one `bench/vllm_baseline.py` generates; messages are prepared before timing; each
//! repetition starts from a fresh table and times one pass over all of them; figures are
//! medians over `--reps` with the quartiles and extremes next to them (nearest rank, read
//! from an HDR histogram: [`Spread::of`]).

pub mod alloc;
pub mod args;
pub mod floor;
pub mod ingest;
pub mod line;
pub mod stream;

mod c_api;
mod compare;
mod latency;
mod memory;
mod sweep;
mod tick;

use std::process::ExitCode;

use hdrhistogram::Histogram;

pub use args::BenchCommand;
pub use ingest::Mode;
pub use line::{Line, num};

/// `kvdrain bench` entry point: 0 ok, 1 when a run breaks a check, 2 on bad arguments.
pub fn main(what: BenchCommand) -> ExitCode {
    let result = match what {
        BenchCommand::Ingest(a) => ingest::main(&a),
        BenchCommand::Floor(a) => ingest::floor_main(&a),
        BenchCommand::Compare(a) => compare::main(&a),
        BenchCommand::Sweep(a) => sweep::main(&a),
        BenchCommand::Tick(a) => tick::main(&a),
        BenchCommand::Memory => memory::main(),
        BenchCommand::Stream(a) => ingest::stream_main(&a),
        BenchCommand::CApi(a) => c_api::main(&a),
        BenchCommand::Latency(a) => latency::main(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("kvdrain bench: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Check(e)) => {
            eprintln!("kvdrain bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why a bench command failed.
#[derive(Debug)]
pub enum Failure {
    /// Flags that clap accepts but that do not fit together (exit 2).
    Usage(String),
    /// The run broke a check: allocations, a sanity count, a child process (exit 1).
    Check(String),
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
    /// Summarises `samples` (at least one) through an HDR histogram of their hundredths:
    /// nearest-rank quantiles (an even count's median is the lower middle sample), exact
    /// below 327.68 and within 0.01 % above (four significant digits). Any sample that is
    /// not finite (no thread clock) makes every figure `NaN`, printed `null`.
    pub fn of(samples: &[f64]) -> Spread {
        let unknown = Spread {
            min: f64::NAN,
            q1: f64::NAN,
            median: f64::NAN,
            q3: f64::NAN,
            max: f64::NAN,
        };
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return unknown;
        }
        // Auto-resizing: `record` grows it to the largest sample.
        let Ok(mut h) = Histogram::<u64>::new(4) else {
            return unknown;
        };
        for &s in samples {
            if h.record((s.max(0.0) * 100.0).round() as u64).is_err() {
                return unknown;
            }
        }
        let at = |q: f64| h.value_at_quantile(q) as f64 / 100.0;
        Spread {
            min: h.min() as f64 / 100.0,
            q1: at(0.25),
            median: at(0.5),
            q3: at(0.75),
            max: h.max() as f64 / 100.0,
        }
    }

    /// Adds `"<median_key>":median,"<prefix>_min":..,"_q1","_q3","_max"` to `line`
    /// (`null` for values that are not finite).
    pub fn put(&self, line: &mut Line, median_key: &str, prefix: &str) {
        line.put(median_key, num(self.median));
        for (key, value) in [
            ("min", self.min),
            ("q1", self.q1),
            ("q3", self.q3),
            ("max", self.max),
        ] {
            line.put(format!("{prefix}_{key}"), num(value));
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

/// `"allocations":N`, or `null` when the counting allocator is not installed.
pub fn put_allocations(line: &mut Line, counting: bool, allocations: u64) {
    line.put("allocations", counting.then_some(allocations));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_nearest_ranks_from_the_histogram() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(
            (s.min, s.q1, s.median, s.q3, s.max),
            (1.0, 2.0, 3.0, 4.0, 5.0)
        );
        assert_eq!(Spread::of(&[1.0, 2.0]).median, 1.0);
        let s = Spread::of(&[44.32, 8.01, 327.67]);
        assert_eq!((s.min, s.median, s.max), (8.01, 44.32, 327.67));
        let s = Spread::of(&[1497.42, 149_700.42, 2143.42, 1400.0, 1450.0]);
        let close = |got: f64, want: f64| (got / want - 1.0).abs() <= 1e-4;
        assert!(close(s.min, 1400.0) && close(s.q1, 1450.0), "{s:?}");
        assert!(close(s.median, 1497.42) && close(s.q3, 2143.42), "{s:?}");
        assert!(close(s.max, 149_700.42), "{s:?}");
        assert!(Spread::of(&[1.0, f64::NAN]).median.is_nan());
    }
}
