//! `kvdrain.Decision`: one decision about one request, with the caller's own objects.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::agents::AgentTable;
use crate::record::PyRecord;
use crate::tracker::EDGES;

/// What was decided. The Python side sees the lower-case word (the replay format's
/// `event`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// Every edge landed: decode may start; the blocks now belong to the request.
    Completed,
    /// Every edge resolved, at least one failed: fail the request; `Released` follows.
    Failed,
    /// The deadline passed with edges outstanding; `Released` follows.
    Expired,
    /// The engine aborted it with edges outstanding; `Released` follows.
    Aborted,
    /// The blocks of a request that did not complete are free.
    Released,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Completed => "completed",
            Kind::Failed => "failed",
            Kind::Expired => "expired",
            Kind::Aborted => "aborted",
            Kind::Released => "released",
        }
    }
}

/// A decision: `kind` says what, `request_id` and `blocks` say about which request (the
/// very objects given to `register`), `forced` and `outstanding` say more where they apply.
#[pyclass(frozen, freelist = 1024, module = "kvdrain", name = "Decision")]
#[derive(Debug)]
pub(crate) struct Decision {
    pub(crate) kind: Kind,
    pub(crate) request_id: Py<PyString>,
    pub(crate) blocks: Py<PyAny>,
    pub(crate) at_ms: u64,
    pub(crate) forced: bool,
    /// `None`, an `int` (counting mode) or a `list[str]` (named edges), for expired and
    /// aborted decisions.
    pub(crate) outstanding: Py<PyAny>,
    /// The request's record, handed out by the core with the decision (plain data:
    /// `record` builds its Python objects when it is read).
    pub(crate) record: Arc<kvdrain::Record<EDGES>>,
    /// The ledger's agent names, for the record's named edges.
    pub(crate) agents: Arc<Mutex<AgentTable>>,
}

#[pymethods]
impl Decision {
    /// `"completed"`, `"failed"`, `"expired"`, `"aborted"` or `"released"`.
    #[getter]
    fn kind<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        let word = match self.kind {
            Kind::Completed => pyo3::intern!(py, "completed"),
            Kind::Failed => pyo3::intern!(py, "failed"),
            Kind::Expired => pyo3::intern!(py, "expired"),
            Kind::Aborted => pyo3::intern!(py, "aborted"),
            Kind::Released => pyo3::intern!(py, "released"),
        };
        word.clone()
    }

    /// The request id given to `register` (the same object).
    #[getter]
    fn request_id(&self, py: Python<'_>) -> Py<PyString> {
        self.request_id.clone_ref(py)
    }

    /// The blocks object given to `register` (the same object).
    #[getter]
    fn blocks(&self, py: Python<'_>) -> Py<PyAny> {
        self.blocks.clone_ref(py)
    }

    /// The ledger's clock when the decision was taken, in ms.
    #[getter]
    fn at_ms(&self) -> u64 {
        self.at_ms
    }

    /// `released` only: `True` when the quarantine ran out with writes still outstanding.
    #[getter]
    fn forced(&self) -> bool {
        self.forced
    }

    /// `expired` and `aborted` only: notices still owed (counting mode, an `int`) or the
    /// agents that still owe one (named edges, a `list[str]`); `None` otherwise.
    #[getter]
    fn outstanding(&self, py: Python<'_>) -> Py<PyAny> {
        self.outstanding.clone_ref(py)
    }

    /// What the ledger knew of the request when this decision was taken
    /// (`kvdrain.Record`): its edges by agent and how each resolved, its first failure,
    /// deadline, settle end and release. A new object at each read; every decision has
    /// one (the core hands it out with the decision).
    #[getter]
    fn record(&self, py: Python<'_>) -> PyResult<Py<PyRecord>> {
        Py::new(
            py,
            PyRecord {
                record: Arc::clone(&self.record),
                request_id: self.request_id.clone_ref(py),
                agents: Arc::clone(&self.agents),
            },
        )
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let id = self.request_id.bind(py).repr()?;
        let mut s = format!(
            "Decision(kind={:?}, request_id={id}, at_ms={}",
            self.kind.as_str(),
            self.at_ms
        );
        if self.kind == Kind::Released {
            s.push_str(if self.forced {
                ", forced=True"
            } else {
                ", forced=False"
            });
        }
        if !self.outstanding.is_none(py) {
            s.push_str(&format!(
                ", outstanding={}",
                self.outstanding.bind(py).repr()?
            ));
        }
        s.push(')');
        Ok(s)
    }
}
