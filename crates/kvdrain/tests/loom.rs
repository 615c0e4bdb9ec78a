//! Loom models of the races between the ingest thread and the engine thread.
//!
//! ```text
//! RUSTFLAGS="--cfg kvdrain_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p kvdrain --test loom
//! ```
//!
//! Each model is the engine on loom's main thread plus one spawned ingest thread (the
//! design has exactly one of each per ledger: `Ingest` is neither `Clone` nor `Copy` and
//! [`Ledger::split`] takes `&mut self`, so a second ingest thread does not compile; two
//! notices from the one ingest thread are modelled instead). Every model checks the rules
//! of `docs/replay-trace.md`:
//!
//! * **no release before drain** — a producer's RDMA write is modelled as a loom
//!   `AtomicBool` that the ingest thread sets (`Release`) before it hands that producer's
//!   completion notice to the ledger, as NIXL delivers a notification only after its
//!   write. Whenever the engine receives `Completed`, `Failed` or an unforced `Released`,
//!   it loads (`Acquire`) the flag of every write the request waits for and panics if one
//!   may still land — so the check is on happens-before, not on a final tally;
//! * **exactly one decision** — each request ends with exactly one of completed / failed /
//!   aborted / expired, and exactly one `Released` unless it completed;
//! * **no lost and no double-counted notice** — each model asserts what every notice
//!   returned in every interleaving, and the ingest counters must agree with it.
//! * **failure notices settle** (rule 8) — models with `settle_ms > 0` check that an
//!   unforced `Released` comes no earlier than `settle_ms` after the clock the failure
//!   notice could have been stamped with (the engine raises a flag after each `advance`,
//!   which the ingest thread reads before its notice), or its arrival when the ingest
//!   half was given a later one (`set_arrival`), that a fence deciding after a failure
//!   notice still sees its stamp, and that a quarantine end is never delayed.
//! * **a `gone` settles too** (rule 9) — the gone models report an agent gone at a clock
//!   past 0 while the sibling's notice, the deadline or an abort races it, and the judge
//!   checks every unforced release against the `gone`'s time plus `settle_ms`.
//! * **each edge's cause is the resolution's** — the judge takes every decision with its
//!   record ([`Engine::poll_recorded`]) and checks each named edge: `landed` only once its
//!   write has landed (on happens-before, as above), `gone` or `fenced` only for an agent
//!   whose `gone` or `fence` resolved an edge, and a completion only with every edge
//!   landed. One model races a failure notice against a `gone` of the same agent and
//!   requires the record to name whichever resolved the edge.
//!
//! Each model also returns a label of what happened (the engine's log, `|` where it joined
//! the ingest thread, what each notice returned), and [`check`] requires the set of labels
//! over all executions to be exactly the expected one: every outcome the race allows is
//! reached, and no other. Three models run deliberately broken paths and must fail: two
//! ingest paths of `crates/kvdrain/src/broken.rs`, and a judge that reports a gone agent with
//! `fence`.
//!
//! loom 0.7 has no scoped threads and `Ledger::split` hands out borrowing halves, so
//! [`with_halves`] boxes one ledger per execution, lends its halves as `'static` and frees
//! it once the model joined its threads. Set `KVDRAIN_LOOM_QUIET` to not print the
//! per-model execution counts, times and outcomes.

#![cfg(kvdrain_loom)]

use std::collections::{BTreeMap, BTreeSet};

use kvdrain::{
    AbortError, AgentId, BlockHandle, Config, Decision, Duration, EdgeOutcome, Engine, Expect,
    IgnoreReason, Ingest, IngestCounters, Instant, Ledger, Noticed, Outstanding, Pending,
    QuarantineCause, Record, Recorded, RecordedEdges, RegisterErrorKind, Registration,
};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

// One ingest thread per ledger is the design: make a second one a compile error.
static_assertions::assert_not_impl_any!(Ingest<'static, 2, 2>: Clone, Copy);
static_assertions::assert_not_impl_any!(Engine<'static, 2, 2>: Clone, Copy);

const DEADLINE: u64 = 100;
const QUARANTINE: u64 = 50;
/// `settle_ms` of the models that settle failure notices (rule 8); the others use 0.
const SETTLE: u64 = 20;
/// Past every deadline and quarantine end of every model.
const FAR: u64 = 1_000;
const AGENTS: [AgentId; 2] = [AgentId(0), AgentId(1)];

/// Runs one model under loom, prints how many executions it took and how long, and checks
/// that the executions reached exactly the `expected` outcomes (each model returns a label
/// of what happened: the engine's log, `|` where it joined the ingest thread, and what
/// each notice returned).
///
/// The outcome check guards against vacuous models: stock loom 0.7.3 explores too little
/// here (its DPOR forgets a plain load by one thread once another loads and then stores
/// the same atomic, tokio-rs/loom#392 and #166; with it most of these models ran 1 to 20
/// executions and never reached half their outcomes). The workspace therefore builds loom
/// from `vendor/loom`, 0.7.3 with that and one modification-order fix
/// (`vendor/loom/PATCHES.md`), and the expected sets pin what it must reach.
fn check(name: &str, expected: &[&str], model: impl Fn() -> String + Sync + Send + 'static) {
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let outcomes = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let (counter, seen) = (executions.clone(), outcomes.clone());
    let mut builder = loom::model::Builder::new();
    // The CI command sets LOOM_MAX_PREEMPTIONS=2; keep a bare `cargo test` bounded too.
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
        builder.max_branches = 10_000;
    }
    let start = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let label = model();
        seen.lock().expect("outcome set").insert(label);
    });
    let elapsed = start.elapsed();
    let outcomes = outcomes.lock().expect("outcome set");
    if std::env::var_os("KVDRAIN_LOOM_QUIET").is_none() {
        println!(
            "loom model {name}: {} executions in {elapsed:.2?}, {} outcomes",
            executions.load(std::sync::atomic::Ordering::Relaxed),
            outcomes.len()
        );
        for o in outcomes.iter() {
            println!("    {o}");
        }
    }
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        *outcomes, expected,
        "model {name} reached other outcomes than expected"
    );
}

/// Hands `body` the two halves of a fresh `Ledger<N, E>` as `'static` values, which
/// `loom::thread::spawn` needs, and frees the ledger when `body` returns.
///
/// `body` must join every thread it moves a half into before it returns.
fn with_halves<const N: usize, const E: usize, R>(
    config: Config,
    body: impl FnOnce(Ingest<'static, N, E>, Engine<'static, N, E>) -> R,
) -> R {
    struct Lease<L>(*mut L);
    impl<L> Drop for Lease<L> {
        fn drop(&mut self) {
            // On a failed model a thread may still hold a half: leak rather than free.
            if !std::thread::panicking() {
                // SAFETY: `self.0` came from `Box::into_raw` and is freed only here, after
                // `body` returned and joined every thread that held a borrow of it.
                drop(unsafe { Box::from_raw(self.0) });
            }
        }
    }
    let lease = Lease(Box::into_raw(Box::new(Ledger::<N, E>::new(config))));
    // SAFETY: the box stays allocated until `lease` drops, after `body` returned; `body`
    // joins every thread it gave a half to, so no borrow outlives the box, and this is the
    // only reference ever made from the pointer before `Lease::drop`.
    let ledger: &'static mut Ledger<N, E> = unsafe { &mut *lease.0 };
    let (ingest, engine) = ledger.split();
    let out = body(ingest, engine);
    drop(lease);
    out
}

/// Failure notices release with the decision (`settle_ms = 0`, vLLM's behaviour).
fn config(capacity: usize) -> Config {
    settling_config(capacity, 0)
}

fn settling_config(capacity: usize, settle_ms: u64) -> Config {
    Config {
        capacity,
        deadline: Duration::from_millis(DEADLINE),
        quarantine: Duration::from_millis(QUARANTINE),
        settle: Duration::from_millis(settle_ms),
        seed: 7,
    }
}

/// Counting mode (vLLM's) or named-edge mode; every model runs in the modes it applies to.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Counting,
    Named,
}

impl Mode {
    fn expect(self, edges: usize) -> Expect<'static> {
        match self {
            Mode::Counting => Expect::Count(edges as u8),
            Mode::Named => Expect::Edges(&AGENTS[..edges]),
        }
    }
    /// What a quarantine reports for `n` outstanding edges, the first `n` agents'.
    fn outstanding(self, agents: &[u16]) -> Outstanding {
        match self {
            Mode::Counting => Outstanding::Count(agents.len() as u8),
            Mode::Named => Outstanding::Edges(agents.iter().map(|&a| 1u64 << a).sum()),
        }
    }
}

