//! The vLLM push-mode notification messages, parsed and emitted byte-exactly.
//!
//! | message | direction | bytes |
//! | --- | --- | --- |
//! | completion | P → D, attached to each WRITE | `{D_request_id}:{P_tp_size}` |
//! | failure notice | P → D, standalone | `PUSH_FAIL:{D_request_id}:{P_tp_size}` |
//! | heartbeat | D → P | `HB:{P_request_id},{P_request_id},...` |
//! | registration | D → P | `PUSH_REG:` + msgpack map (opaque here) |
//! | cancel | D → P, standalone | `PUSH_CANCEL:{D_request_id}` |
//!
//! Parsing follows vLLM's order (`push_worker._get_new_notifs`): the `PUSH_REG:` prefix is
//! matched on the raw bytes, then the message must be UTF-8, then `HB:`, then `PUSH_FAIL:`;
//! a completion body is split at its **last** `:` so ids may contain `:`. `PUSH_CANCEL:` is
//! kvdrain's own (vLLM has no D → P cancel): it is read after `HB:`, and everything after
//! its prefix is the id. A vLLM P takes it for a completion of the unknown id
//! `PUSH_CANCEL` (or `PUSH_CANCEL:…` when the id holds a `:`) and drops it. Parsing borrows
//! from the input and never allocates; emitting writes into a caller buffer.

use core::fmt;

/// Prefix of a failure notice (`PUSH_FAIL_NOTIF_PREFIX` in vLLM).
pub const PUSH_FAIL_PREFIX: &[u8] = b"PUSH_FAIL:";
/// Prefix of a registration (`PUSH_REG_NOTIF_PREFIX` in vLLM).
pub const PUSH_REG_PREFIX: &[u8] = b"PUSH_REG:";
/// Prefix of a heartbeat.
pub const HEARTBEAT_PREFIX: &[u8] = b"HB:";
/// Prefix of a cancel: the consumer gave up a request it registered (kvdrain's own).
pub const PUSH_CANCEL_PREFIX: &[u8] = b"PUSH_CANCEL:";

/// The body shared by completions and failure notices: `{request_id}:{tp_size}`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Body<'a> {
    /// The consumer's request id (may contain `:`; never empty).
    pub request_id: &'a str,
    /// The producer's tensor-parallel size, `1..=65535`.
    pub tp_size: u16,
}

/// A parsed notification.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Message<'a> {
    /// A WRITE landed: one edge of the request delivered its data.
    Completion(Body<'a>),
    /// `PUSH_FAIL:`: the sender's write for this request did not complete and will not be
    /// reported otherwise. Bytes of a write that failed after it was posted may still land
    /// for a while: the consumer lets the notice settle (`Config::settle`).
    Failure(Body<'a>),
    /// `HB:`: producer-bound lease renewal.
    Heartbeat(Heartbeat<'a>),
    /// `PUSH_REG:`: producer-bound registration; the msgpack payload after the prefix.
    Registration(&'a [u8]),
    /// `PUSH_CANCEL:`: producer-bound; the consumer gave up its request with this id
    /// (aborted or expired), so the producer must not start a WRITE for it. A WRITE
    /// already posted runs to its end and is reported as usual.
    Cancel(&'a str),
}

/// A heartbeat body: comma-separated producer-side request ids.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Heartbeat<'a> {
    ids: &'a str,
}

impl<'a> Heartbeat<'a> {
    /// The request ids the heartbeat renews, in order; empty entries are skipped.
    pub fn ids(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.ids.split(',').filter(|id| !id.is_empty())
    }
}

/// Why a notification could not be parsed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ParseError {
    /// The bytes (other than a `PUSH_REG:` payload) are not UTF-8.
    NotUtf8,
    /// The body has no `:` separating the id from the TP size.
    MissingSeparator,
    /// Nothing before the last `:`.
    EmptyRequestId,
    /// The TP size is empty or not made of ASCII digits.
    TpSizeNotDecimal,
    /// The TP size is a number outside `1..=65535`.
    TpSizeOutOfRange,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseError::NotUtf8 => "notification is not valid UTF-8",
            ParseError::MissingSeparator => "no ':' between request id and TP size",
            ParseError::EmptyRequestId => "empty request id",
            ParseError::TpSizeNotDecimal => "TP size is not a decimal number",
            ParseError::TpSizeOutOfRange => "TP size is outside 1..=65535",
        })
    }
}

