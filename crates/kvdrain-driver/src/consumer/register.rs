//! Registration: what the engine asks for ([`ReceiveSpec`], [`EdgeMode`]), what it gets
//! back ([`Registered`], [`ConsumerError`]), and the steps between. The edges of this rank
//! come from the producer engine's topology; the request is tracked in the core **before**
//! `PUSH_REG` goes out, so no completion can beat its state; the agents the `PUSH_REG`
//! could not be sent to are reported unreached (F6).

use std::sync::Arc;

use kvdrain::producer::{Topology, TopologyError};
use kvdrain::{
    AgentId, BlockHandle, Duration, Expect, Instant, Pending, RegisterErrorKind, Registration,
    RequestKey,
};

use super::state::InFlight;
use super::{ConsumerEngine, RemoteProducer, TrackedRequest};
use crate::PerRequest;
use crate::directory::DirectoryFull;
use crate::registration::PushRegistration;
use crate::transport::Transport;

/// A request the engine wants pushed into this rank: what
/// [`register`](ConsumerEngine::register) takes.
#[derive(Debug)]
pub struct ReceiveSpec<'a> {
    /// D's request id.
    pub id: &'a str,
    /// The producer engine (added with
    /// [`ConsumerDriver::add_producer_engine`](super::ConsumerDriver::add_producer_engine)).
    pub producer_engine: &'a str,
    /// P's request id (for heartbeats).
    pub remote_request_id: &'a str,
    /// Router pairing key, if any.
    pub transfer_id: Option<&'a str>,
    /// The engine's handle on the destination blocks.
    pub blocks: BlockHandle,
    /// D's logical block ids per KV-cache group (uncached suffix), as sent in `PUSH_REG`.
    pub block_ids: Vec<Vec<u64>>,
    /// How long from its registration it may wait; `None` uses the ledger's default
    /// ([`Config::deadline`](kvdrain::Config::deadline)).
    pub deadline: Option<Duration>,
}

/// How a registration's edges are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EdgeMode {
    /// Named edges when every producer of the rank is named and they fit `E`; vLLM's
    /// count otherwise (the default: [`ConsumerEngine::register`]).
    #[default]
    Named,
    /// vLLM's count (`pp × max(1, P_tp / D_tp)`) even when every producer is named: for
    /// a deployment that wants vLLM's semantics exactly, and for the simulator, which
    /// exercises both modes.
    Count,
}

/// A registration that is being tracked.
#[derive(Debug, PartialEq, Eq)]
pub struct Registered {
    /// The core's key.
    pub key: RequestKey,
    /// Producer agents the `PUSH_REG` could not be sent to (F6). Their edges stay
    /// outstanding until the deadline: the engine may abort.
    pub unreached: Vec<String>,
}

/// Failure of a consumer operation.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// [`ReceiveSpec::producer_engine`] was never added.
    #[error("unknown producer engine {0:?}")]
    UnknownEngine(String),
    /// The producer/consumer shapes do not fit.
    #[error("producer engine {engine:?} cannot write consumer rank {rank}: {source}")]
    Topology {
        /// Producer engine.
        engine: String,
        /// This rank.
        rank: u16,
        /// Why.
        #[source]
        source: TopologyError,
    },
    /// Too many producer agents.
    #[error(transparent)]
    Directory(#[from] DirectoryFull),
    /// The core refused the registration; the blocks come back unchanged.
    #[error("registration of {id:?} refused: {kind:?}")]
    Rejected {
        /// D's request id.
        id: String,
        /// Why.
        kind: RegisterErrorKind,
        /// The engine's blocks, handed back.
        blocks: BlockHandle,
    },
}

