//! `kvdrain bench` command-line arguments (clap).
//!
//! Counts accept `_` separators and a `0x` prefix (`--notifications 2_000_000`).

use clap::{Args, Subcommand, ValueEnum};

use super::stream::{DEFAULT_SEED, Params};

/// What to measure.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// ns per notification through the real Ledger (parse, lookup, count, decide, poll,
    /// re-register).
    #[command(
        after_help = "Example:\n  kvdrain bench ingest --inflight 4096 --edges 2 --notifications 2_000_000"
    )]
    Ingest(IngestArgs),
    /// The same stream through a pre-sized FxHashMap counter: one hash, one update.
    #[command(
        after_help = "Example:\n  kvdrain bench floor --inflight 4096 --edges 2 --notifications 2_000_000"
    )]
    Floor(FloorArgs),
    /// kvdrain, the floor (interleaved, same thread) and bench/vllm_baseline.py, with the
    /// ratios.
    #[command(
        after_help = "Example:\n  kvdrain bench compare --inflight 4096 --edges 2 --notifications 2_000_000 --reps 21"
    )]
    Compare(CompareArgs),
    /// `bench ingest` for R = 64 … 65 536 × E, and how flat it is.
    #[command(
        after_help = "Example:\n  kvdrain bench sweep --notifications 1_000_000 --edges-list 1,2,8,32"
    )]
    Sweep(SweepArgs),
    /// Cost of one advance with many requests in flight and few expiring.
    #[command(
        after_help = "Example:\n  kvdrain bench tick --inflight 65536 --expiring 4 --ticks 4096"
    )]
    Tick(TickArgs),
    /// size_of the ledger and per tracked request.
    #[command(after_help = "Example:\n  kvdrain bench memory")]
    Memory,
    /// The message stream, one a line (to `cmp` against the Python generator).
    #[command(
        after_help = "Example:\n  kvdrain bench stream --inflight 64 --edges 2 --notifications 1000"
    )]
    Stream(StreamArgs),
    /// ns per notification through the C ABI (kvdrain-ffi) next to the Rust API on the
    /// same ledger, interleaved in one run, with the ratio.
    #[command(
        after_help = "Example:\n  kvdrain bench c-api --inflight 4096 --edges 2 --notifications 2_000_000 --reps 11"
    )]
    CApi(CApiArgs),
    /// Notification → decision latency (p50 … max, ns) through the two-thread consumer
    /// (Ledger::split), on one thread, and a bare hand-off between the same two threads.
    #[command(
        after_help = "Prints one JSON line per path (one_thread, handoff, two_threads) and a \
`split` line: how much of the two-thread latency is kvdrain's work and how much the hand-off.\n\n\
Example:\n  kvdrain bench latency --requests 100_000 --rate 100_000 --batch 1\n  \
kvdrain bench latency --rate 100_000 --batch 16   # NIXL handing notices over 16 at a time"
    )]
    Latency(LatencyArgs),
}

/// How requests wait for their notifications (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// E notices from anyone (vLLM's semantics).
    Counting,
    /// One notice from each of E named agents.
    Named,
}

/// The message stream every ingest benchmark times.
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    /// R: requests in flight.
    #[arg(long, value_name = "R", value_parser = count)]
    pub inflight: usize,
    /// E: notifications (edges) per request, also the TP field (at most 64).
    #[arg(long, value_name = "E", value_parser = edges)]
    pub edges: usize,
    /// M: messages in the stream.
    #[arg(long, value_name = "M", value_parser = count)]
    pub notifications: usize,
    /// Probability of a failure notice instead of a completion.
    #[arg(long, value_name = "F", default_value_t = 0.01, value_parser = share)]
    pub fail_share: f64,
    /// PRNG seed.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_SEED, value_parser = number)]
    pub seed: u64,
}

impl StreamArgs {
    /// The generation parameters.
    pub fn params(&self) -> Params {
        Params {
            inflight: self.inflight,
            edges: self.edges,
            notifications: self.notifications,
            fail_share: self.fail_share,
            seed: self.seed,
        }
    }
}

/// `bench ingest`.
#[derive(Debug, Clone, Args)]
pub struct IngestArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub stream: StreamArgs,
    /// Counting or named edges.
    #[arg(long, value_enum, default_value_t = ModeArg::Counting)]
    pub mode: ModeArg,
    /// Repetitions (each from a fresh table).
    #[arg(long, value_name = "K", default_value_t = 11, value_parser = count)]
    pub reps: usize,
}

/// `bench floor`.
#[derive(Debug, Clone, Args)]
pub struct FloorArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub stream: StreamArgs,
    /// Repetitions (each from a fresh table).
    #[arg(long, value_name = "K", default_value_t = 11, value_parser = count)]
    pub reps: usize,
}

