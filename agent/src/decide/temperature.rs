//! Temperatures: which one applies to a question, and laya's clamping.
//!
//! laya divides a question's logits by `temperature_by_options["<type>:<bucket>"]` when the
//! checkpoint fitted one for that option count, else by `temperature[qtype]`; a per-language
//! table, when one is configured for the request's language, replaces both. Every value is
//! confined to [0.5, 5.0] and anything that is not a finite number becomes 1.0, because some
//! shipped buckets sharpen rather than soften (laya's `clamp_temperature`).

use std::collections::HashMap;

use indexmap::IndexMap;
use laya_topics::Value;

use crate::prompt::QType;

/// Lowest temperature laya applies.
pub const TEMP_MIN: f64 = 0.5;
/// Highest temperature laya applies.
pub const TEMP_MAX: f64 = 5.0;

/// Python's `float(v)` for a JSON value, `None` where Python raises.
fn py_float(v: &Value) -> Option<f64> {
    match v {
        Value::Float(f) => Some(*f),
        Value::Int(i) => Some(i.to_f64()),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::Str(s) => {
            let t = crate::prompt::question::py_strip(s);
            // Python allows single underscores between digits ("1_000.5").
            let bytes = t.as_bytes();
            let underscores_ok = bytes.iter().enumerate().all(|(i, &b)| {
                b != b'_'
                    || (i > 0 && bytes[i - 1].is_ascii_digit() && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
            });
            if !underscores_ok {
                return None;
            }
            t.replace('_', "").parse().ok()
        }
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// laya's `clamp_temperature`.
pub fn clamp_temperature(v: &Value) -> f64 {
    match py_float(v) {
        Some(t) if t.is_finite() => t.clamp(TEMP_MIN, TEMP_MAX),
        _ => 1.0,
    }
}

/// laya's `temp_bucket`: `"<type>:2"`, `":3-5"`, `":6-10"` or `":11+"`.
pub fn bucket(qtype: QType, k: usize) -> String {
    let size = match k {
        0..=2 => "2",
        3..=5 => "3-5",
        6..=10 => "6-10",
        _ => "11+",
    };
    format!("{}:{size}", qtype.name())
}

/// One set of temperatures, already clamped.
#[derive(Debug, Clone, PartialEq)]
pub struct TemperatureTable {
    /// By question type index.
    pub per_type: [f64; 3],
    /// By `bucket()` name.
    pub by_options: IndexMap<String, f64>,
}

impl Default for TemperatureTable {
    fn default() -> Self {
        TemperatureTable { per_type: [1.0; 3], by_options: IndexMap::new() }
    }
}

/// Why a temperature table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemperatureError {
    #[error("{0} temperature must be a list of 3 numbers (choice, score, noul)")]
    NotThree(String),
    #[error("{0} temperature_by_options must be an object of bucket -> number")]
    ByOptions(String),
    #[error("lang temperatures must be an object of language -> table")]
    Languages,
}

impl TemperatureTable {
    /// Reads `temperature` (a 3-list; absent means `default_raw`) and `temperature_by_options`.
    fn from_values(
        what: &str,
        temperature: Option<&Value>,
        by_options: Option<&Value>,
        default_raw: &[Value],
    ) -> Result<TemperatureTable, TemperatureError> {
        let raw: &[Value] = match temperature {
            None => default_raw,
            Some(Value::Array(items)) => items,
            Some(_) => return Err(TemperatureError::NotThree(what.to_owned())),
        };
        let [a, b, c] = raw else {
            return Err(TemperatureError::NotThree(what.to_owned()));
        };
        let per_type = [clamp_temperature(a), clamp_temperature(b), clamp_temperature(c)];
        let by_options = match by_options {
            None | Some(Value::Null) => IndexMap::new(),
            Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), clamp_temperature(v))).collect(),
            Some(_) => return Err(TemperatureError::ByOptions(what.to_owned())),
        };
        Ok(TemperatureTable { per_type, by_options })
    }

    fn lookup(&self, qtype: QType, k: usize) -> f64 {
        self.by_options.get(&bucket(qtype, k)).copied().unwrap_or(self.per_type[qtype.index()])
    }
}

/// A checkpoint's temperatures with optional per-language tables.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Temperatures {
    pub base: TemperatureTable,
    /// By primary language subtag, lowercased (`de` for `de-DE`).
    pub langs: HashMap<String, TemperatureTable>,
}