/// The producers' RDMA writes into the consumer's blocks.
#[derive(Debug)]
struct Writes([AtomicBool; 2]);

impl Writes {
    fn new() -> Arc<Self> {
        Arc::new(Writes([AtomicBool::new(false), AtomicBool::new(false)]))
    }
    /// Producer `agent`'s write has landed (NIXL then delivers its notification).
    fn land(&self, agent: u16) {
        self.0[agent as usize].store(true, Ordering::Release);
    }
    fn landed(&self, agent: u16) -> bool {
        self.0[agent as usize].load(Ordering::Acquire)
    }
}

/// One notice from the ingest thread, with what it returned.
type NoticeResult = Result<Noticed, IgnoreReason>;

fn notify<const N: usize, const E: usize>(
    ingest: &mut Ingest<'_, N, E>,
    agent: u16,
    bytes: &[u8],
) -> NoticeResult {
    ingest
        .handle_notification(AgentId(agent), bytes)
        .map_err(|e| e.reason)
}

fn show(results: &[NoticeResult]) -> String {
    let words: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(n) => format!("{n:?}"),
            Err(e) => e.as_str().to_string(),
        })
        .collect();
    words.join(",")
}

/// What the engine saw of one request.
#[derive(Clone, Copy, Default, Debug)]
struct Tally {
    completed: u32,
    failed: u32,
    aborted: u32,
    expired: u32,
    released: u32,
    forced: u32,
    /// What `Expired` or a successful abort reported as outstanding.
    quarantined_with: Option<Outstanding>,
    /// The engine's clock when the blocks were released.
    released_at: Option<u64>,
}

/// The engine thread's referee: checks every decision as it arrives and the whole
/// history at the end, and keeps a log of it for the outcome label.
struct Judge {
    writes: Arc<Writes>,
    /// Per request key: its name and the agents whose completion (and so whose write) it
    /// waits for.
    requests: BTreeMap<u64, (&'static str, Vec<u16>)>,
    /// Agents fenced by the current `fence` call: their writes can no longer land.
    fenced: Vec<u16>,
    /// Agents a `gone` resolved edges of, with when that `gone` has settled (rule 8):
    /// their writes may still land until then, so no unforced release comes earlier.
    gone: Vec<(u16, u64)>,
    /// Agents whose `gone` or `fence` resolved an edge, with the cause the core was asked
    /// to write: a record's `gone` or `fenced` edge must be one of these.
    ended: Vec<(u16, EdgeOutcome)>,
    /// Per request key, its named edges as the record of its last decision so far said.
    edges: BTreeMap<u64, Vec<(u16, EdgeOutcome)>>,
    /// Broken on purpose: report a gone agent with `fence` (no settling), which the
    /// judge must catch.
    gone_as_fence: bool,
    tally: BTreeMap<u64, Tally>,
    log: Vec<String>,
    /// The engine's clock (the last `advance`).
    now: u64,
}

impl Judge {
    fn new(writes: &Arc<Writes>) -> Self {
        Judge {
            writes: writes.clone(),
            requests: BTreeMap::new(),
            fenced: Vec::new(),
            gone: Vec::new(),
            ended: Vec::new(),
            edges: BTreeMap::new(),
            gone_as_fence: false,
            tally: BTreeMap::new(),
            log: Vec::new(),
            now: 0,
        }
    }

    /// Registers `id` and remembers which agents will write for it.
    fn register<const N: usize, const E: usize>(
        &mut self,
        engine: &mut Engine<'_, N, E>,
        id: &'static str,
        expect: Expect<'static>,
        deadline_ms: Option<u64>,
        writers: &[u16],
    ) -> Result<Pending, RegisterErrorKind> {
        let ticket = engine
            .register(Registration {
                id,
                blocks: BlockHandle(u64::from(id.as_bytes()[1])),
                expect,
                deadline: deadline_ms.map(Duration::from_millis),
            })
            .map_err(|e| e.kind)?;
        let key = ticket.key().get();
        self.requests.insert(key, (id, writers.to_vec()));
        self.tally.insert(key, Tally::default());
        Ok(ticket)
    }

    fn note(&mut self, key: u64, what: &str) -> &mut Tally {
        let name = self
            .requests
            .get(&key)
            .unwrap_or_else(|| panic!("decision for unregistered key {key}"))
            .0;
        self.log.push(format!("{name}:{what}"));
        self.tally.get_mut(&key).expect("registered")
    }

    /// Every write of request `key` has landed, except those of fenced or gone agents
    /// (`fenced_ok`; a gone agent's release is checked against its settle end instead).
    fn assert_drained(&self, key: u64, what: &str, fenced_ok: bool) {
        for &agent in &self.requests[&key].1 {
            let gone = self.gone.iter().any(|&(a, _)| a == agent);
            if fenced_ok && (self.fenced.contains(&agent) || gone) {
                continue;
            }
            assert!(
                self.writes.landed(agent),
                "{what} request {key} while the write of agent {agent} may still land"
            );
        }
    }

    /// The record handed out with a decision: its edges' causes agree with what happened.
    fn check_record<const E: usize>(&mut self, d: &Decision, record: &Record<E>) {
        let key = d.key().get();
        assert_eq!(record.key, d.key(), "a decision comes with its own record");
        let edges: Vec<(u16, EdgeOutcome)> = record
            .edges
            .named()
            .iter()
            .map(|&(a, o)| (a.0, o))
            .collect();
        for &(agent, outcome) in &edges {
            match outcome {
                EdgeOutcome::Landed => assert!(
                    self.writes.landed(agent),
                    "request {key}'s record says agent {agent} landed before its write did"
                ),
                EdgeOutcome::Gone | EdgeOutcome::Fenced => assert!(
                    self.ended.contains(&(agent, outcome)),
                    "request {key}'s record says agent {agent} {outcome:?}, which no call did: {:?}",
                    self.ended
                ),
                EdgeOutcome::FailureNotice | EdgeOutcome::Outstanding => {}
            }
        }
        match (d, &record.edges) {
            (Decision::Completed(_), RecordedEdges::Named { .. }) => assert!(
                edges.iter().all(|&(_, o)| o == EdgeOutcome::Landed),
                "completed request {key} with {edges:?}"
            ),
            (Decision::Failed(_), RecordedEdges::Named { .. }) => assert!(
                edges.iter().any(|&(_, o)| o.failed()),
                "failed request {key} with {edges:?}"
            ),
            _ => {}
        }
        self.edges.insert(key, edges);
    }

    fn recorded<const E: usize>(&mut self, r: Recorded<E>) {
        self.check_record(&r.decision, &r.record);
        self.decision(r.decision);
    }

    fn decision(&mut self, d: Decision) {
        let key = d.key().get();
        match d {
            Decision::Completed(drained) => {
                self.assert_drained(key, "completed", false);
                self.note(key, "completed").completed += 1;
                let _ = drained.into_decode();
            }
            Decision::Failed(_) => {
                self.assert_drained(key, "failed", true);
                self.note(key, "failed").failed += 1;
            }
            Decision::Expired(q) => {
                assert_eq!(q.cause(), QuarantineCause::Expired);
                let t = self.note(key, "expired");
                t.expired += 1;
                t.quarantined_with = Some(q.outstanding());
            }
            Decision::Released(r) => {
                let now = self.now;
                if !r.forced() {
                    self.assert_drained(key, "released the blocks of", true);
                    for &(agent, settled) in &self.gone {
                        assert!(
                            now >= settled,
                            "released request {key} at {now}, before the gone of agent {agent} settled at {settled}"
                        );
                    }
                }
                let t = self.note(key, if r.forced() { "forced" } else { "released" });
                t.released_at = Some(now);
                t.released += 1;
                t.forced += u32::from(r.forced());
                let _ = r.into_free();
            }
        }
    }

    fn abort<const N: usize, const E: usize>(
        &mut self,
        engine: &mut Engine<'_, N, E>,
        ticket: Pending,
    ) -> Result<(), AbortError> {
        let key = ticket.key().get();
        match engine.abort(ticket) {
            Ok(q) => {
                assert_eq!(q.cause(), QuarantineCause::Aborted);
                let t = self.note(key, "aborted");
                t.aborted += 1;
                t.quarantined_with = Some(q.outstanding());
                Ok(())
            }
            Err(e) => {
                self.note(key, "abort_late");
                Err(e)
            }
        }
    }

