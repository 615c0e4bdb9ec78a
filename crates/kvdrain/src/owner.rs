//! The engine thread's own tables: everything only the owner of a [`Ledger`](crate::Ledger)
//! touches (configuration, clock, free list, per-request records, timers, tombstone ages,
//! counters). [`Engine`](crate::Engine) borrows it mutably; the ingest thread never sees it.

use crate::config::Config;
use crate::counters::EngineCounters;
use crate::decided::Decided;
use crate::fingerprint::Fingerprint;
use crate::refused_hold::RefusedHolds;
use crate::time::Instant;
use crate::timers::Timers;
use crate::tombstones::TombstoneAges;

/// Owner-only facts about a slot's request: 64 bytes, a cache line's worth (asserted
/// below), read and written on the decisions' paths. (Aligning it to a line measured no
/// faster: the split halves' ratio to the floor rose.)
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub(crate) key: u64,
    pub(crate) blocks: u64,
    /// While counting, the deadline; while settling, the settle end (rule 8: the last
    /// failure notice's or `gone`'s time plus `Config::settle`); once it completed, when
    /// (for its [`Record`](crate::Record)). Nothing else needs it in between.
    pub(crate) due: Instant,
    pub(crate) fp: Fingerprint,
    pub(crate) generation: u32,
    pub(crate) bucket: u32,
    /// The low 32 bits of the clock at the last `gone` that resolved one of the edges
    /// (a stamp, read like a failure notice's: `stamp.rs`); meaningful only with the
    /// history's `GONE`. The engine's own copy: the slot's failure stamp has one writer,
    /// the ingest thread.
    pub(crate) gone_at: u32,
    /// For its [`Record`](crate::Record): the clock at its registration and its deadline,
    /// as stamps, and the notices (counting) or named edges it expected (`0`: no request
    /// was ever registered in the slot).
    pub(crate) registered_at: u32,
    pub(crate) deadline: u32,
    pub(crate) expected: u8,
    pub(crate) live: bool,
    /// Decided, every edge resolved, waiting for its failure notices to settle: the timer
    /// fires at the settle end (or the quarantine end, if earlier) and releases.
    pub(crate) settling: bool,
    /// Something went wrong with it: its slot's [`History`] is its own. `false` at its
    /// registration, so that a registration writes no history line.
    pub(crate) has_history: bool,
}

const _: () = assert!(size_of::<Request>() == 64);

/// What a request's [`Record`](crate::Record) reports beyond its [`Request`]: the times of
/// what went wrong, written only on the paths that handle it (an abort, an expiry, a
/// fence, a failed decision, a release that is not a completion). A registration and a
/// completion write none of it, so the common path touches no history line: the slot's
/// history is its request's once [`Request::has_history`] says so, and empty until then.
/// Times are stamps (`stamp.rs`: the low 32 bits of their milliseconds, read back
/// against the clock), so the whole history costs 32 bytes a request and the table
/// stays within 256 bytes a request (`tests/size.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct History {
    /// What was owed when the deadline passed, for the `Expired` decision built at
    /// hand-out: the count in counting mode, the mask of unresolved agents in named-edge
    /// mode (see [`Outstanding`](crate::Outstanding)).
    pub(crate) owed_at_expiry: u64,
    /// The last `fence` that resolved one of its edges (with `FENCED`).
    pub(crate) fenced_at: u32,
    /// The abort or the expiry (with `ABORTED` or `EXPIRED`).
    pub(crate) ended_at: u32,
    /// `failed` (with `DECIDED`; a completion's time is `Request::due`).
    pub(crate) decided_at: u32,
    /// The blocks came back (with `RELEASED`).
    pub(crate) released_at: u32,
    /// The last failure notice's stamp, kept when the slot was freed (with `NOTICE`).
    pub(crate) notice_at: u32,
    /// What the state word still owed when the slot was freed (with `CLOSED`).
    pub(crate) outstanding: u8,
    pub(crate) flags: HistoryFlags,
}

