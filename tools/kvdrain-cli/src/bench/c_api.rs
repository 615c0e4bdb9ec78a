//! `kvdrain bench c-api`: what a notification costs through the C ABI, next to the Rust
//! API, on one stream in one run.
//!
//! The C side calls the `extern "C"` functions of `kvdrain-ffi` (`kvdrain_ingest_feed`,
//! `kvdrain_engine_poll`, `kvdrain_engine_register`) from Rust: the same machine code a C
//! or C++ engine calls, with the same argument passing, handle checks, panic boundary,
//! ticket table and decision copies, and none of a C harness's own differences (compiler,
//! loop code). The loop is the one of `bench ingest`: per message one feed; on `DECIDED`
//! a poll into a 16-entry array and the re-registration of each request whose blocks came
//! back, so R stay in flight.
//!
//! Three implementations run interleaved, rep by rep, on one thread:
//! * `c-api`: `kvdrain-ffi`'s one instantiation, `Ledger<65536, 8>`, capacity R;
//! * `rust-same-ledger`: the Rust API on `Ledger<65536, 8>`: the C ABI's own cost is the
//!   ratio of these two (the target: within 10 %);
//! * `rust-fitted`: the Rust API on the ledger `bench ingest` picks for R (e.g.
//!   `Ledger<4096, 8>`): what the fixed instantiation costs on top.
//!
//! Both Rust passes drive the halves of `Ledger::split`, as the C ABI does (its handles are
//! split halves), not `Ledger`'s one-thread shortcut: the ratio is the ABI's cost alone.

use std::hint::black_box;
use std::mem::MaybeUninit;

use kvdrain_ffi::{
    kvdrain_config, kvdrain_config_default, kvdrain_decision, kvdrain_decision_kind,
    kvdrain_engine, kvdrain_engine_free, kvdrain_engine_poll, kvdrain_engine_register,
    kvdrain_ingest, kvdrain_ingest_feed, kvdrain_ingest_free, kvdrain_ledger, kvdrain_ledger_free,
    kvdrain_ledger_new, kvdrain_ledger_split, kvdrain_notice, kvdrain_registration, kvdrain_status,
};

use super::args::CApiArgs;
use super::ingest::{self, Inputs, Mode, Pass, Shape, Workload};
use super::stream::Stream;
use super::{Clock, Failure, Line, Spread, alloc, num, on_big_stack, stack_for};

/// The three handles of one C-API ledger, freed on drop.
struct Handles {
    ledger: *mut kvdrain_ledger,
    ingest: *mut kvdrain_ingest,
    engine: *mut kvdrain_engine,
}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: each handle came from `kvdrain_ledger_new`/`_split` and is freed once.
        unsafe {
            kvdrain_ingest_free(self.ingest);
            kvdrain_engine_free(self.engine);
            kvdrain_ledger_free(self.ledger);
        }
    }
}

fn ok(status: kvdrain_status, what: &str) -> Result<(), Failure> {
    if status == kvdrain_status::KVDRAIN_OK {
        Ok(())
    } else {
        Err(Failure::Check(format!("{what}: {status:?}")))
    }
}

impl Handles {
    fn open(capacity: usize) -> Result<Handles, Failure> {
        let capacity = u32::try_from(capacity)
            .map_err(|_| Failure::Usage(format!("capacity {capacity} too large")))?;
        let mut config = MaybeUninit::<kvdrain_config>::uninit();
        let mut h = Handles {
            ledger: std::ptr::null_mut(),
            ingest: std::ptr::null_mut(),
            engine: std::ptr::null_mut(),
        };
        // SAFETY: every out-pointer is valid for its write; the config is initialised by
        // `kvdrain_config_default` before it is read.
        unsafe {
            ok(
                kvdrain_config_default(capacity, config.as_mut_ptr()),
                "kvdrain_config_default",
            )?;
            // As `bench ingest`: a failed request's blocks come back with its decision, so
            // the stream can re-register it at once (settling is an advance-time cost).
            (*config.as_mut_ptr()).settle_ms = 0;
            ok(
                kvdrain_ledger_new(config.as_ptr(), &mut h.ledger),
                "kvdrain_ledger_new",
            )?;
            ok(
                kvdrain_ledger_split(h.ledger, &mut h.ingest, &mut h.engine),
                "kvdrain_ledger_split",
            )?;
        }
        Ok(h)
    }
}

