//! One output line per decision, as JSON with its keys in a fixed order
//! (`docs/replay-trace.md`, "Output").

use std::io::{self, Write};

use kvdrain::Instant;
use serde::Serialize;

/// One output line (spec/replay-trace.md, "Output"): keys in this order, the optional ones
/// only where the event has them.
#[derive(Debug, Serialize)]
pub(crate) struct Record<'a> {
    /// The replay's clock in ms, as the format writes it.
    pub(crate) at: u64,
    pub(crate) event: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) req: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) outstanding: Option<Owed<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) forced: Option<bool>,
}

/// `outstanding`: the agents still owing a notice, or how many notices are owed.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Owed<'a> {
    Count(u64),
    Agents(Vec<&'a str>),
}

impl<'a> Record<'a> {
    pub(crate) fn new(at: Instant, event: &'a str, req: Option<&'a str>) -> Self {
        Record {
            at: at.millis(),
            event,
            req,
            reason: None,
            outstanding: None,
            forced: None,
        }
    }
}

/// Serialises `record` as one line into `buf`, then writes it whole to `out`.
pub(crate) fn write_record(
    buf: &mut Vec<u8>,
    out: &mut dyn Write,
    record: &Record<'_>,
) -> io::Result<()> {
    buf.clear();
    serde_json::to_writer(&mut *buf, record)?;
    buf.push(b'\n');
    out.write_all(buf)
}
