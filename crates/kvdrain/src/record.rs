//! What the ledger knows of one request, for an operator: read from the tables it already
//! keeps, with no allocation and nothing added to the notification path.
//!
//! ```text
//! registered_at ──▶ edges resolve ──▶ decided_at ──▶ settle_end? ──▶ released_at
//!       │           (each: landed, failure_notice, gone or fenced)     ▲
//!       └── deadline (expiry) or abort ──── ended ─────────────────────┘
//! ```
//!
//! [`Engine::record`](crate::Engine::record) builds a [`Record`] from a request's key, from
//! its registration until its slot holds the next request: for a tracked request (what is
//! it waiting for?), and for a decision just handed out (how did it end?). A caller that
//! wants the record of every decision takes them together from
//! [`poll_recorded`](crate::Engine::poll_recorded) (or reads it right after
//! [`poll_decision`](crate::Engine::poll_decision), before its next registration).
//!
//! The failure times are the ones the decisions use: the *last* failure notice that
//! resolved one of the request's edges (the stamp rule 8 settles from), the last `gone`
//! and the last `fence` of one of its agents. A named edge says how it ended: landed, or
//! failed by a failure notice, a `gone` or a `fence` ([`EdgeOutcome`]). The cause is
//! written by the resolution itself, in the edge word's two cause bits (`slot.rs`): a
//! notice sets the bits it always set, and a `gone` or a `fence` sets its own in the CAS
//! it already made, so no path stores anything more and the causes cannot disagree with
//! the resolutions, whichever thread won a race. The time is the request's, not the
//! edge's: a per-edge time would be one more store on every notice.
//!
//! [`Engine::poll_recorded`](crate::Engine::poll_recorded) hands out each decision with
//! its record, built before anything can reuse the slot: a caller that wants every
//! record never meets one that is not there.

use crate::Engine;
use crate::owner::{History, HistoryFlags};
use crate::stamp;
use crate::sync::Ordering;
use crate::ticket::{AgentId, Decision, Drained, RequestKey};
use crate::time::Instant;

/// How a named edge stands: outstanding, or how it ended. The cause is the one the
/// resolution itself wrote (the edge word holds it: `slot.rs`), so a failure notice that
/// races a `gone` or a `fence` of the same agent is told apart from it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum EdgeOutcome {
    /// Nothing resolved it yet.
    Outstanding,
    /// Its completion notice came.
    Landed,
    /// Its producer's failure notice (`PUSH_FAIL:`) failed it.
    FailureNotice,
    /// [`Engine::gone`](crate::Engine::gone) of its agent failed it.
    Gone,
    /// [`Engine::fence`](crate::Engine::fence) of its agent failed it.
    Fenced,
}

impl EdgeOutcome {
    /// Its lower-case name, as logs and bindings spell it: `outstanding`, `landed`,
    /// `failure_notice`, `gone` or `fenced`.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeOutcome::Outstanding => "outstanding",
            EdgeOutcome::Landed => "landed",
            EdgeOutcome::FailureNotice => "failure_notice",
            EdgeOutcome::Gone => "gone",
            EdgeOutcome::Fenced => "fenced",
        }
    }

    /// Whether it ended as failed (a failure notice, a `gone` or a `fence`).
    pub fn failed(self) -> bool {
        matches!(
            self,
            EdgeOutcome::FailureNotice | EdgeOutcome::Gone | EdgeOutcome::Fenced
        )
    }
}

/// The edges of a request, as registered and as they stand.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RecordedEdges<const E: usize> {
    /// Counting mode: `expected` notices from anyone.
    Count {
        /// Notices the registration asked for.
        expected: u8,
        /// Notices still owed.
        outstanding: u8,
        /// Whether one of those that came was a failure notice.
        failed: bool,
    },
    /// Named-edge mode: one notice from each agent, in registration order.
    Named {
        /// The first `len` entries are the edges.
        edges: [(AgentId, EdgeOutcome); E],
        /// Named edges.
        len: u8,
    },
}

impl<const E: usize> RecordedEdges<E> {
    /// The named edges (none in counting mode).
    pub fn named(&self) -> &[(AgentId, EdgeOutcome)] {
        match self {
            RecordedEdges::Count { .. } => &[],
            RecordedEdges::Named { edges, len } => &edges[..usize::from(*len)],
        }
    }
}

/// How a request ended before every edge resolved.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Ended {
    /// The engine aborted it.
    Aborted,
    /// Its deadline passed.
    Expired,
}

/// What the request's first failure was, and when.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FailureCause {
    /// A producer's `PUSH_FAIL:` (the last one that resolved an edge).
    Notice(Instant),
    /// A producer was reported gone.
    Gone(Instant),
    /// A producer was fenced.
    Fenced(Instant),
    /// The engine aborted the request.
    Aborted(Instant),
    /// The deadline passed.
    Expired(Instant),
}

