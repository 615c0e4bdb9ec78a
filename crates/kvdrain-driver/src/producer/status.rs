//! Status polling: every posted WRITE is polled until `Success` or a backend error; an
//! unreadable status is counted once, sends nothing and keeps the source blocks fenced.

use kvdrain::producer::EdgeState;

use super::{ProducerDriver, Push, TickReport};
use crate::transport::{Transport, WriteStatus};

impl<W> ProducerDriver<W> {
    pub(super) fn poll_writes<T: Transport<Write = W>>(
        &mut self,
        push: &mut Push<W>,
        transport: &mut T,
        report: &mut TickReport,
        errored: &mut Vec<(String, u16)>,
    ) {
        let engine = push.registration.decode_engine_id.clone();
        let _span = tracing::debug_span!("push", req = %push.keys.id).entered();
        let mut i = 0;
        while i < push.writes.len() {
            let d = push.writes[i].0;
            match transport.poll_write(&mut push.writes[i].1) {
                WriteStatus::InProgress => i += 1,
                WriteStatus::Unknown => {
                    if push.plan.edge(d).map(|e| e.state) == Some(EdgeState::Posted) {
                        tracing::warn!(
                            d_rank = d,
                            cause = "status_unknown",
                            "write status lost: no PUSH_FAIL, sources stay fenced"
                        );
                        self.counters.status_unknown += 1;
                        let step = push.plan.status_unknown(d);
                        self.plan_step(step);
                    }
                    i += 1;
                }
                WriteStatus::Success => {
                    let step = push.plan.landed_after_unknown(d);
                    self.plan_step(step);
                    push.writes.swap_remove(i);
                    self.counters.landed += 1;
                    report.finished += 1;
                    self.finished_one(&engine, d);
                }
                WriteStatus::BackendError => {
                    tracing::warn!(
                        d_rank = d,
                        cause = "after_post",
                        "write failed after posting"
                    );
                    let step = push.plan.backend_error(d);
                    self.plan_step(step);
                    push.writes.swap_remove(i);
                    self.counters.failed_after_post += 1;
                    report.finished += 1;
                    self.finished_one(&engine, d);
                    errored.push((engine.clone(), d));
                }
            }
        }
    }
}
