//! Producer agent names ↔ the core's [`AgentId`]s.
//!
//! NIXL identifies a notification's sender only by its agent name (`docs/nixl.md#sender`);
//! the core counts named edges by [`AgentId`]. Names are interned when the consumer loads a
//! producer's metadata, never from incoming traffic: a sender nobody introduced maps to
//! [`AgentId::STRANGER`], which matches no edge, so garbage senders create no state.

use std::collections::HashMap;
use std::sync::Arc;

use kvdrain::AgentId;

/// The name ↔ id table of one consumer.
#[derive(Debug, Default)]
pub struct AgentDirectory {
    ids: HashMap<String, AgentId>,
    /// Shared with the records of decisions ([`crate::consumer::DecisionRecord`]).
    names: Vec<Arc<str>>,
}

/// The directory holds [`AgentDirectory::CAPACITY`] names already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent directory full; cannot name {0:?}")]
pub struct DirectoryFull(pub String);

impl AgentDirectory {
    /// Most names a directory holds.
    pub const CAPACITY: usize = u16::MAX as usize;

    /// The id of `name`, assigning the next free one the first time.
    ///
    /// # Errors
    /// [`DirectoryFull`] once [`Self::CAPACITY`] names are known.
    pub fn intern(&mut self, name: &str) -> Result<AgentId, DirectoryFull> {
        if let Some(&id) = self.ids.get(name) {
            return Ok(id);
        }
        let id = u16::try_from(self.names.len())
            .ok()
            .filter(|&i| i != AgentId::STRANGER.0)
            .map(AgentId)
            .ok_or_else(|| DirectoryFull(name.to_owned()))?;
        self.ids.insert(name.to_owned(), id);
        self.names.push(Arc::from(name));
        Ok(id)
    }

    /// The id of a known name.
    pub fn get(&self, name: &str) -> Option<AgentId> {
        self.ids.get(name).copied()
    }

    /// The id of `name`, or [`AgentId::STRANGER`].
    pub fn id_or_stranger(&self, name: &str) -> AgentId {
        self.get(name).unwrap_or(AgentId::STRANGER)
    }

    /// The name of `id`.
    pub fn name(&self, id: AgentId) -> Option<&str> {
        self.names.get(usize::from(id.0)).map(|n| &**n)
    }

    /// The name of `id`, shared (a reference count, no copy of the name).
    pub fn shared_name(&self, id: AgentId) -> Option<Arc<str>> {
        self.names.get(usize::from(id.0)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interns_stably_and_strangers_stay_strangers() {
        let mut d = AgentDirectory::default();
        let a = d.intern("p0").unwrap();
        assert_eq!(d.intern("p1").unwrap(), AgentId(1));
        assert_eq!(d.intern("p0").unwrap(), a);
        assert_eq!(d.name(a), Some("p0"));
        assert_eq!(d.shared_name(a).as_deref(), Some("p0"));
        assert_eq!(d.shared_name(AgentId::STRANGER), None);
        assert_eq!(d.id_or_stranger("who"), AgentId::STRANGER);
        assert_eq!(d.get("who"), None);
    }
}
