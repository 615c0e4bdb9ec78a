//! `ProducerDriver::next_timer`: a loop that ticks the producer only at the time it
//! names (or on new input) misses no lease and leaves no offered or retired work undone.

mod common;

use common::registration;
use kvdrain::{Duration, Instant, wire};
use kvdrain_driver::memory::{MemoryFabric, MemoryTransport, MemoryWrite};
use kvdrain_driver::producer::{Offer, ProducerConfig, ProducerDriver, ProducerEvent};

const LEASE: u64 = 90;

/// The instant `ms` after the epoch.
fn at(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

fn producer() -> (MemoryFabric, ProducerDriver<MemoryWrite>, MemoryTransport) {
    let fabric = MemoryFabric::new();
    let t = fabric.endpoint("p0");
    fabric.publish_consumer("engine-d", 0, "d0");
    let mut config = ProducerConfig::new("engine-p", 0, 1);
    config.lease = Duration::from_millis(LEASE);
    (fabric, ProducerDriver::new(config), t)
}

fn offer(p: &mut ProducerDriver<MemoryWrite>, id: &str, now: u64) {
    let offer = Offer {
        request_id: id.into(),
        transfer_id: None,
        block_ids: vec![vec![1]],
    };
    p.offer(offer, at(now)).expect("offer");
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

#[test]
fn offers_wake_the_producer_when_their_lease_ends() {
    let (_fabric, mut p, mut t) = producer();
    assert_eq!(p.next_timer(), None, "nothing held, nothing due");
    offer(&mut p, "a", 10);
    offer(&mut p, "b", 40);
    assert_eq!(p.next_timer(), Some(at(10 + LEASE)));
    p.tick(&mut t, at(50)).expect("tick");
    assert!(released(&mut p).is_empty());
    assert_eq!(p.next_timer(), Some(at(10 + LEASE)), "nothing changed");
    // Ticking exactly then ends a's lease, and names b's.
    p.tick(&mut t, at(10 + LEASE)).expect("tick");
    assert_eq!(released(&mut p), ["a"]);
    assert_eq!(p.next_timer(), Some(at(40 + LEASE)));
    p.tick(&mut t, at(40 + LEASE)).expect("tick");
    assert_eq!(released(&mut p), ["b"]);
    assert_eq!(p.next_timer(), None);
}

#[test]
fn work_left_by_offer_or_retire_is_due_at_once() {
    let (fabric, mut p, mut t) = producer();
    // The registration comes first and is stashed; the offer pairs it: a push to start.
    fabric.inject("d0", "p0", &registration("r"));
    p.tick(&mut t, at(1)).expect("tick");
    assert_eq!(
        p.next_timer(),
        None,
        "a stashed registration waits for its offer"
    );
    offer(&mut p, "r", 5);
    assert_eq!(
        p.next_timer(),
        Some(at(5)),
        "the paired push starts at the next tick"
    );
    fabric.set_write_polls(1_000);
    p.tick(&mut t, at(6)).expect("tick");
    assert_eq!(p.counters().posted, 1);
    assert_eq!(
        p.next_timer(),
        Some(at(5 + LEASE)),
        "a posted write's status is input; the lease is the timer"
    );
    // Retired mid-write: nothing more to post and no lease to watch; the source waits for
    // the write, which is input.
    p.retire("r");
    assert_eq!(
        p.next_timer(),
        Some(at(6)),
        "the retire is taken at the next tick"
    );
    p.tick(&mut t, at(7)).expect("tick");
    assert_eq!(p.next_timer(), None);
    assert!(
        released(&mut p).is_empty(),
        "F3: the write still reads the source"
    );
}

#[test]
fn a_heartbeat_moves_the_wakeup_to_the_extended_lease() {
    let (fabric, mut p, mut t) = producer();
    offer(&mut p, "r", 0);
    let mut hb = [0u8; 64];
    let n = wire::encode_heartbeat(["r"].into_iter(), &mut hb).expect("heartbeat bytes");
    fabric.inject("d0", "p0", &hb[..n]);
    p.tick(&mut t, at(60)).expect("tick");
    let extended = at(60) + p.config().lease_extension();
    assert!(extended > at(LEASE));
    assert_eq!(p.next_timer(), Some(extended));
    p.tick(&mut t, at(LEASE)).expect("tick");
    assert!(
        released(&mut p).is_empty(),
        "the old lease end passes: still held"
    );
    p.tick(&mut t, extended).expect("tick");
    assert_eq!(
        released(&mut p),
        ["r"],
        "released at the extended lease end"
    );
    assert_eq!(p.next_timer(), None);
}
