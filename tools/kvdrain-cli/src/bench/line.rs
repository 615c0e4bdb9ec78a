//! One JSON line of benchmark figures: keys in the order they are put, values through serde.

use serde::Serialize;
use serde_json::{Map, Value};

/// A JSON object whose keys keep their insertion order (serde_json's `preserve_order`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Line(Map<String, Value>);

impl Line {
    /// An empty object.
    pub fn new() -> Line {
        Line::default()
    }

    /// Sets `key` (appended at the end the first time) to `value`.
    pub fn put(&mut self, key: impl Into<String>, value: impl Serialize) -> &mut Line {
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        self.0.insert(key.into(), value);
        self
    }

    /// The object itself, to nest in another line.
    pub fn into_map(self) -> Map<String, Value> {
        self.0
    }

    /// The object as one line of JSON (no newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_default()
    }

    /// Prints the line on standard output.
    pub fn print(&self) {
        println!("{}", self.to_json());
    }
}

/// A figure rounded to two decimals; `null` when not finite.
pub fn num(x: f64) -> Value {
    if x.is_finite() {
        Value::from((x * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

#[cfg(test)]
mod tests {
    use super::{Line, num};

    #[test]
    fn keys_keep_their_order_and_figures_round() {
        let mut line = Line::new();
        line.put("z", 1)
            .put("a", num(1.0 / 3.0))
            .put("m", num(f64::NAN));
        assert_eq!(line.to_json(), r#"{"z":1,"a":0.33,"m":null}"#);
    }
}
