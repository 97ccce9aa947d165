//! Temperatures: which one applies to a question, and laya's clamping.
//!
//! laya divides a question's logits by `temperature_by_options["<type>:<bucket>"]` when the
//! checkpoint fitted one for that option count, else by `temperature[qtype]`; a per-language
//! table, when one is configured for the request's language, replaces both. Every value is
//! confined to [0.5, 5.0] and anything that is not a finite number becomes 1.0, because some
//! shipped buckets sharpen rather than soften (laya's `clamp_temperature`).
//!
//! laya 0.4.15 reads the same tables with stricter rules ([`Temperatures::from_config_as`]): a
//! boolean is not a temperature (1.0, where 0.3.20 floated `false` to 0.0 and clamped it to 0.5),
//! a `null` language entry or a `null` temperature inherits the checkpoint's own, and a malformed
//! override is refused with laya's message. A `calibration.json` may then replace the checkpoint's
//! temperatures and add a histogram-binning map (see [`super::calibration`]).

use std::collections::HashMap;

use indexmap::IndexMap;
use laya_topics::Value;
use laya_topics::wire::LayaVersion;

use crate::prompt::QType;
use crate::prompt::pyrepr::repr;

/// Lowest temperature laya applies.
pub const TEMP_MIN: f64 = 0.5;
/// Highest temperature laya applies.
pub const TEMP_MAX: f64 = 5.0;

/// Python's `float(v)` for a JSON value, `None` where Python raises.
pub(crate) fn py_float(v: &Value) -> Option<f64> {
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

/// laya 0.3.20's `clamp_temperature`.
pub fn clamp_temperature(v: &Value) -> f64 {
    match py_float(v) {
        Some(t) if t.is_finite() => t.clamp(TEMP_MIN, TEMP_MAX),
        _ => 1.0,
    }
}

/// `clamp_temperature` as `laya` of version `laya` has it: 0.4.15 reads a boolean as no number.
pub fn clamp_temperature_as(laya: LayaVersion, v: &Value) -> f64 {
    if laya.is_0_4() && matches!(v, Value::Bool(_)) { 1.0 } else { clamp_temperature(v) }
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
    /// laya 0.4.15's own message for a malformed language override or calibration file.
    #[error("{0}")]
    Laya(String),
}

impl TemperatureTable {
    /// Reads `temperature` (a 3-list; absent means `default_raw`) and `temperature_by_options`.
    fn from_values(
        laya: LayaVersion,
        what: &str,
        temperature: Option<&Value>,
        by_options: Option<&Value>,
        default_raw: &[Value],
    ) -> Result<TemperatureTable, TemperatureError> {
        let clamp = |v: &Value| clamp_temperature_as(laya, v);
        let raw: &[Value] = match temperature {
            None => default_raw,
            Some(Value::Array(items)) => items,
            Some(_) => return Err(TemperatureError::NotThree(what.to_owned())),
        };
        let [a, b, c] = raw else {
            return Err(TemperatureError::NotThree(what.to_owned()));
        };
        let per_type = [clamp(a), clamp(b), clamp(c)];
        let by_options = match by_options {
            None | Some(Value::Null) => IndexMap::new(),
            Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), clamp(v))).collect(),
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
    /// laya 0.4.15's histogram-binning map from `calibration.json`: bucket -> the recalibrated
    /// confidence of each of its equal-width bins. Empty: none (laya applies a map only when it
    /// is a non-empty dict).
    pub binning: IndexMap<String, Vec<f64>>,
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
        Temperatures::from_config_as(LayaVersion::V0_3_20, temperature, by_options, langs)
    }

    /// [`Temperatures::from_config`] with the rules of `laya`'s version (0.4.15's
    /// `resolve_lang_temperatures`: see the module doc).
    pub fn from_config_as(
        laya: LayaVersion,
        temperature: Option<&Value>,
        by_options: Option<&Value>,
        langs: Option<&Value>,
    ) -> Result<Temperatures, TemperatureError> {
        let ones = [Value::Float(1.0), Value::Float(1.0), Value::Float(1.0)];
        let base_raw: Vec<Value> = match temperature {
            Some(Value::Array(items)) => items.clone(),
            _ => ones.to_vec(),
        };
        let base = TemperatureTable::from_values(laya, "the checkpoint's", temperature, by_options, &ones)?;
        let mut tables = HashMap::new();
        match langs {
            None | Some(Value::Null) => {}
            // `(raw or {}).items()`: any falsy value is no table.
            Some(v) if laya.is_0_4() && !v.is_truthy() => {}
            Some(Value::Object(m)) if laya.is_0_4() => {
                for (lang, cfg) in m {
                    tables.insert(primary_language(lang), lang_table_0_4(lang, cfg, &base_raw)?);
                }
            }
            Some(Value::Object(m)) => {
                for (lang, cfg) in m {
                    if !matches!(cfg, Value::Object(_)) {
                        return Err(TemperatureError::Languages);
                    }
                    let what = format!("language {lang:?}");
                    let table = TemperatureTable::from_values(
                        laya,
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
        Ok(Temperatures { base, langs: tables, binning: IndexMap::new() })
    }

    /// Whether `lang` selects one of the per-language tables (laya's `lang_override`).
    pub fn has_language(&self, lang: Option<&str>) -> bool {
        lang.filter(|l| !l.is_empty()).is_some_and(|l| self.langs.contains_key(&primary_language(l)))
    }

    /// The temperature for a question of `qtype` with `k` options, in `lang` if given.
    pub fn for_question(&self, qtype: QType, k: usize, lang: Option<&str>) -> f64 {
        let table =
            lang.filter(|l| !l.is_empty()).and_then(|l| self.langs.get(&primary_language(l))).unwrap_or(&self.base);
        table.lookup(qtype, k)
    }
}

/// One entry of laya 0.4.15's `resolve_lang_temperatures`, with its messages.
fn lang_table_0_4(lang: &str, cfg: &Value, base_raw: &[Value]) -> Result<TemperatureTable, TemperatureError> {
    let laya = LayaVersion::V0_4_15;
    let l = crate::prompt::pyrepr::repr_str(lang);
    let empty = Value::Object(Default::default());
    let cfg = if *cfg == Value::Null { &empty } else { cfg };
    if !matches!(cfg, Value::Object(_)) {
        return Err(TemperatureError::Laya(format!(
            "Language override {l} must be a mapping, got {}",
            cfg.python_type_name()
        )));
    }
    let base = Value::Array(base_raw.to_vec());
    let t_raw = match cfg.get("temperature") {
        None | Some(Value::Null) => &base,
        Some(t) => t,
    };
    if !matches!(t_raw, Value::Array(items) if items.len() == 3) {
        return Err(TemperatureError::Laya(format!(
            "Language override {l} temperature must be a list of 3 floats, got {}",
            repr(t_raw)
        )));
    }
    // `cfg.get("temperature_by_options") or {}`: any falsy value is no table.
    let by_options = cfg.get("temperature_by_options").filter(|v| v.is_truthy());
    if let Some(v) = by_options
        && !matches!(v, Value::Object(_))
    {
        return Err(TemperatureError::Laya(format!(
            "Language override {l} temperature_by_options must be a mapping of bucket -> float, got {}",
            v.python_type_name()
        )));
    }
    TemperatureTable::from_values(laya, "", Some(t_raw), by_options, base_raw)
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
