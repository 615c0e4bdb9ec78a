//! The C ABI driven from Rust through its `extern "C"` functions, small enough for miri
//! (`make miri` runs these, checking every `unsafe` of the binding under Stacked Borrows
//! and its data-race detector). The C catalogue (`tests/catalogue.c`) covers the
//! behaviour at full size under ASan and UBSan.

use core::ptr::null_mut;
use std::mem::MaybeUninit;

use kvdrain_decision_kind::*;
use kvdrain_ffi::*;
use kvdrain_notice::*;
use kvdrain_status::*;

struct Fixture {
    ledger: *mut kvdrain_ledger,
    ingest: *mut kvdrain_ingest,
    engine: *mut kvdrain_engine,
}

impl Fixture {
    fn open(capacity: u32) -> Fixture {
        let mut config = MaybeUninit::uninit();
        let mut f = Fixture {
            ledger: null_mut(),
            ingest: null_mut(),
            engine: null_mut(),
        };
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(
                kvdrain_config_default(capacity, config.as_mut_ptr()),
                KVDRAIN_OK
            );
            let mut config = config.assume_init();
            config.deadline_ms = 100;
            config.quarantine_ms = 1000;
            // Release with the decision (vLLM's way); the C catalogue tests settling.
            config.settle_ms = 0;
            assert_eq!(kvdrain_ledger_new(&config, &mut f.ledger), KVDRAIN_OK);
            assert_eq!(
                kvdrain_ledger_split(f.ledger, &mut f.ingest, &mut f.engine),
                KVDRAIN_OK
            );
        }
        f
    }

    fn register(&self, id: &str, blocks: u64, count: u32, agents: &[u16]) -> u64 {
        let r = kvdrain_registration {
            id: id.as_ptr(),
            id_len: id.len(),
            blocks,
            count,
            agents: agents.as_ptr(),
            agents_len: agents.len(),
            deadline_ms: 0,
        };
        let mut key = u64::MAX;
        // SAFETY: live handle; `r` borrows `id` and `agents` for the call.
        assert_eq!(
            unsafe { kvdrain_engine_register(self.engine, &r, &mut key) },
            KVDRAIN_OK
        );
        key
    }

    fn feed(&self, agent: u16, msg: &str) -> kvdrain_notice {
        feed(self.ingest, agent, msg)
    }

    fn poll(&self) -> Vec<kvdrain_decision> {
        poll(self.engine, 2)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SAFETY: each handle freed once.
        unsafe {
            kvdrain_engine_free(self.engine);
            kvdrain_ledger_free(self.ledger);
            kvdrain_ingest_free(self.ingest);
        }
    }
}

fn feed(ingest: *mut kvdrain_ingest, agent: u16, msg: &str) -> kvdrain_notice {
    let mut outcome = MaybeUninit::uninit();
    // SAFETY: live handle; `msg` readable; `outcome` writable.
    unsafe {
        assert_eq!(
            kvdrain_ingest_feed(ingest, agent, msg.as_ptr(), msg.len(), outcome.as_mut_ptr()),
            KVDRAIN_OK
        );
        outcome.assume_init()
    }
}

/// Every waiting decision, taken out `room` at a time into uninitialised memory.
fn poll(engine: *mut kvdrain_engine, room: usize) -> Vec<kvdrain_decision> {
    let mut all = Vec::new();
    loop {
        let mut buf: Vec<MaybeUninit<kvdrain_decision>> = Vec::with_capacity(room);
        buf.resize_with(room, MaybeUninit::uninit);
        let mut n = room;
        // SAFETY: live handle; `buf` has room for `n` decisions.
        assert_eq!(
            unsafe { kvdrain_engine_poll(engine, buf.as_mut_ptr().cast(), &mut n) },
            KVDRAIN_OK
        );
        // SAFETY: the first `n` entries were written.
        all.extend(buf[..n].iter().map(|d| unsafe { d.assume_init() }));
        if n < room {
            return all;
        }
    }
}