impl core::error::Error for ParseError {}

/// Parses one notification.
///
/// # Errors
/// A [`ParseError`] naming the first rule the bytes break.
pub fn parse(bytes: &[u8]) -> Result<Message<'_>, ParseError> {
    if let Some(payload) = bytes.strip_prefix(PUSH_REG_PREFIX) {
        return Ok(Message::Registration(payload));
    }
    let text = core::str::from_utf8(bytes).map_err(|_| ParseError::NotUtf8)?;
    if let Some(ids) = text.strip_prefix("HB:") {
        return Ok(Message::Heartbeat(Heartbeat { ids }));
    }
    if let Some(request_id) = text.strip_prefix("PUSH_CANCEL:") {
        if request_id.is_empty() {
            return Err(ParseError::EmptyRequestId);
        }
        return Ok(Message::Cancel(request_id));
    }
    match text.strip_prefix("PUSH_FAIL:") {
        Some(body) => parse_body(body).map(Message::Failure),
        None => parse_body(text).map(Message::Completion),
    }
}

fn parse_body(body: &str) -> Result<Body<'_>, ParseError> {
    let (request_id, tp) = body.rsplit_once(':').ok_or(ParseError::MissingSeparator)?;
    if request_id.is_empty() {
        return Err(ParseError::EmptyRequestId);
    }
    Ok(Body {
        request_id,
        tp_size: parse_tp_size(tp.as_bytes())?,
    })
}

fn parse_tp_size(digits: &[u8]) -> Result<u16, ParseError> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ParseError::TpSizeNotDecimal);
    }
    let mut value: u32 = 0;
    for &d in digits {
        value = value * 10 + u32::from(d - b'0');
        if value > u32::from(u16::MAX) {
            return Err(ParseError::TpSizeOutOfRange);
        }
    }
    match u16::try_from(value) {
        Ok(0) | Err(_) => Err(ParseError::TpSizeOutOfRange),
        Ok(tp) => Ok(tp),
    }
}

/// Why a message could not be emitted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is shorter than `needed` bytes; nothing was written.
    BufferTooSmall {
        /// Bytes the message needs.
        needed: usize,
    },
    /// The request id is empty.
    EmptyRequestId,
    /// The TP size is 0.
    ZeroTpSize,
    /// A heartbeat id is empty or contains `,`, which would change the id list.
    BadHeartbeatId,
    /// A completion's bytes would start with `HB:`, `PUSH_FAIL:`, `PUSH_REG:` or
    /// `PUSH_CANCEL:` (ids such as `HB`, `HB:x` or `PUSH_FAIL:x`) and parse as another
    /// message (a failure notice for another id, say).
    ReservedPrefix,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BufferTooSmall { needed } => {
                write!(f, "output buffer too small: {needed} bytes needed")
            }
            EncodeError::EmptyRequestId => f.write_str("empty request id"),
            EncodeError::ZeroTpSize => f.write_str("TP size 0"),
            EncodeError::BadHeartbeatId => f.write_str("heartbeat id is empty or contains ','"),
            EncodeError::ReservedPrefix => f.write_str(
                "completion would start with a message prefix (HB:, PUSH_FAIL:, PUSH_REG:, \
                 PUSH_CANCEL:)",
            ),
        }
    }
}

impl core::error::Error for EncodeError {}

/// A cursor over a caller buffer that checks the length before writing anything.
struct Out<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Out<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

