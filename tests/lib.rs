//! Workspace-level test suites live in this package's `tests/` directory; this library
//! only holds helpers they share.

use std::path::PathBuf;

/// The `tests/` directory of the workspace (where the trace files live).
pub fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
