//! `kvdrain.Ledger`: the consumer (decode-side) tracker for Python.
//!
//! The class is `frozen` and `Sync`: its two halves sit behind their own locks (see
//! [`crate::tracker`] and, for what runs under them, [`crate::lock`]), so a NIXL writer
//! thread can `feed` while the engine thread registers, polls and advances.

use std::sync::{Arc, Mutex};

use kvdrain::{AbortError, AgentId, ClockError, Config, Duration, Outstanding, RegisterErrorKind};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString};
use pyo3::{PyTraverseError, PyVisit};

use crate::agents::AgentTable;
use crate::args;
use crate::decision::Decision;
use crate::errors::{
    AllocError, ClockBackwardsError, ConfigError, DuplicateRequestError, FullError,
    InvalidArgumentError, InvalidExpectError, InvalidRequestIdError, UnknownRequestError,
};
use crate::feed::BatchReader;
use crate::lock::lock;
use crate::requests::{Agents, Entry};
use crate::tracker::{self, BuildError, EDGES, Held, Refusal, Taken, Tracker};

fn invalid_argument(why: String) -> PyErr {
    InvalidArgumentError::new_err(why)
}

/// The `ClockBackwardsError` of a refused clock move (`advance`, or the `now_ms` of an
/// `abort`, `gone` or `fence`).
fn clock_backwards(e: ClockError) -> PyErr {
    let ClockError::Backwards { last, now } = e;
    ClockBackwardsError::new_err((
        format!(
            "clock went backwards from {} ms to {} ms",
            last.millis(),
            now.millis()
        ),
        last.millis(),
        now.millis(),
    ))
}

/// The table sizes (`N` of `Ledger<N, 8>`) the module is built with; a ledger gets the
/// smallest that holds its capacity. At least 1024 so the tombstones remember thousands of
/// decided ids (`late` rather than `unknown`) however small the capacity.
pub(crate) const TABLE_SIZES: [usize; 4] = [1024, 4096, 16_384, 65_536];

/// The consumer (decode-side) ledger: tracks up to `capacity` requests whose KV blocks
/// producers push over NIXL, and decides for each, exactly once, `completed`, `failed`,
/// `expired` or `aborted`, then (unless completed) `released` when no write into its blocks
/// can still land. `feed` belongs to the thread that drains NIXL; every other method to the
/// engine thread; the two may run at once.
#[pyclass(frozen, module = "kvdrain", name = "Ledger")]
pub(crate) struct PyLedger {
    tracker: Box<dyn Tracker>,
    /// Shared with the decisions, whose records name agents when read.
    agents: Arc<Mutex<AgentTable>>,
    table_size: usize,
    capacity: usize,
    deadline_ms: u64,
    quarantine_ms: u64,
    settle_ms: u64,
}

impl std::fmt::Debug for PyLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyLedger")
            .field("table_size", &self.table_size)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// What `expect` asked for, checked; agent names are numbered only when a registration
/// with them is made, so a refused one takes no number.
enum ExpectArg<'py> {
    Count(u8),
    /// `1..=EDGES` distinct names, each valid UTF-8.
    Agents(Vec<Bound<'py, PyString>>),
}

