//! Pairing a consumer's registration with a producer's finished request (catalogue F10).
//!
//! vLLM randomizes request ids per engine by appending `-` and 8 hex digits, so P's and D's
//! ids for one client request differ in that suffix. A registration pairs with a finished
//! request, in this order:
//!
//! 1. by **exact id**: D's `request_id` equals P's request id;
//! 2. by **`transfer_id`**: the registration's router-assigned `transfer_id` equals the
//!    offer's `transfer_id` or P's request id;
//! 3. by **base id**: both ids with a trailing `-` + 8 hex digits stripped, compared
//!    case-insensitively ([`base_id`]). Compatibility only: two requests with one base id
//!    are ambiguous, so a base id held by two entries pairs with neither.
//!
//! [`PairingTable`] holds entries of one side (offers, or stashed registrations) under all
//! three keys with keyed lookups (no scan) and a fixed capacity.

use std::collections::HashMap;

/// `id` without a trailing `-` + 8 hex digits, lower-cased (vLLM's
/// `get_base_request_id`, made case-insensitive).
pub fn base_id(id: &str) -> String {
    let bytes = id.as_bytes();
    let stripped = if bytes.len() > 9
        && bytes[bytes.len() - 9] == b'-'
        && bytes[bytes.len() - 8..].iter().all(u8::is_ascii_hexdigit)
    {
        &id[..id.len() - 9]
    } else {
        id
    };
    stripped.to_ascii_lowercase()
}

/// The keys an entry can be found by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairingKeys {
    /// The entry's own request id.
    pub id: String,
    /// A router-assigned `transfer_id`, if any.
    pub transfer_id: Option<String>,
}

impl PairingKeys {
    /// Keys of an entry.
    pub fn new(id: &str, transfer_id: Option<&str>) -> Self {
        PairingKeys {
            id: id.to_owned(),
            transfer_id: transfer_id.map(str::to_owned),
        }
    }
}

/// The table is full; the entry is handed back.
#[derive(Debug, PartialEq, Eq)]
pub struct TableFull<T>(pub PairingKeys, pub T);

/// Entries of one side under their exact id, `transfer_id` and base id.
#[derive(Debug)]
pub struct PairingTable<T> {
    capacity: usize,
    entries: HashMap<String, (PairingKeys, T)>,
    by_transfer: HashMap<String, String>,
    /// Base id → the one id holding it, or `None` if two do (ambiguous).
    by_base: HashMap<String, Option<String>>,
}

