//! The probe: does the backend still answer like the float model?
//!
//! Quantization and runtime bugs fail silently: a min-max calibrated graph at 256 tokens turns
//! every decision into 0.5, librknnrt 2.4.2 returns one vector for every input, a context binary
//! from another QAIRT release may load and misbehave. A bundle therefore ships probe rows with
//! the float model's logits (made by the CPU backend when the bundle is assembled, see
//! `engine::probe_file`), and the engine runs them on every new worker (with the health call) and
//! every `probe.interval_min`. This module only compares: rows in, figures out, no I/O.
//!
//! Probabilities here are the softmax of a row's option logits at temperature 1 (the same for
//! both sides, so the figures compare the backends, not the temperatures).

use crate::backend::RowResult;
use crate::bundle::Thresholds;
use crate::prompt::Row;

/// A decision is clear when the float model's top two probabilities differ by more than this.
pub const CLEAR_MARGIN: f64 = 0.02;

/// The probe rows and what the float model answered for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub rows: Vec<Row>,
    pub expected: Vec<RowResult>,
    pub thresholds: Thresholds,
}

/// The figures of one probe run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub rows: usize,
    /// Rows whose best option agrees with the float model's.
    pub agree: usize,
    /// Rows the float model decides clearly, and how many of those agree.
    pub clear: usize,
    pub clear_agree: usize,
    /// Mean and largest per-row max |dp| over the options.
    pub mean_dp: f64,
    pub max_dp: f64,
    /// Mean cosine of the option logits.
    pub mean_cosine: f64,
    /// Why the outputs look collapsed (near-uniform, or the same for different inputs).
    pub collapse: Option<String>,
    /// Whether the figures meet the thresholds (and nothing collapsed).
    pub passed: bool,
    /// What failed, in a sentence (empty when passed).
    pub verdict: String,
}

impl Report {
    pub fn agreement(&self) -> f64 {
        ratio(self.agree, self.rows)
    }

    pub fn clear_agreement(&self) -> f64 {
        ratio(self.clear_agree, self.clear)
    }
}

impl std::fmt::Display for Report {
    /// Like the model cards: `argmax 87/88, clear 80/80, mean |dp| 0.004 (max 0.03), mean cosine 0.999`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "argmax {}/{}, clear decisions {}/{}, mean |dp| {:.4} (max {:.4}), mean cosine {:.4}",
            self.agree, self.rows, self.clear_agree, self.clear, self.mean_dp, self.max_dp, self.mean_cosine
        )?;
        if let Some(c) = &self.collapse {
            write!(f, ", collapsed: {c}")?;
        }
        Ok(())
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let e: Vec<f64> = logits.iter().map(|&v| (f64::from(v) - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

fn argmax(p: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in p.iter().enumerate() {
        if *v > p[best] {
            best = i;
        }
    }
    best
}

fn top_two_margin(p: &[f64]) -> f64 {
    let mut s: Vec<f64> = p.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s.get(1).copied().unwrap_or(0.0)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        // Two zero vectors are the same; one zero vector against another is not.
        return if na == nb { 1.0 } else { 0.0 };
    }
    dot / (na * nb)
}

/// Largest difference between two rows' logits.
fn distance(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs()).fold(0.0, f64::max)
}

/// How close two outputs must be to count as "the same" for different inputs, and how far
/// apart the float model's outputs must be for that to be wrong.
const SAME: f64 = 1e-4;
const DIFFERENT: f64 = 1e-2;
/// A row is near-uniform when its probabilities all lie within this of `1/n`.
const UNIFORM: f64 = 0.01;