    /// Pulls every decision waiting; returns the number of requests they were for (a
    /// request's decisions come out one after the other).
    fn poll<const N: usize, const E: usize>(&mut self, engine: &mut Engine<'_, N, E>) -> usize {
        let mut requests = 0;
        let mut last = None;
        while let Some(r) = engine.poll_recorded() {
            if last != Some(r.decision.key()) {
                requests += 1;
                last = Some(r.decision.key());
            }
            self.recorded(r);
        }
        requests
    }

    /// Pulls exactly the decisions the last `advance` or `fence` queued (not those of
    /// requests the ingest thread drained: `poll` takes those).
    fn queued<const N: usize, const E: usize>(&mut self, engine: &mut Engine<'_, N, E>) {
        while let Some(r) = engine.poll_queued_recorded() {
            self.recorded(r);
        }
    }

    fn advance<const N: usize, const E: usize>(&mut self, engine: &mut Engine<'_, N, E>, now: u64) {
        self.now = now;
        engine
            .advance(Instant::from_millis(now))
            .expect("the models' clocks only go forward");
        self.queued(engine);
    }

    /// Fences `agent`; returns the number of edges it resolved.
    fn fence<const N: usize, const E: usize>(
        &mut self,
        engine: &mut Engine<'_, N, E>,
        agent: u16,
    ) -> u32 {
        self.fenced.push(agent);
        self.ended.push((agent, EdgeOutcome::Fenced));
        self.log.push(format!("fence(p{agent})"));
        let resolved = engine.fence(AgentId(agent));
        self.queued(engine);
        self.log.push(format!("={resolved}"));
        if resolved == 0 {
            // Its notice resolved the edge first: the write counts as landed again.
            self.fenced.retain(|&a| a != agent);
            self.ended.pop();
        }
        resolved
    }

    /// Reports `agent` gone at the judge's clock; returns the number of edges it resolved.
    /// Those settle for `settle_ms` from now, which every later unforced release is
    /// checked against.
    fn gone<const N: usize, const E: usize>(
        &mut self,
        engine: &mut Engine<'_, N, E>,
        agent: u16,
        settle_ms: u64,
    ) -> u32 {
        self.log.push(format!("gone(p{agent})"));
        let cause = if self.gone_as_fence {
            EdgeOutcome::Fenced
        } else {
            EdgeOutcome::Gone
        };
        // Before the call: the decisions it takes are checked inside it.
        self.ended.push((agent, cause));
        let resolved = if self.gone_as_fence {
            engine.fence(AgentId(agent))
        } else {
            engine.gone(AgentId(agent))
        };
        if resolved > 0 {
            self.gone.push((agent, self.now + settle_ms));
        } else {
            self.ended.pop();
        }
        self.queued(engine);
        self.log.push(format!("={resolved}"));
        resolved
    }

    /// The ingest thread was joined.
    fn joined(&mut self) {
        self.log.push("|".into());
    }

    /// Drains everything (poll, clock past every timer, poll) and checks that each
    /// request got exactly one decision and, unless it completed, exactly one release.
    /// Returns the tallies in registration order and the log.
    fn finish<const N: usize, const E: usize>(
        mut self,
        engine: &mut Engine<'_, N, E>,
    ) -> (Vec<Tally>, String) {
        self.poll(engine);
        self.advance(engine, FAR);
        self.poll(engine);
        assert_eq!(engine.len(), 0, "every request decided and its slot freed");
        for (key, t) in &self.tally {
            assert_eq!(
                t.completed + t.failed + t.aborted + t.expired,
                1,
                "request {key} must get exactly one decision: {t:?}"
            );
            let releases = if t.completed == 1 { 0 } else { 1 };
            assert_eq!(t.released, releases, "request {key} releases: {t:?}");
            if t.failed == 1 {
                assert_eq!(
                    t.forced, 0,
                    "a failed request is released when drained: {t:?}"
                );
            }
        }
        let c = engine.counters();
        let decided: u32 = self
            .tally
            .values()
            .map(|t| t.completed + t.failed + t.aborted + t.expired)
            .sum();
        assert_eq!(
            c.completed + c.failed + c.aborted + c.expired,
            u64::from(decided),
            "engine counters agree with the decisions seen"
        );
        (self.tally.into_values().collect(), self.log.join(" "))
    }
}

/// The ingest counters agree with what the notices returned.
fn assert_ingest_counters(c: &IngestCounters, results: &[NoticeResult]) {
    let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
    let decided = results
        .iter()
        .filter(|r| **r == Ok(Noticed::Decided))
        .count() as u64;
    assert_eq!(
        c.completions + c.failure_notices,
        ok,
        "{c:?} vs {results:?}"
    );
    assert_eq!(c.last_edges, decided, "{c:?} vs {results:?}");
    assert_eq!(c.ready_overflow, 0);
}

// ---------------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------------

/// The last edge's completion races `abort` of the same request. The notice always counts
/// (an aborted request still drains); the request is `completed` (abort comes back
/// `Late`) or `aborted` and then released unforced once the write has landed.
fn last_edge_vs_abort(mode: Mode) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(config(2), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let ticket = judge
            .register(&mut engine, "r1", mode.expect(2), None, &[0, 1])
            .expect("room");
        // Edge p1 lands before the race; p0 is the last edge.
        w.land(1);
        assert_eq!(notify(&mut ingest, 1, b"r1:2"), Ok(Noticed::Counted));
        let producer = thread::spawn(move || {
            w.land(0);
            let r = notify(&mut ingest, 0, b"r1:2");
            (r, *ingest.counters())
        });
        let aborted = judge.abort(&mut engine, ticket);
        judge.poll(&mut engine);
        let (notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        assert_eq!(notice, Ok(Noticed::Decided), "the last edge is never lost");
        assert_ingest_counters(&counters, &[Ok(Noticed::Counted), notice]);
        match aborted {
            Ok(()) => {
                assert_eq!((t.aborted, t.forced), (1, 0), "{t:?}");
                // Counting mode must report the one edge owed; named mode may already see
                // p0's edge claimed by the notice in flight.
                if let Mode::Counting = mode {
                    assert_eq!(t.quarantined_with, Some(mode.outstanding(&[0])));
                }
            }
            Err(e) => {
                assert_eq!(e, AbortError::Late);
                assert_eq!(t.completed, 1, "{t:?}");
            }
        }
        log
    })
}

const LAST_EDGE_VS_ABORT: &[&str] = &[
    "r1:abort_late r1:completed |",
    "r1:abort_late | r1:completed",
    "r1:aborted r1:released |",
    "r1:aborted | r1:released",
];

#[test]
fn last_edge_vs_abort_counting() {
    check("last_edge_vs_abort_counting", LAST_EDGE_VS_ABORT, || {
        last_edge_vs_abort(Mode::Counting)
    });
}

#[test]
fn last_edge_vs_abort_named() {
    check("last_edge_vs_abort_named", LAST_EDGE_VS_ABORT, || {
        last_edge_vs_abort(Mode::Named)
    });
}

/// The last edge's completion races the deadline (`advance`). p1 already sent a failure
/// notice, so the request is either `failed` (notice first) or `expired`; either way the
/// last notice counts and the release waits for p0's write and is not forced.
fn last_edge_vs_deadline(mode: Mode) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(config(2), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let _ticket = judge
            .register(&mut engine, "r1", mode.expect(2), Some(10), &[0])
            .expect("room");
        assert_eq!(
            notify(&mut ingest, 1, b"PUSH_FAIL:r1:2"),
            Ok(Noticed::Counted)
        );
        let producer = thread::spawn(move || {
            w.land(0);
            let r = notify(&mut ingest, 0, b"r1:2");
            (r, *ingest.counters())
        });
        judge.advance(&mut engine, 10);
        judge.poll(&mut engine);
        let (notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        assert_eq!(notice, Ok(Noticed::Decided), "the last edge is never lost");
        assert_ingest_counters(&counters, &[Ok(Noticed::Counted), notice]);
        assert_eq!(t.forced, 0, "{t:?}");
        assert_eq!(t.failed + t.expired, 1, "{t:?}");
        if t.expired == 1 && matches!(mode, Mode::Counting) {
            assert_eq!(t.quarantined_with, Some(mode.outstanding(&[0])));
        }
        log
    })
}

const LAST_EDGE_VS_DEADLINE: &[&str] = &[
    "r1:expired r1:released |",
    "r1:expired | r1:released",
    "r1:failed r1:released |",
    "| r1:failed r1:released",
];

#[test]
fn last_edge_vs_deadline_counting() {
    check(
        "last_edge_vs_deadline_counting",
        LAST_EDGE_VS_DEADLINE,
        || last_edge_vs_deadline(Mode::Counting),
    );
}

