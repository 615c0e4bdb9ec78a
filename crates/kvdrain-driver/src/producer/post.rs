//! The post loop: once a push is paired, every edge its plan allows is posted as one WRITE
//! (with the completion it carries); a WRITE that cannot be described or posted, or whose
//! handshake fails, is recorded in the plan and owes a failure notice.

use super::notices::notice_bytes;
use super::{ProducerDriver, Push, TickReport};
use crate::transport::{PostError, Posted, Transport, WriteSpec};

impl<W> ProducerDriver<W> {
    /// Posts every edge the plan allows.
    pub(super) fn start<T: Transport<Write = W>>(
        &mut self,
        push: &mut Push<W>,
        transport: &mut T,
        report: &mut TickReport,
    ) {
        let _span = tracing::debug_span!("push", req = %push.keys.id).entered();
        let Some(source) = push.source.as_ref() else {
            return;
        };
        tracing::debug!("posting");
        let topology = self.topology(&push.registration);
        let body = notice_bytes(&push.registration.request_id, self.config.tp_size, false);
        // By index: the plan's edges are fixed once planned, and posting changes their states.
        for i in 0..push.plan.edges().len() {
            let edge = push.plan.edges()[i];
            let d = edge.d_rank;
            if push.plan.may_post(d).is_err() {
                continue;
            }
            let spec = WriteSpec {
                producer_request_id: &push.keys.id,
                registration: &push.registration,
                topology,
                tp_rank: self.config.tp_rank,
                d_rank: d,
                shape: edge.shape,
                source,
                completion: &body,
            };
            match transport.post_write(&spec) {
                Ok(Posted::InFlight(w)) => {
                    let step = push.plan.posted(d);
                    self.plan_step(step);
                    push.writes.push((d, w));
                    *self
                        .unfinished
                        .entry((push.registration.decode_engine_id.clone(), d))
                        .or_default() += 1;
                    self.counters.posted += 1;
                    report.posted += 1;
                }
                Ok(Posted::Done) => {
                    let step = push.plan.posted(d).and_then(|()| push.plan.landed(d));
                    self.plan_step(step);
                    self.counters.posted += 1;
                    self.counters.landed += 1;
                    report.posted += 1;
                    report.finished += 1;
                }
                Err(e) => {
                    if e == PostError::Handshake {
                        tracing::warn!(d_rank = d, cause = "handshake", "handshake failed");
                        self.counters.handshake_failures += 1;
                    }
                    tracing::warn!(d_rank = d, cause = "post", error = ?e, "write not posted");
                    self.counters.post_failures += 1;
                    let step = push.plan.post_failed(d);
                    self.plan_step(step);
                }
            }
        }
    }
}