impl Probe {
    /// Compares `outputs` (one per probe row, in order) with the float model's.
    pub fn judge(&self, outputs: &[RowResult]) -> Report {
        let mut r = Report {
            rows: self.rows.len(),
            agree: 0,
            clear: 0,
            clear_agree: 0,
            mean_dp: 0.0,
            max_dp: 0.0,
            mean_cosine: 0.0,
            collapse: None,
            passed: false,
            verdict: String::new(),
        };
        if outputs.len() != self.rows.len() {
            r.verdict = format!("the backend answered {} probe rows of {}", outputs.len(), self.rows.len());
            return r;
        }
        let mut uniform_got = 0;
        let mut uniform_expected = 0;
        let mut dp_sum = 0.0;
        let mut cos_sum = 0.0;
        for (want, got) in self.expected.iter().zip(outputs) {
            if want.logits.len() != got.logits.len() || want.logits.is_empty() {
                r.verdict = format!(
                    "a probe row came back with {} option logits instead of {}",
                    got.logits.len(),
                    want.logits.len()
                );
                return r;
            }
            let (pw, pg) = (softmax(&want.logits), softmax(&got.logits));
            let agree = argmax(&pw) == argmax(&pg);
            r.agree += usize::from(agree);
            if top_two_margin(&pw) > CLEAR_MARGIN {
                r.clear += 1;
                r.clear_agree += usize::from(agree);
            }
            let dp = pw.iter().zip(&pg).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            dp_sum += dp;
            r.max_dp = r.max_dp.max(dp);
            cos_sum += cosine(&want.logits, &got.logits);
            let n = pg.len() as f64;
            uniform_got += usize::from(pg.iter().all(|p| (p - 1.0 / n).abs() < UNIFORM));
            uniform_expected += usize::from(pw.iter().all(|p| (p - 1.0 / n).abs() < UNIFORM));
        }
        let n = self.rows.len().max(1) as f64;
        r.mean_dp = dp_sum / n;
        r.mean_cosine = cos_sum / n;
        r.collapse = self.collapse(outputs, uniform_got, uniform_expected);
        let t = &self.thresholds;
        let mut failed = Vec::new();
        if r.agreement() < t.min_agreement {
            failed.push(format!("argmax agreement {:.3} < {}", r.agreement(), t.min_agreement));
        }
        if r.clear_agreement() < t.min_clear_agreement {
            failed.push(format!("clear-decision agreement {:.3} < {}", r.clear_agreement(), t.min_clear_agreement));
        }
        // NaN logits give a NaN cosine: that fails too.
        if r.mean_cosine.is_nan() || r.mean_cosine < t.min_cosine {
            failed.push(format!("mean cosine {:.4} < {}", r.mean_cosine, t.min_cosine));
        }
        if let Some(c) = &r.collapse {
            failed.push(format!("collapsed: {c}"));
        }
        r.passed = failed.is_empty();
        r.verdict = failed.join("; ");
        r
    }

