//! Two real threads on one ledger: an ingest thread feeds notices — completions,
//! `PUSH_FAIL`s, duplicates, unexpected senders, unknown ids and garbage, in counting and
//! named-edge mode — while the engine thread registers, aborts, fences, advances the clock
//! and polls, all at once.
//!
//! Requests come in two classes:
//!
//! * **settled** (`d…`, agents 0..8): the engine touches one only after the ingest thread
//!   reports it sent every notice it will ever get (then it polls and, if the request is
//!   still undecided, aborts it by id); no fence names its agents and its deadline never
//!   comes. Its history is therefore one sequence of events, and a **single-threaded
//!   replay** of that sequence on a fresh ledger must give the same result for every
//!   notice and the same decisions. The concurrency is all around it: registrations,
//!   decisions, aborts, fences and slot recycling of other requests while its notices are
//!   looked up and counted.
//! * **racing** (`r…`, agents 8..16, deadlines of a few ms): aborted, fenced and expired by
//!   the engine while its notices are in flight. No single order of events is defined, so
//!   the run checks the rules instead: no `Completed`, `Failed` or unforced `Released`
//!   before every edge's producer spoke or was fenced (checked on happens-before, when the
//!   decision arrives), exactly one decision and at most one release per request, no edge
//!   counted twice, counters that add up.
//!
//! Scale: `KVDRAIN_STRESS_REQUESTS` (default 600 000 in release builds, about 1.7 million
//! notices, ~3 s; 100 000, about 280 000 notices, with debug assertions) and
//! `KVDRAIN_STRESS_SEED`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::mpsc;

use kvdrain::{
    AbortError, AgentId, BlockHandle, Config, Decision, Duration, Engine, Expect, IgnoreReason,
    Ingest, IngestCounters, Instant, Ledger, Noticed, Outstanding, Pending, Quarantined,
    Registration, RequestKey,
};

/// Slots of the ledger under test. The engine keeps at most `LIVE` requests at once so
/// that no registration is refused as full (which would depend on the interleaving).
const N: usize = 1024;
const LIVE: usize = 64;
/// Named edges per request at most (and edge positions tracked per request).
const E: usize = 8;
/// Requests the ingest thread works on at once (their notices interleave).
const POOL: usize = 16;
const QUARANTINE: Duration = Duration::from_millis(40);
/// The ledger's clock runs at 1 ms per this many notices handled, so that deadlines and
/// quarantines fall while notices are in flight whatever the speed of the build.
const NOTICES_PER_MS: u64 = 8;
/// Deadline of settled requests: never reached.
const NEVER: Duration = Duration::from_millis(1 << 40);
const FAR: Instant = Instant::from_millis(1 << 42);
/// Edge position that records "a counting-mode duplicate was sent".
const DUP: usize = E - 1;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Settled,
    Racing,
}

/// A registered request, as both threads know it.
#[derive(Clone, Debug)]
struct Spec {
    seq: usize,
    class: Class,
    id: String,
    /// `Some(n)`: counting mode, `n` notices; `None`: named, one per agent of `agents`.
    count: Option<u8>,
    agents: Vec<AgentId>,
}

impl Spec {
    fn expect(&self) -> Expect<'_> {
        match self.count {
            Some(n) => Expect::Count(n),
            None => Expect::Edges(&self.agents),
        }
    }
    fn edges(&self) -> usize {
        self.count.map_or(self.agents.len(), usize::from)
    }
}

/// What a notice says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Says {
    Completion,
    Failure,
    /// An id nobody registered: completion, failure notice.
    Ghost(u64),
    GhostFailure(u64),
    /// A producer-bound heartbeat.
    Heartbeat(u64),
    Garbage,
}

