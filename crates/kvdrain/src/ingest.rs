//! The ingest half: turns notification bytes into edge resolutions, without locks.

use crate::counters::IngestCounters;
use crate::error::{IgnoreReason, Ignored};
use crate::fingerprint::Fingerprint;
use crate::shared::Shared;
use crate::slot::EdgeClaim;
use crate::stamp;
use crate::state_word::{Resolution, Resolved};
use crate::sync::{Ordering, fence};
use crate::ticket::AgentId;
use crate::time::Instant;
use crate::wire::{self, Message, ParseError};

/// What an accepted notice did.
#[must_use = "after `Decided`, pull `Engine::poll_decision` to take the decision out"]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Noticed {
    /// It resolved an edge; others are still outstanding.
    Counted,
    /// It resolved the request's last edge: a decision (`completed`, `failed` or
    /// `released`) waits for [`Engine::poll_decision`](crate::Engine::poll_decision).
    Decided,
}

/// What the ingest half keeps between calls. It lives in the [`Ledger`](crate::Ledger),
/// not in the half, so that the ledger's convenience methods (which build a half per
/// call) and every [`split`](crate::Ledger::split) see the same counters and the same
/// arrival time.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct IngestOwn {
    pub(crate) counters: IngestCounters,
    /// The latest time given to [`Ingest::set_arrival`]; `None` until one is.
    arrival: Option<Instant>,
}

impl IngestOwn {
    pub(crate) fn arrival(&self) -> Option<Instant> {
        self.arrival
    }
}

/// The ingest half of a [`Ledger`](crate::Ledger): `Send`, one per ledger.
#[derive(Debug)]
pub struct Ingest<'l, const N: usize, const E: usize> {
    pub(crate) shared: &'l Shared<N, E>,
    own: &'l mut IngestOwn,
    /// Built by [`Ledger`](crate::Ledger)'s own methods, which hold `&mut Ledger`: no
    /// engine half exists, so no other thread can touch the shared half, and an edge is
    /// resolved with plain stores instead of CAS (see `StateWord::transition_alone`).
    alone: bool,
}

impl<'l, const N: usize, const E: usize> Ingest<'l, N, E> {
    /// The ingest half of a split ledger: its engine half may run on another thread.
    pub(crate) fn new(shared: &'l Shared<N, E>, own: &'l mut IngestOwn) -> Self {
        Ingest {
            shared,
            own,
            alone: false,
        }
    }

    /// The ingest half for a caller that holds the whole ledger exclusively (`&mut
    /// Ledger`, so no engine half exists while it lives).
    pub(crate) fn alone(shared: &'l mut Shared<N, E>, own: &'l mut IngestOwn) -> Self {
        Ingest {
            shared,
            own,
            alone: true,
        }
    }

