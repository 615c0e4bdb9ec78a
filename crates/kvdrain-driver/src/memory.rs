//! An in-process [`Transport`]: a shared fabric of mailboxes and scripted WRITEs. It is the
//! demo's fallback when NIXL is missing and the drivers' fast test bed.
//!
//! Every endpoint ([`MemoryTransport`]) has an agent name and shares one [`MemoryFabric`].
//! Consumer ranks are published under `(engine, rank)` so producers can reach them. A
//! WRITE is in progress for [`MemoryFabric::set_write_polls`] polls, then ends as the
//! fault script says: `Success` delivers its completion to the consumer (sender: the
//! producer's agent name) and logs it in [`MemoryFabric::take_landed`], where the caller
//! moves the bytes; a backend error or an unreadable status delivers nothing.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::transport::{
    DrainError, GonePeer, Notification, Peer, PostError, Posted, SendError, Transport, WriteSpec,
    WriteStatus,
};

/// How a scripted WRITE ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFault {
    /// It lands.
    None,
    /// The handshake with the consumer rank fails: never posted.
    Handshake,
    /// The descriptors are refused: never posted.
    Descriptor,
    /// Posted, then a backend error.
    BackendError,
    /// Posted, then its status can no longer be read (it may still land).
    Unknown,
}

/// Chooses how each WRITE ends.
pub type FaultScript = Box<dyn FnMut(&WriteSpec<'_>) -> WriteFault + Send>;

/// A WRITE that landed: the caller moves its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandedWrite {
    /// The producer's agent name.
    pub producer: String,
    /// P's request id.
    pub producer_request_id: String,
    /// D's request id.
    pub consumer_request_id: String,
    /// The producer's TP rank.
    pub tp_rank: u16,
    /// The consumer rank written.
    pub d_rank: u16,
    /// P's source block ids.
    pub source: Vec<Vec<u64>>,
    /// D's block ids.
    pub dest: Vec<Vec<u64>>,
}

struct PendingWrite {
    producer: String,
    consumer: String,
    completion: Vec<u8>,
    polls_left: u32,
    fault: WriteFault,
    landed: LandedWrite,
}

#[derive(Default)]
struct Fabric {
    mailboxes: HashMap<String, VecDeque<Notification>>,
    consumers: HashMap<(String, u16), String>,
    writes: HashMap<u64, PendingWrite>,
    next_write: u64,
    write_polls: u32,
    script: Option<FaultScript>,
    landed: Vec<LandedWrite>,
    dead: HashSet<String>,
    gone: HashMap<String, VecDeque<GonePeer>>,
}

/// The shared in-process network.
#[derive(Clone, Default)]
pub struct MemoryFabric {
    inner: Arc<Mutex<Fabric>>,
}

impl std::fmt::Debug for MemoryFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryFabric").finish_non_exhaustive()
    }
}

impl MemoryFabric {
    /// An empty fabric; WRITEs land at their first poll.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Fabric> {
        // A panic elsewhere leaves plain data behind: keep going.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An endpoint named `agent`.
    pub fn endpoint(&self, agent: &str) -> MemoryTransport {
        self.lock().mailboxes.entry(agent.to_owned()).or_default();
        MemoryTransport {
            name: agent.to_owned(),
            fabric: self.clone(),
        }
    }

    /// Publishes consumer rank `(engine, rank)` as agent `agent` (its "handshake").
    pub fn publish_consumer(&self, engine: &str, rank: u16, agent: &str) {
        self.lock()
            .consumers
            .insert((engine.to_owned(), rank), agent.to_owned());
    }

    /// Polls a WRITE stays in progress before it ends.
    pub fn set_write_polls(&self, polls: u32) {
        self.lock().write_polls = polls;
    }

    /// How WRITEs end from now on (`None`: they land).
    pub fn set_fault_script(&self, script: Option<FaultScript>) {
        self.lock().script = script;
    }

    /// Agent `agent` dies: sends to it fail with a disconnect, every other endpoint
    /// learns it is gone, and its WRITEs in flight end with a backend error.
    pub fn kill(&self, agent: &str) {
        let mut f = self.lock();
        f.dead.insert(agent.to_owned());
        let ranks: Vec<(String, u16)> = f
            .consumers
            .iter()
            .filter(|(_, a)| *a == agent)
            .map(|(k, _)| k.clone())
            .collect();
        let names: Vec<String> = f.mailboxes.keys().cloned().collect();
        for name in names.into_iter().filter(|n| n != agent) {
            let queue = f.gone.entry(name).or_default();
            queue.push_back(GonePeer::Agent(agent.to_owned()));
            for (engine, rank) in &ranks {
                queue.push_back(GonePeer::ConsumerRank {
                    engine: engine.clone(),
                    rank: *rank,
                });
            }
        }
        for w in f.writes.values_mut() {
            if w.producer == agent || w.consumer == agent {
                w.fault = WriteFault::BackendError;
                w.polls_left = 0;
            }
        }
    }

