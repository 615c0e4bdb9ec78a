//! `Ledger`'s own methods take a shortcut the split halves do not: holding `&mut Ledger`,
//! a notice skips the lookup's second read of the state word and resolves its edge with
//! plain stores instead of a CAS. The shortcut must change nothing but the cost: the same
//! random run of registrations, notices (completions, failure notices, duplicates,
//! strangers, unknown ids, garbage), aborts, fences, gones and clock steps, driven once through
//! `Ledger`'s methods and once through `split`'s halves on the same thread, gives the same
//! outcome for every call and the same counters.
#![cfg(not(kvdrain_loom))]

use kvdrain::{AgentId, BlockHandle, Config, Duration, Expect, Instant, Ledger, Registration};

type L = Ledger<16, 4>;

const AGENTS: [AgentId; 3] = [AgentId(0), AgentId(1), AgentId(2)];

fn ledger() -> L {
    Ledger::new(Config {
        capacity: 12,
        deadline: Duration::from_millis(60),
        quarantine: Duration::from_millis(40),
        settle: Duration::from_millis(15),
        seed: 7,
    })
}

/// xorshift64*: a fixed, dependency-free stream of choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % below
    }
}

/// One step of the run, the same for both ledgers.
enum Step {
    Register {
        id: String,
        expect: u8,
        deadline: Option<u64>,
    },
    Notice {
        agent: AgentId,
        bytes: Vec<u8>,
    },
    Abort(String),
    Fence(AgentId),
    Gone(AgentId),
    Advance(u64),
}

fn steps(seed: u64, len: usize) -> Vec<Step> {
    let mut rng = Rng(seed | 1);
    let mut now = 0;
    let id = |rng: &mut Rng| format!("req-{}", rng.next(20));
    (0..len)
        .map(|_| match rng.next(100) {
            0..=19 => Step::Register {
                id: id(&mut rng),
                // 0..=2: Count(1..=3); 3, 4: two or three named edges.
                expect: rng.next(5) as u8,
                deadline: (rng.next(3) == 0).then(|| rng.next(100)),
            },
            20..=79 => {
                let agent = AgentId(rng.next(4) as u16);
                let bytes = match rng.next(20) {
                    0 => b"req-\xff:2".to_vec(),
                    1 => b"HB:req-1".to_vec(),
                    2 => b"nonsense".to_vec(),
                    3..=5 => format!("PUSH_FAIL:{}:2", id(&mut rng)).into_bytes(),
                    _ => format!("{}:2", id(&mut rng)).into_bytes(),
                };
                Step::Notice { agent, bytes }
            }
            80..=86 => Step::Abort(id(&mut rng)),
            87..=88 => Step::Fence(AgentId(rng.next(4) as u16)),
            89..=90 => Step::Gone(AgentId(rng.next(4) as u16)),
            _ => {
                now += rng.next(30);
                Step::Advance(now)
            }
        })
        .collect()
}

fn registration<'a>(id: &'a str, expect: u8, deadline: Option<u64>) -> Registration<'a> {
    Registration {
        id,
        blocks: BlockHandle(u64::from(expect)),
        expect: match expect {
            0..=2 => Expect::Count(expect + 1),
            3 => Expect::Edges(&AGENTS[..2]),
            _ => Expect::Edges(&AGENTS),
        },
        deadline: deadline.map(Duration::from_millis),
    }
}

/// Runs `$steps` with notices fed to `$ingest` and everything else to `$engine` (the same
/// ledger, or its two halves), logging every outcome and decision, one line each.
macro_rules! run {
    ($ingest:ident, $engine:ident, $steps:expr, $log:ident) => {
        for step in $steps {
            match step {
                Step::Register {
                    id,
                    expect,
                    deadline,
                } => {
                    let r = $engine.register(registration(id, *expect, *deadline));
                    $log.push(format!("register {:?}", r.map_err(|e| e.kind)));
                }
                Step::Notice { agent, bytes } => {
                    let r = $ingest.handle_notification(*agent, bytes);
                    $log.push(format!("notice {r:?}"));
                }
                Step::Abort(id) => $log.push(format!("abort {:?}", $engine.abort_id(id))),
                Step::Fence(agent) => $log.push(format!("fence {}", $engine.fence(*agent))),
                Step::Gone(agent) => $log.push(format!("gone {}", $engine.gone(*agent))),
                Step::Advance(now) => $log.push(format!(
                    "advance {:?}",
                    $engine.advance(Instant::from_millis(*now))
                )),
            }
            for d in $engine.decisions() {
                $log.push(format!("decision {d:?}"));
            }
        }
    };
}

/// The run through `Ledger`'s methods.
fn through_ledger(steps: &[Step]) -> Vec<String> {
    let mut l = ledger();
    let mut log = Vec::new();
    run!(l, l, steps, log);
    log.push(format!("counters {:?}", l.counters()));
    log
}

/// The same run through the split halves, on this thread.
fn through_halves(steps: &[Step]) -> Vec<String> {
    let mut l = ledger();
    let mut log = Vec::new();
    {
        let (mut ingest, mut engine) = l.split();
        run!(ingest, engine, steps, log);
    }
    log.push(format!("counters {:?}", l.counters()));
    log
}

#[test]
fn the_one_thread_shortcut_changes_no_outcome() {
    let runs = if cfg!(miri) { 3 } else { 300 };
    let mut gone_resolved = false;
    for seed in 0..runs {
        let steps = steps(0x9E37_79B9_7F4A_7C15 ^ seed, 400);
        let (alone, split) = (through_ledger(&steps), through_halves(&steps));
        if alone != split {
            let at = alone
                .iter()
                .zip(&split)
                .position(|(a, b)| a != b)
                .unwrap_or(alone.len().min(split.len()));
            panic!(
                "seed {seed}: first difference at line {at}:\n  ledger: {:?}\n  halves: {:?}",
                alone.get(at),
                split.get(at)
            );
        }
        gone_resolved |= alone
            .iter()
            .any(|line| line == "gone 1" || line == "gone 2");
        // The run exercises what it claims to: decisions of every kind and ignored notices.
        if seed == 0 {
            for what in [
                "Completed",
                "Failed",
                "Released",
                "Expired",
                "Duplicate",
                "Late",
            ] {
                assert!(
                    alone.iter().any(|line| line.contains(what)),
                    "no {what} in the run"
                );
            }
        }
    }
    assert!(gone_resolved, "no `gone` resolved an edge in any run");
}
