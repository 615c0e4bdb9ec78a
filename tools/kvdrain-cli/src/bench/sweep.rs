//! `kvdrain bench sweep`: `bench ingest` over R = 64 … 65 536 (powers of two) × E.
//!
//! One JSON line per point (as `bench ingest` prints it) and one for the floor on the
//! same stream, then one summary line per E: the medians' range over R, the ratio of the
//! largest to the smallest, and the largest deviation from the median of the medians
//! (the target: "flat within ±20 %"), for wall time, CPU time and the floor's CPU time.

use super::args::SweepArgs;
use super::ingest::{self, Inputs, Mode, Shape};
use super::stream::Params;
use super::{Failure, Line, Spread, alloc, num, on_big_stack, stack_for};

/// Adds `"<p>ns_median_of_medians":..,...,"<p>by_inflight":{..}` for one set of medians.
fn flatness(line: &mut Line, p: &str, medians: &[(usize, f64)]) {
    let values: Vec<f64> = medians.iter().map(|m| m.1).collect();
    let s = Spread::of(&values);
    let deviation = values
        .iter()
        .map(|v| (v / s.median - 1.0).abs())
        .fold(0.0, f64::max);
    line.put(format!("{p}ns_median_of_medians"), num(s.median))
        .put(format!("{p}ns_lowest"), num(s.min))
        .put(format!("{p}ns_highest"), num(s.max))
        .put(format!("{p}highest_over_lowest"), num(s.max / s.min))
        .put(format!("{p}max_deviation_pct"), num(deviation * 100.0));
    let mut by_inflight = Line::new();
    for (r, ns) in medians {
        by_inflight.put(r.to_string(), num(*ns));
    }
    line.put(format!("{p}by_inflight"), by_inflight.into_map());
}

/// `kvdrain bench sweep`.
pub fn main(args: &SweepArgs) -> Result<(), Failure> {
    let SweepArgs {
        notifications,
        ref edges_list,
        min_inflight: min,
        max_inflight: max,
        mode,
        fail_share,
        reps,
        seed,
    } = *args;
    let mode = Mode::from(mode);
    let points_per_e = std::iter::successors(Some(min), |r| r.checked_mul(2))
        .take_while(|&r| r <= max)
        .count();
    let progress = crate::progress::bar((points_per_e * edges_list.len()) as u64, "points");
    let counting = alloc::counting();
    let mut failures = Vec::new();
    for &edges in edges_list {
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
            progress.inc(1);
            let (spreads, floor_spreads) = progress.suspend(|| {
                let (mut line, spreads) = ingest::json_line("kvdrain", &w, &passes, counting);
                line.put("ledger", shape.name()).print();
                let (mut line, floor_spreads) =
                    ingest::json_line("rust-floor", &w, &floor, counting);
                line.put("hasher", "rustc-hash 2").print();
                (spreads, floor_spreads)
            });
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
        let mut line = Line::new();
        line.put("sweep", "summary")
            .put("edges", edges)
            .put("mode", mode.name())
            .put("inflight_min", min)
            .put("inflight_max", max);
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
        progress.suspend(|| line.print());
    }
    progress.finish_and_clear();
    match failures.first() {
        None => Ok(()),
        Some(e) => Err(Failure::Check(e.clone())),
    }
}