/// One notice the ingest thread sends (kept small: the log holds millions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Notice {
    agent: u16,
    says: Says,
    /// The producer's TP size in the message.
    tp: u8,
    /// The request it names (`None`: an unknown id or garbage).
    seq: Option<usize>,
    /// The edge position it speaks for, and 1 (completion: its write landed) or 2 (failure
    /// notice), or (`DUP`, 3) for a counting-mode duplicate; `None` for other duplicates,
    /// strangers and noise.
    speaks: Option<(usize, u8)>,
}

impl Notice {
    /// The message bytes; `id` is the request's id for `Completion` and `Failure`.
    fn bytes(&self, id: &str) -> Vec<u8> {
        let tp = self.tp;
        match self.says {
            Says::Completion => format!("{id}:{tp}").into_bytes(),
            Says::Failure => format!("PUSH_FAIL:{id}:{tp}").into_bytes(),
            Says::Ghost(k) => format!("ghost-{k}:{tp}").into_bytes(),
            Says::GhostFailure(k) => format!("PUSH_FAIL:ghost-{k}:{tp}").into_bytes(),
            Says::Heartbeat(k) => format!("HB:ghost-{k}").into_bytes(),
            Says::Garbage => vec![b'x', b':', 0xFF, b':', b'7'],
        }
    }
}

type NoticeResult = Result<Noticed, IgnoreReason>;

/// What each edge position's producer said: 0 nothing yet, 1 completion (its write
/// landed), 2 failure notice, 3 (position `DUP`) a counting-mode duplicate. Stored by the
/// ingest thread before it hands the notice to the ledger (`Release`), loaded by the
/// engine thread when a decision arrives (`Acquire`): the ledger's own synchronization is
/// what makes the stores visible.
struct Spoken(Vec<[AtomicU8; E]>);

impl Spoken {
    fn new(requests: usize) -> Self {
        Spoken((0..requests).map(|_| Default::default()).collect())
    }
    fn mark(&self, seq: usize, pos: usize, what: u8) {
        self.0[seq][pos].store(what, Ordering::Release);
    }
    fn get(&self, seq: usize, pos: usize) -> u8 {
        self.0[seq][pos].load(Ordering::Acquire)
    }
}

fn says(fail: bool) -> Says {
    if fail {
        Says::Failure
    } else {
        Says::Completion
    }
}

