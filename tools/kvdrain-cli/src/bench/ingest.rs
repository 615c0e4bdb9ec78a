//! `kvdrain bench ingest`, `bench floor` and `bench stream`.
//!
//! One repetition: build a fresh `Ledger<N, E>` (N = R rounded up to a power of two, at
//! least 64; E = 8, or 32 for named mode with more than 8 edges), register the R requests
//! (untimed), then time one pass over the M prepared messages. Per message: the real
//! [`Ledger::handle_notification`] (parse, fingerprint, index probe, CAS); on
//! [`Noticed::Decided`] the [`Ledger::poll_decision`] pulls that take the decisions out
//! and the re-registration of the request under the same id, so R stay in flight. Allocations
//! are counted around the timed loop only.

use std::hint::black_box;

use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Duration, Engine, Expect, Ignored, Ingest, Ledger,
    Noticed, Pending, RegisterError, Registration,
};

use super::args::{FloorArgs, IngestArgs, ModeArg, StreamArgs};
use super::floor::Floor;
use super::stream::{self, Params, Stream};
use super::{Clock, Failure, Line, Spread, alloc, on_big_stack, put_allocations, stack_for};

/// How requests wait for their notifications.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// `Expect::Count(E)`: E notices from anyone (vLLM's semantics).
    Counting,
    /// `Expect::Edges`: one notice from each of E named agents; message `k` comes from
    /// agent `k % E`.
    Named,
}

impl Mode {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Counting => "counting",
            Mode::Named => "named",
        }
    }
}

/// The `--mode` flag's value.
impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Counting => Mode::Counting,
            ModeArg::Named => Mode::Named,
        }
    }
}

/// Everything a timed pass reads.
#[derive(Debug)]
pub struct Workload<'a> {
    /// Generation parameters (R, E, M, failure share, seed).
    pub params: &'a Params,
    /// Counting or named edges.
    pub mode: Mode,
    /// The prepared messages.
    pub stream: &'a Stream,
    /// `ids[i]` is request `i`'s id.
    pub ids: &'a [String],
}

/// The prepared messages and ids of one run, generated once and shared by every pass.
#[derive(Debug)]
pub struct Inputs {
    /// The messages.
    pub stream: Stream,
    /// `ids[i]` is request `i`'s id.
    pub ids: Vec<String>,
}

impl Inputs {
    /// Generates the stream and the ids for `params`.
    pub fn generate(params: &Params) -> Self {
        Inputs {
            stream: stream::generate(params),
            ids: (0..params.inflight).map(stream::request_id).collect(),
        }
    }

    /// The workload of these inputs in `mode`.
    pub fn workload<'a>(&'a self, params: &'a Params, mode: Mode) -> Workload<'a> {
        Workload {
            params,
            mode,
            stream: &self.stream,
            ids: &self.ids,
        }
    }
}

/// What one timed pass saw.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pass {
    /// Wall time of the pass divided by M.
    pub ns_per_notification: f64,
    /// Thread-CPU time of the pass divided by M (`NaN` if unavailable).
    pub cpu_ns_per_notification: f64,
    /// Requests decided (and re-registered).
    pub decided: u64,
    /// Of those, decided `failed`.
    pub failed: u64,
    /// Notices the ledger ignored (must be 0).
    pub ignored: u64,
    /// Registrations refused, or decisions the harness did not expect (must be 0).
    pub anomalies: u64,
    /// Heap allocations during the timed loop.
    pub allocations: u64,
}

/// Counts kept by the timed loop.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    decided: u64,
    failed: u64,
    ignored: u64,
    anomalies: u64,
}

