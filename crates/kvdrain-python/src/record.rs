//! `kvdrain.Record`: what the ledger knows of one request when a decision about it was
//! taken ([`Decision.record`](crate::decision::Decision)), for an operator.
//!
//! A [`Decision`](crate::decision::Decision) keeps the core's [`Record`], handed out by
//! the core with the decision (plain data); the Python objects (names, words, ints) are
//! built only when `record` is read. A named edge's agent is the string given to
//! `register`.
//!
//! An edge says `landed`, `failure_notice`, `gone`, `fenced` or `outstanding`: the cause
//! the core wrote as it resolved the edge ([`EdgeOutcome`]), whichever thread did. The
//! times are the request's (the last failure notice, `gone` and `fence` that resolved
//! one of its edges); an edge shows its cause's time when it is the request's only edge
//! with that cause, so the time is its own.

use std::sync::{Arc, Mutex};

use kvdrain::{EdgeOutcome, Ended, FailureCause, Instant, Record, RecordedEdges};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::agents::AgentTable;
use crate::lock::lock;
use crate::tracker::EDGES;

/// What the ledger knows of one request: read with `Decision.record`.
#[pyclass(frozen, module = "kvdrain", name = "Record")]
#[derive(Debug)]
pub(crate) struct PyRecord {
    /// Shared with the decision it was read from.
    pub(crate) record: Arc<Record<EDGES>>,
    pub(crate) request_id: Py<PyString>,
    /// The ledger's agent names, for the named edges.
    pub(crate) agents: Arc<Mutex<AgentTable>>,
}

/// One named edge as `edges` returns it: the agent's name, how, when.
type EdgeRow = (Option<Py<PyString>>, &'static str, Option<u64>);

fn ms(at: Option<Instant>) -> Option<u64> {
    at.map(Instant::millis)
}

/// When the edge `i` of `record` (whose outcome is `outcome`) ended, where the record
/// tells: the request's time for the edge's cause, when no other edge has that cause.
fn edge_time(record: &Record<EDGES>, i: usize, outcome: EdgeOutcome) -> Option<u64> {
    let at = match outcome {
        EdgeOutcome::Outstanding | EdgeOutcome::Landed => return None,
        EdgeOutcome::FailureNotice => record.failure_notice_at,
        EdgeOutcome::Gone => record.gone_at,
        EdgeOutcome::Fenced => record.fenced_at,
    };
    let named = record.edges.named();
    let alone = named
        .iter()
        .enumerate()
        .all(|(j, &(_, o))| j == i || o != outcome);
    if alone { ms(at) } else { None }
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
        self.record.registered_at.millis()
    }

    /// When it expires (or expired) with edges outstanding, in ms.
    #[getter]
    fn deadline_ms(&self) -> u64 {
        self.record.deadline.millis()
    }

    /// `True` when it counts notices (`expect` was an int): `edges` is then empty.
    #[getter]
    fn counting(&self) -> bool {
        matches!(self.record.edges, RecordedEdges::Count { .. })
    }

    /// Notices (counting) or named edges expected.
    #[getter]
    fn expected(&self) -> u64 {
        match self.record.edges {
            RecordedEdges::Count { expected, .. } => u64::from(expected),
            RecordedEdges::Named { len, .. } => u64::from(len),
        }
    }

    /// Notices (counting) or named edges still owed.
    #[getter]
    fn owed(&self) -> u64 {
        match &self.record.edges {
            RecordedEdges::Count { outstanding, .. } => u64::from(*outstanding),
            named @ RecordedEdges::Named { .. } => named
                .named()
                .iter()
                .filter(|&&(_, o)| o == EdgeOutcome::Outstanding)
                .count() as u64,
        }
    }

    /// The named edges, in registration order: `(agent, how, at_ms)`, how one of
    /// `"landed"`, `"failure_notice"`, `"gone"`, `"fenced"` or `"outstanding"`, as the
    /// core recorded it; `at_ms` the request's time for that cause when the edge is its
    /// only one with that cause, else `None`. Empty in counting mode.
    #[getter]
    fn edges<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let record = &*self.record;
        let rows: Vec<EdgeRow> = {
            let agents = lock(py, &self.agents);
            record
                .edges
                .named()
                .iter()
                .enumerate()
                .map(|(i, &(agent, outcome))| {
                    (
                        agents.name(py, agent),
                        outcome.as_str(),
                        edge_time(record, i, outcome),
                    )
                })
                .collect()
        };
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
        ms(self.record.failure_notice_at)
    }

    /// The last `gone` that resolved one of its edges, in ms.
    #[getter]
    fn gone_ms(&self) -> Option<u64> {
        ms(self.record.gone_at)
    }

    /// The last `fence` that resolved one of its edges, in ms.
    #[getter]
    fn fenced_ms(&self) -> Option<u64> {
        ms(self.record.fenced_at)
    }

    /// `"aborted"` or `"expired"` if it ended so, else `None`.
    #[getter]
    fn ended(&self) -> Option<&'static str> {
        self.record.ended.map(|(how, _)| match how {
            Ended::Aborted => "aborted",
            Ended::Expired => "expired",
        })
    }

    /// When it was aborted or expired, in ms.
    #[getter]
    fn ended_ms(&self) -> Option<u64> {
        self.record.ended.map(|(_, at)| at.millis())
    }

    /// When `completed` or `failed` was decided, in ms.
    #[getter]
    fn decided_ms(&self) -> Option<u64> {
        ms(self.record.decided_at)
    }

    /// Until when its blocks settled after a failure, in ms, if they had to.
    #[getter]
    fn settle_end_ms(&self) -> Option<u64> {
        ms(self.record.settle_end)
    }

    /// When its blocks came back, in ms (`None` until then).
    #[getter]
    fn released_ms(&self) -> Option<u64> {
        self.record.released.map(|(at, _)| at.millis())
    }

    /// `True` when the quarantine forced the blocks back with writes outstanding.
    #[getter]
    fn forced(&self) -> bool {
        self.record.forced()
    }

    /// The earliest failure: `"failure_notice"`, `"gone"`, `"fenced"`, `"aborted"` or
    /// `"expired"`; `None` when it did not fail.
    #[getter]
    fn first_failure(&self) -> Option<&'static str> {
        self.record.first_failure().map(FailureCause::as_str)
    }

    /// When the first failure happened, in ms.
    #[getter]
    fn first_failure_ms(&self) -> Option<u64> {
        self.record.first_failure().map(|c| c.at().millis())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let id = self.request_id.bind(py).repr()?;
        let r = &*self.record;
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
