//! The hot path allocates nothing: register, notify, poll, abort, fence, expire and settle run
//! under a counting global allocator that records every allocation made on this thread.
#![cfg(not(kvdrain_loom))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration,
};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if WATCHING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if WATCHING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
#[cfg_attr(miri, ignore = "global allocator counting is not what miri checks")]
fn hot_path_allocates_nothing() {
    // Failure notices settle (rule 8) for less than one clock step of the loop, so the
    // settle timers fire inside it too.
    let mut ledger: Ledger<64, 4> = Ledger::new(Config {
        settle: Duration::from_millis(30),
        ..Config::with_capacity(64)
    });
    let ids: Vec<String> = (0..256).map(|i| format!("cmpl-{i:08x}-0")).collect();
    let done: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| format!("{id}:2").into_bytes())
        .collect();
    let fail: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| format!("PUSH_FAIL:{id}:2").into_bytes())
        .collect();
    let agents = [AgentId(0), AgentId(1)];
    let mut decided = 0usize;

    WATCHING.with(|w| w.set(true));
    for round in 0..4u64 {
        for (i, id) in ids.iter().enumerate() {
            let expect = if i % 2 == 0 {
                Expect::Count(2)
            } else {
                Expect::Edges(&agents)
            };
            let registration = Registration {
                id,
                blocks: BlockHandle(i as u64),
                expect,
                deadline: Some(Duration::from_millis(50)),
            };
            let Ok(ticket) = ledger.register(registration) else {
                continue;
            };
            match i % 5 {
                0 => {
                    let _ = ledger.handle_notification(agents[0], &done[i]);
                    let _ = ledger.handle_notification(agents[1], &fail[i]);
                }
                1 => {
                    let _ = ledger.abort(ticket);
                    let _ = ledger.handle_notification(agents[0], &done[i]);
                    // Its decisions are pulled with the rest below.
                    let _resolved = ledger.fence(agents[1]);
                }
                2 => {
                    let _ = ledger.handle_notification(agents[0], b"\xffgarbage");
                    let _ = ledger.handle_notification(agents[0], &done[(i + 1) % ids.len()]);
                }
                _ => {
                    let _ = ledger.handle_notification(agents[0], &done[i]);
                    let _ = ledger.handle_notification(agents[1], &done[i]);
                }
            }
            for d in ledger.decisions() {
                decided += 1;
                drop::<Decision>(d);
            }
        }
        let now = ledger.now() + Duration::from_millis(40 * (round + 1));
        let _ = ledger.advance(now);
        while let Some(d) = ledger.poll_decision() {
            decided += 1;
            drop(d);
        }
    }
    let _ = ledger.advance(Instant::from_millis(1_000_000));
    decided += ledger.decisions().count();
    WATCHING.with(|w| w.set(false));

    assert_eq!(
        ALLOCATIONS.load(Ordering::Relaxed),
        0,
        "the hot path allocated"
    );
    assert!(
        decided > 250,
        "the loop exercised too little: {decided} decisions"
    );
    assert!(
        ledger.is_empty(),
        "every request reached a terminal release"
    );
}
