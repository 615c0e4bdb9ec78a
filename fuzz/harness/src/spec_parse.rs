//! The message rules of `docs/replay-trace.md` ("Message bytes"), written out again in the
//! plainest way, for the reference model and the `wire` differential check. It shares no
//! code with [`kvdrain::wire`].

/// What a consumer makes of one notification, per the spec.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum SpecMessage {
    /// A completion (`failed == false`) or a failure notice for `id`.
    Notice { id: String, tp: u16, failed: bool },
    /// `HB:...`, `PUSH_REG:...` or `PUSH_CANCEL:<id>`.
    NotForConsumer,
    /// Anything else.
    Malformed,
}

pub(crate) fn spec_parse(bytes: &[u8]) -> SpecMessage {
    // The registration prefix is matched on raw bytes: its payload is binary.
    if bytes.starts_with(b"PUSH_REG:") {
        return SpecMessage::NotForConsumer;
    }
    let Ok(text) = core::str::from_utf8(bytes) else {
        return SpecMessage::Malformed;
    };
    if text.starts_with("HB:") {
        return SpecMessage::NotForConsumer;
    }
    // A cancel names the consumer's id: everything after its prefix, never empty.
    if let Some(id) = text.strip_prefix("PUSH_CANCEL:") {
        return if id.is_empty() {
            SpecMessage::Malformed
        } else {
            SpecMessage::NotForConsumer
        };
    }
    let (body, failed) = match text.strip_prefix("PUSH_FAIL:") {
        Some(body) => (body, true),
        None => (text, false),
    };
    // The id is everything before the last ':'.
    let Some(colon) = body.rfind(':') else {
        return SpecMessage::Malformed;
    };
    let (id, tp) = (&body[..colon], &body[colon + 1..]);
    if id.is_empty() || tp.is_empty() || !tp.chars().all(|c| c.is_ascii_digit()) {
        return SpecMessage::Malformed;
    }
    // A decimal number in 1..=65535; leading zeros do not change the number.
    let significant = tp.trim_start_matches('0');
    if significant.is_empty() || significant.len() > 5 {
        return SpecMessage::Malformed;
    }
    match significant.parse::<u32>() {
        Ok(n) if (1..=65_535).contains(&n) => SpecMessage::Notice {
            id: id.to_string(),
            tp: n as u16,
            failed,
        },
        _ => SpecMessage::Malformed,
    }
}
