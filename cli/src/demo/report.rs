//! The demo's progress bar and summary table.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// What a demo run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// How the bytes moved.
    pub transport: String,
    /// Requests pushed.
    pub requests: u64,
    /// `completed` (every write landed and the bytes were checked).
    pub completed: u64,
    /// `failed` (a producer sent `PUSH_FAIL`).
    pub failed: u64,
    /// `expired` (deadline passed).
    pub expired: u64,
    /// Releases forced by the quarantine running out.
    pub forced: u64,
    /// Completed requests whose blocks did not hold the expected bytes.
    pub corrupt: u64,
    /// Requests that never reached a decision.
    pub unfinished: u64,
    /// Bytes of writes that landed.
    pub bytes: u64,
    /// Completion notices counted by the tracker.
    pub completions: u64,
    /// `PUSH_FAIL` notices counted by the tracker.
    pub failure_notices: u64,
    /// Notification → decision latency, median.
    pub p50: Option<Duration>,
    /// Notification → decision latency, 99th percentile.
    pub p99: Option<Duration>,
    /// With a pump thread: drain → the decision point in the ingest half (kvdrain's own
    /// part, before the hand-off to the engine thread), median and 99th percentile.
    pub ingest_p50: Option<Duration>,
    /// See `ingest_p50`.
    pub ingest_p99: Option<Duration>,
    /// Wall time of the run.
    pub wall: Duration,
}

impl Summary {
    /// Every request ended and every completed one held its bytes.
    pub fn ok(&self) -> bool {
        self.corrupt == 0
            && self.unfinished == 0
            && self.completed + self.failed + self.expired == self.requests
    }
}

fn micros(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.1} µs", d.as_secs_f64() * 1e6),
    )
}

fn per_sec(n: f64, wall: Duration) -> f64 {
    n / wall.as_secs_f64().max(1e-9)
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let notices = (self.completions + self.failure_notices) as f64;
        let rows: [(&str, String); 12] = [
            ("transport", self.transport.clone()),
            ("requests", self.requests.to_string()),
            ("completed", format!("{} (bytes checked)", self.completed)),
            (
                "failed",
                format!("{} (PUSH_FAIL from a producer)", self.failed),
            ),
            ("expired", self.expired.to_string()),
            (
                "notices",
                format!(
                    "{} completions + {} PUSH_FAIL",
                    self.completions, self.failure_notices
                ),
            ),
            (
                "bytes moved",
                format!("{:.1} MiB", self.bytes as f64 / (1 << 20) as f64),
            ),
            (
                "notification → decision",
                format!("p50 {}   p99 {}", micros(self.p50), micros(self.p99)),
            ),
            (
                "  of which ingest half",
                match self.ingest_p50 {
                    Some(_) => format!(
                        "p50 {}   p99 {} (drain → decision point, pump thread)",
                        micros(self.ingest_p50),
                        micros(self.ingest_p99)
                    ),
                    None => "(no pump thread)".to_owned(),
                },
            ),
            (
                "throughput",
                format!(
                    "{:.0} req/s   {:.0} notices/s   {:.1} MiB/s",
                    per_sec(self.requests as f64, self.wall),
                    per_sec(notices, self.wall),
                    per_sec(self.bytes as f64 / (1 << 20) as f64, self.wall)
                ),
            ),
            ("wall time", format!("{:.2} s", self.wall.as_secs_f64())),
            (
                "problems",
                if self.ok() {
                    "none".to_owned()
                } else {
                    format!(
                        "{} corrupt, {} unfinished, {} forced releases",
                        self.corrupt, self.unfinished, self.forced
                    )
                },
            ),
        ];
        writeln!(f)?;
        writeln!(f, "  {:-<26}+{:-<52}", "", "")?;
        for (k, v) in rows {
            writeln!(f, "  {k:<25} | {v}")?;
        }
        writeln!(f, "  {:-<26}+{:-<52}", "", "")
    }
}

/// A progress bar on standard error: redrawn in place on a terminal; on a pipe, a line every
/// two seconds once the run is long. Silent on short piped runs.
#[derive(Debug)]
pub struct Progress {
    total: u64,
    start: Instant,
    last: Instant,
    tty: bool,
    drawn: bool,
}

impl Progress {
    /// A bar for `total` requests.
    pub fn new(total: u64) -> Self {
        let now = Instant::now();
        Progress {
            total,
            start: now,
            last: now,
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// `done` requests decided so far.
    pub fn update(&mut self, done: u64) {
        let every = if self.tty {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(2)
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let frac = done as f64 / self.total.max(1) as f64;
        let width = 40;
        let filled = (frac * width as f64) as usize;
        let line = format!(
            "[{}{}] {done}/{} ({:.0}%) {:.1} s",
            "#".repeat(filled),
            " ".repeat(width - filled.min(width)),
            self.total,
            frac * 100.0,
            self.start.elapsed().as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        let _ = if self.tty {
            write!(err, "\r{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
        self.drawn = true;
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if self.tty && self.drawn {
            let _ = write!(std::io::stderr(), "\r{:80}\r", "");
        }
    }
}
