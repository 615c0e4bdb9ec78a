//! The heartbeat schedule: every `lease / 6` while any request is tracked, one `HB:` per
//! producer engine naming P's ids of its requests still waiting for a decision (F9), to
//! each of the engine's agents.

use std::collections::BTreeMap;

use kvdrain::Instant;

use super::ConsumerEngine;
use crate::transport::Transport;

impl<const N: usize, const E: usize> ConsumerEngine<'_, N, E> {
    /// Sends a heartbeat round if one is due at the driver's clock.
    pub(super) fn heartbeat_if_due<T: Transport>(&mut self, transport: &mut T) {
        let interval = self.state.config.heartbeat_interval();
        if self
            .state
            .now
            .saturating_duration_since(self.state.last_heartbeat)
            >= interval
        {
            self.state.last_heartbeat = self.state.now;
            self.heartbeat(transport);
        }
    }

    /// When the next heartbeat round is due; `None` while nothing is tracked.
    pub(super) fn next_heartbeat(&self) -> Option<Instant> {
        let st = &*self.state;
        (!st.inflight.is_empty()).then(|| st.last_heartbeat + st.config.heartbeat_interval())
    }

    /// `HB:` with P's request ids still waiting, per producer engine, to each of its agents.
    fn heartbeat<T: Transport>(&mut self, transport: &mut T) {
        let st = &*self.state;
        // Engines in name order: the sends go out in the same order on every run.
        let mut per_engine: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for f in st.inflight.values().filter(|f| f.heartbeat) {
            let id = f.request.remote_request_id.as_str();
            if !id.is_empty() && !id.contains(',') {
                per_engine
                    .entry(f.request.producer_engine.as_str())
                    .or_default()
                    .push(id);
            }
        }
        let mut sends = Vec::new();
        for (engine, mut ids) in per_engine {
            let Some(engine) = st.engines.get(engine) else {
                continue;
            };
            // The same bytes for the same requests, whatever the table's order.
            ids.sort_unstable();
            let len = 3 + ids.iter().map(|i| i.len() + 1).sum::<usize>();
            let mut buf = vec![0; len];
            let Ok(n) = kvdrain::wire::encode_heartbeat(ids.iter().copied(), &mut buf) else {
                continue;
            };
            buf.truncate(n);
            for agent in &engine.agents {
                sends.push((agent.clone(), buf.clone()));
            }
        }
        for (agent, msg) in sends {
            if self.send(transport, &agent, &msg) {
                self.state.counters.heartbeats_sent += 1;
            } else {
                self.state.counters.heartbeats_failed += 1;
            }
        }
    }
}
