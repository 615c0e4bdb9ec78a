//! `kvdrain replay FILE|-`: feeds a trace of consumer-side events through the real tracker
//! and prints every decision it takes, one JSON object per line (`docs/replay-trace.md`).
//!
//! This file only parses the trace and formats decisions; every decision comes from
//! [`kvdrain::Ledger`].

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use kvdrain::{
    AbortError, AgentId, BlockHandle, Config, Decision, Expect, IgnoreReason, Ledger, Millis,
    Outstanding, Quarantined, RegisterErrorKind, Registration, RequestKey,
};

/// Longest request id or agent name a trace may use, in bytes.
pub const MAX_NAME: usize = 256;
/// Most edges or notices a registration may wait for (the tracker's limit).
pub const MAX_EDGES: usize = kvdrain::MAX_EDGES;
/// Largest `capacity` a trace may configure.
pub const MAX_CAPACITY: usize = 65_536;
/// Agent id given to senders that no registration names (they can never match an edge).
const STRANGER: AgentId = AgentId(u16::MAX);

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

/// Exit status when the input cannot be read or the output written.
pub const EXIT_UNREADABLE: u8 = 1;
/// Exit status of a trace error.
pub const EXIT_TRACE_ERROR: u8 = 2;

/// `kvdrain replay` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Exit status: 0 after the whole trace; 1 if the input cannot be read; 2 on a trace error
(`trace error at line L: WHY` on stderr, after the decisions of the lines before it) and
on bad usage (clap's message).

Example:
  kvdrain replay tests/traces/story_mixed_node.trace
  printf 'register r1 expect=1\\nnotify p0 r1:1\\n' | kvdrain replay -")]
pub struct ReplayArgs {
    /// The trace, one command a line (config, at, register, notify, abort, fence, gone; examples
    /// in tests/traces), or - for standard input.
    #[arg(value_name = "FILE|-")]
    pub trace: PathBuf,
}

/// `kvdrain replay` entry point: exit 0 after the whole trace, 2 on a trace error, 1 if
/// the input cannot be read.
pub fn main(args: &ReplayArgs) -> ExitCode {
    let path = &args.trace;
    let mut input = Vec::new();
    let read = if path.as_os_str() == "-" {
        io::stdin().lock().read_to_end(&mut input)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut input))
    };
    if let Err(e) = read {
        eprintln!("kvdrain replay: cannot read {}: {e}", path.display());
        return ExitCode::from(EXIT_UNREADABLE);
    }
    let mut out = io::BufWriter::new(io::stdout());
    let result = replay(&input, &mut out);
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(ReplayError::Trace(e)), _) => {
            eprintln!("{e}");
            ExitCode::from(EXIT_TRACE_ERROR)
        }
        (Err(ReplayError::Io(e)), _) | (Ok(()), Err(e)) => {
            eprintln!("kvdrain replay: cannot write output: {e}");
            ExitCode::from(EXIT_UNREADABLE)
        }
    }
}

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
/// # Errors
/// [`ReplayError::Trace`] at the first line that breaks the grammar (after writing the
/// decisions of the lines before it).
pub fn replay(trace: &[u8], out: &mut (dyn Write + Send)) -> Result<(), ReplayError> {
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
        1024 => run::<1024>(config, first, lines, out),
        2048 => run::<2048>(config, first, lines, out),
        4096 => run::<4096>(config, first, lines, out),
        8192 => run::<8192>(config, first, lines, out),
        16384 => run::<16384>(config, first, lines, out),
        32768 => run::<32768>(config, first, lines, out),
        _ => run::<65536>(config, first, lines, out),
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
            "deadline_ms" => config.deadline_ms = value,
            "quarantine_ms" => config.quarantine_ms = value,
            "settle_ms" => config.settle_ms = value,
            _ => return Err(format!("unknown config key {key:?}")),
        }
    }
    Ok(())
}

fn number(s: &str) -> Result<u64, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a non-negative decimal integer"));
    }
    s.parse().map_err(|_| format!("{s} is too large"))
}

fn name<'a>(what: &str, word: Option<&'a str>) -> Result<&'a str, String> {
    let word = word.ok_or_else(|| format!("missing {what}"))?;
    if word.len() > MAX_NAME {
        return Err(format!("{what} longer than {MAX_NAME} bytes"));
    }
    Ok(word)
}

/// What the replay keeps per tracked request to print its decisions.
struct Tracked {
    id: String,
    /// Named-edge mode: the agents in registration order.
    agents: Vec<String>,
}