    /// Tells the ingest half when the notices it is handed from now on arrived: the time,
    /// on the engine's clock (the one [`advance`](crate::Engine::advance) is given), at
    /// which the thread that drains NIXL took them from the transport. Call it once per
    /// batch, before the batch.
    ///
    /// Why: a failure notice is dated for rule 8 (its request's blocks settle for
    /// [`Config::settle`](crate::Config::settle) from then), and the ingest half reads no
    /// clock. Without an arrival time a notice is dated at the engine's last `advance`,
    /// which an engine that advances once per step can leave a whole step behind the
    /// notice: the blocks would be released up to one step too early. With one, a failure
    /// notice is dated at the later of the two, so never earlier than the engine's clock
    /// and never earlier than its arrival. Completions are not dated (they need no
    /// settling) and pay nothing for this.
    ///
    /// Monotonic: a time earlier than one already given is ignored, and the notices keep
    /// the later one, which can only delay a release (two draining threads that read the
    /// clock and then take turns at this half can hand their times in out of order).
    /// Give times every batch or never: an arrival time left more than 2^31 ms (24.8
    /// days) behind the engine's clock is read as ahead of it, which dates a notice up to
    /// that much late (a delay, never an early release; an aborted or expired request's
    /// quarantine end still bounds it).
    ///
    /// ```
    /// # use kvdrain::{AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Registration};
    /// let mut ledger: Ledger<16, 2> = Ledger::new(Config { settle: Duration::from_millis(500), ..Config::with_capacity(16) });
    /// # let _t = ledger.register(Registration { id: "r", blocks: BlockHandle(1),
    /// #     expect: Expect::Count(1), deadline: None }).unwrap();
    /// let (mut ingest, mut engine) = ledger.split();
    /// engine.advance(Instant::from_millis(10)).expect("clock forward");
    /// // The engine is inside a slow step; the writer thread takes a batch at 600.
    /// ingest.set_arrival(Instant::from_millis(600));
    /// let _ = ingest.handle_notification(AgentId(0), b"PUSH_FAIL:r:1");
    /// engine.advance(Instant::from_millis(600)).expect("clock forward");
    /// assert!(matches!(engine.poll_decision(), Some(Decision::Failed(_))));
    /// engine.advance(Instant::from_millis(1_099)).expect("clock forward");
    /// assert_eq!(engine.poll_decision(), None); // settles until 600 + 500, not 10 + 500
    /// engine.advance(Instant::from_millis(1_100)).expect("clock forward");
    /// assert!(matches!(engine.poll_decision(), Some(Decision::Released(_))));
    /// ```
    pub fn set_arrival(&mut self, now: Instant) {
        if self.own.arrival.is_none_or(|last| now > last) {
            self.own.arrival = Some(now);
        }
    }

    /// The latest time given to [`set_arrival`](Self::set_arrival), if any.
    pub fn arrival(&self) -> Option<Instant> {
        self.own.arrival()
    }

