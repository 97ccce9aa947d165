//! laya 0.4.15's calibration file (`calibration.json` beside `rl_agent_config.json`): what
//! `Agent.save_calibration` writes and `Agent(calibration=...)` loads (`apply_calibration_payload`).
//!
//! It replaces the checkpoint's `temperature` and `temperature_by_options` (clamped as the
//! checkpoint's are) and may add a `binning_map`, which remaps an answer's `answer_confidence`
//! per option-count bucket (`apply_binning_map`). The per-language tables are not touched: laya
//! resolves them from the checkpoint's own temperatures before the file is read. A malformed file
//! is refused with laya's message for it; the values laya forgives (temperatures it clamps) are
//! forgiven here too, and the ones it refuses (binning values) are refused.

use indexmap::IndexMap;
use laya_topics::Value;
use laya_topics::wire::LayaVersion;

use super::temperature::{TemperatureError, TemperatureTable, Temperatures, clamp_temperature_as};
use crate::prompt::pyrepr::{repr, repr_str};

fn refuse(message: String) -> TemperatureError {
    TemperatureError::Laya(message)
}

/// Python's `int(s)` for a version string: optional whitespace and sign, digits with single
/// underscores between them.
fn py_int_str(s: &str) -> Option<i64> {
    let t = crate::prompt::question::py_strip(s);
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    let b = digits.as_bytes();
    let ok = !b.is_empty()
        && b.first().is_some_and(u8::is_ascii_digit)
        && b.last().is_some_and(u8::is_ascii_digit)
        && b.windows(2).all(|w| !(w[0] == b'_' && w[1] == b'_'))
        && b.iter().all(|c| c.is_ascii_digit() || *c == b'_');
    if !ok {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// The payload's `version` as laya reads it (1 when absent or null); only its validity matters
/// here (laya warns, and still loads, when a version-2 file was fitted for another checkpoint).
fn check_version(v: Option<&Value>) -> Result<(), TemperatureError> {
    let bad = |v: &Value| refuse(format!("calibration JSON version must be an integer, got {}", repr(v)));
    match v {
        None | Some(Value::Null) | Some(Value::Int(_)) => Ok(()),
        Some(f @ Value::Float(x)) => {
            if x.is_finite() && x.fract() == 0.0 {
                Ok(())
            } else {
                Err(bad(f))
            }
        }
        Some(s @ Value::Str(text)) => py_int_str(text).map(|_| ()).ok_or_else(|| bad(s)),
        Some(other) => Err(bad(other)),
    }
}

/// Python's `float(v)` succeeds for a binning value: a number, a bool, or numeric text.
fn floats(v: &Value) -> Option<f64> {
    match v {
        Value::Float(f) => Some(*f),
        Value::Int(i) => Some(i.to_f64()),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::Str(_) => super::temperature::py_float(v),
        _ => None,
    }
}

fn binning_entry(name: &str, entry: &Value) -> Result<Vec<f64>, TemperatureError> {
    let n = repr_str(name);
    let Value::Object(_) = entry else {
        return Err(refuse(format!(
            "calibration JSON binning_map[{n}] must be an object with \"bins\" and \"values\", got {}",
            entry.python_type_name()
        )));
    };
    let bins_value = entry.get("bins").unwrap_or(&Value::Null);
    let bins = match bins_value {
        Value::Int(i) => i.to_i64().filter(|b| *b >= 1),
        _ => None,
    }
    .ok_or_else(|| {
        refuse(format!(
            "calibration JSON binning_map[{n}] must have an integer \"bins\" >= 1, got {}",
            repr(bins_value)
        ))
    })?;
    let values = match entry.get("values") {
        Some(Value::Array(items)) if items.len() as i64 == bins => items,
        _ => {
            return Err(refuse(format!(
                "calibration JSON binning_map[{n}] must have \"values\" of length \"bins\" ({bins})"
            )));
        }
    };
    let list = Value::Array(values.clone());
    let not_numbers =
        || refuse(format!("calibration JSON binning_map[{n}] values must be numbers, got {}", repr(&list)));
    let parsed: Vec<f64> = values.iter().map(floats).collect::<Option<_>>().ok_or_else(not_numbers)?;
    if values.iter().any(|v| !matches!(v, Value::Int(_) | Value::Float(_))) {
        return Err(not_numbers());
    }
    for v in &parsed {
        if !v.is_finite() {
            return Err(refuse(format!(
                "calibration JSON binning_map[{n}] values must be finite, got {}",
                repr(&list)
            )));
        }
        if !(0.0..=1.0).contains(v) {
            return Err(refuse(format!(
                "calibration JSON binning_map[{n}] values must be in [0, 1], got {}",
                repr(&list)
            )));
        }
    }
    Ok(parsed)
}

/// Applies a calibration payload to `temperatures`: laya 0.4.15's `apply_calibration_payload`,
/// with its checks and messages.
pub fn apply(temperatures: &mut Temperatures, payload: &Value) -> Result<(), TemperatureError> {
    let laya = LayaVersion::V0_4_15;
    if !matches!(payload, Value::Object(_)) {
        return Err(refuse(format!("calibration JSON must be an object, got {}", payload.python_type_name())));
    }
    check_version(payload.get("version"))?;
    let Some(Value::Array(temps)) = payload.get("temperature") else {
        return Err(refuse("calibration JSON must contain temperature: [3 floats]".into()));
    };
    let [a, b, c] = temps.as_slice() else {
        return Err(refuse("calibration JSON must contain temperature: [3 floats]".into()));
    };
    let by_options = match payload.get("temperature_by_options") {
        None | Some(Value::Null) => IndexMap::new(),
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), clamp_temperature_as(laya, v))).collect(),
        Some(other) => {
            return Err(refuse(format!(
                "calibration JSON temperature_by_options must be an object of bucket -> float, got {}",
                other.python_type_name()
            )));
        }
    };
    let binning = match payload.get("binning_map") {
        None | Some(Value::Null) => IndexMap::new(),
        Some(Value::Object(m)) => {
            m.iter().map(|(name, entry)| Ok((name.clone(), binning_entry(name, entry)?))).collect::<Result<_, _>>()?
        }
        Some(other) => {
            return Err(refuse(format!(
                "calibration JSON binning_map must be an object of bucket -> {{bins, values}}, got {}",
                other.python_type_name()
            )));
        }
    };
    temperatures.base = TemperatureTable {
        per_type: [clamp_temperature_as(laya, a), clamp_temperature_as(laya, b), clamp_temperature_as(laya, c)],
        by_options,
    };
    temperatures.binning = binning;
    Ok(())
}

