//! Fuzz harness of the `replay` target, compiled only under `cfg(fuzzing)`.

use crate::replay::{ReplayError, replay as run};

/// Arbitrary bytes as a trace file: the front end must never panic, must write only whole
/// JSON object lines, and must stop at a trace error on a line that exists.
pub fn replay(data: &[u8]) {
    let mut out = Vec::new();
    let result = run(data, &mut out);
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
