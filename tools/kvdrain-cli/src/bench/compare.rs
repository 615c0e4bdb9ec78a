//! `kvdrain bench compare`: kvdrain, the Rust floor and vLLM's Python path on one stream.
//!
//! kvdrain and the floor run interleaved on the same thread (rep by rep, alternating
//! which goes first), so machine noise hits both alike; the ratio is reported both as
//! the ratio of medians and as the median of per-rep ratios. kvdrain runs twice a rep:
//! through `Ledger`'s own methods (`kvdrain`, the one-thread shortcut) and through the
//! halves of `Ledger::split` on the same thread (`kvdrain-halves`, the lock-free protocol
//! a two-thread deployment runs). Then
//! `bench/vllm_baseline.py` runs as a child process with the same flags, after checking
//! that it generates the same bytes (the first `min(M, 200 000)` messages are compared).

use std::path::PathBuf;
use std::process::Command;

use super::args::CompareArgs;
use super::ingest::{self, Inputs, Mode, Pass, Shape};
use super::stream::{self, Params};
use super::{Failure, Line, Spread, alloc, num, on_big_stack, stack_for};

/// Messages compared byte for byte against the Python generator.
const STREAM_CHECK: usize = 200_000;

struct Python {
    interpreter: String,
    script: PathBuf,
    reps: usize,
}

fn default_script() -> PathBuf {
    let beside_sources = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/vllm_baseline.py"
    ));
    if beside_sources.exists() {
        beside_sources
    } else {
        PathBuf::from("bench/vllm_baseline.py")
    }
}

fn python_args(p: &Params, notifications: usize) -> Vec<String> {
    vec![
        "--inflight".into(),
        p.inflight.to_string(),
        "--edges".into(),
        p.edges.to_string(),
        "--notifications".into(),
        notifications.to_string(),
        "--fail-share".into(),
        p.fail_share.to_string(),
        "--seed".into(),
        p.seed.to_string(),
    ]
}