impl<T> PairingTable<T> {
    /// An empty table holding at most `capacity` entries (space reserved now).
    pub fn with_capacity(capacity: usize) -> Self {
        PairingTable {
            capacity,
            entries: HashMap::with_capacity(capacity),
            by_transfer: HashMap::with_capacity(capacity),
            by_base: HashMap::with_capacity(capacity),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether an entry with this exact id is held.
    pub fn contains(&self, id: &str) -> bool {
        self.entries.contains_key(id)
    }

    /// Inserts an entry; an entry with the same id is replaced.
    ///
    /// # Errors
    /// [`TableFull`] with the entry when the table holds `capacity` others.
    pub fn insert(&mut self, keys: PairingKeys, value: T) -> Result<(), TableFull<T>> {
        if !self.entries.contains_key(&keys.id) && self.entries.len() >= self.capacity {
            return Err(TableFull(keys, value));
        }
        self.remove(&keys.id.clone());
        if let Some(t) = &keys.transfer_id {
            self.by_transfer.insert(t.clone(), keys.id.clone());
        }
        self.by_base
            .entry(base_id(&keys.id))
            .and_modify(|holder| *holder = None)
            .or_insert_with(|| Some(keys.id.clone()));
        self.entries.insert(keys.id.clone(), (keys, value));
        Ok(())
    }

    /// The id of the entry `keys` pairs with: exact id, then `transfer_id` (against the
    /// entries' `transfer_id`s and ids), then an unambiguous base id.
    pub fn find(&self, keys: &PairingKeys) -> Option<&str> {
        if let Some((k, _)) = self.entries.get(&keys.id) {
            return Some(&k.id);
        }
        if let Some(t) = &keys.transfer_id {
            if let Some(id) = self.by_transfer.get(t) {
                return Some(id);
            }
            if let Some((k, _)) = self.entries.get(t) {
                return Some(&k.id);
            }
        }
        // The other side's transfer_id may be our id.
        if let Some(id) = self.by_transfer.get(&keys.id) {
            return Some(id);
        }
        match self.by_base.get(&base_id(&keys.id)) {
            Some(Some(id)) => Some(id),
            _ => None,
        }
    }

    /// The entry with exact id `id`, mutably.
    pub fn get_mut_exact(&mut self, id: &str) -> Option<&mut T> {
        self.entries.get_mut(id).map(|(_, v)| v)
    }

    /// The entry paired with `keys`, if any.
    pub fn get(&self, keys: &PairingKeys) -> Option<&T> {
        let id = self.find(keys)?;
        self.entries.get(id).map(|(_, v)| v)
    }

    /// Takes the entry `keys` pairs with out of the table.
    pub fn take(&mut self, keys: &PairingKeys) -> Option<(PairingKeys, T)> {
        let id = self.find(keys)?.to_owned();
        self.remove(&id)
    }

    /// Removes the entry with exact id `id`.
    pub fn remove(&mut self, id: &str) -> Option<(PairingKeys, T)> {
        let (keys, value) = self.entries.remove(id)?;
        if let Some(t) = &keys.transfer_id {
            if self.by_transfer.get(t).is_some_and(|held| held == id) {
                self.by_transfer.remove(t);
            }
        }
        let base = base_id(id);
        if let Some(Some(held)) = self.by_base.get(&base) {
            if held == id {
                self.by_base.remove(&base);
            }
        }
        Some((keys, value))
    }

    /// Iterates over the held entries (no order).
    pub fn iter(&self) -> impl Iterator<Item = (&PairingKeys, &T)> {
        self.entries.values().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_id_strips_only_a_dash_and_eight_hex_digits() {
        assert_eq!(base_id("cmpl-abc-0-1a2B3c4D"), "cmpl-abc-0");
        assert_eq!(base_id("cmpl-abc-0-1a2b3c4"), "cmpl-abc-0-1a2b3c4");
        assert_eq!(base_id("cmpl-abc-0-1a2b3c4g"), "cmpl-abc-0-1a2b3c4g");
        assert_eq!(base_id("cmpl-abc-0_1a2b3c4d"), "cmpl-abc-0_1a2b3c4d");
        assert_eq!(
            base_id("-1a2b3c4d"),
            "-1a2b3c4d",
            "nothing before the suffix"
        );
        assert_eq!(base_id("CMPL-X"), "cmpl-x");
    }

    #[test]
    fn pairs_by_exact_then_transfer_then_base() {
        let mut t = PairingTable::with_capacity(8);
        t.insert(PairingKeys::new("cmpl-u-0-aaaaaaaa", Some("xfer-9")), 1)
            .unwrap();
        t.insert(PairingKeys::new("exact", None), 2).unwrap();
        // Exact.
        assert_eq!(t.get(&PairingKeys::new("exact", None)), Some(&2));
        // transfer_id against the entry's transfer_id.
        assert_eq!(t.get(&PairingKeys::new("other", Some("xfer-9"))), Some(&1));
        // transfer_id against the entry's id.
        assert_eq!(t.get(&PairingKeys::new("zzz", Some("exact"))), Some(&2));
        // Base id, vLLM's per-engine suffixes differing, case-insensitive.
        assert_eq!(
            t.get(&PairingKeys::new("CMPL-U-0-BBBBBBBB", None)),
            Some(&1)
        );
        assert_eq!(t.get(&PairingKeys::new("cmpl-u-1-aaaaaaaa", None)), None);
        assert_eq!(
            t.take(&PairingKeys::new("cmpl-u-0-cccccccc", None)),
            Some((PairingKeys::new("cmpl-u-0-aaaaaaaa", Some("xfer-9")), 1))
        );
        assert_eq!(t.get(&PairingKeys::new("x", Some("xfer-9"))), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn ambiguous_base_pairs_with_nothing_and_full_table_hands_back() {
        let mut t = PairingTable::with_capacity(2);
        t.insert(PairingKeys::new("r-0-aaaaaaaa", None), 1).unwrap();
        t.insert(PairingKeys::new("r-0-bbbbbbbb", None), 2).unwrap();
        assert_eq!(t.get(&PairingKeys::new("r-0-cccccccc", None)), None);
        assert_eq!(t.get(&PairingKeys::new("r-0-bbbbbbbb", None)), Some(&2));
        assert_eq!(
            t.insert(PairingKeys::new("third", None), 3),
            Err(TableFull(PairingKeys::new("third", None), 3))
        );
        // Replacing an entry with the same id is not growth.
        assert!(t.insert(PairingKeys::new("r-0-aaaaaaaa", None), 4).is_ok());
    }
}
