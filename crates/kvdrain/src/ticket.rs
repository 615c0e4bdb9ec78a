//! The engine-facing typestate: registrations in, owned tickets out.
//!
//! ```text
//! Registration ──register──▶ Pending ───(all edges landed)──────▶ Drained ──into_decode──▶ BlockHandle
//!   (pending)                   │    └──(all resolved, ≥1 failed)─▶ Failed ┐
//!                               │                                          ├─▶ Released ──into_free──▶ BlockHandle
//!                               └─abort / deadline──▶ Quarantined ─────────┘   (edges drained or quarantine over)
//! ```
//!
//! Tickets are consumed by value and are neither `Clone` nor `Copy`. Only [`Drained`] gives
//! the blocks to decode and only [`Released`] gives them back for reuse, so freeing the
//! blocks of a request that may still be written to does not compile. The run-time state of
//! every request stays in the ledger's table; tickets carry the [`RequestKey`] that ties
//! them to it.

use core::fmt;

use crate::time::Duration;

/// A producer agent, numbered by the caller (the glue maps NIXL agent names to these).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AgentId(pub u16);

impl AgentId {
    /// The id to give a sender the caller cannot name (no registration or introduction
    /// named it): its notices can never match a named edge, because a registration that
    /// lists it in [`Expect::Edges`](crate::Expect::Edges) is refused
    /// ([`BadEdges`](crate::RegisterErrorKind::BadEdges)). Callers number the agents they
    /// know below it.
    pub const STRANGER: AgentId = AgentId(u16::MAX);
}

/// The engine's handle on a request's destination blocks (e.g. its block-table index).
/// Opaque to kvdrain; handed back only when the blocks may be used.
#[derive(PartialEq, Eq, Hash, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BlockHandle(pub u64);

/// Identifies one registration for its whole life (unique per ledger, never reused).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RequestKey(pub(crate) u64);

impl RequestKey {
    /// Registration order: keys increase with every accepted registration.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The key whose [`get`](Self::get) is `key`, for a caller that kept only the number
    /// (a binding: C, Python). Only [`Engine::record`](crate::Engine::record) takes a
    /// key, and a number no registration returned finds no record there.
    pub const fn from_raw(key: u64) -> RequestKey {
        RequestKey(key)
    }
}

/// What a request waits for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Expect<'a> {
    /// `n` notices (completions or failure notices) from any sender — vLLM's semantics.
    /// `1..=`[`MAX_EDGES`](crate::MAX_EDGES).
    Count(u8),
    /// Exactly one notice from each of these distinct agents (`1..=E` of them). Duplicates
    /// and unexpected senders are detected and the missing producer can be named.
    Edges(&'a [AgentId]),
}

/// A request the engine wants tracked (the *pending* state of the typestate).
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Registration<'a> {
    /// The consumer's request id, as it will appear in completions.
    pub id: &'a str,
    /// Handed back in [`Drained`] or [`Released`].
    pub blocks: BlockHandle,
    /// Edges to wait for.
    pub expect: Expect<'a>,
    /// How long after its registration the request expires (relative, not a point in
    /// time); `None` uses the ledger's [`Config::deadline`](crate::Config::deadline).
    pub deadline: Option<Duration>,
}

/// A tracked request whose writes may still land, in counting or named-edge mode (the
/// type was called `Counting`). Holds no blocks.
#[must_use = "keep the ticket to abort the request; decisions arrive through `poll_decision`"]
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Pending {
    pub(crate) key: RequestKey,
    pub(crate) slot: u32,
}

impl Pending {
    /// The request's key.
    pub fn key(&self) -> RequestKey {
        self.key
    }
}

/// Every edge delivered its completion: the blocks hold the whole KV.
#[must_use = "hand the blocks to decode with `into_decode`"]
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Drained {
    pub(crate) key: RequestKey,
    pub(crate) blocks: BlockHandle,
}

impl Drained {
    /// The request's key.
    pub fn key(&self) -> RequestKey {
        self.key
    }
    /// The blocks, now owned by the running request (no release follows).
    pub fn into_decode(self) -> BlockHandle {
        self.blocks
    }
}

/// Every edge is resolved and at least one failed: the request has failed for the client.
/// The blocks come back in the [`Released`] that follows — at once, or once every failure
/// notice has settled ([`Config::settle`](crate::Config::settle)), since a write it
/// reports may still be landing; their content must not be read.
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Failed {
    pub(crate) key: RequestKey,
}

impl Failed {
    /// The request's key.
    pub fn key(&self) -> RequestKey {
        self.key
    }
}

/// Why a request was quarantined.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum QuarantineCause {
    /// The engine aborted it.
    Aborted,
    /// Its deadline passed.
    Expired,
}

/// Edges still owed when a request was quarantined.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Outstanding {
    /// Counting mode: how many notices were still owed.
    Count(u8),
    /// Named-edge mode: bit `i` set if the `i`-th agent of the registration still owes.
    Edges(u64),
}

/// The request is over for the client but its blocks stay fenced: writes may still land.
#[must_use = "the blocks come back later as `Decision::Released`"]
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Quarantined {
    pub(crate) key: RequestKey,
    pub(crate) cause: QuarantineCause,
    pub(crate) outstanding: Outstanding,
}

impl Quarantined {
    /// The request's key.
    pub fn key(&self) -> RequestKey {
        self.key
    }
    /// Abort or deadline.
    pub fn cause(&self) -> QuarantineCause {
        self.cause
    }
    /// What was still owed at that moment.
    pub fn outstanding(&self) -> Outstanding {
        self.outstanding
    }
}

/// The blocks of a request that did not complete are safe to reuse.
#[must_use = "give the blocks back with `into_free`"]
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Released {
    pub(crate) key: RequestKey,
    pub(crate) blocks: BlockHandle,
    pub(crate) forced: bool,
}

impl Released {
    /// The request's key.
    pub fn key(&self) -> RequestKey {
        self.key
    }
    /// `true` if released because the quarantine ran out with edges still outstanding.
    pub fn forced(&self) -> bool {
        self.forced
    }
    /// The blocks, free for reuse.
    pub fn into_free(self) -> BlockHandle {
        self.blocks
    }
}

/// A decision the ledger hands to the engine.
#[must_use]
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Decision {
    /// `completed`: decode may start.
    Completed(Drained),
    /// `failed`: apply the KV load failure policy; a `Released` follows, at once or, if a
    /// failure notice has not settled yet ([`Config::settle`](crate::Config::settle)),
    /// from the `advance` that reaches its settle end.
    Failed(Failed),
    /// `expired`: the deadline passed with edges outstanding.
    Expired(Quarantined),
    /// `released`: the blocks are free.
    Released(Released),
}

impl Decision {
    /// The request the decision is about.
    pub fn key(&self) -> RequestKey {
        match self {
            Decision::Completed(d) => d.key,
            Decision::Failed(f) => f.key,
            Decision::Expired(q) => q.key,
            Decision::Released(r) => r.key,
        }
    }
}

impl fmt::Display for QuarantineCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuarantineCause::Aborted => "aborted",
            QuarantineCause::Expired => "expired",
        })
    }
}