/// A `Ledger<N, E>` picked at run time.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Table size `N`.
    pub n: usize,
    /// Named-edge capacity `E`.
    pub e: usize,
    /// `size_of::<Ledger<N, E>>()`.
    pub bytes: usize,
    pass: fn(&Workload<'_>) -> Pass,
    pass_halves: fn(&Workload<'_>) -> Pass,
}

/// `Ledger<N, E>` whatever R (`bench c-api` compares on the C ABI's instantiation).
pub fn shape<const N: usize, const E: usize>() -> Shape {
    Shape {
        n: N,
        e: E,
        bytes: size_of::<Ledger<N, E>>(),
        pass: kvdrain_pass::<N, E, false>,
        pass_halves: kvdrain_pass::<N, E, true>,
    }
}

macro_rules! shapes {
    ($n:expr, $e:expr; $($size:literal)*) => {
        match ($n, $e) {
            $(
                ($size, 8) => Some(shape::<$size, 8>()),
                ($size, 32) => Some(shape::<$size, 32>()),
            )*
            _ => None,
        }
    };
}

impl Shape {
    /// The ledger for R requests with E edges in `mode`.
    pub fn for_run(inflight: usize, edges: usize, mode: Mode) -> Result<Shape, Failure> {
        let n = inflight.next_power_of_two().max(64);
        let e = match mode {
            Mode::Counting if edges <= 64 => 8,
            Mode::Named if edges <= 8 => 8,
            Mode::Named if edges <= 32 => 32,
            _ => {
                return Err(Failure::Usage(format!(
                    "--edges {edges}: at most 64 in counting mode, 32 in named mode"
                )));
            }
        };
        shapes!(n, e; 64 128 256 512 1024 2048 4096 8192 16384 32768 65536)
            .ok_or_else(|| Failure::Usage(format!("--inflight {inflight}: at most 65536")))
    }

    /// `Ledger<N, E>` as text.
    pub fn name(&self) -> String {
        format!("Ledger<{}, {}>", self.n, self.e)
    }

    /// One timed repetition through `Ledger`'s own methods (call it on a stack of
    /// [`stack_for`]`(self.bytes)`).
    pub fn pass(&self, w: &Workload<'_>) -> Pass {
        (self.pass)(w)
    }

    /// One timed repetition through the halves of `Ledger::split`, on this thread: the
    /// lock-free protocol a two-thread deployment (and the C ABI) runs, without the
    /// one-thread shortcut of `Ledger::handle_notification`.
    pub fn pass_halves(&self, w: &Workload<'_>) -> Pass {
        (self.pass_halves)(w)
    }
}

fn kvdrain_pass<const N: usize, const E: usize, const HALVES: bool>(w: &Workload<'_>) -> Pass {
    let edges = w.params.edges;
    let agents: [AgentId; 64] = core::array::from_fn(|i| AgentId(i as u16));
    let expect = match w.mode {
        Mode::Counting => Expect::Count(edges as u8),
        Mode::Named => Expect::Edges(&agents[..edges]),
    };
    // The timed loop has no clock (vLLM's path releases with the decision): a failed
    // request's blocks come back at once and its id is registered again, as before rule 8.
    let mut ledger: Ledger<N, E> = Ledger::new(Config {
        settle: Duration::ZERO,
        ..Config::with_capacity(N)
    });
    let mut refused = 0;
    for (i, id) in w.ids.iter().enumerate() {
        let registration = Registration {
            id,
            blocks: BlockHandle(i as u64),
            expect,
            deadline: None,
        };
        refused += u64::from(ledger.register(registration).is_err());
    }
    let ledger = black_box(&mut ledger);
    let before = alloc::allocations();
    let clock = Clock::start();
    let tally = if HALVES {
        let (ingest, engine) = ledger.split();
        drive(
            &mut Halves { ingest, engine },
            w.stream,
            w.ids,
            expect,
            edges,
        )
    } else {
        drive(ledger, w.stream, w.ids, expect, edges)
    };
    let elapsed = clock.per(w.stream.len());
    let allocations = alloc::allocations() - before;
    Pass {
        ns_per_notification: elapsed.wall,
        cpu_ns_per_notification: elapsed.cpu,
        decided: tally.decided,
        failed: tally.failed,
        ignored: tally.ignored,
        anomalies: tally.anomalies + refused,
        allocations,
    }
}

/// What the timed loop drives: the ledger itself, or its split halves.
trait Tracker {
    fn notice<'m>(&mut self, agent: AgentId, bytes: &'m [u8]) -> Result<Noticed, Ignored<'m>>;
    fn poll(&mut self) -> Option<Decision>;
    fn register<'r>(&mut self, r: Registration<'r>) -> Result<Pending, RegisterError<'r>>;
}

impl<const N: usize, const E: usize> Tracker for Ledger<N, E> {
    #[inline(always)]
    fn notice<'m>(&mut self, agent: AgentId, bytes: &'m [u8]) -> Result<Noticed, Ignored<'m>> {
        self.handle_notification(agent, bytes)
    }
    #[inline(always)]
    fn poll(&mut self) -> Option<Decision> {
        self.poll_decision()
    }
    #[inline(always)]
    fn register<'r>(&mut self, r: Registration<'r>) -> Result<Pending, RegisterError<'r>> {
        Ledger::register(self, r)
    }
}

/// A ledger's two halves, driven from one thread.
struct Halves<'l, const N: usize, const E: usize> {
    ingest: Ingest<'l, N, E>,
    engine: Engine<'l, N, E>,
}

impl<const N: usize, const E: usize> Tracker for Halves<'_, N, E> {
    #[inline(always)]
    fn notice<'m>(&mut self, agent: AgentId, bytes: &'m [u8]) -> Result<Noticed, Ignored<'m>> {
        self.ingest.handle_notification(agent, bytes)
    }
    #[inline(always)]
    fn poll(&mut self) -> Option<Decision> {
        self.engine.poll_decision()
    }
    #[inline(always)]
    fn register<'r>(&mut self, r: Registration<'r>) -> Result<Pending, RegisterError<'r>> {
        self.engine.register(r)
    }
}

