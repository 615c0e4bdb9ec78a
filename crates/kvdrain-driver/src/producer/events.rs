//! What the driver hands the engine: the events to act on, what one tick did, and the
//! rank's counters.

/// What the engine must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProducerEvent {
    /// Every WRITE of P's request `request_id` is terminal: its source blocks may be reused.
    SourceReleased {
        /// P's request id.
        request_id: String,
    },
    /// A heartbeat named P's request `request_id`; its lease was extended.
    LeaseExtended {
        /// P's request id.
        request_id: String,
    },
}

/// What one [`ProducerDriver::tick`](super::ProducerDriver::tick) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Notifications drained.
    pub notifications: usize,
    /// Writes posted.
    pub posted: usize,
    /// Writes that reached a terminal status.
    pub finished: usize,
    /// Failure notices sent.
    pub notices: usize,
    /// Requests whose source blocks were released.
    pub released: usize,
}

/// Counters of a producer rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerCounters {
    /// `PUSH_REG` decoded.
    pub registrations: u64,
    /// `PUSH_REG` that did not decode (dropped, as vLLM does).
    pub registrations_malformed: u64,
    /// `PUSH_REG` for a request being pushed already (another consumer rank's copy).
    pub registrations_duplicate: u64,
    /// `PUSH_REG` dropped because the stash of unpaired ones was full.
    pub registrations_dropped: u64,
    /// `PUSH_REG` for a request retired here: answered with failure notices (F4).
    pub registrations_retired: u64,
    /// Heartbeat ids that extended a lease.
    pub heartbeats: u64,
    /// Other notifications (ignored).
    pub ignored: u64,
    /// Writes posted.
    pub posted: u64,
    /// Writes that landed.
    pub landed: u64,
    /// Writes that could not be described or posted (C2), handshake failures included.
    pub post_failures: u64,
    /// Posted writes that ended with a backend error (F7).
    pub failed_after_post: u64,
    /// Posted writes whose status became unreadable (NOT_FOUND not caused here): no
    /// notice, source blocks fenced (F7).
    pub status_unknown: u64,
    /// Handshakes that failed (F8).
    pub handshake_failures: u64,
    /// `PUSH_FAIL` sent.
    pub notices_sent: u64,
    /// `PUSH_FAIL` owed to a consumer that could not be reached.
    pub notices_unsendable: u64,
    /// Requests whose source blocks were released.
    pub released: u64,
    /// Registrations whose topology the plan refused (nothing owed: the edges cannot be named).
    pub unplannable: u64,
    /// Leases that ran out (the request was retired).
    pub leases_expired: u64,
    /// Offers refused (full table or duplicate).
    pub offers_refused: u64,
    /// Plan steps the driver took in a wrong order (a driver bug; always 0).
    pub plan_errors: u64,
}
