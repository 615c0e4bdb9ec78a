//! The ingest half: turns notification bytes into edge resolutions, without locks.

use crate::counters::IngestCounters;
use crate::error::{IgnoreReason, Ignored};
use crate::shared::Shared;
use crate::slot::EdgeClaim;
use crate::state_word::Resolved;
use crate::sync::{Ordering, fence};
use crate::ticket::AgentId;
use crate::wire::{self, Message};

/// What an accepted notice did.
#[must_use = "after `Decided`, call `Engine::poll` to take the decision out"]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Noticed {
    /// It resolved an edge; others are still outstanding.
    Counted,
    /// It resolved the request's last edge: a decision (`completed`, `failed` or
    /// `released`) waits for [`Engine::poll`](crate::Engine::poll).
    Decided,
}

/// The ingest half of a [`Ledger`](crate::Ledger): `Send`, one per ledger.
#[derive(Debug)]
pub struct Ingest<'l, const N: usize, const E: usize> {
    shared: &'l Shared<N, E>,
    counters: &'l mut IngestCounters,
}

impl<'l, const N: usize, const E: usize> Ingest<'l, N, E> {
    pub(crate) fn new(shared: &'l Shared<N, E>, counters: &'l mut IngestCounters) -> Self {
        Ingest { shared, counters }
    }

    /// Feeds one NIXL notification from producer `agent`.
    ///
    /// `O(1)`: one parse, one hash, an expected 1.5 index probes, one or two CAS (plus a
    /// scan of at most `E` edge words in named mode). Never allocates, never blocks, never
    /// panics.
    ///
    /// # Errors
    /// [`Ignored`] with the reason when the notice changed nothing; no state is created
    /// and no other request is touched.
    pub fn handle_notification<'m>(
        &mut self,
        agent: AgentId,
        bytes: &'m [u8],
    ) -> Result<Noticed, Ignored<'m>> {
        let (body, failed) = match wire::parse(bytes) {
            Ok(Message::Completion(c)) => (c, false),
            Ok(Message::Failure(c)) => (c, true),
            Ok(Message::Heartbeat(_) | Message::Registration(_)) => {
                return Err(self.ignore(IgnoreReason::NotForConsumer, None));
            }
            Err(e) => return Err(self.ignore(IgnoreReason::Malformed(e), None)),
        };
        let id = Some(body.request_id);
        let fp = self.shared.fingerprint(body.request_id);
        loop {
            let Some(found) = self.shared.find(fp) else {
                let reason = if self.shared.tombstones.contains(fp) {
                    IgnoreReason::Late
                } else {
                    IgnoreReason::Unknown
                };
                return Err(self.ignore(reason, id));
            };
            let generation = found.state.generation();
            if found.state.outstanding() == 0 {
                return Err(self.ignore(IgnoreReason::Late, id));
            }
            let slot = &self.shared.slots[found.slot as usize];
            if found.named > 0 {
                match slot.claim_edge(found.named, generation, agent, failed) {
                    EdgeClaim::Claimed => {}
                    EdgeClaim::Duplicate => return Err(self.ignore(IgnoreReason::Duplicate, id)),
                    EdgeClaim::Recycled => continue,
                    EdgeClaim::NotAnEdge => {
                        // Only trust "not an edge" if the edges we scanned were this
                        // generation's.
                        fence(Ordering::Acquire);
                        if slot.state.load(Ordering::Relaxed).is_live(generation) {
                            return Err(self.ignore(IgnoreReason::UnexpectedSender, id));
                        }
                        continue;
                    }
                }
            }
            return match slot.state.resolve_edge(generation, failed) {
                Resolved::Counted => Ok(self.counted(failed, Noticed::Counted)),
                Resolved::LastEdge => {
                    if !self.shared.ready.push(found.slot) {
                        self.counters.ready_overflow += 1;
                    }
                    self.counters.last_edges += 1;
                    Ok(self.counted(failed, Noticed::Decided))
                }
                Resolved::AlreadyDrained => Err(self.ignore(IgnoreReason::Late, id)),
                // Counting mode: look again. Named mode: our edge claim was for a request
                // that ended under us (its quarantine ran out): the notice is late.
                Resolved::Recycled if found.named == 0 => continue,
                Resolved::Recycled => Err(self.ignore(IgnoreReason::Late, id)),
            };
        }
    }

    /// Counters of this half.
    pub fn counters(&self) -> &IngestCounters {
        self.counters
    }

    fn counted(&mut self, failed: bool, outcome: Noticed) -> Noticed {
        if failed {
            self.counters.failure_notices += 1;
        } else {
            self.counters.completions += 1;
        }
        outcome
    }

    fn ignore<'m>(&mut self, reason: IgnoreReason, request_id: Option<&'m str>) -> Ignored<'m> {
        let c = &mut *self.counters;
        *match reason {
            IgnoreReason::Malformed(_) => &mut c.malformed,
            IgnoreReason::NotForConsumer => &mut c.not_for_consumer,
            IgnoreReason::Unknown => &mut c.unknown,
            IgnoreReason::Late => &mut c.late,
            IgnoreReason::Duplicate => &mut c.duplicate,
            IgnoreReason::UnexpectedSender => &mut c.unexpected_sender,
        } += 1;
        Ignored { reason, request_id }
    }
}
