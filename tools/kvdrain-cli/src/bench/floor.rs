//! The floor: the cheapest thing a per-request notification counter can do.
//!
//! Per notification, [`Floor::notify`] strips a `PUSH_FAIL:` prefix, finds the last `:`,
//! hashes the bytes before it into a `u64` key, looks the key up in a pre-sized
//! `HashMap` and decrements that entry's counter; when the counter reaches 0 it is reset
//! to the expected count (the request is "re-registered", so the same number stay in
//! flight).
//!
//! The hasher is `rustc-hash` 2.x's `FxHasher` (what `FxHashMap` is today): its byte
//! hash for the id and its word step plus the final `rotate_left(26)` for the map. The
//! first floor used `rustc-hash` 1.x's algorithm, whose low key bits barely change
//! across these ids (`req-{i:08x}-cmpl`): for R = 4096 the keys landed on 32 of the
//! map's 8192 home buckets and the "floor" paid for long probe sequences (~15 ns instead
//! of ~10 ns). A floor must not be slowed down by a weak hash, so it uses the better one.
//!
//! It is a floor, not a tracker: the TP field is not parsed, a failure notice counts like
//! a completion (no failure flag), ids are not compared (two ids with the same 64-bit
//! hash share an entry), duplicates are not detected and there are no deadlines.
//! Anything kvdrain does per message beyond this is overhead relative to the floor.

use std::collections::HashMap;
use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;

use super::stream::PUSH_FAIL_PREFIX;

/// `rustc-hash` 2.x hash of an id's raw bytes.
#[inline]
pub fn hash_id(id: &[u8]) -> u64 {
    FxBuildHasher.hash_one(id)
}

/// Index of the last `needle` in `haystack` (a hand-written `memrchr`).
#[inline]
pub fn memrchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().rposition(|&b| b == needle)
}

/// One request's counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Notifications still missing in the current generation.
    pub remaining: u32,
    /// Notifications per generation; `remaining` is reset to it on completion.
    pub expected: u32,
}

/// The floor: one hash and one counter update per notification.
#[derive(Debug, Clone)]
pub struct Floor {
    map: HashMap<u64, Entry, FxBuildHasher>,
}

impl Floor {
    /// A floor with room for `capacity` requests, so registering that many never
    /// reallocates.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            map: HashMap::with_capacity_and_hasher(capacity, FxBuildHasher),
        }
    }

    /// Registers `id`, expecting `expected` notifications per generation (0 is treated
    /// as 1). Returns `false` when the id's key was already present; its entry is then
    /// replaced.
    pub fn register(&mut self, id: &[u8], expected: u32) -> bool {
        let expected = expected.max(1);
        self.map
            .insert(
                hash_id(id),
                Entry {
                    remaining: expected,
                    expected,
                },
            )
            .is_none()
    }

    /// Counts one notification `[PUSH_FAIL:]{id}:{anything}`. Returns `true` when it
    /// completed its request (the counter reached 0 and was reset to the expected
    /// count), `false` otherwise, including for messages without `:` and unknown ids.
    #[inline]
    pub fn notify(&mut self, msg: &[u8]) -> bool {
        let msg = msg.strip_prefix(PUSH_FAIL_PREFIX).unwrap_or(msg);
        let Some(colon) = memrchr(b':', msg) else {
            return false;
        };
        let Some(entry) = self.map.get_mut(&hash_id(&msg[..colon])) else {
            return false;
        };
        entry.remaining -= 1;
        if entry.remaining == 0 {
            entry.remaining = entry.expected;
            true
        } else {
            false
        }
    }

    /// The entry registered for `id`, if any.
    pub fn get(&self, id: &[u8]) -> Option<Entry> {
        self.map.get(&hash_id(id)).copied()
    }

    /// Number of registered requests.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no request is registered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Current capacity of the underlying map.
    pub fn capacity(&self) -> usize {
        self.map.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::super::stream::{self, Params};
    use super::*;

    #[test]
    fn memrchr_finds_the_last_colon() {
        assert_eq!(memrchr(b':', b"a:b:c"), Some(3));
        assert_eq!(memrchr(b':', b"abc"), None);
        assert_eq!(memrchr(b':', b""), None);
        assert_eq!(memrchr(b':', b":"), Some(0));
    }

    #[test]
    fn hash_spreads_the_benchmark_ids_over_home_buckets() {
        // The rustc-hash 1.x artefact: 4096 ids on 32 of 8192 buckets. Now the map's own
        // hash of the key (Fx word step + rotate) must use most of the low bits.
        let mut homes = std::collections::HashSet::new();
        for i in 0..4096 {
            let key = hash_id(stream::request_id(i).as_bytes());
            homes.insert(FxBuildHasher.hash_one(key) & 8191);
        }
        assert!(homes.len() > 2500, "{} home buckets", homes.len());
    }

    #[test]
    fn notify_counts_down_and_rearms() {
        let mut f = Floor::with_capacity(4);
        assert!(f.register(b"req-a", 2));
        assert!(!f.register(b"req-a", 2));
        assert!(!f.notify(b"req-a:2"));
        // A failure notice counts like a completion.
        assert!(f.notify(b"PUSH_FAIL:req-a:2"));
        assert_eq!(
            f.get(b"req-a"),
            Some(Entry {
                remaining: 2,
                expected: 2
            })
        );
        // Ids with colons: the id is everything before the last colon.
        assert!(f.register(b"a:b", 1));
        assert!(f.notify(b"a:b:7"));
        // Unknown ids and messages without a colon are dropped.
        assert!(!f.notify(b"req-b:2"));
        assert!(!f.notify(b"req-a"));
        assert_eq!(f.get(b"req-a").map(|e| e.remaining), Some(2));
        // Zero expected is treated as one.
        assert!(f.register(b"z", 0));
        assert!(f.notify(b"z:1"));
    }

    #[test]
    fn registering_capacity_requests_does_not_grow() {
        let mut f = Floor::with_capacity(4096);
        let cap = f.capacity();
        for i in 0..4096 {
            assert!(f.register(stream::request_id(i).as_bytes(), 2));
        }
        assert_eq!(f.capacity(), cap);
        assert_eq!(f.len(), 4096);
    }

    #[test]
    fn every_pass_completes_every_request_failures_included() {
        let p = Params {
            inflight: 64,
            edges: 3,
            notifications: 64 * 3 * 5,
            fail_share: 0.1,
            seed: 7,
        };
        let s = stream::generate(&p);
        assert!(s.failures() > 0);
        let mut f = Floor::with_capacity(p.inflight);
        for i in 0..p.inflight {
            f.register(stream::request_id(i).as_bytes(), p.edges as u32);
        }
        let done = s.iter().filter(|m| f.notify(m)).count();
        assert_eq!(done, p.notifications / p.edges);
    }
}
