//! The checks at the end of a run: every request gave all its blocks back, every decode rank
//! has all its blocks free and its driver tracks nothing, no producer holds a request (but
//! those a WRITE of unknown status keeps fenced) or a pending WRITE, and every request
//! arrived. The checks of each step live where that step is handled.

use super::world::{BLOCKS, World};

impl World {
    pub(super) fn final_checks(&mut self) {
        let leftovers: Vec<String> = self
            .requests
            .iter()
            .map(|(req, r)| {
                let ranks: Vec<String> = r
                    .ranks
                    .iter()
                    .map(|p| format!("{:?}/released={}/done={}", p.outcome, p.released, p.done))
                    .collect();
                format!(
                    "request {req} (arrived {} ms) never gave all its blocks back: {}",
                    r.arrived,
                    ranks.join(", ")
                )
            })
            .collect();
        for what in leftovers {
            self.violation(what);
        }
        for d in 0..self.consumers.len() {
            let c = &mut self.consumers[d];
            let (free, in_flight, tracked) = (
                c.pool.free_blocks(),
                c.pool.writes_in_flight(),
                c.driver.engine().in_flight(),
            );
            if free != BLOCKS as usize || in_flight != 0 || tracked != 0 {
                self.violation(format!(
                    "rank {d} at the end: {free} of {BLOCKS} blocks free, \
                     {in_flight} writes in flight, {tracked} requests tracked"
                ));
            }
        }
        // A request with a WRITE of unknown status keeps its sources fenced until a backend
        // error to the same decode rank bounds it (F7); at the end none may be held otherwise.
        let held: usize = self
            .producers
            .iter()
            .map(|p| p.in_flight() - p.fenced_unknown())
            .sum();
        self.decisions.fenced_edges = self
            .consumers
            .iter()
            .map(|c| c.driver.counters().fenced_edges)
            .sum();
        self.decisions.gone_edges = self
            .consumers
            .iter()
            .map(|c| c.driver.counters().gone_edges)
            .sum();
        if held != 0 || !self.writes.is_empty() {
            self.violation(format!(
                "producers at the end: {held} requests held, {} writes pending",
                self.writes.len()
            ));
        }
        self.faults.deferred_post_refused = self
            .producers
            .iter()
            .map(|p| p.counters().registrations_retired)
            .sum();
        if self.arrived != self.config.requests {
            self.violation(format!(
                "{} of {} requests arrived",
                self.arrived, self.config.requests
            ));
        }
    }
}
