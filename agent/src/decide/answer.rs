//! Typed answers from one question's logits: laya's `Agent._decode_answers`.
//!
//! The arithmetic is laya's, operation for operation: `float32` logits divided by the temperature
//! (numpy casts the Python float to `float32` first), numpy's `exp`, `log` and pairwise sums,
//! `float32` division, then Python's `round(x, 4)` on the `float64` value. The expected score is
//! the one `float64` computation (`np.arange(k)` is int64, which promotes the product).

use laya_topics::pyfloat::round;
use laya_topics::{Action, Answer};

use super::numpy;
use crate::prompt::question::{Criteria, Question};

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

/// Turns one question's logits (its `k` real options, in option order) into its answer.
///
/// `act_probability` is the act head's first-class probability (after its softmax).
pub fn answer(q: &Question, logits: &[f32], act_probability: f32, temperature: f64) -> Answer {
    let p = probabilities(logits, temperature);
    let action = Action { act_probability: r4(act_probability) };
    let answer_confidence = r4(answer_confidence(&p));
    match &q.criteria {
        Criteria::Choice(labels) => Answer::Choice {
            choice: labels.get(numpy::argmax(&p)).map(|(l, _)| l.clone()).unwrap_or_default(),
            probabilities: labels.iter().zip(&p).map(|((l, _), &v)| (l.clone(), r4(v))).collect(),
            confidence: r4(entropy_confidence(&p)),
            answer_confidence,
            action,
        },
        Criteria::Score(levels) => {
            let weighted: Vec<f64> = p.iter().enumerate().map(|(i, &v)| i as f64 * f64::from(v)).collect();
            Answer::Score {
                score: round(numpy::sum(&weighted), 4),
                legend: levels.iter().enumerate().map(|(i, c)| (i.to_string(), c.clone())).collect(),
                probabilities: p.iter().enumerate().map(|(i, &v)| (i.to_string(), r4(v))).collect(),
                confidence: r4(entropy_confidence(&p)),
                answer_confidence,
                action,
            }
        }
        Criteria::Noul { .. } => {
            let p_true = p.get(1).copied().map_or(0.0, f64::from);
            Answer::Noul {
                noul: round(p_true, 4),
                confidence: round(p_true.max(1.0 - p_true), 4),
                answer_confidence,
                action,
            }
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