#[test]
fn the_catalogue_in_brief() {
    let f = Fixture::open(4);
    // C2, failure first: waits for the sibling, then FAILED and RELEASED.
    let a = f.register("a", 10, 0, &[0, 1]);
    assert_eq!(f.feed(1, "PUSH_FAIL:a:2"), KVDRAIN_NOTICE_COUNTED);
    assert!(f.poll().is_empty());
    assert_eq!(f.feed(0, "a:2"), KVDRAIN_NOTICE_DECIDED);
    let d = f.poll();
    assert_eq!(d.len(), 2);
    assert_eq!((d[0].kind, d[0].key), (KVDRAIN_FAILED, a));
    assert_eq!((d[1].kind, d[1].blocks), (KVDRAIN_RELEASED, 10));
    // Garbage, unknown, duplicate.
    let b = f.register("b", 11, 0, &[0, 1]);
    assert_eq!(f.feed(0, "junk"), KVDRAIN_IGNORED_MALFORMED);
    assert_eq!(f.feed(0, "zz:2"), KVDRAIN_IGNORED_UNKNOWN);
    assert_eq!(f.feed(0, "b:2"), KVDRAIN_NOTICE_COUNTED);
    assert_eq!(f.feed(0, "b:2"), KVDRAIN_IGNORED_DUPLICATE);
    // Abort, then a stale key, then the late notice releases.
    let mut q = MaybeUninit::uninit();
    // SAFETY: live handle; `q` writable.
    unsafe {
        assert_eq!(
            kvdrain_engine_abort(f.engine, b, q.as_mut_ptr()),
            KVDRAIN_OK
        );
        assert_eq!(q.assume_init().outstanding, 0b10);
        assert_eq!(
            kvdrain_engine_abort(f.engine, b, null_mut()),
            KVDRAIN_ERR_STALE
        );
        // A key above every key issued (keys carry their slot in their low 16 bits:
        // the next registration's sequence number, shifted, is such a key).
        assert_eq!(
            kvdrain_engine_abort(f.engine, (b | 0xFFFF) + 1, null_mut()),
            KVDRAIN_ERR_UNKNOWN
        );
    }
    assert_eq!(f.feed(1, "b:2"), KVDRAIN_NOTICE_DECIDED);
    assert_eq!(f.poll()[0].kind, KVDRAIN_RELEASED);
    // Deadline, fence, full table.
    let c = f.register("c", 12, 2, &[]);
    let e = f.register("e", 13, 0, &[5, 6]);
    for id in ["x", "y"] {
        f.register(id, 0, 1, &[]);
    }
    let r = kvdrain_registration {
        id: "z".as_ptr(),
        id_len: 1,
        blocks: 0,
        count: 1,
        agents: core::ptr::null(),
        agents_len: 0,
        deadline_ms: 0,
    };
    let mut resolved = 0;
    // SAFETY: live handles; valid pointers.
    unsafe {
        assert_eq!(
            kvdrain_engine_register(f.engine, &r, null_mut()),
            KVDRAIN_ERR_FULL
        );
        assert_eq!(kvdrain_engine_fence(f.engine, 6, &mut resolved), KVDRAIN_OK);
        assert_eq!(kvdrain_engine_advance(f.engine, 100), KVDRAIN_OK);
        assert_eq!(
            kvdrain_engine_advance(f.engine, 99),
            KVDRAIN_ERR_CLOCK_BACKWARDS
        );
    }
    assert_eq!(resolved, 1);
    let kinds: Vec<_> = f.poll().iter().map(|d| (d.kind, d.key)).collect();
    assert!(kinds.contains(&(KVDRAIN_EXPIRED, c)));
    assert!(kinds.contains(&(KVDRAIN_EXPIRED, e)));
}

/// Raw handles moved to the ingest thread (they are plain pointers to C).
struct SendPtr<T>(T);
// SAFETY: the ingest handle may be used from another thread, one call at a time (its
// documented contract); only that thread uses it.
unsafe impl<T> Send for SendPtr<T> {}

/// The two halves on two threads at once: every request decided once (miri's data-race
/// detector watches the binding's cells and the core's atomics).
#[test]
fn two_threads_decide_each_request_once() {
    let requests: u64 = if cfg!(miri) { 24 } else { 2000 };
    let f = Fixture::open(8);
    let ingest = SendPtr(f.ingest);
    let registered = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        let registered = &registered;
        s.spawn(move || {
            let ingest = ingest;
            let mut fed = 0;
            while fed < requests {
                let ready = registered.load(std::sync::atomic::Ordering::Acquire);
                if ready == fed {
                    std::thread::yield_now();
                    continue;
                }
                for i in fed..ready {
                    assert_eq!(
                        feed(ingest.0, 0, &format!("r{i}:2")),
                        KVDRAIN_NOTICE_COUNTED
                    );
                    assert_eq!(
                        feed(ingest.0, 1, &format!("r{i}:2")),
                        KVDRAIN_NOTICE_DECIDED
                    );
                }
                fed = ready;
            }
        });
        // Each request's blocks are its number; its key is whatever register returned.
        let mut keys = vec![u64::MAX; requests as usize];
        let mut seen = vec![false; requests as usize];
        let (mut next, mut done) = (0, 0);
        while done < requests {
            while next < requests && next - done < 8 {
                keys[next as usize] = f.register(&format!("r{next}"), next, 0, &[0, 1]);
                next += 1;
                registered.store(next, std::sync::atomic::Ordering::Release);
            }
            for d in poll(f.engine, 3) {
                assert_eq!(d.kind, KVDRAIN_COMPLETED);
                assert_eq!(keys[d.blocks as usize], d.key);
                assert!(!std::mem::replace(&mut seen[d.blocks as usize], true));
                done += 1;
            }
            std::thread::yield_now();
        }
    });
}

