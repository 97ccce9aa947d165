//! laya 0.4.15's confidence gate: a request's `min_confidence` (`laya.confidence`).
//!
//! A number in [0, 1] gates every answer at it; a map gates each answer at the threshold of its
//! option-count bucket (`"choice:3-5"`, ..., falling back to `"default"`, then to 0: gate
//! nothing). The gate compares `answer_confidence` (falling back to `confidence`) with the
//! threshold and writes `abstention` and `abstention_threshold` on every answer, and
//! `low_confidence: true` on the ones below it. Without `min_confidence` nothing is written. A
//! threshold laya would refuse refuses the request, with laya's message.

use indexmap::IndexMap;
use laya_topics::wire::LayaVersion;
use laya_topics::{Abstention, Gate, Request, Value};

use crate::prompt::pyrepr::repr;

/// The gate's question types and bucket sizes (`BUCKET_QTYPES`, `BUCKET_SIZES`).
const QTYPES: [&str; 3] = ["choice", "score", "noul"];
const SIZES: [&str; 4] = ["2", "3-5", "6-10", "11+"];

/// A validated `min_confidence`.
#[derive(Debug, Clone, PartialEq)]
pub enum MinConfidence {
    /// One threshold for every answer.
    All(f64),
    /// Per option-count bucket, plus an optional `"default"`.
    ByBucket(IndexMap<String, f64>),
}

/// `_check_one_threshold`.
fn threshold(v: &Value) -> Result<f64, String> {
    let x = match v {
        Value::Int(i) => Some(i.to_f64()),
        Value::Float(f) => Some(*f),
        _ => None,
    };
    x.filter(|x| x.is_finite() && (0.0..=1.0).contains(x))
        .ok_or_else(|| format!("min_confidence must be a float in [0.0, 1.0], got {}", repr(v)))
}

impl MinConfidence {
    /// laya's `check_min_confidence`.
    pub fn parse(v: &Value) -> Result<MinConfidence, String> {
        let Value::Object(m) = v else { return threshold(v).map(MinConfidence::All) };
        if m.is_empty() {
            return Err(format!("a min_confidence map must be a non-empty dict of bucket -> float, got {}", repr(v)));
        }
        let mut out = IndexMap::new();
        for (key, val) in m {
            let known =
                key == "default" || key.split_once(':').is_some_and(|(t, s)| QTYPES.contains(&t) && SIZES.contains(&s));
            if !known {
                return Err(format!(
                    "min_confidence map keys must be a bucket like 'choice:3-5' or 'default', got {}",
                    repr(&Value::Str(key.clone()))
                ));
            }
            out.insert(key.clone(), threshold(val)?);
        }
        Ok(MinConfidence::ByBucket(out))
    }

    /// The request's gate, if it set one: refused with laya's message when malformed, and
    /// under laya 0.3.20 (which has no gate) with ours.
    pub fn of_request(laya: LayaVersion, request: &Request) -> Result<Option<MinConfidence>, String> {
        match &request.min_confidence {
            None => Ok(None),
            Some(_) if !laya.is_0_4() => Err(format!(
                "min_confidence is laya 0.4.15's and this model is served as laya {laya}; serve it with [model] laya = \"0.4.15\" (--laya 0.4.15), or leave min_confidence out"
            )),
            Some(v) => MinConfidence::parse(v).map(Some),
        }
    }

    /// `resolve_min_confidence` for an answer in `bucket`.
    fn threshold_for(&self, bucket: &str) -> f64 {
        match self {
            MinConfidence::All(t) => *t,
            MinConfidence::ByBucket(m) => m.get(bucket).or_else(|| m.get("default")).copied().unwrap_or(0.0),
        }
    }

    /// The verdict on an answer in `bucket` with these confidences (`answer_confidence`, then
    /// the entropy `confidence` when that is not a finite number).
    pub fn judge(&self, bucket: &str, answer_confidence: f64, confidence: f64) -> Gate {
        let threshold = self.threshold_for(bucket);
        let conf = [answer_confidence, confidence].into_iter().find(|c| c.is_finite());
        let abstention = match conf {
            None => Abstention::Unevaluated,
            Some(c) if c < threshold => Abstention::Abstained,
            Some(_) => Abstention::Passed,
        };
        Gate { abstention, threshold }
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
    fn thresholds_laya_refuses_are_refused_with_its_messages() {
        for (input, want) in [
            ("true", "min_confidence must be a float in [0.0, 1.0], got True"),
            ("1.5", "min_confidence must be a float in [0.0, 1.0], got 1.5"),
            (r#""0.5""#, "min_confidence must be a float in [0.0, 1.0], got '0.5'"),
            ("{}", "a min_confidence map must be a non-empty dict of bucket -> float, got {}"),
            (
                r#"{"choice:12": 0.5}"#,
                "min_confidence map keys must be a bucket like 'choice:3-5' or 'default', got 'choice:12'",
            ),
            (r#"{"noul:2": -0.1}"#, "min_confidence must be a float in [0.0, 1.0], got -0.1"),
        ] {
            assert_eq!(MinConfidence::parse(&v(input)).unwrap_err(), want, "{input}");
        }
    }

    #[test]
    fn a_bucket_map_falls_back_to_its_default_then_to_gating_nothing() {
        let m = MinConfidence::parse(&v(r#"{"choice:3-5": 0.8, "default": 0.5}"#)).unwrap();
        assert_eq!(m.judge("choice:3-5", 0.7, 0.1), Gate { abstention: Abstention::Abstained, threshold: 0.8 });
        assert_eq!(m.judge("noul:2", 0.7, 0.1), Gate { abstention: Abstention::Passed, threshold: 0.5 });
        let no_default = MinConfidence::parse(&v(r#"{"score:2": 1}"#)).unwrap();
        assert_eq!(no_default.judge("noul:2", 0.0, 0.0).threshold, 0.0);
        assert_eq!(no_default.judge("noul:2", f64::NAN, f64::NAN).abstention, Abstention::Unevaluated);
    }
}