/// What a registration of request `i` waits for.
#[derive(Clone, Copy)]
struct Expectation<'a> {
    count: u32,
    agents: &'a [u16],
}

fn register(engine: *mut kvdrain_engine, id: &str, i: u64, e: Expectation<'_>) -> bool {
    let r = kvdrain_registration {
        id: id.as_ptr(),
        id_len: id.len(),
        blocks: i,
        count: e.count,
        agents: e.agents.as_ptr(),
        agents_len: e.agents.len(),
        deadline_ms: 0,
    };
    // SAFETY: `engine` is live; `r`'s spans borrow `id` and `e.agents` for the call.
    let status = unsafe { kvdrain_engine_register(engine, &r, std::ptr::null_mut()) };
    status == kvdrain_status::KVDRAIN_OK
}

/// One timed repetition through the C ABI.
fn c_pass(w: &Workload<'_>) -> Result<Pass, Failure> {
    let edges = w.params.edges;
    let agents: Vec<u16> = (0..edges as u16).collect();
    let expect = match w.mode {
        Mode::Counting => Expectation {
            count: edges as u32,
            agents: &[],
        },
        Mode::Named => Expectation {
            count: 0,
            agents: &agents,
        },
    };
    let h = Handles::open(w.params.inflight)?;
    let mut refused = 0;
    for (i, id) in w.ids.iter().enumerate() {
        refused += u64::from(!register(h.engine, id, i as u64, expect));
    }
    let before = alloc::allocations();
    let clock = Clock::start();
    let mut tally = drive(black_box(&h), w.stream, w.ids, expect, edges);
    let elapsed = clock.per(w.stream.len());
    let allocations = alloc::allocations() - before;
    tally.anomalies += refused;
    Ok(Pass {
        ns_per_notification: elapsed.wall,
        cpu_ns_per_notification: elapsed.cpu,
        allocations,
        ..tally
    })
}

/// The timed loop (not inlined, so profilers can single it out).
#[inline(never)]
fn drive(
    h: &Handles,
    stream: &Stream,
    ids: &[String],
    expect: Expectation<'_>,
    edges: usize,
) -> Pass {
    let mut t = Pass::default();
    let mut edge = 0usize;
    let mut out = [MaybeUninit::<kvdrain_decision>::uninit(); 16];
    for msg in stream.iter() {
        let agent = edge as u16;
        edge += 1;
        if edge == edges {
            edge = 0;
        }
        let mut outcome = MaybeUninit::<kvdrain_notice>::uninit();
        // SAFETY: the ingest handle is live; `msg` is readable for its length; `outcome`
        // is valid for a write.
        let status = unsafe {
            kvdrain_ingest_feed(
                h.ingest,
                agent,
                msg.as_ptr(),
                msg.len(),
                outcome.as_mut_ptr(),
            )
        };
        if status != kvdrain_status::KVDRAIN_OK {
            t.anomalies += 1;
            continue;
        }
        // SAFETY: written by the successful call.
        match unsafe { outcome.assume_init() } {
            kvdrain_notice::KVDRAIN_NOTICE_COUNTED => {}
            kvdrain_notice::KVDRAIN_NOTICE_DECIDED => loop {
                let mut n = out.len();
                // SAFETY: the engine handle is live; `out` has room for `n` decisions.
                let status =
                    unsafe { kvdrain_engine_poll(h.engine, out.as_mut_ptr().cast(), &mut n) };
                if status != kvdrain_status::KVDRAIN_OK {
                    t.anomalies += 1;
                    break;
                }
                for d in &out[..n] {
                    // SAFETY: the first `n` entries were written by the poll.
                    let d = unsafe { d.assume_init() };
                    match d.kind {
                        kvdrain_decision_kind::KVDRAIN_COMPLETED
                        | kvdrain_decision_kind::KVDRAIN_RELEASED => {
                            t.decided += 1;
                            let i = d.blocks;
                            t.anomalies +=
                                u64::from(!register(h.engine, &ids[i as usize], i, expect));
                        }
                        kvdrain_decision_kind::KVDRAIN_FAILED => t.failed += 1,
                        kvdrain_decision_kind::KVDRAIN_EXPIRED => t.anomalies += 1,
                    }
                }
                if n < out.len() {
                    break;
                }
            },
            _ => t.ignored += 1,
        }
    }
    t
}