/// A push plan's outcomes through the ABI: a write of unknown status owes nothing and
/// keeps the plan non-terminal; a backend error owes one notice; a never-posted edge is
/// owed at once; a write that lands after its status was unknown owes nothing.
#[test]
fn producer_outcomes_through_the_abi() {
    let topology = kvdrain_topology {
        p_tp: 1,
        p_pp: 1,
        d_tp: 4,
        mla: 0,
    };
    let mut plan = null_mut();
    let mut owed = [MaybeUninit::<kvdrain_owed_notice>::uninit(); 4];
    // SAFETY: valid pointers throughout; the plan is freed once at the end.
    unsafe {
        assert_eq!(
            kvdrain_push_plan_new(&topology, 0, 0, &mut plan),
            KVDRAIN_OK
        );
        for d_rank in 0..3 {
            assert_eq!(kvdrain_push_plan_posted(plan, d_rank), KVDRAIN_OK);
        }
        assert_eq!(kvdrain_push_plan_status_unknown(plan, 0), KVDRAIN_OK);
        assert_eq!(kvdrain_push_plan_status_unknown(plan, 1), KVDRAIN_OK);
        assert_eq!(kvdrain_push_plan_backend_error(plan, 2), KVDRAIN_OK);
        assert_eq!(kvdrain_push_plan_retire(plan), KVDRAIN_OK); // rank 3: never posted
        let mut n = owed.len();
        assert_eq!(
            kvdrain_push_plan_owed(plan, owed.as_mut_ptr().cast(), &mut n),
            KVDRAIN_OK
        );
        let owed: Vec<(u16, u8)> = owed[..n]
            .iter()
            .map(|o| {
                let o = o.assume_init();
                (o.d_rank, o.posted)
            })
            .collect();
        assert_eq!(owed, [(2, 1), (3, 0)]);
        let mut state = kvdrain_edge_state::KVDRAIN_EDGE_PLANNED;
        assert_eq!(
            kvdrain_push_plan_edge_state(plan, 0, &mut state),
            KVDRAIN_OK
        );
        assert_eq!(state, kvdrain_edge_state::KVDRAIN_EDGE_UNKNOWN);
        let (mut terminal, mut all_landed) = (true, true);
        assert_eq!(
            kvdrain_push_plan_state(plan, &mut terminal, &mut all_landed),
            KVDRAIN_OK
        );
        assert!(!terminal && !all_landed);
        assert_eq!(kvdrain_push_plan_landed_after_unknown(plan, 0), KVDRAIN_OK);
        assert_eq!(kvdrain_push_plan_backend_error(plan, 1), KVDRAIN_OK);
        assert_eq!(
            kvdrain_push_plan_state(plan, &mut terminal, null_mut()),
            KVDRAIN_OK
        );
        assert!(terminal);
        assert_eq!(
            kvdrain_push_plan_edge_state(plan, 9, &mut state),
            KVDRAIN_ERR_UNKNOWN
        );
        kvdrain_push_plan_free(plan);
    }
}

