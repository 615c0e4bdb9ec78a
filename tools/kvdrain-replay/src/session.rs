//! One replay in progress: the names the trace gave agents and requests, and each command
//! applied to the ledger, its decisions written as they are handed out.

use std::collections::HashMap;
use std::io::{self, Write};

use kvdrain::{
    AbortError, AgentId, BlockHandle, Decision, Duration, Expect, IgnoreReason, Instant, Ledger,
    Outstanding, Quarantined, RegisterErrorKind, Registration, RequestKey,
};

use crate::MAX_EDGES;
use crate::lines::{Line, name, number, unescape};
use crate::record::{Owed, Record, write_record};

/// What the replay keeps per tracked request to print its decisions.
struct Tracked {
    id: String,
    /// Named-edge mode: the agents in registration order.
    pub(crate) agents: Vec<String>,
}

pub(crate) struct Replay<'o> {
    now: Instant,
    agents: HashMap<String, AgentId>,
    requests: HashMap<RequestKey, Tracked>,
    out: &'o mut (dyn Write + Send),
    buf: Vec<u8>,
}

impl<'o> Replay<'o> {
    /// A replay at time 0 that knows no names yet, writing to `out`.
    pub(crate) fn new(out: &'o mut (dyn Write + Send)) -> Self {
        Replay {
            now: Instant::ZERO,
            agents: HashMap::new(),
            requests: HashMap::new(),
            out,
            buf: Vec::new(),
        }
    }
}

pub(crate) enum Step {
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
    pub(crate) fn command<const N: usize>(
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
                if ms < self.now.millis() {
                    return Err(Step::Trace(format!(
                        "clock goes backwards from {} to {ms}",
                        self.now.millis()
                    )));
                }
                self.now = Instant::from_millis(ms);
                ledger
                    .advance(self.now)
                    .map_err(|e| Step::Trace(e.to_string()))?;
            }
            "arrival" => {
                // A recorded batch's arrival time (`Ingest::set_arrival`): the notices that
                // follow are stamped with the later of it and the clock. The clock stays.
                let ms = number(args.next().ok_or("missing MS")?)?;
                if args.next().is_some() {
                    return Err(Step::Trace("arrival takes one argument".into()));
                }
                ledger.set_arrival(Instant::from_millis(ms));
            }
            "register" => self.register(ledger, args)?,
            "notify" => {
                let (agent, bytes) = line.notify_args()?;
                let bytes = unescape(bytes)?;
                let agent = self.agents.get(agent).copied().unwrap_or(AgentId::STRANGER);
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
                let agent = self.agents.get(agent).copied().unwrap_or(AgentId::STRANGER);
                let _resolved = ledger.fence(agent);
            }
            "gone" => {
                let agent = name("AGENT", args.next())?;
                if args.next().is_some() {
                    return Err(Step::Trace("gone takes one argument".into()));
                }
                let agent = self.agents.get(agent).copied().unwrap_or(AgentId::STRANGER);
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
            deadline: deadline.map(Duration::from_millis),
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
            .filter(|&n| n != AgentId::STRANGER.0)
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
