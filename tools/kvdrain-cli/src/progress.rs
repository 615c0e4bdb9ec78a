//! Progress bars for long runs, on standard error and only when it is a terminal: piped or
//! redirected output (and so every JSON line on standard output) never carries a byte of
//! them.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where bars draw: standard error on a terminal, nowhere otherwise.
pub fn target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar counting up to `total` `unit`s (hidden when standard error is not a terminal).
///
/// It redraws only when the caller moves it, on the caller's thread: no ticker thread
/// allocates behind a benchmark's timed loop (the allocation count spans every thread), so
/// move it between timed sections only.
pub fn bar(total: u64, unit: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(&format!(
        "[{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{percent}}%, eta {{eta}})"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::with_draw_target(Some(total), target()).with_style(style)
}

/// A spinner with a message and the elapsed time, for runs whose progress the caller
/// cannot count (hidden when standard error is not a terminal). A ticker thread redraws it:
/// not for timed sections.
pub fn spinner(message: String) -> ProgressBar {
    let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bar = ProgressBar::with_draw_target(None, target())
        .with_style(style)
        .with_message(message);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
