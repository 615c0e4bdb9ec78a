//! `kvdrain.Record`: what the ledger knows of one request when a decision about it was
//! taken ([`Decision.record`](crate::decision::Decision)), for an operator.
//!
//! A [`Decision`](crate::decision::Decision) keeps the core's [`Record`] (plain data,
//! read under the engine lock as the decision is taken) and the edges the ledger's own
//! `gone` or `fence` resolved ([`EndedEdges`]); the Python objects (names, words, ints)
//! are built only when `record` is read. A named edge's agent is the string given to
//! `register`.
//!
//! An edge says `landed`, `failure_notice`, `gone`, `fenced`, `failed` or `outstanding`.
//! The core keeps no cause and no time per edge; `gone` and `fenced` are known because
//! this ledger made those calls itself (`Ledger.gone`, `Ledger.fence`): before each, the
//! edges of the agent still outstanding are read, after it, those that failed, and the
//! count is checked against what the core resolved. Every other failed edge was failed
//! by a failure notice. When a notice fed on another thread raced the call (the counts
//! disagree), the edges involved say `failed`: the cause is not told apart.

use std::sync::{Arc, Mutex};

use kvdrain::{EdgeOutcome, Ended, FailureCause, Instant, Record, RecordedEdges};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::agents::AgentTable;
use crate::lock::lock;
use crate::tracker::{AgentEnd, EDGES};

/// The edges of one request a `gone` or `fence` of this ledger resolved: `(edge index,
/// how, when in ms)`; `None` for how: a failure notice raced the call.
pub(crate) type EndedEdges = Vec<(u8, Option<AgentEnd>, u64)>;

/// A request's record as the engine side read it, kept by a decision.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) record: Record<EDGES>,
    pub(crate) ended_edges: EndedEdges,
}

/// What the ledger knows of one request: read with `Decision.record`.
#[pyclass(frozen, module = "kvdrain", name = "Record")]
#[derive(Debug)]
pub(crate) struct PyRecord {
    /// Shared with the decision it was read from.
    pub(crate) recorded: Arc<Recorded>,
    pub(crate) request_id: Py<PyString>,
    /// The ledger's agent names, for the named edges.
    pub(crate) agents: Arc<Mutex<AgentTable>>,
}

