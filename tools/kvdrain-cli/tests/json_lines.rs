//! Every command that prints JSON lines, run as a user runs it with its output piped: each
//! line parses (serde_json) into an object with the documented keys in the documented
//! order, and no progress-bar byte reaches either stream.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{Map, Value};

fn kvdrain(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvdrain"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvdrain");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

/// The objects `args` prints, after checking the run and that nothing drew a bar.
fn objects(args: &[&str], stdin: &[u8]) -> Vec<Map<String, Value>> {
    let out = kvdrain(args, stdin);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            !bytes.iter().any(|&b| b == b'\r' || b == 0x1b),
            "{args:?}: progress bytes on {name}"
        );
    }
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    assert!(text.ends_with('\n'), "{args:?}: {text:?}");
    text.lines()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(map)) => map,
            other => panic!("{args:?}: not a JSON object: {line:?} ({other:?})"),
        })
        .collect()
}

fn keys(object: &Map<String, Value>) -> Vec<&str> {
    object.keys().map(String::as_str).collect()
}

#[test]
fn replay_prints_the_spec_keys_in_order() {
    let trace = b"config deadline_ms=100 quarantine_ms=50 settle_ms=0\n\
register r1 edges=p0,p1\nregister r2 expect=2\nregister r1 expect=1\n\
notify p1 PUSH_FAIL:r1:2\nnotify p0 r1:2\nnotify p0 garbage\nabort r2\nat 60\n\
register r3 edges=a,b\nat 200\n";
    let lines = objects(&["replay", "-"], trace);
    let seen: Vec<(String, Vec<&str>)> = lines
        .iter()
        .map(|o| (o["event"].as_str().unwrap_or_default().to_owned(), keys(o)))
        .collect();
    let want = |event: &str, k: &[&'static str]| (event.to_owned(), k.to_vec());
    assert_eq!(
        seen,
        [
            want("rejected", &["at", "event", "req", "reason"]),
            want("failed", &["at", "event", "req"]),
            want("released", &["at", "event", "req", "forced"]),
            want("ignored", &["at", "event", "reason"]),
            want("aborted", &["at", "event", "req", "outstanding"]),
            want("released", &["at", "event", "req", "forced"]),
            want("expired", &["at", "event", "req", "outstanding"]),
        ]
    );
    assert_eq!(lines[4]["outstanding"], Value::from(2));
    assert_eq!(lines[5]["forced"], Value::Bool(true));
    assert_eq!(lines[6]["outstanding"], serde_json::json!(["a", "b"]));
}

#[test]
fn sim_prints_one_line_with_its_keys_in_order() {
    let lines = objects(&["sim", "--seed", "5", "--requests", "200"], b"");
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!(
        keys(line),
        [
            "requests",
            "violations",
            "faults",
            "decisions",
            "seed",
            "topology",
            "steps",
            "virtual_ms",
            "settle_ms",
            "settle_hold_block_ms",
            "settle_hold_per_failed_block_ms"
        ]
    );
    assert_eq!(line["requests"], Value::from(200));
    assert_eq!(line["violations"], Value::from(0));
    let decisions = line["decisions"].as_object().expect("decisions object");
    assert_eq!(keys(decisions)[..3], ["completed", "failed", "aborted"]);
    assert!(line["faults"].as_object().is_some_and(|f| f.len() >= 20));
}

const SMALL: [&str; 6] = [
    "--inflight",
    "64",
    "--edges",
    "2",
    "--notifications",
    "2_000",
];

fn bench(what: &str, extra: &[&str]) -> Vec<Map<String, Value>> {
    let mut args = vec!["bench", what];
    args.extend(extra);
    objects(&args, b"")
}

#[test]
fn bench_ingest_and_floor_lines() {
    let ingest_keys = [
        "impl",
        "ns_per_notification",
        "ns_min",
        "ns_q1",
        "ns_q3",
        "ns_max",
        "cpu_ns_per_notification",
        "cpu_ns_min",
        "cpu_ns_q1",
        "cpu_ns_q3",
        "cpu_ns_max",
        "notifications",
        "inflight",
        "edges",
        "mode",
        "fail_share",
        "reps",
        "allocations",
        "decided_per_rep",
        "failed_per_rep",
    ];
    let lines = bench("ingest", &[&SMALL[..], &["--reps", "3"]].concat());
    assert_eq!(lines.len(), 1);
    let mut want = ingest_keys.to_vec();
    want.extend(["ledger", "ledger_bytes"]);
    assert_eq!(keys(&lines[0]), want);
    assert_eq!(lines[0]["impl"], "kvdrain");
    assert_eq!(lines[0]["allocations"], Value::from(0));

    let lines = bench("floor", &[&SMALL[..], &["--reps", "3"]].concat());
    let mut want = ingest_keys.to_vec();
    want.push("hasher");
    assert_eq!(keys(&lines[0]), want);

    let lines = bench(
        "compare",
        &[
            &SMALL[..],
            &["--reps", "2", "--no-python", "--mode", "named"],
        ]
        .concat(),
    );
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["impl"], "kvdrain");
    assert_eq!(lines[1]["impl"], "kvdrain-halves");
    assert_eq!(lines[1]["allocations"], Value::from(0));
    assert_eq!(lines[2]["impl"], "rust-floor");
    assert_eq!(keys(&lines[3])[..2], ["compare", "kvdrain_ns"]);
    assert_eq!(lines[3]["python_ns"], Value::Null);
    assert!(
        lines[3]["halves_over_floor_cpu"]
            .as_f64()
            .is_some_and(|r| r > 0.0)
    );
    assert_eq!(lines[3]["stream_checked_against_python"], Value::from(0));
}

