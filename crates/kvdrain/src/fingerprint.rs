//! Request-id fingerprints: the only form in which the tracker stores an id.
//!
//! A request id is hashed once per event into a 128-bit keyed fingerprint. Tables hold
//! fingerprints, never strings, which keeps a slot small and the ingest path free of
//! byte-by-byte comparisons of shared memory. The key is derived from a seed the engine
//! chooses ([`Config::seed`](crate::Config::seed)), so a peer cannot aim for a collision
//! without knowing it. Registration refuses a second live request with the same
//! fingerprint, so among tracked requests matching is exact.
//!
//! The two 64-bit halves are two independently keyed hashes of the same id: `lo` and `hi`
//! use disjoint key words, so an id pair collides in both only with probability about
//! 2⁻⁶⁴ · 2⁻⁶⁴. Each half absorbs 32 bytes per round with two folded 64×64→128-bit
//! multiplies (the step of wyhash-style hashes), the first of them chained through the
//! half's state; an id of up to 16 bytes takes one multiply per half, up to 32 bytes two,
//! and the four multiplies of a round are independent of each other, so the hash costs
//! about one multiply's latency per 32 bytes. The length is added last, multiplied by an
//! odd key word: two ids of different lengths whose words coincide can never collide.

use core::num::Wrapping;

/// A 128-bit keyed fingerprint of a request id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Fingerprint {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

/// The per-ledger hash key: ten words derived from the seed once, at construction, so a
/// fingerprint pays no key setup.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key {
    /// `lo`'s words: `[0]`, `[1]` for the first 16 bytes of a round, `[2]`, `[3]` for the
    /// second 16, `[4]` (odd) for the length.
    lo: [u64; 5],
    /// `hi`'s words, in the same roles.
    hi: [u64; 5],
}

impl Key {
    /// The key of `seed`: SplitMix64's sequence from it, so nearby seeds give unrelated
    /// keys and no key word is a simple function of another.
    pub(crate) fn from_seed(seed: u64) -> Self {
        let mut state = Wrapping(seed);
        let mut next = || {
            state += 0x9E37_79B9_7F4A_7C15;
            let mut z = state.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut lo = [0; 5].map(|_| next());
        let mut hi = [0; 5].map(|_| next());
        lo[4] |= 1;
        hi[4] |= 1;
        Key { lo, hi }
    }
}

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The 8 bytes at `at`, little-endian (a fixed-size copy: one load).
#[inline(always)]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The 4 bytes at `at`, little-endian.
#[inline(always)]
fn half(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    u64::from(u32::from_le_bytes(w))
}

/// The last 1 to 16 bytes of `id` (all of it when shorter) as two words, read with
/// overlapping loads rather than a byte loop or a variable-length copy. For a given
/// length every byte lands in `(x, y)` and the mapping is one-to-one; the length itself
/// is mixed in by the caller.
#[inline(always)]
fn tail(id: &[u8]) -> (u64, u64) {
    let len = id.len();
    if len >= 16 {
        (word(id, len - 16), word(id, len - 8))
    } else if len >= 8 {
        (word(id, 0), word(id, len - 8))
    } else if len >= 4 {
        (half(id, 0), half(id, len - 4))
    } else if len > 0 {
        let spread =
            u64::from(id[0]) | (u64::from(id[len / 2]) << 8) | (u64::from(id[len - 1]) << 16);
        (spread, 0)
    } else {
        (0, 0)
    }
}

/// One half's first 16 bytes of a round, chained through the half's `state`.
#[inline(always)]
fn first(k: &[u64; 5], state: u64, x0: u64, x1: u64) -> u64 {
    fold(x0 ^ k[0], x1 ^ k[1] ^ state)
}

/// One half's second 16 bytes of a round.
#[inline(always)]
fn second(k: &[u64; 5], x2: u64, x3: u64) -> u64 {
    fold(x2 ^ k[2], x3 ^ k[3])
}

impl Fingerprint {
    /// Fingerprints `id` under `key`.
    #[inline(always)]
    pub(crate) fn of(key: &Key, id: &[u8]) -> Self {
        let (mut lo, mut hi) = (0u64, 0u64);
        // Whole 32-byte rounds, leaving the last 1 to 32 bytes.
        let mut at = 0;
        while id.len() - at > 32 {
            let (x0, x1) = (word(id, at), word(id, at + 8));
            let (x2, x3) = (word(id, at + 16), word(id, at + 24));
            lo = first(&key.lo, lo, x0, x1) ^ second(&key.lo, x2, x3);
            hi = first(&key.hi, hi, x0, x1) ^ second(&key.hi, x2, x3);
            at += 32;
        }
        // The last 1 to 32 bytes (all of `id` when shorter): above 16, the first and the
        // last 16 of them (overlapping), a full round; else `tail` of them, half a round.
        // For a given length the mapping is one-to-one; the length is mixed in below.
        let rest = &id[at..];
        if rest.len() > 16 {
            let r = rest.len();
            let (x0, x1) = (word(rest, 0), word(rest, 8));
            let (x2, x3) = (word(rest, r - 16), word(rest, r - 8));
            lo = first(&key.lo, lo, x0, x1) ^ second(&key.lo, x2, x3);
            hi = first(&key.hi, hi, x0, x1) ^ second(&key.hi, x2, x3);
        } else {
            let (x0, x1) = tail(rest);
            lo = first(&key.lo, lo, x0, x1);
            hi = first(&key.hi, hi, x0, x1);
        }
        let len = id.len() as u64;
        Fingerprint {
            lo: lo.wrapping_add(len.wrapping_mul(key.lo[4])),
            hi: hi.wrapping_add(len.wrapping_mul(key.hi[4])),
        }
    }

