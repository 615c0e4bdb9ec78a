//! The engine half: the [`Engine`] handle and its getters. Owns every table the ingest
//! thread only reads. Its work is one concept per file, each an `impl Engine` block:
//!
//! | file | concept |
//! | --- | --- |
//! | `register.rs` | registration: the expectation checked, the owner's id probe, a slot taken |
//! | `abort.rs` | abort by ticket or id: into quarantine |
//! | `lost_agent.rs` | `gone` and `fence`: an agent's outstanding edges failed, each with its cause |
//! | `clock.rs` | `advance`: deadlines, settle ends and quarantine ends fired |
//! | `poll.rs` | decisions out: `poll_decision`, `poll_recorded`, the queued ones |
//! | `decide.rs` | a drained or timed-out request decided, settled, released and retired |
//! | `record.rs` | the history kept when something goes wrong, and the [`Record`](crate::Record) read from it |
//! | `refused_hold.rs` | the blocks of a refused registration, held for a quarantine |

use crate::counters::EngineCounters;
use crate::owner::Owner;
use crate::shared::Shared;
use crate::time::Instant;

/// The engine half of a [`Ledger`](crate::Ledger): registration, abort, fence and gone,
/// clock and decisions. One per ledger, on the scheduler thread.
#[derive(Debug)]
pub struct Engine<'l, const N: usize, const E: usize> {
    pub(crate) shared: &'l Shared<N, E>,
    pub(crate) owner: &'l mut Owner<N>,
}

impl<'l, const N: usize, const E: usize> Engine<'l, N, E> {
    pub(crate) fn new(shared: &'l Shared<N, E>, owner: &'l mut Owner<N>) -> Self {
        Engine { shared, owner }
    }

    /// The clock.
    pub fn now(&self) -> Instant {
        self.owner.now
    }

    /// When the next deadline, settle end, quarantine end or [refused
    /// hold](Self::hold_refused)'s end falls: the time to [`advance`](Self::advance) to
    /// next, if nothing else happens first.
    pub fn next_timer(&self) -> Option<Instant> {
        self.owner.next_timer()
    }

    /// Counters of this half.
    pub fn counters(&self) -> &EngineCounters {
        &self.owner.counters
    }

    /// Requests tracked now: registered and not yet completed or released (decided
    /// requests whose decisions wait to be handed out are not counted).
    pub fn len(&self) -> usize {
        self.owner.live
    }

    /// Decisions taken by `advance`, `fence`, `gone` or an earlier pull and not handed out yet
    /// (decisions of requests the ingest side drained are taken at the pull and not
    /// counted until then).
    pub fn queued_decisions(&self) -> usize {
        self.owner.decided.len()
    }

    /// Whether a registration would find room: fewer than `capacity` requests tracked and
    /// a slot free. A decided request frees its slot when its last decision is handed out.
    pub fn has_room(&self) -> bool {
        self.owner.has_room()
    }

    /// Whether no request is tracked.
    pub fn is_empty(&self) -> bool {
        self.owner.live == 0
    }
}
