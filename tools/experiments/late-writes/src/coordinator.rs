//! The coordinator: starts D and P as separate processes for each run, relays the
//! handshake between them, and turns their result lines into one [`RunRecord`].
//!
//! ```text
//!  coordinator            D child                         P child
//!      │ spawn ──────────▶ agent, pages, registration
//!      │ ◀──── D-READY md base
//!      │ spawn ────────────────────────────────────────▶ agent, stamped source
//!      │ D-READY ──────────────────────────────────────▶ load D's metadata
//!      │ ◀──────────────────────────────────────────── P-READY md
//!      │ P-READY ────────▶ load P's metadata, register the request, start the watcher
//!      │ ◀──── D-GO
//!      │ GO ───────────────────────────────────────────▶ P-POSTING, post, fault, report
//!      │ (fault d: SIGKILL to P fault_delay_us after P-POSTING)
//!      │ ◀──── D-RESULT …  (after the event, the release and the observation window)
//!      │ EXIT ─────────────────────────────────────────▶ ◀── P-RESULT … (none after a kill)
//! ```
//!
//! How a child is started is the caller's business ([`Launch`]): the `kvdrain` binary
//! re-executes itself with a hidden role subcommand; a test binary re-runs one of its
//! ignored tests. Either way the child calls [`child_main`] with its [`Role`].

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::host_monotonic_us;
use crate::lines::{Fields, announce, expect_line, reader_lines, stdin_lines};
use crate::spec::{Fault, RunSpec, SPEC_ENV, WRITE_PAGES};
use crate::{consumer_side, producer_side};

const START_LIMIT: Duration = Duration::from_secs(60);
const EXIT_LIMIT: Duration = Duration::from_secs(20);
const TEARDOWN_LIMIT: Duration = Duration::from_secs(5);

/// Which child a process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// D.
    Consumer,
    /// P.
    Producer,
}

impl Role {
    /// `d` / `p`.
    pub fn letter(self) -> &'static str {
        match self {
            Role::Consumer => "d",
            Role::Producer => "p",
        }
    }

    /// Parses `d` / `p`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "d" => Some(Role::Consumer),
            "p" => Some(Role::Producer),
            _ => None,
        }
    }
}

/// Builds the command that starts a child in `Role` (the coordinator adds the spec, the
/// transport's environment and the pipes).
pub type Launch<'a> = &'a dyn Fn(Role) -> Command;

/// The entry point of a child process: reads the spec from [`SPEC_ENV`], runs its side and
/// prints `D-RESULT …` / `P-RESULT …`. Returns the process exit code.
pub fn child_main(role: Role) -> i32 {
    let Some(spec) = std::env::var(SPEC_ENV)
        .ok()
        .and_then(|s| RunSpec::decode(&s))
    else {
        eprintln!("late-writes child: {SPEC_ENV} is missing or malformed");
        return 2;
    };
    let input = stdin_lines();
    let marker = match role {
        Role::Consumer => "D-RESULT",
        Role::Producer => "P-RESULT",
    };
    let publish = |fields: &Fields| announce(&format!("{marker} {}", fields.encode()));
    let result = match role {
        Role::Consumer => consumer_side::run(&spec, &input, &publish),
        Role::Producer => producer_side::run(&spec, &input, &publish),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("late-writes {} child: {e}", role.letter());
            announce(&format!("{}-ERROR {e}", role.letter().to_uppercase()));
            1
        }
    }
}

/// One run's combined result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// The run.
    pub spec: RunSpec,
    /// D's result fields.
    pub consumer: Fields,
    /// P's result fields (empty after a kill).
    pub producer: Fields,
    /// When the fault came, µs on the host's monotonic clock: P's `fault_mono_us`, or when
    /// the coordinator sent the SIGKILL (`None`: P reported no fault).
    pub fault_mono_us: Option<u64>,
}

impl RunRecord {
    /// Producer pages that landed after D wrote its reuse stamps.
    pub fn violations(&self) -> u64 {
        self.consumer.num("violation_pages").unwrap_or(0)
    }

    /// µs from a milestone (`"event"`, `"notice"`, `"disconnect"`, `"expiry"`, `"release"`) to
    /// the last landing (0 when everything landed before it; `None` when the run had no such
    /// milestone).
    pub fn gap_after(&self, milestone: &str) -> Option<u64> {
        self.consumer.num(&format!("gap_after_{milestone}_us"))
    }

    /// Pages that landed after the run's first failure event.
    pub fn late_pages(&self) -> u64 {
        self.consumer.num("late_pages").unwrap_or(0)
    }

    /// Whether the fault came before the write finished landing: D's watcher saw a page land
    /// after the fault, on the host's clock. Only the lower bound of the last landing
    /// counts (the start of the scan before the one that saw it), so a landing within a
    /// scan of the fault, or a write that stopped at the fault, is not mid-write. P's own
    /// view (`write_done_before_fault`: no `Success` polled yet) is not enough: every page
    /// may have landed before P polls the completion.
    pub fn fault_mid_write(&self) -> bool {
        match (
            self.fault_mono_us,
            self.consumer.num("last_landing_from_mono_us"),
        ) {
            (Some(fault), Some(last_landing_from)) => last_landing_from >= fault,
            _ => false,
        }
    }

