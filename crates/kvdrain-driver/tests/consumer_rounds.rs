//! The consumer driver's round, seen from its halves: a failed drain leaves the rest of
//! the round done, and the engine half says when the next round has work.
//!
//! No producer driver runs here: the producers are bare endpoints of the in-process
//! fabric, so nothing lands and only the consumer's own timers and sends decide.

mod common;

use common::{P_ENGINE, consumer_rank, producer_agents};
use kvdrain::{BlockHandle, Config, Duration, Instant, Outstanding};
use kvdrain_driver::Transport;
use kvdrain_driver::consumer::{ConsumerDriver, ConsumerEvent, EdgeMode, ReceiveSpec};
use kvdrain_driver::memory::{MemoryFabric, MemoryTransport, MemoryWrite};
use kvdrain_driver::transport::{
    DrainError, GonePeer, Notification, Peer, PostError, Posted, SendError, WriteSpec, WriteStatus,
};

const LEASE: Duration = Duration::from_millis(600);
/// `LEASE / 6`.
const HEARTBEAT: Duration = Duration::from_millis(100);

/// The instant `ms` after the epoch.
fn at(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

/// D's endpoint with two faults to switch on: every drain fails (consuming nothing), and
/// the transport keeps quiet about peers it saw go (so a dead producer is found only by a
/// failed send).
struct Faulty<'a> {
    inner: &'a mut MemoryTransport,
    fail_drain: bool,
    hide_gone: bool,
}

impl Transport for Faulty<'_> {
    type Write = MemoryWrite;
    fn post_write(&mut self, spec: &WriteSpec<'_>) -> Result<Posted<MemoryWrite>, PostError> {
        self.inner.post_write(spec)
    }
    fn poll_write(&mut self, write: &mut MemoryWrite) -> WriteStatus {
        self.inner.poll_write(write)
    }
    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError> {
        self.inner.send_notification(to, bytes)
    }
    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError> {
        if self.fail_drain {
            return Err(DrainError("injected".into()));
        }
        self.inner.drain_notifications(out)
    }
    fn peer_gone(&mut self) -> Option<GonePeer> {
        if self.hide_gone {
            return None;
        }
        self.inner.peer_gone()
    }
}

/// D rank 0 of TP 1 for a TP-2 producer engine (agents `p0`, `p1`), releasing with the
/// decision (`settle` zero); the fabric and D's endpoint.
fn consumer() -> (ConsumerDriver<64, 8>, MemoryFabric, MemoryTransport) {
    let fabric = MemoryFabric::new();
    let dt = fabric.endpoint("d0");
    for p in ["p0", "p1"] {
        fabric.endpoint(p);
    }
    let mut ledger = Config::with_capacity(64);
    ledger.deadline = Duration::from_millis(1_000);
    ledger.quarantine = Duration::from_millis(2_000);
    ledger.settle = Duration::from_millis(0);
    let d = consumer_rank(ledger, LEASE, producer_agents(2));
    (d, fabric, dt)
}

fn request(id: &str, deadline_ms: Option<u64>) -> ReceiveSpec<'_> {
    ReceiveSpec {
        id,
        producer_engine: P_ENGINE,
        remote_request_id: id,
        transfer_id: None,
        blocks: BlockHandle(7),
        block_ids: vec![vec![10, 11]],
        deadline: deadline_ms.map(Duration::from_millis),
    }
}

/// A poll whose drain fails still does the rest of its round, and reports the failure
/// after it: the producer the transport saw go is reported gone (its named edge fails),
/// the deadline that passed expires, and the heartbeat that is due goes out.
#[test]
fn a_failed_drain_leaves_the_rest_of_the_round_done() {
    let (mut d, fabric, mut dt) = consumer();
    // r counts its writes (a gone resolves nothing of it): only its deadline decides.
    // s names p0 and p1: p1 gone fails its edge of p1 (the failure waits for p0's, which
    // never comes here), and it still waits at 250, so the heartbeat round names it.
    let mut engine = d.engine();
    engine
        .register_with(
            &mut dt,
            request("r", Some(250)),
            EdgeMode::Count,
            Instant::ZERO,
        )
        .expect("register r");
    engine
        .register(&mut dt, request("s", None), Instant::ZERO)
        .expect("register s");
    fabric.kill("p1");
    let mut p0 = fabric.endpoint("p0");
    let mut heard = Vec::new();
    p0.drain_notifications(&mut heard).expect("p0 drains");
    assert_eq!(heard.len(), 2, "the two PUSH_REGs");
    let sent_before = d.counters().heartbeats_sent;

    let mut failing = Faulty {
        inner: &mut dt,
        fail_drain: true,
        hide_gone: false,
    };
    let polled = d.poll(&mut failing, at(250));
    assert_eq!(polled, Err(DrainError("injected".into())));

    let mut engine = d.engine();
    let expired = engine.poll_event();
    assert!(
        matches!(
            &expired,
            Some(ConsumerEvent::Expired {
                request,
                outstanding: Outstanding::Count(2),
                ..
            }) if request.id == "r"
        ),
        "the deadline passed in the failed poll: {expired:?}"
    );
    assert_eq!(engine.poll_event(), None, "s waits for p0");
    assert_eq!(engine.in_flight(), 2);
    let counters = d.counters();
    assert_eq!((counters.disconnects, counters.gones), (1, 1));
    assert_eq!(counters.gone_edges, 1, "s's edge of p1, in the failed poll");
    assert_eq!(
        counters.heartbeats_sent,
        sent_before + 1,
        "the heartbeat due at 100 went out (to p0 only)"
    );
    heard.clear();
    p0.drain_notifications(&mut heard).expect("p0 drains");
    assert_eq!(heard, [("d0".to_owned(), b"HB:s".to_vec())], "names only s");
}

