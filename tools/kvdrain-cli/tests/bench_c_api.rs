//! `kvdrain bench c-api` end to end at a small size: the C ABI path and both Rust paths
//! decide every request of the stream, allocate nothing in their timed loops (the
//! command's own checks, exit status 1 otherwise), and the comparison line is printed.

use std::process::Command;

#[test]
fn c_api_bench_runs_its_checks_and_prints_the_ratio() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvdrain"))
        .args([
            "bench",
            "c-api",
            "--inflight",
            "64",
            "--edges",
            "2",
            "--notifications",
            "20000",
            "--reps",
            "1",
        ])
        .output()
        .expect("run kvdrain");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (line, implementation) in lines
        .iter()
        .zip(["c-api", "rust-same-ledger", "rust-fitted"])
    {
        assert!(
            line.starts_with(&format!("{{\"impl\":\"{implementation}\"")),
            "{line}"
        );
        assert!(line.contains("\"decided_per_rep\":10000"), "{line}");
    }
    assert!(lines[3].contains("\"c_over_rust\":"), "{}", lines[3]);
    assert!(lines[3].contains("\"target_met\":"), "{}", lines[3]);
}
