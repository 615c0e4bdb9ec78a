//! `kvdrain bench latency` end to end at a small size: one line per path and the split
//! line, each with its keys in order; every request decided and sampled on every path; the
//! percentiles ordered (p50 ≤ p90 ≤ p99 ≤ p99.9 ≤ max); the split line made of the path
//! lines' own figures. No timing threshold: the figures depend on the machine.

use std::process::Command;

use serde_json::{Map, Value};

const PATH_KEYS: [&str; 22] = [
    "bench",
    "path",
    "requests",
    "edges",
    "inflight",
    "rate",
    "batch",
    "samples",
    "ns_p50",
    "ns_p90",
    "ns_p99",
    "ns_p999",
    "ns_max",
    "arrival_ns_p50",
    "arrival_ns_p90",
    "arrival_ns_p99",
    "arrival_ns_p999",
    "arrival_ns_max",
    "registration_waits",
    "late_batches",
    "anomalies",
    "allocations",
];

fn run(args: &[&str]) -> Vec<Map<String, Value>> {
    let out = Command::new(env!("CARGO_BIN_EXE_kvdrain"))
        .args(["bench", "latency"])
        .args(args)
        .output()
        .expect("run kvdrain");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(map)) => map,
            other => panic!("not a JSON object: {line:?} ({other:?})"),
        })
        .collect()
}

fn int(line: &Map<String, Value>, key: &str) -> u64 {
    line[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key}: {:?}", line[key]))
}

fn check(args: &[&str], requests: u64, batch: u64) {
    let lines = run(args);
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (line, path) in lines.iter().zip(["one_thread", "handoff", "two_threads"]) {
        assert_eq!(
            line.keys().map(String::as_str).collect::<Vec<_>>(),
            PATH_KEYS,
            "{line:?}"
        );
        assert_eq!(line["bench"], "latency");
        assert_eq!(line["path"], path);
        assert_eq!(int(line, "requests"), requests);
        assert_eq!(int(line, "samples"), requests, "{line:?}");
        assert_eq!(int(line, "batch"), batch);
        assert_eq!(int(line, "anomalies"), 0, "{line:?}");
        // The binary installs the counting allocator: a number, and 0 (else exit 1).
        assert_eq!(int(line, "allocations"), 0, "{line:?}");
        for prefix in ["ns_", "arrival_ns_"] {
            let q: Vec<u64> = ["p50", "p90", "p99", "p999", "max"]
                .iter()
                .map(|k| int(line, &format!("{prefix}{k}")))
                .collect();
            assert!(q.windows(2).all(|w| w[0] <= w[1]), "{path} {prefix}: {q:?}");
        }
    }
    let split = &lines[3];
    assert_eq!(split["path"], "split");
    for (key, q) in [("p50", "ns_p50"), ("p99", "ns_p99")] {
        let (one, ring, two) = (int(&lines[0], q), int(&lines[1], q), int(&lines[2], q));
        assert_eq!(int(split, &format!("kvdrain_ns_{key}")), one);
        assert_eq!(int(split, &format!("handoff_ns_{key}")), ring);
        assert_eq!(int(split, &format!("two_threads_ns_{key}")), two);
        let rest = split[&format!("rest_ns_{key}")].as_i64().expect("rest");
        assert_eq!(rest, two as i64 - one as i64 - ring as i64);
        assert!(split[&format!("two_over_one_{key}")].is_number());
    }
    let met = split["goal_met"].as_bool().expect("goal_met");
    assert_eq!(met, int(&lines[2], "ns_p99") <= int(split, "goal_ns_p99"));
}

#[test]
fn paced_run_prints_every_path_and_the_split() {
    check(
        &[
            "--requests",
            "2000",
            "--inflight",
            "64",
            "--rate",
            "200_000",
        ],
        2000,
        1,
    );
}

#[test]
fn batched_flat_out_run_decides_every_request() {
    check(
        &[
            "--requests",
            "3000",
            "--edges",
            "3",
            "--inflight",
            "100",
            "--rate",
            "0",
            "--batch",
            "8",
        ],
        3000,
        8,
    );
}

#[test]
fn nonsense_flags_are_usage_errors() {
    for args in [
        &["--inflight", "5000"][..],
        &["--edges", "0"],
        &["--edges", "65"],
        &["--batch", "0"],
        &["--rate", "1", "--batch", "100"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvdrain"))
            .args(["bench", "latency"])
            .args(args)
            .output()
            .expect("run kvdrain");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
