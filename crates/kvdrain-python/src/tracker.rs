//! The ledger's two halves on the heap, each behind its own lock, for every table size the
//! module offers.
//!
//! [`Halves<N>`] owns a boxed [`Ledger<N, EDGES>`] and the [`Ingest`] and [`Engine`] halves
//! split from it (a self-referential holder: the halves borrow the box, which never moves
//! and outlives them). The ingest half is locked by the thread that feeds NIXL batches and
//! the engine half by the thread that registers, polls and advances, so the two never wait
//! for each other: their only meeting point is the core's lock-free split.
//!
//! [`Tracker`] erases `N` so that one Python class can hold any table size; each method
//! works on a whole batch, so the dynamic call is paid once per batch.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kvdrain::{
    AbortError, AgentId, BlockHandle, ClockError, Config, Decision as CoreDecision, Duration,
    Engine, EngineCounters, Expect, Ingest, IngestCounters, Instant, Ledger, Outstanding, Record,
    Recorded, RegisterErrorKind, Registration, Split,
};
use ouroboros::self_referencing;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use pyo3::{PyTraverseError, PyVisit};

use crate::decision::Kind;
use crate::lock::{lock, lock_detached};
use crate::requests::{Entry, Requests};

/// Named edges per request in every table the module builds (counting mode allows up to
/// 64 notices whatever this is).
pub(crate) const EDGES: usize = 8;

/// A decision taken under the engine lock; it becomes a Python object after the lock is
/// released.
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) kind: Kind,
    pub(crate) entry: Entry,
    pub(crate) at_ms: u64,
    pub(crate) forced: bool,
    pub(crate) outstanding: Option<Outstanding>,
    /// The request's record, handed out by the core with the decision (on the heap: a
    /// `Taken` and a `Decision` stay small, so a poll of thousands moves little memory).
    pub(crate) record: Arc<Record<EDGES>>,
}

/// One message of a batch: the sender's number and the bytes, borrowed from a `bytes`
/// object the caller keeps alive (immutable, so no other thread can change them while
/// the batch is fed without the GIL).
pub(crate) type Message<'b> = (AgentId, &'b [u8]);

/// Batches at least this long are fed with the GIL released: below it, detaching (about
/// a microsecond) would cost more than the other threads gain.
pub(crate) const DETACH_AT: usize = 512;

/// Why the engine side refused one registration.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Refusal {
    /// The core refused it.
    Core(RegisterErrorKind),
    /// Its id is not valid UTF-8.
    NotUtf8,
    /// Its id can never complete (`kvdrain::wire::check_request_id`).
    CannotComplete(kvdrain::wire::EncodeError),
}

