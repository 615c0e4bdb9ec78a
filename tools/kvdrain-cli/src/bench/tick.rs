//! `kvdrain bench tick`: what one clock [`advance`](kvdrain::Ledger::advance) costs with
//! many requests in flight and few expiring.
//!
//! R requests are registered (counting mode, 2 notices each, none ever arrives); X·T of
//! them, spread evenly over registration order, get deadlines 1 … T ms so that exactly X
//! expire at each tick; the rest never expire within the run, and the quarantine is long
//! enough that no forced release happens. Timed: T advances of 1 ms that each expire X
//! requests (`busy`), then T advances with nothing due (`idle`).

use std::hint::black_box;

use kvdrain::{BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration};

use super::args::TickArgs;
use super::stream;
use super::{
    Clock, Elapsed, Failure, Line, Spread, alloc, num, on_big_stack, put_allocations, stack_for,
};

#[derive(Debug)]
struct TickWork<'a> {
    inflight: usize,
    expiring: usize,
    ticks: usize,
    ids: &'a [String],
}

#[derive(Clone, Copy, Debug, Default)]
struct TickPass {
    busy: Elapsed,
    idle: Elapsed,
    expired: u64,
    other: u64,
    allocations: u64,
}

type TickFn = fn(&TickWork<'_>) -> TickPass;

fn tick_pass<const N: usize>(w: &TickWork<'_>) -> TickPass {
    const NEVER: u64 = 1 << 40;
    let mut ledger: Ledger<N, 8> = Ledger::new(Config {
        quarantine: Duration::from_millis(NEVER),
        ..Config::with_capacity(N)
    });
    let due = w.expiring * w.ticks;
    let stride = w.inflight / due;
    let mut other = 0;
    for (i, id) in w.ids.iter().enumerate() {
        let deadline_ms = if i % stride == 0 && i / stride < due {
            1 + (i / stride / w.expiring) as u64
        } else {
            NEVER
        };
        let registration = Registration {
            id,
            blocks: BlockHandle(i as u64),
            expect: Expect::Count(2),
            deadline: Some(Duration::from_millis(deadline_ms)),
        };
        other += u64::from(ledger.register(registration).is_err());
    }
    let ledger = black_box(&mut ledger);
    let mut expired = 0u64;
    let before = alloc::allocations();
    let clock = Clock::start();
    advance_all(ledger, 1, w.ticks as u64, &mut expired, &mut other);
    let busy = clock.per(w.ticks);
    let clock = Clock::start();
    advance_all(
        ledger,
        w.ticks as u64 + 1,
        2 * w.ticks as u64,
        &mut expired,
        &mut other,
    );
    let idle = clock.per(w.ticks);
    let allocations = alloc::allocations() - before;
    TickPass {
        busy,
        idle,
        expired,
        other,
        allocations,
    }
}

#[inline(never)]
fn advance_all<const N: usize>(
    ledger: &mut Ledger<N, 8>,
    from: u64,
    to: u64,
    expired: &mut u64,
    other: &mut u64,
) {
    for now in from..=to {
        let advanced = ledger.advance(Instant::from_millis(now));
        *other += u64::from(advanced.is_err());
        while let Some(d) = ledger.poll_decision() {
            match d {
                Decision::Expired(_) => *expired += 1,
                _ => *other += 1,
            }
        }
    }
}

macro_rules! tick_shapes {
    ($n:expr; $($size:literal)*) => {
        match $n {
            $( $size => Some((tick_pass::<$size> as TickFn, size_of::<Ledger<$size, 8>>())), )*
            _ => None,
        }
    };
}

/// `kvdrain bench tick`.
pub fn main(args: &TickArgs) -> Result<(), Failure> {
    let TickArgs {
        inflight,
        expiring,
        ticks,
        reps,
    } = *args;
    if expiring.saturating_mul(ticks) > inflight {
        return Err(Failure::Usage(
            "--expiring × --ticks must not exceed --inflight".into(),
        ));
    }
    let n = inflight.next_power_of_two().max(64);
    let (pass, bytes) = tick_shapes!(n; 64 128 256 512 1024 2048 4096 8192 16384 32768 65536)
        .ok_or_else(|| Failure::Usage(format!("--inflight {inflight}: at most 65536")))?;
    let counting = alloc::counting();
    let ids: Vec<String> = (0..inflight).map(stream::request_id).collect();
    let w = TickWork {
        inflight,
        expiring,
        ticks,
        ids: &ids,
    };
    let progress = crate::progress::bar(reps as u64, "reps");
    let passes = on_big_stack(stack_for(bytes), || {
        (0..reps)
            .map(|_| {
                let p = pass(&w);
                progress.inc(1);
                p
            })
            .collect::<Vec<_>>()
    })?;
    progress.finish_and_clear();
    let spread = |f: fn(&TickPass) -> f64| Spread::of(&passes.iter().map(f).collect::<Vec<_>>());
    let busy = spread(|p| p.busy.wall);
    let busy_cpu = spread(|p| p.busy.cpu);
    let idle = spread(|p| p.idle.wall);
    let idle_cpu = spread(|p| p.idle.cpu);
    let mut line = Line::new();
    line.put("bench", "tick")
        .put("inflight", inflight)
        .put("expiring_per_tick", expiring)
        .put("ticks", ticks)
        .put("reps", reps)
        .put("ledger", format!("Ledger<{n}, 8>"));
    busy.put(&mut line, "ns_per_advance", "ns");
    busy_cpu.put(&mut line, "cpu_ns_per_advance", "cpu_ns");
    line.put("ns_per_expiry", num(busy.median / expiring as f64))
        .put("cpu_ns_per_expiry", num(busy_cpu.median / expiring as f64));
    idle.put(&mut line, "ns_per_idle_advance", "idle_ns");
    idle_cpu.put(&mut line, "cpu_ns_per_idle_advance", "idle_cpu_ns");
    put_allocations(
        &mut line,
        counting,
        passes.iter().map(|p| p.allocations).sum(),
    );
    line.print();
    let want = (expiring * ticks) as u64;
    if let Some(p) = passes.iter().find(|p| p.expired != want || p.other != 0) {
        return Err(Failure::Check(format!(
            "tick: expired {} (want {want}), other decisions or errors {}",
            p.expired, p.other
        )));
    }
    if counting && passes.iter().any(|p| p.allocations != 0) {
        return Err(Failure::Check("tick: allocations in the timed loop".into()));
    }
    Ok(())
}
