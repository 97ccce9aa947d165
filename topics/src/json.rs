//! JSON with Python's `json` semantics, in both directions.
//!
//! Reading follows `json.loads`: `NaN`, `Infinity` and `-Infinity` are accepted, integers keep
//! every digit, a number with a fraction or exponent is a float, duplicate keys keep their first
//! position and their last value, raw control characters inside strings are refused. Writing
//! follows `json.dumps(..., ensure_ascii=False)`: only `"`, `\` and control characters are
//! escaped, floats use Python's `repr`. The one deliberate difference: a lone UTF-16 surrogate
//! (`"\ud800"`) is refused, because a Rust string cannot hold it.
//!
//! Nesting is bounded ([`ParseOptions::max_depth`]) so a hostile payload cannot exhaust the stack.

use crate::pyfloat;
use crate::value::{Integer, Map, Value};

/// Why a document was refused, with the byte offset where reading stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at byte {offset}")]
pub struct ParseError {
    pub kind: ParseErrorKind,
    pub offset: usize,
}

/// The kinds of malformed JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    #[error("unexpected end of input")]
    Eof,
    #[error("unexpected character {0:?}")]
    Unexpected(char),
    #[error("invalid UTF-8")]
    Utf8,
    #[error("invalid number")]
    Number,
    #[error("integer with more than {0} digits")]
    IntegerTooLong(usize),
    #[error("invalid escape")]
    Escape,
    #[error("lone UTF-16 surrogate in a \\u escape")]
    LoneSurrogate,
    #[error("control character in a string")]
    ControlCharacter,
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
    #[error("extra data after the document")]
    TrailingData,
}

/// Limits applied while reading.
#[derive(Debug, Clone, Copy)]
pub struct ParseOptions {
    /// Arrays and objects nested deeper than this are refused.
    pub max_depth: usize,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions { max_depth: 128 }
    }
}

/// Python refuses to convert integers longer than this (`sys.int_info.default_max_str_digits`).
pub(crate) const MAX_INT_DIGITS: usize = 4300;

/// Parses one JSON document from bytes (UTF-8, an optional BOM is skipped like `json.loads`
/// does for bytes).
pub fn parse(input: &[u8], options: ParseOptions) -> Result<Value, ParseError> {
    let input = input.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(input);
    let text =
        std::str::from_utf8(input).map_err(|e| ParseError { kind: ParseErrorKind::Utf8, offset: e.valid_up_to() })?;
    parse_str(text, options)
}

/// Parses one JSON document from a string.
pub fn parse_str(text: &str, options: ParseOptions) -> Result<Value, ParseError> {
    let mut p = Parser { s: text.as_bytes(), text, pos: 0, max_depth: options.max_depth, lone: None };
    p.document()
}

/// Parses like [`parse_str`], except that a lone UTF-16 surrogate escape is accepted as Python
/// accepts it. A Rust string cannot hold one, so each becomes U+FFFD (one character, as the
/// surrogate is one code point to Python's `len`) and the second value of the pair says that at
/// least one was met. Callers that must refuse such a document later (laya.serve checks for
/// them only after its size limits) use this.
pub fn parse_str_keeping_lone_surrogates(text: &str, options: ParseOptions) -> Result<(Value, bool), ParseError> {
    let mut p = Parser { s: text.as_bytes(), text, pos: 0, max_depth: options.max_depth, lone: Some(false) };
    let v = p.document()?;
    Ok((v, p.lone == Some(true)))
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    max_depth: usize,
    /// `None`: a lone surrogate escape is an error; `Some(seen)`: it is replaced and recorded.
    lone: Option<bool>,
}