/// The notices of one request, in the order the ingest thread will send them.
fn plan(spec: &Spec, rng: &mut Rng) -> Vec<Notice> {
    let mut out = Vec::new();
    let tp = 1 + rng.below(8) as u8;
    let base = if spec.class == Class::Settled { 0 } else { 8 };
    let seq = Some(spec.seq);
    match spec.count {
        Some(n) => {
            // 10 %: one producer never reports.
            let sent = if rng.chance(10) { n - 1 } else { n };
            for pos in 0..usize::from(sent) {
                let fail = rng.chance(15);
                out.push(Notice {
                    agent: base + rng.below(8) as u16,
                    says: says(fail),
                    tp,
                    seq,
                    speaks: Some((pos, if fail { 2 } else { 1 })),
                });
            }
            // 10 %: a duplicate on top, anywhere (counting mode cannot tell it apart).
            if rng.chance(10) {
                let at = rng.below(out.len() as u64 + 1) as usize;
                let dup = Notice {
                    agent: base + rng.below(8) as u16,
                    says: Says::Completion,
                    tp,
                    seq,
                    speaks: Some((DUP, 3)),
                };
                out.insert(at, dup);
            }
        }
        None => {
            let mut order: Vec<usize> = (0..spec.agents.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for &pos in &order {
                if rng.chance(7) {
                    continue; // this producer never reports
                }
                let fail = rng.chance(15);
                out.push(Notice {
                    agent: spec.agents[pos].0,
                    says: says(fail),
                    tp,
                    seq,
                    speaks: Some((pos, if fail { 2 } else { 1 })),
                });
                if rng.chance(5) {
                    // The same agent again (a NIXL error after a delivered notice).
                    out.push(Notice {
                        agent: spec.agents[pos].0,
                        says: says(!fail),
                        tp,
                        seq,
                        speaks: None,
                    });
                }
            }
            if rng.chance(5) {
                // An agent that is not one of the request's edges.
                let stranger = (base..base + 8).find(|&a| !spec.agents.contains(&AgentId(a)));
                if let Some(agent) = stranger {
                    let at = rng.below(out.len() as u64 + 1) as usize;
                    let notice = Notice {
                        agent,
                        says: Says::Completion,
                        tp,
                        seq,
                        speaks: None,
                    };
                    out.insert(at, notice);
                }
            }
        }
    }
    out
}

/// Noise between notices: unknown ids, producer-bound messages, garbage.
fn noise(rng: &mut Rng, k: u64) -> (Notice, IgnoreReason) {
    let says = match rng.below(4) {
        0 => Says::Ghost(k),
        1 => Says::GhostFailure(k),
        2 => Says::Heartbeat(k),
        _ => Says::Garbage,
    };
    let notice = Notice {
        agent: rng.below(16) as u16,
        says,
        tp: 2,
        seq: None,
        speaks: None,
    };
    let reason = match says {
        Says::Heartbeat(_) => IgnoreReason::NotForConsumer,
        Says::Garbage => kvdrain::wire::parse(&notice.bytes(""))
            .err()
            .map(IgnoreReason::Malformed)
            .expect("garbage does not parse"),
        _ => IgnoreReason::Unknown,
    };
    (notice, reason)
}

/// What the ingest thread did, in order.
struct IngestLog {
    notices: Vec<(Notice, NoticeResult)>,
    /// Noise notices and the reason each must be ignored for.
    noise: Vec<(usize, IgnoreReason)>,
    counters: IngestCounters,
}

fn ingest_thread<const M: usize, const F: usize>(
    mut ingest: Ingest<'_, M, F>,
    seed: u64,
    specs: mpsc::Receiver<Spec>,
    done: mpsc::Sender<usize>,
    spoken: &Spoken,
    progress: &AtomicU64,
) -> IngestLog {
    let mut rng = Rng(seed ^ 0xA5A5_A5A5);
    let mut pool: Vec<(Spec, Vec<Notice>, usize)> = Vec::new();
    let mut log = IngestLog {
        notices: Vec::new(),
        noise: Vec::new(),
        counters: IngestCounters::default(),
    };
    let mut open = true;
    let mut k = 0u64;
    loop {
        // Top the pool up; block only when there is nothing else to do.
        while open && pool.len() < POOL {
            let next = if pool.is_empty() {
                specs.recv().ok()
            } else {
                match specs.try_recv() {
                    Ok(spec) => Some(spec),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => None,
                }
            };
            match next {
                Some(spec) => {
                    let p = plan(&spec, &mut rng);
                    pool.push((spec, p, 0));
                }
                None => open = false,
            }
        }
        if pool.is_empty() {
            break;
        }
        k += 1;
        let (notice, bytes) = if rng.chance(8) {
            let (notice, reason) = noise(&mut rng, k);
            log.noise.push((log.notices.len(), reason));
            (notice, notice.bytes(""))
        } else {
            let i = rng.below(pool.len() as u64) as usize;
            let (spec, p, at) = &mut pool[i];
            if *at == p.len() {
                if spec.class == Class::Settled {
                    done.send(spec.seq).expect("engine listens until we stop");
                }
                pool.swap_remove(i);
                continue;
            }
            let notice = p[*at];
            *at += 1;
            if let Some((pos, what)) = notice.speaks {
                spoken.mark(spec.seq, pos, what);
            }
            (notice, notice.bytes(&spec.id))
        };
        let result = ingest
            .handle_notification(AgentId(notice.agent), &bytes)
            .map_err(|e| e.reason);
        log.notices.push((notice, result));
        progress.store(log.notices.len() as u64, Ordering::Relaxed);
    }
    log.counters = *ingest.counters();
    log
}

/// What the engine saw of one request.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
struct Outcome {
    completed: u32,
    failed: u32,
    aborted: u32,
    expired: u32,
    released: u32,
    forced: u32,
    /// Its decisions and aborts, in order: `completed`, `failed`, `released`, `forced`,
    /// `expired`, `aborted`, `abort_late`.
    history: Vec<&'static str>,
    /// What the abort or the expiry reported as still owed.
    quarantined_with: Option<Outstanding>,
}

/// The engine thread's record of the run.
struct EngineRun<'s> {
    spoken: &'s Spoken,
    specs: Vec<Spec>,
    outcomes: Vec<Outcome>,
    key_to_seq: HashMap<RequestKey, usize>,
    /// Agents fenced at least once so far.
    fenced: [bool; 16],
    fences: u64,
    fenced_edges: u64,
    aborts: u64,
    advances: u64,
    polls: u64,
}

