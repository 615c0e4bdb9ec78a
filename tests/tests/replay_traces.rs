//! Every trace under `tests/traces/` replayed through the real tracker: the output must
//! match `NAME.expected` byte for byte; traces with a `NAME.stderr` must stop with the trace
//! error it names (same line number) after printing exactly the expected decisions.

use std::fs;
use std::path::Path;

use kvdrain_replay::{ReplayError, replay};

fn check(trace: &Path) -> Result<(), String> {
    let input = fs::read(trace).map_err(|e| e.to_string())?;
    let expected = fs::read_to_string(trace.with_extension("expected"))
        .map_err(|e| format!("expected file: {e}"))?;
    let stderr = fs::read_to_string(trace.with_extension("stderr")).ok();
    let mut out = Vec::new();
    let result = replay(&input, &mut out);
    let out = String::from_utf8(out).map_err(|e| e.to_string())?;
    let mut problems = Vec::new();
    if out != expected {
        problems.push(format!(
            "stdout differs\n--- expected\n{expected}--- got\n{out}"
        ));
    }
    match (result, stderr) {
        (Ok(()), None) => {}
        (Ok(()), Some(want)) => problems.push(format!("expected a trace error: {}", want.trim())),
        (Err(ReplayError::Trace(e)), Some(want)) => {
            let want = want.lines().next().unwrap_or_default();
            let prefix = want.split_inclusive(':').take(1).collect::<String>();
            if !e.to_string().starts_with(&prefix) {
                problems.push(format!(
                    "trace error differs: want {want:?}, got {:?}",
                    e.to_string()
                ));
            }
        }
        (Err(e), _) => problems.push(format!("unexpected error: {e:?}")),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[test]
fn every_trace_matches_its_expected_output() {
    let dir = kvdrain_tests::tests_dir().join("traces");
    let mut traces: Vec<_> = fs::read_dir(&dir)
        .expect("tests/traces exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    traces.sort();
    assert!(
        traces.len() >= 40,
        "only {} traces found in {}",
        traces.len(),
        dir.display()
    );
    let failures: Vec<String> = traces
        .iter()
        .filter_map(|t| {
            check(t)
                .err()
                .map(|why| format!("=== {}\n{why}", t.display()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} traces failed:\n{}",
        failures.len(),
        traces.len(),
        failures.join("\n")
    );
    println!("{} traces replayed", traces.len());
}