fn reserve(buf: &mut [u8], needed: usize) -> Result<Out<'_>, EncodeError> {
    if buf.len() < needed {
        return Err(EncodeError::BufferTooSmall { needed });
    }
    Ok(Out { buf, at: 0 })
}

/// Formats `n` in decimal into a small stack buffer.
fn decimal(n: u16) -> ([u8; 5], usize) {
    let mut digits = [0u8; 5];
    let mut n = n;
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - start;
    digits.copy_within(start.., 0);
    (digits, len)
}

impl Body<'_> {
    /// Bytes [`encode`](Self::encode) writes.
    pub fn encoded_len(&self) -> usize {
        self.request_id.len() + 1 + decimal(self.tp_size).1
    }

    /// Writes the completion body `{request_id}:{tp_size}`; returns its length.
    ///
    /// # Errors
    /// [`EncodeError`] if the buffer is too short or the fields could not be parsed back.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        self.encode_with(&[], out)
    }

    /// Writes the failure notice `PUSH_FAIL:{request_id}:{tp_size}`; returns its length.
    ///
    /// # Errors
    /// As [`encode`](Self::encode).
    pub fn encode_failure(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        self.encode_with(PUSH_FAIL_PREFIX, out)
    }

    fn encode_with(&self, prefix: &[u8], out: &mut [u8]) -> Result<usize, EncodeError> {
        if self.request_id.is_empty() {
            return Err(EncodeError::EmptyRequestId);
        }
        if self.tp_size == 0 {
            return Err(EncodeError::ZeroTpSize);
        }
        // After `PUSH_FAIL:` any id reads back; a bare completion must not start like
        // another message.
        if prefix.is_empty() && completion_reads_as_another_message(self.request_id) {
            return Err(EncodeError::ReservedPrefix);
        }
        let (digits, n) = decimal(self.tp_size);
        let needed = prefix.len() + self.encoded_len();
        let mut o = reserve(out, needed)?;
        o.put(prefix);
        o.put(self.request_id.as_bytes());
        o.put(b":");
        o.put(&digits[..n]);
        Ok(needed)
    }
}

/// Whether the completion `{request_id}:{tp}` starts like another message, counting the
/// `:` that follows the id (id `HB` gives `HB:2`), and so parses as it.
fn completion_reads_as_another_message(request_id: &str) -> bool {
    let id = request_id.as_bytes();
    let reserved = |p: &[u8]| {
        let n = p.len() - 1;
        id.get(..n) == Some(&p[..n]) && id.get(n).is_none_or(|&b| b == b':')
    };
    [
        HEARTBEAT_PREFIX,
        PUSH_FAIL_PREFIX,
        PUSH_REG_PREFIX,
        PUSH_CANCEL_PREFIX,
    ]
    .into_iter()
    .any(reserved)
}

/// Whether a request registered under `request_id` could ever complete: `Err` when its
/// completions cannot exist on the wire, because the id is empty
/// ([`EncodeError::EmptyRequestId`]) or its completion would parse as another message
/// ([`EncodeError::ReservedPrefix`]: ids `HB`, `HB:...`, `PUSH_REG:...`,
/// `PUSH_FAIL:...`, `PUSH_CANCEL:...`). [`Engine::register`](crate::Engine::register) accepts such ids (a
/// replay trace may register them, and they expire); an API that wants to refuse them
/// up front asks this.
///
/// # Errors
/// As above.
pub fn check_request_id(request_id: &str) -> Result<(), EncodeError> {
    if request_id.is_empty() {
        Err(EncodeError::EmptyRequestId)
    } else if completion_reads_as_another_message(request_id) {
        Err(EncodeError::ReservedPrefix)
    } else {
        Ok(())
    }
}