    /// Feeds one NIXL notification from producer `agent`.
    ///
    /// `O(1)`: one parse, one hash, an expected 1.5 index probes, one or two CAS (plus a
    /// scan of at most `E` edge words in named mode). Never allocates, never blocks, never
    /// panics.
    ///
    /// # Errors
    /// [`Ignored`] with the reason when the notice changed nothing; no state is created
    /// and no other request is touched.
    // Always inlined, like `Engine::register`: as a call it costs its caller ~30
    // instructions per notice, and with two call sites in one crate (the bench's ledger
    // and split passes) the compiler stopped inlining a plain `#[inline]`.
    #[inline(always)]
    pub fn handle_notification<'m>(
        &mut self,
        agent: AgentId,
        bytes: &'m [u8],
    ) -> Result<Noticed, Ignored<'m>> {
        let (id, failed) = match consumer_notice(bytes) {
            Some(notice) => notice,
            None => self.parse_slow(bytes)?,
        };
        let fp = Fingerprint::of(&self.shared.key, id);
        loop {
            let Some(found) = self.shared.find(fp, self.alone) else {
                let reason = if self.shared.tombstones.contains(fp) {
                    IgnoreReason::Late
                } else {
                    IgnoreReason::Unknown
                };
                return Err(self.ignore_id(reason, id));
            };
            let generation = found.state.generation();
            if found.state.outstanding() == 0 {
                return Err(self.ignore_id(IgnoreReason::Late, id));
            }
            let slot = &self.shared.slots[found.slot as usize];
            if found.named > 0 {
                match slot.claim_edge(found.named, generation, agent, failed, self.alone) {
                    EdgeClaim::Claimed => {}
                    EdgeClaim::Duplicate => return Err(self.ignore_id(IgnoreReason::Duplicate, id)),
                    EdgeClaim::Recycled => continue,
                    EdgeClaim::NotAnEdge => {
                        // Only trust "not an edge" if the edges we scanned were this
                        // generation's.
                        fence(Ordering::Acquire);
                        if slot.state.load(Ordering::Relaxed).is_live(generation) {
                            return Err(self.ignore_id(IgnoreReason::UnexpectedSender, id));
                        }
                        continue;
                    }
                }
            }
            let how = if failed {
                // Rule 8: the time of this failure notice, for the owner's settle end: the
                // engine's published clock, or its arrival if that is later. One `Relaxed`
                // load and store and a compare or two, on failure notices only.
                let clock = self.shared.clock.load(Ordering::Relaxed);
                let at = match self.own.arrival {
                    Some(arrival) => stamp::later(clock, stamp::of(arrival)),
                    None => clock,
                };
                slot.stamp_failure_notice(at);
                Resolution::FailureNotice
            } else {
                Resolution::Landed
            };
            let resolved = if self.alone {
                slot.state.resolve_edge_alone(found.state, generation, how)
            } else {
                slot.state.resolve_edge_from(found.state, generation, how)
            };
            return match resolved {
                Resolved::Counted => Ok(self.counted(failed, Noticed::Counted)),
                Resolved::LastEdge => {
                    if !self.shared.ready.push(found.slot) {
                        self.own.counters.ready_overflow += 1;
                    }
                    self.own.counters.last_edges += 1;
                    Ok(self.counted(failed, Noticed::Decided))
                }
                Resolved::AlreadyDrained => Err(self.ignore_id(IgnoreReason::Late, id)),
                // Counting mode: look again. Named mode: our edge claim was for a request
                // that ended under us (its quarantine ran out): the notice is late.
                Resolved::Recycled if found.named == 0 => continue,
                Resolved::Recycled => Err(self.ignore_id(IgnoreReason::Late, id)),
            };
        }
    }

    /// [`wire::parse`]'s verdict on a notice the fast path did not take.
    #[cold]
    fn parse_slow<'m>(&mut self, bytes: &'m [u8]) -> Result<(&'m [u8], bool), Ignored<'m>> {
        match wire::parse(bytes) {
            Ok(Message::Completion(c)) => Ok((c.request_id.as_bytes(), false)),
            Ok(Message::Failure(c)) => Ok((c.request_id.as_bytes(), true)),
            Ok(Message::Heartbeat(_) | Message::Registration(_) | Message::Cancel(_)) => {
                Err(self.ignore(IgnoreReason::NotForConsumer, None))
            }
            Err(e) => Err(self.ignore(IgnoreReason::Malformed(e), None)),
        }
    }

    /// Counters of this half.
    pub fn counters(&self) -> &IngestCounters {
        &self.own.counters
    }

    fn counted(&mut self, failed: bool, outcome: Noticed) -> Noticed {
        if failed {
            self.own.counters.failure_notices += 1;
        } else {
            self.own.counters.completions += 1;
        }
        outcome
    }

    /// Ignores a notice that parsed, for `reason`, reporting its id. The fast parse does
    /// not check the id's UTF-8: a tracked id is a `str`, so bytes that are not UTF-8
    /// match one only through a fingerprint collision, and a notice that ends up ignored
    /// with such an id gets the verdict [`wire::parse`] gives it, `Malformed(NotUtf8)`.
    #[cold]
    fn ignore_id<'m>(&mut self, reason: IgnoreReason, id: &'m [u8]) -> Ignored<'m> {
        match core::str::from_utf8(id) {
            Ok(id) => self.ignore(reason, Some(id)),
            Err(_) => self.ignore(IgnoreReason::Malformed(ParseError::NotUtf8), None),
        }
    }

    fn ignore<'m>(&mut self, reason: IgnoreReason, request_id: Option<&'m str>) -> Ignored<'m> {
        let c = &mut self.own.counters;
        *match reason {
            IgnoreReason::Malformed(_) => &mut c.malformed,
            IgnoreReason::NotForConsumer => &mut c.not_for_consumer,
            IgnoreReason::Unknown => &mut c.unknown,
            IgnoreReason::Late => &mut c.late,
            IgnoreReason::Duplicate => &mut c.duplicate,
            IgnoreReason::UnexpectedSender => &mut c.unexpected_sender,
        } += 1;
        Ignored { reason, request_id }
    }
}

