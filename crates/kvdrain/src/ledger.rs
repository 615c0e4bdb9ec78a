//! The ledger: fixed tables sized by const generics, split into an ingest half and an
//! engine half that may run on two threads.

use crate::config::Config;
use crate::counters::{Counters, EngineCounters};
use crate::engine::Engine;
use crate::error::{AbortError, ClockError, Ignored, RegisterError};
use crate::ingest::{Ingest, IngestOwn, Noticed};
use crate::owner::Owner;
use crate::refused_hold::RefusedHold;
use crate::shared::Shared;
use crate::ticket::{AgentId, Decision, Pending, Quarantined, Registration};
use crate::time::Instant;

/// The consumer-side tracker for up to `N` requests with up to `E` named edges each.
///
/// `N` must be a power of two in `1..=65536` and `E` in `1..=`[`MAX_EDGES`](crate::MAX_EDGES) (checked at compile
/// time). Every table is inline: the ledger never allocates. See the crate documentation
/// for the state diagram, the drive contract and the threading rules.
#[derive(Debug)]
pub struct Ledger<const N: usize, const E: usize = 8> {
    shared: Shared<N, E>,
    owner: Owner<N>,
    ingest: IngestOwn,
}

impl<const N: usize, const E: usize> Ledger<N, E> {
    const VALID: () = {
        assert!(
            N.is_power_of_two() && N <= 65_536,
            "N must be a power of two <= 65536"
        );
        assert!(
            E >= 1 && E <= crate::MAX_EDGES,
            "E must be in 1..=MAX_EDGES (64)"
        );
    };

    /// An empty ledger at time 0. `config.capacity` is clamped to `N`.
    pub fn new(config: Config) -> Self {
        let () = Self::VALID;
        let config = Config {
            capacity: config.capacity.min(N),
            ..config
        };
        Ledger {
            shared: Shared::new(config.seed),
            owner: Owner::new(config),
            ingest: IngestOwn::default(),
        }
    }

    /// Splits the ledger into its two halves: [`Ingest`] for the thread that drains NIXL
    /// notifications and [`Engine`] for the scheduler thread. Both borrow the ledger, so
    /// use them from scoped threads (or keep both on one thread).
    pub fn split(&mut self) -> (Ingest<'_, N, E>, Engine<'_, N, E>) {
        (
            Ingest::new(&self.shared, &mut self.ingest),
            Engine::new(&self.shared, &mut self.owner),
        )
    }

