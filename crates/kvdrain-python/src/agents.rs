//! Producer agent names (the keys of NIXL's `get_new_notifs()` dict) ↔ the core's
//! [`AgentId`] numbers.
//!
//! Names get a number when an accepted registration names them (a refused one gives the
//! numbers it took back, so refusals cannot use them up); a sender that no registration
//! ever named is [`AgentId::STRANGER`], which no edge can match (so in named-edge mode its notices
//! are `unexpected_sender`, and in counting mode the sender does not matter).

use std::collections::HashMap;

use kvdrain::AgentId;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// Names interned so far, both ways.
#[derive(Debug, Default)]
pub(crate) struct AgentTable {
    by_name: HashMap<String, u16>,
    names: Vec<Py<PyString>>,
}

/// Every number below [`AgentId::STRANGER`] is taken.
#[derive(Debug)]
pub(crate) struct AgentsExhausted;

impl AgentTable {
    /// The number of `name`, or [`AgentId::STRANGER`] if no registration named it.
    pub(crate) fn lookup(&self, name: &str) -> AgentId {
        self.by_name
            .get(name)
            .map_or(AgentId::STRANGER, |&n| AgentId(n))
    }

    /// The number of `name` (whose text is `text`), giving it the next free one if it has
    /// none.
    pub(crate) fn intern(
        &mut self,
        name: &Bound<'_, PyString>,
        text: &str,
    ) -> Result<AgentId, AgentsExhausted> {
        if let Some(&n) = self.by_name.get(text) {
            return Ok(AgentId(n));
        }
        let Ok(n) = u16::try_from(self.names.len()) else {
            return Err(AgentsExhausted);
        };
        if n == AgentId::STRANGER.0 {
            return Err(AgentsExhausted);
        }
        self.by_name.insert(text.to_owned(), n);
        self.names.push(name.clone().unbind());
        Ok(AgentId(n))
    }

    /// Names interned so far.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// Forgets the names numbered `len..` (those a refused registration interned: nothing
    /// refers to their numbers). Returns their objects, to be dropped with no lock held.
    pub(crate) fn truncate(&mut self, py: Python<'_>, len: usize) -> Vec<Py<PyString>> {
        let forgotten = self.names.split_off(len.min(self.names.len()));
        for name in &forgotten {
            if let Ok(text) = name.bind(py).to_str() {
                self.by_name.remove(text);
            }
        }
        forgotten
    }

    /// The name of an interned number.
    pub(crate) fn name(&self, py: Python<'_>, agent: AgentId) -> Option<Py<PyString>> {
        self.names
            .get(usize::from(agent.0))
            .map(|n| n.clone_ref(py))
    }
}
