//! `kvdrain.PushPlan`: the failure notices a producer rank owes for one request, from the
//! core's [`PushPlan`] (posted vs never-posted edges, F3/F4, at most one notice per edge).

use kvdrain::producer::{EdgeState, PlanError, PushPlan, Topology, TopologyError};
use kvdrain::wire::Body;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::args;
use crate::errors::{PlanError as PyPlanError, TopologyError as PyTopologyError};

/// One request on one producer rank.
#[pyclass(module = "kvdrain", name = "PushPlan")]
#[derive(Debug)]
pub(crate) struct PyPushPlan {
    plan: PushPlan,
    request_id: Py<PyString>,
    /// `d_agents[d_rank]`: the consumer rank's NIXL agent name (`None`: not known).
    d_agents: Vec<Option<Py<PyString>>>,
    p_tp: u16,
}

fn topology_error(e: TopologyError) -> PyErr {
    PyTopologyError::new_err(e.to_string())
}

fn topology_message(why: String) -> PyErr {
    PyTopologyError::new_err(why)
}

fn plan_error(e: PlanError) -> PyErr {
    PyPlanError::new_err(e.to_string())
}

fn state_name(s: EdgeState) -> &'static str {
    match s {
        EdgeState::Planned => "planned",
        EdgeState::Posted => "posted",
        EdgeState::Landed => "landed",
        EdgeState::Failed { posted: true } => "failed_posted",
        EdgeState::Failed { posted: false } => "failed_unposted",
        EdgeState::Unknown => "unknown",
        EdgeState::Noticed => "noticed",
        EdgeState::Unreachable => "unreachable",
    }
}

impl PyPushPlan {
    fn rank(d_rank: &Bound<'_, PyAny>) -> PyResult<u16> {
        args::unsigned(d_rank, "d_rank", PyPlanError::new_err)
    }

    /// `(agent, PUSH_FAIL bytes)` for each owed notice whose consumer agent is known.
    fn owed<'py>(&self, py: Python<'py>) -> PyResult<Vec<(u16, Bound<'py, PyTuple>)>> {
        let id = self.request_id.bind(py).to_str()?;
        let completion = Body {
            request_id: id,
            tp_size: self.p_tp,
        };
        let mut buf = vec![0u8; completion.encoded_len() + kvdrain::wire::PUSH_FAIL_PREFIX.len()];
        let len = completion
            .encode_failure(&mut buf)
            .map_err(|e| PyPlanError::new_err(e.to_string()))?;
        let mut out = Vec::new();
        for d_rank in self.plan.owed_notices() {
            if let Some(Some(agent)) = self.d_agents.get(usize::from(d_rank)) {
                let pair = PyTuple::new(
                    py,
                    [
                        agent.clone_ref(py).into_bound(py).into_any(),
                        PyBytes::new(py, &buf[..len]).into_any(),
                    ],
                )?;
                out.push((d_rank, pair));
            }
        }
        Ok(out)
    }
}