impl PyLedger {
    /// `fence` and `gone` (`lose`: the tracker's): a stranger (no registration named
    /// it) has no edges to end, but the clock still moves to `now_ms` if given.
    fn lose_agent<'py>(
        &self,
        py: Python<'py>,
        agent: &Bound<'py, PyString>,
        now_ms: Option<&Bound<'py, PyAny>>,
        lose: impl FnOnce(&dyn Tracker, AgentId, Option<u64>) -> Result<Vec<Taken>, ClockError>,
    ) -> PyResult<Bound<'py, PyList>> {
        let name = args::utf8(agent, "agent name", invalid_argument)?;
        let now_ms = args::unsigned_opt(now_ms, "now_ms", invalid_argument)?;
        let agent = lock(py, &self.agents).lookup(name);
        let taken = match (agent == AgentId::STRANGER, now_ms) {
            (true, None) => return Ok(PyList::empty(py)),
            (true, Some(now_ms)) => self.tracker.advance(py, now_ms),
            (false, _) => lose(&*self.tracker, agent, now_ms),
        }
        .map_err(clock_backwards)?;
        self.decisions(py, taken)
    }

    fn decisions<'py>(&self, py: Python<'py>, taken: Vec<Taken>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for t in taken {
            list.append(self.decision(py, t)?)?;
        }
        Ok(list)
    }

    fn decision(&self, py: Python<'_>, t: Taken) -> PyResult<Py<Decision>> {
        let outstanding = match t.outstanding {
            None => py.None(),
            Some(Outstanding::Count(n)) => n.into_pyobject(py)?.into_any().unbind(),
            Some(Outstanding::Edges(mask)) => {
                let agents = lock(py, &self.agents);
                let names: Vec<Py<PyString>> = t
                    .entry
                    .agents
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| mask & (1 << i) != 0)
                    .filter_map(|(_, &a)| agents.name(py, a))
                    .collect();
                drop(agents);
                PyList::new(py, names)?.into_any().unbind()
            }
        };
        Py::new(
            py,
            Decision {
                kind: t.kind,
                request_id: t.entry.id,
                blocks: t.entry.blocks,
                at_ms: t.at_ms,
                forced: t.forced,
                outstanding,
                record: t.record,
                agents: Arc::clone(&self.agents),
            },
        )
    }

    /// A registration's entry, its agents and count not set yet.
    fn entry(id: Py<PyString>, blocks: Py<PyAny>) -> (Entry, Option<u8>) {
        let entry = Entry {
            id,
            blocks,
            agents: None,
        };
        (entry, None)
    }

    /// Registers `entries` (their `agents` and counts not set yet) in order, all with
    /// `expect`; the first
    /// refusal becomes its exception. Named agents are numbered under the names lock, held
    /// until the engine half has answered: if no registration was accepted, the names
    /// this call numbered are forgotten again. Every Python object left over is dropped
    /// after both locks are released.
    fn register_entries(
        &self,
        py: Python<'_>,
        mut entries: Vec<(Entry, Option<u8>)>,
        expect: &ExpectArg<'_>,
        deadline_ms: Option<u64>,
    ) -> PyResult<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let total = entries.len();
        let (mut entries, refused, forgotten) = match expect {
            ExpectArg::Count(n) => {
                entries.iter_mut().for_each(|(_, count)| *count = Some(*n));
                let mut entries = entries.into_iter();
                let refused = self.tracker.register_many(py, &mut entries, deadline_ms);
                (entries, refused, Vec::new())
            }
            ExpectArg::Agents(names) => {
                let mut table = lock(py, &self.agents);
                let before = table.len();
                let mut agents = Vec::with_capacity(names.len());
                for name in names {
                    // Checked by `expect_arg`; a `str` cannot change since.
                    let Ok(text) = name.to_str() else { continue };
                    match table.intern(name, text) {
                        Ok(agent) => agents.push(agent),
                        Err(_) => {
                            let forgotten = table.truncate(py, before);
                            drop(table);
                            drop(forgotten);
                            return Err(InvalidExpectError::new_err((
                                "more than 65 535 distinct agent names in use",
                                entries[0].0.id.clone_ref(py),
                            )));
                        }
                    }
                }
                let agents: Agents = Some(agents.into());
                for (entry, _) in &mut entries {
                    entry.agents.clone_from(&agents);
                }
                let mut entries = entries.into_iter();
                let refused = self.tracker.register_many(py, &mut entries, deadline_ms);
                let accepted = total - entries.len() - usize::from(refused.is_err());
                let forgotten = if accepted == 0 {
                    table.truncate(py, before)
                } else {
                    Vec::new()
                };
                drop(table);
                (entries, refused, forgotten)
            }
        };
        drop(forgotten);
        // The ones after a refusal, dropped with no lock held.
        entries.by_ref().for_each(drop);
        match refused {
            Ok(()) => Ok(()),
            Err((kind, entry)) => Err(self.refusal(py, kind, entry)),
        }
    }

    /// The exception for a refused registration, carrying what was refused.
    fn refusal(&self, py: Python<'_>, refusal: Refusal, entry: Entry) -> PyErr {
        let id = args::repr(entry.id.bind(py));
        match refusal {
            Refusal::Core(RegisterErrorKind::Full) => FullError::new_err((
                format!("table full ({} requests): {id} refused", self.capacity),
                entry.id,
                entry.blocks,
            )),
            Refusal::Core(RegisterErrorKind::DuplicateId) => DuplicateRequestError::new_err((
                format!("request {id} is tracked already"),
                entry.id,
            )),
            Refusal::Core(_) => InvalidExpectError::new_err((
                format!("registration of {id} refused: invalid expect"),
                entry.id,
            )),
            Refusal::NotUtf8 => InvalidRequestIdError::new_err((
                format!("request id {id} is not valid UTF-8 (it holds a lone surrogate)"),
                entry.id,
            )),
            Refusal::CannotComplete(e) => args::cannot_complete(entry.id.bind(py), e),
        }
    }

    fn expect_arg<'py>(
        request_id: &Bound<'py, PyString>,
        expect: &Bound<'py, PyAny>,
    ) -> PyResult<ExpectArg<'py>> {
        let invalid = |why: String| InvalidExpectError::new_err((why, request_id.clone().unbind()));
        if expect.is_instance_of::<PyBool>() {
            return Err(invalid(format!(
                "expect={expect}: give a count (an int) or agent names, not a bool"
            )));
        }
        if let Ok(n) = expect.extract::<i64>() {
            return match u8::try_from(n) {
                Ok(n @ 1..=64) => Ok(ExpectArg::Count(n)),
                _ => Err(invalid(format!("expect={n}: a count must be in 1..=64"))),
            };
        }
        if expect.is_instance_of::<PyInt>() {
            return Err(invalid(format!(
                "expect={expect}: a count must be in 1..=64"
            )));
        }
        if expect.is_instance_of::<PyString>() {
            return Err(invalid(
                "expect is a str: give a list of agent names".into(),
            ));
        }
        let Ok(names) = expect.try_iter() else {
            return Err(invalid(
                "expect must be an int or a sequence of agent names".into(),
            ));
        };
        // Iterating may run Python code: no lock is held.
        let names = names.collect::<PyResult<Vec<_>>>()?;
        let mut agents: Vec<Bound<'py, PyString>> = Vec::with_capacity(names.len());
        let mut texts: Vec<&str> = Vec::with_capacity(names.len());
        for name in &names {
            let Ok(name) = name.cast::<PyString>() else {
                return Err(invalid("agent names must be str".into()));
            };
            texts.push(args::utf8(name, "agent name", invalid)?);
            agents.push(name.clone());
        }
        let distinct = texts
            .iter()
            .enumerate()
            .all(|(i, a)| !texts[..i].contains(a));
        if agents.is_empty() || agents.len() > EDGES || !distinct {
            return Err(invalid(format!(
                "expect must name 1..={EDGES} distinct agents (got {})",
                agents.len()
            )));
        }
        Ok(ExpectArg::Agents(agents))
    }
}