struct Replay<'o> {
    now: Millis,
    agents: HashMap<String, AgentId>,
    requests: HashMap<RequestKey, Tracked>,
    out: &'o mut (dyn Write + Send),
    buf: Vec<u8>,
}

/// One output line (spec/replay-trace.md, "Output"): keys in this order, the optional ones
/// only where the event has them.
#[derive(Debug, Serialize)]
struct Record<'a> {
    at: Millis,
    event: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    req: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outstanding: Option<Owed<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    forced: Option<bool>,
}

/// `outstanding`: the agents still owing a notice, or how many notices are owed.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Owed<'a> {
    Count(u64),
    Agents(Vec<&'a str>),
}

impl<'a> Record<'a> {
    fn new(at: Millis, event: &'a str, req: Option<&'a str>) -> Self {
        Record {
            at,
            event,
            req,
            reason: None,
            outstanding: None,
            forced: None,
        }
    }
}

fn run<const N: usize>(
    config: Config,
    first: (usize, Line<'_>),
    lines: Lines<'_>,
    out: &mut (dyn Write + Send),
) -> Result<(), ReplayError> {
    let bytes = std::mem::size_of::<Ledger<N, MAX_EDGES>>();
    // The fuzzer calls this millions of times on its (8 MiB) main thread: skip the thread
    // while the ledger is small enough to build there.
    if cfg!(fuzzing) && bytes < (2 << 20) {
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
    let mut r = Replay {
        now: 0,
        agents: HashMap::new(),
        requests: HashMap::new(),
        out,
        buf: Vec::new(),
    };
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

enum Step {
    Trace(String),
    Io(io::Error),
}

impl From<String> for Step {
    fn from(why: String) -> Self {
        Step::Trace(why)
    }
}

impl From<&str> for Step {
    fn from(why: &str) -> Self {
        Step::Trace(why.into())
    }
}

impl From<io::Error> for Step {
    fn from(e: io::Error) -> Self {
        Step::Io(e)
    }
}

impl Replay<'_> {
    fn command<const N: usize>(
        &mut self,
        ledger: &mut Ledger<N, MAX_EDGES>,
        line: &Line<'_>,
    ) -> Result<(), Step> {
        let mut args = line.args();
        match line.command() {
            "config" => return Err(Step::Trace("config after the first other command".into())),
            "at" => {
                let ms = number(args.next().ok_or("missing MS")?)?;
                if args.next().is_some() {
                    return Err(Step::Trace("at takes one argument".into()));
                }
                if ms < self.now {
                    return Err(Step::Trace(format!(
                        "clock goes backwards from {} to {ms}",
                        self.now
                    )));
                }
                self.now = ms;
                ledger.advance(ms).map_err(|e| Step::Trace(e.to_string()))?;
            }
            "register" => self.register(ledger, args)?,
            "notify" => {
                let (agent, bytes) = line.notify_args()?;
                let bytes = unescape(bytes)?;
                let agent = self.agents.get(agent).copied().unwrap_or(STRANGER);
                if let Err(ignored) = ledger.handle_notification(agent, &bytes) {
                    let req = match ignored.reason {
                        IgnoreReason::Malformed(_) | IgnoreReason::NotForConsumer => None,
                        _ => ignored.request_id,
                    };
                    self.ignored(req, ignored.reason.as_str())?;
                }
            }
            "abort" => {
                let id = name("REQ", args.next())?;
                if args.next().is_some() {
                    return Err(Step::Trace("abort takes one argument".into()));
                }
                match ledger.abort_id(id) {
                    Ok(q) => self.quarantined("aborted", &q)?,
                    Err(AbortError::Unknown) => self.ignored(Some(id), "unknown")?,
                    Err(AbortError::Late) => self.ignored(Some(id), "late")?,
                }
            }
            "fence" => {
                let agent = name("AGENT", args.next())?;
                if args.next().is_some() {
                    return Err(Step::Trace("fence takes one argument".into()));
                }
                let agent = self.agents.get(agent).copied().unwrap_or(STRANGER);
                let _resolved = ledger.fence(agent);
            }
            "gone" => {
                let agent = name("AGENT", args.next())?;
                if args.next().is_some() {
                    return Err(Step::Trace("gone takes one argument".into()));
                }
                let agent = self.agents.get(agent).copied().unwrap_or(STRANGER);
                let _resolved = ledger.gone(agent);
            }
            other => return Err(Step::Trace(format!("unknown command {other:?}"))),
        }
        // Every decision the command led to, in the order taken: those `at`, `fence` or
        // `gone` took, then those of requests a notice drained (decided at the pull).
        while let Some(d) = ledger.poll_decision() {
            self.decision(d)?;
        }
        Ok(())
    }

    fn register<'a, const N: usize>(
        &mut self,
        ledger: &mut Ledger<N, MAX_EDGES>,
        mut args: impl Iterator<Item = &'a str>,
    ) -> Result<(), Step> {
        let id = name("REQ", args.next())?;
        let (mut expect, mut edges, mut deadline) = (None, None, None);
        for word in args {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("expected KEY=VALUE, got {word:?}"))?;
            let fresh = match key {
                "expect" => expect.replace(number(value)?).is_none(),
                "deadline" => deadline.replace(number(value)?).is_none(),
                "edges" => edges.replace(value).is_none(),
                _ => return Err(Step::Trace(format!("unknown register key {key:?}"))),
            };
            if !fresh {
                return Err(Step::Trace(format!("{key} given twice")));
            }
        }
        let mut agent_names = Vec::new();
        let mut agent_ids = Vec::new();
        let expect = match (expect, edges) {
            (Some(n), None) => match u8::try_from(n) {
                Ok(n) if (1..=MAX_EDGES as u8).contains(&n) => Expect::Count(n),
                _ => return Err(Step::Trace(format!("expect must be in 1..={MAX_EDGES}"))),
            },
            (None, Some(list)) => {
                for agent in list.split(',') {
                    let agent = name("agent name in edges", Some(agent))?;
                    if agent.is_empty() {
                        return Err(Step::Trace("empty agent name in edges".into()));
                    }
                    if agent_names.iter().any(|a| a == agent) {
                        return Err(Step::Trace(format!(
                            "agent {agent:?} listed twice in edges"
                        )));
                    }
                    agent_names.push(agent.to_owned());
                }
                if agent_names.len() > MAX_EDGES {
                    return Err(Step::Trace(format!("more than {MAX_EDGES} edges")));
                }
                for agent in &agent_names {
                    agent_ids.push(self.intern(agent)?);
                }
                Expect::Edges(&agent_ids)
            }
            (Some(_), Some(_)) => {
                return Err(Step::Trace("give expect= or edges=, not both".into()));
            }
            (None, None) => {
                return Err(Step::Trace(
                    "register needs expect=N or edges=A,B,...".into(),
                ));
            }
        };
        let registration = Registration {
            id,
            blocks: BlockHandle(0),
            expect,
            deadline_ms: deadline,
        };
        match ledger.register(registration) {
            Ok(ticket) => {
                let tracked = Tracked {
                    id: id.to_owned(),
                    agents: agent_names,
                };
                self.requests.insert(ticket.key(), tracked);
                Ok(())
            }
            Err(e) => {
                let reason = match e.kind {
                    RegisterErrorKind::Full => "full",
                    RegisterErrorKind::DuplicateId => "duplicate_id",
                    _ => return Err(Step::Trace(e.to_string())),
                };
                self.write(&Record {
                    reason: Some(reason),
                    ..Record::new(self.now, "rejected", Some(id))
                })?;
                Ok(())
            }
        }
    }

    fn intern(&mut self, agent: &str) -> Result<AgentId, String> {
        if let Some(&id) = self.agents.get(agent) {
            return Ok(id);
        }
        let id = u16::try_from(self.agents.len())
            .ok()
            .filter(|&n| n != STRANGER.0)
            .ok_or("more than 65535 distinct agent names")?;
        self.agents.insert(agent.to_owned(), AgentId(id));
        Ok(AgentId(id))
    }

    fn decision(&mut self, d: Decision) -> io::Result<()> {
        match d {
            Decision::Completed(done) => {
                let key = done.key();
                let _blocks = done.into_decode();
                self.simple("completed", key)?;
                self.requests.remove(&key);
            }
            Decision::Failed(f) => self.simple("failed", f.key())?,
            Decision::Expired(q) => self.quarantined("expired", &q)?,
            Decision::Released(r) => {
                let (key, forced) = (r.key(), r.forced());
                let _blocks = r.into_free();
                let id = self.requests.remove(&key).map(|t| t.id);
                self.write(&Record {
                    forced: Some(forced),
                    ..Record::new(self.now, "released", id.as_deref())
                })?;
            }
        }
        Ok(())
    }

    fn simple(&mut self, event: &str, key: RequestKey) -> io::Result<()> {
        let id = self.requests.get(&key).map(|t| t.id.clone());
        self.write(&Record::new(self.now, event, id.as_deref()))
    }

    fn quarantined(&mut self, event: &str, q: &Quarantined) -> io::Result<()> {
        let tracked = self.requests.get(&q.key());
        let outstanding = match q.outstanding() {
            Outstanding::Count(n) => Owed::Count(u64::from(n)),
            Outstanding::Edges(mask) => {
                let agents = tracked.map(|t| t.agents.as_slice()).unwrap_or_default();
                let owing = agents
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, agent)| agent.as_str());
                Owed::Agents(owing.collect())
            }
        };
        let record = Record {
            outstanding: Some(outstanding),
            ..Record::new(self.now, event, tracked.map(|t| t.id.as_str()))
        };
        write_record(&mut self.buf, &mut *self.out, &record)
    }

    fn ignored(&mut self, req: Option<&str>, reason: &str) -> io::Result<()> {
        self.write(&Record {
            reason: Some(reason),
            ..Record::new(self.now, "ignored", req)
        })
    }

    fn write(&mut self, record: &Record<'_>) -> io::Result<()> {
        write_record(&mut self.buf, &mut *self.out, record)
    }
}