impl EngineRun<'_> {
    /// Checks a decision as it arrives, then records it.
    fn decision(&mut self, d: Decision) {
        let seq = self.key_to_seq[&d.key()];
        let spec = &self.specs[seq];
        let what: &'static str = match &d {
            Decision::Completed(_) => "completed",
            Decision::Failed(_) => "failed",
            Decision::Expired(_) => "expired",
            Decision::Released(r) if r.forced() => "forced",
            Decision::Released(_) => "released",
        };
        if matches!(what, "completed" | "failed" | "released") {
            // Rule 1: every edge resolved before the blocks are handed over or freed.
            match spec.count {
                Some(n) => {
                    let completions = (0..usize::from(n))
                        .filter(|&p| self.spoken.get(seq, p) != 0)
                        .count();
                    let dup = usize::from(self.spoken.get(seq, DUP) != 0);
                    assert!(
                        completions + dup >= usize::from(n),
                        "{what} {} with {completions} of {n} notices sent (duplicate: {dup})",
                        spec.id
                    );
                }
                None => {
                    for (pos, agent) in spec.agents.iter().enumerate() {
                        let said = self.spoken.get(seq, pos);
                        assert!(
                            said != 0 || self.fenced[agent.0 as usize],
                            "{what} {} while agent {} may still write",
                            spec.id,
                            agent.0
                        );
                        if what == "completed" {
                            assert_eq!(
                                said, 1,
                                "{} completed without {}'s write",
                                spec.id, agent.0
                            );
                        }
                    }
                }
            }
        }
        let o = &mut self.outcomes[seq];
        o.history.push(what);
        match d {
            Decision::Completed(c) => {
                o.completed += 1;
                let _ = c.into_decode();
            }
            Decision::Failed(_) => o.failed += 1,
            Decision::Expired(q) => {
                o.expired += 1;
                o.quarantined_with = Some(q.outstanding());
            }
            Decision::Released(r) => {
                o.released += 1;
                o.forced += u32::from(r.forced());
                let _ = r.into_free();
            }
        }
    }

    fn aborted(&mut self, seq: usize, result: Result<Quarantined, AbortError>) {
        self.aborts += 1;
        let o = &mut self.outcomes[seq];
        match result {
            Ok(q) => {
                o.aborted += 1;
                o.quarantined_with = Some(q.outstanding());
                o.history.push("aborted");
            }
            Err(AbortError::Late) => o.history.push("abort_late"),
            Err(AbortError::Unknown) => panic!("abort of {} unknown", self.specs[seq].id),
        }
    }

    fn decided(&self, seq: usize) -> bool {
        let o = &self.outcomes[seq];
        o.completed + o.failed + o.aborted + o.expired > 0
    }

    fn poll<const M: usize, const F: usize>(&mut self, engine: &mut Engine<'_, M, F>) {
        self.polls += 1;
        while let Some(d) = engine.poll_decision() {
            self.decision(d);
        }
    }

    /// The decisions the last `fence` or `advance` queued, and not those of requests the
    /// ingest thread drained since (`poll` takes those).
    fn queued<const M: usize, const F: usize>(&mut self, engine: &mut Engine<'_, M, F>) {
        for d in engine.drain_queued() {
            self.decision(d);
        }
    }

    /// A settled request's notices are all out: take its decision, or abort it.
    fn settle<const M: usize, const F: usize>(
        &mut self,
        engine: &mut Engine<'_, M, F>,
        seq: usize,
    ) {
        self.poll(engine);
        if !self.decided(seq) {
            let result = engine.abort_id(&self.specs[seq].id);
            self.aborted(seq, result);
        }
    }
}