    /// The four 32-bit words the shared tables store.
    pub(crate) fn words(self) -> [u32; 4] {
        [
            self.lo as u32,
            (self.lo >> 32) as u32,
            self.hi as u32,
            (self.hi >> 32) as u32,
        ]
    }

    pub(crate) fn from_words(w: [u32; 4]) -> Self {
        Fingerprint {
            lo: u64::from(w[0]) | (u64::from(w[1]) << 32),
            hi: u64::from(w[2]) | (u64::from(w[3]) << 32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Fingerprint, Key};

    fn key(seed: u64) -> Key {
        Key::from_seed(seed)
    }

    #[test]
    fn differs_on_every_prefix_and_seed() {
        let id = b"cmpl-3f1c9a2e-0-1a2b3c4d:with:colons";
        let mut seen = std::collections::HashSet::new();
        for len in 0..=id.len() {
            for seed in 0..4u64 {
                assert!(seen.insert(Fingerprint::of(&key(seed), &id[..len])));
            }
        }
    }

    #[test]
    fn zero_padding_does_not_collide() {
        assert_ne!(
            Fingerprint::of(&key(1), b"a"),
            Fingerprint::of(&key(1), b"a\0")
        );
        assert_ne!(
            Fingerprint::of(&key(1), b""),
            Fingerprint::of(&key(1), b"\0")
        );
    }

    #[test]
    fn every_byte_of_every_length_counts() {
        // Flipping any one bit of any one byte changes both halves of the fingerprint, for
        // every length up to 3 rounds.
        // Under miri (~1000x slower), the two bits that matter most for ASCII ids.
        let bits: &[u32] = if cfg!(miri) {
            &[0, 7]
        } else {
            &[0, 1, 2, 3, 4, 5, 6, 7]
        };
        let base: std::vec::Vec<u8> = (0..96u8).map(|i| b'a' + i % 26).collect();
        for len in 0..=base.len() {
            let fp = Fingerprint::of(&key(9), &base[..len]);
            for i in 0..len {
                for &bit in bits {
                    let mut v = base[..len].to_vec();
                    v[i] ^= 1 << bit;
                    let other = Fingerprint::of(&key(9), &v);
                    assert!(
                        other.lo != fp.lo && other.hi != fp.hi,
                        "len {len}, byte {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn lengths_never_collide_when_the_words_coincide() {
        // All-zero ids load the same (zero) words at every length: only the length term
        // tells them apart, and it must, in both halves.
        let zeros = [0u8; 97];
        let mut lo = std::collections::HashSet::new();
        let mut hi = std::collections::HashSet::new();
        for len in 0..=zeros.len() {
            let fp = Fingerprint::of(&key(3), &zeros[..len]);
            assert!(lo.insert(fp.lo) && hi.insert(fp.hi), "len {len}");
        }
    }

    #[test]
    fn the_key_follows_the_seed() {
        let id = b"req-00000001-cmpl";
        assert_ne!(Fingerprint::of(&key(1), id), Fingerprint::of(&key(2), id));
        assert_eq!(Fingerprint::of(&key(1), id), Fingerprint::of(&key(1), id));
    }

    #[test]
    fn words_round_trip() {
        let f = Fingerprint::of(&key(7), b"req");
        assert_eq!(Fingerprint::from_words(f.words()), f);
    }
}