/// The timed loop (not inlined, so profilers can single it out).
#[inline(never)]
fn drive<T: Tracker>(
    ledger: &mut T,
    stream: &Stream,
    ids: &[String],
    expect: Expect<'_>,
    edges: usize,
) -> Tally {
    let mut t = Tally::default();
    let mut edge = 0usize;
    for msg in stream.iter() {
        let agent = AgentId(edge as u16);
        edge += 1;
        if edge == edges {
            edge = 0;
        }
        match ledger.notice(agent, msg) {
            Ok(Noticed::Counted) => {}
            Ok(Noticed::Decided) => {
                // The slot comes back as the decision is handed out: re-register at once.
                while let Some(d) = ledger.poll() {
                    let blocks = match d {
                        Decision::Completed(c) => c.into_decode(),
                        Decision::Released(r) => r.into_free(),
                        Decision::Failed(_) => {
                            t.failed += 1;
                            continue;
                        }
                        Decision::Expired(_) => {
                            t.anomalies += 1;
                            continue;
                        }
                    };
                    t.decided += 1;
                    let registration = Registration {
                        id: &ids[blocks.0 as usize],
                        blocks,
                        expect,
                        deadline: None,
                    };
                    t.anomalies += u64::from(ledger.register(registration).is_err());
                }
            }
            Err(_) => t.ignored += 1,
        }
    }
    t
}

/// One timed repetition of the floor ([`Floor`]) over the same stream.
pub fn floor_pass(w: &Workload<'_>) -> Pass {
    let mut floor = Floor::with_capacity(w.ids.len());
    let mut anomalies = 0;
    for id in w.ids {
        anomalies += u64::from(!floor.register(id.as_bytes(), w.params.edges as u32));
    }
    let floor = black_box(&mut floor);
    let before = alloc::allocations();
    let clock = Clock::start();
    let decided = drive_floor(floor, w.stream);
    let elapsed = clock.per(w.stream.len());
    let allocations = alloc::allocations() - before;
    Pass {
        ns_per_notification: elapsed.wall,
        cpu_ns_per_notification: elapsed.cpu,
        decided,
        failed: 0,
        ignored: 0,
        anomalies,
        allocations,
    }
}

#[inline(never)]
fn drive_floor(floor: &mut Floor, stream: &Stream) -> u64 {
    let mut decided = 0;
    for msg in stream.iter() {
        decided += u64::from(floor.notify(msg));
    }
    decided
}

/// One timed walk over the stream that only touches each message: the harness's own
/// share of every figure.
pub fn walk_pass(w: &Workload<'_>) -> Pass {
    let clock = Clock::start();
    let mut sum = 0u64;
    for msg in w.stream.iter() {
        let msg = black_box(msg);
        sum = sum.wrapping_add(u64::from(msg[msg.len() - 1]));
    }
    black_box(sum);
    let elapsed = clock.per(w.stream.len());
    Pass {
        ns_per_notification: elapsed.wall,
        cpu_ns_per_notification: elapsed.cpu,
        ..Pass::default()
    }
}

/// Checks the passes of one implementation: every full group of E messages decided one
/// request, nothing ignored, nothing allocated.
pub fn check(
    label: &str,
    w: &Workload<'_>,
    passes: &[Pass],
    counting: bool,
) -> Result<(), Failure> {
    let want = (w.params.notifications / w.params.edges) as u64;
    for p in passes {
        if p.decided != want || p.ignored != 0 || p.anomalies != 0 {
            return Err(Failure::Check(format!(
                "{label}: sanity check failed: decided {} (want {want}), ignored {}, anomalies {}",
                p.decided, p.ignored, p.anomalies
            )));
        }
    }
    let allocations: u64 = passes.iter().map(|p| p.allocations).sum();
    if counting && allocations != 0 {
        return Err(Failure::Check(format!(
            "{label}: {allocations} allocations in the timed loops (must be 0)"
        )));
    }
    Ok(())
}

/// Wall and CPU spreads of a set of passes.
#[derive(Clone, Copy, Debug)]
pub struct Spreads {
    /// Wall-clock ns per notification.
    pub wall: Spread,
    /// Thread-CPU ns per notification.
    pub cpu: Spread,
}

impl Spreads {
    /// Of `passes` (at least one).
    pub fn of(passes: &[Pass]) -> Spreads {
        let wall: Vec<f64> = passes.iter().map(|p| p.ns_per_notification).collect();
        let cpu: Vec<f64> = passes.iter().map(|p| p.cpu_ns_per_notification).collect();
        Spreads {
            wall: Spread::of(&wall),
            cpu: Spread::of(&cpu),
        }
    }
}