fn run_python(py: &Python, args: &[String]) -> Result<Vec<u8>, Failure> {
    let output = Command::new(&py.interpreter)
        .arg(&py.script)
        .args(args)
        .output()
        .map_err(|e| Failure::Check(format!("cannot run {}: {e}", py.interpreter)))?;
    if !output.status.success() {
        return Err(Failure::Check(format!(
            "{} {} failed ({}): {}",
            py.interpreter,
            py.script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(output.stdout)
}

/// The number under `key` in a one-line JSON object.
fn json_number(line: &str, key: &str) -> Option<f64> {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()?
        .get(key)?
        .as_f64()
}

/// `kvdrain bench compare`.
pub fn main(args: &CompareArgs) -> Result<(), Failure> {
    let params = args.ingest.stream.params();
    let mode = Mode::from(args.ingest.mode);
    let reps = args.ingest.reps;
    let python = (!args.no_python).then(|| Python {
        interpreter: args.python.clone(),
        script: args.python_script.clone().unwrap_or_else(default_script),
        reps: args.python_reps,
    });
    let shape = Shape::for_run(params.inflight, params.edges, mode)?;
    let counting = alloc::counting();
    let inputs = Inputs::generate(&params);
    let w = inputs.workload(&params, mode);

    // Same bytes as the Python generator?
    let checked = if let Some(py) = &python {
        let m = params.notifications.min(STREAM_CHECK);
        let mut args = python_args(&params, m);
        args.push("--dump-stream".into());
        let theirs = run_python(py, &args)?;
        let mut ours = Vec::new();
        stream::generate(&Params {
            notifications: m,
            ..params
        })
        .write_lines(&mut ours)
        .map_err(|e| Failure::Check(e.to_string()))?;
        if theirs != ours {
            return Err(Failure::Check(format!(
                "the Python generator's first {m} messages differ from ours"
            )));
        }
        m
    } else {
        0
    };

    let progress = crate::progress::bar(reps as u64, "reps");
    let (kv, halves, fl, walk) = on_big_stack(stack_for(shape.bytes), || {
        let (mut kv, mut halves, mut fl, mut walk) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rep in 0..reps {
            progress.inc(1);
            if rep % 2 == 0 {
                kv.push(shape.pass(&w));
                fl.push(ingest::floor_pass(&w));
                halves.push(shape.pass_halves(&w));
            } else {
                halves.push(shape.pass_halves(&w));
                fl.push(ingest::floor_pass(&w));
                kv.push(shape.pass(&w));
            }
            walk.push(ingest::walk_pass(&w));
        }
        (kv, halves, fl, walk)
    })?;
    progress.finish_and_clear();

    let (mut line, kv_spread) = ingest::json_line("kvdrain", &w, &kv, counting);
    line.put("ledger", shape.name()).print();
    let (mut line, halves_spread) = ingest::json_line("kvdrain-halves", &w, &halves, counting);
    line.put("ledger", shape.name()).print();
    let (mut line, fl_spread) = ingest::json_line("rust-floor", &w, &fl, counting);
    line.put("hasher", "rustc-hash 2").print();
    let walk_spread = ingest::Spreads::of(&walk);

    // (wall, cpu) medians of the Python baseline.
    let python_ns = match &python {
        None => None,
        Some(py) => {
            let mut args = python_args(&params, params.notifications);
            args.extend(["--reps".into(), py.reps.to_string()]);
            let out = run_python(py, &args)?;
            let text = String::from_utf8_lossy(&out);
            let last = text.lines().last().unwrap_or_default().to_owned();
            println!("{last}");
            let wall = json_number(&last, "ns_per_notification")
                .ok_or_else(|| Failure::Check(format!("no ns_per_notification in {last:?}")))?;
            let cpu = json_number(&last, "cpu_ns_per_notification").unwrap_or(f64::NAN);
            Some((wall, cpu))
        }
    };

    let paired = |f: fn(&Pass) -> f64| {
        let ratios: Vec<f64> = kv.iter().zip(&fl).map(|(k, l)| f(k) / f(l)).collect();
        Spread::of(&ratios)
    };
    let paired_wall = paired(|p| p.ns_per_notification);
    let paired_cpu = paired(|p| p.cpu_ns_per_notification);
    let (py_wall, py_cpu) = python_ns.unwrap_or((f64::NAN, f64::NAN));
    let mut line = Line::new();
    line.put(
        "compare",
        format!(
            "R={} E={} M={} mode={} fail_share={}",
            params.inflight,
            params.edges,
            params.notifications,
            mode.name(),
            params.fail_share
        ),
    );
    for (key, value) in [
        ("kvdrain_ns", kv_spread.wall.median),
        ("floor_ns", fl_spread.wall.median),
        ("python_ns", py_wall),
        ("kvdrain_cpu_ns", kv_spread.cpu.median),
        ("floor_cpu_ns", fl_spread.cpu.median),
        ("python_cpu_ns", py_cpu),
        (
            "kvdrain_over_floor",
            kv_spread.wall.median / fl_spread.wall.median,
        ),
        (
            "kvdrain_over_floor_cpu",
            kv_spread.cpu.median / fl_spread.cpu.median,
        ),
        ("kvdrain_over_floor_paired", paired_wall.median),
        ("kvdrain_over_floor_paired_cpu", paired_cpu.median),
        ("kvdrain_over_floor_paired_cpu_min", paired_cpu.min),
        ("kvdrain_over_floor_paired_cpu_max", paired_cpu.max),
        ("python_over_kvdrain", py_wall / kv_spread.wall.median),
        ("python_over_kvdrain_cpu", py_cpu / kv_spread.cpu.median),
        ("python_over_floor", py_wall / fl_spread.wall.median),
        ("halves_cpu_ns", halves_spread.cpu.median),
        (
            "halves_over_floor_cpu",
            halves_spread.cpu.median / fl_spread.cpu.median,
        ),
        ("python_over_halves_cpu", py_cpu / halves_spread.cpu.median),
        ("harness_walk_ns", walk_spread.cpu.median),
    ] {
        line.put(key, num(value));
    }
    line.put("stream_checked_against_python", checked).print();
    ingest::check("kvdrain", &w, &kv, counting)?;
    ingest::check("kvdrain-halves", &w, &halves, counting)?;
    ingest::check("rust-floor", &w, &fl, counting)
}

#[cfg(test)]
mod tests {
    use super::json_number;

    #[test]
    fn reads_a_number_from_a_json_line() {
        let line = r#"{"impl":"vllm-python","ns_per_notification":1138.71,"reps":5}"#;
        assert_eq!(json_number(line, "ns_per_notification"), Some(1138.71));
        assert_eq!(json_number(line, "reps"), Some(5.0));
        assert_eq!(json_number(line, "missing"), None);
    }
}