/// Writes a heartbeat `HB:id,id,...` for the given producer-side request ids; returns its
/// length.
///
/// # Errors
/// [`EncodeError::BadHeartbeatId`] for an empty id or one containing `,`;
/// [`EncodeError::BufferTooSmall`] if `out` is too short (nothing written).
pub fn encode_heartbeat<'i>(
    ids: impl Iterator<Item = &'i str> + Clone,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let mut needed = HEARTBEAT_PREFIX.len();
    for (i, id) in ids.clone().enumerate() {
        if id.is_empty() || id.contains(',') {
            return Err(EncodeError::BadHeartbeatId);
        }
        needed += id.len() + usize::from(i > 0);
    }
    let mut o = reserve(out, needed)?;
    o.put(HEARTBEAT_PREFIX);
    for (i, id) in ids.enumerate() {
        if i > 0 {
            o.put(b",");
        }
        o.put(id.as_bytes());
    }
    Ok(needed)
}

/// Writes a registration `PUSH_REG:` + `msgpack_payload`; returns its length.
///
/// # Errors
/// [`EncodeError::BufferTooSmall`] if `out` is too short (nothing written).
pub fn encode_registration(msgpack_payload: &[u8], out: &mut [u8]) -> Result<usize, EncodeError> {
    let needed = PUSH_REG_PREFIX.len() + msgpack_payload.len();
    let mut o = reserve(out, needed)?;
    o.put(PUSH_REG_PREFIX);
    o.put(msgpack_payload);
    Ok(needed)
}