    /// Whether D's first failure event (the notice, a disconnect or the expiry) came while
    /// pages of the write were still missing: only then can a release at that event be
    /// early. On a loaded host the fault can come mid-write and D still read the notice
    /// after the last page landed; such a run says nothing about late writes either.
    pub fn event_mid_write(&self) -> bool {
        self.consumer
            .num("landed_pages_at_event")
            .is_some_and(|landed| landed < WRITE_PAGES as u64)
    }

    /// One JSON line: the run's parameters, then D's fields under `d` and P's under `p`
    /// (absent after a kill).
    pub fn to_json(&self) -> String {
        let s = &self.spec;
        let mut head = Fields::default();
        head.put("run", s.run)
            .put("transport", s.transport.name())
            .put("fault", s.fault.letter())
            .put("policy", s.policy.name())
            .put("settle_ms", s.settle_ms)
            .put("deadline_ms", s.deadline_ms)
            .put("quarantine_ms", s.quarantine_ms)
            .put("fault_delay_us", s.fault_delay_us)
            .put("offset_pages", s.offset_pages)
            .put("rotation", s.rotation)
            .put_opt("fault_mono_us", self.fault_mono_us)
            .put("mid_write", self.fault_mid_write());
        let mut line = head.to_json_map();
        line.insert("d".into(), self.consumer.to_json_map().into());
        if !self.producer.0.is_empty() {
            line.insert("p".into(), self.producer.to_json_map().into());
        }
        serde_json::to_string(&line).unwrap_or_default()
    }
}

struct ChildProc {
    child: Child,
    stdin: ChildStdin,
    stdout: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    who: &'static str,
}

impl ChildProc {
    fn spawn(launch: Launch<'_>, role: Role, spec: &RunSpec) -> Result<Self, String> {
        let mut cmd = launch(role);
        cmd.env(SPEC_ENV, spec.encode())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in spec.transport.env() {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = reader_lines(child.stdout.take().ok_or("no stdout")?);
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().ok_or("no stderr")?;
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
                // Keep the tail only: UCX can be chatty after a reset.
                if s.len() > 16_384 {
                    let cut = s.len() - 8192;
                    let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(0);
                    s.drain(..cut);
                }
            }
        });
        Ok(ChildProc {
            child,
            stdin,
            stdout,
            stderr,
            who: if role == Role::Consumer { "D" } else { "P" },
        })
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("{}: write: {e}", self.who))
    }

    fn expect(&self, marker: &str, limit: Duration) -> Result<String, String> {
        let error = format!("{}-ERROR", self.who);
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = expect_line(&self.stdout, "", left).map_err(|e| self.failed(&e))?;
            if let Some((_, rest)) = line.split_once(&error) {
                return Err(self.failed(rest.trim()));
            }
            if let Some((_, rest)) = line.split_once(marker) {
                return Ok(rest.trim().to_owned());
            }
        }
    }

    fn failed(&self, what: &str) -> String {
        let err = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let tail: String = err
            .lines()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n  ");
        format!("{} child: {what}\n  {tail}", self.who)
    }

    /// Waits for the exit (killing the child after `limit`); `true` if it exited by itself.
    fn reap(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs one spec with two fresh child processes.
///
/// # Errors
/// A message (with the tail of the failing child's stderr) when a child fails or hangs.
pub fn run_once(spec: &RunSpec, launch: Launch<'_>) -> Result<RunRecord, String> {
    let mut d = ChildProc::spawn(launch, Role::Consumer, spec)?;
    let ready = d.expect("D-READY ", START_LIMIT)?;
    let mut p = ChildProc::spawn(launch, Role::Producer, spec)?;
    p.send(&format!("D-READY {ready}"))?;
    let p_md = p.expect("P-READY ", START_LIMIT)?;
    d.send(&format!("P-READY {p_md}"))?;
    d.expect("D-GO", START_LIMIT)?;
    p.send("GO")?;
    let mut kill_mono_us = None;
    if spec.fault == Fault::Kill {
        p.expect("P-POSTING", START_LIMIT)?;
        std::thread::sleep(Duration::from_micros(spec.fault_delay_us));
        kill_mono_us = Some(host_monotonic_us());
        p.child.kill().map_err(|e| format!("kill P: {e}"))?;
    }
    let consumer = Fields::decode(&d.expect(
        "D-RESULT ",
        Duration::from_millis(spec.limit_ms()) + EXIT_LIMIT,
    )?);
    let mut consumer = consumer;
    let producer = if spec.fault == Fault::Kill {
        p.reap(EXIT_LIMIT);
        Fields::default()
    } else {
        p.send("EXIT")?;
        let mut r = Fields::decode(&p.expect("P-RESULT ", EXIT_LIMIT)?);
        r.put("exited", p.reap(TEARDOWN_LIMIT));
        r
    };
    // NIXL teardown can hang once the peer died (seen on shared memory after a kill: the
    // UCX progress thread spins in the keepalive check and the agent's drop joins it).
    consumer.put("exited", d.reap(TEARDOWN_LIMIT));
    let fault_mono_us = kill_mono_us.or_else(|| producer.num("fault_mono_us"));
    Ok(RunRecord {
        spec: spec.clone(),
        consumer,
        producer,
        fault_mono_us,
    })
}