#[pymethods]
impl PyLedger {
    #[new]
    #[pyo3(
        text_signature = "(capacity=4096, *, deadline_ms=30000, quarantine_ms=60000, settle_ms=5000, seed=None)"
    )]
    #[pyo3(signature = (capacity = None, *, deadline_ms = None, quarantine_ms = None, settle_ms = None, seed = None))]
    fn new(
        capacity: Option<&Bound<'_, PyAny>>,
        deadline_ms: Option<&Bound<'_, PyAny>>,
        quarantine_ms: Option<&Bound<'_, PyAny>>,
        settle_ms: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config_error = |why: String| ConfigError::new_err(why);
        let capacity = args::unsigned_opt(capacity, "capacity", config_error)?.unwrap_or(4096);
        let setting = |value, name, default| {
            args::unsigned_opt::<u64>(value, name, config_error).map(|v| v.unwrap_or(default))
        };
        let deadline_ms = setting(deadline_ms, "deadline_ms", 30_000)?;
        let quarantine_ms = setting(quarantine_ms, "quarantine_ms", 60_000)?;
        let settle_ms = setting(settle_ms, "settle_ms", 5_000)?;
        let seed: Option<u64> = args::unsigned_opt(seed, "seed", config_error)?;
        let Some(&table_size) = TABLE_SIZES.iter().find(|&&n| n >= capacity) else {
            return Err(ConfigError::new_err(format!(
                "capacity {capacity} is above the largest table ({})",
                TABLE_SIZES[TABLE_SIZES.len() - 1]
            )));
        };
        if capacity == 0 {
            return Err(ConfigError::new_err("capacity must be at least 1"));
        }
        let defaults = Config::with_capacity(capacity);
        let config = Config {
            capacity,
            // Python's spans are integers in ms.
            deadline: Duration::from_millis(deadline_ms),
            quarantine: Duration::from_millis(quarantine_ms),
            settle: Duration::from_millis(settle_ms),
            seed: seed.unwrap_or(defaults.seed),
        };
        let tracker = match table_size {
            1024 => tracker::build::<1024>(config),
            4096 => tracker::build::<4096>(config),
            16_384 => tracker::build::<16_384>(config),
            _ => tracker::build::<65_536>(config),
        }
        .map_err(|e| match e {
            BuildError::NoMemory { bytes } => AllocError::new_err(format!(
                "no memory for a ledger of table size {table_size} ({bytes} bytes)"
            )),
            BuildError::NoThread(e) => AllocError::new_err(format!(
                "cannot start the thread that builds the ledger: {e}"
            )),
        })?;
        Ok(PyLedger {
            tracker,
            agents: Arc::new(Mutex::new(AgentTable::default())),
            table_size,
            capacity,
            deadline_ms,
            quarantine_ms,
            settle_ms,
        })
    }

    /// Requests tracked at once (quarantined and settling ones included).
    #[getter]
    fn capacity(&self) -> usize {
        self.capacity
    }

    /// The table size `N` of the `Ledger<N, 8>` built for this capacity.
    #[getter]
    fn table_size(&self) -> usize {
        self.table_size
    }

    /// Most agents `expect` may name.
    #[getter]
    fn max_edges(&self) -> usize {
        EDGES
    }

    /// Default deadline of a registration, ms.
    #[getter]
    fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// How long the blocks of an aborted or expired request stay fenced at most, ms.
    #[getter]
    fn quarantine_ms(&self) -> u64 {
        self.quarantine_ms
    }

    /// How long after a failure notice its request's blocks stay fenced, ms.
    #[getter]
    fn settle_ms(&self) -> u64 {
        self.settle_ms
    }

    /// The clock: the last `advance`, ms.
    #[getter]
    fn now_ms(&self, py: Python<'_>) -> u64 {
        self.tracker.clock(py).0
    }

    /// When the next deadline, quarantine end or settle end falls, if any.
    #[getter]
    fn next_timer_ms(&self, py: Python<'_>) -> Option<u64> {
        self.tracker.clock(py).1
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.tracker.clock(py).2
    }

    /// Starts tracking a request.
    #[pyo3(signature = (request_id, blocks, expect, *, deadline_ms = None))]
    fn register(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyString>,
        blocks: &Bound<'_, PyAny>,
        expect: &Bound<'_, PyAny>,
        deadline_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        // The id is checked with the registration (a refusal like the core's).
        let expect = Self::expect_arg(request_id, expect)?;
        let deadline_ms = args::unsigned_opt(deadline_ms, "deadline_ms", invalid_argument)?;
        let entry = Self::entry(request_id.clone().unbind(), blocks.clone().unbind());
        self.register_entries(py, vec![entry], &expect, deadline_ms)
    }

    /// Registers `request_ids[i]` with `blocks[i]`, all with the same `expect`, in order
    /// (vLLM's `start_load_kv` registers a step's requests together). On the first refusal
    /// it raises as `register` does: the requests before it stay registered, the ones
    /// after it are not.
    #[pyo3(signature = (request_ids, blocks, expect, *, deadline_ms = None))]
    fn register_many<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
        blocks: &Bound<'py, PyAny>,
        expect: &Bound<'py, PyAny>,
        deadline_ms: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let deadline_ms = args::unsigned_opt(deadline_ms, "deadline_ms", invalid_argument)?;
        let mut blocks = blocks.try_iter()?;
        let mut parsed: Option<ExpectArg<'py>> = None;
        let mut entries = Vec::with_capacity(request_ids.len().unwrap_or(0));
        // An id that can never complete is refused as the core refuses a registration: the
        // ones before it stay registered, the ones after it are not.
        for request_id in request_ids.try_iter()? {
            let request_id = request_id?;
            let request_id = request_id.cast_into::<PyString>()?;
            let Some(block) = blocks.next() else {
                return Err(InvalidExpectError::new_err((
                    "register_many: fewer blocks than request ids",
                    request_id.unbind(),
                )));
            };
            if parsed.is_none() {
                parsed = Some(Self::expect_arg(&request_id, expect)?);
            }
            entries.push(Self::entry(request_id.unbind(), block?.unbind()));
        }
        match &parsed {
            Some(expect) => self.register_entries(py, entries, expect, deadline_ms),
            None => Ok(()),
        }
    }

    /// Feeds one NIXL batch: the `dict[str, list[bytes]]` that `get_new_notifs()` returns
    /// (any mapping of agent name to an iterable of messages works; a `dict` of `list`s
    /// is read without copying anything). Returns the producer-bound messages (`HB:`,
    /// `PUSH_REG:`) as `(agent, message)` pairs, the very objects given. Never raises on
    /// message content: garbage is counted and ignored; only `bytes` are messages (a
    /// `bytes`, `bytearray`, `memoryview` or `str` value is one message, not a sequence).
    /// If reading the batch raises (an iterable of messages that raises, even
    /// `KeyboardInterrupt`), the messages read before it are fed, then that very exception
    /// propagates, carrying the producer-bound ones among them as its
    /// `kvdrain_producer_bound` attribute. The batch is read in chunks (`feed.rs`); a
    /// chunk of 512 messages or more is fed with the GIL released.
    ///
    /// `now_ms`: when the batch arrived (taken from NIXL), on the clock `advance` is given.
    /// A failure notice is then dated at the later of `now_ms` and the clock, so its
    /// blocks settle for `settle_ms` from its arrival, not from the last `advance`. A
    /// `now_ms` earlier than one an earlier `feed` gave is not an error: the later one
    /// stays (the core's `Ingest::set_arrival`). Without it, a failure notice is dated at
    /// the later of the clock and the last `now_ms` given, if any.
    #[pyo3(signature = (notifs, now_ms = None))]
    fn feed<'py>(
        &self,
        py: Python<'py>,
        notifs: &Bound<'py, PyAny>,
        now_ms: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        // Checked before anything is read: a bad time feeds nothing.
        if let Some(now_ms) = args::unsigned_opt(now_ms, "now_ms", invalid_argument)? {
            self.tracker.set_arrival(py, now_ms);
        }
        let mut reader = BatchReader::new(py, &*self.tracker, &self.agents);
        let failure = reader.read(notifs)?;
        let out = reader.finish()?;
        match failure {
            None => Ok(out),
            Some(e) => {
                // Best effort: an exception type without attributes still propagates.
                let _ = e.value(py).setattr("kvdrain_producer_bound", out);
                Err(e)
            }
        }
    }

    /// Decisions the fed notices made ready (completed; failed then released; released of
    /// an aborted or expired request), in the order they were taken, after any that an
    /// `abort(..., now_ms=...)`'s clock move took (those wait here).
    fn poll<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let taken = self.tracker.poll(py);
        self.decisions(py, taken)
    }

    /// `poll` for the hot path: the ids of the completed requests (the `request_id`
    /// objects given to `register`, no `Decision` made for them), and every other
    /// decision as a `Decision`, each list in the order taken.
    fn poll_split<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        // Sized for a step's completions: growing them costs more than the call.
        let mut completed = Vec::with_capacity(64);
        let mut blocks = Vec::with_capacity(64);
        let mut others = Vec::new();
        self.tracker
            .poll_split(py, &mut completed, &mut blocks, &mut others);
        // The lock is released: a `__del__` these drops run may call back in.
        drop(blocks);
        let others = others
            .into_iter()
            .map(|t| self.decision(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((PyList::new(py, completed)?, PyList::new(py, others)?))
    }

    /// Moves the clock to `now_ms`; returns the decisions of the deadlines, quarantine
    /// ends and settle ends it reached.
    fn advance<'py>(
        &self,
        py: Python<'py>,
        now_ms: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let now_ms = args::unsigned(now_ms, "now_ms", invalid_argument)?;
        let taken = self.tracker.advance(py, now_ms).map_err(clock_backwards)?;
        self.decisions(py, taken)
    }

    /// Holds the blocks of a receive this ledger refused (`register` raised `FullError`,
    /// say) that producers may write into all the same, because another rank's
    /// registration of the same request let them. The ledger's clock times the hold: it
    /// ends `quarantine_ms` after the clock (the last `advance`), rounded up to a granule
    /// of a 61st of the quarantine (at least 1 ms), and `poll_refused_releases` hands
    /// `(request_id, blocks)` back once an `advance` reaches it. Returns that end (ms).
    /// Changes no tracked request; never refuses.
    fn hold_refused(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyString>,
        blocks: &Bound<'_, PyAny>,
    ) -> u64 {
        self.tracker.hold_refused(
            py,
            Held {
                id: request_id.clone().unbind(),
                blocks: blocks.clone().unbind(),
            },
        )
    }

    /// The refused receives (`hold_refused`) whose hold the clock has reached, oldest
    /// first, as `(request_id, blocks)`: their blocks are free (a forced release).
    fn poll_refused_releases<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let held = self.tracker.poll_refused_releases(py);
        PyList::new(py, held.into_iter().map(|h| (h.id, h.blocks)))
    }

    /// Aborts a request: returns its `aborted` decision (its blocks stay fenced until a
    /// `released`), or `None` if it was decided already.
    ///
    /// `now_ms`: the clock moves there first, as `advance(now_ms)` would, so the abort is
    /// dated at that moment (the quarantine runs `quarantine_ms` from it); an earlier time
    /// than the clock raises `ClockBackwardsError` and aborts nothing. The decisions the
    /// move takes (deadlines, settle and quarantine ends reached) are not returned here:
    /// they stay queued, and the next `poll` (or `advance`, `gone`, `fence`) returns them
    /// first.
    #[pyo3(signature = (request_id, *, now_ms = None))]
    fn abort(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyString>,
        now_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Decision>>> {
        let id = args::request_id_utf8(request_id)?;
        let now_ms = args::unsigned_opt(now_ms, "now_ms", invalid_argument)?;
        let aborted = self
            .tracker
            .abort(py, id, now_ms)
            .map_err(clock_backwards)?;
        match aborted {
            Ok(taken) => Ok(Some(self.decision(py, taken)?)),
            Err(AbortError::Late) => Ok(None),
            Err(AbortError::Unknown) => Err(UnknownRequestError::new_err((
                format!("abort of unknown request {}", args::repr(request_id)),
                request_id.clone().unbind(),
            ))),
        }
    }

    /// The transport saw `agent` go away (a failed send or heartbeat, a reset
    /// connection, a dead process, invalidated metadata) but cannot prove that none of
    /// its bytes already on the way can land: every outstanding named edge of it resolves
    /// as failed now, as a failure notice from it would, and the blocks settle for
    /// `settle_ms` from now. Returns the decisions this takes.
    ///
    /// `now_ms`: the clock moves there first, as `advance(now_ms)` would (an earlier time
    /// raises `ClockBackwardsError` and changes nothing), so the blocks settle from that
    /// moment; the decisions the move takes come first in the list.
    #[pyo3(signature = (agent, *, now_ms = None))]
    fn gone<'py>(
        &self,
        py: Python<'py>,
        agent: &Bound<'py, PyString>,
        now_ms: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.lose_agent(py, agent, now_ms, |t, agent, now_ms| {
            t.gone(py, agent, now_ms)
        })
    }

    /// The transport proves that `agent` can no longer write here (nothing of it in
    /// flight, none of it can land): every outstanding named edge of it resolves as
    /// failed, with no settling. A peer merely seen gone is [`gone`](Self::gone).
    /// Returns the decisions this takes. `now_ms` as for `gone`.
    #[pyo3(signature = (agent, *, now_ms = None))]
    fn fence<'py>(
        &self,
        py: Python<'py>,
        agent: &Bound<'py, PyString>,
        now_ms: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.lose_agent(py, agent, now_ms, |t, agent, now_ms| {
            t.fence(py, agent, now_ms)
        })
    }

    /// Every counter of both halves, by name.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (i, not_bytes, e) = self.tracker.counters(py);
        let d = PyDict::new(py);
        for (k, v) in [
            ("completions", i.completions),
            ("failure_notices", i.failure_notices),
            ("last_edges", i.last_edges),
            ("malformed", i.malformed),
            ("not_bytes", not_bytes),
            ("not_for_consumer", i.not_for_consumer),
            ("unknown", i.unknown),
            ("late", i.late),
            ("duplicate", i.duplicate),
            ("unexpected_sender", i.unexpected_sender),
            ("registered", e.registered),
            ("rejected_full", e.rejected_full),
            ("rejected_duplicate_id", e.rejected_duplicate_id),
            ("rejected_invalid", e.rejected_invalid),
            ("completed", e.completed),
            ("failed", e.failed),
            ("aborted", e.aborted),
            ("expired", e.expired),
            ("released", e.released),
            ("released_forced", e.released_forced),
            ("abort_unknown", e.abort_unknown),
            ("abort_late", e.abort_late),
            ("fenced_edges", e.fenced_edges),
            ("gone_edges", e.gone_edges),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.tracker.traverse(&visit)
    }

    fn __clear__(&self) {
        // Dropped after the engine lock is released (a drop may run `__del__`).
        drop(self.tracker.clear());
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let (now, _, len) = self.tracker.clock(py);
        format!(
            "Ledger(capacity={}, tracked={len}, now_ms={now}, table_size={})",
            self.capacity, self.table_size
        )
    }
}