/// Writes a cancel `PUSH_CANCEL:{request_id}` for the consumer's request id; returns its
/// length. Any non-empty id reads back whole, `:` included.
///
/// # Errors
/// [`EncodeError::EmptyRequestId`] for an empty id; [`EncodeError::BufferTooSmall`] if
/// `out` is too short (nothing written).
pub fn encode_cancel(request_id: &str, out: &mut [u8]) -> Result<usize, EncodeError> {
    if request_id.is_empty() {
        return Err(EncodeError::EmptyRequestId);
    }
    let needed = PUSH_CANCEL_PREFIX.len() + request_id.len();
    let mut o = reserve(out, needed)?;
    o.put(PUSH_CANCEL_PREFIX);
    o.put(request_id.as_bytes());
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(id: &str, tp: u16) -> Message<'_> {
        Message::Completion(Body {
            request_id: id,
            tp_size: tp,
        })
    }
    fn fail(id: &str, tp: u16) -> Message<'_> {
        Message::Failure(Body {
            request_id: id,
            tp_size: tp,
        })
    }

    // Golden vectors: the exact bytes vLLM puts on the wire.
    #[test]
    fn golden_completion() {
        assert_eq!(parse(b"req-1:2"), Ok(done("req-1", 2)));
        let mut buf = [0u8; 32];
        let n = Body {
            request_id: "req-1",
            tp_size: 2,
        }
        .encode(&mut buf)
        .unwrap();
        assert_eq!(&buf[..n], b"req-1:2");
    }

    #[test]
    fn golden_failure_notice() {
        assert_eq!(parse(b"PUSH_FAIL:req-1:2"), Ok(fail("req-1", 2)));
        let mut buf = [0u8; 32];
        let c = Body {
            request_id: "req-1",
            tp_size: 2,
        };
        let n = c.encode_failure(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"PUSH_FAIL:req-1:2");
    }

    #[test]
    fn golden_heartbeat() {
        let mut buf = [0u8; 64];
        let n = encode_heartbeat(["cmpl-a-0", "cmpl-b-1"].into_iter(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"HB:cmpl-a-0,cmpl-b-1");
        let Ok(Message::Heartbeat(hb)) = parse(&buf[..n]) else {
            panic!("not a heartbeat")
        };
        assert!(hb.ids().eq(["cmpl-a-0", "cmpl-b-1"]));
    }

    #[test]
    fn golden_registration_prefix_on_raw_bytes() {
        // msgpack fixmap with one entry: {"request_id": "r"} — not UTF-8 clean in general.
        let payload = b"\x81\xaarequest_id\xa1r\xff";
        let mut buf = [0u8; 64];
        let n = encode_registration(payload, &mut buf).unwrap();
        assert_eq!(&buf[..9], b"PUSH_REG:");
        assert_eq!(parse(&buf[..n]), Ok(Message::Registration(payload)));
    }

    #[test]
    fn golden_cancel() {
        let mut buf = [0u8; 32];
        let n = encode_cancel("cmpl-42-0", &mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            b"\x50\x55\x53\x48\x5f\x43\x41\x4e\x43\x45\x4c\x3a\x63\x6d\x70\x6c\x2d\x34\x32\x2d\x30"
        );
        assert_eq!(&buf[..n], b"PUSH_CANCEL:cmpl-42-0");
        assert_eq!(parse(&buf[..n]), Ok(Message::Cancel("cmpl-42-0")));
        // The id is everything after the prefix, colons and digits included.
        assert_eq!(parse(b"PUSH_CANCEL:a:b:2"), Ok(Message::Cancel("a:b:2")));
        assert_eq!(parse(b"PUSH_CANCEL:"), Err(ParseError::EmptyRequestId));
        assert_eq!(parse(b"PUSH_CANCEL:r\xff"), Err(ParseError::NotUtf8));
        assert_eq!(
            encode_cancel("", &mut buf),
            Err(EncodeError::EmptyRequestId)
        );
        let mut short = [9u8; 12];
        assert_eq!(
            encode_cancel("r", &mut short),
            Err(EncodeError::BufferTooSmall { needed: 13 })
        );
        assert_eq!(short, [9u8; 12]);
    }

    #[test]
    fn old_producer_view_of_a_cancel_is_an_unknown_id() {
        // What a vLLM 0.33 P does with it: not `HB:`, so `rsplit(":", 1)` gives an id
        // that starts with `PUSH_CANCEL`, which no request has; the TP field is never
        // read as a number for an unknown id.
        for (body, id) in [
            ("PUSH_CANCEL:req", "PUSH_CANCEL"),
            ("PUSH_CANCEL:a:b", "PUSH_CANCEL:a"),
        ] {
            assert_eq!(body.rsplit_once(':').map(|(id, _)| id), Some(id));
        }
    }

    #[test]
    fn id_is_everything_before_the_last_colon() {
        assert_eq!(parse(b"a:b:c:4"), Ok(done("a:b:c", 4)));
        assert_eq!(parse(b"PUSH_FAIL:x::1"), Ok(fail("x:", 1)));
    }

    #[test]
    fn tp_size_bounds_and_digits() {
        assert_eq!(parse(b"r:65535"), Ok(done("r", 65535)));
        assert_eq!(parse(b"r:007"), Ok(done("r", 7)));
        assert_eq!(parse(b"r:0"), Err(ParseError::TpSizeOutOfRange));
        assert_eq!(parse(b"r:65536"), Err(ParseError::TpSizeOutOfRange));
        assert_eq!(
            parse(b"r:99999999999999999999"),
            Err(ParseError::TpSizeOutOfRange)
        );
        assert_eq!(parse(b"r:"), Err(ParseError::TpSizeNotDecimal));
        assert_eq!(parse(b"r:+2"), Err(ParseError::TpSizeNotDecimal));
        assert_eq!(parse(b"r: 2"), Err(ParseError::TpSizeNotDecimal));
        assert_eq!(parse(b"r:2\n"), Err(ParseError::TpSizeNotDecimal));
    }

    #[test]
    fn every_malformed_shape() {
        assert_eq!(parse(b""), Err(ParseError::MissingSeparator));
        assert_eq!(parse(b"no-colon"), Err(ParseError::MissingSeparator));
        assert_eq!(parse(b":2"), Err(ParseError::EmptyRequestId));
        assert_eq!(parse(b"PUSH_FAIL::2"), Err(ParseError::EmptyRequestId));
        assert_eq!(parse(b"PUSH_FAIL:"), Err(ParseError::MissingSeparator));
        assert_eq!(parse(b"r\xff:2"), Err(ParseError::NotUtf8));
        assert_eq!(parse(b"HB:\xff"), Err(ParseError::NotUtf8));
        assert_eq!(parse(b"PUSH_REG:\xff"), Ok(Message::Registration(b"\xff")));
    }

    #[test]
    fn old_consumer_view_of_push_fail_is_an_unknown_id() {
        // What an old D does with a new P's notice: rsplit gives id "PUSH_FAIL:req".
        let body = "PUSH_FAIL:req:2";
        assert_eq!(
            body.rsplit_once(':').map(|(id, _)| id),
            Some("PUSH_FAIL:req")
        );
    }

    #[test]
    fn encode_refuses_short_buffers_without_writing() {
        let mut buf = [7u8; 4];
        let c = Body {
            request_id: "req-1",
            tp_size: 12,
        };
        assert_eq!(
            c.encode(&mut buf),
            Err(EncodeError::BufferTooSmall { needed: 8 })
        );
        assert_eq!(buf, [7u8; 4]);
        assert_eq!(
            encode_heartbeat(["a,b"].into_iter(), &mut [0u8; 16]),
            Err(EncodeError::BadHeartbeatId)
        );
    }

    // Found by the `wire` fuzz target: `HB::65535` was emitted for id `HB:` (and `HB:58`
    // for id `HB`) and read back as a heartbeat; `PUSH_FAIL:x` as an id would read back as
    // a failure notice for `x`.
    #[test]
    fn completion_ids_that_look_like_another_message_are_refused() {
        let mut buf = [0u8; 64];
        for id in [
            "HB",
            "HB:",
            "HB:x",
            "PUSH_FAIL",
            "PUSH_FAIL:x",
            "PUSH_REG",
            "PUSH_REG:x",
            "PUSH_CANCEL",
            "PUSH_CANCEL:x",
        ] {
            let c = Body {
                request_id: id,
                tp_size: 2,
            };
            assert_eq!(c.encode(&mut buf), Err(EncodeError::ReservedPrefix), "{id}");
            assert_eq!(
                check_request_id(id),
                Err(EncodeError::ReservedPrefix),
                "{id}"
            );
            let n = c.encode_failure(&mut buf).unwrap();
            assert_eq!(parse(&buf[..n]), Ok(Message::Failure(c)));
        }
        for id in [
            "H",
            "HBx",
            "PUSH_FAILx:y",
            "PUSH_RE",
            "xHB:",
            "PUSH_CANCELx",
        ] {
            let c = Body {
                request_id: id,
                tp_size: 2,
            };
            let n = c.encode(&mut buf).unwrap();
            assert_eq!(parse(&buf[..n]), Ok(Message::Completion(c)), "{id}");
            assert_eq!(check_request_id(id), Ok(()), "{id}");
        }
        assert_eq!(check_request_id(""), Err(EncodeError::EmptyRequestId));
    }

    #[test]
    fn emit_then_parse_round_trips() {
        let mut buf = [0u8; 300];
        for tp in [1u16, 2, 9, 10, 99, 100, 65535] {
            for id in ["r", "a:b", "cmpl-uuid-0-deadbeef", "ü:ñ"] {
                let c = Body {
                    request_id: id,
                    tp_size: tp,
                };
                let n = c.encode(&mut buf).unwrap();
                assert_eq!(n, c.encoded_len());
                assert_eq!(parse(&buf[..n]), Ok(Message::Completion(c)));
                let n = c.encode_failure(&mut buf).unwrap();
                assert_eq!(parse(&buf[..n]), Ok(Message::Failure(c)));
                let n = encode_cancel(id, &mut buf).unwrap();
                assert_eq!(parse(&buf[..n]), Ok(Message::Cancel(id)));
            }
        }
    }
}
