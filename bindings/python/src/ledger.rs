//! `kvdrain.Ledger`: the consumer (decode-side) tracker for Python.
//!
//! The class is `frozen` and `Sync`: its two halves sit behind their own locks (see
//! [`crate::tracker`]), so a NIXL writer thread can `feed` while the engine thread
//! registers, polls and advances, with or without the GIL.

use std::sync::{Arc, Mutex};

use kvdrain::{AbortError, AgentId, ClockError, Config, Outstanding, RegisterErrorKind};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::agents::AgentTable;
use crate::decision::Decision;
use crate::errors::{
    ClockBackwardsError, ConfigError, DuplicateRequestError, FullError, InvalidExpectError,
    UnknownRequestError,
};
use crate::lock::lock;
use crate::tracker::{self, Batch, EDGES, Entry, Taken, Tracker};

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
    agents: Mutex<AgentTable>,
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

/// What `expect` asked for.
enum ExpectArg {
    Count(u8),
    Agents(Arc<[AgentId]>),
}

impl PyLedger {
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
            },
        )
    }

    /// What the engine side keeps of one registration, and its count (counting mode).
    fn entry(
        request_id: &Bound<'_, PyString>,
        blocks: Bound<'_, PyAny>,
        expect: &ExpectArg,
    ) -> (Entry, Option<u8>) {
        let (count, agents) = match expect {
            ExpectArg::Count(n) => (Some(*n), None),
            ExpectArg::Agents(agents) => (None, Some(Arc::clone(agents))),
        };
        let entry = Entry {
            id: request_id.clone().unbind(),
            blocks: blocks.unbind(),
            agents,
        };
        (entry, count)
    }

    /// Registers `entries` in order; the first refusal becomes its exception.
    fn register_entries(
        &self,
        py: Python<'_>,
        entries: Vec<(Entry, Option<u8>)>,
        deadline_ms: Option<u64>,
    ) -> PyResult<()> {
        let mut entries = entries.into_iter();
        let refused = self.tracker.register_many(py, &mut entries, deadline_ms)?;
        drop(entries); // the ones after a refusal, dropped with no lock held
        match refused {
            Ok(()) => Ok(()),
            Err((kind, entry)) => Err(self.refusal(py, kind, entry)),
        }
    }

    /// The exception for a refused registration, carrying what was refused.
    fn refusal(&self, py: Python<'_>, kind: RegisterErrorKind, entry: Entry) -> PyErr {
        let id = entry.id.bind(py).to_string_lossy().into_owned();
        match kind {
            RegisterErrorKind::Full => FullError::new_err((
                format!("table full ({} requests): {id:?} refused", self.capacity),
                entry.id,
                entry.blocks,
            )),
            RegisterErrorKind::DuplicateId => DuplicateRequestError::new_err((
                format!("request {id:?} is tracked already"),
                entry.id,
            )),
            _ => InvalidExpectError::new_err((
                format!("registration of {id:?} refused: invalid expect"),
                entry.id,
            )),
        }
    }

    fn expect_arg(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyString>,
        expect: &Bound<'_, PyAny>,
    ) -> PyResult<ExpectArg> {
        let invalid = |why: String| InvalidExpectError::new_err((why, request_id.clone().unbind()));
        if let Ok(n) = expect.extract::<i64>() {
            return match u8::try_from(n) {
                Ok(n @ 1..=64) => Ok(ExpectArg::Count(n)),
                _ => Err(invalid(format!("expect={n}: a count must be in 1..=64"))),
            };
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
        // Iterating may run Python code: collect first, lock the names table after.
        let names = names.collect::<PyResult<Vec<_>>>()?;
        let mut agents = Vec::with_capacity(names.len());
        let mut table = lock(py, &self.agents);
        for name in &names {
            let Ok(name) = name.cast::<PyString>() else {
                return Err(invalid("agent names must be str".into()));
            };
            match table.intern(name)? {
                Ok(agent) => agents.push(agent),
                Err(_) => return Err(invalid("more than 65 535 distinct agent names".into())),
            }
        }
        drop(table);
        let distinct = agents
            .iter()
            .enumerate()
            .all(|(i, a)| !agents[..i].contains(a));
        if agents.is_empty() || agents.len() > EDGES || !distinct {
            return Err(invalid(format!(
                "expect must name 1..={EDGES} distinct agents (got {})",
                agents.len()
            )));
        }
        Ok(ExpectArg::Agents(agents.into()))
    }
}

