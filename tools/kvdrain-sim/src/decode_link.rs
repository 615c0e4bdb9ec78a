//! The simulator's virtual network as a decode rank's consumer driver sees it: the shared
//! [`ConsumerDriver`](kvdrain_driver::consumer::ConsumerDriver) runs unchanged (the
//! directory, registration, heartbeat schedule, lost producers and decisions real NIXL runs), and
//! this [`Transport`] turns what it sends into simulation events, with the network's
//! faults applied here, never in the driver:
//!
//! * `PUSH_REG` to a producer agent reaches its rank 0..=`REG_LATENCY` ms later; the
//!   request's [`RequestPaths`] may drop every copy to one rank (F6, a partial
//!   registration) or hold them back on a slow path (`SLOW_PREFILL`, so the rank's lease
//!   may end first: F3/F4);
//! * `HB:` reaches each rank like a registration; on a slow path the request's id is
//!   lost from it, so that rank's lease on the request is never renewed (the F3/F4 the
//!   slow path is for);
//! * a send to an agent that is dead, or that no rank runs any more, succeeds and is lost
//!   (the rank is checked when the message arrives);
//! * notifications come from the event loop with their sender's agent name
//!   ([`Cluster::agent_name`]); a producer's death that the transport notices comes out
//!   of [`Transport::peer_gone`] (the driver reports it gone to the core: its edges fail
//!   and settle for `settle_ms`).
//!
//! A decode rank posts no WRITE: [`Transport::post_write`] refuses.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::ops::Range;

use kvdrain::AgentId;
use kvdrain::wire::{self, Message};
use kvdrain_driver::registration::PushRegistration;
use kvdrain_driver::transport::{
    DrainError, GonePeer, Notification, Peer, PostError, Posted, SendError, Transport, WriteSpec,
    WriteStatus,
};

use super::cluster::Cluster;
use super::faults::{Faults, Rates};
use super::link::request_number;
use super::rng::Rng;
use super::timing::{REG_LATENCY, SLOW_PREFILL};

/// The network's condition between the decode engine and the producer ranks of one
/// request, drawn when the request arrives.
#[derive(Clone, Debug, Default)]
pub struct RequestPaths {
    /// The producer rank that no `PUSH_REG` of the request reaches (F6).
    pub missed: Option<usize>,
    /// Slow ranks and the delay of the request's `PUSH_REG` to each.
    pub slow: Vec<(usize, u64)>,
}

impl RequestPaths {
    /// Draws the paths to producer ranks `ranks`, counting the faults drawn.
    pub fn roll(rng: &mut Rng, rates: &Rates, faults: &mut Faults, ranks: Range<usize>) -> Self {
        let missed = rng
            .chance(rates.partial_registration)
            .then(|| ranks.start + rng.below(ranks.len() as u64) as usize);
        faults.partial_registration += u64::from(missed.is_some());
        let mut slow = Vec::new();
        for rank in ranks.filter(|&rank| Some(rank) != missed) {
            if rng.chance(rates.slow_producer) {
                slow.push((rank, rng.between(SLOW_PREFILL.0, SLOW_PREFILL.1)));
            }
        }
        RequestPaths { missed, slow }
    }

    fn slow_delay(&self, rank: usize) -> Option<u64> {
        self.slow
            .iter()
            .find(|&&(r, _)| r == rank)
            .map(|&(_, delay)| delay)
    }
}

/// A message from a decode rank on its way to a producer rank.
#[derive(Clone, Debug)]
pub struct ToProducer {
    /// When it arrives.
    pub at: u64,
    /// The producer rank.
    pub rank: usize,
    /// The agent it was sent to (the rank drops it if it no longer runs as that agent).
    pub agent: AgentId,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// One decode rank's view of the network during one driver call.
#[derive(Debug)]
pub struct DecodeLink<'w> {
    /// The virtual time.
    pub now: u64,
    /// The run's generator.
    pub rng: &'w mut Rng,
    /// Who runs which agent.
    pub cluster: &'w Cluster,
    /// Per request in flight, its paths to the producer ranks.
    pub paths: &'w BTreeMap<u64, RequestPaths>,
    /// Notifications delivered to this rank.
    pub inbox: &'w mut Vec<Notification>,
    /// Producer agents this rank's transport saw gone.
    pub gone: &'w mut VecDeque<String>,
    /// The request a `register` call is for, set by the event loop around it: the
    /// `PUSH_REG`s it sends take that request's paths without decoding the msgpack again
    /// (`None`: decoded).
    pub registering: Option<u64>,
    /// Messages sent during the call.
    pub sent: Vec<ToProducer>,
}

