//! `kvdrain bench compare`: kvdrain, the Rust floor and vLLM's Python path on one stream.
//!
//! kvdrain and the floor run interleaved on the same thread (rep by rep, alternating
//! which goes first), so machine noise hits both alike; the ratio is reported both as
//! the ratio of medians and as the median of per-rep ratios. Then
//! `bench/vllm_baseline.py` runs as a child process with the same flags, after checking
//! that it generates the same bytes (the first `min(M, 200 000)` messages are compared).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use super::ingest::{self, Inputs, Mode, Pass, Shape};
use super::stream::{self, Params};
use super::{Failure, Flags, Num, Spread, alloc, on_big_stack, stack_for};

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
        "/../bench/vllm_baseline.py"
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

/// The number after `"key":` in a one-line JSON object.
fn json_number(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// `kvdrain bench compare`.
pub fn main(mut flags: Flags) -> Result<(), Failure> {
    let params = ingest::stream_params(&mut flags, None)?;
    let mode = Mode::from_flag(flags.string("mode")?.as_deref())?;
    let reps = flags.count("reps", Some(11))?;
    let python = if flags.switch("no-python")? {
        None
    } else {
        Some(Python {
            interpreter: flags.string("python")?.unwrap_or_else(|| "python3".into()),
            script: flags
                .string("python-script")?
                .map_or_else(default_script, PathBuf::from),
            reps: flags.count("python-reps", Some(3))?,
        })
    };
    flags.finish()?;
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

    let (kv, fl, walk) = on_big_stack(stack_for(shape.bytes), || {
        let (mut kv, mut fl, mut walk) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..reps {
            if rep % 2 == 0 {
                kv.push(shape.pass(&w));
                fl.push(ingest::floor_pass(&w));
            } else {
                fl.push(ingest::floor_pass(&w));
                kv.push(shape.pass(&w));
            }
            walk.push(ingest::walk_pass(&w));
        }
        (kv, fl, walk)
    })?;

    let mut line = String::new();
    let kv_spread = ingest::json_line(&mut line, "kvdrain", &w, &kv, counting);
    let _ = write!(line, ",\"ledger\":\"{}\"}}", shape.name());
    println!("{line}");
    line.clear();
    let fl_spread = ingest::json_line(&mut line, "rust-floor", &w, &fl, counting);
    line.push_str(",\"hasher\":\"rustc-hash 2\"}");
    println!("{line}");
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
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\"compare\":\"R={} E={} M={} mode={} fail_share={}\",\
\"kvdrain_ns\":{},\"floor_ns\":{},\"python_ns\":{},\
\"kvdrain_cpu_ns\":{},\"floor_cpu_ns\":{},\"python_cpu_ns\":{},\
\"kvdrain_over_floor\":{},\"kvdrain_over_floor_cpu\":{},\
\"kvdrain_over_floor_paired\":{},\"kvdrain_over_floor_paired_cpu\":{},\
\"kvdrain_over_floor_paired_cpu_min\":{},\"kvdrain_over_floor_paired_cpu_max\":{},\
\"python_over_kvdrain\":{},\"python_over_kvdrain_cpu\":{},\
\"python_over_floor\":{},\"harness_walk_ns\":{},\"stream_checked_against_python\":{checked}}}",
        params.inflight,
        params.edges,
        params.notifications,
        mode.name(),
        params.fail_share,
        Num(kv_spread.wall.median),
        Num(fl_spread.wall.median),
        Num(py_wall),
        Num(kv_spread.cpu.median),
        Num(fl_spread.cpu.median),
        Num(py_cpu),
        Num(kv_spread.wall.median / fl_spread.wall.median),
        Num(kv_spread.cpu.median / fl_spread.cpu.median),
        Num(paired_wall.median),
        Num(paired_cpu.median),
        Num(paired_cpu.min),
        Num(paired_cpu.max),
        Num(py_wall / kv_spread.wall.median),
        Num(py_cpu / kv_spread.cpu.median),
        Num(py_wall / fl_spread.wall.median),
        Num(walk_spread.cpu.median),
    );
    println!("{s}");
    ingest::check("kvdrain", &w, &kv, counting)?;
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