impl FailureCause {
    /// Its lower-case name, as logs and bindings spell it: `failure_notice`, `gone`,
    /// `fenced`, `aborted` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCause::Notice(_) => "failure_notice",
            FailureCause::Gone(_) => "gone",
            FailureCause::Fenced(_) => "fenced",
            FailureCause::Aborted(_) => "aborted",
            FailureCause::Expired(_) => "expired",
        }
    }

    /// When it happened.
    pub fn at(self) -> Instant {
        match self {
            FailureCause::Notice(t)
            | FailureCause::Gone(t)
            | FailureCause::Fenced(t)
            | FailureCause::Aborted(t)
            | FailureCause::Expired(t) => t,
        }
    }
}

/// What the ledger knows of one request ([`Engine::record`](crate::Engine::record)).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Record<const E: usize> {
    /// The request.
    pub key: RequestKey,
    /// The clock at its registration.
    pub registered_at: Instant,
    /// When it expires if its edges have not resolved.
    pub deadline: Instant,
    /// Its edges.
    pub edges: RecordedEdges<E>,
    /// The last failure notice that resolved one of its edges.
    pub failure_notice_at: Option<Instant>,
    /// The last `gone` that resolved one of its edges.
    pub gone_at: Option<Instant>,
    /// The last `fence` that resolved one of its edges.
    pub fenced_at: Option<Instant>,
    /// Aborted or expired, and when.
    pub ended: Option<(Ended, Instant)>,
    /// When `completed` or `failed` was decided (every edge resolved).
    pub decided_at: Option<Instant>,
    /// Until when its blocks settled after a failure (rule 8), if they had to.
    pub settle_end: Option<Instant>,
    /// When its blocks came back (`completed` or `released`), and whether the quarantine
    /// forced it (edges still outstanding).
    pub released: Option<(Instant, bool)>,
}

impl<const E: usize> Record<E> {
    /// The earliest of its failures: a failure notice, a `gone`, a `fence`, the abort or
    /// the expiry. `None` for a request that has not failed.
    pub fn first_failure(&self) -> Option<FailureCause> {
        let ended = self.ended.map(|(how, at)| match how {
            Ended::Aborted => FailureCause::Aborted(at),
            Ended::Expired => FailureCause::Expired(at),
        });
        [
            self.failure_notice_at.map(FailureCause::Notice),
            self.gone_at.map(FailureCause::Gone),
            self.fenced_at.map(FailureCause::Fenced),
            ended,
        ]
        .into_iter()
        .flatten()
        .min_by_key(|c| c.at())
    }

    /// Whether its blocks came back forced by the quarantine, with writes outstanding.
    pub fn forced(&self) -> bool {
        matches!(self.released, Some((_, true)))
    }
}

/// A decision together with the record of its request, built as it was handed out
/// ([`Engine::poll_recorded`]).
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use = "a decision carries blocks or an outcome the engine must act on"]
pub struct Recorded<const E: usize> {
    /// The decision.
    pub decision: Decision,
    /// What the ledger knows of its request, as the decision was handed out.
    pub record: Record<E>,
}

/// What [`Engine::poll_split`] hands out: a completion bare, any other decision with its
/// record.
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use = "a decision carries blocks or an outcome the engine must act on"]
pub enum Split<const E: usize> {
    /// Every edge landed: the blocks go to decode. No record is built.
    Completed(Drained),
    /// Any other decision, with its request's record.
    Other(Recorded<E>),
}