    /// The WRITEs that landed since the last call.
    pub fn take_landed(&self) -> Vec<LandedWrite> {
        std::mem::take(&mut self.lock().landed)
    }

    /// WRITEs posted and not ended (unknown ones included).
    pub fn writes_in_flight(&self) -> usize {
        self.lock().writes.len()
    }

    /// Delivers `bytes` to `to` as if `from` had sent it (tests: garbage, strangers).
    pub fn inject(&self, from: &str, to: &str, bytes: &[u8]) {
        self.lock()
            .mailboxes
            .entry(to.to_owned())
            .or_default()
            .push_back((from.to_owned(), bytes.to_vec()));
    }
}

/// One agent's endpoint on a [`MemoryFabric`].
#[derive(Debug)]
pub struct MemoryTransport {
    name: String,
    fabric: MemoryFabric,
}

/// A WRITE posted on a [`MemoryFabric`].
#[derive(Debug)]
pub struct MemoryWrite(u64);

impl MemoryTransport {
    /// This endpoint's agent name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn resolve(f: &Fabric, to: Peer<'_>) -> Option<String> {
        match to {
            Peer::Agent(name) => f.mailboxes.contains_key(name).then(|| name.to_owned()),
            Peer::ConsumerRank { engine, rank } => {
                f.consumers.get(&(engine.to_owned(), rank)).cloned()
            }
        }
    }
}

impl Transport for MemoryTransport {
    type Write = MemoryWrite;

    fn post_write(&mut self, spec: &WriteSpec<'_>) -> Result<Posted<MemoryWrite>, PostError> {
        let mut guard = self.fabric.lock();
        let f = &mut *guard;
        let Some(consumer) = Self::resolve(
            f,
            Peer::ConsumerRank {
                engine: &spec.registration.decode_engine_id,
                rank: spec.d_rank,
            },
        ) else {
            return Err(PostError::Handshake);
        };
        if f.dead.contains(&consumer) {
            return Err(PostError::Handshake);
        }
        let fault = f.script.as_mut().map_or(WriteFault::None, |s| s(spec));
        match fault {
            WriteFault::Handshake => return Err(PostError::Handshake),
            WriteFault::Descriptor => return Err(PostError::Descriptor),
            _ => {}
        }
        let id = f.next_write;
        f.next_write += 1;
        let landed = LandedWrite {
            producer: self.name.clone(),
            producer_request_id: spec.producer_request_id.to_owned(),
            consumer_request_id: spec.registration.request_id.clone(),
            tp_rank: spec.tp_rank,
            d_rank: spec.d_rank,
            source: spec.source.to_vec(),
            dest: spec.registration.local_block_ids.clone(),
        };
        f.writes.insert(
            id,
            PendingWrite {
                producer: self.name.clone(),
                consumer,
                completion: spec.completion.to_vec(),
                polls_left: f.write_polls,
                fault,
                landed,
            },
        );
        Ok(Posted::InFlight(MemoryWrite(id)))
    }

    fn poll_write(&mut self, write: &mut MemoryWrite) -> WriteStatus {
        let mut guard = self.fabric.lock();
        let f = &mut *guard;
        let Some(w) = f.writes.get_mut(&write.0) else {
            return WriteStatus::BackendError;
        };
        if w.polls_left > 0 {
            w.polls_left -= 1;
            return WriteStatus::InProgress;
        }
        match w.fault {
            WriteFault::Unknown => WriteStatus::Unknown,
            WriteFault::BackendError | WriteFault::Handshake | WriteFault::Descriptor => {
                f.writes.remove(&write.0);
                WriteStatus::BackendError
            }
            WriteFault::None => {
                let Some(w) = f.writes.remove(&write.0) else {
                    return WriteStatus::BackendError;
                };
                f.mailboxes
                    .entry(w.consumer)
                    .or_default()
                    .push_back((w.producer, w.completion));
                f.landed.push(w.landed);
                WriteStatus::Success
            }
        }
    }

    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError> {
        let mut f = self.fabric.lock();
        let Some(agent) = Self::resolve(&f, to) else {
            return Err(SendError::Unreachable);
        };
        if f.dead.contains(&agent) {
            return Err(SendError::PeerGone);
        }
        f.mailboxes
            .entry(agent)
            .or_default()
            .push_back((self.name.clone(), bytes.to_vec()));
        Ok(())
    }

    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError> {
        let mut f = self.fabric.lock();
        if let Some(mailbox) = f.mailboxes.get_mut(&self.name) {
            out.extend(mailbox.drain(..));
        }
        Ok(())
    }

    fn peer_gone(&mut self) -> Option<GonePeer> {
        self.fabric.lock().gone.get_mut(&self.name)?.pop_front()
    }
}