#[pymethods]
impl PyPushPlan {
    #[new]
    #[pyo3(
        text_signature = "(request_id, *, p_tp, d_tp, d_agents, tp_rank, p_pp=1, pp_stage=0, mla=False)"
    )]
    #[pyo3(signature = (request_id, *, p_tp, d_tp, d_agents, tp_rank, p_pp = None, pp_stage = None, mla = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        request_id: &Bound<'_, PyString>,
        p_tp: &Bound<'_, PyAny>,
        d_tp: &Bound<'_, PyAny>,
        d_agents: Vec<Option<Py<PyString>>>,
        tp_rank: &Bound<'_, PyAny>,
        p_pp: Option<&Bound<'_, PyAny>>,
        pp_stage: Option<&Bound<'_, PyAny>>,
        mla: bool,
    ) -> PyResult<Self> {
        args::registrable_request_id(request_id)?;
        let size = |value, name| args::unsigned::<u16>(value, name, topology_message);
        let (p_tp, d_tp, tp_rank) = (
            size(p_tp, "p_tp")?,
            size(d_tp, "d_tp")?,
            size(tp_rank, "tp_rank")?,
        );
        let p_pp = args::unsigned_opt(p_pp, "p_pp", topology_message)?.unwrap_or(1);
        let pp_stage = args::unsigned_opt(pp_stage, "pp_stage", topology_message)?.unwrap_or(0);
        let topology = Topology {
            p_tp,
            p_pp,
            d_tp,
            mla,
        };
        topology.validate().map_err(topology_error)?;
        if d_agents.len() != usize::from(d_tp) {
            return Err(PyTopologyError::new_err(format!(
                "d_agents names {} consumer ranks, d_tp is {d_tp}",
                d_agents.len()
            )));
        }
        let plan = PushPlan::new(&topology, pp_stage, tp_rank).map_err(topology_error)?;
        Ok(PyPushPlan {
            plan,
            request_id: request_id.clone().unbind(),
            d_agents,
            p_tp,
        })
    }

    /// The consumer ranks this producer rank writes, in order.
    #[getter]
    fn targets(&self) -> Vec<u16> {
        self.plan.edges().iter().map(|e| e.d_rank).collect()
    }

    /// `(d_rank, state)` per edge; states: planned, posted, landed, failed_posted,
    /// failed_unposted, unknown, noticed, unreachable.
    #[getter]
    fn edges(&self) -> Vec<(u16, &'static str)> {
        self.plan
            .edges()
            .iter()
            .map(|e| (e.d_rank, state_name(e.state)))
            .collect()
    }

    /// Whether the WRITE to `d_rank` may be posted now (not retired, edge still planned).
    fn may_post(&self, d_rank: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.plan.may_post(Self::rank(d_rank)?).is_ok())
    }

    /// The WRITE to `d_rank` was posted.
    fn posted(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan.posted(Self::rank(d_rank)?).map_err(plan_error)
    }

    /// The WRITE to `d_rank` could not be described or posted: nothing was sent.
    fn post_failed(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan
            .post_failed(Self::rank(d_rank)?)
            .map_err(plan_error)
    }

    /// The initiator saw the WRITE to `d_rank` succeed (after `status_unknown`, use
    /// `landed_after_unknown`).
    fn landed(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan.landed(Self::rank(d_rank)?).map_err(plan_error)
    }

    /// The posted WRITE to `d_rank` ended with a backend error (its own, or another
    /// transfer's to the same consumer agent): nothing more of it lands, a `PUSH_FAIL` is
    /// owed. Also accepted after `status_unknown`: the error bounds the unknown write.
    fn backend_error(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan
            .backend_error(Self::rank(d_rank)?)
            .map_err(plan_error)
    }

    /// The older name of `backend_error`.
    fn failed(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan
            .backend_error(Self::rank(d_rank)?)
            .map_err(plan_error)
    }

    /// The posted WRITE to `d_rank` can no longer report its status (NIXL `NOT_FOUND` the
    /// producer did not cause): it may still land. Nothing is owed and the edge is not
    /// terminal (the source blocks stay fenced; the consumer's deadline decides) until a
    /// later `landed_after_unknown` or `backend_error`. Repeating it is a no-op.
    fn status_unknown(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan
            .status_unknown(Self::rank(d_rank)?)
            .map_err(plan_error)
    }

    /// The WRITE to `d_rank`, posted and perhaps reported unknown, was later seen to
    /// succeed: it landed, nothing is owed.
    fn landed_after_unknown(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan
            .landed_after_unknown(Self::rank(d_rank)?)
            .map_err(plan_error)
    }

    /// Consumer rank `d_rank` cannot be named or reached: no notice can be sent to it.
    fn unreachable(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan
            .unreachable(Self::rank(d_rank)?)
            .map_err(plan_error)
    }

    /// The request ended on this producer: nothing more is posted, every edge not yet
    /// attempted is owed a notice.
    fn retire(&mut self) {
        self.plan.retire();
    }

    /// The failure notices owed now, `(consumer agent name, b"PUSH_FAIL:REQ:TP")`, one per
    /// failed edge whose agent is known; does not mark them sent.
    fn owed_notices<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let owed = self.owed(py)?;
        PyList::new(py, owed.into_iter().map(|(_, pair)| pair))
    }

    /// The owed notices, each marked sent (hand every one to the transport).
    fn take_owed_notices<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let owed = self.owed(py)?;
        for (d_rank, _) in &owed {
            self.plan.noticed(*d_rank).map_err(plan_error)?;
        }
        PyList::new(py, owed.into_iter().map(|(_, pair)| pair))
    }

    /// The notice for `d_rank` was handed to the transport.
    fn noticed(&mut self, d_rank: &Bound<'_, PyAny>) -> PyResult<()> {
        self.plan.noticed(Self::rank(d_rank)?).map_err(plan_error)
    }

    /// No WRITE is in flight or still to post: the source blocks may be released.
    #[getter]
    fn is_terminal(&self) -> bool {
        self.plan.is_terminal()
    }

    /// Every edge landed.
    #[getter]
    fn all_landed(&self) -> bool {
        self.plan.all_landed()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "PushPlan(request_id={}, edges={:?})",
            self.request_id.bind(py).repr()?,
            self.edges()
        ))
    }
}

/// `kvdrain.producers_of`: the `(pp_stage, tp_rank)` producer ranks whose WRITEs land on
/// consumer rank `d_rank`, in order: the core's [`Topology::producers_of`], so the vLLM
/// plugin's expectation and the producer's plan come from one rule.
#[pyfunction]
#[pyo3(signature = (d_rank, *, p_tp, d_tp, p_pp = None, mla = false))]
#[pyo3(text_signature = "(d_rank, *, p_tp, d_tp, p_pp=1, mla=False)")]
pub(crate) fn producers_of(
    d_rank: &Bound<'_, PyAny>,
    p_tp: &Bound<'_, PyAny>,
    d_tp: &Bound<'_, PyAny>,
    p_pp: Option<&Bound<'_, PyAny>>,
    mla: bool,
) -> PyResult<Vec<(u16, u16)>> {
    let size = |value, name| args::unsigned::<u16>(value, name, topology_message);
    let topology = Topology {
        p_tp: size(p_tp, "p_tp")?,
        p_pp: args::unsigned_opt(p_pp, "p_pp", topology_message)?.unwrap_or(1),
        d_tp: size(d_tp, "d_tp")?,
        mla,
    };
    topology.validate().map_err(topology_error)?;
    let d_rank = size(d_rank, "d_rank")?;
    if d_rank >= topology.d_tp {
        return Err(topology_message(format!(
            "d_rank={d_rank} is outside the consumer's {} ranks",
            topology.d_tp
        )));
    }
    Ok(topology.producers_of(d_rank).collect())
}