// `consumer_notice` dispatches on the first byte of these.
const PUSH_FAIL: &[u8; 10] = b"PUSH_FAIL:";
const PUSH_REG: &[u8; 9] = b"PUSH_REG:";
const HEARTBEAT: &[u8; 3] = b"HB:";
const PUSH_CANCEL: &[u8; 12] = b"PUSH_CANCEL:";
const _: () = assert!(
    PUSH_FAIL[0] == b'P' && PUSH_REG[0] == b'P' && HEARTBEAT[0] == b'H' && PUSH_CANCEL[0] == b'P'
);

/// The common case of [`wire::parse`] on the consumer side, on bytes: a completion or
/// `PUSH_FAIL:` notice whose TP field is 1 to 5 digits with a value in `1..=65535`.
/// Returns the request id and whether the notice is a failure. `None` means "not that
/// common case": the caller falls back to [`wire::parse`], which classifies the message
/// and reports errors exactly as before. The id is not checked for UTF-8 here (see
/// `Ingest::ignore_id`): whatever this accepts with a UTF-8 id, `wire::parse` accepts as
/// the same message, and with any other id it calls `NotUtf8` (tested below). Always
/// inlined: with `#[inline]` the compiler kept it a call (about 7 instructions per notice
/// of call and return).
#[inline(always)]
fn consumer_notice(bytes: &[u8]) -> Option<(&[u8], bool)> {
    // The four prefixes start with `P` or `H`: any other first byte is a completion
    // without comparing a prefix. Else fixed-size prefix compares: a couple of loads
    // each, no `memcmp` call.
    let (body, failed) = match bytes.first() {
        Some(b'P' | b'H') => match bytes.split_first_chunk::<10>() {
            Some((head, body)) if head == PUSH_FAIL => (body, true),
            _ if bytes.first_chunk::<9>() == Some(PUSH_REG)
                || bytes.first_chunk::<3>() == Some(HEARTBEAT)
                || bytes.first_chunk::<12>() == Some(PUSH_CANCEL) =>
            {
                return None;
            }
            _ => (bytes, false),
        },
        _ => (bytes, false),
    };
    // The TP field: the digits after the last ':' (digits hold no ':'), read backwards.
    let mut colon = body.len();
    let (mut tp, mut scale) = (0u32, 1u32);
    loop {
        colon = colon.checked_sub(1)?;
        let digit = body[colon].wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        if scale > 10_000 {
            return None; // a sixth digit
        }
        tp += u32::from(digit) * scale;
        scale *= 10;
    }
    if body[colon] != b':' || colon == 0 || scale == 1 || tp == 0 || tp > u32::from(u16::MAX) {
        return None;
    }
    Some((&body[..colon], failed))
}

#[cfg(all(test, not(kvdrain_loom)))]
mod tests {
    use super::{HEARTBEAT, PUSH_CANCEL, PUSH_FAIL, PUSH_REG, consumer_notice};
    use crate::wire::{self, Message};

    #[test]
    fn prefixes_are_the_wire_prefixes() {
        assert_eq!(&PUSH_FAIL[..], wire::PUSH_FAIL_PREFIX);
        assert_eq!(&PUSH_REG[..], wire::PUSH_REG_PREFIX);
        assert_eq!(&HEARTBEAT[..], wire::HEARTBEAT_PREFIX);
        assert_eq!(&PUSH_CANCEL[..], wire::PUSH_CANCEL_PREFIX);
    }

    /// `consumer_notice` accepts a subset of what `wire::parse` accepts as a completion or
    /// failure notice, with the same id; or an id that is not UTF-8, which `wire::parse`
    /// calls `NotUtf8`.
    fn agrees(bytes: &[u8]) {
        if let Some((id, failed)) = consumer_notice(bytes) {
            if core::str::from_utf8(id).is_err() {
                assert_eq!(
                    wire::parse(bytes),
                    Err(wire::ParseError::NotUtf8),
                    "{bytes:?}"
                );
                return;
            }
            match wire::parse(bytes) {
                Ok(Message::Completion(c)) if !failed => assert_eq!(c.request_id.as_bytes(), id),
                Ok(Message::Failure(c)) if failed => assert_eq!(c.request_id.as_bytes(), id),
                other => panic!("{bytes:?}: fast path {id:?}/{failed}, parse {other:?}"),
            }
        }
    }