#[test]
fn bench_sweep_tick_and_memory_lines() {
    let lines = bench(
        "sweep",
        &[
            "--notifications",
            "1000",
            "--edges-list",
            "1,2",
            "--min-inflight",
            "64",
            "--max-inflight",
            "128",
            "--reps",
            "1",
        ],
    );
    // Per E: two points × (kvdrain, floor), then the summary.
    assert_eq!(lines.len(), 2 * (2 * 2 + 1));
    let summary = &lines[4];
    assert_eq!(
        keys(summary)[..6],
        [
            "sweep",
            "edges",
            "mode",
            "inflight_min",
            "inflight_max",
            "ns_median_of_medians"
        ]
    );
    let by_inflight = summary["by_inflight"].as_object().expect("object");
    assert_eq!(keys(by_inflight), ["64", "128"]);

    let lines = bench(
        "tick",
        &[
            "--inflight",
            "256",
            "--expiring",
            "2",
            "--ticks",
            "16",
            "--reps",
            "1",
        ],
    );
    assert_eq!(
        keys(&lines[0])[..7],
        [
            "bench",
            "inflight",
            "expiring_per_tick",
            "ticks",
            "reps",
            "ledger",
            "ns_per_advance"
        ]
    );
    assert_eq!(keys(&lines[0]).last(), Some(&"allocations"));

    let lines = bench("memory", &[]);
    assert_eq!(
        keys(&lines[0]),
        [
            "bench",
            "slot_equivalent_bytes",
            "Ledger<1024, 8>",
            "Ledger<4096, 8>",
            "Ledger<65536, 8>",
            "Ledger<4096, 32>",
            "Ledger<65536, 32>",
            "target_bytes_per_request"
        ]
    );
    assert!(lines[0]["Ledger<1024, 8>"]["bytes"].as_u64().is_some());
}

#[test]
fn a_piped_demo_draws_no_progress() {
    let out = kvdrain(
        &[
            "demo",
            "--in-process",
            "--requests",
            "300",
            "--block-size",
            "1024",
            "--window",
            "16",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0));
    for bytes in [&out.stdout, &out.stderr] {
        assert!(!bytes.iter().any(|&b| b == b'\r' || b == 0x1b));
    }
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("p99.9"), "{summary}");
}