impl Parser<'_> {
    fn document(&mut self) -> Result<Value, ParseError> {
        self.skip_ws();
        let v = self.value(0)?;
        self.skip_ws();
        if self.pos != self.s.len() {
            return Err(self.err(ParseErrorKind::TrailingData));
        }
        Ok(v)
    }

    /// A lone surrogate escape at `at`: an error, or U+FFFD when the caller keeps them.
    fn lone_surrogate(&mut self, at: usize) -> Result<char, ParseError> {
        match self.lone {
            None => Err(ParseError { kind: ParseErrorKind::LoneSurrogate, offset: at }),
            Some(_) => {
                self.lone = Some(true);
                Ok(char::REPLACEMENT_CHARACTER)
            }
        }
    }

    fn err(&self, kind: ParseErrorKind) -> ParseError {
        ParseError { kind, offset: self.pos }
    }

    fn unexpected(&self) -> ParseError {
        match self.text[self.pos..].chars().next() {
            Some(c) => self.err(ParseErrorKind::Unexpected(c)),
            None => self.err(ParseErrorKind::Eof),
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.pos) {
            self.pos += 1;
        }
    }

    fn eat_literal(&mut self, lit: &str) -> bool {
        if self.s[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        match self.s.get(self.pos) {
            None => Err(self.err(ParseErrorKind::Eof)),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b'n') if self.eat_literal("null") => Ok(Value::Null),
            Some(b't') if self.eat_literal("true") => Ok(Value::Bool(true)),
            Some(b'f') if self.eat_literal("false") => Ok(Value::Bool(false)),
            Some(b'N') if self.eat_literal("NaN") => Ok(Value::Float(f64::NAN)),
            Some(b'I') if self.eat_literal("Infinity") => Ok(Value::Float(f64::INFINITY)),
            Some(b'-') if self.eat_literal("-Infinity") => Ok(Value::Float(f64::NEG_INFINITY)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.unexpected()),
        }
    }

    fn enter(&self, depth: usize) -> Result<(), ParseError> {
        if depth > self.max_depth { Err(self.err(ParseErrorKind::TooDeep(self.max_depth))) } else { Ok(()) }
    }

    fn object(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.enter(depth)?;
        self.pos += 1; // '{'
        let mut map = Map::new();
        self.skip_ws();
        if self.s.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            if self.s.get(self.pos) != Some(&b'"') {
                return Err(self.unexpected());
            }
            let key = self.string()?;
            self.skip_ws();
            if self.s.get(self.pos) != Some(&b':') {
                return Err(self.unexpected());
            }
            self.pos += 1;
            self.skip_ws();
            let v = self.value(depth)?;
            map.insert(key, v);
            self.skip_ws();
            match self.s.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.unexpected()),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.enter(depth)?;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.s.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.s.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.unexpected()),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        self.pos - start
    }

    /// `-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`, as Python's scanner reads numbers.
    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.pos;
        if self.s[self.pos] == b'-' {
            self.pos += 1;
        }
        match self.s.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.unexpected()),
        }
        let int_end = self.pos;
        let mut is_float = false;
        if self.s.get(self.pos) == Some(&b'.') && self.s.get(self.pos + 1).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
            self.digits();
            is_float = true;
        }
        if let Some(b'e' | b'E') = self.s.get(self.pos) {
            let save = self.pos;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.s.get(self.pos) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                // Python's regex does not take a bare `e`: the number ends before it.
                self.pos = save;
            } else {
                is_float = true;
            }
        }
        let text = &self.text[start..self.pos];
        if is_float {
            // Rust's parser rounds correctly, like Python's float(); overflow gives infinity.
            text.parse::<f64>().map(Value::Float).map_err(|_| self.err(ParseErrorKind::Number))
        } else {
            let ndigits = int_end - start - usize::from(text.starts_with('-'));
            if ndigits > MAX_INT_DIGITS {
                return Err(ParseError { kind: ParseErrorKind::IntegerTooLong(MAX_INT_DIGITS), offset: start });
            }
            Integer::parse(text).map(Value::Int).ok_or_else(|| self.err(ParseErrorKind::Number))
        }
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let chunk = self.s.get(self.pos..self.pos + 4).ok_or_else(|| self.err(ParseErrorKind::Escape))?;
        let mut v = 0u32;
        for &b in chunk {
            let d = (b as char).to_digit(16).ok_or_else(|| self.err(ParseErrorKind::Escape))?;
            v = v * 16 + d;
        }
        self.pos += 4;
        Ok(v)
    }

    /// Whether the `\\u` at the current position spells a low surrogate (`DC00..=DFFF`).
    fn peek_low_surrogate(&self) -> bool {
        let Some(hex) = self.s.get(self.pos + 2..self.pos + 6) else { return false };
        let Ok(hex) = std::str::from_utf8(hex) else { return false };
        u32::from_str_radix(hex, 16).is_ok_and(|lo| (0xDC00..0xE000).contains(&lo))
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            while let Some(&b) = self.s.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[run_start..self.pos]);
            match self.s.get(self.pos) {
                None => return Err(self.err(ParseErrorKind::Eof)),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let esc = *self.s.get(self.pos).ok_or_else(|| self.err(ParseErrorKind::Eof))?;
                    self.pos += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let at = self.pos;
                            let hi = self.hex4()?;
                            // Python pairs a high surrogate with an immediately following low
                            // one; anything else leaves it lone and reads the next escape anew.
                            let pair = (0xD800..0xDC00).contains(&hi)
                                && self.s[self.pos..].starts_with(b"\\u")
                                && self.peek_low_surrogate();
                            let ch = if pair {
                                self.pos += 2;
                                let lo = self.hex4()?;
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                            } else {
                                char::from_u32(hi)
                            };
                            let ch = match ch {
                                Some(ch) => ch,
                                None => self.lone_surrogate(at)?,
                            };
                            out.push(ch);
                        }
                        _ => {
                            self.pos -= 1;
                            return Err(self.err(ParseErrorKind::Escape));
                        }
                    }
                }
                Some(_) => return Err(self.err(ParseErrorKind::ControlCharacter)),
            }
        }
    }
}

