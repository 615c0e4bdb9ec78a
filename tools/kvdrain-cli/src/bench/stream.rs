//! The benchmark message stream, byte-identical to `bench/vllm_baseline.py`'s.
//!
//! * ids `req-{i:08x}-cmpl` for `i` in `0..R` (17 ASCII bytes);
//! * xorshift64* seeded with `S` (0 is replaced by [`DEFAULT_SEED`]);
//! * message `k` goes to request `(k / E) % R`: round-robin, `E` consecutive messages
//!   (one per edge) per request per pass;
//! * one draw `r = next()` per message: `r % 10000 < fail_share * 10000.0` gives
//!   `PUSH_FAIL:{id}:{E}`, otherwise `{id}:{E}` (the TP field is `E` in decimal).

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
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// End offset of each message in `bytes`.
    ends: Vec<u32>,
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
        let end = *self.ends.get(k)? as usize;
        let start = if k == 0 { 0 } else { self.ends[k - 1] as usize };
        Some(&self.bytes[start..end])
    }

    /// The messages in order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let msg = &self.bytes[start..end as usize];
            start = end as usize;
            msg
        })
    }

    /// The messages, one a line (what `--dump-stream` prints).
    pub fn write_lines(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        for m in self.iter() {
            out.write_all(m)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }
}

/// Builds the stream for `p`.
///
/// # Panics
/// If R or E is 0, or the stream would not fit in 4 GiB.
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
        bytes: Vec::with_capacity(p.notifications * (ids[0].len() + tp.len() + 2)),
        ends: Vec::with_capacity(p.notifications),
        failures: 0,
    };
    for k in 0..p.notifications {
        let id = &ids[(k / p.edges) % p.inflight];
        // `r % 10000` is exact as an f64, so the comparison matches Python's int-vs-float
        // comparison bit for bit.
        if ((rng.next() % 10000) as f64) < threshold {
            out.bytes.extend_from_slice(PUSH_FAIL_PREFIX);
            out.failures += 1;
        }
        out.bytes.extend_from_slice(id.as_bytes());
        out.bytes.push(b':');
        out.bytes.extend_from_slice(tp.as_bytes());
        let end = u32::try_from(out.bytes.len()).expect("stream larger than 4 GiB");
        out.ends.push(end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xorshift_reference_values() {
        // Same values as bench/vllm_baseline.py's XorShift64Star(DEFAULT_SEED).
        let mut rng = XorShift64Star::new(DEFAULT_SEED);
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
        let s = generate(&p);
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
        let mut lines = Vec::new();
        s.write_lines(&mut lines).expect("writes to a Vec");
        assert!(lines.starts_with(b"PUSH_FAIL:req-00000000-cmpl:2\nPUSH_FAIL:"));
    }
}
