//! `kvdrain replay FILE|-`: feeds a trace of consumer-side events through the real tracker
//! and prints every decision it takes, one JSON object per line (`docs/replay-trace.md`).
//!
//! This file only reads the input and maps the outcome to an exit status; the trace is
//! parsed and run by [`kvdrain_replay`], every decision taken by [`kvdrain::Ledger`].

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use kvdrain_replay::{ReplayError, replay};

/// Exit status when the input cannot be read or the output written.
pub const EXIT_UNREADABLE: u8 = 1;
/// Exit status of a trace error.
pub const EXIT_TRACE_ERROR: u8 = 2;

/// `kvdrain replay` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Exit status: 0 after the whole trace; 1 if the input cannot be read; 2 on a trace error
(`trace error at line L: WHY` on stderr, after the decisions of the lines before it) and
on bad usage (clap's message).

Example:
  kvdrain replay tests/traces/story_mixed_node.trace
  printf 'register r1 expect=1\\nnotify p0 r1:1\\n' | kvdrain replay -")]
pub struct ReplayArgs {
    /// The trace, one command a line (config, at, register, notify, abort, fence, gone; examples
    /// in tests/traces), or - for standard input.
    #[arg(value_name = "FILE|-")]
    pub trace: PathBuf,
}

/// `kvdrain replay` entry point: exit 0 after the whole trace, 2 on a trace error, 1 if
/// the input cannot be read.
pub fn main(args: &ReplayArgs) -> ExitCode {
    let path = &args.trace;
    let mut input = Vec::new();
    let read = if path.as_os_str() == "-" {
        io::stdin().lock().read_to_end(&mut input)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut input))
    };
    if let Err(e) = read {
        eprintln!("kvdrain replay: cannot read {}: {e}", path.display());
        return ExitCode::from(EXIT_UNREADABLE);
    }
    let mut out = io::BufWriter::new(io::stdout());
    let result = replay(&input, &mut out);
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(ReplayError::Trace(e)), _) => {
            eprintln!("{e}");
            ExitCode::from(EXIT_TRACE_ERROR)
        }
        (Err(ReplayError::Io(e)), _) | (Ok(()), Err(e)) => {
            eprintln!("kvdrain replay: cannot write output: {e}");
            ExitCode::from(EXIT_UNREADABLE)
        }
    }
}