/// Serialises `record` as one line into `buf`, then writes it whole to `out`.
fn write_record(buf: &mut Vec<u8>, out: &mut dyn Write, record: &Record<'_>) -> io::Result<()> {
    buf.clear();
    serde_json::to_writer(&mut *buf, record)?;
    buf.push(b'\n');
    out.write_all(buf)
}

/// Decodes `\xNN` and `\\` in notify bytes.
fn unescape(raw: &str) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(raw.len());
    let mut rest = raw.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b != b'\\' {
            bytes.push(b);
            rest = tail;
            continue;
        }
        match tail {
            [b'\\', more @ ..] => {
                bytes.push(b'\\');
                rest = more;
            }
            [b'x', h, l, more @ ..] if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                bytes.push(hex(*h) << 4 | hex(*l));
                rest = more;
            }
            _ => return Err("invalid escape in notification bytes (use \\xNN or \\\\)".into()),
        }
    }
    Ok(bytes)
}

/// One significant trace line, with its trailing `\r` dropped.
struct Line<'a> {
    text: &'a str,
}

impl<'a> Line<'a> {
    fn words(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.text.split(' ').filter(|w| !w.is_empty())
    }
    fn command(&self) -> &'a str {
        self.words().next().unwrap_or("")
    }
    fn args(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.words().skip(1)
    }
    /// `notify AGENT BYTES`: BYTES is everything after the single space after AGENT.
    fn notify_args(&self) -> Result<(&'a str, &'a str), String> {
        let after_command =
            self.text.trim_start_matches(' ')["notify".len()..].trim_start_matches(' ');
        let (agent, bytes) = after_command.split_once(' ').unwrap_or((after_command, ""));
        Ok((name("AGENT", Some(agent).filter(|a| !a.is_empty()))?, bytes))
    }
}

