//! Request-id fingerprints: the only form in which the tracker stores an id.
//!
//! A request id is hashed once per event into a 128-bit keyed fingerprint. Tables hold
//! fingerprints, never strings, which keeps a slot small and the ingest path free of
//! byte-by-byte comparisons of shared memory. Two distinct ids share a fingerprint with
//! probability 2⁻¹²⁸; the seed is chosen by the engine, so a peer cannot aim for a
//! collision without knowing it. Registration refuses a second live request with the same
//! fingerprint, so among tracked requests matching is exact.
//!
//! The mixing step is the folded 64×64→128-bit multiply used by wyhash-style hashes, run in
//! two independent lanes of 16 bytes each (32 bytes per round), then two folds that mix the
//! lanes into the two output words.

/// A 128-bit keyed fingerprint of a request id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Fingerprint {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

const S0: u64 = 0x9E37_79B9_7F4A_7C15;
const S1: u64 = 0xC2B2_AE3D_27D4_EB4F;
const S2: u64 = 0x1656_67B1_9E37_79F9;
const S3: u64 = 0xD6E8_FEB8_6659_FD93;

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

/// Bit 7 of every byte of a word.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

impl Fingerprint {
    /// Fingerprints `id` under `seed`.
    #[inline]
    pub(crate) fn of(seed: u64, id: &[u8]) -> Self {
        Self::of_checked(seed, id).0
    }

    /// Fingerprints `id` under `seed`, and tells whether `id` is all ASCII (for free:
    /// every byte is loaded into a word anyway). ASCII is valid UTF-8, which lets the
    /// ingest path skip a separate UTF-8 validation of the id.
    ///
    /// Two independent lanes each absorb 16 bytes per folded multiply, so one round takes
    /// 32 bytes: an id of up to 32 bytes costs two rounds of two multiplies (the lanes
    /// run in parallel), the second round mixing each lane into both output words.
    #[inline(always)]
    pub(crate) fn of_checked(seed: u64, id: &[u8]) -> (Self, bool) {
        let len = id.len();
        let (k0, k1) = (S0 ^ seed, S1 ^ seed.rotate_left(32));
        let (mut a, mut b) = (seed ^ S2, seed.rotate_left(17) ^ S3);
        let mut high = 0;
        // Whole 32-byte chunks, leaving the last 1 to 32 bytes.
        let mut at = 0;
        while len - at > 32 {
            let (x0, x1) = (word(id, at), word(id, at + 8));
            let (x2, x3) = (word(id, at + 16), word(id, at + 24));
            high |= x0 | x1 | x2 | x3;
            a = fold(x0 ^ k0, x1 ^ a);
            b = fold(x2 ^ k1, x3 ^ b);
            at += 32;
        }
        // The last 1 to 32 bytes (all of `id` when shorter): above 16, the first and the
        // last 16 of them (overlapping); else `tail` of them in the first lane alone. For
        // a given length the mapping is one-to-one; the length is mixed in below.
        let rest = &id[at..];
        let ((x0, x1), (x2, x3)) = if rest.len() > 16 {
            let r = rest.len();
            (
                (word(rest, 0), word(rest, 8)),
                (word(rest, r - 16), word(rest, r - 8)),
            )
        } else {
            (tail(rest), (0, 0))
        };
        high |= x0 | x1 | x2 | x3;
        let len = len as u64;
        a = fold(x0 ^ k0 ^ len, x1 ^ a);
        b = fold(x2 ^ k1, x3 ^ b ^ len.rotate_left(32));
        let fp = Fingerprint {
            lo: fold(a ^ k1, b ^ S1),
            hi: fold(b ^ k0, a ^ S0),
        };
        (fp, high & HIGH_BITS == 0)
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
    use super::Fingerprint;

    #[test]
    fn differs_on_every_prefix_and_seed() {
        let id = b"cmpl-3f1c9a2e-0-1a2b3c4d:with:colons";
        let mut seen = std::collections::HashSet::new();
        for len in 0..=id.len() {
            for seed in 0..4u64 {
                assert!(seen.insert(Fingerprint::of(seed, &id[..len])));
            }
        }
    }

    #[test]
    fn zero_padding_does_not_collide() {
        assert_ne!(Fingerprint::of(1, b"a"), Fingerprint::of(1, b"a\0"));
        assert_ne!(Fingerprint::of(1, b""), Fingerprint::of(1, b"\0"));
    }

    #[test]
    fn every_byte_of_every_length_counts() {
        // Flipping any one byte changes the fingerprint, for every length up to 3 chunks,
        // and the ASCII flag follows the high bits.
        let base: std::vec::Vec<u8> = (0..96u8).map(|i| b'a' + i % 26).collect();
        for len in 0..=base.len() {
            let (fp, ascii) = Fingerprint::of_checked(9, &base[..len]);
            assert!(ascii);
            for i in 0..len {
                let mut v = base[..len].to_vec();
                v[i] ^= 0x01;
                assert_ne!(Fingerprint::of(9, &v), fp, "len {len}, byte {i}");
                v[i] ^= 0x81;
                let (other, ascii) = Fingerprint::of_checked(9, &v);
                assert!(!ascii, "len {len}, byte {i}");
                assert_ne!(other, fp);
            }
        }
    }

    #[test]
    fn words_round_trip() {
        let f = Fingerprint::of(7, b"req");
        assert_eq!(Fingerprint::from_words(f.words()), f);
    }
}
