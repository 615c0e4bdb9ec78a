//! The run-time configuration of a ledger, and the one fixed instantiation behind it.

use kvdrain::{Config, Duration, Ledger};

use crate::status::kvdrain_status::{self, KVDRAIN_ERR_INVALID, KVDRAIN_OK};
use crate::status::{boundary, write_opt};

/// The table size `N` of the one instantiation, `Ledger<65536, 8>`: the most requests a
/// ledger can be configured to track at once.
pub const KVDRAIN_MAX_CAPACITY: u32 = 65_536;
/// The edge capacity `E` of the instantiation: the most agents a named-edge registration
/// may list.
pub const KVDRAIN_MAX_EDGES: u32 = 8;
/// The most notices a counting-mode registration may wait for.
pub const KVDRAIN_MAX_COUNT: u32 = 64;

/// The table size `N` of [`CoreLedger`]. Under miri a small table, so that the ownership
/// code (which is the same) is checked in seconds rather than hours.
/// cbindgen:ignore
#[cfg(not(miri))]
pub(crate) const TABLE: usize = KVDRAIN_MAX_CAPACITY as usize;
/// cbindgen:ignore
#[cfg(miri)]
pub(crate) const TABLE: usize = 64;

/// The core type every handle wraps.
/// cbindgen:ignore
pub(crate) type CoreLedger = Ledger<TABLE, { KVDRAIN_MAX_EDGES as usize }>;

/// Run-time settings of a ledger. Start from `kvdrain_config_default` and change fields.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct kvdrain_config {
    /// Requests tracked at once, quarantined ones included: `1..=KVDRAIN_MAX_CAPACITY`.
    pub capacity: u32,
    /// Default deadline of a registration, in ms (default 30 000).
    pub deadline_ms: u64,
    /// How long the blocks of an aborted or expired request stay fenced before they are
    /// released anyway, in ms (default 60 000). Set it above the producers' lease.
    pub quarantine_ms: u64,
    /// How long after a failure notice the blocks of its request stay fenced, in ms
    /// (default 5 000): a failed write may still be landing (rule 8). 0 releases with
    /// the decision, as vLLM does.
    pub settle_ms: u64,
    /// Key of the request-id fingerprints; any value works, a secret one keeps peers from
    /// aiming for collisions.
    pub seed: u64,
}

impl kvdrain_config {
    /// The defaults for `capacity`.
    pub(crate) fn defaults(capacity: u32) -> Self {
        let core = Config::with_capacity(capacity as usize);
        kvdrain_config {
            capacity,
            deadline_ms: core.deadline.millis(),
            quarantine_ms: core.quarantine.millis(),
            settle_ms: core.settle.millis(),
            seed: core.seed,
        }
    }

    /// The core's configuration, or `KVDRAIN_ERR_INVALID` for a capacity out of range.
    pub(crate) fn to_core(self) -> Result<Config, kvdrain_status> {
        if !(1..=KVDRAIN_MAX_CAPACITY).contains(&self.capacity) {
            return Err(KVDRAIN_ERR_INVALID);
        }
        let config = Config {
            capacity: self.capacity as usize,
            // The ABI's spans are integers in ms.
            deadline: Duration::from_millis(self.deadline_ms),
            quarantine: Duration::from_millis(self.quarantine_ms),
            settle: Duration::from_millis(self.settle_ms),
            seed: self.seed,
        };
        Ok(config)
    }
}

/// Writes the defaults for `capacity` into `*out` (deadline 30 s, quarantine 60 s,
/// settle 5 s, the built-in seed). `capacity` is checked by `kvdrain_ledger_new`, not
/// here. Any thread.
///
/// # Safety
/// `out` must be NULL or valid for writing one `kvdrain_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_config_default(
    capacity: u32,
    out: *mut kvdrain_config,
) -> kvdrain_status {
    boundary(|| {
        if out.is_null() {
            return kvdrain_status::KVDRAIN_ERR_NULL;
        }
        // SAFETY: non-NULL and valid for writes per the contract.
        unsafe { write_opt(out, kvdrain_config::defaults(capacity)) };
        KVDRAIN_OK
    })
}