/// Significant lines with their 1-based numbers; a line that is not UTF-8 is an error.
struct Lines<'a> {
    rest: &'a [u8],
    number: usize,
}

impl<'a> Lines<'a> {
    fn new(input: &'a [u8]) -> Self {
        Lines {
            rest: input,
            number: 0,
        }
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = (usize, Result<Line<'a>, String>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (raw, rest) = match self.rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&self.rest[..i], &self.rest[i + 1..]),
                None => (self.rest, &[][..]),
            };
            self.rest = rest;
            self.number += 1;
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            let text = match std::str::from_utf8(raw) {
                Ok(text) => text,
                Err(_) => return Some((self.number, Err("line is not UTF-8".into()))),
            };
            let significant = text.trim_start_matches([' ', '\t']);
            if significant.is_empty() || significant.starts_with('#') {
                continue;
            }
            return Some((self.number, Ok(Line { text })));
        }
    }
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

    #[test]
    fn unescape_rules() {
        assert_eq!(unescape(r"a\x41\\b").unwrap(), b"aA\\b");
        assert_eq!(unescape(r"\xff\x00").unwrap(), b"\xff\x00");
        assert!(unescape(r"\n").is_err());
        assert!(unescape(r"\x4").is_err());
        assert!(unescape("\\").is_err());
    }

    #[test]
    fn notify_bytes_keep_extra_spaces() {
        let line = Line {
            text: "  notify   p0  r1:2",
        };
        assert_eq!(line.notify_args().unwrap(), ("p0", " r1:2"));
        let line = Line { text: "notify p0" };
        assert_eq!(line.notify_args().unwrap(), ("p0", ""));
    }
}
