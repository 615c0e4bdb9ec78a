//! Run-time settings of a [`Ledger`](crate::Ledger).

/// Run-time settings.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// Requests tracked at once, quarantined and settling ones included; at most `N`.
    pub capacity: usize,
    /// Default deadline of a registration, in ms.
    pub deadline_ms: u64,
    /// How long the blocks of an aborted or expired request stay fenced after the abort or
    /// the deadline before they are released anyway, in ms. Set it above the producers'
    /// lease (vLLM: 30 s) so that no producer can still be writing.
    pub quarantine_ms: u64,
    /// How long after the last failure notice (`PUSH_FAIL:`) that resolved one of its
    /// edges a request's blocks stay fenced, in ms (rule 8): the write the notice reports
    /// may have errored after it was posted, and NIXL cannot cancel a posted write, so its
    /// bytes may still be landing. Completions and fences need no settling; the forced
    /// release at the end of a quarantine is not delayed. `0` releases with the decision,
    /// which is vLLM's behaviour.
    pub settle_ms: u64,
    /// Seed of the request-id fingerprints' key (ten key words derived from it once, at
    /// construction). Any value works; a secret one keeps peers from aiming for
    /// collisions.
    pub seed: u64,
}

impl Config {
    /// The default deadline of a registration.
    pub const DEFAULT_DEADLINE_MS: u64 = 30_000;
    /// The default quarantine after an abort or a deadline.
    pub const DEFAULT_QUARANTINE_MS: u64 = 60_000;
    /// The default settling time of a failure notice.
    pub const DEFAULT_SETTLE_MS: u64 = 5_000;

    /// The defaults: deadline 30 s, quarantine 60 s, settling 5 s, capacity `n`.
    pub const fn with_capacity(n: usize) -> Self {
        Config {
            capacity: n,
            deadline_ms: Self::DEFAULT_DEADLINE_MS,
            quarantine_ms: Self::DEFAULT_QUARANTINE_MS,
            settle_ms: Self::DEFAULT_SETTLE_MS,
            seed: 0x6b76_6472_6169_6e00,
        }
    }
}