#[test]
fn last_edge_vs_deadline_named() {
    check("last_edge_vs_deadline_named", LAST_EDGE_VS_DEADLINE, || {
        last_edge_vs_deadline(Mode::Named)
    });
}

/// Which ingest entry point a model drives.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Correct,
    /// `handle_notification_broken_f1` for failure notices.
    BrokenF1,
    /// `handle_notification_broken_aba` for completions.
    BrokenAba,
    /// `fence` where the model reports an agent gone.
    BrokenGoneAsFence,
}

/// A failure notice and the sibling's completion arrive (in either order) while the engine
/// polls: `failed` must wait for the sibling's write.
fn failure_waits_for_sibling(mode: Mode, failure_first: bool, variant: Variant) -> String {
    failure_waits_for_sibling_settling(mode, failure_first, variant, 0)
}

/// As [`failure_waits_for_sibling`], with failure notices settling for `settle_ms`: the
/// notice is stamped with the clock of the last advance (0 here), so `failed` comes when
/// the sibling lands and the release at the first advance past `settle_ms` (the final
/// drain's).
fn failure_waits_for_sibling_settling(
    mode: Mode,
    failure_first: bool,
    variant: Variant,
    settle_ms: u64,
) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(
        settling_config(2, settle_ms),
        move |mut ingest, mut engine| {
            let mut judge = Judge::new(&writes);
            let _ticket = judge
                .register(&mut engine, "r1", mode.expect(2), None, &[0])
                .expect("room");
            let producer = thread::spawn(move || {
                let fail = |ingest: &mut Ingest<'static, 2, 2>| {
                    let bytes = b"PUSH_FAIL:r1:2";
                    if variant == Variant::BrokenF1 {
                        ingest
                            .handle_notification_broken_f1(AgentId(1), bytes)
                            .map_err(|e| e.reason)
                    } else {
                        notify(ingest, 1, bytes)
                    }
                };
                let mut results = Vec::new();
                if failure_first {
                    results.push(fail(&mut ingest));
                }
                w.land(0);
                results.push(notify(&mut ingest, 0, b"r1:2"));
                if !failure_first {
                    results.push(fail(&mut ingest));
                }
                (results, *ingest.counters())
            });
            judge.poll(&mut engine);
            judge.poll(&mut engine);
            let (results, counters) = producer.join().expect("ingest thread");
            judge.joined();
            let (t, log) = judge.finish(&mut engine);
            let t = t[0];
            if variant == Variant::Correct {
                assert_eq!(
                    results,
                    [Ok(Noticed::Counted), Ok(Noticed::Decided)],
                    "both notices count, the second decides"
                );
                assert_ingest_counters(&counters, &results);
            }
            assert_eq!((t.failed, t.released, t.forced), (1, 1, 0), "{t:?}");
            if settle_ms > 0 && variant == Variant::Correct {
                assert_eq!(
                    t.released_at,
                    Some(FAR),
                    "rule 8: settled at the first advance"
                );
            }
            log
        },
    )
}

const FAILURE_WAITS: &[&str] = &["r1:failed r1:released |", "| r1:failed r1:released"];
const FAILURE_WAITS_SETTLING: &[&str] = &["r1:failed | r1:released", "| r1:failed r1:released"];

#[test]
fn failure_notice_then_sibling_completion_settling_counting() {
    check(
        "failure_notice_then_sibling_completion_settling_counting",
        FAILURE_WAITS_SETTLING,
        || failure_waits_for_sibling_settling(Mode::Counting, true, Variant::Correct, SETTLE),
    );
}

#[test]
fn sibling_completion_then_failure_notice_settling_named() {
    check(
        "sibling_completion_then_failure_notice_settling_named",
        FAILURE_WAITS_SETTLING,
        || failure_waits_for_sibling_settling(Mode::Named, false, Variant::Correct, SETTLE),
    );
}

/// Rule 8 across threads: a failure notice that resolves the last edge races the clock
/// advances whose time it is stamped with (the ledger publishes each `advance` to the
/// ingest thread) and, when the request was aborted, the quarantine end. After each
/// `advance(t)` returns, the engine thread also raises a flag the ingest thread reads
/// (`Acquire`) before its notice: a notice that saw `advance(t)` finished must not have
/// its blocks released unforced before `t + SETTLE`, and a forced release comes only at
/// the quarantine end.
///
/// `arrival`: the ingest thread says its notice arrived then (`Ingest::set_arrival`),
/// ahead of the engine's first advance: an unforced release must also wait until the
/// arrival plus `SETTLE`, whichever clock the notice read.
fn failure_notice_vs_settle_advance(aborted: bool, arrival: Option<u64>) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    let advanced = Arc::new(loom::sync::atomic::AtomicU32::new(0));
    let seen = advanced.clone();
    with_halves::<2, 2, _>(settling_config(2, SETTLE), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let ticket = judge
            .register(&mut engine, "r1", Mode::Named.expect(2), None, &[0])
            .expect("room");
        w.land(0);
        assert_eq!(notify(&mut ingest, 0, b"r1:2"), Ok(Noticed::Counted));
        if aborted {
            judge.abort(&mut engine, ticket).expect("counting");
        }
        let producer = thread::spawn(move || {
            let after = seen.load(Ordering::Acquire);
            if let Some(arrival) = arrival {
                ingest.set_arrival(Instant::from_millis(arrival));
            }
            let r = notify(&mut ingest, 1, b"PUSH_FAIL:r1:2");
            (u64::from(after), r, *ingest.counters())
        });
        for now in [10, QUARANTINE] {
            judge.advance(&mut engine, now);
            advanced.store(now as u32, Ordering::Release);
            judge.poll(&mut engine);
        }
        let (after, notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        let released_at = t.released_at.expect("released");
        assert_eq!(t.released, 1, "{t:?}");
        if t.forced == 1 {
            assert!(
                aborted,
                "forced release of a request that was not aborted: {t:?}"
            );
            assert!(
                released_at >= QUARANTINE,
                "forced before the quarantine end: {t:?}"
            );
        } else {
            assert_eq!(
                notice,
                Ok(Noticed::Decided),
                "an unforced release needs the last edge"
            );
            assert!(
                released_at >= after + SETTLE,
                "released at {released_at}, before the notice after {after} settled"
            );
            let arrived = arrival.unwrap_or(0);
            assert!(
                released_at >= arrived + SETTLE,
                "released at {released_at}, before the notice that arrived at {arrived} settled"
            );
        }
        match notice {
            Ok(_) => assert_ingest_counters(&counters, &[Ok(Noticed::Counted), notice]),
            Err(reason) => assert!(
                aborted && t.forced == 1 && reason == IgnoreReason::Late,
                "{reason:?} {t:?}"
            ),
        }
        format!(
            "{log} :: {} after {after} released at {released_at}",
            show(&[notice])
        )
    })
}

#[test]
fn failure_notice_then_sibling_completion_counting() {
    check(
        "failure_notice_then_sibling_completion_counting",
        FAILURE_WAITS,
        || failure_waits_for_sibling(Mode::Counting, true, Variant::Correct),
    );
}

#[test]
fn failure_notice_then_sibling_completion_named() {
    check(
        "failure_notice_then_sibling_completion_named",
        FAILURE_WAITS,
        || failure_waits_for_sibling(Mode::Named, true, Variant::Correct),
    );
}

#[test]
fn sibling_completion_then_failure_notice_named() {
    check(
        "sibling_completion_then_failure_notice_named",
        FAILURE_WAITS,
        || failure_waits_for_sibling(Mode::Named, false, Variant::Correct),
    );
}

/// The checker can fail (catalogue F1): with a failure notice that decides at once, the
/// model catches the engine releasing the blocks while the sibling's write may still land.
#[test]
#[should_panic(expected = "while the write of agent 0 may still land")]
fn broken_f1_failure_cuts_the_count_short_is_caught() {
    check("broken_f1 (must fail)", FAILURE_WAITS, || {
        failure_waits_for_sibling(Mode::Counting, true, Variant::BrokenF1)
    });
}