/// The table-size-independent face of [`Halves`].
pub(crate) trait Tracker: Send + Sync {
    /// Feeds `messages` in order to the ingest half (with the GIL released from
    /// [`DETACH_AT`] messages on) and counts `not_bytes` entries that were not `bytes`;
    /// pushes the positions of the producer-bound messages onto `producer_bound`.
    fn feed(
        &self,
        py: Python<'_>,
        messages: &[Message<'_>],
        not_bytes: u64,
        producer_bound: &mut Vec<usize>,
    );
    /// Feeds small batches of `list`s with the GIL held, element by element (no copy of
    /// the references): `(agent, list, key)` per sender; entries that are not `bytes` are
    /// counted. Pushes `(sender position, message)` for each producer-bound message.
    /// Nothing here runs Python code, so no other thread can change the lists meanwhile.
    fn feed_lists<'py>(
        &self,
        py: Python<'py>,
        batch: &[(AgentId, Bound<'py, PyList>, Bound<'py, PyAny>)],
        producer_bound: &mut Vec<(usize, Bound<'py, PyAny>)>,
    );
    /// Registers each `(entry, count)` in order under one lock; stops at the first refusal
    /// and hands back why, and the refused entry. The entries after it are left in
    /// `entries`. Runs no Python code and drops no Python object.
    fn register_many(
        &self,
        py: Python<'_>,
        entries: &mut std::vec::IntoIter<(Entry, Option<u8>)>,
        deadline_ms: Option<u64>,
    ) -> Result<(), (Refusal, Entry)>;
    /// Decisions the ingest half made ready.
    fn poll(&self, py: Python<'_>) -> Vec<Taken>;
    /// The same, with the completed requests' ids apart (no [`Taken`] made for them) and
    /// their blocks objects in `blocks`, for the caller to drop once the lock is released
    /// (a drop may run `__del__`).
    fn poll_split(
        &self,
        py: Python<'_>,
        completed: &mut Vec<Py<PyString>>,
        blocks: &mut Vec<Py<PyAny>>,
        others: &mut Vec<Taken>,
    );
    /// Tells the ingest half when the notices fed from now on arrived (the core's
    /// `Ingest::set_arrival`: an earlier time than one given before is ignored).
    fn set_arrival(&self, py: Python<'_>, now_ms: u64);
    /// Moves the clock; deadlines and quarantine ends fire.
    fn advance(&self, py: Python<'_>, now_ms: u64) -> Result<Vec<Taken>, ClockError>;
    /// Aborts a request by id, after moving the clock to `now_ms` if given (under the same
    /// lock). The decisions that move takes stay queued for the next call that hands
    /// queued decisions out (`poll`, `advance`, `gone`, `fence`): an abort hands out its
    /// own `aborted` only.
    fn abort(
        &self,
        py: Python<'_>,
        id: &str,
        now_ms: Option<u64>,
    ) -> Result<Result<Taken, AbortError>, ClockError>;
    /// The core's `gone` of `agent`, after moving the clock to `now_ms` if given (under
    /// the same lock). Returns the decisions of both, the clock's first.
    fn gone(
        &self,
        py: Python<'_>,
        agent: AgentId,
        now_ms: Option<u64>,
    ) -> Result<Vec<Taken>, ClockError>;
    /// The core's `fence` of `agent`, as [`gone`](Self::gone).
    fn fence(
        &self,
        py: Python<'_>,
        agent: AgentId,
        now_ms: Option<u64>,
    ) -> Result<Vec<Taken>, ClockError>;
    /// Both halves' counters plus the entries that were not `bytes`.
    fn counters(&self, py: Python<'_>) -> (IngestCounters, u64, EngineCounters);
    /// Visits every Python object the engine side holds (`tp_traverse`). Skips them if
    /// the engine half is locked right now: unvisited references only keep objects alive.
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError>;
    /// Takes out every registration and refused hold (`tp_clear`: the ledger is
    /// unreachable), or nothing if the engine half is locked right now.
    fn clear(&self) -> (Vec<Entry>, Vec<Held>);
    /// Clock, next timer, requests tracked.
    fn clock(&self, py: Python<'_>) -> (u64, Option<u64>, usize);
    /// The core's `hold_refused`, with the held receive kept in its queue; returns when
    /// it ends (ms).
    fn hold_refused(&self, py: Python<'_>, held: Held) -> u64;
    /// The refused holds whose end the clock reached, oldest first, out of the queue.
    fn poll_refused_releases(&self, py: Python<'_>) -> Vec<Held>;
}

/// A receive the core refused and holds for its quarantine (`Engine::hold_refused`): what
/// the caller gave, handed back when the hold ends.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) id: Py<PyString>,
    pub(crate) blocks: Py<PyAny>,
}

/// What the ingest lock guards.
#[derive(Debug)]
struct IngestSide<'l, const N: usize> {
    ingest: Ingest<'l, N, EDGES>,
    not_bytes: u64,
}

/// What the engine lock guards.
#[derive(Debug)]
struct EngineSide<'l, const N: usize> {
    engine: Engine<'l, N, EDGES>,
    /// Live registrations by request key.
    requests: Requests,
    /// Refused receives held, by hold number from `refused_front` on: the core keeps
    /// their ends, this side what they hold.
    refused: VecDeque<Held>,
    refused_front: u64,
}

#[derive(Debug)]
struct Sides<'l, const N: usize> {
    ingest: Mutex<IngestSide<'l, N>>,
    engine: Mutex<EngineSide<'l, N>>,
}

/// A heap ledger of `N` requests and its two halves. The ledger is the one element of a
/// `Vec` (reserved fallibly, never grown, so it never moves).
#[self_referencing]
pub(crate) struct Halves<const N: usize> {
    ledger: Vec<Ledger<N, EDGES>>,
    #[borrows(mut ledger)]
    #[not_covariant]
    sides: Sides<'this, N>,
}

impl<const N: usize> std::fmt::Debug for Halves<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Halves")
            .field("N", &N)
            .finish_non_exhaustive()
    }
}

/// Why a ledger could not be built.
#[derive(Debug)]
pub(crate) enum BuildError {
    /// Its tables (`bytes` of them) could not be allocated.
    NoMemory { bytes: usize },
    /// The thread with a stack for its construction could not start.
    NoThread(std::io::Error),
}

/// Builds a `Ledger<N, EDGES>` and splits it. Its memory and the key table's are
/// allocated fallibly first (an out-of-memory is an error, not an abort). [`Ledger::new`]
/// builds the value on the stack (13 MiB at `N` = 65 536), so it runs on a thread whose
/// stack has room for it, and is moved into the reserved place.
pub(crate) fn build<const N: usize>(config: Config) -> Result<Box<dyn Tracker>, BuildError> {
    let bytes = std::mem::size_of::<Ledger<N, EDGES>>();
    // The one element's place, reserved now: the push below never allocates.
    let mut ledger: Vec<Ledger<N, EDGES>> = Vec::new();
    ledger
        .try_reserve_exact(1)
        .map_err(|_| BuildError::NoMemory { bytes })?;
    let requests = Requests::try_new(N).map_err(|bytes| BuildError::NoMemory { bytes })?;
    std::thread::Builder::new()
        .name("kvdrain-ledger".into())
        .stack_size(bytes * 4 + (4 << 20))
        .spawn(move || -> Box<dyn Tracker> {
            ledger.push(Ledger::<N, EDGES>::new(config));
            Box::new(
                HalvesBuilder {
                    ledger,
                    sides_builder: |ledger: &mut Vec<Ledger<N, EDGES>>| {
                        let (ingest, engine) = ledger[0].split();
                        Sides {
                            ingest: Mutex::new(IngestSide {
                                ingest,
                                not_bytes: 0,
                            }),
                            engine: Mutex::new(EngineSide {
                                engine,
                                requests,
                                refused: VecDeque::new(),
                                refused_front: 0,
                            }),
                        }
                    },
                }
                .build(),
            )
        })
        .map_err(BuildError::NoThread)?
        .join()
        .map_err(|_| BuildError::NoThread(std::io::Error::other("building the ledger panicked")))
}

/// Turns one of the core's decisions, just pulled with its record, into a [`Taken`];
/// completed and released requests leave the table. `None` only for a key this side never
/// registered (a bookkeeping bug: there is no request to tell the caller about).
fn taken<const N: usize>(
    side: &mut EngineSide<'_, N>,
    py: Python<'_>,
    at_ms: u64,
    recorded: Recorded<EDGES>,
) -> Option<Taken> {
    let Recorded {
        decision: d,
        record,
    } = recorded;
    let key = d.key().get();
    let requests = &mut side.requests;
    let (kind, entry, forced, outstanding) = match d {
        CoreDecision::Completed(drained) => {
            let BlockHandle(_) = drained.into_decode();
            (Kind::Completed, requests.remove(key), false, None)
        }
        CoreDecision::Failed(_) => (
            Kind::Failed,
            requests.get(key).map(|e| e.clone_ref(py)),
            false,
            None,
        ),
        CoreDecision::Expired(q) => (
            Kind::Expired,
            requests.get(key).map(|e| e.clone_ref(py)),
            false,
            Some(q.outstanding()),
        ),
        CoreDecision::Released(r) => {
            let forced = r.forced();
            let BlockHandle(_) = r.into_free();
            (Kind::Released, requests.remove(key), forced, None)
        }
    };
    Some(Taken {
        kind,
        entry: entry?,
        at_ms,
        forced,
        outstanding,
        record: Arc::new(record),
    })
}

/// The core loop of `feed`: every message to the ingest half, in order.
fn feed_side<const N: usize>(
    side: &mut IngestSide<'_, N>,
    messages: &[Message<'_>],
    not_bytes: u64,
    producer_bound: &mut Vec<usize>,
) {
    side.not_bytes += not_bytes;
    for (at, &(agent, bytes)) in messages.iter().enumerate() {
        // A decided request waits on the ready ring for the engine's pull; an ignored
        // notice is counted by the core.
        if let Err(ignored) = side.ingest.handle_notification(agent, bytes)
            && ignored.reason == kvdrain::IgnoreReason::NotForConsumer
        {
            producer_bound.push(at);
        }
    }
}

/// Pulls the decisions the last `advance` or `fence` queued (those of requests the ingest
/// half drained stay for `poll`, which decides them), each with its record.
fn take_queued<const N: usize>(
    side: &mut EngineSide<'_, N>,
    py: Python<'_>,
    at_ms: u64,
    out: &mut Vec<Taken>,
) {
    while let Some(recorded) = side.engine.poll_queued_recorded() {
        out.extend(taken(side, py, at_ms, recorded));
    }
}

/// The core's `abort_id` under the engine lock, as an `aborted` decision.
fn abort_side<const N: usize>(
    side: &mut EngineSide<'_, N>,
    py: Python<'_>,
    id: &str,
) -> Result<Taken, AbortError> {
    let q = side.engine.abort_id(id)?;
    let entry = side.requests.get(q.key().get()).map(|e| e.clone_ref(py));
    // A request the core tracks is always in the table and has a record; if it were
    // not, the abort would concern nothing the caller registered.
    let (Some(entry), Some(record)) = (entry, side.engine.record(q.key())) else {
        return Err(AbortError::Unknown);
    };
    Ok(Taken {
        kind: Kind::Aborted,
        entry,
        at_ms: side.engine.now().millis(),
        forced: false,
        outstanding: Some(q.outstanding()),
        record: Arc::new(record),
    })
}

impl<const N: usize> Halves<N> {
    /// `gone` or `fence` (`lose`) under the engine lock, after moving the clock to
    /// `now_ms` if given; the decisions of both, the clock's first, each with the record
    /// the core hands out with it (every edge's cause written by the core).
    fn lose_agent(
        &self,
        py: Python<'_>,
        now_ms: Option<u64>,
        lose: impl FnOnce(&mut Engine<'_, N, EDGES>) -> u32,
    ) -> Result<Vec<Taken>, ClockError> {
        let mut out = Vec::new();
        self.with_sides(|sides| {
            let side = &mut *lock(py, &sides.engine);
            if let Some(now_ms) = now_ms {
                side.engine.advance(Instant::from_millis(now_ms))?;
            }
            let at_ms = side.engine.now().millis();
            let _resolved = lose(&mut side.engine);
            take_queued(side, py, at_ms, &mut out);
            Ok::<(), ClockError>(())
        })?;
        Ok(out)
    }
}

impl<const N: usize> Tracker for Halves<N> {
    fn feed(
        &self,
        py: Python<'_>,
        messages: &[Message<'_>],
        not_bytes: u64,
        producer_bound: &mut Vec<usize>,
    ) {
        self.with_sides(|sides| {
            if messages.len() >= DETACH_AT {
                // Nothing below touches a Python object: the bytes are borrowed from
                // objects the caller holds.
                py.detach(|| {
                    let mut side = lock_detached(&sides.ingest);
                    feed_side(&mut side, messages, not_bytes, producer_bound);
                });
            } else {
                let mut side = lock(py, &sides.ingest);
                feed_side(&mut side, messages, not_bytes, producer_bound);
            }
        });
    }

    fn feed_lists<'py>(
        &self,
        py: Python<'py>,
        batch: &[(AgentId, Bound<'py, PyList>, Bound<'py, PyAny>)],
        producer_bound: &mut Vec<(usize, Bound<'py, PyAny>)>,
    ) {
        self.with_sides(|sides| {
            let mut side = lock(py, &sides.ingest);
            for (sender, (agent, messages, _)) in batch.iter().enumerate() {
                for message in messages.iter() {
                    let Ok(bytes) = message.cast::<PyBytes>() else {
                        side.not_bytes += 1;
                        continue;
                    };
                    if let Err(ignored) = side.ingest.handle_notification(*agent, bytes.as_bytes())
                        && ignored.reason == kvdrain::IgnoreReason::NotForConsumer
                    {
                        producer_bound.push((sender, message.clone()));
                    }
                }
            }
        });
    }

    fn register_many(
        &self,
        py: Python<'_>,
        entries: &mut std::vec::IntoIter<(Entry, Option<u8>)>,
        deadline_ms: Option<u64>,
    ) -> Result<(), (Refusal, Entry)> {
        self.with_sides(|sides| {
            let mut side = lock(py, &sides.engine);
            for (entry, count) in entries.by_ref() {
                let id_object = entry.id.bind(py);
                let Ok(id) = id_object.to_str() else {
                    return Err((Refusal::NotUtf8, entry));
                };
                if let Err(e) = kvdrain::wire::check_request_id(id) {
                    return Err((Refusal::CannotComplete(e), entry));
                }
                let expect = match count {
                    Some(n) => Expect::Count(n),
                    None => Expect::Edges(entry.agents.as_deref().unwrap_or_default()),
                };
                let registration = Registration {
                    id,
                    blocks: BlockHandle(0),
                    expect,
                    deadline: deadline_ms.map(Duration::from_millis),
                };
                match side.engine.register(registration) {
                    Ok(ticket) => {
                        side.requests.insert(ticket.key().get(), entry);
                    }
                    Err(e) => return Err((Refusal::Core(e.kind), entry)),
                }
            }
            Ok(())
        })
    }

    fn poll(&self, py: Python<'_>) -> Vec<Taken> {
        let mut out = Vec::new();
        self.with_sides(|sides| {
            let side = &mut *lock(py, &sides.engine);
            let at_ms = side.engine.now().millis();
            while let Some(recorded) = side.engine.poll_recorded() {
                out.extend(taken(side, py, at_ms, recorded));
            }
        });
        out
    }

    fn poll_split(
        &self,
        py: Python<'_>,
        completed: &mut Vec<Py<PyString>>,
        blocks: &mut Vec<Py<PyAny>>,
        others: &mut Vec<Taken>,
    ) {
        self.with_sides(|sides| {
            let side = &mut *lock(py, &sides.engine);
            let at_ms = side.engine.now().millis();
            while let Some(split) = side.engine.poll_split() {
                match split {
                    Split::Completed(drained) => {
                        // No record: no `Decision` is made for a completed request here.
                        let key = drained.key().get();
                        let BlockHandle(_) = drained.into_decode();
                        if let Some(entry) = side.requests.remove(key) {
                            // Not dropped here: the ledger may hold the last reference,
                            // and its `__del__` must not run under this lock.
                            blocks.push(entry.blocks);
                            completed.push(entry.id);
                        }
                    }
                    Split::Other(recorded) => others.extend(taken(side, py, at_ms, recorded)),
                }
            }
        });
    }

    fn advance(&self, py: Python<'_>, now_ms: u64) -> Result<Vec<Taken>, ClockError> {
        let mut out = Vec::new();
        self.with_sides(|sides| {
            let side = &mut *lock(py, &sides.engine);
            side.engine.advance(Instant::from_millis(now_ms))?;
            take_queued(side, py, now_ms, &mut out);
            Ok::<(), ClockError>(())
        })?;
        Ok(out)
    }

    fn set_arrival(&self, py: Python<'_>, now_ms: u64) {
        self.with_sides(|sides| {
            lock(py, &sides.ingest)
                .ingest
                .set_arrival(Instant::from_millis(now_ms));
        });
    }

    fn abort(
        &self,
        py: Python<'_>,
        id: &str,
        now_ms: Option<u64>,
    ) -> Result<Result<Taken, AbortError>, ClockError> {
        self.with_sides(|sides| {
            let mut side = lock(py, &sides.engine);
            if let Some(now_ms) = now_ms {
                side.engine.advance(Instant::from_millis(now_ms))?;
            }
            Ok(abort_side(&mut side, py, id))
        })
    }

    fn gone(
        &self,
        py: Python<'_>,
        agent: AgentId,
        now_ms: Option<u64>,
    ) -> Result<Vec<Taken>, ClockError> {
        self.lose_agent(py, now_ms, |engine| engine.gone(agent))
    }

    fn fence(
        &self,
        py: Python<'_>,
        agent: AgentId,
        now_ms: Option<u64>,
    ) -> Result<Vec<Taken>, ClockError> {
        self.lose_agent(py, now_ms, |engine| engine.fence(agent))
    }

    fn counters(&self, py: Python<'_>) -> (IngestCounters, u64, EngineCounters) {
        self.with_sides(|sides| {
            let (ingest, not_bytes) = {
                let side = lock(py, &sides.ingest);
                (*side.ingest.counters(), side.not_bytes)
            };
            let engine = *lock(py, &sides.engine).engine.counters();
            (ingest, not_bytes, engine)
        })
    }

    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.with_sides(|sides| {
            // No GIL calls here (none are allowed while the collector traverses).
            let Ok(side) = sides.engine.try_lock() else {
                return Ok(());
            };
            for entry in side.requests.iter() {
                visit.call(&entry.id)?;
                visit.call(&entry.blocks)?;
            }
            for held in &side.refused {
                visit.call(&held.id)?;
                visit.call(&held.blocks)?;
            }
            Ok(())
        })
    }

    fn clear(&self) -> (Vec<Entry>, Vec<Held>) {
        self.with_sides(|sides| match sides.engine.try_lock() {
            Ok(mut side) => (side.requests.take_all(), side.refused.drain(..).collect()),
            Err(_) => (Vec::new(), Vec::new()),
        })
    }

    fn clock(&self, py: Python<'_>) -> (u64, Option<u64>, usize) {
        self.with_sides(|sides| {
            let side = lock(py, &sides.engine);
            (
                side.engine.now().millis(),
                side.engine.next_timer().map(Instant::millis),
                side.engine.len(),
            )
        })
    }

    fn hold_refused(&self, py: Python<'_>, held: Held) -> u64 {
        self.with_sides(|sides| {
            let side = &mut *lock(py, &sides.engine);
            let hold = side.engine.hold_refused();
            debug_assert_eq!(hold.number, side.refused_front + side.refused.len() as u64);
            side.refused.push_back(held);
            hold.until.millis()
        })
    }

    fn poll_refused_releases(&self, py: Python<'_>) -> Vec<Held> {
        self.with_sides(|sides| {
            let side = &mut *lock(py, &sides.engine);
            let mut out = Vec::new();
            while let Some(hold) = side.engine.poll_refused_release() {
                debug_assert_eq!(hold.number, side.refused_front);
                side.refused_front += 1;
                out.extend(side.refused.pop_front());
            }
            out
        })
    }
}
