//! `kvdrain sim` as a test: whole P→D clusters under every fault class of the catalogue,
//! driven through the library function the command runs.
//!
//! The default runs are debug-build sized (10⁴ requests each). The 10⁵-request check that
//! every fault class fires is `#[ignore]`d for debug runs; run it in release:
//! `cargo test --release -p kvdrain-tests --test sim -- --include-ignored`
//! (tests/README.md has the figures of a long run).

use kvdrain_sim::{Broken, Report, Shape, SimConfig, run};

fn simulate(seed: u64, requests: u64, shape: Shape) -> Report {
    run(SimConfig::new(seed, requests, shape)).expect("a valid topology")
}

fn fixed(p_tp: u16, p_pp: u16, d_tp: u16) -> Shape {
    Shape::Fixed { p_tp, p_pp, d_tp }
}

fn assert_clean(report: &Report) {
    assert_eq!(
        report.violations, 0,
        "seed {} {}: {:#?}",
        report.seed, report.topology, report.first_violations
    );
    let d = report.decisions;
    assert!(
        d.completed > 0 && d.failed > 0 && d.released > 0,
        "{}",
        report.to_json()
    );
}

#[test]
fn p2_to_d1_pr50754_shape() {
    assert_clean(&simulate(1, 10_000, fixed(2, 1, 1)));
}

#[test]
fn p4_pp2_to_d2() {
    assert_clean(&simulate(2, 10_000, fixed(4, 2, 2)));
}

#[test]
fn p1_to_d4_one_producer_many_consumers() {
    assert_clean(&simulate(3, 10_000, fixed(1, 1, 4)));
}

#[test]
fn random_topologies() {
    for seed in [4, 5] {
        assert_clean(&simulate(seed, 10_000, Shape::Random));
    }
}

#[test]
fn a_seed_replays_the_same_run() {
    let a = simulate(6, 2_000, Shape::Random);
    let b = simulate(6, 2_000, Shape::Random);
    assert_eq!(a.to_json(), b.to_json());
    assert_ne!(a.to_json(), simulate(7, 2_000, Shape::Random).to_json());
}

/// The checks can fail: a consumer that hands blocks back at the abort (instead of waiting
/// for `released`) is caught reusing blocks that writes still land in.
#[test]
fn broken_release_on_abort_is_caught() {
    for seed in [1, 2] {
        let mut config = SimConfig::new(seed, 10_000, fixed(2, 1, 1));
        config.broken = Some(Broken::ReleaseOnAbort);
        let report = run(config).expect("a valid topology");
        assert!(
            report.violations > 0,
            "seed {seed}: broken variant not caught"
        );
        let memory = report.first_violations.iter().any(|v| {
            v.what.contains("while") && v.what.contains("may still land")
                || v.what.contains("landed in block")
        });
        assert!(memory, "{:#?}", report.first_violations);
    }
}

/// vLLM's counting semantics under repeated notices: a repeat counts as a sibling's
/// notice and the request completes while the sibling's WRITE is still in flight. The
/// simulation sees it; named-edge mode (the default for repeats) does not have the hole.
#[test]
fn repeats_in_counting_mode_are_caught() {
    let mut config = SimConfig::new(1, 10_000, fixed(2, 1, 1));
    config.broken = Some(Broken::DuplicateCounting);
    let report = run(config).expect("a valid topology");
    let early = report
        .first_violations
        .iter()
        .any(|v| v.what.contains("completed but"));
    assert!(early, "{:#?}", report.first_violations);
}

/// No settling (`settle_ms = 0`, vLLM's behaviour) while failed WRITEs keep landing after
/// their error (`docs/nixl.md#late-writes`): the consumer releases at the failure notice and the memory model
/// sees bytes land in released or reused blocks.
#[test]
fn late_landing_without_settling_is_caught() {
    let config = SimConfig::new(1, 10_000, fixed(2, 1, 1)).with_broken(Broken::NoSettle);
    let report = run(config).expect("a valid topology");
    assert!(report.faults.late_landing > 0);
    let late = report.first_violations.iter().any(|v| {
        v.what.contains("released while") && v.what.contains("may still land")
            || v.what.contains("landed in block")
    });
    assert!(late, "{:#?}", report.first_violations);
}

/// With the core's settling (`settle_ms` > the late-landing window) the same fault is
/// harmless.
#[test]
fn late_landing_with_settling_is_clean() {
    for (seed, shape) in [(1, fixed(2, 1, 1)), (2, fixed(4, 2, 2)), (3, Shape::Random)] {
        let report =
            run(SimConfig::new(seed, 10_000, shape).with_late_landing()).expect("a valid topology");
        assert!(report.faults.late_landing > 0);
        assert_clean(&report);
    }
}

/// What settling costs: blocks stay held after a `failed` decision for about `settle_ms`
/// (nothing without settling), and the run stays clean with any settling.
#[test]
fn settling_holds_failed_blocks_for_settle_ms() {
    let held = |settle_ms| {
        let mut config = SimConfig::new(8, 3_000, fixed(2, 1, 1));
        config.settle_ms = settle_ms;
        let report = run(config).expect("a valid topology");
        assert_clean(&report);
        assert_eq!(report.settle_ms, settle_ms);
        report.held_per_failed()
    };
    let (none, short, long) = (held(0), held(100), held(5_000));
    assert_eq!(none, 0.0);
    // At most four blocks (BLOCKS_PER_REQUEST) for a little over settle_ms (a later failure
    // notice restarts it); less when a completion or a fence resolves the last edge.
    assert!(short > 0.0 && short <= 4.0 * 200.0, "{short}");
    assert!(long > 10.0 * short && long <= 4.0 * 5_200.0, "{long}");
}

/// Every fault class fires at 10⁵ requests, late landing included, with no violation, on
/// each topology.
#[test]
#[ignore = "10^5 requests per topology: run with --release (tests/README.md)"]
fn every_fault_class_fires_at_1e5_requests() {
    let shapes = [
        (11, fixed(2, 1, 1)),
        (12, fixed(4, 2, 2)),
        (13, fixed(1, 1, 4)),
        (14, Shape::Random),
    ];
    for (seed, shape) in shapes {
        let config = SimConfig::new(seed, 100_000, shape).with_late_landing();
        let report = run(config).expect("a valid topology");
        assert_clean(&report);
        for (name, n) in report.faults.entries() {
            assert!(
                n > 0,
                "{} seed {seed}: fault {name} never injected",
                report.topology
            );
        }
    }
}