/// A failure notice from p1 (ingest) races a fence of the sibling p0 (engine): both resolve
/// an edge, exactly one of them resolves the last one, and the request is decided once.
/// With `settle_ms > 0` the release must wait for the failure notice to settle even when
/// the fence decided: the engine sees the notice's stamp through the state word's CAS.
fn failure_notice_vs_fence_of_sibling(settle_ms: u64) -> String {
    let writes = Writes::new();
    with_halves::<2, 2, _>(
        settling_config(2, settle_ms),
        move |mut ingest, mut engine| {
            let mut judge = Judge::new(&writes);
            let _ticket = judge
                .register(&mut engine, "r1", Mode::Named.expect(2), None, &[0])
                .expect("room");
            let producer = thread::spawn(move || {
                let r = notify(&mut ingest, 1, b"PUSH_FAIL:r1:2");
                (r, *ingest.counters())
            });
            let fenced = judge.fence(&mut engine, 0);
            judge.poll(&mut engine);
            let (notice, counters) = producer.join().expect("ingest thread");
            judge.joined();
            let (t, log) = judge.finish(&mut engine);
            let t = t[0];
            assert_eq!(fenced, 1, "the fence always resolves p0's edge");
            assert!(
                notice.is_ok(),
                "the failure notice always counts: {notice:?}"
            );
            assert_ingest_counters(&counters, &[notice]);
            assert_eq!((t.failed, t.released, t.forced), (1, 1, 0), "{t:?}");
            if settle_ms > 0 {
                assert_eq!(
                    t.released_at,
                    Some(FAR),
                    "rule 8: the notice at 0 settles first"
                );
            }
            format!("{log} :: {}", show(&[notice]))
        },
    )
}

#[test]
fn failure_notice_vs_fence_of_sibling_no_settling() {
    check(
        "failure_notice_vs_fence_of_sibling_no_settling",
        &[
            // The fence resolved the last edge and decided.
            "fence(p0) r1:failed r1:released =1 | :: Counted",
            // The notice resolved the last edge; poll or the final drain decided.
            "fence(p0) =1 r1:failed r1:released | :: Decided",
            "fence(p0) =1 | r1:failed r1:released :: Decided",
        ],
        || failure_notice_vs_fence_of_sibling(0),
    );
}

#[test]
fn failure_notice_vs_fence_of_sibling_settling() {
    check(
        "failure_notice_vs_fence_of_sibling_settling",
        &[
            "fence(p0) r1:failed =1 | r1:released :: Counted",
            "fence(p0) =1 r1:failed | r1:released :: Decided",
            "fence(p0) =1 | r1:failed r1:released :: Decided",
        ],
        || failure_notice_vs_fence_of_sibling(SETTLE),
    );
}

/// ABA: r1's notice is in flight while r1 expires, its quarantine runs out (forced
/// release) and r2 is registered into the same slot (capacity 1). The notice counts for r1
/// or is `late`; it never counts for r2, which must still owe its edge at the end.
fn late_notice_vs_slot_recycling(mode: Mode, variant: Variant) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(config(1), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let _r1 = judge
            .register(&mut engine, "r1", mode.expect(1), Some(10), &[0])
            .expect("room");
        let producer = thread::spawn(move || {
            w.land(0);
            let r = if variant == Variant::BrokenAba {
                ingest
                    .handle_notification_broken_aba(AgentId(0), b"r1:1")
                    .map_err(|e| e.reason)
            } else {
                notify(&mut ingest, 0, b"r1:1")
            };
            (r, *ingest.counters())
        });
        judge.advance(&mut engine, 10);
        judge.advance(&mut engine, 10 + QUARANTINE);
        judge.poll(&mut engine);
        // If r1 drained but is not polled yet, the one slot is still taken: poll and retry.
        let _r2 = loop {
            match judge.register(&mut engine, "r2", mode.expect(1), None, &[]) {
                Ok(t) => break t,
                Err(RegisterErrorKind::Full) => {
                    judge.poll(&mut engine);
                    // A spin: let the ingest thread finish pushing r1 on the ready ring.
                    thread::yield_now();
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        };
        judge.poll(&mut engine);
        let (notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (tallies, log) = judge.finish(&mut engine);
        let (r1, r2) = (tallies[0], tallies[1]);
        assert_eq!(
            (r2.expired, r2.forced, r2.quarantined_with),
            (1, 1, Some(mode.outstanding(&[0]))),
            "r1's notice must never count for r2: {r2:?}"
        );
        if variant == Variant::BrokenAba {
            return String::new();
        }
        assert_ingest_counters(&counters, &[notice]);
        match notice {
            Ok(Noticed::Decided) => assert_eq!(r1.forced, 0, "{r1:?}"),
            Err(IgnoreReason::Late) => assert_eq!((r1.expired, r1.forced), (1, 1), "{r1:?}"),
            other => panic!("r1's notice returned {other:?}"),
        }
        format!("{log} :: {}", show(&[notice]))
    })
}

const LATE_NOTICE_VS_RECYCLING: &[&str] = &[
    // The notice drained r1 before its deadline.
    "r1:completed | r2:expired r2:forced :: Decided",
    // After the deadline, before the quarantine ran out.
    "r1:expired r1:released | r2:expired r2:forced :: Decided",
    // After the forced release (found the slot free or recycled): late, and not for r2.
    "r1:expired r1:forced | r2:expired r2:forced :: late",
];

#[test]
fn late_notice_vs_slot_recycling_counting() {
    check(
        "late_notice_vs_slot_recycling_counting",
        LATE_NOTICE_VS_RECYCLING,
        || late_notice_vs_slot_recycling(Mode::Counting, Variant::Correct),
    );
}

#[test]
fn late_notice_vs_slot_recycling_named() {
    check(
        "late_notice_vs_slot_recycling_named",
        LATE_NOTICE_VS_RECYCLING,
        || late_notice_vs_slot_recycling(Mode::Named, Variant::Correct),
    );
}

/// The checker can fail (ABA): a notice that re-reads the slot's generation instead of
/// the one it looked up counts for the next request in the slot, and the model catches it.
#[test]
#[should_panic(expected = "r1's notice must never count for r2")]
fn broken_aba_generation_not_checked_is_caught() {
    check("broken_aba (must fail)", LATE_NOTICE_VS_RECYCLING, || {
        late_notice_vs_slot_recycling(Mode::Counting, Variant::BrokenAba)
    });
}

/// `fence(p0)` races p0's completion. With p1 already landed (`last`) the winner resolves
/// the last edge: `completed` if the notice won, else `failed` + `released` emitted by the
/// fence itself and the notice is `duplicate` or `late`. With p1 still to come, p1's later
/// notice decides. Either way p0's edge is resolved exactly once.
fn fence_vs_completion_same_agent(last: bool) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(config(2), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let _ticket = judge
            .register(&mut engine, "r1", Mode::Named.expect(2), None, &[0, 1])
            .expect("room");
        if last {
            w.land(1);
            assert_eq!(notify(&mut ingest, 1, b"r1:2"), Ok(Noticed::Counted));
        }
        let producer = thread::spawn(move || {
            w.land(0);
            let mut results = vec![notify(&mut ingest, 0, b"r1:2")];
            if !last {
                w.land(1);
                results.push(notify(&mut ingest, 1, b"r1:2"));
            }
            (results, *ingest.counters())
        });
        let fenced = judge.fence(&mut engine, 0);
        judge.poll(&mut engine);
        let (results, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        let p0_counted = results[0].is_ok();
        assert_eq!(
            u32::from(p0_counted) + fenced,
            1,
            "p0's edge is resolved exactly once: notice {:?}, fence {fenced}",
            results[0]
        );
        if last {
            let mut all = vec![Ok(Noticed::Counted)];
            all.extend(&results);
            assert_ingest_counters(&counters, &all);
        } else {
            assert_ingest_counters(&counters, &results);
            assert!(results[1].is_ok(), "p1 always counts: {results:?}");
        }
        if p0_counted {
            assert_eq!(t.completed, 1, "{t:?}");
        } else {
            assert!(
                matches!(
                    results[0],
                    Err(IgnoreReason::Duplicate | IgnoreReason::Late)
                ),
                "{results:?}"
            );
            assert_eq!((t.failed, t.released, t.forced), (1, 1, 0), "{t:?}");
        }
        format!("{log} :: {}", show(&results))
    })
}

#[test]
fn fence_vs_last_completion_same_agent() {
    check(
        "fence_vs_last_completion_same_agent",
        &[
            "fence(p0) =0 r1:completed | :: Decided",
            "fence(p0) =0 | r1:completed :: Decided",
            // The fence resolved the last edge and decided; the notice came after its
            // edge claim (duplicate) or after the slot was freed (late).
            "fence(p0) r1:failed r1:released =1 | :: duplicate",
            "fence(p0) r1:failed r1:released =1 | :: late",
        ],
        || fence_vs_completion_same_agent(true),
    );
}

