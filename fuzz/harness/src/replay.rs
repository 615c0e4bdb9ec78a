//! `replay`: arbitrary bytes as a trace file, through the same front end as `kvdrain replay`.

use kvdrain_replay::{ReplayError, replay_inline_below};

/// Arbitrary bytes as a trace file: the front end must never panic, must write only whole
/// JSON object lines, and must stop at a trace error on a line that exists.
pub fn replay(data: &[u8]) {
    if configures_a_large_table(data) {
        // Same code at a bigger `N`; building and zeroing a 27 MB ledger per run would
        // cut the fuzzer to < 1 000 execs/s (fuzz/README.md).
        return;
    }
    let mut out = Vec::new();
    // The fuzzer's main thread has 8 MiB of stack: ledgers below 2 MiB are built on it
    // rather than on a spawned thread (spawning cost more than the replay).
    let result = replay_inline_below(data, &mut out, 2 << 20);
    let text = String::from_utf8(out).expect("replay output is UTF-8");
    assert!(text.is_empty() || text.ends_with('\n'), "unterminated line");
    for line in text.lines() {
        assert!(
            line.starts_with("{\"at\":") && line.ends_with('}'),
            "not a decision line: {line:?}"
        );
    }
    match result {
        Ok(()) => {}
        Err(ReplayError::Trace(e)) => {
            let lines = data.split(|&b| b == b'\n').count();
            assert!(
                e.line >= 1 && e.line <= lines,
                "trace error at line {} of {lines}",
                e.line
            );
        }
        Err(ReplayError::Io(e)) => panic!("writing into a Vec failed: {e}"),
    }
}

/// Whether the trace asks for more than [`FUZZ_MAX_CAPACITY`] requests.
fn configures_a_large_table(data: &[u8]) -> bool {
    const KEY: &[u8] = b"capacity=";
    (0..data.len())
        .filter(|&i| data[i..].starts_with(KEY))
        .any(|i| {
            let digits = data[i + KEY.len()..]
                .iter()
                .take_while(|b| b.is_ascii_digit());
            digits.fold(0u64, |n, &d| {
                n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
            }) > FUZZ_MAX_CAPACITY
        })
}

/// Largest `capacity` the replay target runs (the ledger stays at `Ledger<4096, 64>`).
const FUZZ_MAX_CAPACITY: u64 = 4096;