/// One named edge as `edges` returns it: the agent's name, how, when.
type EdgeRow = (Option<Py<PyString>>, &'static str, Option<u64>);

fn ms(at: Option<Instant>) -> Option<u64> {
    at.map(Instant::millis)
}

/// How a named edge resolved, and when where known, as words and ms.
fn resolution(recorded: &Recorded, i: usize, outcome: EdgeOutcome) -> (&'static str, Option<u64>) {
    match outcome {
        EdgeOutcome::Outstanding => ("outstanding", None),
        EdgeOutcome::Landed => ("landed", None),
        EdgeOutcome::Failed => {
            let by_ledger = recorded
                .ended_edges
                .iter()
                .find(|&&(edge, _, _)| usize::from(edge) == i);
            match by_ledger {
                Some(&(_, Some(AgentEnd::Gone), at)) => ("gone", Some(at)),
                Some(&(_, Some(AgentEnd::Fence), at)) => ("fenced", Some(at)),
                Some(&(_, None, _)) => ("failed", None),
                None => ("failure_notice", None),
            }
        }
    }
}

#[pymethods]
impl PyRecord {
    /// The request id given to `register` (the same object).
    #[getter]
    fn request_id(&self, py: Python<'_>) -> Py<PyString> {
        self.request_id.clone_ref(py)
    }

    /// The ledger's clock at its registration, in ms.
    #[getter]
    fn registered_ms(&self) -> u64 {
        self.recorded.record.registered_at.millis()
    }

    /// When it expires (or expired) with edges outstanding, in ms.
    #[getter]
    fn deadline_ms(&self) -> u64 {
        self.recorded.record.deadline.millis()
    }

    /// `True` when it counts notices (`expect` was an int): `edges` is then empty.
    #[getter]
    fn counting(&self) -> bool {
        matches!(self.recorded.record.edges, RecordedEdges::Count { .. })
    }

    /// Notices (counting) or named edges expected.
    #[getter]
    fn expected(&self) -> u64 {
        match self.recorded.record.edges {
            RecordedEdges::Count { expected, .. } => u64::from(expected),
            RecordedEdges::Named { len, .. } => u64::from(len),
        }
    }

    /// Notices (counting) or named edges still owed.
    #[getter]
    fn owed(&self) -> u64 {
        match &self.recorded.record.edges {
            RecordedEdges::Count { outstanding, .. } => u64::from(*outstanding),
            named @ RecordedEdges::Named { .. } => named
                .named()
                .iter()
                .filter(|&&(_, o)| o == EdgeOutcome::Outstanding)
                .count() as u64,
        }
    }

    /// The named edges, in registration order: `(agent, how, at_ms)`, how one of
    /// `"landed"`, `"failure_notice"`, `"gone"`, `"fenced"`, `"failed"` (cause not told
    /// apart) or `"outstanding"`; `at_ms` for `gone` and `fenced` (the call's clock) and
    /// for a `failure_notice` when it is the request's only one, else `None`. Empty in
    /// counting mode.
    #[getter]
    fn edges<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let recorded = &self.recorded;
        let named = recorded.record.edges.named();
        let mut rows: Vec<EdgeRow> = {
            let agents = lock(py, &self.agents);
            named
                .iter()
                .enumerate()
                .map(|(i, &(agent, outcome))| {
                    let (how, at) = resolution(recorded, i, outcome);
                    (agents.name(py, agent), how, at)
                })
                .collect()
        };
        let raced = rows.iter().any(|r| r.1 == "failed");
        let mut by_notice = rows.iter_mut().filter(|r| r.1 == "failure_notice");
        if let (Some(only), None, false) = (by_notice.next(), by_notice.next(), raced) {
            only.2 = ms(recorded.record.failure_notice_at);
        }
        let list = PyList::empty(py);
        for (name, how, at) in rows {
            let name = match name {
                Some(n) => n.into_bound(py).into_any(),
                None => PyString::new(py, "?").into_any(),
            };
            let how = PyString::intern(py, how).into_any();
            let at = at.into_pyobject(py)?.into_any();
            list.append(PyTuple::new(py, [name, how, at])?)?;
        }
        Ok(list)
    }

    /// The last failure notice that resolved one of its edges, in ms.
    #[getter]
    fn failure_notice_ms(&self) -> Option<u64> {
        ms(self.recorded.record.failure_notice_at)
    }

    /// The last `gone` that resolved one of its edges, in ms.
    #[getter]
    fn gone_ms(&self) -> Option<u64> {
        ms(self.recorded.record.gone_at)
    }

    /// The last `fence` that resolved one of its edges, in ms.
    #[getter]
    fn fenced_ms(&self) -> Option<u64> {
        ms(self.recorded.record.fenced_at)
    }

    /// `"aborted"` or `"expired"` if it ended so, else `None`.
    #[getter]
    fn ended(&self) -> Option<&'static str> {
        self.recorded.record.ended.map(|(how, _)| match how {
            Ended::Aborted => "aborted",
            Ended::Expired => "expired",
        })
    }

    /// When it was aborted or expired, in ms.
    #[getter]
    fn ended_ms(&self) -> Option<u64> {
        self.recorded.record.ended.map(|(_, at)| at.millis())
    }

    /// When `completed` or `failed` was decided, in ms.
    #[getter]
    fn decided_ms(&self) -> Option<u64> {
        ms(self.recorded.record.decided_at)
    }

    /// Until when its blocks settled after a failure, in ms, if they had to.
    #[getter]
    fn settle_end_ms(&self) -> Option<u64> {
        ms(self.recorded.record.settle_end)
    }

    /// When its blocks came back, in ms (`None` until then).
    #[getter]
    fn released_ms(&self) -> Option<u64> {
        self.recorded.record.released.map(|(at, _)| at.millis())
    }

    /// `True` when the quarantine forced the blocks back with writes outstanding.
    #[getter]
    fn forced(&self) -> bool {
        self.recorded.record.forced()
    }

    /// The earliest failure: `"failure_notice"`, `"gone"`, `"fenced"`, `"aborted"` or
    /// `"expired"`; `None` when it did not fail.
    #[getter]
    fn first_failure(&self) -> Option<&'static str> {
        self.recorded
            .record
            .first_failure()
            .map(FailureCause::as_str)
    }

    /// When the first failure happened, in ms.
    #[getter]
    fn first_failure_ms(&self) -> Option<u64> {
        self.recorded
            .record
            .first_failure()
            .map(|c| c.at().millis())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let id = self.request_id.bind(py).repr()?;
        let r = &self.recorded.record;
        Ok(format!(
            "Record(request_id={id}, registered_ms={}, deadline_ms={}, edges={}, first_failure={:?}, decided_ms={:?}, settle_end_ms={:?}, released_ms={:?}, forced={})",
            r.registered_at.millis(),
            r.deadline.millis(),
            self.edges(py)?.repr()?,
            r.first_failure().map(|c| (c.as_str(), c.at().millis())),
            ms(r.decided_at),
            ms(r.settle_end),
            r.released.map(|(at, _)| at.millis()),
            if r.forced() { "True" } else { "False" },
        ))
    }
}
