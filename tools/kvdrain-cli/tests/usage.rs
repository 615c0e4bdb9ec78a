//! The command line as a user meets it: `--help` everywhere, `--version`, clap's errors
//! with status 2, and the usage block of docs/commands.md equal to what `--help` prints.
//!
//! After changing a flag, `KVDRAIN_BLESS=1 cargo test -p kvdrain-cli --test usage`
//! rewrites that block.

use std::process::Command;

use kvdrain_cli::command;

const BEGIN: &str = "<!-- BEGIN kvdrain usage";
const END: &str = "<!-- END kvdrain usage -->";

fn kvdrain(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvdrain"))
        .args(args)
        .output()
        .expect("run kvdrain")
}

#[test]
fn commands_page_usage_matches_help() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/commands.md");
    let page = std::fs::read_to_string(path).expect("docs/commands.md");
    let begin = page
        .find(BEGIN)
        .expect("docs/commands.md has the usage block");
    let body = begin + page[begin..].find("-->\n").expect("marker ends") + 4;
    let end = page.find(END).expect("docs/commands.md has the end marker");
    let block = format!("```text\n{}```\n", command::readme_usage());
    if std::env::var_os("KVDRAIN_BLESS").is_some() {
        let updated = format!("{}{block}{}", &page[..body], &page[end..]);
        std::fs::write(path, updated).expect("write docs/commands.md");
        return;
    }
    assert_eq!(
        page[body..end],
        block,
        "docs/commands.md usage block is stale: run KVDRAIN_BLESS=1 cargo test -p kvdrain-cli --test usage"
    );
}

#[test]
fn every_command_answers_help_with_an_example() {
    let top = kvdrain(&["--help"]);
    assert_eq!(top.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&top.stdout),
        command::help(&[]).expect("top help")
    );
    for path in command::PATHS {
        let mut args = path.to_vec();
        args.push("--help");
        let out = kvdrain(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: kvdrain "), "{args:?}: {text}");
        assert!(text.contains("Example:\n  kvdrain "), "{args:?}: {text}");
        assert_eq!(text, command::help(path).expect("help"), "{args:?}");
    }
}

#[test]
fn version_prints_the_crate_version() {
    let out = kvdrain(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("kvdrain {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bad_input_gets_clap_errors_with_status_2() {
    for args in [
        &["frobnicate"][..],
        &[],
        &["sim", "--seed", "1", "--requests", "1", "--bogus"],
        &["sim", "--seed", "x", "--requests", "1"],
        &["sim", "--requests", "1"],
        &[
            "sim",
            "--seed",
            "1",
            "--requests",
            "1",
            "--random-topology",
            "--p-tp",
            "2",
        ],
        &["demo", "--block-size", "100"],
        &["demo", "--fail-rate", "2"],
        &[
            "bench",
            "ingest",
            "--inflight",
            "0",
            "--edges",
            "2",
            "--notifications",
            "9",
        ],
        &[
            "bench",
            "ingest",
            "--inflight",
            "64",
            "--edges",
            "65",
            "--notifications",
            "9",
        ],
        &["bench", "sweep", "--mode", "sideways"],
        &["bench", "tick", "--reps"],
        &["bench", "nothing"],
    ] {
        let out = kvdrain(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // No command at all: clap shows the help (on stderr) instead of an error line.
        assert!(
            args.is_empty() || stderr.contains("error:"),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains("Usage: kvdrain") || stderr.contains("--help"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn replay_usage_errors_are_clap_errors_not_trace_errors() {
    for args in [
        &["replay"][..],
        &["replay", "a", "b"],
        &["replay", "--bogus", "x"],
    ] {
        let out = kvdrain(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("error:") && !stderr.contains("trace error"),
            "{stderr}"
        );
    }
}
