//! Deliberately broken variants, compiled only under `cfg(kvdrain_loom)`.
//!
//! The loom suite (`tests/loom.rs`) runs its models against these and asserts that they
//! fail, which shows that the models can catch the bug classes of the failure catalogue
//! rather than passing vacuously. Nothing else may call them.

use crate::error::Ignored;
use crate::ingest::{Ingest, Noticed};
use crate::state_word::{Resolution, Resolved};
use crate::sync::Ordering;
use crate::ticket::AgentId;
use crate::wire::{self, Message};

impl<const N: usize, const E: usize> Ingest<'_, N, E> {
    /// **Broken on purpose** (catalogue F1: "sibling WRITEs still landing after the first
    /// error"): a failure notice resolves *every* outstanding edge of its request at once
    /// and hands the request to the engine, which then decides `failed` and releases the
    /// blocks while sibling writes may still land. Everything else goes through
    /// [`handle_notification`](Ingest::handle_notification).
    ///
    /// # Errors
    /// As `handle_notification`.
    #[doc(hidden)]
    pub fn handle_notification_broken_f1<'m>(
        &mut self,
        agent: AgentId,
        bytes: &'m [u8],
    ) -> Result<Noticed, Ignored<'m>> {
        if let Ok(Message::Failure(body)) = wire::parse(bytes) {
            let fp = self.shared.fingerprint(body.request_id);
            if let Some(found) = self.shared.find(fp, false) {
                let slot = &self.shared.slots[found.slot as usize];
                // The bug: no waiting for the siblings.
                loop {
                    match slot
                        .state
                        .resolve_edge(found.state.generation(), Resolution::Fenced)
                    {
                        Resolved::Counted => {}
                        Resolved::LastEdge => {
                            let _ = self.shared.ready.push(found.slot);
                            return Ok(Noticed::Decided);
                        }
                        Resolved::AlreadyDrained | Resolved::Recycled => break,
                    }
                }
            }
        }
        self.handle_notification(agent, bytes)
    }
}

impl<const N: usize, const E: usize> Ingest<'_, N, E> {
    /// **Broken on purpose** (slot reuse without a generation check, the ABA bug): a
    /// counting-mode notice looks its request up, then resolves an edge of whatever request
    /// holds the slot *when it gets there*, so a notice that raced a recycling counts for
    /// the next request in the slot. Named-mode and unmatched notices go through
    /// [`handle_notification`](Ingest::handle_notification).
    ///
    /// # Errors
    /// As `handle_notification`.
    #[doc(hidden)]
    pub fn handle_notification_broken_aba<'m>(
        &mut self,
        agent: AgentId,
        bytes: &'m [u8],
    ) -> Result<Noticed, Ignored<'m>> {
        if let Ok(Message::Completion(body)) = wire::parse(bytes) {
            let fp = self.shared.fingerprint(body.request_id);
            if let Some(found) = self.shared.find(fp, false).filter(|f| f.named == 0) {
                let slot = &self.shared.slots[found.slot as usize];
                // The bug: the generation is read again instead of the one looked up.
                let generation = slot.state.load(Ordering::Acquire).generation();
                match slot.state.resolve_edge(generation, Resolution::Landed) {
                    Resolved::Counted => return Ok(Noticed::Counted),
                    Resolved::LastEdge => {
                        let _ = self.shared.ready.push(found.slot);
                        return Ok(Noticed::Decided);
                    }
                    Resolved::AlreadyDrained | Resolved::Recycled => {}
                }
            }
        }
        self.handle_notification(agent, bytes)
    }
}
