//! Just enough JSON output for one-line records: string escaping.

use std::fmt::Write as _;

/// Appends `s` as a JSON string literal (quotes included) to `out`.
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_quotes_backslashes_and_controls() {
        let mut s = String::new();
        super::push_str(&mut s, "a\"b\\c\u{1}\n");
        assert_eq!(s, r#""a\"b\\c\u0001\n""#);
    }
}
