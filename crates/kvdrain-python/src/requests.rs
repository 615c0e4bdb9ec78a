//! The engine side's table of live registrations, by the core's request key, and what it
//! keeps of each ([`Entry`]).
//!
//! Keys grow by one with every accepted registration, so the live ones are nearly
//! contiguous: a ring of `2·N` places indexed by `key mod 2·N` finds almost every request
//! with one array access and no hashing. A request that is still live when its place is
//! needed again (one that waits through a quarantine while `2·N` newer requests arrive)
//! moves to a small overflow map.

use std::collections::HashMap;
use std::sync::Arc;

use kvdrain::AgentId;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// The named edges of a registration (`None`: counting mode).
pub(crate) type Agents = Option<Arc<[AgentId]>>;

/// What the engine side keeps of a registration until its last decision.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: Py<PyString>,
    pub(crate) blocks: Py<PyAny>,
    /// Named-edge mode: the agents in registration order (bit `i` of
    /// [`Outstanding::Edges`](kvdrain::Outstanding::Edges) is `agents[i]`), shared by the requests registered together;
    /// empty in counting mode.
    pub(crate) agents: Agents,
}

impl Entry {
    pub(crate) fn clone_ref(&self, py: Python<'_>) -> Entry {
        Entry {
            id: self.id.clone_ref(py),
            blocks: self.blocks.clone_ref(py),
            agents: self.agents.clone(),
        }
    }
}

/// Live registrations: `(key, entry)` in a ring, the rare long-lived ones in `overflow`.
#[derive(Debug)]
pub(crate) struct Requests {
    /// Reserved fallibly at its full length, never grown.
    ring: Vec<Option<(u64, Entry)>>,
    mask: u64,
    overflow: HashMap<u64, Entry>,
}

impl Requests {
    /// A table for a ledger of `table_size` (a power of two) requests, or the bytes it
    /// needed if they could not be allocated.
    pub(crate) fn try_new(table_size: usize) -> Result<Self, usize> {
        let places = (table_size * 2).next_power_of_two();
        let mut ring = Vec::new();
        ring.try_reserve_exact(places)
            .map_err(|_| places * size_of::<Option<(u64, Entry)>>())?;
        ring.resize_with(places, || None);
        Ok(Requests {
            ring,
            mask: places as u64 - 1,
            overflow: HashMap::new(),
        })
    }

    fn place(&self, key: u64) -> usize {
        (key & self.mask) as usize
    }

    /// Adds the entry of a new registration.
    pub(crate) fn insert(&mut self, key: u64, entry: Entry) {
        let at = self.place(key);
        if let Some((old_key, old)) = self.ring[at].replace((key, entry)) {
            self.overflow.insert(old_key, old);
        }
    }

    /// The entry of `key`, if it is live.
    pub(crate) fn get(&self, key: u64) -> Option<&Entry> {
        match &self.ring[self.place(key)] {
            Some((k, entry)) if *k == key => Some(entry),
            _ => self.overflow.get(&key),
        }
    }

    /// Every live entry (for the garbage collector's traversal).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Entry> {
        let ring = self.ring.iter().flatten().map(|(_, entry)| entry);
        ring.chain(self.overflow.values())
    }

    /// Takes out every entry (the garbage collector breaks a cycle through this table).
    pub(crate) fn take_all(&mut self) -> Vec<Entry> {
        let ring = self
            .ring
            .iter_mut()
            .filter_map(Option::take)
            .map(|(_, e)| e);
        let mut all: Vec<Entry> = ring.collect();
        all.extend(self.overflow.drain().map(|(_, e)| e));
        all
    }

    /// Takes out the entry of `key` (its last decision was taken).
    pub(crate) fn remove(&mut self, key: u64) -> Option<Entry> {
        let at = self.place(key);
        match &self.ring[at] {
            Some((k, _)) if *k == key => self.ring[at].take().map(|(_, entry)| entry),
            _ => self.overflow.remove(&key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(py: Python<'_>, n: u64) -> Entry {
        Entry {
            id: pyo3::types::PyString::new(py, &n.to_string()).unbind(),
            blocks: py.None(),
            agents: None,
        }
    }

    fn id(e: Option<&Entry>, py: Python<'_>) -> Option<String> {
        e.map(|e| e.id.bind(py).to_string())
    }

    #[test]
    fn long_lived_entries_overflow_and_come_back() {
        Python::initialize();
        Python::attach(|py| {
            let mut r = Requests::try_new(2).expect("4 places"); // 4 places
            for k in 0..10 {
                r.insert(k, entry(py, k));
                if k != 1 {
                    assert_eq!(id(r.remove(k).as_ref(), py), Some(k.to_string()));
                }
            }
            // Key 1 was displaced by key 5 and then 9: it lives in the overflow map.
            assert_eq!(id(r.get(1), py), Some("1".into()));
            assert!(r.get(5).is_none() && r.remove(9).is_none());
            assert_eq!(id(r.remove(1).as_ref(), py), Some("1".into()));
            assert!(r.get(1).is_none() && r.overflow.is_empty());
        });
    }
}
