//! What a driver needs from the wire, and nothing more: post a WRITE and poll its status,
//! send a notification, drain notifications with their sender, learn that a peer is gone.
//!
//! Three implementations exist: real NIXL (`kvdrain-nixl`), in-process memory
//! ([`crate::memory`]) and the simulator's virtual network (`kvdrain sim`). A transport
//! takes **no protocol decision**: it reports what happened in the terms below, and the
//! drivers decide what it means (which notice is owed, which peer is fenced, when a peer's
//! metadata may be dropped).

use kvdrain::producer::{Topology, WriteShape};

use crate::registration::PushRegistration;

/// Where a notification goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer<'a> {
    /// A producer agent, by the name the consumer loaded it under.
    Agent(&'a str),
    /// Rank `rank` of consumer engine `engine` (the producer reaches it through its
    /// handshake, cached by the transport).
    ConsumerRank {
        /// D's engine id.
        engine: &'a str,
        /// D's TP rank.
        rank: u16,
    },
}

/// A peer that went away (owned form of [`Peer`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GonePeer {
    /// A producer agent.
    Agent(String),
    /// A consumer rank.
    ConsumerRank {
        /// D's engine id.
        engine: String,
        /// D's TP rank.
        rank: u16,
    },
}

/// One WRITE a producer driver asks the transport to post.
#[derive(Clone, Copy, Debug)]
pub struct WriteSpec<'a> {
    /// P's request id.
    pub producer_request_id: &'a str,
    /// The consumer's registration (D's engine, block ids, sizes).
    pub registration: &'a PushRegistration,
    /// The topology the plan was made for.
    pub topology: Topology,
    /// This producer's TP rank.
    pub tp_rank: u16,
    /// The consumer rank written.
    pub d_rank: u16,
    /// What the WRITE carries.
    pub shape: WriteShape,
    /// P's source block ids per KV-cache group.
    pub source: &'a [Vec<u64>],
    /// The completion notification to attach (`{D_request_id}:{P_tp}`), delivered by the
    /// transport when and only when the WRITE has landed.
    pub completion: &'a [u8],
}

/// A WRITE the transport accepted.
#[derive(Debug)]
pub enum Posted<W> {
    /// In progress: poll it with [`Transport::poll_write`].
    InFlight(W),
    /// Finished inside the post (its completion is on its way).
    Done,
}

/// Why a WRITE was never posted: nothing of it can land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The P → D handshake failed (F8).
    #[error("handshake with the consumer rank failed")]
    Handshake,
    /// The descriptors could not be built or were refused (C2).
    #[error("the write could not be described")]
    Descriptor,
    /// The post itself failed (C2).
    #[error("the write could not be posted")]
    Post,
}

/// A posted WRITE's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStatus {
    /// Still in progress.
    InProgress,
    /// Over: every byte landed and the completion is on its way.
    Success,
    /// The backend reported an error for this transfer: nothing more of it lands (a short
    /// drain aside, which the consumer's settling covers).
    BackendError,
    /// The status cannot be read (NOT_FOUND the driver did not cause): the WRITE may still
    /// land. The driver keeps polling the handle.
    Unknown,
}

/// Why a notification was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The peer cannot be named or reached (no metadata, handshake refused).
    #[error("peer unreachable")]
    Unreachable,
    /// The peer's cached metadata is stale (NOT_FOUND): it may be refreshed with
    /// [`Transport::forget_peer`] once no transfer to it is unfinished.
    #[error("peer metadata stale")]
    Stale,
    /// The backend reports the peer disconnected (the consumer driver fences it).
    #[error("peer disconnected")]
    PeerGone,
}

/// Draining notifications failed; nothing was consumed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("draining notifications failed: {0}")]
pub struct DrainError(pub String);

/// One notification: the sender's agent name and the raw bytes.
pub type Notification = (String, Vec<u8>);

/// What a driver needs from the wire.
pub trait Transport {
    /// A posted WRITE's handle, kept by the driver until `Success` or a backend error.
    type Write;

    /// Posts one WRITE with its completion attached.
    ///
    /// # Errors
    /// [`PostError`]: the WRITE was never posted.
    fn post_write(&mut self, spec: &WriteSpec<'_>) -> Result<Posted<Self::Write>, PostError>;

    /// Polls a posted WRITE.
    fn poll_write(&mut self, write: &mut Self::Write) -> WriteStatus;

    /// Sends one notification.
    ///
    /// # Errors
    /// [`SendError`]; a send error proves nothing about delivery.
    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError>;

    /// Appends every notification received since the last call to `out`.
    ///
    /// # Errors
    /// [`DrainError`]: nothing was consumed.
    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError>;

    /// The next peer found gone since the last call, if any.
    fn peer_gone(&mut self) -> Option<GonePeer>;

    /// Drops the cached metadata of a consumer rank so the next use handshakes afresh. The
    /// producer driver calls it only when no transfer to that rank is unfinished (F7).
    fn forget_peer(&mut self, to: Peer<'_>) {
        let _ = to;
    }
}