#[test]
fn fence_vs_completion_same_agent_sibling_later() {
    check(
        "fence_vs_completion_same_agent_sibling_later",
        &[
            "fence(p0) =0 r1:completed | :: Counted,Decided",
            "fence(p0) =0 | r1:completed :: Counted,Decided",
            "fence(p0) =1 r1:failed r1:released | :: duplicate,Decided",
            "fence(p0) =1 | r1:failed r1:released :: duplicate,Decided",
            // p1 counted between the fence's edge claim and its state-word update, so
            // the fence resolved the last edge.
            "fence(p0) r1:failed r1:released =1 | :: duplicate,Counted",
        ],
        || fence_vs_completion_same_agent(false),
    );
}

/// `register(r1)` races r1's notice, in a slot that r0 used and freed just before (so a
/// stale identity is there to be torn). The notice is `unknown` (it came first: r1 then
/// owes its edge and expires) or counts for the fully published r1 (`completed`); never
/// `duplicate`, `unexpected_sender` or `late`, and never a count for a half-written slot.
fn register_vs_early_notice(mode: Mode) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(config(1), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let r0_expect = match mode {
            Mode::Counting => Expect::Count(1),
            Mode::Named => Expect::Edges(&AGENTS[1..]),
        };
        let _r0 = judge
            .register(&mut engine, "r0", r0_expect, None, &[1])
            .expect("room");
        w.land(1);
        assert_eq!(notify(&mut ingest, 1, b"r0:1"), Ok(Noticed::Decided));
        assert_eq!(judge.poll(&mut engine), 1);
        let producer = thread::spawn(move || {
            w.land(0);
            let r = notify(&mut ingest, 0, b"r1:1");
            (r, *ingest.counters())
        });
        let _r1 = judge
            .register(&mut engine, "r1", mode.expect(1), None, &[0])
            .expect("r0's slot is free again");
        judge.poll(&mut engine);
        let (notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (tallies, log) = judge.finish(&mut engine);
        let r1 = tallies[1];
        assert_ingest_counters(&counters, &[Ok(Noticed::Decided), notice]);
        match notice {
            Ok(Noticed::Decided) => assert_eq!(r1.completed, 1, "{r1:?}"),
            Err(IgnoreReason::Unknown) => assert_eq!(
                (r1.expired, r1.forced, r1.quarantined_with),
                (1, 1, Some(mode.outstanding(&[0]))),
                "an early notice must not count: {r1:?}"
            ),
            other => panic!("r1's notice returned {other:?}"),
        }
        format!("{log} :: {}", show(&[notice]))
    })
}

const REGISTER_VS_EARLY_NOTICE: &[&str] = &[
    "r0:completed r1:completed | :: Decided",
    "r0:completed | r1:completed :: Decided",
    // The notice came first: unknown, and r1 still owes its edge.
    "r0:completed | r1:expired r1:forced :: unknown",
];

#[test]
fn register_vs_early_notice_counting() {
    check(
        "register_vs_early_notice_counting",
        REGISTER_VS_EARLY_NOTICE,
        || register_vs_early_notice(Mode::Counting),
    );
}

#[test]
fn register_vs_early_notice_named() {
    check(
        "register_vs_early_notice_named",
        REGISTER_VS_EARLY_NOTICE,
        || register_vs_early_notice(Mode::Named),
    );
}

/// Two notices and a duplicate for a counting-mode request (`expect=2`) from the one
/// ingest thread, while the engine aborts it and runs its quarantine out. Accepted
/// notices are a prefix of the three, at most two count, the second to count decides, and
/// a request that got both is released unforced; fewer, forced.
#[test]
fn two_notices_and_a_duplicate_vs_abort_and_quarantine_end() {
    check(
        "two_notices_and_a_duplicate_vs_abort_and_quarantine_end",
        &[
            "r1:abort_late r1:completed | :: Counted,Decided,late",
            "r1:abort_late | r1:completed :: Counted,Decided,late",
            "r1:aborted r1:released | :: Counted,Decided,late",
            "r1:aborted | r1:released :: Counted,Decided,late",
            // The quarantine ran out first: forced, and what came after is late.
            "r1:aborted r1:forced | :: Counted,late,late",
            "r1:aborted r1:forced | :: late,late,late",
        ],
        || {
            let writes = Writes::new();
            let w = writes.clone();
            with_halves::<2, 2, _>(config(2), move |mut ingest, mut engine| {
                let mut judge = Judge::new(&writes);
                let ticket = judge
                    .register(&mut engine, "r1", Mode::Counting.expect(2), None, &[0, 1])
                    .expect("room");
                let producer = thread::spawn(move || {
                    w.land(0);
                    let a = notify(&mut ingest, 0, b"r1:2");
                    w.land(1);
                    let b = notify(&mut ingest, 1, b"r1:2");
                    let c = notify(&mut ingest, 1, b"r1:2");
                    (vec![a, b, c], *ingest.counters())
                });
                let aborted = judge.abort(&mut engine, ticket);
                judge.advance(&mut engine, QUARANTINE);
                judge.poll(&mut engine);
                let (results, counters) = producer.join().expect("ingest thread");
                judge.joined();
                let (t, log) = judge.finish(&mut engine);
                let t = t[0];
                assert_ingest_counters(&counters, &results);
                let counted = results.iter().take_while(|r| r.is_ok()).count();
                assert!(
                    results[counted..]
                        .iter()
                        .all(|r| *r == Err(IgnoreReason::Late)),
                    "accepted notices form a prefix, the rest are late: {results:?}"
                );
                assert!(counted <= 2, "no double count: {results:?}");
                if counted == 2 {
                    assert_eq!(results[1], Ok(Noticed::Decided));
                }
                match aborted {
                    Ok(()) => {
                        assert_eq!(t.aborted, 1);
                        assert_eq!(t.forced, u32::from(counted < 2), "{t:?} {results:?}");
                    }
                    Err(e) => {
                        assert_eq!(e, AbortError::Late);
                        assert_eq!((t.completed, counted), (1, 2), "{t:?} {results:?}");
                    }
                }
                format!("{log} :: {}", show(&results))
            })
        },
    );
}

// ---------------------------------------------------------------------------------------
// The checker itself: the two fixes of `vendor/loom` are in effect.
// ---------------------------------------------------------------------------------------

/// tokio-rs/loom#392: a plain load by one thread racing a load-then-store by another must
/// see both values (stock loom 0.7.3 runs one execution and only ever sees 0).
#[test]
fn loom_explores_a_load_racing_a_load_then_store() {
    check(
        "loom_explores_a_load_racing_a_load_then_store",
        &["0", "1"],
        || {
            let x = Arc::new(AtomicBool::new(false));
            let y = x.clone();
            let other = thread::spawn(move || {
                let _ = y.load(Ordering::Relaxed);
                y.store(true, Ordering::Relaxed);
            });
            let seen = x.load(Ordering::Relaxed);
            other.join().expect("thread");
            u8::from(seen).to_string()
        },
    );
}