    fn collapse(&self, outputs: &[RowResult], uniform_got: usize, uniform_expected: usize) -> Option<String> {
        let rows = self.rows.len();
        if rows >= 2 && uniform_got == rows && uniform_expected < rows {
            return Some(format!(
                "all {rows} probe rows came back near-uniform (every probability within {UNIFORM} of 1/n)"
            ));
        }
        let mut same = 0;
        let mut pairs = 0;
        for i in 0..rows {
            for j in i + 1..rows {
                let comparable = self.rows[i].input_ids != self.rows[j].input_ids
                    && self.expected[i].logits.len() == self.expected[j].logits.len()
                    && distance(&self.expected[i].logits, &self.expected[j].logits) > DIFFERENT;
                if comparable {
                    pairs += 1;
                    same += usize::from(distance(&outputs[i].logits, &outputs[j].logits) < SAME);
                }
            }
        }
        // One identical pair can happen; half of them cannot.
        (pairs > 0 && same * 2 >= pairs).then(|| {
            format!("{same} of {pairs} pairs of different probe rows came back with the same logits (within {SAME})")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;

    fn row(ids: &[u32]) -> Row {
        Row { input_ids: ids.to_vec(), marker_pos: vec![1, 2], qtype: QType::Choice, layout: None }
    }

    fn out(logits: &[f32]) -> RowResult {
        RowResult { logits: logits.to_vec(), act_logits: vec![] }
    }

    fn probe(expected: &[&[f32]]) -> Probe {
        Probe {
            rows: (0..expected.len() as u32).map(|i| row(&[1, 100 + i, 2])).collect(),
            expected: expected.iter().map(|l| out(l)).collect(),
            thresholds: Thresholds::default(),
        }
    }

    const FLOAT: [&[f32]; 4] = [&[2.0, -1.0], &[-1.5, 1.0, 0.2], &[0.3, 0.1], &[-3.0, 3.0]];

    #[test]
    fn the_float_models_own_answers_pass_with_perfect_figures() {
        let p = probe(&FLOAT);
        let r = p.judge(&p.expected);
        assert!(r.passed, "{r}: {}", r.verdict);
        assert_eq!((r.agree, r.clear, r.clear_agree), (4, 4, 4));
        assert_eq!((r.mean_dp, r.max_dp), (0.0, 0.0));
        assert!((r.mean_cosine - 1.0).abs() < 1e-12);
    }

    #[test]
    fn small_quantization_noise_passes_and_is_measured() {
        let p = probe(&FLOAT);
        let noisy: Vec<RowResult> = p
            .expected
            .iter()
            .map(|o| out(&o.logits.iter().map(|v| v + 0.01 * v.signum()).collect::<Vec<_>>()))
            .collect();
        let r = p.judge(&noisy);
        assert!(r.passed, "{r}: {}", r.verdict);
        assert!(r.mean_dp > 0.0 && r.max_dp < 0.01, "{r}");
    }

    #[test]
    fn flipped_decisions_fail_with_the_figures_in_the_verdict() {
        let p = probe(&FLOAT);
        let flipped: Vec<RowResult> =
            p.expected.iter().map(|o| out(&o.logits.iter().rev().copied().collect::<Vec<_>>())).collect();
        let r = p.judge(&flipped);
        assert!(!r.passed);
        assert!(r.agree < 4 && r.verdict.contains("argmax agreement"), "{r}: {}", r.verdict);
    }

    #[test]
    fn near_uniform_outputs_are_a_collapse() {
        let p = probe(&FLOAT);
        // Every decision 0.5 (or 1/3): the min-max-at-256 failure.
        let flat: Vec<RowResult> = p.expected.iter().map(|o| out(&vec![0.001; o.logits.len()])).collect();
        let r = p.judge(&flat);
        assert!(!r.passed);
        assert!(r.collapse.as_deref().is_some_and(|c| c.contains("near-uniform")), "{r}");
    }

    #[test]
    fn the_same_output_for_different_rows_is_a_collapse_even_when_argmaxes_agree() {
        // librknnrt 2.4.2: one vector for every input. Rows of the same width the float model
        // answers differently but with the same best option.
        let p = probe(&[&[2.0, -1.0], &[1.0, 0.0], &[3.0, -2.0], &[0.9, 0.1]]);
        let constant: Vec<RowResult> = p.expected.iter().map(|_| out(&[1.5, -0.5])).collect();
        let r = p.judge(&constant);
        assert_eq!(r.agree, 4, "every argmax agrees, so only the collapse check can catch it");
        assert!(!r.passed && r.collapse.is_some(), "{r}");
    }

    #[test]
    fn a_wrong_number_of_rows_or_options_fails_without_panicking() {
        let p = probe(&FLOAT);
        assert!(!p.judge(&p.expected[..3]).passed);
        let mut short = p.expected.clone();
        short[1].logits.pop();
        let r = p.judge(&short);
        assert!(!r.passed && r.verdict.contains("option logits"), "{}", r.verdict);
        let mut nan = p.expected.clone();
        nan[0].logits[0] = f32::NAN;
        assert!(!p.judge(&nan).passed, "NaN logits must not pass");
    }
}
