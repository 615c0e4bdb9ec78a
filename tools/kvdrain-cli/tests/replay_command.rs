//! The `kvdrain replay` command as an operator runs it: file or stdin, exit statuses,
//! stderr wording.

use std::io::Write;
use std::process::{Command, Stdio};

fn kvdrain() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvdrain"))
}

#[test]
fn replays_standard_input() {
    let mut child = kvdrain()
        .args(["replay", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn kvdrain");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"register r1 expect=1\nnotify p0 r1:1\n")
        .expect("write trace");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    assert_eq!(
        out.stdout,
        b"{\"at\":0,\"event\":\"completed\",\"req\":\"r1\"}\n"
    );
}

#[test]
fn trace_error_exits_2_after_printing_earlier_decisions() {
    let dir = std::env::temp_dir().join(format!("kvdrain-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bad.trace");
    std::fs::write(
        &path,
        "register r1 expect=1\nabort r1\n\nat 5\nat 4\nat 9\n",
    )
    .expect("write");
    let out = kvdrain().arg("replay").arg(&path).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"at\":0,\"event\":\"aborted\",\"req\":\"r1\",\"outstanding\":1}\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("trace error at line 5: "), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_file_and_bad_usage_are_not_trace_errors() {
    let out = kvdrain()
        .args(["replay", "/nonexistent/trace"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    // A usage error is clap's, status 2, without the trace error's `trace error at line`.
    let out = kvdrain().arg("replay").output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("trace error"));
    let out = kvdrain().arg("frobnicate").output().expect("run");
    assert_eq!(out.status.code(), Some(2));
}
