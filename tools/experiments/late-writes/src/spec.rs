//! One run's parameters ([`RunSpec`]), shipped to both child processes in one environment
//! variable, and the randomized plan of a series of runs.

use crate::policy::Policy;
use crate::stamp::PAGE;

/// Environment variable carrying a [`RunSpec`] to a child.
pub const SPEC_ENV: &str = "KVDRAIN_LATE_WRITES_SPEC";
/// Bytes of each WRITE: 256 MiB.
pub const WRITE_BYTES: usize = 256 << 20;
/// Pages of each WRITE.
pub const WRITE_PAGES: usize = WRITE_BYTES / PAGE;
/// Spans (descriptors) of each WRITE: 64 × 4 MiB.
pub const SPANS: usize = 64;
/// Extra pages in D's region, so the write can start at a random page.
pub const SLACK_PAGES: usize = 256;
/// The consumer's request id (P's completion and `PUSH_FAIL` name it).
pub const REQUEST_ID: &str = "cmpl-late-writes-0";

/// The injected fault, applied by P a random delay after it posted the WRITE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// (a) P invalidates D's metadata.
    Invalidate,
    /// (b) P drops (releases) the transfer handle.
    DropHandle,
    /// (c) P's TCP connections are reset (`ss -K`, SOCK_DESTROY).
    ResetTcp,
    /// (d) P is killed (SIGKILL).
    Kill,
}

impl Fault {
    /// Every fault, in order.
    pub const ALL: [Fault; 4] = [
        Fault::Invalidate,
        Fault::DropHandle,
        Fault::ResetTcp,
        Fault::Kill,
    ];

    /// `a` … `d`.
    pub fn letter(self) -> &'static str {
        match self {
            Fault::Invalidate => "a",
            Fault::DropHandle => "b",
            Fault::ResetTcp => "c",
            Fault::Kill => "d",
        }
    }

    /// Parses `a` … `d`.
    pub fn parse(s: &str) -> Option<Self> {
        Fault::ALL.into_iter().find(|f| f.letter() == s)
    }

    /// Whether the fault means anything on `transport` (no TCP connection on shared memory).
    pub fn applies_to(self, transport: Transport) -> bool {
        !(self == Fault::ResetTcp && transport == Transport::Shm)
    }
}

/// The UCX transports, chosen per child process through `UCX_*` variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `UCX_TLS=tcp UCX_NET_DEVICES=lo`: TCP on loopback only.
    Tcp,
    /// `UCX_TLS=sm` (shared memory and cross-memory attach) with peer failure handling on.
    Shm,
}

impl Transport {
    /// `tcp` / `shm`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
        }
    }

    /// Parses `tcp` / `shm`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tcp" => Some(Transport::Tcp),
            "shm" => Some(Transport::Shm),
            _ => None,
        }
    }

    /// The environment a child needs for this transport.
    pub fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Transport::Tcp => &[("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")],
            Transport::Shm => &[
                ("UCX_TLS", "sm"),
                ("UCX_POSIX_ERROR_HANDLING", "on"),
                ("UCX_SYSV_ERROR_HANDLING", "on"),
            ],
        }
    }
}

/// Everything both children of one run need to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// Run number (for the output).
    pub run: u32,
    /// Agent-name prefix, unique per run and process tree.
    pub prefix: String,
    /// UCX transport.
    pub transport: Transport,
    /// Injected fault.
    pub fault: Fault,
    /// P's reporting policy.
    pub policy: Policy,
    /// D's failure-notice settling, ms (`settle_ms: wired when Config has it`).
    pub settle_ms: u64,
    /// D's deadline for the request, ms after registration.
    pub deadline_ms: u64,
    /// D's quarantine after an expiry, ms.
    pub quarantine_ms: u64,
    /// How long D keeps watching after the failure event and after the release, ms.
    pub observe_ms: u64,
    /// Delay from P's post to the fault, µs.
    pub fault_delay_us: u64,
    /// Page of D's region where the write starts (`< SLACK_PAGES`).
    pub offset_pages: usize,
    /// Span `i` of the source goes to destination span `(i + rotation) % SPANS`.
    pub rotation: usize,
    /// Stamp generation of this run's source pages (never 0).
    pub generation: u16,
}

impl RunSpec {
    /// `key=value` pairs separated by spaces.
    pub fn encode(&self) -> String {
        format!(
            "run={} prefix={} transport={} fault={} policy={} settle_ms={} deadline_ms={} \
             quarantine_ms={} observe_ms={} fault_delay_us={} offset_pages={} rotation={} generation={}",
            self.run,
            self.prefix,
            self.transport.name(),
            self.fault.letter(),
            self.policy.name(),
            self.settle_ms,
            self.deadline_ms,
            self.quarantine_ms,
            self.observe_ms,
            self.fault_delay_us,
            self.offset_pages,
            self.rotation,
            self.generation
        )
    }

