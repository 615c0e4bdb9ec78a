//! `kvdrain bench sweep`: `bench ingest` over R = 64 … 65 536 (powers of two) × E.
//!
//! One JSON line per point (as `bench ingest` prints it) and one for the floor on the
//! same stream, then one summary line per E: the medians' range over R, the ratio of the
//! largest to the smallest, and the largest deviation from the median of the medians
//! (the "flat within ±20 %"), for wall time, CPU time and the floor's CPU time.

use std::fmt::Write as _;

use super::ingest::{self, Inputs, Mode, Shape};
use super::stream::{DEFAULT_SEED, Params};
use super::{Failure, Flags, Num, Spread, alloc, on_big_stack, stack_for};

fn parse_list(text: &str) -> Result<Vec<usize>, Failure> {
    text.split(',')
        .map(|t| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|&v| v >= 1)
                .ok_or_else(|| Failure::Usage(format!("--edges-list: bad entry {t:?}")))
        })
        .collect()
}

/// `,"<p>ns_median_of_medians":..,...,"<p>by_inflight":{..}` for one set of medians.
fn flatness(line: &mut String, p: &str, medians: &[(usize, f64)]) {
    let values: Vec<f64> = medians.iter().map(|m| m.1).collect();
    let s = Spread::of(&values);
    let deviation = values
        .iter()
        .map(|v| (v / s.median - 1.0).abs())
        .fold(0.0, f64::max);
    let _ = write!(
        line,
        ",\"{p}ns_median_of_medians\":{},\"{p}ns_lowest\":{},\"{p}ns_highest\":{},\
\"{p}highest_over_lowest\":{},\"{p}max_deviation_pct\":{},\"{p}by_inflight\":{{",
        Num(s.median),
        Num(s.min),
        Num(s.max),
        Num(s.max / s.min),
        Num(deviation * 100.0)
    );
    for (i, (r, ns)) in medians.iter().enumerate() {
        let _ = write!(
            line,
            "{}\"{r}\":{}",
            if i == 0 { "" } else { "," },
            Num(*ns)
        );
    }
    line.push('}');
}

/// `kvdrain bench sweep`.
pub fn main(mut flags: Flags) -> Result<(), Failure> {
    let notifications = flags.count("notifications", Some(1_000_000))?;
    let edges_list = parse_list(flags.string("edges-list")?.as_deref().unwrap_or("1,2,8,32"))?;
    let min = flags.count("min-inflight", Some(64))?;
    let max = flags.count("max-inflight", Some(65_536))?;
    let mode = Mode::from_flag(flags.string("mode")?.as_deref())?;
    let fail_share = flags.f64("fail-share", 0.01)?;
    let reps = flags.count("reps", Some(11))?;
    let seed = flags.u64("seed")?.unwrap_or(DEFAULT_SEED);
    flags.finish()?;
    if !(0.0..=1.0).contains(&fail_share) {
        return Err(Failure::Usage("--fail-share must be within [0, 1]".into()));
    }
    let counting = alloc::counting();
    let mut failures = Vec::new();
    for &edges in &edges_list {
        let mut medians = Vec::new();
        let mut inflight = min;
        while inflight <= max {
            let params = Params {
                inflight,
                edges,
                notifications,
                fail_share,
                seed,
            };
            let shape = Shape::for_run(inflight, edges, mode)?;
            let inputs = Inputs::generate(&params);
            let w = inputs.workload(&params, mode);
            // The floor, interleaved, so the summary can say how much of the growth
            // with R any hash-table counter pays (caches), and how much is kvdrain's.
            let (passes, floor) = on_big_stack(stack_for(shape.bytes), || {
                let (mut kv, mut fl) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    kv.push(shape.pass(&w));
                    fl.push(ingest::floor_pass(&w));
                }
                (kv, fl)
            })?;
            let mut line = String::new();
            let spreads = ingest::json_line(&mut line, "kvdrain", &w, &passes, counting);
            let _ = write!(line, ",\"ledger\":\"{}\"}}", shape.name());
            println!("{line}");
            line.clear();
            let floor_spreads = ingest::json_line(&mut line, "rust-floor", &w, &floor, counting);
            line.push_str(",\"hasher\":\"rustc-hash 2\"}");
            println!("{line}");
            if let Err(Failure::Check(e) | Failure::Usage(e)) =
                ingest::check("kvdrain", &w, &passes, counting)
            {
                failures.push(e);
            }
            medians.push((
                inflight,
                spreads.wall.median,
                spreads.cpu.median,
                floor_spreads.cpu.median,
            ));
            inflight *= 2;
        }
        if medians.is_empty() {
            continue;
        }
        let mut line = String::new();
        let _ = write!(
            line,
            "{{\"sweep\":\"summary\",\"edges\":{edges},\"mode\":\"{}\",\"inflight_min\":{min},\
\"inflight_max\":{max}",
            mode.name()
        );
        flatness(
            &mut line,
            "",
            &medians.iter().map(|m| (m.0, m.1)).collect::<Vec<_>>(),
        );
        flatness(
            &mut line,
            "cpu_",
            &medians.iter().map(|m| (m.0, m.2)).collect::<Vec<_>>(),
        );
        let floor: Vec<(usize, f64)> = medians.iter().map(|m| (m.0, m.3)).collect();
        flatness(&mut line, "floor_cpu_", &floor);
        line.push('}');
        println!("{line}");
    }
    match failures.first() {
        None => Ok(()),
        Some(e) => Err(Failure::Check(e.clone())),
    }
}
