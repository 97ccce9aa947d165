//! A request body read as laya.serve reads it: Python's `json.loads` on the raw bytes.
//!
//! `json.loads(bytes)` picks the encoding from the first bytes (a UTF-8 byte order mark, UTF-16
//! and UTF-32 with or without one, recognised from where the zero bytes are), decodes with
//! `surrogatepass`, then parses. That accepts more than a UTF-8 JSON reader would: a byte order
//! mark, UTF-16/32 bodies, encoded surrogates, and lone surrogate escapes. laya.serve refuses the
//! surrogates only after its size limits, so they are kept here as a flag (each becomes U+FFFD,
//! which has the same length, one code point) and [`super::refusal`] refuses them in their turn.

use crate::json::{self, ParseOptions};
use crate::value::Value;

use super::contract::MAX_JSON_DEPTH;

/// A parsed body.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub value: Value,
    /// Some string (a key, a value, anywhere) held an unpaired UTF-16 surrogate.
    pub lone_surrogate: bool,
}

/// Why `json.loads` would raise (laya.serve answers every case with the same 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("the body does not decode as {0}")]
    Decode(&'static str),
    #[error(transparent)]
    Parse(#[from] json::ParseError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Utf8,
    Utf16 { big_endian: bool },
    Utf32 { big_endian: bool },
}

/// `json.detect_encoding`, returning the encoding and how many BOM bytes to skip.
fn detect(b: &[u8]) -> (Encoding, usize) {
    use Encoding::*;
    if b.starts_with(&[0, 0, 0xFE, 0xFF]) {
        return (Utf32 { big_endian: true }, 4);
    }
    if b.starts_with(&[0xFF, 0xFE, 0, 0]) {
        return (Utf32 { big_endian: false }, 4);
    }
    if b.starts_with(&[0xFE, 0xFF]) {
        return (Utf16 { big_endian: true }, 2);
    }
    if b.starts_with(&[0xFF, 0xFE]) {
        return (Utf16 { big_endian: false }, 2);
    }
    if b.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return (Utf8, 3);
    }
    if b.len() >= 4 {
        if b[0] == 0 {
            return (if b[1] != 0 { Utf16 { big_endian: true } } else { Utf32 { big_endian: true } }, 0);
        }
        if b[1] == 0 {
            return (if b[2] != 0 || b[3] != 0 { Utf16 { big_endian: false } } else { Utf32 { big_endian: false } }, 0);
        }
    } else if b.len() == 2 {
        if b[0] == 0 {
            return (Utf16 { big_endian: true }, 0);
        }
        if b[1] == 0 {
            return (Utf16 { big_endian: false }, 0);
        }
    }
    (Utf8, 0)
}

/// UTF-8 with `surrogatepass`: an encoded surrogate (`ED A0..BF xx`) is one code point.
fn decode_utf8(mut b: &[u8], lone: &mut bool) -> Result<String, LoadError> {
    let mut out = String::with_capacity(b.len());
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(s);
                return Ok(out);
            }
            Err(e) => {
                let (good, bad) = b.split_at(e.valid_up_to());
                // The prefix was just validated; this cannot fail.
                out.push_str(std::str::from_utf8(good).map_err(|_| LoadError::Decode("UTF-8"))?);
                match bad {
                    [0xED, 0xA0..=0xBF, 0x80..=0xBF, ..] => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        *lone = true;
                        b = &bad[3..];
                    }
                    _ => return Err(LoadError::Decode("UTF-8")),
                }
            }
        }
    }
}

fn decode_utf16(b: &[u8], big_endian: bool, lone: &mut bool) -> Result<String, LoadError> {
    if !b.len().is_multiple_of(2) {
        return Err(LoadError::Decode("UTF-16"));
    }
    let units = b
        .chunks_exact(2)
        .map(|c| if big_endian { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_le_bytes([c[0], c[1]]) });
    Ok(char::decode_utf16(units)
        .map(|r| {
            r.unwrap_or_else(|_| {
                *lone = true;
                char::REPLACEMENT_CHARACTER
            })
        })
        .collect())
}

fn decode_utf32(b: &[u8], big_endian: bool, lone: &mut bool) -> Result<String, LoadError> {
    if !b.len().is_multiple_of(4) {
        return Err(LoadError::Decode("UTF-32"));
    }
    let mut out = String::with_capacity(b.len() / 4);
    for c in b.chunks_exact(4) {
        let arr = [c[0], c[1], c[2], c[3]];
        let code = if big_endian { u32::from_be_bytes(arr) } else { u32::from_le_bytes(arr) };
        match char::from_u32(code) {
            Some(ch) => out.push(ch),
            None if (0xD800..0xE000).contains(&code) => {
                *lone = true;
                out.push(char::REPLACEMENT_CHARACTER);
            }
            None => return Err(LoadError::Decode("UTF-32")),
        }
    }
    Ok(out)
}

/// `json.loads(body)`, with lone surrogates kept as a flag (see the module docs).
pub fn loads(body: &[u8]) -> Result<Loaded, LoadError> {
    let (encoding, bom) = detect(body);
    let bytes = &body[bom..];
    let mut lone = false;
    let text = match encoding {
        Encoding::Utf8 => decode_utf8(bytes, &mut lone)?,
        Encoding::Utf16 { big_endian } => decode_utf16(bytes, big_endian, &mut lone)?,
        Encoding::Utf32 { big_endian } => decode_utf32(bytes, big_endian, &mut lone)?,
    };
    let (value, escaped) = json::parse_str_keeping_lone_surrogates(&text, ParseOptions { max_depth: MAX_JSON_DEPTH })?;
    Ok(Loaded { value, lone_surrogate: lone || escaped })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_and_utf32_bodies_are_recognised_from_their_zero_bytes() {
        let text = r#"{"a": "é"}"#;
        let le16: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let be32: Vec<u8> = text.chars().flat_map(|c| (c as u32).to_be_bytes()).collect();
        for body in [le16, be32] {
            let loaded = loads(&body).expect("decodes");
            assert_eq!(loaded.value.get("a").and_then(Value::as_str), Some("é"));
            assert!(!loaded.lone_surrogate);
        }
    }

    #[test]
    fn lone_surrogates_are_kept_as_one_character_and_flagged() {
        let loaded = loads(br#"["\ud800x", "\udc00", "\ud83d\ude00"]"#).expect("parses");
        assert!(loaded.lone_surrogate);
        let items = loaded.value.as_array().expect("array");
        assert_eq!(items[0].as_str().map(|s| s.chars().count()), Some(2));
        assert_eq!(items[2].as_str(), Some("😀"));
        assert!(loads(b"[\"\xED\xA0\x80\"]").expect("surrogatepass").lone_surrogate);
        assert!(!loads(br#""\ud83d\ude00""#).expect("a pair").lone_surrogate);
    }
}