    /// Parses [`RunSpec::encode`]'s output.
    pub fn decode(s: &str) -> Option<Self> {
        let get = |k: &str| {
            s.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
        };
        let num = |k: &str| get(k)?.parse::<u64>().ok();
        let spec = RunSpec {
            run: u32::try_from(num("run")?).ok()?,
            prefix: get("prefix")?.to_owned(),
            transport: Transport::parse(get("transport")?)?,
            fault: Fault::parse(get("fault")?)?,
            policy: Policy::parse(get("policy")?)?,
            settle_ms: num("settle_ms")?,
            deadline_ms: num("deadline_ms")?,
            quarantine_ms: num("quarantine_ms")?,
            observe_ms: num("observe_ms")?,
            fault_delay_us: num("fault_delay_us")?,
            offset_pages: usize::try_from(num("offset_pages")?).ok()?,
            rotation: usize::try_from(num("rotation")?).ok()?,
            generation: u16::try_from(num("generation")?).ok()?,
        };
        (spec.offset_pages < SLACK_PAGES && spec.rotation < SPANS && spec.generation != 0)
            .then_some(spec)
    }

    /// The longest a run can take before its coordinator gives up on it, ms.
    pub fn limit_ms(&self) -> u64 {
        self.deadline_ms + self.quarantine_ms + self.settle_ms + 2 * self.observe_ms + 30_000
    }

    /// The transfer spans `(source page, destination page)` of span `i`, relative to the
    /// source region and to D's region.
    pub fn span_pages(&self, i: usize) -> (usize, usize) {
        let per = WRITE_PAGES / SPANS;
        (
            i * per,
            self.offset_pages + (i + self.rotation) % SPANS * per,
        )
    }
}

/// What a series of runs varies and keeps.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Total runs (spread round-robin over every applicable fault × transport pair).
    pub runs: u32,
    /// Faults to inject.
    pub faults: Vec<Fault>,
    /// Transports to use.
    pub transports: Vec<Transport>,
    /// P's policy.
    pub policy: Policy,
    /// D's settling, ms.
    pub settle_ms: u64,
    /// D's deadline, ms.
    pub deadline_ms: u64,
    /// D's quarantine, ms.
    pub quarantine_ms: u64,
    /// D's watch after the event and after the release, ms.
    pub observe_ms: u64,
    /// Fault delay range after the post, µs (inclusive).
    pub fault_delay_us: (u64, u64),
    /// Randomization seed.
    pub seed: u64,
    /// Agent-name prefix.
    pub prefix: String,
}

impl Plan {
    /// The runs, with random fault delays, write offsets and span rotations.
    pub fn specs(&self) -> Vec<RunSpec> {
        let pairs: Vec<(Transport, Fault)> = self
            .transports
            .iter()
            .flat_map(|&t| self.faults.iter().map(move |&f| (t, f)))
            .filter(|&(t, f)| f.applies_to(t))
            .collect();
        if pairs.is_empty() {
            return Vec::new();
        }
        let mut rng = SplitMix(self.seed);
        let (lo, hi) = self.fault_delay_us;
        (0..self.runs)
            .map(|run| {
                let (transport, fault) = pairs[run as usize % pairs.len()];
                RunSpec {
                    run,
                    prefix: format!("{}-r{run}", self.prefix),
                    transport,
                    fault,
                    policy: self.policy,
                    settle_ms: self.settle_ms,
                    deadline_ms: self.deadline_ms,
                    quarantine_ms: self.quarantine_ms,
                    observe_ms: self.observe_ms,
                    fault_delay_us: lo + rng.next() % (hi.saturating_sub(lo) + 1),
                    offset_pages: (rng.next() % SLACK_PAGES as u64) as usize,
                    rotation: (rng.next() % SPANS as u64) as usize,
                    generation: (run % 0xfffe + 1) as u16,
                }
            })
            .collect()
    }
}

/// splitmix64: a small deterministic generator for the plan.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_and_plans_cover_every_pair() {
        let plan = Plan {
            runs: 7,
            faults: Fault::ALL.to_vec(),
            transports: vec![Transport::Tcp, Transport::Shm],
            policy: Policy::New,
            settle_ms: 5000,
            deadline_ms: 1500,
            quarantine_ms: 2000,
            observe_ms: 1000,
            fault_delay_us: (1000, 30_000),
            seed: 9,
            prefix: "x".into(),
        };
        let specs = plan.specs();
        assert_eq!(specs.len(), 7);
        // 4 TCP faults + 3 on shm (no TCP reset there).
        let pairs: std::collections::HashSet<_> =
            specs.iter().map(|s| (s.transport, s.fault)).collect();
        assert_eq!(pairs.len(), 7);
        assert!(!pairs.contains(&(Transport::Shm, Fault::ResetTcp)));
        for s in &specs {
            assert_eq!(RunSpec::decode(&s.encode()).as_ref(), Some(s));
            assert!((1000..=30_000).contains(&s.fault_delay_us));
            let (src, dst) = s.span_pages(SPANS - 1);
            assert!(src + WRITE_PAGES / SPANS <= WRITE_PAGES);
            assert!(dst + WRITE_PAGES / SPANS <= WRITE_PAGES + SLACK_PAGES);
        }
        assert_eq!(RunSpec::decode("run=1"), None);
    }
}
