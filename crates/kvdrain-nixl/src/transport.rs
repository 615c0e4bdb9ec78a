//! The drivers' [`Transport`] over real NIXL: WRITEs with their completion attached, status
//! polls, notifications, and the P → D handshake cache. It reports what NIXL said; the
//! drivers decide what it means.
//!
//! | NIXL | reported as |
//! | --- | --- |
//! | `get_xfer_status` `InProgress` / `Success` | [`WriteStatus::InProgress`] / [`WriteStatus::Success`] |
//! | `get_xfer_status` backend error | [`WriteStatus::BackendError`] |
//! | `get_xfer_status` NOT_FOUND (or any other error) | [`WriteStatus::Unknown`]: the put may still land (F7) |
//! | handshake or metadata load fails | [`PostError::Handshake`] |
//! | descriptors or `create_xfer_req` refused | [`PostError::Descriptor`] |
//! | `post_xfer_req` fails | [`PostError::Post`] (the handle is released: nothing was sent) |
//! | `send_notification` NOT_FOUND | [`SendError::Stale`] |
//! | `send_notification` backend error | [`SendError::PeerGone`] |
//!
//! The consumer rank's metadata is dropped from the cache only when the producer driver asks
//! ([`Transport::forget_peer`]), which it does only with no WRITE to that rank unfinished.

use std::collections::HashMap;

use kvdrain_driver::transport::{
    DrainError, GonePeer, Notification, Peer, PostError, Posted, SendError, Transport, WriteSpec,
    WriteStatus,
};
use nixl_sys::{MemType, NixlError, OptArgs, XferDescList, XferOp, XferRequest, XferStatus};

use crate::agent::{AgentError, UcxAgent};
use crate::block_layout::BlockLayout;
use crate::descriptors;
use crate::handshake::Handshake;

/// A fault to inject into one edge (tests and the demo's failure rate). Both are real NIXL
/// failures, not simulations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Aim the write past the consumer's registered memory: `create_xfer_req` fails (C2).
    BadDescriptor,
    /// Invalidate the consumer's metadata right after posting, as a third party would: a
    /// write still in progress then reads NOT_FOUND — an unknown status the producer did not
    /// cause (F7). A write that completed inside the post is unaffected.
    InvalidateAfterPost,
}

/// Chooses a fault per `(P request id, D rank)`.
pub type FaultInjector = Box<dyn FnMut(&str, u16) -> Option<Fault> + Send>;

/// A consumer rank this producer has handshaken with.
#[derive(Clone, Debug)]
struct ConsumerPeer {
    name: String,
    /// `None` when the handshake got the metadata but failed afterwards: notices only.
    layout: Option<BlockLayout>,
}

/// What a producer rank's NIXL transport keeps between ticks.
#[derive(Default)]
pub struct ProducerLinkState {
    peers: HashMap<(String, u16), ConsumerPeer>,
    faults: Option<FaultInjector>,
    /// The last drain error, handed to the caller of the tick.
    pub(crate) drain_error: Option<AgentError>,
}

impl std::fmt::Debug for ProducerLinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerLinkState")
            .field("peers", &self.peers.len())
            .finish_non_exhaustive()
    }
}

impl ProducerLinkState {
    /// Injects faults into chosen edges from now on.
    pub fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        self.faults = faults;
    }
}

/// A producer rank's transport for one tick: the agent, its source layout, the handshake.
pub struct NixlProducerTransport<'a, H: Handshake> {
    /// The producer's agent.
    pub agent: &'a UcxAgent,
    /// Where its source blocks are.
    pub layout: &'a BlockLayout,
    /// Where consumer ranks come from.
    pub handshake: &'a mut H,
    /// The handshake cache and faults.
    pub state: &'a mut ProducerLinkState,
}

impl<H: Handshake> std::fmt::Debug for NixlProducerTransport<'_, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlProducerTransport")
            .field("agent", &self.agent.name())
            .finish_non_exhaustive()
    }
}

impl<H: Handshake> NixlProducerTransport<'_, H> {
    /// The consumer rank, handshaking (and loading its metadata) the first time.
    fn peer(&mut self, engine: &str, d: u16) -> Option<ConsumerPeer> {
        let key = (engine.to_owned(), d);
        if let Some(p) = self.state.peers.get(&key) {
            return Some(p.clone());
        }
        let (metadata, layout) = match self.handshake.consumer_rank(engine, d) {
            Ok(rank) => (rank.metadata, Some(rank.layout)),
            Err(e) => (e.metadata?, None),
        };
        let name = self.agent.load_remote_metadata(&metadata).ok()?;
        let peer = ConsumerPeer { name, layout };
        self.state.peers.insert(key, peer.clone());
        Some(peer)
    }
}