fn new_spec(seq: usize, rng: &mut Rng) -> Spec {
    let class = if rng.chance(70) {
        Class::Settled
    } else {
        Class::Racing
    };
    let (prefix, base) = match class {
        Class::Settled => ('d', 0),
        Class::Racing => ('r', 8),
    };
    // Ids with colons, as vLLM's can have.
    let id = format!("{prefix}{seq}:cmpl-{:x}", rng.next() & 0xFFFF);
    if rng.chance(50) {
        let n = 1 + rng.below(4) as u8;
        Spec {
            seq,
            class,
            id,
            count: Some(n),
            agents: Vec::new(),
        }
    } else {
        let k = 1 + rng.below(4) as usize;
        let mut agents: Vec<AgentId> = (base..base + 8).map(AgentId).collect();
        for i in (1..agents.len()).rev() {
            agents.swap(i, rng.below(i as u64 + 1) as usize);
        }
        agents.truncate(k);
        Spec {
            seq,
            class,
            id,
            count: None,
            agents,
        }
    }
}

fn engine_thread<'s, const M: usize, const F: usize>(
    engine: &mut Engine<'_, M, F>,
    requests: usize,
    seed: u64,
    spec_tx: mpsc::SyncSender<Spec>,
    done_rx: mpsc::Receiver<usize>,
    spoken: &'s Spoken,
    progress: &AtomicU64,
) -> EngineRun<'s> {
    let mut rng = Rng(seed);
    let mut run = EngineRun {
        spoken,
        specs: Vec::with_capacity(requests),
        outcomes: vec![Outcome::default(); requests],
        key_to_seq: HashMap::with_capacity(requests),
        fenced: [false; 16],
        fences: 0,
        fenced_edges: 0,
        aborts: 0,
        advances: 0,
        polls: 0,
    };
    let mut tickets: HashMap<usize, Pending> = HashMap::new();
    let mut racing: Vec<usize> = Vec::new();
    let mut spec_tx = Some(spec_tx);
    let mut seen = 0;
    loop {
        // Register while there is room.
        let mut burst = 0;
        while run.specs.len() < requests && engine.len() < LIVE && burst < 8 {
            burst += 1;
            let seq = run.specs.len();
            let spec = new_spec(seq, &mut rng);
            let deadline = match spec.class {
                Class::Settled => NEVER,
                Class::Racing => Duration::from_millis(6 + rng.below(40)),
            };
            let ticket = engine
                .register(Registration {
                    id: &spec.id,
                    blocks: BlockHandle(seq as u64),
                    expect: spec.expect(),
                    deadline: Some(deadline),
                })
                .unwrap_or_else(|e| panic!("registration refused: {e}"));
            run.key_to_seq.insert(ticket.key(), seq);
            if spec.class == Class::Racing {
                tickets.insert(seq, ticket);
                racing.push(seq);
            }
            run.specs.push(spec.clone());
            if let Some(tx) = &spec_tx {
                tx.send(spec).expect("ingest thread listens");
            }
        }
        if run.specs.len() == requests {
            spec_tx = None; // no more requests: the ingest thread ends when it is done
        }
        // Settled requests the ingest thread finished with.
        let mut finished = false;
        loop {
            match done_rx.try_recv() {
                Ok(seq) => run.settle(engine, seq),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    finished = true;
                    break;
                }
            }
        }
        if finished {
            break;
        }
        // Race the ingest thread on racing requests, at the pace it makes progress.
        let handled = progress.load(Ordering::Relaxed);
        if handled == seen {
            run.poll(engine);
            std::thread::yield_now();
            continue;
        }
        seen = handled;
        racing.retain(|seq| !run.decided(*seq));
        if rng.chance(25) && !racing.is_empty() {
            let i = rng.below(racing.len() as u64) as usize;
            let seq = racing.swap_remove(i);
            let ticket = tickets.remove(&seq).expect("undecided racing request");
            let result = engine.abort(ticket);
            run.aborted(seq, result);
        }
        if rng.chance(3) {
            let agent = 8 + rng.below(8) as u16;
            run.fenced[agent as usize] = true;
            run.fences += 1;
            let resolved = engine.fence(AgentId(agent));
            run.queued(engine);
            run.fenced_edges += u64::from(resolved);
        }
        let now = Instant::from_millis(handled / NOTICES_PER_MS);
        if now > engine.now() {
            run.advances += 1;
            engine.advance(now).expect("clock forward");
            run.queued(engine);
        }
        run.poll(engine);
    }
    // The ingest thread is done: drain every timer.
    run.poll(engine);
    engine.advance(FAR).expect("clock forward");
    run.queued(engine);
    run.poll(engine);
    run
}

