//! The simulator's virtual network as the producer driver sees it during one tick: the
//! shared [`ProducerDriver`](kvdrain_driver::producer::ProducerDriver) runs unchanged (the
//! pairing, leases, retired ids, plans and owed notices real NIXL runs), and this
//! [`Transport`] turns what it asks for into simulation events, with faults.
//!
//! * a post fails (C2) at the `post_fail` rate; otherwise the WRITE is recorded and ends
//!   1..=`WRITE_MAX` ms later, failing (F7, a backend error) at the `write_fail` rate;
//! * a status poll reads the outcome the event loop recorded when the WRITE ended — or, at
//!   the `status_unknown` rate, reads nothing the producer can use (F7): the WRITE still
//!   lands or fails, but the producer must keep its sources fenced and send nothing;
//! * a failure notice is lost at the `notice_lost` rate, and never sent for a request whose
//!   producer aborted silently;
//! * the physical destination blocks of `(request, D rank)` come from the simulation (the
//!   transport resolves them, as NIXL's descriptors do from each rank's layout).

use std::collections::{BTreeMap, BTreeSet};

use kvdrain::wire::{self, Message};
use kvdrain_driver::transport::{
    DrainError, GonePeer, Notification, Peer, PostError, Posted, SendError, Transport, WriteSpec,
    WriteStatus,
};

use super::faults::{Faults, Rates};
use super::rng::Rng;
use super::timing::WRITE_MAX;

/// A posted WRITE's handle: its id in the event loop.
#[derive(Debug)]
pub struct SimWrite(pub u64);

/// A WRITE posted during a tick, for the event loop to schedule.
#[derive(Clone, Debug)]
pub struct PostedWrite {
    /// Its id.
    pub id: u64,
    /// The request.
    pub req: u64,
    /// The decode rank written.
    pub d: usize,
    /// The physical blocks written.
    pub blocks: Vec<u32>,
    /// Whether it will land (else a backend error).
    pub ok: bool,
    /// Whether its status will be unreadable to the producer (it lands or fails anyway).
    pub unknown: bool,
    /// When it ends.
    pub done_at: u64,
}

/// The request number of a consumer-side id `req-N`.
pub fn request_number(id: &str) -> Option<u64> {
    id.strip_prefix("req-")?.split('-').next()?.parse().ok()
}

/// One producer rank's view of the network during one tick.
#[derive(Debug)]
pub struct SimLink<'w> {
    /// The virtual time.
    pub now: u64,
    /// The run's generator.
    pub rng: &'w mut Rng,
    /// Fault rates.
    pub rates: &'w Rates,
    /// Fault counts.
    pub faults: &'w mut Faults,
    /// Notifications delivered to this rank.
    pub inbox: &'w mut Vec<Notification>,
    /// Outcomes of this rank's WRITEs that ended, by id.
    pub finished: &'w mut BTreeMap<u64, WriteStatus>,
    /// Per request, the physical blocks of each decode rank.
    pub targets: &'w BTreeMap<u64, Vec<Vec<u32>>>,
    /// Requests whose producer aborted without sending what it owes.
    pub silent: &'w BTreeSet<u64>,
    /// The next WRITE id.
    pub next_write: &'w mut u64,
    /// WRITEs posted this tick.
    pub posted: Vec<PostedWrite>,
    /// Notifications sent this tick: `(decode rank, bytes)`.
    pub sent: Vec<(usize, Vec<u8>)>,
}

impl Transport for SimLink<'_> {
    type Write = SimWrite;

    fn post_write(&mut self, spec: &WriteSpec<'_>) -> Result<Posted<SimWrite>, PostError> {
        let d = usize::from(spec.d_rank);
        let blocks = request_number(&spec.registration.request_id)
            .and_then(|req| Some((req, self.targets.get(&req)?.get(d)?.clone())));
        let Some((req, blocks)) = blocks else {
            return Err(PostError::Descriptor);
        };
        if self.rng.chance(self.rates.post_fail) {
            self.faults.post_failed += 1;
            return Err(PostError::Post);
        }
        let id = *self.next_write;
        *self.next_write += 1;
        let ok = !self.rng.chance(self.rates.write_fail);
        let unknown = self.rng.chance(self.rates.status_unknown);
        let done_at = self.now + self.rng.between(1, WRITE_MAX);
        self.posted.push(PostedWrite {
            id,
            req,
            d,
            blocks,
            ok,
            unknown,
            done_at,
        });
        Ok(Posted::InFlight(SimWrite(id)))
    }

    fn poll_write(&mut self, write: &mut SimWrite) -> WriteStatus {
        self.finished
            .remove(&write.0)
            .unwrap_or(WriteStatus::InProgress)
    }

    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError> {
        let Peer::ConsumerRank { rank, .. } = to else {
            return Err(SendError::Unreachable);
        };
        let req = match wire::parse(bytes) {
            Ok(Message::Failure(c) | Message::Completion(c)) => request_number(c.request_id),
            _ => None,
        };
        if req.is_some_and(|r| self.silent.contains(&r)) {
            return Err(SendError::Unreachable);
        }
        if self.rng.chance(self.rates.notice_lost) {
            self.faults.notice_lost += 1;
            return Err(SendError::Unreachable);
        }
        self.sent.push((usize::from(rank), bytes.to_vec()));
        Ok(())
    }

    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError> {
        out.append(self.inbox);
        Ok(())
    }

    fn peer_gone(&mut self) -> Option<GonePeer> {
        None
    }
}
