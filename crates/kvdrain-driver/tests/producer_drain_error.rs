//! A failed drain leaves the producer's round done, as it does the consumer's: the tick
//! polls every posted WRITE, sends what is owed, releases sources and expires leases, then
//! returns the drain's error.

mod common;

use common::registration;
use kvdrain::{Duration, Instant, wire};
use kvdrain_driver::Transport;
use kvdrain_driver::memory::{MemoryFabric, MemoryTransport, MemoryWrite};
use kvdrain_driver::producer::{Offer, ProducerConfig, ProducerDriver, ProducerEvent};
use kvdrain_driver::transport::{
    DrainError, GonePeer, Notification, Peer, PostError, Posted, SendError, WriteSpec, WriteStatus,
};

/// The in-process transport, but while `fail_drain` is set every drain fails and hands over
/// nothing (as NIXL's `get_notifications` returning an error does); `drains` counts calls.
struct DrainFails {
    inner: MemoryTransport,
    fail_drain: bool,
    drains: usize,
}

impl Transport for DrainFails {
    type Write = MemoryWrite;
    fn post_write(&mut self, spec: &WriteSpec<'_>) -> Result<Posted<MemoryWrite>, PostError> {
        self.inner.post_write(spec)
    }
    fn poll_write(&mut self, w: &mut MemoryWrite) -> WriteStatus {
        self.inner.poll_write(w)
    }
    fn send_notification(&mut self, to: Peer<'_>, bytes: &[u8]) -> Result<(), SendError> {
        self.inner.send_notification(to, bytes)
    }
    fn drain_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), DrainError> {
        self.drains += 1;
        if self.fail_drain {
            return Err(DrainError("get_notifications: backend error".into()));
        }
        self.inner.drain_notifications(out)
    }
    fn peer_gone(&mut self) -> Option<GonePeer> {
        self.inner.peer_gone()
    }
}

fn offer(id: &str) -> Offer {
    Offer {
        request_id: id.into(),
        transfer_id: None,
        block_ids: vec![vec![1]],
    }
}

fn released(p: &mut ProducerDriver<MemoryWrite>) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(e) = p.poll_event() {
        if let ProducerEvent::SourceReleased { request_id } = e {
            ids.push(request_id);
        }
    }
    ids
}

/// What consumer agent `d0` received: `(completions, failure notices)` by request id.
fn received(d0: &mut MemoryTransport) -> (Vec<String>, Vec<String>) {
    let mut inbox = Vec::new();
    d0.drain_notifications(&mut inbox)
        .expect("in-process drain");
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for (_, bytes) in &inbox {
        match wire::parse(bytes) {
            Ok(wire::Message::Completion(c)) => done.push(c.request_id.to_owned()),
            Ok(wire::Message::Failure(c)) => failed.push(c.request_id.to_owned()),
            other => panic!("unexpected notification {other:?}"),
        }
    }
    (done, failed)
}

#[test]
fn a_failed_drain_still_polls_writes_sends_owed_notices_and_releases() {
    let fabric = MemoryFabric::new();
    let mut d0 = fabric.endpoint("d0");
    fabric.publish_consumer("engine-d", 0, "d0");
    // Every WRITE is in progress for one poll, then lands.
    fabric.set_write_polls(1);
    let mut t = DrainFails {
        inner: fabric.endpoint("p0"),
        fail_drain: false,
        drains: 0,
    };
    let mut p = ProducerDriver::new(ProducerConfig::new("engine-p", 0, 1));
    // `w` pairs and is posted; `s` is registered and stashed.
    fabric.inject("d0", "p0", &registration("w"));
    fabric.inject("d0", "p0", &registration("s"));
    p.offer(offer("w"), Instant::from_millis(0)).expect("offer");
    let first = p.tick(&mut t, Instant::from_millis(1)).expect("tick");
    assert_eq!(
        (first.notifications, first.posted, first.finished),
        (2, 1, 0)
    );
    assert!(released(&mut p).is_empty());
    // `s` is offered (pairing its stashed registration) and retired at once: its only
    // edge was never posted, so the next tick owes its consumer a PUSH_FAIL.
    p.offer(offer("s"), Instant::from_millis(1)).expect("offer");
    p.retire("s");
    assert_eq!(
        p.next_timer(),
        Some(Instant::from_millis(1)),
        "work queued for the next tick"
    );

    t.fail_drain = true;
    let err = p
        .tick(&mut t, Instant::from_millis(2))
        .expect_err("the drain fails");
    assert_eq!(err, DrainError("get_notifications: backend error".into()));
    assert_eq!(t.drains, 2);
    // The rest of the round ran: `w`'s WRITE was polled to `Success` (its completion
    // delivered), `s`'s owed notice went out, and both sources came back.
    let k = p.counters();
    assert_eq!((k.posted, k.landed, k.notices_sent), (1, 1, 1), "{k:?}");
    assert_eq!(received(&mut d0), (vec!["w".into()], vec!["s".into()]));
    let mut back = released(&mut p);
    back.sort();
    assert_eq!(back, ["s", "w"]);
    assert_eq!(p.in_flight(), 0, "both pushes are over");
    assert_eq!(p.next_timer(), None, "nothing left for the next tick");
    assert_eq!(fabric.take_landed().len(), 1);

    // A later tick whose drain works finds nothing left to do.
    t.fail_drain = false;
    let after = p.tick(&mut t, Instant::from_millis(3)).expect("tick");
    assert_eq!((after.posted, after.finished, after.notices), (0, 0, 0));
}

#[test]
fn a_failed_drain_still_expires_leases() {
    let fabric = MemoryFabric::new();
    let mut config = ProducerConfig::new("engine-p", 0, 1);
    config.lease = Duration::from_millis(10);
    let mut p = ProducerDriver::new(config);
    let mut t = DrainFails {
        inner: fabric.endpoint("p0"),
        fail_drain: true,
        drains: 0,
    };
    p.offer(offer("o"), Instant::from_millis(0)).expect("offer");
    assert!(p.tick(&mut t, Instant::from_millis(10)).is_err());
    assert_eq!(
        released(&mut p),
        ["o"],
        "the lease ran out in the failed round"
    );
    assert_eq!(p.counters().leases_expired, 1);
}
