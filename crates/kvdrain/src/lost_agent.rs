//! An agent lost on the engine half: [`gone`](crate::Engine::gone) (seen going away, its
//! writes may still land) and [`fence`](crate::Engine::fence) (proved silent). Each fails
//! the agent's outstanding named edges, writing its cause into each edge word in the CAS
//! that resolves it, and decides the requests whose last edge it was.

use crate::Engine;
use crate::owner::HistoryFlags;
use crate::slot::{EdgeCause, EdgeClaim};
use crate::stamp;
use crate::state_word::{Resolution, Resolved};
use crate::sync::Ordering;
use crate::ticket::AgentId;

impl<const N: usize, const E: usize> Engine<'_, N, E> {
    /// The transport confirmed that `agent` can no longer write here: resolves, as
    /// failed, every outstanding named edge of `agent` now, with no settling (nothing of
    /// the agent's can still land). Counting-mode requests are not touched (nobody knows
    /// which notices the agent still owed), and neither are requests registered later.
    /// Requests whose last edge this resolves are decided at once, in registration order;
    /// their decisions wait for [`poll_decision`](Self::poll_decision). Returns the number
    /// of edges resolved. `O(N·E)`: fences are rare.
    ///
    /// Only for a transport that can prove it: a peer seen gone (a failed send or
    /// heartbeat, a reset connection, a dead process, invalidated metadata) proves
    /// nothing of the kind, since bytes already handed to its transport keep landing.
    /// Report that with [`gone`](Self::gone).
    pub fn fence(&mut self, agent: AgentId) -> u32 {
        let resolved = self.resolve_agent(agent, Resolution::Fenced);
        self.owner.counters.fenced_edges += u64::from(resolved);
        resolved
    }

    /// The transport saw `agent` go away (a send or heartbeat to it failed, its
    /// connection was reset, its process died, its metadata was invalidated) but cannot
    /// confirm that none of its bytes already on the way can still land: resolves, as
    /// failed, every outstanding named edge of `agent` now, exactly as a failure notice
    /// from `agent` for each of those requests would (rule 8): the decision is taken at
    /// once and the blocks settle for [`Config::settle`](crate::Config::settle) from now. An edge already resolved is
    /// left as it is; counting-mode requests and requests registered later are not
    /// touched, as with [`fence`](Self::fence). Requests whose last edge this resolves are
    /// decided at once, in registration order (`Failed`; `Released` for an aborted or
    /// expired request, once it settled or its quarantine ended); their decisions wait for
    /// [`poll_decision`](Self::poll_decision). Returns the number of edges resolved.
    /// `O(N·E)`.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config { settle: Duration::from_millis(100), ..Config::with_capacity(16) });
    /// let (p0, p1) = (AgentId(0), AgentId(1));
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Edges(&[p0, p1]), deadline: None }).unwrap();
    /// let _ = ledger.handle_notification(p0, b"r:2");
    /// ledger.advance(Instant::from_millis(20)).expect("clock forward");
    /// // p1's heartbeat failed: the request fails now, its blocks settle until 20 + 100.
    /// assert_eq!(ledger.gone(p1), 1);
    /// assert!(matches!(ledger.poll_decision(), Some(Decision::Failed(_))));
    /// ledger.advance(Instant::from_millis(119)).expect("clock forward");
    /// assert_eq!(ledger.poll_decision(), None);
    /// ledger.advance(Instant::from_millis(120)).expect("clock forward");
    /// assert!(matches!(ledger.poll_decision(), Some(Decision::Released(_))));
    /// ```
    pub fn gone(&mut self, agent: AgentId) -> u32 {
        let resolved = self.resolve_agent(agent, Resolution::Gone);
        self.owner.counters.gone_edges += u64::from(resolved);
        resolved
    }

    /// Resolves, as `how` says (a fence or a `gone`), every outstanding named edge of
    /// `agent` among the live requests, and decides those whose last edge it was, in
    /// registration order. Each edge it claims says so in its word: the cause is written
    /// by the claim's CAS, so a failure notice that wins the race for the same edge
    /// keeps its own. Returns the number of edges resolved.
    pub(crate) fn resolve_agent(&mut self, agent: AgentId, how: Resolution) -> u32 {
        let mut resolved = 0;
        let mut batch = 0;
        let now = stamp::of(self.owner.now);
        let slots = &self.shared.slots;
        for slot in 0..N as u32 {
            let r = &mut self.owner.requests[slot as usize];
            let shared = &slots[slot as usize];
            let generation = r.generation;
            if !r.live || shared.named() == 0 {
                continue;
            }
            let cause = match how {
                Resolution::Gone => EdgeCause::Gone,
                _ => EdgeCause::Fenced,
            };
            if shared.end_edge(shared.named(), generation, agent, cause) != EdgeClaim::Claimed {
                continue;
            }
            resolved += 1;
            if how == Resolution::Gone {
                // Before the state word: whoever decides (here, or a pull after the
                // ingest side resolved the last edge) reads it on this thread.
                r.gone_at = now;
                self.history(slot).flags |= HistoryFlags::GONE;
            }
            if how == Resolution::Fenced {
                let h = self.history(slot);
                h.fenced_at = now;
                h.flags |= HistoryFlags::FENCED;
            }
            if shared.state.resolve_edge(generation, how) == Resolved::LastEdge {
                self.owner.batch[batch] = slot;
                batch += 1;
            }
        }
        self.sort_batch(batch);
        for i in 0..batch {
            let slot = self.owner.batch[i];
            let s = self.shared.slots[slot as usize]
                .state
                .load(Ordering::Acquire);
            self.decide_drained(slot, s);
        }
        resolved
    }
}