/// The JSON line of one implementation's passes; callers add their own last keys.
pub fn json_line(
    implementation: &str,
    w: &Workload<'_>,
    passes: &[Pass],
    counting: bool,
) -> (Line, Spreads) {
    let spreads = Spreads::of(passes);
    let p = w.params;
    let mut line = Line::new();
    line.put("impl", implementation);
    spreads.wall.put(&mut line, "ns_per_notification", "ns");
    spreads
        .cpu
        .put(&mut line, "cpu_ns_per_notification", "cpu_ns");
    line.put("notifications", p.notifications)
        .put("inflight", p.inflight)
        .put("edges", p.edges)
        .put("mode", w.mode.name())
        .put("fail_share", p.fail_share)
        .put("reps", passes.len());
    put_allocations(
        &mut line,
        counting,
        passes.iter().map(|q| q.allocations).sum(),
    );
    if let Some(first) = passes.first() {
        line.put("decided_per_rep", first.decided)
            .put("failed_per_rep", first.failed);
    }
    (line, spreads)
}

/// `kvdrain bench ingest`.
pub fn main(args: &IngestArgs) -> Result<(), Failure> {
    let params = args.stream.params();
    let mode = Mode::from(args.mode);
    let shape = Shape::for_run(params.inflight, params.edges, mode)?;
    let counting = alloc::counting();
    let inputs = Inputs::generate(&params);
    let w = inputs.workload(&params, mode);
    let progress = crate::progress::bar(args.reps as u64, "reps");
    let passes = on_big_stack(stack_for(shape.bytes), || {
        (0..args.reps)
            .map(|_| {
                let pass = shape.pass(&w);
                progress.inc(1);
                pass
            })
            .collect::<Vec<_>>()
    })?;
    progress.finish_and_clear();
    let (mut line, _) = json_line("kvdrain", &w, &passes, counting);
    line.put("ledger", shape.name())
        .put("ledger_bytes", shape.bytes);
    line.print();
    check("kvdrain", &w, &passes, counting)
}

/// `kvdrain bench floor`.
pub fn floor_main(args: &FloorArgs) -> Result<(), Failure> {
    let params = args.stream.params();
    let counting = alloc::counting();
    let inputs = Inputs::generate(&params);
    let w = inputs.workload(&params, Mode::Counting);
    let progress = crate::progress::bar(args.reps as u64, "reps");
    let passes: Vec<Pass> = (0..args.reps)
        .map(|_| {
            let pass = floor_pass(&w);
            progress.inc(1);
            pass
        })
        .collect();
    progress.finish_and_clear();
    let (mut line, _) = json_line("rust-floor", &w, &passes, counting);
    line.put("hasher", "rustc-hash 2");
    line.print();
    check("rust-floor", &w, &passes, counting)
}

/// `kvdrain bench stream`: the messages, one a line.
pub fn stream_main(args: &StreamArgs) -> Result<(), Failure> {
    use std::io::Write as _;
    let stream = stream::generate(&args.params());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    stream
        .write_lines(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| Failure::Check(format!("cannot write the stream: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(inflight: usize, edges: usize, mode: Mode, fail_share: f64) -> Pass {
        let params = Params {
            inflight,
            edges,
            notifications: inflight * edges * 3 + edges + 1,
            fail_share,
            seed: 3,
        };
        let inputs = Inputs::generate(&params);
        let w = inputs.workload(&params, mode);
        let shape = Shape::for_run(inflight, edges, mode).expect("valid shape");
        let passes = on_big_stack(stack_for(shape.bytes), || vec![shape.pass(&w)])
            .unwrap_or_else(|_| panic!("bench thread"));
        check("kvdrain", &w, &passes, false).unwrap_or_else(|_| panic!("check"));
        let floor = [floor_pass(&w)];
        check("floor", &w, &floor, false).unwrap_or_else(|_| panic!("floor check"));
        passes[0]
    }

    #[test]
    fn every_group_decides_and_reregisters() {
        let p = run(100, 2, Mode::Counting, 0.05);
        assert_eq!(p.decided, 301);
        assert!(p.failed > 0);
        let q = run(64, 3, Mode::Named, 0.0);
        assert_eq!((q.decided, q.failed), (193, 0));
        let r = run(40, 20, Mode::Named, 0.5);
        assert!(r.failed > 0);
    }

    #[test]
    fn shapes_round_up_and_pick_the_edge_capacity() {
        let s = Shape::for_run(3000, 2, Mode::Counting).expect("fits");
        assert_eq!((s.n, s.e), (4096, 8));
        let s = Shape::for_run(1, 32, Mode::Named).expect("fits");
        assert_eq!((s.n, s.e), (64, 32));
        assert!(Shape::for_run(65_537, 2, Mode::Counting).is_err());
        assert!(Shape::for_run(64, 33, Mode::Named).is_err());
    }
}
