//! The trace's lines and words: significant lines with their numbers, the words of a
//! command, numbers, names and the escapes of notification bytes (`docs/replay-trace.md`,
//! "Trace format").

use crate::MAX_NAME;

pub(crate) fn number(s: &str) -> Result<u64, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a non-negative decimal integer"));
    }
    s.parse().map_err(|_| format!("{s} is too large"))
}

pub(crate) fn name<'a>(what: &str, word: Option<&'a str>) -> Result<&'a str, String> {
    let word = word.ok_or_else(|| format!("missing {what}"))?;
    if word.len() > MAX_NAME {
        return Err(format!("{what} longer than {MAX_NAME} bytes"));
    }
    Ok(word)
}

/// Decodes `\xNN` and `\\` in notify bytes.
pub(crate) fn unescape(raw: &str) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(raw.len());
    let mut rest = raw.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b != b'\\' {
            bytes.push(b);
            rest = tail;
            continue;
        }
        match tail {
            [b'\\', more @ ..] => {
                bytes.push(b'\\');
                rest = more;
            }
            [b'x', h, l, more @ ..] if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                bytes.push(hex(*h) << 4 | hex(*l));
                rest = more;
            }
            _ => return Err("invalid escape in notification bytes (use \\xNN or \\\\)".into()),
        }
    }
    Ok(bytes)
}

/// One significant trace line, with its trailing `\r` dropped.
pub(crate) struct Line<'a> {
    pub(crate) text: &'a str,
}

impl<'a> Line<'a> {
    pub(crate) fn words(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.text.split(' ').filter(|w| !w.is_empty())
    }
    pub(crate) fn command(&self) -> &'a str {
        self.words().next().unwrap_or("")
    }
    pub(crate) fn args(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.words().skip(1)
    }
    /// `notify AGENT BYTES`: BYTES is everything after the single space after AGENT.
    pub(crate) fn notify_args(&self) -> Result<(&'a str, &'a str), String> {
        let after_command =
            self.text.trim_start_matches(' ')["notify".len()..].trim_start_matches(' ');
        let (agent, bytes) = after_command.split_once(' ').unwrap_or((after_command, ""));
        Ok((name("AGENT", Some(agent).filter(|a| !a.is_empty()))?, bytes))
    }
}

/// Significant lines with their 1-based numbers; a line that is not UTF-8 is an error.
pub(crate) struct Lines<'a> {
    rest: &'a [u8],
    number: usize,
}

impl<'a> Lines<'a> {
    pub(crate) fn new(input: &'a [u8]) -> Self {
        Lines {
            rest: input,
            number: 0,
        }
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = (usize, Result<Line<'a>, String>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (raw, rest) = match self.rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&self.rest[..i], &self.rest[i + 1..]),
                None => (self.rest, &[][..]),
            };
            self.rest = rest;
            self.number += 1;
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            let text = match std::str::from_utf8(raw) {
                Ok(text) => text,
                Err(_) => return Some((self.number, Err("line is not UTF-8".into()))),
            };
            let significant = text.trim_start_matches([' ', '\t']);
            if significant.is_empty() || significant.starts_with('#') {
                continue;
            }
            return Some((self.number, Ok(Line { text })));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_rules() {
        assert_eq!(unescape(r"a\x41\\b").unwrap(), b"aA\\b");
        assert_eq!(unescape(r"\xff\x00").unwrap(), b"\xff\x00");
        assert!(unescape(r"\n").is_err());
        assert!(unescape(r"\x4").is_err());
        assert!(unescape("\\").is_err());
    }

    #[test]
    fn notify_bytes_keep_extra_spaces() {
        let line = Line {
            text: "  notify   p0  r1:2",
        };
        assert_eq!(line.notify_args().unwrap(), ("p0", " r1:2"));
        let line = Line { text: "notify p0" };
        assert_eq!(line.notify_args().unwrap(), ("p0", ""));
    }
}