/// laya's `apply_binning_map`: the recalibrated confidence of `confidence`'s bin in `bucket`, or
/// `confidence` itself when the map has no entry for the bucket.
pub fn apply_binning(binning: &IndexMap<String, Vec<f64>>, bucket: &str, confidence: f64) -> f64 {
    let Some(values) = binning.get(bucket).filter(|v| !v.is_empty()) else {
        return confidence;
    };
    let bins = values.len();
    // `int(float(confidence) * bins)`, truncated toward zero, then clamped to the bins.
    let b = ((confidence * bins as f64).trunc().max(0.0) as usize).min(bins - 1);
    values[b]
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya_topics::json::{ParseOptions, parse_str};

    fn v(s: &str) -> Value {
        parse_str(s, ParseOptions::default()).unwrap()
    }

    #[test]
    fn a_calibration_replaces_the_temperatures_and_installs_its_binning_map() {
        let mut t = Temperatures::from_config(Some(&v("[1.5, 1.5, 1.5]")), None, None).unwrap();
        apply(
            &mut t,
            &v(r#"{"version": 2, "temperature": [2.0, 0.1, true], "temperature_by_options": {"choice:2": 9},
                  "binning_map": {"noul:2": {"bins": 2, "values": [0.25, 1]}}}"#),
        )
        .unwrap();
        assert_eq!(t.base.per_type, [2.0, 0.5, 1.0]);
        assert_eq!(t.base.by_options.get("choice:2"), Some(&5.0));
        assert_eq!(apply_binning(&t.binning, "noul:2", 0.49), 0.25);
        assert_eq!(apply_binning(&t.binning, "noul:2", 1.0), 1.0);
        assert_eq!(apply_binning(&t.binning, "choice:2", 0.7), 0.7);
    }

    #[test]
    fn a_malformed_calibration_is_refused_with_layas_message() {
        let cases = [
            ("[]", "calibration JSON must be an object, got list"),
            (r#"{"version": 1.5, "temperature": [1, 1, 1]}"#, "calibration JSON version must be an integer, got 1.5"),
            (r#"{"temperature": [1, 1]}"#, "calibration JSON must contain temperature: [3 floats]"),
            (
                r#"{"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5, "a"]}}}"#,
                "calibration JSON binning_map['noul:2'] values must be numbers, got [0.5, 'a']",
            ),
            (
                r#"{"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 1, "values": [1.5]}}}"#,
                "calibration JSON binning_map['noul:2'] values must be in [0, 1], got [1.5]",
            ),
        ];
        for (payload, want) in cases {
            let mut t = Temperatures::default();
            assert_eq!(apply(&mut t, &v(payload)).unwrap_err().to_string(), want, "{payload}");
        }
    }
}
