//! What a run found: decision counts, fault counts, and every violation of the invariants
//! with the step that broke it.

use std::fmt;

use kvdrain::IgnoreReason;
use serde::{Serialize, Serializer};

use super::faults::Faults;

/// Every decision and refusal the consumers' trackers took, summed over decode ranks
/// (serialised with its fields in this order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Decisions {
    /// `completed`.
    pub completed: u64,
    /// `failed`.
    pub failed: u64,
    /// `aborted`.
    pub aborted: u64,
    /// `expired`.
    pub expired: u64,
    /// `released` after every edge resolved.
    pub released: u64,
    /// `released` with `forced: true`.
    pub released_forced: u64,
    /// `rejected` / `full`.
    pub rejected_full: u64,
    /// `rejected` / `duplicate_id`.
    pub rejected_duplicate_id: u64,
    /// `ignored` / `malformed`.
    pub ignored_malformed: u64,
    /// `ignored` / `not_for_consumer`.
    pub ignored_not_for_consumer: u64,
    /// `ignored` / `unknown`.
    pub ignored_unknown: u64,
    /// `ignored` / `late`.
    pub ignored_late: u64,
    /// `ignored` / `duplicate`.
    pub ignored_duplicate: u64,
    /// `ignored` / `unexpected_sender`.
    pub ignored_unexpected_sender: u64,
    /// Named edges resolved by fences.
    pub fenced_edges: u64,
    /// Named edges resolved by producers reported gone (they settle).
    pub gone_edges: u64,
}

impl Decisions {
    /// Counts one ignored notification.
    pub fn ignored(&mut self, reason: IgnoreReason) {
        *match reason {
            IgnoreReason::Malformed(_) => &mut self.ignored_malformed,
            IgnoreReason::NotForConsumer => &mut self.ignored_not_for_consumer,
            IgnoreReason::Unknown => &mut self.ignored_unknown,
            IgnoreReason::Late => &mut self.ignored_late,
            IgnoreReason::Duplicate => &mut self.ignored_duplicate,
            IgnoreReason::UnexpectedSender => &mut self.ignored_unexpected_sender,
        } += 1;
    }

    /// `(name, count)` in output order.
    pub fn entries(&self) -> [(&'static str, u64); 16] {
        [
            ("completed", self.completed),
            ("failed", self.failed),
            ("aborted", self.aborted),
            ("expired", self.expired),
            ("released", self.released),
            ("released_forced", self.released_forced),
            ("rejected_full", self.rejected_full),
            ("rejected_duplicate_id", self.rejected_duplicate_id),
            ("ignored_malformed", self.ignored_malformed),
            ("ignored_not_for_consumer", self.ignored_not_for_consumer),
            ("ignored_unknown", self.ignored_unknown),
            ("ignored_late", self.ignored_late),
            ("ignored_duplicate", self.ignored_duplicate),
            ("ignored_unexpected_sender", self.ignored_unexpected_sender),
            ("fenced_edges", self.fenced_edges),
            ("gone_edges", self.gone_edges),
        ]
    }
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Events processed before it (the step to stop at when reproducing).
    pub step: u64,
    /// Virtual time.
    pub at: u64,
    /// What broke.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {} at {} ms: {}", self.step, self.at, self.what)
    }
}

/// The outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Client requests simulated.
    pub requests: u64,
    /// Every violation (only the first [`Report::KEPT`] are kept in `first_violations`).
    pub violations: u64,
    /// The first violations, in order.
    pub first_violations: Vec<Violation>,
    /// Fault classes exercised.
    pub faults: Faults,
    /// Decisions taken.
    pub decisions: Decisions,
    /// Events processed.
    pub steps: u64,
    /// Virtual time at the end.
    pub virtual_ms: u64,
    /// The seed.
    pub seed: u64,
    /// The topology, as the command line gives it.
    pub topology: String,
    /// The consumers' `settle_ms`.
    pub settle_ms: u64,
    /// The cost of settling: block-milliseconds held between a `failed` decision and its
    /// `released`, summed over requests and decode ranks (0 with `settle_ms = 0` unless a
    /// fence decides: a fence resolves at once).
    pub held_after_failed_block_ms: u64,
}

impl Report {
    /// How many violations are kept with their details.
    pub const KEPT: usize = 20;

    /// Records a violation.
    pub fn violation(&mut self, step: u64, at: u64, what: String) {
        self.violations += 1;
        if self.first_violations.len() < Self::KEPT {
            self.first_violations.push(Violation { step, at, what });
        }
    }

    /// Mean block-milliseconds a `failed` request held on a decode rank after the
    /// decision (0 without failures).
    pub fn held_per_failed(&self) -> f64 {
        if self.decisions.failed == 0 {
            return 0.0;
        }
        let per = self.held_after_failed_block_ms as f64 / self.decisions.failed as f64;
        (per * 10.0).round() / 10.0
    }

    /// The one JSON line the command prints.
    pub fn to_json(&self) -> String {
        let line = Line {
            requests: self.requests,
            violations: self.violations,
            faults: FaultCounts(&self.faults),
            decisions: &self.decisions,
            seed: self.seed,
            topology: &self.topology,
            steps: self.steps,
            virtual_ms: self.virtual_ms,
            settle_ms: self.settle_ms,
            settle_hold_block_ms: self.held_after_failed_block_ms,
            settle_hold_per_failed_block_ms: self.held_per_failed(),
        };
        serde_json::to_string(&line).unwrap_or_default()
    }
}

/// The printed line: these keys, in this order.
#[derive(Serialize)]
struct Line<'a> {
    requests: u64,
    violations: u64,
    faults: FaultCounts<'a>,
    decisions: &'a Decisions,
    seed: u64,
    topology: &'a str,
    steps: u64,
    virtual_ms: u64,
    settle_ms: u64,
    settle_hold_block_ms: u64,
    settle_hold_per_failed_block_ms: f64,
}

/// The fault counts as an object, in [`Faults::entries`] order.
struct FaultCounts<'a>(&'a Faults);

impl Serialize for FaultCounts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.entries())
    }
}