/// tokio-rs/loom#282: a compare-exchange that read the value a thread stored earlier comes
/// before that thread's next store in modification order, so the thread reads its own
/// latest store back (stock loom 0.7.3 may hand it the compare-exchange's value).
#[test]
fn loom_keeps_rmw_atomicity_in_modification_order() {
    check(
        "loom_keeps_rmw_atomicity_in_modification_order",
        &["cas failed, read 3", "cas ok, read 3"],
        || {
            let x = Arc::new(loom::sync::atomic::AtomicU32::new(0));
            x.store(1, Ordering::Relaxed);
            let y = x.clone();
            let other = thread::spawn(move || {
                y.compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
            x.store(3, Ordering::Relaxed);
            let read = x.load(Ordering::Relaxed);
            let cas = if other.join().expect("thread") {
                "ok"
            } else {
                "failed"
            };
            format!("cas {cas}, read {read}")
        },
    );
}

#[test]
fn failure_notice_vs_settle_advance_counting_phase() {
    check(
        "failure_notice_vs_settle_advance_counting_phase",
        FAILURE_NOTICE_VS_SETTLE_ADVANCE,
        || failure_notice_vs_settle_advance(false, None),
    );
}

/// As above, the notice dated at its arrival (`ARRIVAL`, between the two advances).
#[test]
fn failure_notice_with_arrival_vs_settle_advance() {
    check(
        "failure_notice_with_arrival_vs_settle_advance",
        FAILURE_NOTICE_WITH_ARRIVAL_VS_SETTLE_ADVANCE,
        || failure_notice_vs_settle_advance(false, Some(ARRIVAL)),
    );
}

#[test]
fn failure_notice_vs_settle_advance_and_quarantine_end() {
    check(
        "failure_notice_vs_settle_advance_and_quarantine_end",
        FAILURE_NOTICE_VS_SETTLE_ADVANCE_ABORTED,
        || failure_notice_vs_settle_advance(true, None),
    );
}

/// `after T`: the ingest thread saw `advance(T)` finished before its notice; the notice
/// may still read a later clock (published before the flag), never an earlier one.
const FAILURE_NOTICE_VS_SETTLE_ADVANCE: &[&str] = &[
    // Decided at the poll after `advance(10)` (stamp 0 or 10: settles by 30) or after
    // `advance(50)` (stamp 0 or 10): released at 50.
    "r1:failed r1:released | :: Decided after 0 released at 50",
    "r1:failed r1:released | :: Decided after 10 released at 50",
    // Stamped 50 (settles at 70): released at the final drain's advance.
    "r1:failed | r1:released :: Decided after 0 released at 1000",
    "r1:failed | r1:released :: Decided after 10 released at 1000",
    "r1:failed | r1:released :: Decided after 50 released at 1000",
    // Decided by the final drain's poll (at 50).
    "| r1:failed r1:released :: Decided after 0 released at 1000",
    "| r1:failed r1:released :: Decided after 0 released at 50",
    "| r1:failed r1:released :: Decided after 10 released at 1000",
    "| r1:failed r1:released :: Decided after 10 released at 50",
    "| r1:failed r1:released :: Decided after 50 released at 1000",
];

/// When the failure notice of the arrival model arrived: after the engine's first advance
/// (10), before its second (50), with `ARRIVAL + SETTLE` past the second.
const ARRIVAL: u64 = 40;

/// Dated 40 (or 50, if it read the clock after `advance(50)`): settles by 60 or 70, so it
/// is never released at 50 (the model without an arrival is, when the notice read 0 or
/// 10), only at the final drain's advance.
const FAILURE_NOTICE_WITH_ARRIVAL_VS_SETTLE_ADVANCE: &[&str] = &[
    "r1:failed | r1:released :: Decided after 0 released at 1000",
    "r1:failed | r1:released :: Decided after 10 released at 1000",
    "r1:failed | r1:released :: Decided after 50 released at 1000",
    "| r1:failed r1:released :: Decided after 0 released at 1000",
    "| r1:failed r1:released :: Decided after 10 released at 1000",
    "| r1:failed r1:released :: Decided after 50 released at 1000",
];

/// Aborted at 0: the quarantine ends at 50.
const FAILURE_NOTICE_VS_SETTLE_ADVANCE_ABORTED: &[&str] = &[
    // The notice read the clock 50 and drained the request just before the quarantine
    // end fired: it would settle at 70, the quarantine end is not delayed: forced.
    "r1:aborted r1:forced | :: Decided after 0 released at 50",
    "r1:aborted r1:forced | :: Decided after 10 released at 50",
    "r1:aborted | r1:forced :: Decided after 0 released at 50",
    "r1:aborted | r1:forced :: Decided after 10 released at 50",
    // The quarantine end freed the slot first: the notice is late.
    "r1:aborted r1:forced | :: late after 0 released at 50",
    "r1:aborted r1:forced | :: late after 10 released at 50",
    "r1:aborted r1:forced | :: late after 50 released at 50",
    // Stamped 0 or 10: settled by 30, released unforced at 50.
    "r1:aborted r1:released | :: Decided after 0 released at 50",
    "r1:aborted r1:released | :: Decided after 10 released at 50",
    "r1:aborted | r1:released :: Decided after 0 released at 50",
    "r1:aborted | r1:released :: Decided after 10 released at 50",
];

/// The time of the `gone` in the gone models: the clock is advanced there first, so a
/// release measured from 0 instead of from the `gone` would be caught.
const GONE_AT: u64 = 10;

/// `gone(p1)` (engine) races the sibling p0's notice (ingest): a completion whose write
/// lands first, or a failure notice. Both resolve an edge, exactly one of them the last;
/// the request fails once and its blocks are released unforced no earlier than the
/// `gone` plus `settle_ms` (the judge checks it) nor, for a failure notice, than the
/// clock the ingest thread saw before its notice plus `settle_ms`.
fn gone_vs_sibling_notice(sibling_fails: bool, variant: Variant) -> String {
    let writes = Writes::new();
    let w = writes.clone();
    let advanced = Arc::new(loom::sync::atomic::AtomicU32::new(0));
    let seen = advanced.clone();
    with_halves::<2, 2, _>(settling_config(2, SETTLE), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        judge.gone_as_fence = variant == Variant::BrokenGoneAsFence;
        let writers: &[u16] = if sibling_fails { &[] } else { &[0] };
        let _ticket = judge
            .register(&mut engine, "r1", Mode::Named.expect(2), None, writers)
            .expect("room");
        judge.advance(&mut engine, GONE_AT);
        advanced.store(GONE_AT as u32, Ordering::Release);
        let producer = thread::spawn(move || {
            let after = seen.load(Ordering::Acquire);
            let r = if sibling_fails {
                notify(&mut ingest, 0, b"PUSH_FAIL:r1:2")
            } else {
                w.land(0);
                notify(&mut ingest, 0, b"r1:2")
            };
            (u64::from(after), r, *ingest.counters())
        });
        let gone = judge.gone(&mut engine, 1, SETTLE);
        judge.poll(&mut engine);
        judge.advance(&mut engine, GONE_AT + SETTLE);
        advanced.store((GONE_AT + SETTLE) as u32, Ordering::Release);
        judge.poll(&mut engine);
        let (after, notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        assert_eq!(gone, 1, "the gone always resolves p1's edge");
        assert!(
            notice.is_ok(),
            "the sibling's notice always counts: {notice:?}"
        );
        assert_ingest_counters(&counters, &[notice]);
        assert_eq!((t.failed, t.released, t.forced), (1, 1, 0), "{t:?}");
        let released_at = t.released_at.expect("released");
        if sibling_fails {
            assert!(
                released_at >= after + SETTLE,
                "released at {released_at}, before the notice after {after} settled"
            );
        }
        format!(
            "{log} :: {} after {after} released at {released_at}",
            show(&[notice])
        )
    })
}

/// `gone(p0)` (engine) races p0's own failure notice for the same edge (ingest), p1
/// having landed: exactly one of them resolves the edge, the last one, and the record of
/// every decision names that one as its cause (`gone` when the `gone` returns 1,
/// `failure_notice` when the notice counted), with the request's time for it. The
/// request fails once and settles from whichever resolved it.
fn gone_vs_failure_notice_same_agent() -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(settling_config(2, SETTLE), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let ticket = judge
            .register(&mut engine, "r1", Mode::Named.expect(2), None, &[1])
            .expect("room");
        let key = ticket.key();
        w.land(1);
        assert_eq!(notify(&mut ingest, 1, b"r1:2"), Ok(Noticed::Counted));
        judge.advance(&mut engine, GONE_AT);
        let producer = thread::spawn(move || {
            let r = notify(&mut ingest, 0, b"PUSH_FAIL:r1:2");
            (r, *ingest.counters())
        });
        let gone = judge.gone(&mut engine, 0, SETTLE);
        judge.poll(&mut engine);
        let (notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        assert_eq!(
            u32::from(notice.is_ok()) + gone,
            1,
            "p0's edge is resolved exactly once: notice {notice:?}, gone {gone}"
        );
        assert_ingest_counters(&counters, &[Ok(Noticed::Counted), notice]);
        assert_eq!((t.failed, t.released, t.forced), (1, 1, 0), "{t:?}");
        let record = engine.record(key).expect("its slot was not reused");
        let cause = if gone == 1 {
            EdgeOutcome::Gone
        } else {
            EdgeOutcome::FailureNotice
        };
        assert_eq!(
            record.edges.named(),
            &[(AgentId(0), cause), (AgentId(1), EdgeOutcome::Landed)]
        );
        let at = Some(Instant::from_millis(GONE_AT));
        if gone == 1 {
            assert_eq!((record.gone_at, record.failure_notice_at), (at, None));
        } else {
            assert_eq!((record.gone_at, record.failure_notice_at), (None, at));
        }
        assert_eq!(
            record.settle_end,
            Some(Instant::from_millis(GONE_AT + SETTLE))
        );
        format!("{log} :: {} p0 {}", show(&[notice]), cause.as_str())
    })
}

#[test]
fn gone_vs_failure_notice_same_agent_names_the_winner() {
    check(
        "gone_vs_failure_notice_same_agent",
        GONE_VS_FAILURE_NOTICE_SAME_AGENT,
        gone_vs_failure_notice_same_agent,
    );
}

const GONE_VS_FAILURE_NOTICE_SAME_AGENT: &[&str] = &[
    // The notice claimed the edge first: the gone resolves nothing, and the pull decides.
    "gone(p0) =0 r1:failed | r1:released :: Decided p0 failure_notice",
    "gone(p0) =0 | r1:failed r1:released :: Decided p0 failure_notice",
    // The gone claimed it and decided; the notice came after its edge claim (duplicate)
    // or after the request was decided (late).
    "gone(p0) r1:failed =1 | r1:released :: duplicate p0 gone",
    "gone(p0) r1:failed =1 | r1:released :: late p0 gone",
];

#[test]
fn gone_vs_sibling_completion() {
    check(
        "gone_vs_sibling_completion",
        GONE_VS_SIBLING_COMPLETION,
        || gone_vs_sibling_notice(false, Variant::Correct),
    );
}

/// The checker can fail (rule 9): a driver that fences a peer it only saw gone gets the
/// blocks back at once, while the bytes the peer had handed to its transport may still
/// land, and the model catches it.
#[test]
#[should_panic(expected = "before the gone of agent 1 settled")]
fn broken_gone_reported_as_fence_is_caught() {
    check(
        "broken_gone_as_fence (must fail)",
        GONE_VS_SIBLING_COMPLETION,
        || gone_vs_sibling_notice(false, Variant::BrokenGoneAsFence),
    );
}

#[test]
fn gone_vs_sibling_failure_notice() {
    check(
        "gone_vs_sibling_failure_notice",
        GONE_VS_SIBLING_FAILURE_NOTICE,
        || gone_vs_sibling_notice(true, Variant::Correct),
    );
}

/// p0's completion (ingest) resolves the last edge while the engine advances past the
/// deadline; p1 was reported gone before. Either the notice wins (`failed`) or the
/// deadline (`expired`, and the notice still resolves the last edge); either way the
/// blocks are released unforced, no earlier than the `gone` plus `settle_ms`: the
/// quarantine (from the deadline, 20 + 50) ends later.
fn gone_then_last_edge_vs_deadline() -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(settling_config(2, SETTLE), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let deadline = GONE_AT + 10;
        let _ticket = judge
            .register(
                &mut engine,
                "r1",
                Mode::Named.expect(2),
                Some(deadline),
                &[0],
            )
            .expect("room");
        judge.advance(&mut engine, GONE_AT);
        assert_eq!(judge.gone(&mut engine, 1, SETTLE), 1);
        let producer = thread::spawn(move || {
            w.land(0);
            let r = notify(&mut ingest, 0, b"r1:2");
            (r, *ingest.counters())
        });
        judge.advance(&mut engine, deadline);
        judge.poll(&mut engine);
        judge.advance(&mut engine, GONE_AT + SETTLE);
        judge.poll(&mut engine);
        let (notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        assert_eq!(notice, Ok(Noticed::Decided), "the last edge is never lost");
        assert_ingest_counters(&counters, &[notice]);
        assert_eq!(
            (t.failed + t.expired, t.released, t.forced),
            (1, 1, 0),
            "{t:?}"
        );
        if t.expired == 1 {
            // p1's edge was resolved by the gone: only p0's can be owed (or none seen
            // owed: the notice in flight already claimed p0's edge word).
            assert!(
                matches!(t.quarantined_with, Some(Outstanding::Edges(0b01 | 0))),
                "{t:?}"
            );
        }
        format!(
            "{log} :: {} released at {}",
            show(&[notice]),
            t.released_at.expect("released")
        )
    })
}

