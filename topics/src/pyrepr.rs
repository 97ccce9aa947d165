//! Python's `repr()` and `str()` of JSON-shaped values, for error messages that must read exactly
//! like laya's (`question 'q1': unknown type None; use one of ['choice', 'noul', 'score']`) and
//! the `%r` in laya.serve's `detail` texts (`too many choice options for "it's" (101 > 100)`).
//! One copy, here, for the agent's validation and the HTTP contract alike, with the Unicode
//! table that Python's `str.isprintable()` reads (Unicode 14.0, Python 3.11's).

use crate::pyfloat;
use crate::value::Value;
use unicode_general_category::{GeneralCategory, get_general_category};

/// `repr(value)` as Python prints the equivalent `json.loads` result.
pub fn repr(value: &Value) -> String {
    let mut out = String::new();
    write(&mut out, value);
    out
}

/// `repr(s)` for a Python `str`.
pub fn repr_str(s: &str) -> String {
    let mut out = String::new();
    write_str(&mut out, s);
    out
}

/// `repr(list_of_strings)`, as in `sorted(keys)` inside laya's messages.
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

/// Python's `str.isprintable()` for one non-ASCII character: everything but the "Other" and
/// "Separator" categories. (Python 3.11 uses Unicode 14; this table is newer, which only matters
/// for characters assigned since.)
fn is_printable(c: char) -> bool {
    !matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::Surrogate
            | GeneralCategory::PrivateUse
            | GeneralCategory::Unassigned
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
            | GeneralCategory::SpaceSeparator
    )
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
    use crate::json::{ParseOptions, parse_str};

    #[test]
    fn strings_pick_quotes_and_escapes_like_python() {
        assert_eq!(repr_str("q1"), "'q1'");
        assert_eq!(repr_str("it's"), "\"it's\"");
        assert_eq!(repr_str("it's \"x\""), "'it\\'s \"x\"'");
        assert_eq!(
            repr_str("a\\b\n\u{1}\u{7f}é\u{200b}\u{85}\u{2028}😀"),
            "'a\\\\b\\n\\x01\\x7fé\\u200b\\x85\\u2028😀'"
        );
    }

    #[test]
    fn nested_values_print_as_python_literals() {
        let v = parse_str(r#"{"a": [1, 2.5, null, true, "x"], "b": {}}"#, ParseOptions::default()).unwrap();
        assert_eq!(repr(&v), "{'a': [1, 2.5, None, True, 'x'], 'b': {}}");
        assert_eq!(repr_str_list(&["choice", "noul", "score"]), "['choice', 'noul', 'score']");
    }
}
