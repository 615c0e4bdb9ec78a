//! Reading a `feed` batch: the `bytes` of each sender's messages, in chunks that the
//! ingest half takes with the GIL released.
//!
//! Reading needs the GIL (it iterates Python objects and may run Python code, a
//! generator's); feeding the core does not. So the messages are read into a chunk of
//! [`CHUNK`] references to `bytes` objects, the chunk is fed (without the GIL from
//! `DETACH_AT` messages on, see `tracker.rs`), and reading goes on: the engine thread
//! waits for one chunk's reading at most, never for a whole batch. The `bytes` stay
//! alive through the chunk's own references while the core reads them.

use std::sync::Mutex;

use kvdrain::AgentId;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PyString, PyTuple};

use crate::agents::AgentTable;
use crate::lock::lock;
use crate::tracker::{DETACH_AT, Message, Tracker};

/// Messages read before a chunk is fed.
const CHUNK: usize = 65_536;

/// One `feed` call's reading state.
pub(crate) struct BatchReader<'a, 'py> {
    py: Python<'py>,
    tracker: &'a dyn Tracker,
    agents: &'a Mutex<AgentTable>,
    /// The batch's keys so far, and the agent number of each.
    keys: Vec<(Bound<'py, PyAny>, AgentId)>,
    /// Read, not yet fed: `(key index, message)`.
    chunk: Vec<(usize, Bound<'py, PyBytes>)>,
    /// Entries that were not `bytes`, not yet counted by the ingest half.
    not_bytes: u64,
    /// The producer-bound messages fed so far, as `(key, message)` tuples.
    producer_bound: Bound<'py, PyList>,
}

impl<'a, 'py> BatchReader<'a, 'py> {
    pub(crate) fn new(
        py: Python<'py>,
        tracker: &'a dyn Tracker,
        agents: &'a Mutex<AgentTable>,
    ) -> Self {
        BatchReader {
            py,
            tracker,
            agents,
            keys: Vec::new(),
            chunk: Vec::new(),
            not_bytes: 0,
            producer_bound: PyList::empty(py),
        }
    }

    /// Reads (and feeds, chunk by chunk) the whole batch. `Err` if the batch is not a
    /// mapping at all (nothing was read); `Ok(Some(e))` for the first exception raised
    /// while reading it, after which nothing more is read.
    pub(crate) fn read(&mut self, notifs: &Bound<'py, PyAny>) -> PyResult<Option<PyErr>> {
        if let Ok(dict) = notifs.cast::<PyDict>()
            && self.small_lists(dict)?
        {
            return Ok(None);
        }
        let stopped = match notifs.cast::<PyDict>() {
            Ok(dict) => dict.iter().try_for_each(|(k, v)| self.value(k, &v)),
            Err(_) => notifs
                .call_method0("items")?
                .try_iter()?
                .try_for_each(|kv| {
                    let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = kv?.extract()?;
                    self.value(k, &v)
                }),
        };
        Ok(stopped.err())
    }

    /// The common case, NIXL's: a `dict` of `list`s with fewer than `DETACH_AT` messages
    /// in all. Fed straight from the lists with the GIL held (no Python code runs, so no
    /// exception and no change to the lists can come in between). `false` if the batch is
    /// not of that shape (nothing was read).
    fn small_lists(&mut self, dict: &Bound<'py, PyDict>) -> PyResult<bool> {
        let mut total = 0;
        let mut batch: Vec<(AgentId, Bound<'py, PyList>, Bound<'py, PyAny>)> =
            Vec::with_capacity(dict.len());
        for (key, value) in dict.iter() {
            let Ok(list) = value.cast_into::<PyList>() else {
                return Ok(false);
            };
            total += list.len();
            // A key that is not a UTF-8 `str` takes the general path: converting it
            // makes an exception object.
            let utf8 = key.cast::<PyString>().is_ok_and(|k| k.to_str().is_ok());
            if total >= DETACH_AT || !utf8 {
                return Ok(false);
            }
            batch.push((AgentId::STRANGER, list, key));
        }
        {
            let agents = lock(self.py, self.agents);
            for (agent, _, key) in &mut batch {
                // Converted above: the UTF-8 is at hand, nothing is allocated.
                if let Ok(Ok(name)) = key.cast::<PyString>().map(|k| k.to_str()) {
                    *agent = agents.lookup(name);
                }
            }
        }
        let mut producer_bound = Vec::new();
        self.tracker
            .feed_lists(self.py, &batch, &mut producer_bound);
        for (sender, message) in producer_bound {
            if let Some((_, _, key)) = batch.get(sender) {
                let pair = PyTuple::new(self.py, [key.clone(), message])?;
                self.producer_bound.append(pair)?;
            }
        }
        Ok(true)
    }

    /// Feeds what is left; returns the producer-bound messages of the whole call.
    pub(crate) fn finish(mut self) -> PyResult<Bound<'py, PyList>> {
        self.flush()?;
        Ok(self.producer_bound)
    }

    /// The agent number of a key: a `str` that a registration named, else [`AgentId::STRANGER`].
    fn agent(&self, key: &Bound<'py, PyAny>) -> AgentId {
        // To UTF-8 before the names lock: a failed conversion makes an exception object,
        // which may start a collection (and run finalizers).
        match key.cast::<PyString>().ok().and_then(|k| k.to_str().ok()) {
            Some(name) => lock(self.py, self.agents).lookup(name),
            None => AgentId::STRANGER,
        }
    }

    /// Reads one value, the messages of `key`: a `list` element by element, a `bytes`,
    /// `bytearray`, `memoryview` or `str` as one message, anything else iterable element
    /// by element, anything else as one message. Only `bytes` messages are fed; the rest
    /// are counted as not bytes.
    fn value(&mut self, key: Bound<'py, PyAny>, value: &Bound<'py, PyAny>) -> PyResult<()> {
        let agent = self.agent(&key);
        let sender = self.keys.len();
        self.keys.push((key, agent));
        if let Ok(list) = value.cast::<PyList>() {
            self.chunk.reserve(list.len().min(CHUNK));
            return list.iter().try_for_each(|m| self.message(sender, m));
        }
        let single = value.is_instance_of::<PyBytes>()
            || value.is_instance_of::<PyByteArray>()
            || value.is_instance_of::<PyMemoryView>()
            || value.is_instance_of::<PyString>();
        match value.try_iter() {
            Ok(items) if !single => items.into_iter().try_for_each(|m| self.message(sender, m?)),
            _ => self.message(sender, value.clone()),
        }
    }

    fn message(&mut self, sender: usize, message: Bound<'py, PyAny>) -> PyResult<()> {
        match message.cast_into::<PyBytes>() {
            Ok(bytes) => self.chunk.push((sender, bytes)),
            Err(_) => self.not_bytes += 1,
        }
        if self.chunk.len() >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    /// Feeds the chunk read so far.
    fn flush(&mut self) -> PyResult<()> {
        if self.chunk.is_empty() && self.not_bytes == 0 {
            return Ok(());
        }
        // Taken first: whatever happens below, these messages are fed once.
        let chunk = std::mem::take(&mut self.chunk);
        let messages: Vec<Message<'_>> = chunk
            .iter()
            .map(|(sender, bytes)| {
                let agent = self.keys.get(*sender).map_or(AgentId::STRANGER, |k| k.1);
                (agent, bytes.as_bytes())
            })
            .collect();
        let mut producer_bound = Vec::new();
        self.tracker
            .feed(self.py, &messages, self.not_bytes, &mut producer_bound);
        drop(messages);
        self.not_bytes = 0;
        for at in producer_bound {
            if let Some((sender, message)) = chunk.get(at)
                && let Some((key, _)) = self.keys.get(*sender)
            {
                let pair = PyTuple::new(self.py, [key.clone(), message.clone().into_any()])?;
                self.producer_bound.append(pair)?;
            }
        }
        // The allocation is kept for the next chunk.
        self.chunk = chunk;
        self.chunk.clear();
        Ok(())
    }
}