impl<H: Handshake> Transport for NixlProducerTransport<'_, H> {
    type Write = XferRequest;

    fn post_write(&mut self, spec: &WriteSpec<'_>) -> Result<Posted<XferRequest>, PostError> {
        let engine = spec.registration.decode_engine_id.as_str();
        let d = spec.d_rank;
        let Some(ConsumerPeer {
            name,
            layout: Some(remote),
        }) = self.peer(engine, d)
        else {
            return Err(PostError::Handshake);
        };
        let spans = descriptors::spans(
            &spec.topology,
            spec.tp_rank,
            spec.shape,
            (self.layout, spec.source),
            (&remote, &spec.registration.local_block_ids),
        )
        .map_err(|_| PostError::Descriptor)?;
        let fault = self
            .state
            .faults
            .as_mut()
            .and_then(|f| f(spec.producer_request_id, d));
        // Past the end of the consumer's registered memory: a real creation failure.
        let shift = match fault {
            Some(Fault::BadDescriptor) => remote.block_len * remote.num_blocks,
            _ => 0,
        };
        let describe = |_| PostError::Descriptor;
        let mut local = XferDescList::new(MemType::Dram).map_err(describe)?;
        let mut far = XferDescList::new(MemType::Dram).map_err(describe)?;
        for s in &spans {
            local.add_desc(s.src, s.len, 0);
            far.add_desc(s.dst + shift, s.len, 0);
        }
        let mut args = OptArgs::new().map_err(describe)?;
        args.set_has_notification(true).map_err(describe)?;
        args.set_notification_message(spec.completion)
            .map_err(describe)?;
        let agent = self.agent.agent();
        let req = agent
            .create_xfer_req(XferOp::Write, &local, &far, &name, Some(&args))
            .map_err(describe)?;
        // `None`: options here would replace the notification set at creation.
        match agent.post_xfer_req(&req, None) {
            Ok(true) => {
                if fault == Some(Fault::InvalidateAfterPost) {
                    // The injected third party: the driver never does this mid-write.
                    let _ = agent.invalidate_remote_md(&name);
                }
                Ok(Posted::InFlight(req))
            }
            Ok(false) => Ok(Posted::Done),
            // A failed post sends nothing; the handle is released here
            // (`docs/nixl.md#no-notification-on-failure`).
            Err(_) => Err(PostError::Post),
        }
    }

    fn poll_write(&mut self, write: &mut XferRequest) -> WriteStatus {
        write_status(self.agent.agent().get_xfer_status(write))
    }

    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError> {
        let name = match to {
            Peer::Agent(name) => name.to_owned(),
            Peer::ConsumerRank { engine, rank } => {
                self.peer(engine, rank).ok_or(SendError::Unreachable)?.name
            }
        };
        send(self.agent, &name, bytes)
    }

    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError> {
        drain(self.agent, out, &mut self.state.drain_error)
    }

    fn peer_gone(&mut self) -> Option<GonePeer> {
        None
    }

    fn forget_peer(&mut self, to: Peer<'_>) {
        if let Peer::ConsumerRank { engine, rank } = to {
            self.state.peers.remove(&(engine.to_owned(), rank));
        }
    }
}

/// A consumer rank's transport: notifications only (a consumer never posts).
#[derive(Debug)]
pub struct NixlConsumerTransport<'a> {
    /// The consumer's agent.
    pub agent: &'a UcxAgent,
    /// The last drain error.
    pub drain_error: Option<AgentError>,
    /// When the last drain that succeeded returned (the start of a notification's
    /// latency on this side).
    pub drained_at: Option<std::time::Instant>,
}

impl<'a> NixlConsumerTransport<'a> {
    /// The transport of `agent`, no drain error yet.
    pub fn new(agent: &'a UcxAgent) -> Self {
        NixlConsumerTransport {
            agent,
            drain_error: None,
            drained_at: None,
        }
    }
}

impl Transport for NixlConsumerTransport<'_> {
    type Write = ();

    fn post_write(&mut self, _spec: &WriteSpec<'_>) -> Result<Posted<()>, PostError> {
        Err(PostError::Post)
    }

    fn poll_write(&mut self, _write: &mut ()) -> WriteStatus {
        WriteStatus::BackendError
    }

    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError> {
        let Peer::Agent(name) = to else {
            return Err(SendError::Unreachable);
        };
        send(self.agent, name, bytes)
    }

    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError> {
        drain(self.agent, out, &mut self.drain_error)?;
        self.drained_at = Some(std::time::Instant::now());
        Ok(())
    }

    fn peer_gone(&mut self) -> Option<GonePeer> {
        None
    }
}

/// What a `get_xfer_status` answer says about a posted WRITE (the table above): only
/// `Success` proves it over, only a backend error proves it failed; NOT_FOUND (or any other
/// error) cancels nothing, the put may still land (F7).
pub fn write_status(status: Result<XferStatus, NixlError>) -> WriteStatus {
    match status {
        Ok(XferStatus::InProgress) => WriteStatus::InProgress,
        Ok(XferStatus::Success) => WriteStatus::Success,
        Err(NixlError::BackendError) => WriteStatus::BackendError,
        Err(_) => WriteStatus::Unknown,
    }
}

/// Sends one notification, reading NIXL's answer the way both sides need it: a backend
/// error means the peer is gone (UCX `REMOTE_DISCONNECT`), `NotFound` that its metadata was
/// invalidated (stale), anything else that it cannot be reached now.
fn send(agent: &UcxAgent, name: &str, bytes: &[u8]) -> Result<(), SendError> {
    match agent.agent().send_notification(name, bytes, None) {
        Ok(()) => Ok(()),
        Err(NixlError::BackendError) => Err(SendError::PeerGone),
        Err(NixlError::NotFound) => Err(SendError::Stale),
        Err(_) => Err(SendError::Unreachable),
    }
}

/// Drains the agent's notifications into `out`; a failure is kept in `error` for the
/// caller and reported to the driver by its message.
fn drain(
    agent: &UcxAgent,
    out: &mut Vec<Notification>,
    error: &mut Option<AgentError>,
) -> Result<(), DrainError> {
    match agent.drain_notifications() {
        Ok(batch) => {
            out.extend(batch);
            Ok(())
        }
        Err(e) => {
            let message = e.to_string();
            *error = Some(e);
            Err(DrainError(message))
        }
    }
}
