//! The executable form of the replay trace spec (`docs/replay-trace.md`): parses a trace of
//! consumer-side events, drives the real [`kvdrain::Ledger`] with it and writes every
//! decision the ledger takes, one JSON object per line.
//!
//! This crate only parses the trace and formats decisions; every decision comes from the
//! core. `kvdrain replay` is a thin front end over [`replay`]; the trace catalogue
//! (`tests/traces`) and the `replay` fuzz target call it directly.
//!
//! ```
//! let mut out = Vec::new();
//! kvdrain_replay::replay(b"register r1 expect=1\nnotify p0 r1:1\n", &mut out).unwrap();
//! assert_eq!(out, b"{\"at\":0,\"event\":\"completed\",\"req\":\"r1\"}\n");
//! ```

mod lines;
mod record;
mod session;

use std::io::{self, Write};

use kvdrain::{Config, Duration, Ledger};

use crate::lines::{Line, Lines, number};
use crate::session::{Replay, Step};

/// Longest request id or agent name a trace may use, in bytes.
pub const MAX_NAME: usize = 256;
/// Most edges or notices a registration may wait for (the tracker's limit).
pub const MAX_EDGES: usize = kvdrain::MAX_EDGES;
/// Largest `capacity` a trace may configure.
pub const MAX_CAPACITY: usize = 65_536;
/// A line that breaks the trace grammar.
#[derive(Debug, PartialEq, Eq)]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "trace error at line {}: {}", self.line, self.why)
    }
}

impl std::error::Error for TraceError {}

/// Why a replay stopped.
#[derive(Debug)]
pub enum ReplayError {
    /// The trace breaks the grammar; decisions of earlier lines were written.
    Trace(TraceError),
    /// Writing the output failed.
    Io(io::Error),
}

impl From<io::Error> for ReplayError {
    fn from(e: io::Error) -> Self {
        ReplayError::Io(e)
    }
}

/// Replays `trace`, writing one JSON line per decision to `out`.
///
/// The ledger is inline and large (`Ledger<N, 64>` with `N` the configured capacity rounded
/// up to a power of two, at least 1 024: about 1 MiB to 27 MiB), so it is built on a
/// thread of its own with a stack big enough for it.
///
/// # Errors
/// [`ReplayError::Trace`] at the first line that breaks the grammar (after writing the
/// decisions of the lines before it); [`ReplayError::Io`] if writing failed or the thread
/// could not be spawned.
pub fn replay(trace: &[u8], out: &mut (dyn Write + Send)) -> Result<(), ReplayError> {
    replay_inline_below(trace, out, 0)
}

/// As [`replay`], but builds the ledger on the calling thread when it takes fewer than
/// `inline_below` bytes, and on a thread of its own otherwise. For a caller that replays
/// many small traces on a thread with a big stack, for which spawning costs more than the
/// replay (the `replay` fuzz target: its 8 MiB main thread takes ledgers below 2 MiB).
/// The calling thread's stack must have room for `inline_below` bytes and some more.
///
/// # Errors
/// As [`replay`].
pub fn replay_inline_below(
    trace: &[u8],
    out: &mut (dyn Write + Send),
    inline_below: usize,
) -> Result<(), ReplayError> {
    let mut lines = Lines::new(trace);
    let mut config = Config::with_capacity(1024);
    // `config` lines come first; the ledger is sized once they are read.
    let first = loop {
        let Some((n, line)) = lines.next() else {
            return Ok(());
        };
        let line = line.map_err(|why| trace_error(n, why))?;
        match line.command() {
            "config" => apply_config(&mut config, &line).map_err(|why| trace_error(n, why))?,
            _ => break (n, line),
        }
    };
    // Room for the configured capacity, and at least 1024 slots so the tombstones remember
    // thousands of decided ids whatever the capacity.
    match config.capacity.max(1024).next_power_of_two() {
        1024 => run::<1024>(config, first, lines, out, inline_below),
        2048 => run::<2048>(config, first, lines, out, inline_below),
        4096 => run::<4096>(config, first, lines, out, inline_below),
        8192 => run::<8192>(config, first, lines, out, inline_below),
        16384 => run::<16384>(config, first, lines, out, inline_below),
        32768 => run::<32768>(config, first, lines, out, inline_below),
        _ => run::<65536>(config, first, lines, out, inline_below),
    }
}

