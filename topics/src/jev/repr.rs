//! Python's `repr` and `str` of JSON-shaped values, for the `%r` in laya.serve's `detail` texts
//! (`too many choice options for "it's" (101 > 100)`, `got True`, `got [0.5]`).
//!
//! Python escapes the characters `str.isprintable()` rejects. Without a Unicode category table
//! (this crate takes no dependency for it) the non-ASCII test below covers the controls, the
//! separators, the common format characters, private use and the noncharacters; an unassigned
//! code point, which Python escapes too, is written as itself. The agent's `prompt::pyrepr` has
//! the exact table for laya's own messages.

use crate::pyfloat;
use crate::value::Value;

/// `repr(value)` of the value `json.loads` builds.
pub fn repr(value: &Value) -> String {
    let mut out = String::new();
    write(&mut out, value);
    out
}

/// `repr(s)` of a Python `str`.
pub fn repr_str(s: &str) -> String {
    let mut out = String::new();
    write_str(&mut out, s);
    out
}

/// `repr` of a list of strings, as `sorted(names)` prints.
pub fn repr_str_list<S: AsRef<str>>(items: &[S]) -> String {
    let parts: Vec<String> = items.iter().map(|s| repr_str(s.as_ref())).collect();
    format!("[{}]", parts.join(", "))
}

/// `str(value)`: the text itself for a string, else its `repr`.
pub fn py_str(value: &Value) -> String {
    match value {
        Value::Str(s) => s.clone(),
        other => repr(other),
    }
}

fn write(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Int(i) => out.push_str(i.as_str()),
        Value::Float(f) => out.push_str(&pyfloat::repr(*f)),
        Value::Str(s) => write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, k);
                out.push_str(": ");
                write(out, v);
            }
            out.push('}');
        }
    }
}

/// `str.isprintable()` for a non-ASCII character, as far as it can be told without a table.
fn is_printable(c: char) -> bool {
    let code = c as u32;
    !matches!(code,
        0x80..=0xA0 | 0xAD | 0x034F | 0x061C | 0x1680 | 0x180E | 0x2000..=0x200F | 0x2028..=0x202F
        | 0x205F..=0x206F | 0x3000 | 0xD800..=0xF8FF | 0xFDD0..=0xFDEF | 0xFEFF | 0xFFF0..=0xFFFB
        | 0xE0000..=0xE0FFF | 0xF0000..=0x10FFFF)
        && code & 0xFFFE != 0xFFFE
}

fn write_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        let code = c as u32;
        match c {
            c if c == quote || c == '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ if code < 0x20 || code == 0x7f => out.push_str(&format!("\\x{code:02x}")),
            _ if code < 0x7f => out.push(c),
            _ if is_printable(c) => out.push(c),
            _ if code <= 0xff => out.push_str(&format!("\\x{code:02x}")),
            _ if code <= 0xffff => out.push_str(&format!("\\u{code:04x}")),
            _ => out.push_str(&format!("\\U{code:08x}")),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_pick_quotes_and_escapes_like_python() {
        assert_eq!(repr_str("q1"), "'q1'");
        assert_eq!(repr_str("it's"), "\"it's\"");
        assert_eq!(repr_str("scéne"), "'scéne'");
        assert_eq!(
            repr_str("a\\b\n\u{1}\u{7f}é\u{200b}\u{85}\u{2028}😀"),
            "'a\\\\b\\n\\x01\\x7fé\\u200b\\x85\\u2028😀'"
        );
    }
}