fn requests_to_run() -> usize {
    std::env::var("KVDRAIN_STRESS_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            100_000
        } else {
            600_000
        })
}

fn seed() -> u64 {
    std::env::var("KVDRAIN_STRESS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6b76_6472_6169_6e33)
}

#[test]
fn two_threads_agree_with_a_single_threaded_replay() {
    let requests = requests_to_run();
    let seed = seed();
    let config = Config {
        capacity: N,
        deadline: NEVER,
        quarantine: QUARANTINE,
        // Released with the decision, so the single-threaded replay can compare every
        // decision's place; the settling race (a failure notice's stamp against the
        // engine's clock) is model-checked in `crates/kvdrain/tests/loom.rs`.
        settle: Duration::ZERO,
        seed: 11,
    };
    let mut ledger: Box<Ledger<N, E>> = Box::new(Ledger::new(config));
    let spoken = Spoken::new(requests);
    let (spec_tx, spec_rx) = mpsc::sync_channel::<Spec>(4 * LIVE);
    let (done_tx, done_rx) = mpsc::channel::<usize>();
    let progress = AtomicU64::new(0);

    let start = std::time::Instant::now();
    let (log, run) = {
        let (ingest, mut engine) = ledger.split();
        let (spoken, progress) = (&spoken, &progress);
        std::thread::scope(|s| {
            let ingest =
                s.spawn(move || ingest_thread(ingest, seed, spec_rx, done_tx, spoken, progress));
            let run = engine_thread(
                &mut engine,
                requests,
                seed,
                spec_tx,
                done_rx,
                spoken,
                progress,
            );
            (ingest.join().expect("ingest thread"), run)
        })
    };
    let elapsed = start.elapsed();

    check_rules(&run, &log, &ledger);
    let replayed = replay_settled(&run, &log, config);
    report(&run, &log, &ledger, replayed, elapsed, seed);
}

/// Rules that hold whatever the interleaving.
fn check_rules(run: &EngineRun<'_>, log: &IngestLog, ledger: &Ledger<N, E>) {
    assert_eq!(
        ledger.len(),
        0,
        "everything decided and released at the end"
    );
    // Noise is ignored for its reason, whatever else happens.
    for &(i, reason) in &log.noise {
        assert_eq!(log.notices[i].1, Err(reason), "{:?}", log.notices[i].0);
    }
    // Per request: what the notices did.
    let mut ok = vec![0usize; run.specs.len()];
    let mut failed_ok = vec![0usize; run.specs.len()];
    let mut decided_by_notice = vec![0usize; run.specs.len()];
    for (notice, result) in &log.notices {
        let Some(seq) = notice.seq else { continue };
        if let Ok(n) = result {
            ok[seq] += 1;
            if notice.says == Says::Failure {
                failed_ok[seq] += 1;
            }
            if *n == Noticed::Decided {
                decided_by_notice[seq] += 1;
            }
        }
    }
    for (seq, (spec, o)) in run.specs.iter().zip(&run.outcomes).enumerate() {
        let edges = spec.edges();
        // Rule 2: exactly one decision; a release unless completed; no double count.
        assert_eq!(
            o.completed + o.failed + o.aborted + o.expired,
            1,
            "{}: exactly one decision: {o:?}",
            spec.id
        );
        assert_eq!(
            o.released,
            u32::from(o.completed == 0),
            "{}: {o:?}",
            spec.id
        );
        assert!(
            ok[seq] <= edges,
            "{}: {} notices counted for {edges} edges",
            spec.id,
            ok[seq]
        );
        assert!(decided_by_notice[seq] <= 1, "{}: decided twice", spec.id);
        if o.completed == 1 {
            assert_eq!((ok[seq], failed_ok[seq]), (edges, 0), "{}: {o:?}", spec.id);
        }
        if o.failed == 1 {
            assert_eq!(
                o.forced, 0,
                "{}: a failed request is drained: {o:?}",
                spec.id
            );
            assert!(
                failed_ok[seq] > 0 || spec.count.is_none(),
                "{}: failed without a failure: {o:?}",
                spec.id
            );
        }
        if o.forced == 1 {
            assert!(ok[seq] < edges, "{}: forced although drained", spec.id);
        }
        if spec.count.is_some() {
            // No fence in counting mode: drained exactly when every notice counted.
            let drained = o.completed + o.failed == 1 || (o.released == 1 && o.forced == 0);
            assert_eq!(
                drained,
                ok[seq] == edges,
                "{}: {o:?}, {} counted",
                spec.id,
                ok[seq]
            );
            assert_eq!(decided_by_notice[seq], usize::from(drained), "{}", spec.id);
        }
        if spec.class == Class::Settled {
            assert_eq!(o.expired, 0, "{}: settled requests never expire", spec.id);
        }
    }
    // Counters add up on both sides.
    let c = ledger.counters();
    let oks = ok.iter().sum::<usize>() as u64;
    assert_eq!(c.ingest, log.counters);
    assert_eq!(c.ingest.completions + c.ingest.failure_notices, oks);
    assert_eq!(
        c.ingest.last_edges,
        decided_by_notice.iter().sum::<usize>() as u64
    );
    assert_eq!(c.ingest.ready_overflow, 0);
    let sum = |f: fn(&Outcome) -> u32| run.outcomes.iter().map(|o| u64::from(f(o))).sum::<u64>();
    assert_eq!(c.engine.registered, run.specs.len() as u64);
    assert_eq!(c.engine.completed, sum(|o| o.completed));
    assert_eq!(c.engine.failed, sum(|o| o.failed));
    assert_eq!(c.engine.aborted, sum(|o| o.aborted));
    assert_eq!(c.engine.expired, sum(|o| o.expired));
    assert_eq!(
        c.engine.released + c.engine.released_forced,
        sum(|o| o.released)
    );
    assert_eq!(c.engine.released_forced, sum(|o| o.forced));
    assert_eq!(c.engine.fenced_edges, run.fenced_edges);
    assert_eq!(c.engine.rejected_full, 0);
}

/// Replays every settled request's events in order on a fresh single-threaded ledger and
/// requires the same result for each notice and the same decisions. Returns how many
/// requests it replayed.
fn replay_settled(run: &EngineRun<'_>, log: &IngestLog, config: Config) -> usize {
    let mut by_seq: Vec<Vec<usize>> = vec![Vec::new(); run.specs.len()];
    for (i, (notice, _)) in log.notices.iter().enumerate() {
        if let Some(seq) = notice.seq {
            by_seq[seq].push(i);
        }
    }
    let mut ledger: Box<Ledger<N, E>> = Box::new(Ledger::new(config));
    let mut replayed = 0;
    for (seq, spec) in run.specs.iter().enumerate() {
        if spec.class != Class::Settled {
            continue;
        }
        replayed += 1;
        let ticket = ledger
            .register(Registration {
                id: &spec.id,
                blocks: BlockHandle(seq as u64),
                expect: spec.expect(),
                deadline: Some(NEVER),
            })
            .unwrap_or_else(|e| panic!("replay: {e}"));
        let key = ticket.key();
        let mut history: Vec<&'static str> = Vec::new();
        let record = |d: Decision, history: &mut Vec<&'static str>| {
            assert_eq!(d.key(), key);
            history.push(match d {
                Decision::Completed(_) => "completed",
                Decision::Failed(_) => "failed",
                Decision::Expired(_) => "expired",
                Decision::Released(r) if r.forced() => "forced",
                Decision::Released(_) => "released",
            });
        };
        for &i in &by_seq[seq] {
            let (notice, result) = &log.notices[i];
            let bytes = notice.bytes(&spec.id);
            let again = ledger
                .handle_notification(AgentId(notice.agent), &bytes)
                .map_err(|e| e.reason);
            assert_eq!(
                &again, result,
                "replay of {} disagrees on notice {notice:?}",
                spec.id
            );
        }
        for d in ledger.decisions() {
            record(d, &mut history);
        }
        let mut quarantined_with = None;
        if history.is_empty() {
            match ledger.abort(ticket) {
                Ok(q) => {
                    history.push("aborted");
                    quarantined_with = Some(q.outstanding());
                }
                Err(e) => panic!("replay: abort of {} refused: {e}", spec.id),
            }
            let until = ledger.now() + QUARANTINE;
            ledger.advance(until).expect("clock forward");
            for d in ledger.decisions() {
                record(d, &mut history);
            }
        }
        let o = &run.outcomes[seq];
        assert_eq!(
            history, o.history,
            "replay of {} decides differently",
            spec.id
        );
        assert_eq!(
            quarantined_with, o.quarantined_with,
            "replay of {}",
            spec.id
        );
    }
    assert_eq!(ledger.len(), 0);
    replayed
}