/// `kvdrain bench c-api`.
pub fn main(args: &CApiArgs) -> Result<(), Failure> {
    let params = args.ingest.stream.params();
    let mode = Mode::from(args.ingest.mode);
    let reps = args.ingest.reps;
    let target = args.target;
    if params.inflight > kvdrain_ffi::KVDRAIN_MAX_CAPACITY as usize {
        return Err(Failure::Usage(format!(
            "--inflight {}: the C ABI's ledger holds at most {}",
            params.inflight,
            kvdrain_ffi::KVDRAIN_MAX_CAPACITY
        )));
    }
    if mode == Mode::Named && params.edges > kvdrain_ffi::KVDRAIN_MAX_EDGES as usize {
        return Err(Failure::Usage(format!(
            "--edges {}: named mode through the C ABI allows at most {}",
            params.edges,
            kvdrain_ffi::KVDRAIN_MAX_EDGES
        )));
    }
    let same = ingest::shape::<65_536, 8>();
    let fitted = Shape::for_run(params.inflight, params.edges, mode)?;
    let counting = alloc::counting();
    let inputs = Inputs::generate(&params);
    let w = inputs.workload(&params, mode);

    let stack = stack_for(same.bytes.max(fitted.bytes));
    let progress = crate::progress::bar(reps as u64, "reps");
    let (c, rs, rf) = on_big_stack(stack, || -> Result<_, Failure> {
        let (mut c, mut rs, mut rf) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..reps {
            progress.inc(1);
            if rep % 2 == 0 {
                c.push(c_pass(&w)?);
                rs.push(same.pass_halves(&w));
            } else {
                rs.push(same.pass_halves(&w));
                c.push(c_pass(&w)?);
            }
            rf.push(fitted.pass_halves(&w));
        }
        Ok((c, rs, rf))
    })??;
    progress.finish_and_clear();
    ingest::check("c-api", &w, &c, counting)?;
    ingest::check("rust-same-ledger", &w, &rs, counting)?;
    ingest::check("rust-fitted", &w, &rf, counting)?;

    for (label, passes, ledger) in [
        ("c-api", &c, same.name()),
        ("rust-same-ledger", &rs, same.name()),
        ("rust-fitted", &rf, fitted.name()),
    ] {
        let (mut line, _) = ingest::json_line(label, &w, passes, counting);
        line.put("ledger", ledger).print();
    }

    let median = |passes: &[Pass]| ingest::Spreads::of(passes).cpu.median;
    let paired = |a: &[Pass], b: &[Pass]| {
        let ratios: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(x, y)| x.cpu_ns_per_notification / y.cpu_ns_per_notification)
            .collect();
        Spread::of(&ratios)
    };
    let abi = paired(&c, &rs);
    let total = paired(&c, &rf);
    let mut line = Line::new();
    line.put(
        "compare",
        format!(
            "c-api vs rust R={} E={} M={} mode={}",
            params.inflight,
            params.edges,
            params.notifications,
            mode.name()
        ),
    );
    for (key, value) in [
        ("c_api_cpu_ns", median(&c)),
        ("rust_same_ledger_cpu_ns", median(&rs)),
        ("rust_fitted_cpu_ns", median(&rf)),
        ("c_over_rust", median(&c) / median(&rs)),
        ("c_over_rust_paired", abi.median),
        ("c_over_rust_paired_min", abi.min),
        ("c_over_rust_paired_max", abi.max),
        ("c_over_rust_fitted", median(&c) / median(&rf)),
        ("c_over_rust_fitted_paired", total.median),
        ("target", target),
    ] {
        line.put(key, num(value));
    }
    line.put("target_met", abi.median <= target).print();
    Ok(())
}
