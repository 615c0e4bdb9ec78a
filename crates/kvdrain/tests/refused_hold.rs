//! Refused holds (`Engine::hold_refused`) against a model that keeps every hold's exact
//! end: the blocks never come back before the quarantine is over, come back less than a
//! granule after it, in the order they were held, and the ring never fills, whatever the
//! pace of refusals, advances and pulls.
#![cfg(not(kvdrain_loom))]

use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, REFUSED_HOLD_ENDS,
    RefusedHold, Registration,
};

/// xorshift64*: a fixed-seed stream, so a failure prints a seed that replays it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn ledger(quarantine_ms: u64) -> Ledger<4, 1> {
    let mut config = Config::with_capacity(1);
    config.quarantine = Duration::from_millis(quarantine_ms);
    Ledger::new(config)
}

/// One scenario: refusals at a random pace, the clock moved by random steps, and the ends
/// pulled after every advance (`eager`) or only now and then.
fn scenario(seed: u64, quarantine_ms: u64, eager: bool) {
    let mut rng = Rng(seed | 1);
    let mut led = ledger(quarantine_ms);
    let granule = RefusedHold::granule(Duration::from_millis(quarantine_ms)).millis();
    // The model: each hold's clock when it was taken and the end it was told.
    let mut held: Vec<(u64, Instant)> = Vec::new();
    let mut next_out = 0u64;
    let mut now = 0u64;
    for _ in 0..3_000 {
        match rng.below(10) {
            0..=3 => {
                for _ in 0..=rng.below(3) {
                    let hold = led.hold_refused();
                    assert_eq!(hold.number, held.len() as u64, "seed {seed}");
                    let exact = now + quarantine_ms;
                    assert!(hold.until.millis() >= exact, "seed {seed}: ends early");
                    assert!(hold.until.millis() < exact + granule, "seed {seed}: late");
                    held.push((now, hold.until));
                }
            }
            4..=7 => {
                now += match rng.below(4) {
                    0 => 0,
                    1 => rng.below(granule + 1),
                    2 => rng.below(quarantine_ms / 8 + 1),
                    _ => rng.below(2 * quarantine_ms + 1),
                };
                led.advance(Instant::from_millis(now)).expect("forward");
            }
            _ => {}
        }
        if eager || rng.below(20) == 0 {
            while let Some(out) = led.poll_refused_release() {
                assert_eq!(out.number, next_out, "seed {seed}: out of order");
                let (taken_at, until) = held[out.number as usize];
                assert!(
                    now >= taken_at + quarantine_ms,
                    "seed {seed}: released early"
                );
                if eager {
                    // Pulled at every advance: released at the end it was told, no later.
                    assert_eq!(out.until, until, "seed {seed}");
                }
                assert!(out.until.millis() <= now);
                next_out += 1;
            }
            // Everything still held is not over yet, and the next timer names the oldest.
            if let Some(&(_, until)) = held.get(next_out as usize) {
                assert!(until.millis() > now, "seed {seed}: over but not handed out");
                assert_eq!(led.next_timer(), Some(until), "seed {seed}");
            } else {
                assert_eq!(led.next_timer(), None, "seed {seed}");
            }
        }
        assert_eq!(led.refused_holds(), held.len() as u64 - next_out);
    }
}

#[test]
fn holds_end_in_order_never_early_and_less_than_a_granule_late() {
    for seed in 0..200 {
        for quarantine_ms in [0, 1, 61, 62, 1_500, 60_000] {
            scenario(seed, quarantine_ms, seed % 2 == 0);
        }
    }
}

/// Refusals at every millisecond of a quarantine, pulled only at its end: more distinct
/// ends than the ring has entries, and none is lost or early.
#[test]
fn a_refusal_every_millisecond_fits_the_ring() {
    let q = 1_000;
    let mut led = ledger(q);
    for t in 0..3 * q {
        led.advance(Instant::from_millis(t)).expect("forward");
        let hold = led.hold_refused();
        assert_eq!(hold.number, t);
    }
    let mut out = 0;
    for t in 3 * q..5 * q {
        led.advance(Instant::from_millis(t)).expect("forward");
        while let Some(r) = led.poll_refused_release() {
            assert_eq!(r.number, out);
            assert!(t >= out + q, "hold {out} released at {t}");
            out += 1;
        }
    }
    assert_eq!(out, 3 * q);
    assert!(REFUSED_HOLD_ENDS < q as usize);
}

/// A hold touches no request: the table, its decisions and its counters are as they were.
#[test]
fn a_hold_changes_no_request() {
    let mut led = ledger(100);
    let p = AgentId(0);
    let ticket = led
        .register(Registration {
            id: "r",
            blocks: BlockHandle(1),
            expect: Expect::Edges(&[p]),
            deadline: None,
        })
        .expect("room");
    let full = led.register(Registration {
        id: "s",
        blocks: BlockHandle(2),
        expect: Expect::Count(1),
        deadline: None,
    });
    assert!(full.is_err());
    let counters = led.counters();
    let hold = led.hold_refused();
    assert_eq!((hold.number, hold.until), (0, Instant::from_millis(100)));
    assert_eq!((led.len(), led.counters()), (1, counters));
    led.advance(Instant::from_millis(100)).expect("forward");
    assert_eq!(led.poll_refused_release(), Some(hold));
    assert_eq!(led.poll_decision(), None);
    let _ = led.handle_notification(p, b"r:1");
    match led.poll_decision() {
        Some(Decision::Completed(d)) => assert_eq!(d.key(), ticket.key()),
        other => panic!("unexpected {other:?}"),
    }
}
