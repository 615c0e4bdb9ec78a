//! `kvdrain-floor`: the cheapest thing a per-request notification counter can do.
//!
//! Per notification, [`Floor::notify`] finds the last `:`, hashes the bytes before it
//! with FxHash into a `u64` key, looks the key up in a pre-sized `HashMap` and
//! decrements that entry's counter; when the counter reaches 0 it is reset to the
//! expected count (the request is "re-registered" so the same number stay in flight).
//!
//! That is a floor, not a tracker: the TP field is not parsed, `PUSH_FAIL:` is not
//! recognised (such a message hashes to an unknown key and is dropped), ids are not
//! compared (two ids with the same 64-bit hash share an entry), duplicates are not
//! detected and there are no deadlines. Anything kvdrain does per message beyond this
//! is overhead relative to the floor.
//!
//! [`stream`] holds the message generator shared (byte for byte) with
//! `bench/vllm_baseline.py`; the rule is documented there and in `bench/README.md`.
//!
//! No dependencies and no `unsafe`, so the floor can be moved into another harness as is.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash as in `rustc-hash` 1.x: per word, `hash = (hash.rotl(5) ^ word) * K`.
///
/// [`Hasher::write`] consumes 8-byte little-endian words, then a 4-, 2- and 1-byte
/// tail, like `rustc-hash` does on a 64-bit little-endian target (where `usize` is
/// 64 bits). Integers written with `write_u*` are one word each.
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