/// How a document is laid out when written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Between items of arrays and objects.
    pub item_sep: &'static str,
    /// Between a key and its value.
    pub key_sep: &'static str,
}

impl Style {
    /// `json.dumps` defaults: `", "` and `": "`. This is the text laya puts in front of the model.
    pub const PYTHON: Style = Style { item_sep: ", ", key_sep: ": " };
    /// No spaces, for the wire.
    pub const COMPACT: Style = Style { item_sep: ",", key_sep: ":" };
}

/// Writes `value` as `json.dumps(value, ensure_ascii=False)` would with `style`'s separators.
pub fn to_string(value: &Value, style: Style) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style);
    out
}

fn write_value(out: &mut String, value: &Value, style: Style) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Int(i) => out.push_str(i.as_str()),
        Value::Float(f) => out.push_str(&pyfloat::json_repr(*f)),
        Value::Str(s) => write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_sep);
                }
                write_value(out, item, style);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_sep);
                }
                write_str(out, k);
                out.push_str(style.key_sep);
                write_value(out, v, style);
            }
            out.push('}');
        }
    }
}

/// A JSON string literal with Python's `ensure_ascii=False` escaping.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(s: &str) -> Value {
        parse_str(s, ParseOptions::default()).unwrap()
    }

    #[test]
    fn key_order_and_duplicate_keys_follow_python_dicts() {
        let v = parse_ok(r#"{"b": 1, "a": 2, "b": 3}"#);
        assert_eq!(to_string(&v, Style::PYTHON), r#"{"b": 3, "a": 2}"#);
    }

    #[test]
    fn numbers_keep_python_int_and_float_forms() {
        let v = parse_ok("[1180591620717411303424, -0, 1.0, 1e2, 1E-7, -0.0, 1e400, NaN, -Infinity]");
        assert_eq!(
            to_string(&v, Style::PYTHON),
            "[1180591620717411303424, 0, 1.0, 100.0, 1e-07, -0.0, Infinity, NaN, -Infinity]"
        );
    }

    #[test]
    fn strings_escape_only_what_python_escapes() {
        let v = parse_ok(r#""a\"b\\c\/d\u0001\u007f\u00e9\ud83d\ude00\n\b""#);
        assert_eq!(to_string(&v, Style::PYTHON), "\"a\\\"b\\\\c/d\\u0001\u{7f}é😀\\n\\b\"");
    }

    #[test]
    fn malformed_documents_are_refused_with_a_position() {
        for bad in ["", "[1,]", "{\"a\" 1}", "01", "1.", "\"\u{1}\"", "[1] x", "\"\\ud800\"", "\"\\x\"", "-"] {
            assert!(parse_str(bad, ParseOptions::default()).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn nesting_beyond_the_limit_is_refused_without_recursing_further() {
        let deep = "[".repeat(100_000);
        let err = parse_str(&deep, ParseOptions { max_depth: 64 }).unwrap_err();
        assert_eq!(err.kind, ParseErrorKind::TooDeep(64));
        let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(parse_str(&ok, ParseOptions { max_depth: 64 }).is_ok());
    }

    #[test]
    fn a_bare_exponent_marker_ends_the_number() {
        // Python reads "1e" as the number 1 followed by extra data.
        let err = parse_str("1e", ParseOptions::default()).unwrap_err();
        assert_eq!(err.kind, ParseErrorKind::TrailingData);
    }

    #[test]
    fn integers_longer_than_python_allows_are_refused() {
        let long = "9".repeat(MAX_INT_DIGITS + 1);
        assert!(matches!(
            parse_str(&long, ParseOptions::default()).unwrap_err().kind,
            ParseErrorKind::IntegerTooLong(_)
        ));
    }
}
