//! CBOR with the same document model as JSON.
//!
//! A CBOR request must reach the model exactly as its JSON twin would: map entries keep their
//! order, integers of any size keep their digits (bignum tags 2 and 3 both ways), and floats of
//! any width become Python floats. Map keys must be text or integers (an integer key becomes its
//! decimal text, as `json.dumps` writes an `int` key); byte strings, other keys and undefined
//! values are refused because a JSON document cannot hold them.

use ciborium::Value as Cbor;

use crate::json::MAX_INT_DIGITS;
use crate::value::{Integer, Map, Value};

/// Why a CBOR document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CborError {
    #[error("malformed CBOR: {0}")]
    Malformed(String),
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
    #[error("CBOR {0} cannot be represented in a request")]
    Unsupported(&'static str),
    #[error("an integer longer than {0} digits")]
    IntegerTooLong(usize),
}

/// The longest bignum magnitude accepted, in bytes: enough for every integer of
/// [`MAX_INT_DIGITS`] decimal digits (256^1786 > 10^4300). The JSON parser refuses longer
/// integers; without the same bound here a bignum would cost time quadratic in its length.
const MAX_BIGNUM_BYTES: usize = 1786;

/// Decodes one CBOR document, refusing nesting deeper than `max_depth`.
pub fn decode(bytes: &[u8], max_depth: usize) -> Result<Value, CborError> {
    let cbor: Cbor =
        ciborium::de::from_reader_with_recursion_limit(bytes, max_depth.saturating_add(1)).map_err(|e| match e {
            ciborium::de::Error::RecursionLimitExceeded => CborError::TooDeep(max_depth),
            other => CborError::Malformed(other.to_string()),
        })?;
    from_cbor(cbor)
}

/// Encodes a document as CBOR.
pub fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail, and every `Cbor` we build is serialisable.
    if ciborium::ser::into_writer(&to_cbor(value), &mut out).is_err() {
        out.clear();
    }
    out
}

/// Big-endian magnitude bytes to decimal text.
fn bytes_to_decimal(bytes: &[u8]) -> String {
    let mut digits: Vec<u8> = vec![0]; // little-endian base-10
    for &b in bytes {
        let mut carry = u32::from(b);
        for d in digits.iter_mut() {
            let v = u32::from(*d) * 256 + carry;
            *d = (v % 10) as u8;
            carry = v / 10;
        }
        while carry > 0 {
            digits.push((carry % 10) as u8);
            carry /= 10;
        }
    }
    while digits.len() > 1 && digits.last() == Some(&0) {
        digits.pop();
    }
    digits.iter().rev().map(|d| char::from(b'0' + d)).collect()
}

