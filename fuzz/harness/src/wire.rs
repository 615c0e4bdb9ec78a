//! `wire`: arbitrary bytes into the notification parser.
//!
//! * `parse` never panics and agrees with the spec's rules (`spec_parse`, written apart);
//! * parse → emit → parse gives the same message, and the same bytes where the input was
//!   canonical;
//! * the same bytes read as fields (id, TP size, heartbeat ids): emit → parse gives the
//!   fields back whenever emitting succeeds.

use arbitrary::{Arbitrary, Unstructured};

use crate::spec_parse::{SpecMessage, spec_parse};
use kvdrain::wire::{
    Body, EncodeError, Message, encode_cancel, encode_heartbeat, encode_registration, parse,
};

/// Runs one fuzz input.
pub fn wire(data: &[u8]) {
    let parsed = parse(data);
    agrees_with_spec(data, parsed);
    if let Ok(message) = parsed {
        reparse(data, message);
    }
    fields_round_trip(data);
}

fn agrees_with_spec(data: &[u8], parsed: Result<Message<'_>, kvdrain::wire::ParseError>) {
    match (parsed, spec_parse(data)) {
        (
            Ok(Message::Completion(c)),
            SpecMessage::Notice {
                id,
                tp,
                failed: false,
            },
        )
        | (
            Ok(Message::Failure(c)),
            SpecMessage::Notice {
                id,
                tp,
                failed: true,
            },
        ) => {
            assert_eq!(c.request_id, id, "request id of {data:?}");
            assert_eq!(c.tp_size, tp, "TP size of {data:?}");
        }
        (
            Ok(Message::Heartbeat(_) | Message::Registration(_) | Message::Cancel(_)),
            SpecMessage::NotForConsumer,
        )
        | (Err(_), SpecMessage::Malformed) => {}
        (parsed, spec) => panic!("{data:?}: parser says {parsed:?}, spec says {spec:?}"),
    }
}

/// Whether the TP digits at the end of `data` have no leading zero (emitting writes none).
fn canonical_tp(data: &[u8]) -> bool {
    let digits = data.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    data[data.len() - digits] != b'0'
}

fn reparse(data: &[u8], message: Message<'_>) {
    let mut buf = std::vec![0u8; data.len() + 16];
    let n = match message {
        Message::Completion(c) => c.encode(&mut buf),
        Message::Failure(c) => c.encode_failure(&mut buf),
        Message::Heartbeat(hb) => {
            let ids: Vec<&str> = hb.ids().collect();
            encode_heartbeat(ids.iter().copied(), &mut buf)
        }
        Message::Registration(payload) => encode_registration(payload, &mut buf),
        Message::Cancel(id) => encode_cancel(id, &mut buf),
    }
    .unwrap_or_else(|e| panic!("{data:?} parsed as {message:?} but does not emit: {e}"));
    match (message, parse(&buf[..n])) {
        // Empty heartbeat entries are dropped: compare the id lists.
        (Message::Heartbeat(a), Ok(Message::Heartbeat(b))) => {
            assert!(a.ids().eq(b.ids()), "{data:?} → {:?}", &buf[..n]);
        }
        (message, again) => assert_eq!(again, Ok(message), "{data:?} → {:?}", &buf[..n]),
    }
    let canonical = match message {
        Message::Completion(_) | Message::Failure(_) => canonical_tp(data),
        // No empty entries between the commas.
        Message::Heartbeat(hb) => hb.ids().collect::<Vec<_>>().join(",").len() + 3 == data.len(),
        Message::Registration(_) | Message::Cancel(_) => true,
    };
    if canonical {
        assert_eq!(&buf[..n], data, "emitting {message:?} changed the bytes");
    }
}

fn fields_round_trip(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(id), Ok(tp)) = (<&str>::arbitrary(&mut u), u16::arbitrary(&mut u)) else {
        return;
    };
    let c = Body {
        request_id: id,
        tp_size: tp,
    };
    let mut buf = std::vec![0u8; id.len() + 32];
    match c.encode(&mut buf) {
        Ok(n) => {
            assert_eq!(n, c.encoded_len());
            assert_eq!(parse(&buf[..n]), Ok(Message::Completion(c)), "emit {c:?}");
        }
        Err(e) => refused_for_a_reason(&c, e),
    }
    match c.encode_failure(&mut buf) {
        Ok(n) => assert_eq!(
            parse(&buf[..n]),
            Ok(Message::Failure(c)),
            "emit failure {c:?}"
        ),
        Err(e) => refused_for_a_reason(&c, e),
    }
    // A too-short buffer is refused without writing.
    let mut short = std::vec![0xAAu8; c.encoded_len().saturating_sub(1)];
    if c.encode(&mut short).is_ok() {
        panic!("{c:?} emitted into {} bytes", short.len());
    }
    assert!(short.iter().all(|&b| b == 0xAA), "a refused emit wrote");
    let Ok(ids) = Vec::<&str>::arbitrary(&mut u) else {
        return;
    };
    let mut buf = std::vec![0u8; ids.iter().map(|i| i.len() + 1).sum::<usize>() + 8];
    match encode_heartbeat(ids.iter().copied(), &mut buf) {
        Ok(n) => {
            let Ok(Message::Heartbeat(hb)) = parse(&buf[..n]) else {
                panic!("heartbeat {ids:?} does not parse back");
            };
            assert!(hb.ids().eq(ids.iter().copied()), "heartbeat ids {ids:?}");
        }
        Err(e) => {
            assert_eq!(e, EncodeError::BadHeartbeatId, "heartbeat {ids:?}");
            assert!(ids.iter().any(|i| i.is_empty() || i.contains(',')));
        }
    }
}

fn refused_for_a_reason(c: &Body<'_>, e: EncodeError) {
    match e {
        EncodeError::EmptyRequestId => assert!(c.request_id.is_empty()),
        EncodeError::ZeroTpSize => assert_eq!(c.tp_size, 0),
        EncodeError::ReservedPrefix => {
            let bytes = std::format!("{}:", c.request_id);
            let reserved = ["HB:", "PUSH_FAIL:", "PUSH_REG:", "PUSH_CANCEL:"];
            assert!(
                reserved.iter().any(|p| bytes.starts_with(p)),
                "{c:?} refused"
            );
        }
        e => panic!("{c:?} refused: {e}"),
    }
}