    #[test]
    fn fast_path_takes_the_common_notices() {
        assert_eq!(consumer_notice(b"req-1:2"), Some((&b"req-1"[..], false)));
        assert_eq!(
            consumer_notice(b"PUSH_FAIL:a:b:65535"),
            Some((&b"a:b"[..], true))
        );
        for slow in [
            &b"PUSH_REG:x:1"[..],
            b"HB:a,b",
            b"PUSH_CANCEL:x:1",
            b"x:0",
            b"x:65536",
            b"x:000001",
            b":1",
            b"PUSH_FAIL::1",
            b"x:",
            b"x1",
            b"x:1a",
            b"1",
        ] {
            assert_eq!(consumer_notice(slow), None, "{slow:?}");
        }
    }

    #[test]
    fn ids_outside_the_fast_path_still_count() {
        use crate::{
            AgentId, BlockHandle, Config, Expect, IgnoreReason, Ledger, Noticed, Registration,
            wire::ParseError,
        };
        let mut ledger: Ledger<64, 2> = Ledger::new(Config::with_capacity(64));
        for id in ["r\u{e9}q-1", "a:b", "HB"] {
            let _ticket = ledger
                .register(Registration {
                    id,
                    blocks: BlockHandle(0),
                    expect: Expect::Count(2),
                    deadline: None,
                })
                .expect("room");
        }
        let p = AgentId(0);
        // Non-ASCII id, six-digit TP field (slow parse), colon in the id.
        let notices: [&[u8]; 4] = [
            "r\u{e9}q-1:2".as_bytes(),
            "PUSH_FAIL:r\u{e9}q-1:000002".as_bytes(),
            b"a:b:2",
            b"a:b:2",
        ];
        let got = notices.map(|n| ledger.handle_notification(p, n).map_err(|e| e.reason));
        assert_eq!(
            got,
            [
                Ok(Noticed::Counted),
                Ok(Noticed::Decided),
                Ok(Noticed::Counted),
                Ok(Noticed::Decided)
            ]
        );
        // `HB:2` is a heartbeat, whatever ids are registered; bad UTF-8 is malformed.
        let hb = ledger.handle_notification(p, b"HB:2").map_err(|e| e.reason);
        assert_eq!(hb, Err(IgnoreReason::NotForConsumer));
        let bad = ledger
            .handle_notification(p, b"r\xc3q:2")
            .map_err(|e| e.reason);
        assert_eq!(bad, Err(IgnoreReason::Malformed(ParseError::NotUtf8)));
        let unknown = ledger
            .handle_notification(p, b"nope:2")
            .map_err(|e| e.reason);
        assert_eq!(unknown, Err(IgnoreReason::Unknown));
    }

    #[test]
    fn fast_path_agrees_with_the_parser() {
        // Under miri (~1000x slower) a sample still covers every shape and prefix.
        let (inputs, tps) = if cfg!(miri) {
            (2_000, 700)
        } else {
            (200_000, 70_000u32)
        };
        let alphabet = b":0123456789PUSH_FAILREGBCN,a\xc3\xa9\x80";
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut buf = [0u8; 24];
        for _ in 0..inputs {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 24) as usize;
            let mut y = x;
            for b in buf.iter_mut().take(len) {
                y = y.wrapping_mul(0x2545_F491_4F6C_DD1D).wrapping_add(1);
                *b = alphabet[(y >> 59) as usize % alphabet.len()];
            }
            agrees(&buf[..len]);
            // With the prefixes in front.
            for prefix in [&b"PUSH_FAIL:"[..], b"PUSH_REG:", b"HB:", b"PUSH_CANCEL:"] {
                let mut v = prefix.to_vec();
                v.extend_from_slice(&buf[..len]);
                agrees(&v);
            }
        }
        for tp in (0..tps).chain(65_530..65_540) {
            agrees(format!("id:{tp}").as_bytes());
            agrees(format!("PUSH_FAIL:id:{tp:06}").as_bytes());
        }
    }
}