/// Decimal text (no sign) to big-endian magnitude bytes.
fn decimal_to_bytes(decimal: &str) -> Vec<u8> {
    let mut bytes: Vec<u8> = vec![0]; // little-endian base-256
    for c in decimal.bytes() {
        let mut carry = u32::from(c - b'0');
        for b in bytes.iter_mut() {
            let v = u32::from(*b) * 10 + carry;
            *b = (v & 0xff) as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            bytes.push((carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    while bytes.len() > 1 && bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes.reverse();
    bytes
}

fn bignum(tag: u64, bytes: &[u8]) -> Result<Integer, CborError> {
    let significant = &bytes[bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len())..];
    if significant.len() > MAX_BIGNUM_BYTES {
        return Err(CborError::IntegerTooLong(MAX_INT_DIGITS));
    }
    let magnitude = bytes_to_decimal(significant);
    if magnitude.len() > MAX_INT_DIGITS {
        return Err(CborError::IntegerTooLong(MAX_INT_DIGITS));
    }
    let text = if tag == 2 {
        magnitude
    } else {
        // Tag 3 holds -1 - n.
        let plus_one = add_one(&magnitude);
        format!("-{plus_one}")
    };
    Ok(Integer::parse(&text).unwrap_or_else(|| Integer::from(0i64)))
}

fn add_one(decimal: &str) -> String {
    let mut d: Vec<u8> = decimal.bytes().map(|b| b - b'0').collect();
    let mut i = d.len();
    loop {
        if i == 0 {
            d.insert(0, 1);
            break;
        }
        i -= 1;
        if d[i] == 9 {
            d[i] = 0;
        } else {
            d[i] += 1;
            break;
        }
    }
    d.iter().map(|v| char::from(b'0' + v)).collect()
}

fn sub_one(decimal: &str) -> String {
    let mut d: Vec<u8> = decimal.bytes().map(|b| b - b'0').collect();
    let mut i = d.len();
    while i > 0 {
        i -= 1;
        if d[i] == 0 {
            d[i] = 9;
        } else {
            d[i] -= 1;
            break;
        }
    }
    let s: String = d.iter().map(|v| char::from(b'0' + v)).collect();
    let t = s.trim_start_matches('0');
    if t.is_empty() { "0".into() } else { t.into() }
}

fn key_text(key: Cbor) -> Result<String, CborError> {
    match key {
        Cbor::Text(s) => Ok(s),
        Cbor::Integer(i) => Ok(i128::from(i).to_string()),
        _ => Err(CborError::Unsupported("map keys other than text or integers")),
    }
}

fn from_cbor(cbor: Cbor) -> Result<Value, CborError> {
    Ok(match cbor {
        Cbor::Null => Value::Null,
        Cbor::Bool(b) => Value::Bool(b),
        Cbor::Integer(i) => Value::Int(Integer::from(i128::from(i))),
        Cbor::Float(f) => Value::Float(f),
        Cbor::Text(s) => Value::Str(s),
        Cbor::Bytes(_) => return Err(CborError::Unsupported("byte strings")),
        Cbor::Tag(tag @ (2 | 3), inner) => match *inner {
            Cbor::Bytes(b) => Value::Int(bignum(tag, &b)?),
            _ => return Err(CborError::Malformed("a bignum tag without bytes".into())),
        },
        // Other tags (dates, URIs, ...) carry a plain value: keep the value.
        Cbor::Tag(_, inner) => from_cbor(*inner)?,
        Cbor::Array(items) => Value::Array(items.into_iter().map(from_cbor).collect::<Result<_, _>>()?),
        Cbor::Map(entries) => {
            let mut map = Map::with_capacity(entries.len());
            for (k, v) in entries {
                map.insert(key_text(k)?, from_cbor(v)?);
            }
            Value::Object(map)
        }
        _ => return Err(CborError::Unsupported("simple values")),
    })
}

fn to_cbor(value: &Value) -> Cbor {
    match value {
        Value::Null => Cbor::Null,
        Value::Bool(b) => Cbor::Bool(*b),
        Value::Int(i) => match i.to_i128().and_then(|v| ciborium::value::Integer::try_from(v).ok()) {
            Some(small) => Cbor::Integer(small),
            None => match i.as_str().strip_prefix('-') {
                Some(magnitude) => Cbor::Tag(3, Box::new(Cbor::Bytes(decimal_to_bytes(&sub_one(magnitude))))),
                None => Cbor::Tag(2, Box::new(Cbor::Bytes(decimal_to_bytes(i.as_str())))),
            },
        },
        Value::Float(f) => Cbor::Float(*f),
        Value::Str(s) => Cbor::Text(s.clone()),
        Value::Array(items) => Cbor::Array(items.iter().map(to_cbor).collect()),
        Value::Object(map) => Cbor::Map(map.iter().map(|(k, v)| (Cbor::Text(k.clone()), to_cbor(v))).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{ParseOptions, Style, parse_str, to_string};

    fn roundtrip(json: &str) -> String {
        let v = parse_str(json, ParseOptions::default()).unwrap();
        to_string(&decode(&encode(&v), 64).unwrap(), Style::PYTHON)
    }

    #[test]
    fn bignums_are_held_to_the_json_parsers_digit_limit() {
        let longest = "9".repeat(MAX_INT_DIGITS);
        assert_eq!(roundtrip(&longest), longest);
        assert_eq!(roundtrip(&format!("-{longest}")), format!("-{longest}"));
        // One digit more, and a magnitude far past it: refused, not converted.
        let too_long =
            Cbor::Tag(2, Box::new(Cbor::Bytes(decimal_to_bytes(&format!("1{}", "0".repeat(MAX_INT_DIGITS))))));
        let huge = Cbor::Tag(3, Box::new(Cbor::Bytes(vec![0xff; 256 * 1024])));
        for c in [too_long, huge] {
            let mut bytes = Vec::new();
            ciborium::ser::into_writer(&c, &mut bytes).unwrap();
            assert!(matches!(decode(&bytes, 64), Err(CborError::IntegerTooLong(MAX_INT_DIGITS))));
        }
    }

    #[test]
    fn documents_survive_cbor_with_order_numbers_and_big_integers() {
        let doc = r#"{"z": 1, "a": [1.0, -0.0, NaN, 1e-07, 2e+300], "m": {"y": null, "b": true}, "big": 1180591620717411303424, "neg": -1180591620717411303425, "edge": -18446744073709551616}"#;
        assert_eq!(roundtrip(doc), doc);
    }

    #[test]
    fn integer_keys_become_text_and_bytes_are_refused() {
        let cbor = Cbor::Map(vec![(Cbor::Integer(7.into()), Cbor::Text("x".into()))]);
        let mut bytes = Vec::new();
        ciborium::ser::into_writer(&cbor, &mut bytes).unwrap();
        assert_eq!(to_string(&decode(&bytes, 8).unwrap(), Style::PYTHON), r#"{"7": "x"}"#);
        let mut bytes = Vec::new();
        ciborium::ser::into_writer(&Cbor::Bytes(vec![1]), &mut bytes).unwrap();
        assert_eq!(decode(&bytes, 8).unwrap_err(), CborError::Unsupported("byte strings"));
    }

    #[test]
    fn nesting_beyond_the_limit_is_refused() {
        let mut bytes = vec![0x81u8; 100]; // 100 nested one-item arrays
        bytes.push(0x01);
        assert_eq!(decode(&bytes, 64).unwrap_err(), CborError::TooDeep(64));
        assert!(decode(&bytes[bytes.len() - 11..], 64).is_ok());
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for bytes in [&[0xffu8][..], &[0x5f, 0x41], &[0xbf, 0x61], &[]] {
            assert!(decode(bytes, 64).is_err());
        }
    }
}
