//! Owed notices: the bytes of a completion or a failure notice, and sending every
//! `PUSH_FAIL` a push's plan owes (retried while the consumer rank's metadata is stale,
//! counted as unsendable when the rank cannot be reached).

use kvdrain::wire::{self, Body};

use super::{ProducerDriver, Push, TickReport};
use crate::PerRequest;
use crate::transport::{Peer, SendError, Transport};

/// The bytes of a completion (`REQ:TP`) or, with `failure`, of a failure notice
/// (`PUSH_FAIL:REQ:TP`) for `request_id`; empty for an id the wire cannot carry (one that
/// starts with a reserved prefix).
pub fn notice_bytes(request_id: &str, tp_size: u16, failure: bool) -> Vec<u8> {
    let c = Body {
        request_id,
        tp_size,
    };
    let mut buf = vec![0; wire::PUSH_FAIL_PREFIX.len() + c.encoded_len()];
    let n = if failure {
        c.encode_failure(&mut buf)
    } else {
        c.encode(&mut buf)
    };
    // The buffer is sized for the longest form.
    buf.truncate(n.unwrap_or(0));
    buf
}

impl<W> ProducerDriver<W> {
    pub(super) fn send_owed<T: Transport<Write = W>>(
        &mut self,
        push: &mut Push<W>,
        transport: &mut T,
        report: &mut TickReport,
    ) {
        let owed: PerRequest<u16> = push.plan.owed_notices().collect();
        if owed.is_empty() {
            return;
        }
        let body = notice_bytes(&push.registration.request_id, self.config.tp_size, true);
        let engine = push.registration.decode_engine_id.clone();
        for d in owed {
            let to = Peer::ConsumerRank {
                engine: &engine,
                rank: d,
            };
            let mut sent = transport.send_notification(to, &body);
            if sent == Err(SendError::Stale) && !self.unfinished.contains_key(&(engine.clone(), d))
            {
                // Nothing to that rank is unfinished: its metadata may be refreshed (F7).
                transport.forget_peer(to);
                self.stale.retain(|(e, r)| !(e == &engine && *r == d));
                sent = transport.send_notification(to, &body);
            }
            match sent {
                Ok(()) => {
                    tracing::debug!(req = %push.keys.id, d_rank = d, "PUSH_FAIL sent");
                    let step = push.plan.noticed(d);
                    self.plan_step(step);
                    self.counters.notices_sent += 1;
                    report.notices += 1;
                }
                // A write to that rank is unfinished: keep the notice owed, retry later.
                Err(SendError::Stale) => {
                    let key = (engine.clone(), d);
                    if !self.stale.contains(&key) {
                        self.stale.push(key);
                    }
                }
                Err(SendError::Unreachable | SendError::PeerGone) => {
                    tracing::warn!(req = %push.keys.id, d_rank = d, cause = "notice_unsendable", "PUSH_FAIL could not be sent");
                    let step = push.plan.unreachable(d);
                    self.plan_step(step);
                    self.counters.notices_unsendable += 1;
                }
            }
        }
    }
}
