//! One small error type per operation, each with a hand-written `Display`.
//!
//! `#[non_exhaustive]` policy: none of these enums is. Each names a *cause* that callers
//! count one by one (catalogue F15: one counter per cause) or map to a protocol word, so a
//! new cause must be a compile error at every `match`, not fall silently into a wildcard
//! arm. The wire codec's errors (`wire::ParseError`, `wire::EncodeError`) describe why
//! bytes are not a message, are printed rather than tabulated, and stay
//! `#[non_exhaustive]`.

use core::fmt;

use crate::ticket::Registration;
use crate::time::Instant;
use crate::wire::ParseError;

/// Why [`register`](crate::Engine::register) refused a request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RegisterErrorKind {
    /// The table holds `capacity` requests (quarantined ones included).
    Full,
    /// A request with this id is tracked already.
    DuplicateId,
    /// `Expect::Count` outside `1..=`[`MAX_EDGES`](crate::MAX_EDGES).
    BadCount,
    /// `Expect::Edges` empty, longer than the ledger's edge capacity `E`, naming an
    /// agent twice, or naming [`AgentId::STRANGER`](crate::AgentId::STRANGER).
    BadEdges,
}

impl RegisterErrorKind {
    /// A word for the reason: the spec's `rejected` reasons (`full`, `duplicate_id`), and
    /// `bad_count` / `bad_edges` for registrations a trace cannot express.
    pub fn as_str(&self) -> &'static str {
        match self {
            RegisterErrorKind::Full => "full",
            RegisterErrorKind::DuplicateId => "duplicate_id",
            RegisterErrorKind::BadCount => "bad_count",
            RegisterErrorKind::BadEdges => "bad_edges",
        }
    }
}

impl fmt::Display for RegisterErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegisterErrorKind::Full => "table full",
            RegisterErrorKind::DuplicateId => "request id already tracked",
            RegisterErrorKind::BadCount => "expected count outside 1..=64",
            RegisterErrorKind::BadEdges => {
                "edge list empty, too long, naming an agent twice or naming the stranger id"
            }
        })
    }
}

/// A refused registration, handed back whole so nothing is lost.
#[derive(PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RegisterError<'a> {
    /// Why.
    pub kind: RegisterErrorKind,
    /// The registration, unchanged.
    pub registration: Registration<'a>,
}

impl fmt::Display for RegisterError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "registration of {:?} refused: {}",
            self.registration.id, self.kind
        )
    }
}

impl core::error::Error for RegisterError<'_> {}

/// Why an abort changed nothing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AbortError {
    /// No such request is tracked or remembered.
    Unknown,
    /// The request was already decided (completed, failed — settling or not —, aborted or
    /// expired).
    Late,
}

impl fmt::Display for AbortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AbortError::Unknown => "abort of an unknown request",
            AbortError::Late => "abort of a request already decided",
        })
    }
}

impl core::error::Error for AbortError {}

/// Why a notification changed nothing (the `ignored` reasons of the spec).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IgnoreReason {
    /// The bytes are not a push-mode message.
    Malformed(ParseError),
    /// `HB:` or `PUSH_REG:`: for producers.
    NotForConsumer,
    /// No such request is tracked or remembered; no state was created.
    Unknown,
    /// The request was already decided.
    Late,
    /// Named-edge mode: this agent's edge was already resolved.
    Duplicate,
    /// Named-edge mode: the agent is not one of the request's edges.
    UnexpectedSender,
}

impl IgnoreReason {
    /// The spec's word for the reason.
    pub fn as_str(&self) -> &'static str {
        match self {
            IgnoreReason::Malformed(_) => "malformed",
            IgnoreReason::NotForConsumer => "not_for_consumer",
            IgnoreReason::Unknown => "unknown",
            IgnoreReason::Late => "late",
            IgnoreReason::Duplicate => "duplicate",
            IgnoreReason::UnexpectedSender => "unexpected_sender",
        }
    }
}

/// A notification that changed nothing, with the request id it named (if it parsed).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Ignored<'m> {
    /// Why.
    pub reason: IgnoreReason,
    /// The id the message named, borrowed from it.
    pub request_id: Option<&'m str>,
}

impl fmt::Display for Ignored<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "notification ignored ({})", self.reason.as_str())?;
        if let IgnoreReason::Malformed(e) = self.reason {
            write!(f, ": {e}")?;
        }
        if let Some(id) = self.request_id {
            write!(f, " for {id:?}")?;
        }
        Ok(())
    }
}

impl core::error::Error for Ignored<'_> {}

/// Why a clock advance was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ClockError {
    /// `now` is earlier than the last time given; nothing changed.
    Backwards {
        /// The ledger's clock.
        last: Instant,
        /// The time given.
        now: Instant,
    },
}

impl fmt::Display for ClockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockError::Backwards { last, now } => {
                write!(f, "clock went backwards from {last} to {now}")
            }
        }
    }
}

impl core::error::Error for ClockError {}