/// The FxHash multiplier (`rustc-hash`'s 64-bit seed).
pub const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add_to_hash(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add_to_hash(u64::from_le_bytes(word));
        }
        let mut rest = chunks.remainder();
        if rest.len() >= 4 {
            self.add_to_hash(u64::from(u32::from_le_bytes([
                rest[0], rest[1], rest[2], rest[3],
            ])));
            rest = &rest[4..];
        }
        if rest.len() >= 2 {
            self.add_to_hash(u64::from(u16::from_le_bytes([rest[0], rest[1]])));
            rest = &rest[2..];
        }
        if let Some(&byte) = rest.first() {
            self.add_to_hash(u64::from(byte));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add_to_hash(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add_to_hash(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add_to_hash(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add_to_hash(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add_to_hash(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// `BuildHasher` for [`FxHasher`].
pub type FxBuildHasher = BuildHasherDefault<FxHasher>;

/// FxHash of an id's raw bytes (no length prefix, unlike `<[u8] as Hash>::hash`).
#[inline]
pub fn hash_id(id: &[u8]) -> u64 {
    let mut hasher = FxHasher::default();
    hasher.write(id);
    hasher.finish()
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
            map: HashMap::with_capacity_and_hasher(capacity, FxBuildHasher::default()),
        }
    }

    /// Registers `id`, expecting `expected` notifications per generation (0 is
    /// treated as 1). Returns `false` when the id's key was already present; its
    /// entry is then replaced.
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

    /// Counts one notification `{id}:{anything}`. Returns `true` when it completed
    /// its request (the counter reached 0 and was reset to the expected count),
    /// `false` otherwise, including for messages without `:` and unknown ids.
    #[inline]
    pub fn notify(&mut self, msg: &[u8]) -> bool {
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

pub mod stream {
    //! The benchmark message stream, identical to `bench/vllm_baseline.py`'s.
    //!
    //! * ids `req-{i:08x}-cmpl` for `i` in `0..R`;
    //! * xorshift64* seeded with `S` (0 is replaced by [`DEFAULT_SEED`]);
    //! * message `k` goes to request `(k / E) % R`;
    //! * one draw `r = next()` per message: `r % 10000 < fail_share * 10000.0`
    //!   gives `PUSH_FAIL:{id}:{E}`, otherwise `{id}:{E}`.

    /// Default PRNG seed (the 64-bit golden ratio).
    pub const DEFAULT_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

    /// Failure-notice prefix (`PUSH_FAIL_NOTIF_PREFIX` upstream).
    pub const PUSH_FAIL_PREFIX: &[u8] = b"PUSH_FAIL:";

    /// xorshift64* (Vigna 2016): shifts 12, 25, 27 and multiplier `0x2545F4914F6CDD1D`.
    #[derive(Debug, Clone)]
    pub struct XorShift64Star {
        state: u64,
    }

    impl XorShift64Star {
        /// Seeds the generator; a zero seed becomes [`DEFAULT_SEED`].
        pub fn new(seed: u64) -> Self {
            Self {
                state: if seed == 0 { DEFAULT_SEED } else { seed },
            }
        }

        /// Next 64-bit output.
        #[allow(clippy::should_implement_trait)]
        pub fn next(&mut self) -> u64 {
            let mut x = self.state;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.state = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    /// The id of request `i`.
    pub fn request_id(i: usize) -> String {
        format!("req-{i:08x}-cmpl")
    }

    /// Generation parameters.
    #[derive(Debug, Clone, Copy)]
    pub struct Params {
        /// R: requests in flight.
        pub inflight: usize,
        /// E: notifications (edges) per request, also the TP field.
        pub edges: usize,
        /// M: messages in the stream.
        pub notifications: usize,
        /// Probability of a failure notice instead of a completion.
        pub fail_share: f64,
        /// PRNG seed.
        pub seed: u64,
    }

    /// All messages back to back in one buffer, so reading them allocates nothing.
    #[derive(Debug, Clone, Default)]
    pub struct Stream {
        bytes: Vec<u8>,
        ends: Vec<usize>,
        failures: usize,
    }

    impl Stream {
        /// Number of messages.
        pub fn len(&self) -> usize {
            self.ends.len()
        }

        /// Whether the stream is empty.
        pub fn is_empty(&self) -> bool {
            self.ends.is_empty()
        }

        /// Number of failure notices in the stream.
        pub fn failures(&self) -> usize {
            self.failures
        }

        /// Message `k`.
        pub fn get(&self, k: usize) -> Option<&[u8]> {
            let end = *self.ends.get(k)?;
            let start = if k == 0 { 0 } else { self.ends[k - 1] };
            Some(&self.bytes[start..end])
        }

        /// The messages in order.
        pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
            let mut start = 0;
            self.ends.iter().map(move |&end| {
                let msg = &self.bytes[start..end];
                start = end;
                msg
            })
        }
    }

    /// Builds the stream for `p` (R and E must be at least 1).
    pub fn generate(p: &Params) -> Stream {
        assert!(
            p.inflight >= 1 && p.edges >= 1,
            "inflight and edges must be >= 1"
        );
        let ids: Vec<String> = (0..p.inflight).map(request_id).collect();
        let tp = p.edges.to_string();
        let threshold = p.fail_share * 10000.0;
        let mut rng = XorShift64Star::new(p.seed);
        let mut out = Stream {
            bytes: Vec::with_capacity(p.notifications * (ids[0].len() + tp.len() + 12)),
            ends: Vec::with_capacity(p.notifications),
            failures: 0,
        };
        for k in 0..p.notifications {
            let id = &ids[(k / p.edges) % p.inflight];
            // `r % 10000` is exact as an f64, so the comparison matches Python's
            // int-vs-float comparison bit for bit.
            if ((rng.next() % 10000) as f64) < threshold {
                out.bytes.extend_from_slice(PUSH_FAIL_PREFIX);
                out.failures += 1;
            }
            out.bytes.extend_from_slice(id.as_bytes());
            out.bytes.push(b':');
            out.bytes.extend_from_slice(tp.as_bytes());
            out.ends.push(out.bytes.len());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::stream::{self, Params, XorShift64Star};
    use super::*;

    #[test]
    fn fxhash_matches_the_reference_formula() {
        // One word: (0.rotl(5) ^ w) * K.
        let mut h = FxHasher::default();
        h.write_u64(0x1234);
        assert_eq!(h.finish(), 0x1234u64.wrapping_mul(FX_SEED));
        // 8 + 4 + 2 + 1 bytes: four words, little-endian.
        let bytes = *b"abcdefghijklmno";
        let mut want = 0u64;
        for w in [
            u64::from_le_bytes(*b"abcdefgh"),
            u64::from(u32::from_le_bytes(*b"ijkl")),
            u64::from(u16::from_le_bytes(*b"mn")),
            u64::from(b'o'),
        ] {
            want = (want.rotate_left(5) ^ w).wrapping_mul(FX_SEED);
        }
        assert_eq!(hash_id(&bytes), want);
        assert_eq!(hash_id(b""), 0);
    }

    #[test]
    fn memrchr_finds_the_last_colon() {
        assert_eq!(memrchr(b':', b"a:b:c"), Some(3));
        assert_eq!(memrchr(b':', b"abc"), None);
        assert_eq!(memrchr(b':', b""), None);
        assert_eq!(memrchr(b':', b":"), Some(0));
    }

    #[test]
    fn notify_counts_down_and_rearms() {
        let mut f = Floor::with_capacity(4);
        assert!(f.register(b"req-a", 2));
        assert!(!f.register(b"req-a", 2));
        assert!(!f.notify(b"req-a:2"));
        assert!(f.notify(b"req-a:2"));
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
        // Unknown ids, no colon, and (by design) failure notices are dropped.
        assert!(!f.notify(b"req-b:2"));
        assert!(!f.notify(b"req-a"));
        assert!(!f.notify(b"PUSH_FAIL:req-a:2"));
        assert_eq!(
            f.get(b"req-a"),
            Some(Entry {
                remaining: 2,
                expected: 2
            })
        );
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
    fn xorshift_reference_values() {
        // Same values as bench/vllm_baseline.py's XorShift64Star(DEFAULT_SEED).
        let mut rng = XorShift64Star::new(stream::DEFAULT_SEED);
        assert_eq!(rng.next(), 0x0d83_b3e2_9a21_487a);
        assert_eq!(rng.next(), 0x54c4_4c79_f1fe_9d67);
        assert_eq!(rng.next(), 0xa845_f342_007a_0e78);
        let mut zero = XorShift64Star::new(0);
        assert_eq!(zero.next(), 0x0d83_b3e2_9a21_487a);
    }

    #[test]
    fn stream_matches_the_python_rule() {
        let p = Params {
            inflight: 4,
            edges: 2,
            notifications: 12,
            fail_share: 0.5,
            seed: 0,
        };
        let s = stream::generate(&p);
        let got: Vec<&[u8]> = s.iter().collect();
        // Produced by `generate(4, 2, 12, 0.5, DEFAULT_SEED)` in vllm_baseline.py.
        let want: [&[u8]; 12] = [
            b"PUSH_FAIL:req-00000000-cmpl:2",
            b"PUSH_FAIL:req-00000000-cmpl:2",
            b"req-00000001-cmpl:2",
            b"req-00000001-cmpl:2",
            b"req-00000002-cmpl:2",
            b"PUSH_FAIL:req-00000002-cmpl:2",
            b"PUSH_FAIL:req-00000003-cmpl:2",
            b"PUSH_FAIL:req-00000003-cmpl:2",
            b"req-00000000-cmpl:2",
            b"req-00000000-cmpl:2",
            b"req-00000001-cmpl:2",
            b"req-00000001-cmpl:2",
        ];
        assert_eq!(got, want);
        assert_eq!(s.failures(), 5);
        assert_eq!(s.get(11), Some(&b"req-00000001-cmpl:2"[..]));
        assert_eq!(s.get(12), None);
    }

    #[test]
    fn without_failures_every_pass_completes_every_request() {
        let p = Params {
            inflight: 64,
            edges: 3,
            notifications: 64 * 3 * 5,
            fail_share: 0.0,
            seed: 7,
        };
        let s = stream::generate(&p);
        let mut f = Floor::with_capacity(p.inflight);
        for i in 0..p.inflight {
            f.register(stream::request_id(i).as_bytes(), p.edges as u32);
        }
        let done = s.iter().filter(|m| f.notify(m)).count();
        assert_eq!(done, p.notifications / p.edges);
    }
}