#[test]
fn gone_then_last_edge_vs_deadline_advance() {
    check(
        "gone_then_last_edge_vs_deadline_advance",
        GONE_THEN_LAST_EDGE_VS_DEADLINE,
        gone_then_last_edge_vs_deadline,
    );
}

/// p0's completion (ingest) resolves the last edge while the engine aborts the request;
/// p1 was reported gone before. Either the abort wins (`aborted`; the notice still
/// resolves the last edge) or the notice (the abort is `Late`, the request `failed`);
/// either way the blocks are released unforced, no earlier than the `gone` plus
/// `settle_ms` (the quarantine, 10 + 50, ends later).
fn gone_then_last_edge_vs_abort() -> String {
    let writes = Writes::new();
    let w = writes.clone();
    with_halves::<2, 2, _>(settling_config(2, SETTLE), move |mut ingest, mut engine| {
        let mut judge = Judge::new(&writes);
        let ticket = judge
            .register(&mut engine, "r1", Mode::Named.expect(2), None, &[0])
            .expect("room");
        judge.advance(&mut engine, GONE_AT);
        assert_eq!(judge.gone(&mut engine, 1, SETTLE), 1);
        let producer = thread::spawn(move || {
            w.land(0);
            let r = notify(&mut ingest, 0, b"r1:2");
            (r, *ingest.counters())
        });
        let aborted = judge.abort(&mut engine, ticket);
        judge.poll(&mut engine);
        judge.advance(&mut engine, GONE_AT + SETTLE);
        judge.poll(&mut engine);
        let (notice, counters) = producer.join().expect("ingest thread");
        judge.joined();
        let (t, log) = judge.finish(&mut engine);
        let t = t[0];
        assert_eq!(notice, Ok(Noticed::Decided), "the last edge is never lost");
        assert_ingest_counters(&counters, &[notice]);
        match aborted {
            Ok(()) => assert_eq!((t.aborted, t.forced), (1, 0), "{t:?}"),
            Err(e) => {
                assert_eq!(e, AbortError::Late);
                assert_eq!((t.failed, t.forced), (1, 0), "{t:?}");
            }
        }
        format!(
            "{log} :: {} released at {}",
            show(&[notice]),
            t.released_at.expect("released")
        )
    })
}

#[test]
fn gone_then_last_edge_vs_abort_model() {
    check(
        "gone_then_last_edge_vs_abort",
        GONE_THEN_LAST_EDGE_VS_ABORT,
        gone_then_last_edge_vs_abort,
    );
}

/// `after T`: the ingest thread saw `advance(T)` finished before its notice.
const GONE_VS_SIBLING_COMPLETION: &[&str] = &[
    // The notice resolved the last edge; the poll after the gone decided (settling until
    // 10 + 20), or the poll after `advance(30)` or the final drain's (settled: at once).
    "gone(p1) =1 r1:failed r1:released | :: Decided after 10 released at 30",
    "gone(p1) =1 r1:failed r1:released | :: Decided after 30 released at 30",
    "gone(p1) =1 | r1:failed r1:released :: Decided after 10 released at 30",
    "gone(p1) =1 | r1:failed r1:released :: Decided after 30 released at 30",
    // The notice counted between the gone's edge claim and its state-word update: the
    // gone resolved the last edge and decided.
    "gone(p1) r1:failed =1 r1:released | :: Counted after 10 released at 30",
];

/// As above; a failure notice stamped 30 (it read the clock after `advance(30)`)
/// settles until 50, so its release waits for the final drain's advance.
const GONE_VS_SIBLING_FAILURE_NOTICE: &[&str] = &[
    "gone(p1) =1 r1:failed r1:released | :: Decided after 10 released at 30",
    "gone(p1) =1 r1:failed | r1:released :: Decided after 10 released at 1000",
    "gone(p1) =1 r1:failed | r1:released :: Decided after 30 released at 1000",
    "gone(p1) =1 | r1:failed r1:released :: Decided after 10 released at 1000",
    "gone(p1) =1 | r1:failed r1:released :: Decided after 10 released at 30",
    "gone(p1) =1 | r1:failed r1:released :: Decided after 30 released at 1000",
    "gone(p1) r1:failed =1 r1:released | :: Counted after 10 released at 30",
];

/// The deadline (20) or the notice first; released at 10 + 20 either way, before the
/// quarantine end (20 + 50), never forced.
const GONE_THEN_LAST_EDGE_VS_DEADLINE: &[&str] = &[
    "gone(p1) =1 r1:expired r1:released | :: Decided released at 30",
    "gone(p1) =1 r1:expired | r1:released :: Decided released at 30",
    "gone(p1) =1 r1:failed r1:released | :: Decided released at 30",
    "gone(p1) =1 | r1:failed r1:released :: Decided released at 30",
];

/// Whoever wins, the blocks come back at 10 + 20, never before, never forced.
const GONE_THEN_LAST_EDGE_VS_ABORT: &[&str] = &[
    "gone(p1) =1 r1:abort_late r1:failed r1:released | :: Decided released at 30",
    "gone(p1) =1 r1:abort_late | r1:failed r1:released :: Decided released at 30",
    "gone(p1) =1 r1:aborted r1:released | :: Decided released at 30",
    "gone(p1) =1 r1:aborted | r1:released :: Decided released at 30",
];