/// `bench compare`.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ingest: IngestArgs,
    /// Python interpreter for the vLLM baseline.
    #[arg(long, value_name = "PATH", default_value = "python3")]
    pub python: String,
    /// The baseline script (default: bench/vllm_baseline.py beside the sources).
    #[arg(long, value_name = "PATH")]
    pub python_script: Option<std::path::PathBuf>,
    /// Repetitions of the Python baseline.
    #[arg(long, value_name = "K", default_value_t = 3, value_parser = count)]
    pub python_reps: usize,
    /// Skip the Python baseline (its figures print as null).
    #[arg(long)]
    pub no_python: bool,
}

/// `bench sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// M: messages per point.
    #[arg(long, value_name = "M", default_value_t = 1_000_000, value_parser = count)]
    pub notifications: usize,
    /// The values of E, comma-separated.
    #[arg(long, value_name = "E,E,...", default_value = "1,2,8,32", value_delimiter = ',', value_parser = count)]
    pub edges_list: Vec<usize>,
    /// Smallest R (doubled up to --max-inflight).
    #[arg(long, value_name = "R", default_value_t = 64, value_parser = count)]
    pub min_inflight: usize,
    /// Largest R.
    #[arg(long, value_name = "R", default_value_t = 65_536, value_parser = count)]
    pub max_inflight: usize,
    /// Counting or named edges.
    #[arg(long, value_enum, default_value_t = ModeArg::Counting)]
    pub mode: ModeArg,
    /// Probability of a failure notice instead of a completion.
    #[arg(long, value_name = "F", default_value_t = 0.01, value_parser = share)]
    pub fail_share: f64,
    /// Repetitions per point.
    #[arg(long, value_name = "K", default_value_t = 11, value_parser = count)]
    pub reps: usize,
    /// PRNG seed.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_SEED, value_parser = number)]
    pub seed: u64,
}

/// `bench tick`.
#[derive(Debug, Clone, Args)]
pub struct TickArgs {
    /// Requests in flight (at most 65536).
    #[arg(long, value_name = "R", default_value_t = 65_536, value_parser = count)]
    pub inflight: usize,
    /// Requests that expire per tick.
    #[arg(long, value_name = "X", default_value_t = 4, value_parser = count)]
    pub expiring: usize,
    /// Ticks per repetition (--expiring × --ticks must not exceed --inflight).
    #[arg(long, value_name = "T", default_value_t = 4096, value_parser = count)]
    pub ticks: usize,
    /// Repetitions.
    #[arg(long, value_name = "K", default_value_t = 11, value_parser = count)]
    pub reps: usize,
}

/// `bench latency`.
#[derive(Debug, Clone, Copy, Args)]
pub struct LatencyArgs {
    /// M: requests measured on each path.
    #[arg(long, value_name = "M", default_value_t = 100_000, value_parser = count)]
    pub requests: usize,
    /// E: notices per request (counting mode); the last one is timed.
    #[arg(long, value_name = "E", default_value_t = 2, value_parser = small_edges)]
    pub edges: u8,
    /// R: requests registered ahead (at most 4096).
    #[arg(long, value_name = "R", default_value_t = 256, value_parser = count)]
    pub inflight: usize,
    /// Notices per second (0: flat out). The default, 100 000/s, is 50 000 requests/s
    /// from TP=2 producers: above what one decode node takes, slow enough that each
    /// decision is pulled before the next notice comes.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = number)]
    pub rate: u64,
    /// Notices handed over at once, as NIXL's getNotifs returns what accumulated.
    #[arg(long, value_name = "B", default_value_t = 1, value_parser = count)]
    pub batch: usize,
}

fn small_edges(text: &str) -> Result<u8, String> {
    edges(text).map(|e| e as u8)
}

/// An unsigned integer with optional `_` separators and `0x` prefix.
pub fn number(text: &str) -> Result<u64, String> {
    let clean: String = text.chars().filter(|&c| c != '_').collect();
    let parsed = match clean
        .strip_prefix("0x")
        .or_else(|| clean.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => clean.parse(),
    };
    parsed.map_err(|e| e.to_string())
}

/// A [`number`] that is at least 1.
pub fn count(text: &str) -> Result<usize, String> {
    match number(text)? {
        0 => Err("must be at least 1".into()),
        n => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

fn edges(text: &str) -> Result<usize, String> {
    match count(text)? {
        e if e > 64 => Err("must be at most 64".into()),
        e => Ok(e),
    }
}

fn share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        Ok(_) => Err("must be within [0, 1]".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::{count, number, share};

    #[test]
    fn numbers_take_separators_and_hex() {
        assert_eq!(number("1_000"), Ok(1000));
        assert_eq!(number("0x10"), Ok(16));
        assert!(number("x").is_err());
        assert!(count("0").is_err());
        assert!(share("1.5").is_err());
        assert_eq!(share("0.5"), Ok(0.5));
    }
}

/// `bench c-api`.
#[derive(Debug, Clone, Args)]
pub struct CApiArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ingest: IngestArgs,
    /// The C/Rust ratio (median of per-rep ratios) reported as met at or below this.
    #[arg(long, value_name = "X", default_value_t = 1.10)]
    pub target: f64,
}
