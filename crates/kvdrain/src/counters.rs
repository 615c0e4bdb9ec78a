//! Counters for every decision and every ignored or rejected reason (catalogue F15: one
//! counter per cause), readable as plain structs for export as metrics.

/// What the ingest side saw.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct IngestCounters {
    /// Completions that resolved an edge.
    pub completions: u64,
    /// Failure notices (`PUSH_FAIL:`) that resolved an edge.
    pub failure_notices: u64,
    /// Notices that resolved a request's last edge.
    pub last_edges: u64,
    /// `ignored`, `malformed`.
    pub malformed: u64,
    /// `ignored`, `not_for_consumer`.
    pub not_for_consumer: u64,
    /// `ignored`, `unknown`.
    pub unknown: u64,
    /// `ignored`, `late`.
    pub late: u64,
    /// `ignored`, `duplicate`.
    pub duplicate: u64,
    /// `ignored`, `unexpected_sender`.
    pub unexpected_sender: u64,
    /// Ready-ring pushes refused (an invariant violation; always 0).
    pub ready_overflow: u64,
}

/// What the engine side decided.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EngineCounters {
    /// Registrations accepted.
    pub registered: u64,
    /// `rejected`, `full`.
    pub rejected_full: u64,
    /// `rejected`, `duplicate_id`.
    pub rejected_duplicate_id: u64,
    /// Registrations refused for a bad count or edge list.
    pub rejected_invalid: u64,
    /// `completed`.
    pub completed: u64,
    /// `failed` (transfer failures, kept apart from expiries).
    pub failed: u64,
    /// `aborted`.
    pub aborted: u64,
    /// `expired`.
    pub expired: u64,
    /// `released` after every edge resolved.
    pub released: u64,
    /// `released` with `forced: true` (quarantine ran out).
    pub released_forced: u64,
    /// Aborts of unknown requests.
    pub abort_unknown: u64,
    /// Aborts of requests already decided.
    pub abort_late: u64,
    /// Named edges resolved as failed by a fence.
    pub fenced_edges: u64,
    /// Named edges resolved as failed by a `gone` (they settle, as failure notices do).
    pub gone_edges: u64,
    /// Requests that started waiting for a failure notice or a `gone` to settle (rule 8).
    pub settle_started: u64,
    /// Of those, how many were released when the settling ended (the others were
    /// released by their quarantine running out first; both are also counted in
    /// `released` or `released_forced`).
    pub settle_released: u64,
    /// Requests waiting to settle now (a gauge: `settle_started` minus those released);
    /// each holds its slot and its blocks.
    pub settling: u64,
}

/// Both sides together.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Counters {
    /// Ingest side.
    pub ingest: IngestCounters,
    /// Engine side.
    pub engine: EngineCounters,
}