#[pymethods]
impl PyLedger {
    #[new]
    #[pyo3(signature = (capacity = 4096, *, deadline_ms = 30_000, quarantine_ms = 60_000, settle_ms = 5_000, seed = None))]
    fn new(
        capacity: usize,
        deadline_ms: u64,
        quarantine_ms: u64,
        settle_ms: u64,
        seed: Option<u64>,
    ) -> PyResult<Self> {
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
            deadline_ms,
            quarantine_ms,
            settle_ms,
            seed: seed.unwrap_or(defaults.seed),
        };
        let tracker = match table_size {
            1024 => tracker::build::<1024>(config),
            4096 => tracker::build::<4096>(config),
            16_384 => tracker::build::<16_384>(config),
            _ => tracker::build::<65_536>(config),
        }
        .map_err(|e| ConfigError::new_err(format!("cannot build the ledger: {e}")))?;
        Ok(PyLedger {
            tracker,
            agents: Mutex::new(AgentTable::default()),
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
        deadline_ms: Option<u64>,
    ) -> PyResult<()> {
        let expect = self.expect_arg(py, request_id, expect)?;
        let entry = Self::entry(request_id, blocks.clone(), &expect);
        self.register_entries(py, vec![entry], deadline_ms)
    }

    /// Registers `request_ids[i]` with `blocks[i]`, all with the same `expect`, in order
    /// (vLLM's `start_load_kv` registers a step's requests together). On the first refusal
    /// it raises as `register` does: the requests before it stay registered, the ones
    /// after it are not.
    #[pyo3(signature = (request_ids, blocks, expect, *, deadline_ms = None))]
    fn register_many(
        &self,
        py: Python<'_>,
        request_ids: &Bound<'_, PyAny>,
        blocks: &Bound<'_, PyAny>,
        expect: &Bound<'_, PyAny>,
        deadline_ms: Option<u64>,
    ) -> PyResult<()> {
        let mut blocks = blocks.try_iter()?;
        let mut parsed: Option<ExpectArg> = None;
        let mut entries = Vec::with_capacity(request_ids.len().unwrap_or(0));
        for request_id in request_ids.try_iter()? {
            let request_id = request_id?;
            let request_id = request_id.cast::<PyString>()?;
            let Some(block) = blocks.next() else {
                return Err(InvalidExpectError::new_err((
                    "register_many: fewer blocks than request ids",
                    request_id.clone().unbind(),
                )));
            };
            let expect = match &parsed {
                Some(e) => e,
                None => parsed.insert(self.expect_arg(py, request_id, expect)?),
            };
            entries.push(Self::entry(request_id, block?, expect));
        }
        self.register_entries(py, entries, deadline_ms)
    }

    /// Feeds one NIXL batch: the `dict[str, list[bytes]]` that `get_new_notifs()` returns
    /// (any mapping of agent name to an iterable of messages works; a `dict` of `list`s
    /// is read without copying anything). Returns the producer-bound messages (`HB:`,
    /// `PUSH_REG:`) as `(agent, message)` pairs, the very objects given. Never raises on
    /// message content: garbage is counted and ignored.
    fn feed<'py>(
        &self,
        py: Python<'py>,
        notifs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let pairs: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = match notifs.cast::<PyDict>() {
            Ok(dict) => dict.iter().collect(),
            Err(_) => notifs
                .call_method0("items")?
                .try_iter()?
                .map(|kv| kv?.extract())
                .collect::<PyResult<_>>()?,
        };
        let mut batch = Vec::with_capacity(pairs.len());
        for (key, messages) in pairs {
            let messages = match messages.cast_into::<PyList>() {
                Ok(list) => list,
                Err(e) => {
                    let other = e.into_inner();
                    // One message instead of a list, or something that is not a list of
                    // messages at all: read what can be read, count the rest as not bytes.
                    let one = || vec![other.clone()];
                    let items = match other.try_iter() {
                        Ok(items) if !other.is_instance_of::<pyo3::types::PyBytes>() => items
                            .collect::<PyResult<Vec<_>>>()
                            .unwrap_or_else(|_| one()),
                        _ => one(),
                    };
                    PyList::new(py, items)?
                }
            };
            batch.push((AgentId::STRANGER, key, messages));
        }
        {
            let agents = lock(py, &self.agents);
            for (agent, key, _) in &mut batch {
                if let Ok(name) = key.cast::<PyString>() {
                    if let Ok(name) = name.to_str() {
                        *agent = agents.lookup(name);
                    }
                }
            }
        }
        let batch: &Batch<'py> = &batch;
        let fed = self.tracker.feed(py, batch);
        let out = PyList::empty(py);
        for (key, message) in fed.producer_bound {
            out.append(PyTuple::new(py, [key, message])?)?;
        }
        Ok(out)
    }

