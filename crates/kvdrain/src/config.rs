//! Run-time settings of a [`Ledger`](crate::Ledger).

use crate::time::Duration;

/// Run-time settings.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// Requests tracked at once, quarantined and settling ones included; at most `N`.
    pub capacity: usize,
    /// The deadline of a registration that names none, counted from its registration.
    pub deadline: Duration,
    /// How long the blocks of an aborted or expired request stay fenced after the abort or
    /// the deadline before they are released anyway. Set it above the producers' lease
    /// (vLLM: 30 s) so that no producer can still be writing.
    pub quarantine: Duration,
    /// How long after the last failure notice (`PUSH_FAIL:`) or [`gone`](crate::Engine::gone)
    /// that resolved one of its edges a request's blocks stay fenced (rule 8): the write the
    /// notice reports may have errored after it was posted, and NIXL cannot cancel a posted
    /// write, so its bytes may still be landing. Completions and fences need no settling;
    /// the forced release at the end of a quarantine is not delayed.
    /// [`Duration::ZERO`] releases with the decision, which is vLLM's behaviour.
    pub settle: Duration,
    /// Seed of the request-id fingerprints' key (ten key words derived from it once, at
    /// construction). Any value works; a secret one keeps peers from aiming for
    /// collisions.
    pub seed: u64,
}

impl Config {
    /// The default deadline of a registration: 30 s.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
    /// The default quarantine after an abort or a deadline: 60 s.
    pub const DEFAULT_QUARANTINE: Duration = Duration::from_secs(60);
    /// The default settling time of a failure notice or a `gone`: 5 s.
    pub const DEFAULT_SETTLE: Duration = Duration::from_secs(5);

    /// The defaults: deadline 30 s, quarantine 60 s, settling 5 s, capacity `n`.
    pub const fn with_capacity(n: usize) -> Self {
        Config {
            capacity: n,
            deadline: Self::DEFAULT_DEADLINE,
            quarantine: Self::DEFAULT_QUARANTINE,
            settle: Self::DEFAULT_SETTLE,
            seed: 0x6b76_6472_6169_6e00,
        }
    }
}