/// `lang.split("-")[0].lower()`.
fn primary_language(lang: &str) -> String {
    lang.split('-').next().unwrap_or(lang).to_lowercase()
}

impl Temperatures {
    /// From `rl_agent_config.json`'s `temperature` and `temperature_by_options`, and an optional
    /// `{lang: {"temperature": [...], "temperature_by_options": {...}}}` table (laya's
    /// `lang_temperatures`; a language without its own 3-list inherits the checkpoint's).
    pub fn from_config(
        temperature: Option<&Value>,
        by_options: Option<&Value>,
        langs: Option<&Value>,
    ) -> Result<Temperatures, TemperatureError> {
        let ones = [Value::Float(1.0), Value::Float(1.0), Value::Float(1.0)];
        let base_raw: Vec<Value> = match temperature {
            Some(Value::Array(items)) => items.clone(),
            _ => ones.to_vec(),
        };
        let base = TemperatureTable::from_values("the checkpoint's", temperature, by_options, &ones)?;
        let mut tables = HashMap::new();
        match langs {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (lang, cfg) in m {
                    if !matches!(cfg, Value::Object(_)) {
                        return Err(TemperatureError::Languages);
                    }
                    let what = format!("language {lang:?}");
                    let table = TemperatureTable::from_values(
                        &what,
                        cfg.get("temperature"),
                        cfg.get("temperature_by_options"),
                        &base_raw,
                    )?;
                    tables.insert(primary_language(lang), table);
                }
            }
            Some(_) => return Err(TemperatureError::Languages),
        }
        Ok(Temperatures { base, langs: tables })
    }

    /// The temperature for a question of `qtype` with `k` options, in `lang` if given.
    pub fn for_question(&self, qtype: QType, k: usize, lang: Option<&str>) -> f64 {
        let table =
            lang.filter(|l| !l.is_empty()).and_then(|l| self.langs.get(&primary_language(l))).unwrap_or(&self.base);
        table.lookup(qtype, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya_topics::json::{ParseOptions, parse_str};

    fn v(s: &str) -> Value {
        parse_str(s, ParseOptions::default()).unwrap()
    }

    #[test]
    fn clamping_follows_python_float_conversion() {
        assert_eq!(clamp_temperature(&v("0.1")), 0.5);
        assert_eq!(clamp_temperature(&v("7.5")), 5.0);
        assert_eq!(clamp_temperature(&v("NaN")), 1.0);
        assert_eq!(clamp_temperature(&v("Infinity")), 1.0);
        assert_eq!(clamp_temperature(&v(r#"" 2.5 ""#)), 2.5);
        assert_eq!(clamp_temperature(&v(r#""1_5""#)), 5.0);
        assert_eq!(clamp_temperature(&v(r#""1__5""#)), 1.0);
        assert_eq!(clamp_temperature(&v("null")), 1.0);
        assert_eq!(clamp_temperature(&v("true")), 1.0);
        assert_eq!(clamp_temperature(&v("2")), 2.0);
    }

    #[test]
    fn buckets_match_lavas_option_counts() {
        assert_eq!(bucket(QType::Choice, 1), "choice:2");
        assert_eq!(bucket(QType::Score, 5), "score:3-5");
        assert_eq!(bucket(QType::Noul, 2), "noul:2");
        assert_eq!(bucket(QType::Choice, 10), "choice:6-10");
        assert_eq!(bucket(QType::Choice, 11), "choice:11+");
    }

    #[test]
    fn a_language_table_replaces_the_checkpoint_table() {
        let t = Temperatures::from_config(
            Some(&v("[1.3, 0.8, 2.0]")),
            Some(&v(r#"{"choice:2": 3.0}"#)),
            Some(&v(r#"{"DE-at": {"temperature_by_options": {"noul:2": 4.0}}}"#)),
        )
        .unwrap();
        assert_eq!(t.for_question(QType::Choice, 2, None), 3.0);
        assert_eq!(t.for_question(QType::Choice, 3, None), 1.3);
        assert_eq!(t.for_question(QType::Noul, 2, Some("de-DE")), 4.0);
        // The language table has no choice:2 bucket, so its own per-type value applies.
        assert_eq!(t.for_question(QType::Choice, 2, Some("de")), 1.3);
        assert_eq!(t.for_question(QType::Choice, 2, Some("fr")), 3.0);
    }

    #[test]
    fn a_temperature_list_of_the_wrong_length_is_refused() {
        assert!(Temperatures::from_config(Some(&v("[1.0, 1.0]")), None, None).is_err());
    }
}
