//! The late-writes experiment on real NIXL, short: P and D as separate processes (this test
//! binary re-run as its ignored `child_*` tests), over UCX TCP on loopback and over shared
//! memory, each fault a few times. The long randomized series is
//! `kvdrain experiment late-writes` (cli).
//!
//! - negative control: the pre-fix producer (`old`) without settling lets D release while the
//!   errored write still lands: violations;
//! - the F7 producer (`new`) with `settle_ms = 5000`: no violations. (`settle_ms` reaches the
//!   core once `Config` has it; the F7 producer sends no notice that settling would have to
//!   cover in these faults, so this passes without it.)

mod common;

use std::process::Command;

use common::{prefix, serial};
use kvdrain_nixl::experiment::coordinator::{Role, RunRecord, child_main, run_once};
use kvdrain_nixl::experiment::policy::Policy;
use kvdrain_nixl::experiment::spec::{Fault, Plan, Transport};
use kvdrain_nixl::experiment::summary::Summary;
use kvdrain_nixl::loader::require_nixl_or_skip;

fn launch(role: Role) -> Command {
    let test = match role {
        Role::Consumer => "child_late_writes_consumer",
        Role::Producer => "child_late_writes_producer",
    };
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--ignored",
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd
}

fn series(test: &str, plan: Plan) -> Option<(Vec<RunRecord>, Summary)> {
    if !require_nixl_or_skip(test) {
        return None;
    }
    let mut records = Vec::new();
    for spec in plan.specs() {
        let r = run_once(&spec, &launch).unwrap_or_else(|e| panic!("run {}: {e}", spec.run));
        eprintln!("{}", r.to_json());
        records.push(r);
    }
    let summary = Summary::of(&records);
    eprint!("{}", summary.table());
    Some((records, summary))
}

fn plan(
    test: &str,
    runs: u32,
    faults: &[Fault],
    transports: &[Transport],
    policy: Policy,
    settle_ms: u64,
) -> Plan {
    Plan {
        runs,
        faults: faults.to_vec(),
        transports: transports.to_vec(),
        policy,
        settle_ms,
        // Above the write's duration on a loaded two-core host (about 2 s for 256 MiB).
        deadline_ms: 3000,
        quarantine_ms: 3000,
        observe_ms: 1000,
        // Early in the write: on TCP even a fast host needs longer for 256 MiB.
        fault_delay_us: (1000, 5000),
        seed: 7,
        prefix: prefix(test),
    }
}

/// The negative control: P invalidates D's metadata mid-write over TCP, sees `NotFound` and
/// (pre-fix) sends `PUSH_FAIL`; D without settling releases at once and the write keeps
/// landing on the released blocks.
#[test]
fn old_producer_without_settling_lets_late_writes_hit_released_blocks() {
    let _s = serial();
    let test = "old_producer_without_settling_lets_late_writes_hit_released_blocks";
    let Some((records, summary)) = series(
        test,
        plan(
            test,
            2,
            &[Fault::Invalidate],
            &[Transport::Tcp],
            Policy::Old,
            0,
        ),
    ) else {
        return;
    };
    for r in &records {
        let json = r.to_json();
        assert_eq!(r.producer.get("end"), Some("not_found"), "{json}");
        assert_eq!(r.producer.get("push_fail_sent"), Some("true"), "{json}");
        assert_eq!(r.consumer.get("event"), Some("notice"), "{json}");
        assert_eq!(r.consumer.get("outcome"), Some("failed"), "{json}");
        assert!(
            r.late_pages() > 0,
            "nothing landed after the notice: {json}"
        );
        assert!(r.violations() > 0, "no violation: {json}");
    }
    assert!(summary.violations > 0);
}

/// Every fault, over TCP and shared memory, with the F7 producer and `settle_ms = 5000`:
/// nothing lands on released blocks, and P's own invalidation (fault a) earns no
/// `PUSH_FAIL` (D's deadline ends the request instead).
#[test]
fn new_producer_with_settling_has_no_violations_under_any_fault() {
    let _s = serial();
    let test = "new_producer_with_settling_has_no_violations_under_any_fault";
    let Some((records, summary)) = series(
        test,
        plan(
            test,
            // Round-robin over the 7 fault × transport pairs: TCP a, b, c twice, the rest once.
            10,
            &Fault::ALL,
            &[Transport::Tcp, Transport::Shm],
            Policy::New,
            5000,
        ),
    ) else {
        return;
    };
    assert_eq!(summary.cells.len(), 7, "{}", summary.table());
    assert_eq!(summary.violations, 0, "{}", summary.table());
    for r in records.iter().filter(|r| r.spec.fault == Fault::Invalidate) {
        let json = r.to_json();
        assert_eq!(r.producer.get("push_fail"), Some("false"), "{json}");
        assert_ne!(r.consumer.get("event"), Some("notice"), "{json}");
    }
}

#[test]
#[ignore = "child process of the late-writes tests"]
fn child_late_writes_consumer() {
    if std::env::var_os(kvdrain_nixl::experiment::spec::SPEC_ENV).is_some() {
        std::process::exit(child_main(Role::Consumer));
    }
}

#[test]
#[ignore = "child process of the late-writes tests"]
fn child_late_writes_producer() {
    if std::env::var_os(kvdrain_nixl::experiment::spec::SPEC_ENV).is_some() {
        std::process::exit(child_main(Role::Producer));
    }
}