    /// Decisions the fed notices made ready (completed; failed then released; released of
    /// an aborted or expired request), in the order they were taken.
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
        let mut completed = Vec::new();
        let mut others = Vec::new();
        self.tracker.poll_split(py, &mut completed, &mut others);
        let others = others
            .into_iter()
            .map(|t| self.decision(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((PyList::new(py, completed)?, PyList::new(py, others)?))
    }

    /// Moves the clock to `now_ms`; returns the decisions of the deadlines, quarantine
    /// ends and settle ends it reached.
    fn advance<'py>(&self, py: Python<'py>, now_ms: u64) -> PyResult<Bound<'py, PyList>> {
        match self.tracker.advance(py, now_ms) {
            Ok(taken) => self.decisions(py, taken),
            Err(ClockError::Backwards { last, now }) => Err(ClockBackwardsError::new_err((
                format!("clock went backwards from {last} ms to {now} ms"),
                last,
                now,
            ))),
        }
    }

    /// Aborts a request: returns its `aborted` decision (its blocks stay fenced until a
    /// `released`), or `None` if it was decided already.
    fn abort(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyString>,
    ) -> PyResult<Option<Py<Decision>>> {
        match self.tracker.abort(py, request_id.to_str()?) {
            Ok(taken) => Ok(Some(self.decision(py, taken)?)),
            Err(AbortError::Late) => Ok(None),
            Err(AbortError::Unknown) => Err(UnknownRequestError::new_err((
                format!("abort of unknown request {:?}", request_id.to_str()?),
                request_id.clone().unbind(),
            ))),
        }
    }

    /// The transport saw `agent` go away (a failed send or heartbeat, a reset
    /// connection, a dead process, invalidated metadata) but cannot prove that none of
    /// its bytes already on the way can land: every outstanding named edge of it resolves
    /// as failed now, as a failure notice from it would, and the blocks settle for
    /// `settle_ms` from now. Returns the decisions this takes.
    fn gone<'py>(
        &self,
        py: Python<'py>,
        agent: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyList>> {
        let agent = lock(py, &self.agents).lookup(agent.to_str()?);
        if agent == STRANGER {
            return Ok(PyList::empty(py));
        }
        let (_, taken) = self.tracker.gone(py, agent);
        self.decisions(py, taken)
    }

    /// The transport proves that `agent` can no longer write here (nothing of it in
    /// flight, none of it can land): every outstanding named edge of it resolves as
    /// failed, with no settling. A peer merely seen gone is [`gone`](Self::gone).
    /// Returns the decisions this takes.
    fn fence<'py>(
        &self,
        py: Python<'py>,
        agent: &Bound<'py, PyString>,
    ) -> PyResult<Bound<'py, PyList>> {
        let agent = lock(py, &self.agents).lookup(agent.to_str()?);
        if agent == AgentId::STRANGER {
            return Ok(PyList::empty(py));
        }
        let (_, taken) = self.tracker.fence(py, agent);
        self.decisions(py, taken)
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
