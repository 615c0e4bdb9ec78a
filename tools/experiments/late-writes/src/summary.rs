//! The summary of a series of runs: per fault and transport, the distribution of "last late
//! byte after the failure event" (failure notice, disconnect or expiry, whichever came
//! first; and after each of them), and the violation count; and the `settle_ms` the
//! measurement supports.

use serde::Serialize;

use crate::coordinator::RunRecord;
use crate::spec::{Fault, Transport};

/// The floor of the recommended settling, ms.
pub const SETTLE_FLOOR_MS: u64 = 5000;
/// Settling must exceed the worst gap seen by this factor.
pub const SETTLE_FACTOR: u64 = 10;

/// min / p50 / p99 / max of a sample, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Spread {
    /// Samples.
    pub n: usize,
    /// Smallest.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile (nearest rank).
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl Spread {
    /// The spread of `samples` (all zero when empty).
    pub fn of(mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        let n = samples.len();
        if n == 0 {
            return Spread::default();
        }
        let rank = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        Spread {
            n,
            min: samples[0],
            p50: rank(0.5),
            p99: rank(0.99),
            max: samples[n - 1],
        }
    }
}

/// One fault × transport cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// The fault.
    pub fault: Fault,
    /// The transport.
    pub transport: Transport,
    /// Runs.
    pub runs: usize,
    /// Runs whose fault hit while the write was in progress.
    pub mid_write: usize,
    /// Runs by D's outcome: completed, failed, expired.
    pub outcomes: [usize; 3],
    /// Runs by first event: notice, disconnect (a failed heartbeat), expiry.
    pub events: [usize; 3],
    /// Runs where some page landed after the event.
    pub late_runs: usize,
    /// Gap from the first failure event to the last landing, over runs with an event (0
    /// when nothing landed after it), µs.
    pub gap: Spread,
    /// The same from the failure notice, over runs where one arrived.
    pub gap_notice: Spread,
    /// The same from the disconnect, over runs where D found P gone.
    pub gap_disconnect: Spread,
    /// The same from the expiry, over runs that expired.
    pub gap_expiry: Spread,
    /// Pages landed after D's reuse stamps, summed.
    pub violations: u64,
    /// Runs with at least one violation.
    pub violating_runs: usize,
}

/// Every cell plus the totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Cells with at least one run.
    pub cells: Vec<Cell>,
    /// Worst gap after the first failure event over every run, µs.
    pub worst_gap_us: u64,
    /// Worst gap after a failure notice or a disconnect over every run, µs: what settling
    /// must cover (a peer's death is followed by late bytes too, over TCP).
    pub worst_settled_gap_us: u64,
    /// Violations over every run.
    pub violations: u64,
}

impl Summary {
    /// Summarizes `records`.
    pub fn of(records: &[RunRecord]) -> Self {
        let mut cells = Vec::new();
        for transport in [Transport::Tcp, Transport::Shm] {
            for fault in Fault::ALL {
                let rs: Vec<&RunRecord> = records
                    .iter()
                    .filter(|r| r.spec.fault == fault && r.spec.transport == transport)
                    .collect();
                if rs.is_empty() {
                    continue;
                }
                let count = |key: &str, v: &str| {
                    rs.iter().filter(|r| r.consumer.get(key) == Some(v)).count()
                };
                let gaps = |m: &str| Spread::of(rs.iter().filter_map(|r| r.gap_after(m)).collect());
                cells.push(Cell {
                    fault,
                    transport,
                    runs: rs.len(),
                    mid_write: rs.iter().filter(|r| r.fault_mid_write()).count(),
                    outcomes: [
                        count("outcome", "completed"),
                        count("outcome", "failed"),
                        count("outcome", "expired"),
                    ],
                    events: [
                        count("event", "notice"),
                        count("event", "disconnect"),
                        count("event", "expiry"),
                    ],
                    late_runs: rs.iter().filter(|r| r.late_pages() > 0).count(),
                    gap: gaps("event"),
                    gap_notice: gaps("notice"),
                    gap_disconnect: gaps("disconnect"),
                    gap_expiry: gaps("expiry"),
                    violations: rs.iter().map(|r| r.violations()).sum(),
                    violating_runs: rs.iter().filter(|r| r.violations() > 0).count(),
                });
            }
        }
        Summary {
            worst_gap_us: cells.iter().map(|c| c.gap.max).max().unwrap_or(0),
            worst_settled_gap_us: cells
                .iter()
                .map(|c| c.gap_notice.max.max(c.gap_disconnect.max))
                .max()
                .unwrap_or(0),
            violations: cells.iter().map(|c| c.violations).sum(),
            cells,
        }
    }