impl DecodeLink<'_> {
    /// When `bytes` sent now reaches producer rank `rank`, and what of it does; `None`
    /// if it is lost.
    fn route(&mut self, rank: usize, bytes: &[u8]) -> Option<(u64, Vec<u8>)> {
        let latency = self.rng.between(0, REG_LATENCY);
        match wire::parse(bytes) {
            Ok(Message::Registration(payload)) => {
                let req = self.registering.or_else(|| {
                    PushRegistration::from_msgpack(payload)
                        .ok()
                        .and_then(|r| request_number(&r.request_id))
                });
                let paths = req.and_then(|req| self.paths.get(&req));
                if paths.is_some_and(|p| p.missed == Some(rank)) {
                    return None;
                }
                let delay = paths.and_then(|p| p.slow_delay(rank)).unwrap_or(latency);
                Some((self.now + delay, bytes.to_vec()))
            }
            Ok(Message::Heartbeat(hb)) => {
                let on_slow_path = |id: &str| {
                    request_number(id)
                        .and_then(|req| self.paths.get(&req))
                        .is_some_and(|p| p.slow_delay(rank).is_some())
                };
                if !hb.ids().any(on_slow_path) {
                    return Some((self.now + latency, bytes.to_vec()));
                }
                let ids: Vec<&str> = hb.ids().filter(|&id| !on_slow_path(id)).collect();
                if ids.is_empty() {
                    return None;
                }
                let mut buf = vec![0; bytes.len()];
                let n = wire::encode_heartbeat(ids.iter().copied(), &mut buf).ok()?;
                buf.truncate(n);
                Some((self.now + latency, buf))
            }
            _ => Some((self.now + latency, bytes.to_vec())),
        }
    }
}

impl Transport for DecodeLink<'_> {
    type Write = Infallible;

    fn post_write(&mut self, _: &WriteSpec<'_>) -> Result<Posted<Infallible>, PostError> {
        Err(PostError::Descriptor)
    }

    fn poll_write(&mut self, write: &mut Infallible) -> WriteStatus {
        match *write {}
    }

    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError> {
        let Peer::Agent(name) = to else {
            return Err(SendError::Unreachable);
        };
        let Some(agent) = Cluster::agent_named(name) else {
            return Err(SendError::Unreachable);
        };
        let Some(rank) = self.cluster.rank_running(agent) else {
            return Ok(()); // an incarnation that was replaced: lost
        };
        if let Some((at, bytes)) = self.route(rank, bytes) {
            self.sent.push(ToProducer {
                at,
                rank,
                agent,
                bytes,
            });
        }
        Ok(())
    }

    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError> {
        out.append(self.inbox);
        Ok(())
    }

    fn peer_gone(&mut self) -> Option<GonePeer> {
        self.gone.pop_front().map(GonePeer::Agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Shape;

    fn registration(id: &str) -> Vec<u8> {
        PushRegistration {
            request_id: id.to_owned(),
            decode_engine_id: "d".to_owned(),
            decode_host: "sim".to_owned(),
            decode_port: 0,
            decode_tp_size: 1,
            local_block_ids: vec![Vec::new()],
            remote_engine_id: "p0".to_owned(),
            remote_host: "sim".to_owned(),
            remote_port: 0,
            remote_tp_size: 2,
            remote_pp_size: 1,
            transfer_id: None,
        }
        .to_notification()
    }

    /// The request's paths decide what reaches each rank: the missed rank hears nothing of
    /// it, the slow one hears its `PUSH_REG` late and its heartbeats never; other requests
    /// and ranks are untouched; gone peers and deliveries pass through.
    #[test]
    fn paths_drop_delay_and_strip_per_request_and_rank() {
        let mut rng = Rng::new(1);
        let shape = Shape::Fixed {
            p_tp: 3,
            p_pp: 1,
            d_tp: 1,
        };
        let cluster = Cluster::new(shape, &mut rng).expect("valid");
        let paths = BTreeMap::from([(
            5,
            RequestPaths {
                missed: Some(0),
                slow: vec![(1, 200)],
            },
        )]);
        let (mut inbox, mut gone) = (Vec::new(), VecDeque::from(["agent-0".to_owned()]));
        let mut link = DecodeLink {
            now: 10,
            rng: &mut rng,
            cluster: &cluster,
            paths: &paths,
            inbox: &mut inbox,
            gone: &mut gone,
            registering: None,
            sent: Vec::new(),
        };
        let name = |rank: usize| Cluster::agent_name(cluster.ranks[rank].agent);
        for rank in 0..3 {
            link.send_notification(Peer::Agent(&name(rank)), &registration("req-5"))
                .expect("sent");
        }
        let reached: Vec<(usize, u64)> = link.sent.iter().map(|m| (m.rank, m.at)).collect();
        assert_eq!(reached.len(), 2, "rank 0 is missed: {reached:?}");
        assert_eq!(reached[0], (1, 210), "rank 1's path is slow");
        assert_eq!(reached[1].0, 2);
        assert!(reached[1].1 <= 10 + REG_LATENCY);
        link.sent.clear();
        let hb = b"HB:req-5-0000abcd,req-6-0000abcd";
        for rank in 1..3 {
            link.send_notification(Peer::Agent(&name(rank)), hb)
                .expect("sent");
        }
        assert_eq!(
            link.sent[0].bytes, b"HB:req-6-0000abcd",
            "request 5 stripped"
        );
        assert_eq!(link.sent[1].bytes, hb, "rank 2 hears both");
        assert_eq!(
            link.peer_gone(),
            Some(GonePeer::Agent("agent-0".to_owned()))
        );
        assert_eq!(link.peer_gone(), None);
        link.inbox.push(("agent-2".to_owned(), b"x".to_vec()));
        let mut out = Vec::new();
        link.drain_notifications(&mut out).expect("drained");
        assert_eq!(out, [("agent-2".to_owned(), b"x".to_vec())]);
        assert!(link.inbox.is_empty());
        assert_eq!(
            link.send_notification(Peer::Agent("stranger"), hb),
            Err(SendError::Unreachable)
        );
    }
}