fn report(
    run: &EngineRun<'_>,
    log: &IngestLog,
    ledger: &Ledger<N, E>,
    replayed: usize,
    elapsed: std::time::Duration,
    seed: u64,
) {
    let notices = log.notices.len();
    let c = ledger.counters();
    println!(
        "stress: {} requests ({replayed} settled and replayed), {notices} notices in \
         {elapsed:.2?} ({:.2} M notices/s), seed {seed:#x}",
        run.specs.len(),
        notices as f64 / elapsed.as_secs_f64() / 1e6,
    );
    println!(
        "stress: engine: {} polls, {} advances, {} aborts, {} fences ({} edges); {:?}",
        run.polls, run.advances, run.aborts, run.fences, run.fenced_edges, c.engine
    );
    println!("stress: ingest: {:?}", c.ingest);
    for class in [Class::Settled, Class::Racing] {
        let mut histories: HashMap<String, usize> = HashMap::new();
        for (spec, o) in run.specs.iter().zip(&run.outcomes) {
            if spec.class == class {
                *histories.entry(o.history.join(" ")).or_default() += 1;
            }
        }
        let mut histories: Vec<_> = histories.into_iter().collect();
        histories.sort_by_key(|h| std::cmp::Reverse(h.1));
        println!("stress: {class:?} outcomes: {histories:?}");
    }
}
