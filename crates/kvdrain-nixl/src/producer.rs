//! The producer (P) pusher of one P rank over real NIXL: the shared
//! [`kvdrain_driver::producer::ProducerDriver`] driven through
//! [`NixlProducerTransport`], with the engine's hooks ([`SourceBlocks`]) called for its
//! events. Every protocol rule (pairing, leases, retired ids, the plan, owed `PUSH_FAIL`s,
//! source release) is the driver's; this file only moves bytes and time.

use std::time::Instant;

use kvdrain_driver::producer::{ProducerDriver, ProducerEvent};
use nixl_sys::XferRequest;

use crate::agent::{AgentError, UcxAgent};
use crate::block_layout::BlockLayout;
use crate::handshake::Handshake;
use crate::transport::{NixlProducerTransport, ProducerLinkState};

pub use crate::transport::{Fault, FaultInjector};
pub use kvdrain_driver::producer::{
    Offer, OfferError, ProducerConfig, ProducerCounters, TickReport,
};

/// The engine's side of a producer: its source blocks and leases.
pub trait SourceBlocks {
    /// Every write of `request` is terminal: its source blocks may be reused (F3).
    fn release(&mut self, request: &str);
    /// A consumer's heartbeat named `request` (P's id); the driver extended its lease.
    fn heartbeat(&mut self, request: &str) {
        let _ = request;
    }
}

/// The P-side pusher of one producer rank over real NIXL.
pub struct Pusher {
    driver: ProducerDriver<XferRequest>,
    layout: BlockLayout,
    link: ProducerLinkState,
    epoch: Instant,
    // Last: handles above are dropped before the agent and its registrations.
    agent: UcxAgent,
}

impl std::fmt::Debug for Pusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pusher")
            .field("agent", &self.agent.name())
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

impl Pusher {
    /// A pusher for `agent`, whose source blocks (laid out as `layout`) are registered.
    pub fn new(agent: UcxAgent, config: ProducerConfig, layout: BlockLayout) -> Self {
        Pusher {
            driver: ProducerDriver::new(config),
            layout,
            link: ProducerLinkState::default(),
            epoch: Instant::now(),
            agent,
        }
    }

    /// The agent.
    pub fn agent(&self) -> &UcxAgent {
        &self.agent
    }

    /// Injects faults into chosen edges from now on.
    pub fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        self.link.set_fault_injector(faults);
    }

    /// Counters.
    pub fn counters(&self) -> ProducerCounters {
        self.driver.counters()
    }

    /// Requests offered or being pushed (not yet released and noticed).
    pub fn in_flight(&self) -> usize {
        self.driver.in_flight()
    }

    /// The driver's clock: ms since `epoch` (where this side reads its clock).
    fn now(&self) -> kvdrain::Instant {
        kvdrain::Instant::from_millis(
            u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX),
        )
    }

    /// A finished request's source blocks are held for pushing (its lease starts now).
    ///
    /// # Errors
    /// [`OfferError`] with the offer when the table is full or the id is offered already.
    pub fn offer(&mut self, offer: Offer) -> Result<(), OfferError> {
        let now = self.now();
        self.driver.offer(offer, now)
    }

    /// The request ended on this producer (aborted): no new write is posted, a failure
    /// notice goes to every consumer rank not written yet, and the source blocks come back
    /// once no write is in flight (F3). A registration arriving later is answered with
    /// failure notices (F4).
    pub fn retire(&mut self, request_id: &str, blocks: &mut impl SourceBlocks) {
        self.driver.retire(request_id);
        self.deliver(blocks);
    }

    /// One round: notifications, leases, new pushes, status polls, owed notices, releases.
    ///
    /// # Errors
    /// [`AgentError`] if draining notifications failed (the rest of the round still ran and
    /// its releases were delivered).
    pub fn tick(
        &mut self,
        handshake: &mut impl Handshake,
        blocks: &mut impl SourceBlocks,
    ) -> Result<TickReport, AgentError> {
        let now = self.now();
        let mut transport = NixlProducerTransport {
            agent: &self.agent,
            layout: &self.layout,
            handshake,
            state: &mut self.link,
        };
        let result = self.driver.tick(&mut transport, now);
        self.deliver(blocks);
        match result {
            Ok(report) => Ok(report),
            // The transport keeps the drain's own error.
            Err(_) => Err(self
                .link
                .drain_error
                .take()
                .unwrap_or_else(|| AgentError::Nixl {
                    agent: self.agent.name().to_owned(),
                    op: "get_notifications",
                    source: nixl_sys::NixlError::BackendError,
                })),
        }
    }

    fn deliver(&mut self, blocks: &mut impl SourceBlocks) {
        while let Some(event) = self.driver.poll_event() {
            match event {
                ProducerEvent::SourceReleased { request_id } => blocks.release(&request_id),
                ProducerEvent::LeaseExtended { request_id } => blocks.heartbeat(&request_id),
            }
        }
    }
}