/// The engine half, split from its ingest half as an engine thread holds it, says when its
/// next round has work: the heartbeat, then a producer whose send failed (at once), then
/// the deadline; its `poll` at that time does the work.
#[test]
fn the_engine_half_says_when_to_wake_it() {
    let (mut d, fabric, mut dt) = consumer();
    let (_ingest, mut engine) = d.split();
    assert_eq!(engine.next_timer(), None, "nothing tracked, nothing due");
    engine
        .register_with(
            &mut dt,
            request("r", Some(250)),
            EdgeMode::Count,
            Instant::ZERO,
        )
        .expect("register");
    assert_eq!(engine.next_timer(), Some(Instant::ZERO + HEARTBEAT));

    // p1 dies; this transport does not say so: D learns it from the heartbeat's send.
    fabric.kill("p1");
    let mut quiet = Faulty {
        inner: &mut dt,
        fail_drain: false,
        hide_gone: true,
    };
    assert_eq!(
        engine.poll(&mut quiet, Instant::ZERO + HEARTBEAT),
        0,
        "nothing ingested: no ready request to take"
    );
    assert_eq!(
        engine.next_timer(),
        Some(Instant::ZERO + HEARTBEAT),
        "the failed send is to be reported gone now"
    );
    assert_eq!(
        engine.poll(&mut quiet, Instant::ZERO + HEARTBEAT),
        0,
        "nothing ingested: no ready request to take"
    );
    assert_eq!(
        engine.next_timer(),
        Some(Instant::ZERO + HEARTBEAT + HEARTBEAT)
    );
    assert_eq!(
        engine.poll_event(),
        None,
        "a gone resolves nothing of a count"
    );

    assert_eq!(
        engine.poll(&mut quiet, Instant::ZERO + HEARTBEAT + HEARTBEAT),
        0,
        "nothing ingested: no ready request to take"
    );
    assert_eq!(
        engine.next_timer(),
        Some(at(250)),
        "the deadline comes first"
    );
    assert_eq!(
        engine.poll(&mut quiet, at(249)),
        0,
        "nothing ingested: no ready request to take"
    );
    assert_eq!(engine.poll_event(), None, "not before its time");
    assert_eq!(
        engine.poll(&mut quiet, at(250)),
        0,
        "nothing ingested: no ready request to take"
    );
    assert!(matches!(
        engine.poll_event(),
        Some(ConsumerEvent::Expired { .. })
    ));
    let counters = d.counters();
    assert_eq!((counters.disconnects, counters.gones), (1, 1));
}

/// A failure notice drained in a round is dated at that round's time, not at the round
/// before (the engine's last advance): its blocks settle from when it was drained (rule
/// 8). Steps at 0 and 10, then a slow one: the notice is drained at 600, settle 500.
#[test]
fn a_failure_notice_settles_from_the_round_that_drained_it() {
    // `consumer()`'s fabric and endpoints; its driver releases with the decision, this
    // one settles.
    let (_, fabric, mut dt) = consumer();
    let mut ledger = Config::with_capacity(64);
    ledger.settle = Duration::from_millis(500);
    ledger.deadline = Duration::from_millis(100_000);
    let mut settling = consumer_rank(ledger, Duration::from_millis(1_000_000), producer_agents(2));
    settling
        .engine()
        .register(&mut dt, request("s", None), Instant::ZERO)
        .expect("register s");
    settling.poll(&mut dt, at(10)).expect("round at 10");
    let mut p0 = fabric.endpoint("p0");
    let mut p1 = fabric.endpoint("p1");
    let d0 = Peer::Agent("d0");
    p0.send_notification(d0, b"s:2").expect("p0 sends");
    p1.send_notification(d0, b"PUSH_FAIL:s:2")
        .expect("p1 sends");
    settling
        .poll(&mut dt, at(600))
        .expect("the slow step's round");
    let mut engine = settling.engine();
    assert!(matches!(
        engine.poll_event(),
        Some(ConsumerEvent::Failed { .. })
    ));
    assert_eq!(
        engine.poll_event(),
        None,
        "not released in the round it is seen"
    );
    settling.poll(&mut dt, at(1_099)).expect("round");
    assert_eq!(settling.engine().poll_event(), None);
    settling.poll(&mut dt, at(1_100)).expect("round");
    assert!(matches!(
        settling.engine().poll_event(),
        Some(ConsumerEvent::Release { forced: false, .. })
    ));
}