bitflags::bitflags! {
    /// Which of a [`History`]'s times are set, and how it ended.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(crate) struct HistoryFlags: u16 {
        const FENCED = 1;
        const ABORTED = 1 << 1;
        const EXPIRED = 1 << 2;
        const DECIDED = 1 << 3;
        /// Its blocks settled until `Request::due` (rule 8).
        const SETTLED = 1 << 4;
        const RELEASED = 1 << 5;
        const FORCED = 1 << 6;
        /// The slot was freed without completing: `outstanding`, `FAILED` and `NOTICE`
        /// are final. (A retired request whose history is not closed completed.)
        const CLOSED = 1 << 7;
        /// At the close: an edge had failed.
        const FAILED = 1 << 8;
        /// At the close: a failure notice had resolved an edge (`notice_at`).
        const NOTICE = 1 << 9;
        /// A [`gone`](crate::Engine::gone) resolved one of its edges: the blocks settle
        /// from `Request::gone_at` as from a failure notice (rule 8).
        const GONE = 1 << 10;
    }
}

impl History {
    /// A request's history before anything went wrong.
    pub(crate) const EMPTY: History = History {
        owed_at_expiry: 0,
        fenced_at: 0,
        ended_at: 0,
        decided_at: 0,
        released_at: 0,
        notice_at: 0,
        outstanding: 0,
        flags: HistoryFlags::empty(),
    };
}

pub(crate) const VACANT: Request = Request {
    key: 0,
    blocks: 0,
    due: Instant::ZERO,
    fp: Fingerprint { lo: 0, hi: 0 },
    generation: 0,
    bucket: 0,
    gone_at: 0,
    registered_at: 0,
    deadline: 0,
    expected: 0,
    live: false,
    settling: false,
    has_history: false,
};

/// Everything only the engine thread touches.
#[derive(Debug)]
pub(crate) struct Owner<const N: usize> {
    pub(crate) config: Config,
    pub(crate) now: Instant,
    pub(crate) next_key: u64,
    pub(crate) live: usize,
    /// Slots no request holds and no queued decision names.
    pub(crate) free: [u32; N],
    pub(crate) free_len: usize,
    pub(crate) requests: [Request; N],
    /// Per slot, what went wrong with its request ([`History`]): beside `requests`, not in
    /// it, so that a `Request` stays one line and the common path writes none of this.
    pub(crate) histories: [History; N],
    pub(crate) timers: Timers<N>,
    pub(crate) ages: TombstoneAges<N>,
    /// Slots touched by one clock advance or fence, sorted into registration order.
    pub(crate) batch: [u32; N],
    pub(crate) counters: EngineCounters,
    /// Decisions taken and not handed out yet, oldest first; a slot goes back to `free`
    /// when its last one is handed out.
    pub(crate) decided: Decided<N>,
    /// The blocks of refused registrations, held for a quarantine (`refused_hold.rs`).
    pub(crate) refused: RefusedHolds,
}

impl<const N: usize> Owner<N> {
    pub(crate) fn new(config: Config) -> Self {
        Owner {
            config,
            now: Instant::ZERO,
            next_key: 0,
            live: 0,
            // Popped from the end: slot 0 first.
            free: core::array::from_fn(|i| (N - 1 - i) as u32),
            free_len: N,
            requests: [VACANT; N],
            histories: [History::EMPTY; N],
            timers: Timers::new(),
            ages: TombstoneAges::new(),
            batch: [0; N],
            counters: EngineCounters::default(),
            decided: Decided::new(),
            refused: RefusedHolds::new(),
        }
    }
    pub(crate) fn now(&self) -> Instant {
        self.now
    }
    pub(crate) fn live(&self) -> usize {
        self.live
    }
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }
    pub(crate) fn counters(&self) -> &EngineCounters {
        &self.counters
    }
    /// The next deadline, settle end, quarantine end or refused hold's end.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        match (self.timers.next_due(), self.refused.next_end()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    /// Returns `slot` to the free list: its last decision is being handed out.
    #[inline]
    pub(crate) fn recycle(&mut self, slot: u32) {
        self.free[self.free_len] = slot;
        self.free_len += 1;
    }
    /// Whether a registration finds a slot: fewer than `capacity` tracked and a slot free
    /// (a slot whose decisions wait to be handed out is not free).
    pub(crate) fn has_room(&self) -> bool {
        self.live < self.config.capacity && self.free_len > 0
    }
}