    /// The settling the measurement supports: `SETTLE_FACTOR ×` the worst gap after a
    /// failure notice or a disconnect, rounded up to a second, and not below `SETTLE_FLOOR_MS`.
    /// (Expiries end in the quarantine, which must exceed their gaps instead.)
    pub fn recommended_settle_ms(&self) -> u64 {
        let ms = (self.worst_settled_gap_us * SETTLE_FACTOR).div_ceil(1000);
        ms.div_ceil(1000).saturating_mul(1000).max(SETTLE_FLOOR_MS)
    }

    /// A table for people.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "fault transport runs mid-write completed/failed/expired notice/disconnect/expiry \
             late-runs violations(runs) | last landing after, ms: n min p50 p99 max\n",
        );
        let ms = |us: u64| us as f64 / 1000.0;
        for c in &self.cells {
            s.push_str(&format!(
                "{:<5} {:<9} {:>4} {:>9} {:>9}/{}/{} {:>12}/{}/{} {:>9} {:>10}({})\n",
                c.fault.letter(),
                c.transport.name(),
                c.runs,
                c.mid_write,
                c.outcomes[0],
                c.outcomes[1],
                c.outcomes[2],
                c.events[0],
                c.events[1],
                c.events[2],
                c.late_runs,
                c.violations,
                c.violating_runs,
            ));
            for (what, g) in [
                ("first event", c.gap),
                ("notice", c.gap_notice),
                ("disconnect", c.gap_disconnect),
                ("expiry", c.gap_expiry),
            ] {
                if g.n > 0 {
                    s.push_str(&format!(
                        "{:>60} {what:<11} {:>4} {:>8.1} {:>8.1} {:>8.1} {:>8.1}\n",
                        "|",
                        g.n,
                        ms(g.min),
                        ms(g.p50),
                        ms(g.p99),
                        ms(g.max)
                    ));
                }
            }
        }
        s.push_str(&format!(
            "worst gap after the first event {:.1} ms, after a failure notice or disconnect {:.1} ms; \
             violations {}; settle_ms >= {} (max({SETTLE_FLOOR_MS}, {SETTLE_FACTOR} x that gap))\n",
            ms(self.worst_gap_us),
            ms(self.worst_settled_gap_us),
            self.violations,
            self.recommended_settle_ms()
        ));
        s
    }

    /// One JSON line.
    pub fn to_json(&self) -> String {
        let line = SummaryLine {
            summary: self.cells.iter().map(CellLine::of).collect(),
            worst_gap_us: self.worst_gap_us,
            worst_settled_gap_us: self.worst_settled_gap_us,
            violations: self.violations,
            recommended_settle_ms: self.recommended_settle_ms(),
        };
        serde_json::to_string(&line).unwrap_or_default()
    }
}

/// The summary's JSON line.
#[derive(Serialize)]
struct SummaryLine<'a> {
    summary: Vec<CellLine<'a>>,
    worst_gap_us: u64,
    worst_settled_gap_us: u64,
    violations: u64,
    recommended_settle_ms: u64,
}

/// One cell in the summary's JSON line.
#[derive(Serialize)]
struct CellLine<'a> {
    fault: &'a str,
    transport: &'a str,
    runs: usize,
    mid_write: usize,
    completed: usize,
    failed: usize,
    expired: usize,
    by_notice: usize,
    by_disconnect: usize,
    by_expiry: usize,
    late_runs: usize,
    gap_after_event_us: Spread,
    gap_after_notice_us: Spread,
    gap_after_disconnect_us: Spread,
    gap_after_expiry_us: Spread,
    violations: u64,
    violating_runs: usize,
}

impl CellLine<'_> {
    fn of(c: &Cell) -> CellLine<'_> {
        CellLine {
            fault: c.fault.letter(),
            transport: c.transport.name(),
            runs: c.runs,
            mid_write: c.mid_write,
            completed: c.outcomes[0],
            failed: c.outcomes[1],
            expired: c.outcomes[2],
            by_notice: c.events[0],
            by_disconnect: c.events[1],
            by_expiry: c.events[2],
            late_runs: c.late_runs,
            gap_after_event_us: c.gap,
            gap_after_notice_us: c.gap_notice,
            gap_after_disconnect_us: c.gap_disconnect,
            gap_after_expiry_us: c.gap_expiry,
            violations: c.violations,
            violating_runs: c.violating_runs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_and_the_recommendation() {
        let s = Spread::of(vec![5, 1, 3, 2, 4]);
        assert_eq!((s.n, s.min, s.p50, s.p99, s.max), (5, 1, 3, 5, 5));
        assert_eq!(Spread::of(Vec::new()), Spread::default());
        let mut sum = Summary {
            cells: Vec::new(),
            worst_gap_us: 2_000_000,
            worst_settled_gap_us: 812_000,
            violations: 0,
        };
        assert_eq!(sum.recommended_settle_ms(), 9000);
        sum.worst_settled_gap_us = 12_000;
        assert_eq!(sum.recommended_settle_ms(), 5000);
    }
}
