//! The document model every payload is decoded into before it is typed.
//!
//! laya reads requests with Python's `json` module, and the text the model sees is whatever
//! `json.dumps` writes back. `serde_json`'s value cannot hold that faithfully: Python keeps object
//! keys in the order they came, keeps integers of any size exactly, distinguishes `1` from `1.0`,
//! and accepts `NaN` and `Infinity`. [`Value`] keeps all four, for JSON and CBOR alike, so the
//! agent can reproduce laya's prompts byte for byte.

use indexmap::IndexMap;

/// An object: keys in first-seen order. A repeated key keeps its first position and takes the
/// last value, as a Python `dict` does when `json.loads` meets a duplicate.
pub type Map = IndexMap<String, Value>;

/// A JSON or CBOR value with Python's semantics (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// An integer of any size, kept as its canonical decimal text (`-` sign, no leading zeros).
    Int(Integer),
    /// A float; `NaN` and the infinities are legal, as in Python.
    Float(f64),
    Str(String),
    Array(Vec<Value>),
    Object(Map),
}

/// An integer of arbitrary size in canonical decimal form.
///
/// Python integers are unbounded and `json.dumps` writes them digit for digit, so a state holding
/// `2**70` must reach the tokenizer as those exact digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Integer(String);

impl Integer {
    /// Parses `-?[0-9]+`, normalising leading zeros and `-0` as Python's `int()` does.
    /// Returns `None` for anything else.
    pub fn parse(text: &str) -> Option<Integer> {
        let (neg, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = digits.trim_start_matches('0');
        Some(if digits.is_empty() {
            Integer("0".to_owned())
        } else if neg {
            Integer(format!("-{digits}"))
        } else {
            Integer(digits.to_owned())
        })
    }

    /// The canonical decimal text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value as an `i64`, if it fits.
    pub fn to_i64(&self) -> Option<i64> {
        self.0.parse().ok()
    }

    /// The value as an `i128`, if it fits.
    pub fn to_i128(&self) -> Option<i128> {
        self.0.parse().ok()
    }

    /// The nearest `f64`, as Python's `float(int)` would give (infinite if too large).
    pub fn to_f64(&self) -> f64 {
        // Rust's float parser rounds correctly, like Python's int-to-float conversion.
        self.0.parse().unwrap_or(f64::NAN)
    }
}

impl From<i64> for Integer {
    fn from(v: i64) -> Self {
        Integer(v.to_string())
    }
}

impl From<u64> for Integer {
    fn from(v: u64) -> Self {
        Integer(v.to_string())
    }
}

impl From<i128> for Integer {
    fn from(v: i128) -> Self {
        Integer(v.to_string())
    }
}

impl Value {
    /// An integer value.
    pub fn int(v: i64) -> Value {
        Value::Int(Integer::from(v))
    }

    /// The string slice, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The object, if this is one.
    pub fn as_object(&self) -> Option<&Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as an `i64` if it is an integer that fits (booleans are not integers here).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => i.to_i64(),
            _ => None,
        }
    }

    /// The value as an `f64` if it is a float, or an integer that converts exactly enough
    /// (booleans are not numbers here).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => i.to_i64().map(|v| v as f64),
            _ => None,
        }
    }

    /// Python's type name for this value (`type(v).__name__`), for error messages.
    pub fn python_type_name(&self) -> &'static str {
        match self {
            Value::Null => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Array(_) => "list",
            Value::Object(_) => "dict",
        }
    }

    /// Looks a key up in an object; `None` for a missing key or a non-object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object().and_then(|m| m.get(key))
    }

    /// Python's truthiness of a JSON-shaped value (`bool(v)`).
    pub fn is_truthy(&self) -> bool {
        match self {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Int(i) => i.as_str() != "0",
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(m) => !m.is_empty(),
        }
    }

    /// Python's `==` between two JSON-shaped values, where `True == 1 == 1.0`.
    pub fn py_eq(&self, other: &Value) -> bool {
        fn number(v: &Value) -> Option<f64> {
            match v {
                Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
                Value::Int(i) => Some(i.to_f64()),
                Value::Float(f) => Some(*f),
                _ => None,
            }
        }
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.py_eq(y)),
            (Value::Object(a), Value::Object(b)) => {
                a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| v.py_eq(w)))
            }
            _ => match (number(self), number(other)) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<Map> for Value {
    fn from(m: Map) -> Self {
        Value::Object(m)
    }
}

impl From<Vec<Value>> for Value {
    fn from(a: Vec<Value>) -> Self {
        Value::Array(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_normalised_like_python_int() {
        assert_eq!(Integer::parse("-0").unwrap().as_str(), "0");
        assert_eq!(Integer::parse("007").unwrap().as_str(), "7");
        assert_eq!(Integer::parse("-0012").unwrap().as_str(), "-12");
        assert_eq!(Integer::parse("1180591620717411303424").unwrap().as_str(), "1180591620717411303424");
        assert!(Integer::parse("1.0").is_none());
        assert!(Integer::parse("-").is_none());
    }

    #[test]
    fn python_equality_treats_bools_and_numbers_alike() {
        assert!(Value::Bool(false).py_eq(&Value::int(0)));
        assert!(Value::Float(1.0).py_eq(&Value::int(1)));
        assert!(!Value::Str(String::new()).py_eq(&Value::Null));
        assert!(!Value::Float(f64::NAN).py_eq(&Value::Float(f64::NAN)));
    }
}