    /// The ingest half alone, for a convenience method: building only the half a call
    /// needs keeps the per-notice path free of the engine half's construction.
    #[inline(always)]
    fn ingest_half(&mut self) -> Ingest<'_, N, E> {
        Ingest::alone(&mut self.shared, &mut self.ingest)
    }

    /// The engine half alone (see [`ingest_half`](Self::ingest_half)).
    #[inline(always)]
    fn engine_half(&mut self) -> Engine<'_, N, E> {
        Engine::new(&self.shared, &mut self.owner)
    }

    /// [`Ingest::handle_notification`] on one thread. Holding the whole ledger (`&mut
    /// self`) it knows no other thread can touch it, so it skips the lookup's second read
    /// of the state word and resolves the edge with plain stores instead of a CAS: the
    /// same outcomes, fewer instructions and no `lock` prefix. The halves of
    /// [`split`](Self::split) keep the lock-free protocol.
    #[inline(always)]
    pub fn handle_notification<'m>(
        &mut self,
        agent: AgentId,
        bytes: &'m [u8],
    ) -> Result<Noticed, Ignored<'m>> {
        self.ingest_half().handle_notification(agent, bytes)
    }

    /// [`Ingest::set_arrival`] on one thread: the notices handed to
    /// [`handle_notification`](Self::handle_notification) from now on arrived at `now`. The
    /// time is the ledger's, so it holds for the halves of a later [`split`](Self::split)
    /// too.
    pub fn set_arrival(&mut self, now: Instant) {
        self.ingest_half().set_arrival(now);
    }

    /// [`Ingest::arrival`] on one thread.
    pub fn arrival(&self) -> Option<Instant> {
        self.ingest.arrival()
    }

    /// [`Engine::register`] on one thread.
    #[inline]
    pub fn register<'r>(
        &mut self,
        registration: Registration<'r>,
    ) -> Result<Pending, RegisterError<'r>> {
        self.engine_half().register(registration)
    }

    /// [`Engine::abort`] on one thread.
    pub fn abort(&mut self, ticket: Pending) -> Result<Quarantined, AbortError> {
        self.engine_half().abort(ticket)
    }

    /// [`Engine::abort_id`] on one thread.
    pub fn abort_id(&mut self, id: &str) -> Result<Quarantined, AbortError> {
        self.engine_half().abort_id(id)
    }

    /// [`Engine::fence`] on one thread.
    pub fn fence(&mut self, agent: AgentId) -> u32 {
        self.engine_half().fence(agent)
    }

    /// [`Engine::gone`] on one thread.
    pub fn gone(&mut self, agent: AgentId) -> u32 {
        self.engine_half().gone(agent)
    }

    /// [`Engine::advance`] on one thread.
    pub fn advance(&mut self, now: Instant) -> Result<(), ClockError> {
        self.engine_half().advance(now)
    }

    /// [`Engine::poll_decision`] on one thread.
    #[must_use = "a decision carries blocks or an outcome the engine must act on"]
    #[inline(always)]
    pub fn poll_decision(&mut self) -> Option<Decision> {
        self.engine_half().poll_decision()
    }

    /// [`Engine::decisions`] on one thread.
    pub fn decisions(&mut self) -> impl Iterator<Item = Decision> + '_ {
        core::iter::from_fn(move || self.poll_decision())
    }

    /// [`Engine::drain_queued`] on one thread.
    pub fn drain_queued(&mut self) -> impl Iterator<Item = Decision> + '_ {
        core::iter::from_fn(move || self.engine_half().pop_queued())
    }

    /// [`Engine::queued_decisions`] on one thread.
    pub fn queued_decisions(&self) -> usize {
        self.owner.decided.len()
    }

    /// The ledger's clock (the last `advance`).
    pub fn now(&self) -> Instant {
        self.owner.now()
    }

    /// [`Engine::hold_refused`] on one thread.
    pub fn hold_refused(&mut self) -> RefusedHold {
        self.engine_half().hold_refused()
    }

    /// [`Engine::poll_refused_release`] on one thread.
    pub fn poll_refused_release(&mut self) -> Option<RefusedHold> {
        self.engine_half().poll_refused_release()
    }

    /// Refused holds taken and not handed out as released ([`Engine::hold_refused`]).
    pub fn refused_holds(&self) -> u64 {
        self.owner.refused.len()
    }

    /// When the next deadline, settle end, quarantine end or refused hold's end falls, if
    /// any.
    pub fn next_timer(&self) -> Option<Instant> {
        self.owner.next_timer()
    }

    /// Requests tracked now (quarantined and settling ones included; decided ones whose
    /// decisions wait to be handed out are not).
    pub fn len(&self) -> usize {
        self.owner.live()
    }

    /// Whether no request is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured capacity (at most `N`).
    pub fn capacity(&self) -> usize {
        self.owner.config().capacity
    }

    /// Whether a registration would be refused as full: `capacity` requests tracked, or
    /// every slot held by a request or by decisions not handed out yet (see
    /// [`Engine::poll_decision`]; never the case for a caller that pulls after every
    /// event).
    pub fn is_full(&self) -> bool {
        !self.owner.has_room()
    }

    /// Counters of both halves.
    pub fn counters(&self) -> Counters {
        Counters {
            ingest: self.ingest.counters,
            engine: *self.owner.counters(),
        }
    }

    /// Counters of the engine half only.
    pub fn engine_counters(&self) -> &EngineCounters {
        self.owner.counters()
    }
}
