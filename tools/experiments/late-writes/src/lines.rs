//! The line protocol between the coordinator and its two children: each child announces
//! `MARKER rest` lines on stdout (libtest may print other lines around them) and reads the
//! coordinator's lines on stdin. Results travel as `key=value` words ([`Fields`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Lines of `source`, read on a thread (ends when the source closes).
pub fn reader_lines(source: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(source).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// This process's stdin, line by line.
pub fn stdin_lines() -> mpsc::Receiver<String> {
    reader_lines(std::io::stdin())
}

/// Prints `line` on its own line and flushes.
pub fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\n{line}");
    let _ = out.flush();
}

/// Waits up to `limit` for a line containing `marker`; returns what follows it, trimmed.
///
/// # Errors
/// A message naming the marker when the limit passes or the source closes.
pub fn expect_line(
    rx: &mpsc::Receiver<String>,
    marker: &str,
    limit: Duration,
) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .map_err(|e| format!("no {marker:?} line within {limit:?} ({e})"))?;
        if let Some((_, rest)) = line.split_once(marker) {
            return Ok(rest.trim().to_owned());
        }
    }
}

/// `key=value` words (values have no spaces; `null` for nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fields(pub Vec<(String, String)>);

impl Fields {
    /// Adds `key=value`.
    pub fn put(&mut self, key: &str, value: impl ToString) -> &mut Self {
        self.0.push((key.to_owned(), value.to_string()));
        self
    }

    /// Adds `key=value`, or `key=null`.
    pub fn put_opt(&mut self, key: &str, value: Option<impl ToString>) -> &mut Self {
        let v = value.map_or_else(|| "null".to_owned(), |v| v.to_string());
        self.put(key, v)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key` as a number (`None` for `null` or missing).
    pub fn num(&self, key: &str) -> Option<u64> {
        self.get(key)?.parse().ok()
    }

    /// The words, space-separated.
    pub fn encode(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Parses [`Fields::encode`]'s output (words without `=` are skipped).
    pub fn decode(s: &str) -> Self {
        Fields(
            s.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The fields as a JSON object, in order: `null`, booleans and integers bare, the rest
    /// strings.
    pub fn to_json_map(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::Value;
        self.0
            .iter()
            .map(|(k, v)| {
                let value = match v.as_str() {
                    "null" => Value::Null,
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    _ => match v.parse::<u64>() {
                        Ok(n) if v.bytes().all(|b| b.is_ascii_digit()) => Value::from(n),
                        _ => Value::String(v.clone()),
                    },
                };
                (k.clone(), value)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_render_as_json() {
        let mut f = Fields::default();
        f.put("event", "notice")
            .put("late_us", 12)
            .put_opt("gap", None::<u64>);
        f.put("ok", true);
        let g = Fields::decode(&format!("noise {}", f.encode()));
        assert_eq!(g, f);
        assert_eq!(g.num("late_us"), Some(12));
        assert_eq!(g.num("gap"), None);
        f.put("quote", "a\"b");
        assert_eq!(
            serde_json::to_string(&f.to_json_map()).unwrap_or_default(),
            r#"{"event":"notice","late_us":12,"gap":null,"ok":true,"quote":"a\"b"}"#
        );
    }
}
