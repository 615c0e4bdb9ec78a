//! `kvdrain demo --metrics` and `--log` over real NIXL: the exposition after the summary is
//! OpenMetrics text (prometheus-client's): every family declared once with its type and
//! help, samples that parse, `# EOF` last; `--log` prints the glue's tracing events on
//! stderr, a `warn` per failure with its cause. Skipped (with a note) where the NIXL
//! runtime is missing.
#![cfg(feature = "nixl")]

use std::collections::BTreeMap;
use std::process::Command;

/// Families the demo must export, with their OpenMetrics type.
const FAMILIES: [(&str, &str); 25] = [
    ("kvdrain:nixl_num_registered_reqs", "counter"),
    ("kvdrain:nixl_num_completed_reqs", "counter"),
    ("kvdrain:nixl_num_failed_reqs", "counter"),
    ("kvdrain:nixl_num_kv_expired_reqs", "counter"),
    ("kvdrain:nixl_num_aborted_reqs", "counter"),
    ("kvdrain:nixl_num_released_reqs", "counter"),
    ("kvdrain:nixl_num_fenced_edges", "counter"),
    ("kvdrain:nixl_num_gone_edges", "counter"),
    ("kvdrain:nixl_num_rejected_registrations", "counter"),
    ("kvdrain:nixl_num_completions", "counter"),
    ("kvdrain:nixl_num_failure_notices", "counter"),
    ("kvdrain:nixl_num_ignored_notifications", "counter"),
    ("kvdrain:nixl_num_sent_notifications", "counter"),
    ("kvdrain:nixl_num_failed_notifications", "counter"),
    ("kvdrain:nixl_num_producer_disconnects", "counter"),
    ("kvdrain:nixl_num_notifications_from_strangers", "counter"),
    ("kvdrain:nixl_notif_to_decision_seconds", "histogram"),
    ("kvdrain:nixl_num_registrations", "counter"),
    ("kvdrain:nixl_num_heartbeats", "counter"),
    ("kvdrain:nixl_num_posted_writes", "counter"),
    ("kvdrain:nixl_num_landed_writes", "counter"),
    ("kvdrain:nixl_num_failed_transfers", "counter"),
    ("kvdrain:nixl_num_released_sources", "counter"),
    ("kvdrain:nixl_num_unplannable_registrations", "counter"),
    ("kvdrain:nixl_num_expired_leases", "counter"),
];

/// `name{labels}` → value of every sample line.
fn samples(exposition: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        let value: f64 = value.parse().expect("a number");
        assert!(
            out.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    out
}

/// Runs a 200-request demo with `extra` flags: (stdout, stderr), or `None` (with a note)
/// when it fell back to the in-process transport.
fn demo(extra: &[&str]) -> Option<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_kvdrain"))
        .args(["demo", "--requests", "200", "--block-size", "4096"])
        .args(["--fail-rate", "0.05"])
        .args(extra)
        .output()
        .expect("run kvdrain demo");
    let stdout = String::from_utf8(out.stdout).expect("UTF-8");
    let stderr = String::from_utf8(out.stderr).expect("UTF-8");
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    if stderr.contains("NIXL not used") {
        eprintln!("skipped: the NIXL runtime is not available here\n{stderr}");
        return None;
    }
    Some((stdout, stderr))
}

#[test]
fn demo_log_prints_a_warning_per_failure_with_its_cause() {
    let Some((stdout, quiet)) = demo(&[]) else {
        return;
    };
    assert!(!quiet.contains("WARN"), "no events without --log: {quiet}");
    assert!(!stdout.contains("WARN"));
    let Some((_, log)) = demo(&["--log"]) else {
        return;
    };
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    let posts = warnings
        .iter()
        .filter(|l| l.contains("cause=\"post\""))
        .count();
    let failed = warnings
        .iter()
        .filter(|l| l.contains("cause=\"transfer\""))
        .count();
    assert!(posts > 0 && failed > 0, "{log}");
    assert!(!log.contains("DEBUG"), "--log defaults to warn: {log}");
    let Some((_, debug)) = demo(&["--log=kvdrain_driver=debug,kvdrain_nixl=debug"]) else {
        return;
    };
    assert!(
        debug.contains("push{req="),
        "a span per pushed request: {debug}"
    );
    assert!(debug.contains("register{req="), "a span per registration");
}

#[test]
fn demo_metrics_are_openmetrics_with_every_family() {
    let Some((stdout, _)) = demo(&["--metrics"]) else {
        return;
    };
    let start = stdout
        .find("# HELP")
        .expect("an exposition after the summary");
    let exposition = &stdout[start..];
    assert!(exposition.ends_with("# EOF\n"), "{exposition}");
    for (name, kind) in FAMILIES {
        let declared = format!("# TYPE {name} {kind}\n");
        assert_eq!(exposition.matches(&declared).count(), 1, "{declared}");
        assert!(exposition.contains(&format!("# HELP {name} ")), "{name}");
    }
    assert_eq!(exposition.matches("# TYPE ").count(), FAMILIES.len());
    let s = samples(&exposition[..exposition.len() - "# EOF\n".len()]);
    let get = |series: &str| s.get(series).copied().unwrap_or(f64::NAN);
    let completed = get("kvdrain:nixl_num_completed_reqs_total");
    let failed = get("kvdrain:nixl_num_failed_reqs_total");
    let expired = get("kvdrain:nixl_num_kv_expired_reqs_total");
    assert_eq!(completed + failed + expired, 200.0, "{exposition}");
    assert!(failed > 0.0, "injected failures show: {exposition}");
    assert_eq!(
        get("kvdrain:nixl_num_failed_transfers_total{cause=\"post\"}"),
        get("kvdrain:nixl_num_sent_notifications_total{side=\"producer\",kind=\"push_fail\"}"),
    );
    assert_eq!(get("kvdrain:nixl_notif_to_decision_seconds_count"), 200.0);
    assert_eq!(
        get("kvdrain:nixl_notif_to_decision_seconds_bucket{le=\"+Inf\"}"),
        200.0
    );
}

/// The summary splits notification → decision latency where it is spent: NIXL and the
/// producers (offer → drained, estimated), the ingest half (drained → decided) and the
/// hand-off to the engine thread (decided → pulled); without a pump thread there is no
/// hand-off to show. Figures are the machine's: only their presence is checked.
#[test]
fn demo_summary_splits_the_latency() {
    let row = |summary: &str, name: &str| -> String {
        summary
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name:?} row: {summary}"))
            .to_owned()
    };
    let Some((threads, _)) = demo(&[]) else {
        return;
    };
    for name in [
        "offer → decision",
        "post → decision",
        "NIXL delivery",
        "notification → decision",
        "ingest half",
        "hand-off",
    ] {
        let line = row(&threads, name);
        assert!(line.contains("p50 "), "{line}");
        assert!(name == "NIXL delivery" || line.contains("p99 "), "{line}");
        assert!(line.contains(" µs"), "{line}");
    }
    let Some((one_loop, _)) = demo(&["--no-pump-thread"]) else {
        return;
    };
    assert!(row(&one_loop, "hand-off").contains("(no pump thread)"));
    assert!(row(&one_loop, "offer → decision").contains("p50 "));
}
