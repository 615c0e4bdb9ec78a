//! `kvdrain-floor`: times [`Floor::notify`] over the shared benchmark stream.
//!
//! Same flags and message generation as `bench/vllm_baseline.py`; prints one JSON line
//! with the median ns per notification over `--reps` passes of all M messages, and the
//! number of heap allocations made during the timed passes (counted by a wrapping
//! global allocator; it must be 0).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kvdrain_floor::Floor;
use kvdrain_floor::stream::{self, DEFAULT_SEED, Params};

/// Counts `alloc`, `alloc_zeroed` and `realloc` calls, then defers to [`System`].
struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged;
// the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[derive(Debug)]
struct Args {
    params: Params,
    reps: usize,
    dump_stream: bool,
}

const USAGE: &str = "usage: kvdrain-floor --inflight R --edges E --notifications M \
[--fail-share 0.01] [--reps 5] [--seed S] [--dump-stream]";

fn parse_u64(flag: &str, text: &str) -> Result<u64, String> {
    let clean: String = text.chars().filter(|&c| c != '_').collect();
    let parsed = if let Some(hex) = clean
        .strip_prefix("0x")
        .or_else(|| clean.strip_prefix("0X"))
    {
        u64::from_str_radix(hex, 16)
    } else {
        clean.parse()
    };
    parsed.map_err(|e| format!("{flag}: invalid number {text:?}: {e}"))
}

fn parse_args() -> Result<Args, String> {
    let mut inflight = None;
    let mut edges = None;
    let mut notifications = None;
    let mut fail_share = 0.01f64;
    let mut reps = 5usize;
    let mut seed = DEFAULT_SEED;
    let mut dump_stream = false;

    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        if flag == "--dump-stream" {
            dump_stream = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_owned());
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?,
        };
        match flag.as_str() {
            "--inflight" => inflight = Some(parse_u64(&flag, &value)? as usize),
            "--edges" => edges = Some(parse_u64(&flag, &value)? as usize),
            "--notifications" => notifications = Some(parse_u64(&flag, &value)? as usize),
            "--reps" => reps = parse_u64(&flag, &value)? as usize,
            "--seed" => seed = parse_u64(&flag, &value)?,
            "--fail-share" => {
                fail_share = value
                    .parse()
                    .map_err(|e| format!("--fail-share: invalid number {value:?}: {e}"))?;
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    let missing = |name: &str| format!("{name} is required\n{USAGE}");
    let params = Params {
        inflight: inflight.ok_or_else(|| missing("--inflight"))?,
        edges: edges.ok_or_else(|| missing("--edges"))?,
        notifications: notifications.ok_or_else(|| missing("--notifications"))?,
        fail_share,
        seed,
    };
    if params.inflight == 0 || params.edges == 0 || params.notifications == 0 || reps == 0 {
        return Err("--inflight, --edges, --notifications and --reps must be >= 1".to_owned());
    }
    if params.edges > u32::MAX as usize {
        return Err("--edges must fit in u32".to_owned());
    }
    if !(0.0..=1.0).contains(&fail_share) {
        return Err("--fail-share must be within [0, 1]".to_owned());
    }
    Ok(Args {
        params,
        reps,
        dump_stream,
    })
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let p = args.params;
    let msgs = stream::generate(&p);

    if args.dump_stream {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for m in msgs.iter() {
            if out
                .write_all(m)
                .and_then(|()| out.write_all(b"\n"))
                .is_err()
            {
                return ExitCode::FAILURE;
            }
        }
        return if out.flush().is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }

    let ids: Vec<String> = (0..p.inflight).map(stream::request_id).collect();
    let mut samples = Vec::with_capacity(args.reps);
    let mut allocations = 0u64;
    for _ in 0..args.reps {
        let mut floor = Floor::with_capacity(p.inflight);
        for id in &ids {
            floor.register(id.as_bytes(), p.edges as u32);
        }
        let floor = black_box(&mut floor);

        let allocs_before = ALLOCATIONS.load(Ordering::Relaxed);
        let start = Instant::now();
        let mut completed = 0u64;
        for msg in msgs.iter() {
            completed += u64::from(black_box(floor.notify(msg)));
        }
        let elapsed = start.elapsed();
        allocations += ALLOCATIONS.load(Ordering::Relaxed) - allocs_before;

        black_box(completed);
        samples.push(elapsed.as_nanos() as f64 / p.notifications as f64);
    }

    println!(
        "{{\"impl\":\"rust-floor\",\"ns_per_notification\":{:.2},\"notifications\":{},\
\"inflight\":{},\"edges\":{},\"reps\":{},\"allocations\":{}}}",
        median(&mut samples),
        p.notifications,
        p.inflight,
        p.edges,
        args.reps,
        allocations
    );
    if allocations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