impl<const N: usize, const E: usize> ConsumerEngine<'_, N, E> {
    /// Tracks `request` in the core, then sends `PUSH_REG` to every agent of its producer
    /// engine.
    ///
    /// # Errors
    /// [`ConsumerError`]; on [`ConsumerError::Rejected`] the blocks come back and nothing
    /// was sent.
    pub fn register<T: Transport>(
        &mut self,
        transport: &mut T,
        request: ReceiveSpec<'_>,
        now: Instant,
    ) -> Result<Registered, ConsumerError> {
        self.register_with(transport, request, EdgeMode::Named, now)
    }

    /// [`register`](Self::register), counting the edges as `mode` says.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub fn register_with<T: Transport>(
        &mut self,
        transport: &mut T,
        request: ReceiveSpec<'_>,
        mode: EdgeMode,
        now: Instant,
    ) -> Result<Registered, ConsumerError> {
        let _span = tracing::debug_span!("register", req = request.id).entered();
        self.state.now = self.state.now.max(now);
        let engine = self.producer_engine(request.producer_engine)?;
        let (topology, producers) = self.producers_of(&engine)?;
        let ids: PerRequest<AgentId> = producers
            .iter()
            .map(|p| self.directory.id_or_stranger(p))
            .collect();
        let expect = expect::<E>(mode, &ids, topology.expected_per_consumer_rank());
        let ReceiveSpec {
            id,
            producer_engine,
            remote_request_id,
            transfer_id,
            blocks,
            block_ids,
            deadline,
        } = request;
        let ticket = self.track(id, blocks, expect, deadline)?;
        let key = ticket.key();
        let registration = self.push_reg(id, &engine, transfer_id, block_ids);
        self.remember(
            key,
            ticket,
            id,
            producer_engine,
            remote_request_id,
            producers,
        );
        let unreached = self.send_registration(transport, id, &engine, &registration);
        tracing::debug!(unreached = unreached.len(), "registered, PUSH_REG sent");
        Ok(Registered { key, unreached })
    }

    /// Step 1: the producer engine the request names, added before.
    fn producer_engine(&self, name: &str) -> Result<Arc<RemoteProducer>, ConsumerError> {
        self.state
            .engines
            .get(name)
            .map(Arc::clone)
            .ok_or_else(|| ConsumerError::UnknownEngine(name.to_owned()))
    }

    /// Step 2: the engine's topology against this rank's, and the producer agents this
    /// rank waits for, in edge order ([`Topology::producers_of`]).
    fn producers_of(
        &self,
        engine: &RemoteProducer,
    ) -> Result<(Topology, PerRequest<String>), ConsumerError> {
        let config = &self.state.config;
        let topology = Topology {
            p_tp: engine.tp_size,
            p_pp: engine.pp_size,
            d_tp: config.tp_size,
            mla: engine.mla,
        };
        let topology_error = |source| ConsumerError::Topology {
            engine: engine.engine_id.clone(),
            rank: config.tp_rank,
            source,
        };
        topology.validate().map_err(topology_error)?;
        let producers: PerRequest<String> = topology
            .producers_of(config.tp_rank)
            .filter_map(|(stage, tp)| {
                let i = usize::from(stage) * usize::from(engine.tp_size) + usize::from(tp);
                engine.agents.get(i).cloned()
            })
            .collect();
        if producers.is_empty() {
            return Err(topology_error(TopologyError::RankOutOfRange));
        }
        Ok((topology, producers))
    }

    /// Step 3: the request tracked in the core, before anything is sent; a refusal hands
    /// the blocks back.
    fn track(
        &mut self,
        id: &str,
        blocks: BlockHandle,
        expect: Expect<'_>,
        deadline: Option<Duration>,
    ) -> Result<Pending, ConsumerError> {
        self.engine
            .register(Registration {
                id,
                blocks,
                expect,
                deadline,
            })
            .map_err(|e| ConsumerError::Rejected {
                id: id.to_owned(),
                kind: e.kind,
                blocks: e.registration.blocks,
            })
    }

    /// Step 4: the `PUSH_REG` notification, the same for every agent of the engine.
    fn push_reg(
        &self,
        id: &str,
        engine: &RemoteProducer,
        transfer_id: Option<&str>,
        block_ids: Vec<Vec<u64>>,
    ) -> Vec<u8> {
        let config = &self.state.config;
        PushRegistration {
            request_id: id.to_owned(),
            decode_engine_id: config.engine_id.clone(),
            decode_host: config.host.clone(),
            decode_port: config.port,
            decode_tp_size: config.tp_size,
            local_block_ids: block_ids,
            remote_engine_id: engine.engine_id.clone(),
            remote_host: engine.host.clone(),
            remote_port: engine.port,
            remote_tp_size: engine.tp_size,
            remote_pp_size: engine.pp_size,
            transfer_id: transfer_id.map(str::to_owned),
        }
        .to_notification()
    }

    /// Step 5: what the driver keeps of the request until its release, heartbeated until
    /// its decision.
    fn remember(
        &mut self,
        key: RequestKey,
        ticket: Pending,
        id: &str,
        producer_engine: &str,
        remote_request_id: &str,
        producers: PerRequest<String>,
    ) {
        let st = &mut *self.state;
        st.by_id.insert(id.to_owned(), key);
        st.inflight.insert(
            key,
            InFlight {
                request: TrackedRequest {
                    key,
                    id: id.to_owned(),
                    producer_engine: producer_engine.to_owned(),
                    remote_request_id: remote_request_id.to_owned(),
                    producers,
                    registered_at: st.now,
                },
                heartbeat: true,
                ticket: Some(ticket),
            },
        );
    }

    /// Step 6: `PUSH_REG` to every agent of the engine; returns those it could not be sent
    /// to (F6).
    fn send_registration<T: Transport>(
        &mut self,
        transport: &mut T,
        id: &str,
        engine: &RemoteProducer,
        registration: &[u8],
    ) -> Vec<String> {
        let mut unreached = Vec::new();
        for agent in &engine.agents {
            if self.send(transport, agent, registration) {
                self.state.counters.registrations_sent += 1;
            } else {
                tracing::warn!(
                    req = id,
                    agent,
                    cause = "registration_unsent",
                    "PUSH_REG could not be sent"
                );
                self.state.counters.registrations_failed += 1;
                unreached.push(agent.clone());
            }
        }
        unreached
    }
}

/// Named edges when the mode allows, every producer is named and they fit `E`; vLLM's
/// count of `expected` notices otherwise.
fn expect<const E: usize>(mode: EdgeMode, ids: &[AgentId], expected: u32) -> Expect<'_> {
    if mode == EdgeMode::Named
        && ids.len() <= E
        && ids.len() as u32 == expected
        && !ids.contains(&AgentId::STRANGER)
    {
        Expect::Edges(ids)
    } else {
        Expect::Count(u8::try_from(expected).unwrap_or(u8::MAX))
    }
}
