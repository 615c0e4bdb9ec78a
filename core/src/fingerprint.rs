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
//! two independent lanes.

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

#[inline(always)]
fn read_le(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

impl Fingerprint {
    /// Fingerprints `id` under `seed`.
    #[inline]
    pub(crate) fn of(seed: u64, id: &[u8]) -> Self {
        let len = id.len() as u64;
        let (k0, k1) = (S0 ^ seed, S1 ^ seed.rotate_left(32));
        let (mut a, mut b) = (seed ^ S2, seed.rotate_left(17) ^ S3);
        let mut chunks = id.chunks_exact(16);
        for chunk in chunks.by_ref() {
            let x = read_le(&chunk[..8]);
            let y = read_le(&chunk[8..]);
            a = fold(x ^ k0, y ^ a);
            b = fold(y ^ k1, x ^ b);
        }
        let rest = chunks.remainder();
        let (x, y) = if rest.len() > 8 {
            (read_le(&rest[..8]), read_le(&rest[8..]))
        } else {
            (read_le(rest), 0)
        };
        a = fold(x ^ k0 ^ len, y ^ a);
        b = fold(y ^ k1, x ^ b ^ len.rotate_left(32));
        Fingerprint {
            lo: fold(a ^ k1, b ^ S1),
            hi: fold(b ^ k0, a ^ S0),
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
    fn words_round_trip() {
        let f = Fingerprint::of(7, b"req");
        assert_eq!(Fingerprint::from_words(f.words()), f);
    }
}
