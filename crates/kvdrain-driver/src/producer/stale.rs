//! Consumer ranks' unfinished WRITEs and stale metadata: a backend error (or a disconnect) to
//! a consumer rank bounds every WRITE to it whose status was unknown, and the rank's metadata
//! is dropped ([`Transport::forget_peer`]) only once nothing to it is unfinished.

use kvdrain::producer::EdgeState;

use super::ProducerDriver;
use crate::transport::{Peer, Transport};

impl<W> ProducerDriver<W> {
    pub(super) fn finished_one(&mut self, engine: &str, d: u16) {
        let key = (engine.to_owned(), d);
        if let Some(n) = self.unfinished.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.unfinished.remove(&key);
            }
        }
    }

    /// A backend error (or a disconnect) for consumer rank `(engine, d)`: every write to it
    /// whose status was unknown is bounded now and owes its notice; its metadata is
    /// refreshed once nothing to it is unfinished.
    pub(super) fn peer_failed(&mut self, engine: &str, d: u16) {
        let mut bounded = 0;
        for push in self.pushes.values_mut() {
            if push.registration.decode_engine_id != engine
                || push.plan.edge(d).map(|e| e.state) != Some(EdgeState::Unknown)
            {
                continue;
            }
            if push.plan.backend_error(d).is_err() {
                self.counters.plan_errors += 1;
            }
            push.writes.retain(|(w, _)| *w != d);
            bounded += 1;
        }
        for _ in 0..bounded {
            self.finished_one(engine, d);
        }
        let key = (engine.to_owned(), d);
        if !self.stale.contains(&key) {
            self.stale.push(key);
        }
    }

    pub(super) fn refresh_stale<T: Transport<Write = W>>(&mut self, transport: &mut T) {
        let unfinished = &self.unfinished;
        self.stale.retain(|(engine, rank)| {
            if unfinished.contains_key(&(engine.clone(), *rank)) {
                return true;
            }
            transport.forget_peer(Peer::ConsumerRank {
                engine,
                rank: *rank,
            });
            false
        });
    }
}