fn trace_error(line: usize, why: impl Into<String>) -> ReplayError {
    ReplayError::Trace(TraceError {
        line,
        why: why.into(),
    })
}

fn apply_config(config: &mut Config, line: &Line<'_>) -> Result<(), String> {
    for word in line.args() {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=VALUE, got {word:?}"))?;
        let value = number(value).map_err(|e| format!("{key}: {e}"))?;
        match key {
            "capacity" => {
                let capacity = usize::try_from(value).unwrap_or(usize::MAX);
                if capacity == 0 || capacity > MAX_CAPACITY {
                    return Err(format!("capacity must be in 1..={MAX_CAPACITY}"));
                }
                config.capacity = capacity;
            }
            // The format's spans are integers in ms, like every time in it.
            "deadline_ms" => config.deadline = Duration::from_millis(value),
            "quarantine_ms" => config.quarantine = Duration::from_millis(value),
            "settle_ms" => config.settle = Duration::from_millis(value),
            _ => return Err(format!("unknown config key {key:?}")),
        }
    }
    Ok(())
}

fn run<const N: usize>(
    config: Config,
    first: (usize, Line<'_>),
    lines: Lines<'_>,
    out: &mut (dyn Write + Send),
    inline_below: usize,
) -> Result<(), ReplayError> {
    let bytes = std::mem::size_of::<Ledger<N, MAX_EDGES>>();
    if bytes < inline_below {
        return drive::<N>(config, first, lines, out);
    }
    // The ledger is large and inline; build it on a thread with room for it.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("kvdrain-replay".into())
            .stack_size(bytes * 4 + (8 << 20))
            .spawn_scoped(scope, move || drive::<N>(config, first, lines, out))
            .map_err(ReplayError::Io)?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn drive<const N: usize>(
    config: Config,
    first: (usize, Line<'_>),
    mut lines: Lines<'_>,
    out: &mut (dyn Write + Send),
) -> Result<(), ReplayError> {
    let mut ledger = Ledger::<N, MAX_EDGES>::new(config);
    let mut r = Replay::new(out);
    let mut next = Some((first.0, Ok(first.1)));
    while let Some((n, line)) = next {
        let line = line.map_err(|why| trace_error(n, why))?;
        r.command(&mut ledger, &line).map_err(|e| match e {
            Step::Trace(why) => trace_error(n, why),
            Step::Io(e) => ReplayError::Io(e),
        })?;
        next = lines.next();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_trace(trace: &str) -> (String, Option<TraceError>) {
        let mut out = Vec::new();
        let err = match replay(trace.as_bytes(), &mut out) {
            Ok(()) => None,
            Err(ReplayError::Trace(e)) => Some(e),
            Err(ReplayError::Io(e)) => panic!("{e}"),
        };
        (String::from_utf8(out).unwrap(), err)
    }

    #[test]
    fn spec_example() {
        let (out, err) = run_trace(
            "config deadline_ms=1000 settle_ms=100\nregister r1 edges=p0,p1\nnotify p1 PUSH_FAIL:r1:2\nat 5\nnotify p0 r1:2\nat 99\nat 100\n",
        );
        assert_eq!(err, None);
        assert_eq!(
            out,
            "{\"at\":5,\"event\":\"failed\",\"req\":\"r1\"}\n{\"at\":100,\"event\":\"released\",\"req\":\"r1\",\"forced\":false}\n"
        );
    }
}
