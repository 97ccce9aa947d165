//! Typed answers from one question's logits: laya's `Agent._decode_answers`.
//!
//! The arithmetic is laya's, operation for operation: `float32` logits divided by the temperature
//! (numpy casts the Python float to `float32` first), numpy's `exp`, `log` and pairwise sums,
//! `float32` division, then Python's `round(x, 4)` on the `float64` value. The expected score is
//! the one `float64` computation (`np.arange(k)` is int64, which promotes the product).

use indexmap::IndexMap;
use laya_topics::pyfloat::round;
use laya_topics::wire::LayaVersion;
use laya_topics::{Action, Answer, Value};

use super::gate::MinConfidence;
use super::numpy;
use super::temperature::bucket;
use crate::prompt::question::{Criteria, Question, label_key};
use crate::prompt::render::render_criterion;

/// laya's decision probabilities: `p = exp(z - max(z)) / sum(...)`, `z = logits / t`.
pub fn probabilities(logits: &[f32], temperature: f64) -> Vec<f32> {
    let t = temperature as f32;
    let z: Vec<f32> = logits.iter().map(|&x| x / t).collect();
    let m = numpy::max(&z);
    let e: Vec<f32> = z.iter().map(|&v| numpy::exp(v - m)).collect();
    let s = numpy::sum(&e);
    e.iter().map(|&v| v / s).collect()
}

/// laya's `confidence_from_probs`: `1 - H(p) / ln k`, clipped to [0, 1]; 1 for a single option.
pub fn entropy_confidence(p: &[f32]) -> f32 {
    let k = p.len();
    if k < 2 {
        return 1.0;
    }
    let terms: Vec<f32> = p.iter().map(|&v| v * numpy::log(v.clamp(1e-12, 1.0))).collect();
    let ent = -numpy::sum(&terms);
    let ln_k = (k as f64).ln() as f32;
    (1.0f32 - ent / ln_k).clamp(0.0, 1.0)
}

/// laya's `answer_confidence`: `max(p)` clipped to [0, 1].
pub fn answer_confidence(p: &[f32]) -> f32 {
    numpy::max(p).clamp(0.0, 1.0)
}

/// The probability of acting, from the act head's logits (softmax, first class).
pub fn act_probabilities(act_logits: &[f32]) -> Vec<f32> {
    let m = numpy::max(act_logits);
    let e: Vec<f32> = act_logits.iter().map(|&v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|&v| v / s).collect()
}

fn r4(x: f32) -> f64 {
    round(f64::from(x), 4)
}

/// laya 0.4.15's `unpermute_probs`: a row in slot order back in option order (slot `s` showed
/// option `order[s]`). A missing or mismatched order leaves the row as it is.
pub fn unpermute(p: Vec<f32>, order: Option<&[usize]>) -> Vec<f32> {
    match order {
        Some(order) if order.len() == p.len() => {
            let mut canonical = vec![0.0; p.len()];
            for (slot, &option) in order.iter().enumerate() {
                canonical[option] = p[slot];
            }
            canonical
        }
        _ => p,
    }
}

/// How one request's answers are decoded, beyond each question's logits.
#[derive(Debug, Clone, Copy)]
pub struct Decoding<'a> {
    /// The laya whose answers these are.
    pub laya: LayaVersion,
    /// laya 0.4.15's binning map, applied to `answer_confidence` (empty: none; not applied when
    /// a language table answers the request).
    pub binning: &'a IndexMap<String, Vec<f64>>,
    /// The request's confidence gate.
    pub gate: Option<&'a MinConfidence>,
}

/// Turns one question's logits (its `k` real options, in option order) into laya 0.3.20's answer.
///
/// `act_probability` is the act head's first-class probability (after its softmax).
pub fn answer(q: &Question, logits: &[f32], act_probability: f32, temperature: f64) -> Answer {
    let none = IndexMap::new();
    let decoding = Decoding { laya: LayaVersion::V0_3_20, binning: &none, gate: None };
    answer_as(q, logits, act_probability, temperature, &decoding)
}

/// [`answer`] as `decoding.laya`'s version decodes it: `logits` in slot order (the question's
/// `option_order`, if any), laya 0.4.15's binning, gate and legend text where it applies.
pub fn answer_as(q: &Question, logits: &[f32], act_probability: f32, temperature: f64, decoding: &Decoding) -> Answer {
    // The row comes back in slot order; everything below indexes by option.
    let p = unpermute(probabilities(logits, temperature), q.option_order.as_deref());
    let action = Action { act_probability: r4(act_probability) };
    let k = p.len();
    let bucket = bucket(q.qtype, k);
    let raw_confidence = answer_confidence(&p);
    let answer_confidence = if decoding.binning.is_empty() {
        r4(raw_confidence)
    } else {
        round(super::calibration::apply_binning(decoding.binning, &bucket, f64::from(raw_confidence)), 4)
    };
    let judge = |confidence: f64| decoding.gate.map(|g| g.judge(&bucket, answer_confidence, confidence));
    match &q.criteria {
        Criteria::Choice(labels) => {
            let confidence = r4(entropy_confidence(&p));
            Answer::Choice {
                choice: labels.get(numpy::argmax(&p)).map(|(l, _)| l.clone()).unwrap_or(Value::Null),
                probabilities: labels.iter().zip(&p).map(|((l, _), &v)| (label_key(l), r4(v))).collect(),
                confidence,
                answer_confidence,
                action,
                gate: judge(confidence),
            }
        }
        Criteria::Score(levels) => {
            let weighted: Vec<f64> = p.iter().enumerate().map(|(i, &v)| i as f64 * f64::from(v)).collect();
            let confidence = r4(entropy_confidence(&p));
            // laya 0.4.15 echoes each level as the text the model read (`render_criterion`),
            // 0.3.20 as the caller wrote it.
            let legend_text =
                |c: &Value| if decoding.laya.is_0_4() { Value::Str(render_criterion(c)) } else { c.clone() };
            Answer::Score {
                score: round(numpy::sum(&weighted), 4),
                legend: levels.iter().enumerate().map(|(i, c)| (i.to_string(), legend_text(c))).collect(),
                probabilities: p.iter().enumerate().map(|(i, &v)| (i.to_string(), r4(v))).collect(),
                confidence,
                answer_confidence,
                action,
                gate: judge(confidence),
            }
        }
        Criteria::Noul { .. } => {
            let p_true = p.get(1).copied().map_or(0.0, f64::from);
            let confidence = round(p_true.max(1.0 - p_true), 4);
            Answer::Noul { noul: round(p_true, 4), confidence, answer_confidence, action, gate: judge(confidence) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_sum_to_one_and_follow_the_temperature() {
        let p = probabilities(&[2.0, 0.0, -1.0], 1.0);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let hot = probabilities(&[2.0, 0.0, -1.0], 5.0);
        assert!(hot[0] < p[0] && hot[2] > p[2]);
        assert_eq!(probabilities(&[-3.0], 1.0), [1.0]);
    }

    #[test]
    fn entropy_confidence_is_zero_for_uniform_and_one_for_certain() {
        assert!(entropy_confidence(&[0.25; 4]) < 1e-6);
        assert!((entropy_confidence(&[1.0, 0.0]) - 1.0).abs() < 1e-6);
        assert_eq!(entropy_confidence(&[1.0]), 1.0);
    }
}