impl<const N: usize, const E: usize> Engine<'_, N, E> {
    /// What the ledger knows of the request `key` names ([`Record`]): while it is
    /// tracked, and after its last decision until its slot takes the next registration.
    /// To keep the record of every decision, take both from
    /// [`poll_recorded`](Self::poll_recorded) (or read it right after
    /// [`poll_decision`](Self::poll_decision) hands the decision out, before registering
    /// again). `None` once the slot holds another request. Reads the slot's edge words and
    /// the owner's record: `O(E)`, nothing on the notification path.
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, EdgeOutcome, Expect, FailureCause, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config::with_capacity(16));
    /// let (p0, p1) = (AgentId(0), AgentId(1));
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Edges(&[p0, p1]), deadline: None }).unwrap();
    /// ledger.advance(Instant::from_millis(5)).expect("clock forward");
    /// let _ = ledger.handle_notification(p0, b"r:2");
    /// let _ = ledger.handle_notification(p1, b"PUSH_FAIL:r:2");
    /// let (_ingest, mut engine) = ledger.split();
    /// let Some(Decision::Failed(failed)) = engine.poll_decision() else { panic!() };
    /// let record = engine.record(failed.key()).expect("not reused yet");
    /// assert_eq!(record.edges.named(), &[(p0, EdgeOutcome::Landed), (p1, EdgeOutcome::FailureNotice)]);
    /// assert_eq!(record.first_failure(), Some(FailureCause::Notice(Instant::from_millis(5))));
    /// ```
    pub fn record(&self, key: RequestKey) -> Option<Record<E>> {
        let slot = (key.0 & 0xFFFF) as u32;
        let r = self.owner.requests.get(slot as usize)?;
        // `expected == 0`: no request was ever registered in the slot.
        if r.key != key.0 || r.expected == 0 {
            return None;
        }
        Some(self.record_at(slot))
    }

    /// The record of the request `slot` holds or last held, until the slot takes the
    /// next registration (see [`record`](Self::record)): what
    /// [`poll_recorded`](Self::poll_recorded) hands out with each decision.
    pub(crate) fn record_at(&self, slot: u32) -> Record<E> {
        let r = &self.owner.requests[slot as usize];
        let key = RequestKey(r.key);
        let h = self.history_of(slot);
        // Retired without a closed history: it completed, at `due` (`complete`).
        let completed = !r.live && !h.flags.contains(HistoryFlags::CLOSED);
        let shared = &self.shared.slots[slot as usize];
        let at =
            |stamp: u32, set: HistoryFlags| h.flags.contains(set).then(|| self.stamped_at(stamp));
        let s = shared.state.load(Ordering::Acquire);
        // Until it is freed the state word says how it stands; after, what was kept of it
        // when it was (the word then belongs to the slot's next generation).
        let (outstanding, failed, notice) = if completed {
            (0, false, None)
        } else if h.flags.contains(HistoryFlags::CLOSED) {
            (
                h.outstanding,
                h.flags.contains(HistoryFlags::FAILED),
                at(h.notice_at, HistoryFlags::NOTICE),
            )
        } else {
            // Not retired, or retired with its history closed before its word was freed:
            // the owner frees a word only after one of those, so the word is this
            // request's.
            debug_assert!(
                s.is_live(r.generation),
                "an unclosed request's word was freed"
            );
            (
                s.outstanding() as u8,
                s.failed(),
                s.settles()
                    .then(|| self.stamped_at(shared.failure_noticed_at())),
            )
        };
        let named = shared.named();
        let edges = if named == 0 {
            RecordedEdges::Count {
                expected: r.expected,
                outstanding,
                failed,
            }
        } else {
            RecordedEdges::Named {
                edges: shared.edge_outcomes(named, r.generation),
                len: named as u8,
            }
        };
        let ended = at(h.ended_at, HistoryFlags::ABORTED)
            .map(|t| (Ended::Aborted, t))
            .or_else(|| at(h.ended_at, HistoryFlags::EXPIRED).map(|t| (Ended::Expired, t)));
        Record {
            key,
            registered_at: self.stamped_at(r.registered_at),
            deadline: self.stamped_at(r.deadline),
            edges,
            failure_notice_at: notice,
            gone_at: at(r.gone_at, HistoryFlags::GONE),
            fenced_at: at(h.fenced_at, HistoryFlags::FENCED),
            ended,
            decided_at: if completed {
                Some(r.due)
            } else {
                at(h.decided_at, HistoryFlags::DECIDED)
            },
            settle_end: h.flags.contains(HistoryFlags::SETTLED).then_some(r.due),
            released: if completed {
                Some((r.due, false))
            } else {
                at(h.released_at, HistoryFlags::RELEASED)
                    .map(|t| (t, h.flags.contains(HistoryFlags::FORCED)))
            },
        }
    }

    /// The history of the request in `slot`, emptied first if it still holds an earlier
    /// request's: only the paths where something went wrong call it.
    #[inline]
    pub(crate) fn history(&mut self, slot: u32) -> &mut History {
        let o = &mut *self.owner;
        let (r, h) = (
            &mut o.requests[slot as usize],
            &mut o.histories[slot as usize],
        );
        if !r.has_history {
            *h = History::EMPTY;
            r.has_history = true;
        }
        h
    }

    /// The history of the request in `slot`, as [`history`](Self::history) would see it.
    pub(crate) fn history_of(&self, slot: u32) -> History {
        match self.owner.requests[slot as usize].has_history {
            true => self.owner.histories[slot as usize],
            false => History::EMPTY,
        }
    }

    /// Keeps, for [`record`](Self::record), how the request's state word stands before
    /// it is freed: what it still owes, whether it failed, and the last failure notice's
    /// time. Owner-only; the word may still move under a forced release (a notice that
    /// lands before the free), which changes the record, never a decision.
    pub(crate) fn close_history(&mut self, slot: u32) {
        let generation = self.owner.requests[slot as usize].generation;
        let shared = &self.shared.slots[slot as usize];
        let s = shared.state.load(Ordering::Acquire);
        let notice = shared.failure_noticed_at();
        let h = self.history(slot);
        if !s.is_live(generation) || h.flags.contains(HistoryFlags::CLOSED) {
            return;
        }
        h.outstanding = s.outstanding() as u8;
        h.notice_at = notice;
        h.flags |= HistoryFlags::CLOSED;
        h.flags.set(HistoryFlags::FAILED, s.failed());
        h.flags.set(HistoryFlags::NOTICE, s.settles());
    }

    /// Notes in the history that the blocks came back now.
    pub(crate) fn released(&mut self, slot: u32, forced: bool) {
        let now = stamp::of(self.owner.now);
        let h = self.history(slot);
        h.released_at = now;
        h.flags |= HistoryFlags::RELEASED;
        h.flags.set(HistoryFlags::FORCED, forced);
    }
}