/// The record of each decision, read by key right after the poll that took it: a named
/// request failed by a notice and a fence, an expired counting request, and the errors
/// (NULL out, an unknown key, a key whose slot holds a later request).
#[test]
fn records_of_the_decisions_just_polled() {
    use kvdrain_failure_cause::*;
    use kvdrain_record_edge_outcome::*;
    use kvdrain_record_ended::*;

    let f = Fixture::open(2);
    let record = |key: u64| {
        let mut out = MaybeUninit::<kvdrain_record>::uninit();
        // SAFETY: live handle; `out` writable.
        let status = unsafe { kvdrain_engine_record(f.engine, key, out.as_mut_ptr()) };
        // SAFETY: written when the status is OK.
        (status == KVDRAIN_OK).then(|| unsafe { out.assume_init() })
    };
    // SAFETY: live handle.
    assert_eq!(unsafe { kvdrain_engine_advance(f.engine, 5) }, KVDRAIN_OK);
    let a = f.register("a", 10, 0, &[3, 4, 5]);
    let c = f.register("c", 11, 2, &[]);
    assert_eq!(f.feed(3, "a:3"), KVDRAIN_NOTICE_COUNTED);
    assert_eq!(f.feed(7, "c:1"), KVDRAIN_NOTICE_COUNTED);
    let mut resolved = 0;
    // SAFETY: live handle; valid pointers.
    unsafe {
        assert_eq!(kvdrain_engine_advance(f.engine, 20), KVDRAIN_OK);
        assert_eq!(kvdrain_ingest_set_arrival(f.ingest, 20), KVDRAIN_OK);
    }
    assert_eq!(f.feed(4, "PUSH_FAIL:a:3"), KVDRAIN_NOTICE_COUNTED);
    // SAFETY: live handle; valid pointers.
    unsafe {
        assert_eq!(kvdrain_engine_advance(f.engine, 30), KVDRAIN_OK);
        assert_eq!(kvdrain_engine_fence(f.engine, 5, &mut resolved), KVDRAIN_OK);
        assert_eq!(kvdrain_engine_advance(f.engine, 105), KVDRAIN_OK);
    }
    assert_eq!(resolved, 1);
    let decided: Vec<_> = f.poll().iter().map(|d| (d.kind, d.key)).collect();
    assert_eq!(
        decided,
        [
            (KVDRAIN_FAILED, a),
            (KVDRAIN_RELEASED, a),
            (KVDRAIN_EXPIRED, c)
        ]
    );

    let ra = record(a).expect("a's slot not reused yet");
    assert_eq!((ra.key, ra.registered_ms, ra.deadline_ms), (a, 5, 105));
    assert_eq!((ra.named_edges, ra.expected, ra.outstanding), (3, 3, 0));
    let edges: Vec<_> = ra.edges[..3].iter().map(|e| (e.agent, e.outcome)).collect();
    assert_eq!(
        edges,
        [
            (3, KVDRAIN_RECORD_EDGE_LANDED),
            (4, KVDRAIN_RECORD_EDGE_FAILURE_NOTICE),
            (5, KVDRAIN_RECORD_EDGE_FENCED)
        ]
    );
    assert_eq!((ra.failure_notice_ms, ra.fenced_ms), (20, 30));
    assert_eq!(
        (ra.gone_ms, ra.ended_ms),
        (KVDRAIN_NO_TIME, KVDRAIN_NO_TIME)
    );
    assert_eq!(
        (ra.first_failure, ra.first_failure_ms),
        (KVDRAIN_FAILURE_NOTICE, 20)
    );
    assert_eq!(ra.ended, KVDRAIN_ENDED_NONE);
    // Settle 0: released with the decision, by the fence at 30.
    assert_eq!((ra.decided_ms, ra.released_ms, ra.forced), (30, 30, 0));

    let rc = record(c).expect("c is quarantined");
    assert_eq!((rc.named_edges, rc.expected, rc.outstanding), (0, 2, 1));
    assert_eq!(rc.count_failed, 0);
    assert_eq!((rc.ended, rc.ended_ms), (KVDRAIN_ENDED_EXPIRED, 105));
    assert_eq!(
        (rc.first_failure, rc.first_failure_ms),
        (KVDRAIN_FAILURE_EXPIRED, 105)
    );
    assert_eq!(
        (rc.decided_ms, rc.released_ms),
        (KVDRAIN_NO_TIME, KVDRAIN_NO_TIME)
    );

    // Hostile input: NULL out, a NULL handle, a key never returned.
    // SAFETY: NULL is accepted for both pointers.
    unsafe {
        assert_eq!(
            kvdrain_engine_record(f.engine, a, null_mut()),
            KVDRAIN_ERR_NULL
        );
        let mut out = MaybeUninit::uninit();
        assert_eq!(
            kvdrain_engine_record(null_mut(), a, out.as_mut_ptr()),
            KVDRAIN_ERR_NULL
        );
    }
    assert_eq!(record(u64::MAX), None);
    assert_eq!(record(a + (1 << 16)), None);
    // a's slot takes the next registration: its record is gone, the new one's is there.
    let b = f.register("b", 12, 1, &[]);
    assert_eq!(record(a), None);
    assert_eq!(record(b).map(|r| (r.key, r.expected)), Some((b, 1)));
}
