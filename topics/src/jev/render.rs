//! laya.serve's response body from laya's result: what `_add_jev_confidence` adds, the
//! `routing` report, and `LAYA_JEV_STRICT`'s projection (`_project_jev_strict`).
//!
//! laya's own result (`{model, answers, usage}`, as [`PredictResult::to_value`] writes it)
//! already carries `action`, `answer_confidence` and the abstention fields; laya.serve appends
//! `routing` (from its Router) and `x_jev_confidence` on every choice and score answer. The
//! strict variant keeps Jev's fields only and computes nothing.

use crate::answer::{Answer, PredictResult};
use crate::pyfloat;
use crate::value::{Integer, Map, Value};

use super::contract::{Kind, Refusal};
use crate::pyrepr::repr_str;

/// laya's `routing` report for a result, as the caller's Router made it.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// The checkpoint's name (`edge`).
    pub model: Value,
    /// Where it was loaded from (the `LAYA_EXTRA_MODELS` source string).
    pub repo: Value,
    /// Why it was chosen (see [`Routing::explicit_model`]).
    pub reason: String,
    pub detection: Value,
    pub workflow: Value,
}

impl Routing {
    /// A checkpoint named by `model`: reason `explicit model='<name>'`.
    pub fn explicit_model(name: &str, repo: &str) -> Routing {
        Routing {
            model: name.into(),
            repo: repo.into(),
            reason: format!("explicit model={}", repr_str(name)),
            detection: Value::Null,
            workflow: Value::Null,
        }
    }

    /// A checkpoint named by `task` (no `model`): reason `explicit task='<task as sent>'`.
    pub fn explicit_task(name: &str, repo: &str, task: &str) -> Routing {
        Routing { reason: format!("explicit task={}", repr_str(task)), ..Routing::explicit_model(name, repo) }
    }

    /// The report as laya writes it: `{model, repo, reason, detection, workflow}`.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("model".into(), self.model.clone());
        m.insert("repo".into(), self.repo.clone());
        m.insert("reason".into(), self.reason.as_str().into());
        m.insert("detection".into(), self.detection.clone());
        m.insert("workflow".into(), self.workflow.clone());
        Value::Object(m)
    }
}

/// The seam for laya's own refusals (row 19): laya.serve answers the whole request with 422
/// and the first refused question's `ValueError` text, where laya-edge answers the other
/// questions and puts an error in the refused one's place. `None` when every question was
/// answered.
pub fn question_refusal(result: &PredictResult) -> Option<Refusal> {
    result.answers.iter().find_map(|(_, a)| match a {
        Answer::Error(e) => Some(Kind::LayaValueError.refusal(&[&e.message])),
        _ => None,
    })
}

/// `laya.confidence.jev_confidence(answer)`: Jev's confidence from the answer's
/// `probabilities`, or `None` when they give no number (see `docs/http-contract.md`).
pub fn jev_confidence(answer: &Map) -> Option<f64> {
    let kind = answer.get("type").and_then(Value::as_str)?;
    let Some(Value::Object(probabilities)) = answer.get("probabilities") else { return None };
    if !matches!(kind, "choice" | "score") || probabilities.is_empty() {
        return None;
    }
    let as_float = |v: &Value| match v {
        Value::Float(f) => Some(*f),
        Value::Int(i) => Some(i.to_f64()),
        Value::Bool(_) => None,
        Value::Str(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    let mut p: Vec<f64> = if kind == "score" {
        let mut keyed = probabilities
            .iter()
            .map(|(k, v)| Some((Integer::parse(k.trim())?.to_i128()?, as_float(v)?)))
            .collect::<Option<Vec<(i128, f64)>>>()?;
        keyed.sort_by_key(|(k, _)| *k);
        keyed.into_iter().map(|(_, v)| v).collect()
    } else {
        probabilities.values().map(as_float).collect::<Option<Vec<f64>>>()?
    };
    if !p.iter().all(|v| v.is_finite() && *v >= 0.0) {
        return None;
    }
    let n = p.len();
    if n == 1 {
        return Some(1.0);
    }
    let nf = n as f64;
    // Python 3.11's `sum` of floats: plain left-to-right addition from the integer 0.
    let total = p.iter().fold(0.0, |acc, v| acc + v);
    if total != 0.0 {
        p.iter_mut().for_each(|v| *v /= total);
    } else {
        p.iter_mut().for_each(|v| *v = 1.0 / nf);
    }
    if kind == "choice" {
        let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        return Some((max - 1.0 / nf) / (1.0 - 1.0 / nf));
    }
    let mut mode = 0;
    for (i, v) in p.iter().enumerate() {
        if *v > p[mode] {
            mode = i;
        }
    }
    let spread = p.iter().enumerate().fold(0.0, |acc, (i, v)| acc + v * (i.abs_diff(mode) as f64));
    let center = (nf - 1.0) / 2.0;
    let uniform_spread = (0..n).fold(0.0, |acc, i| acc + (i as f64 - center).abs()) / nf;
    Some(f64::max(0.0, 1.0 - spread / uniform_spread))
}

/// `_add_jev_confidence`: every answer that gives a number gets `x_jev_confidence`, rounded to
/// 4 places, appended last.
fn add_jev_confidence(result: &Map) -> Map {
    let mut out = result.clone();
    if let Some(Value::Object(answers)) = out.get_mut("answers") {
        for answer in answers.values_mut() {
            if let Value::Object(a) = answer
                && let Some(conf) = jev_confidence(a)
            {
                a.insert("x_jev_confidence".into(), Value::Float(pyfloat::round(conf, 4)));
            }
        }
    }
    out
}

/// `_project_jev_strict`: `{model, answers, usage}` with Jev's fields only.
fn project_strict(result: &Map) -> Map {
    let pick = |a: &Map, keys: &[&str]| -> Value {
        Value::Object(keys.iter().map(|k| (k.to_string(), a.get(*k).cloned().unwrap_or(Value::Null))).collect())
    };
    let mut answers = Map::new();
    if let Some(Value::Object(given)) = result.get("answers") {
        for (qid, answer) in given {
            let projected = match answer {
                Value::Object(a) => match a.get("type").and_then(Value::as_str) {
                    Some("choice") => pick(a, &["type", "choice", "confidence", "probabilities"]),
                    Some("score") => pick(a, &["type", "score", "confidence", "probabilities", "legend"]),
                    Some("noul") => pick(a, &["type", "noul"]),
                    _ => answer.clone(),
                },
                other => other.clone(),
            };
            answers.insert(qid.clone(), projected);
        }
    }
    let usage = result.get("usage");
    let count = |k: &str| usage.and_then(|u| u.get(k)).cloned().unwrap_or(Value::int(0));
    let mut u = Map::new();
    u.insert("input_tokens".into(), count("input_tokens"));
    u.insert("output_tokens".into(), count("output_tokens"));
    let mut out = Map::new();
    out.insert("model".into(), result.get("model").cloned().unwrap_or(Value::Null));
    out.insert("answers".into(), Value::Object(answers));
    out.insert("usage".into(), Value::Object(u));
    out
}

/// Router's result: laya's `{model, answers, usage}` with `routing` appended (kept if the
/// document already has one).
fn with_routing(result: &Value, routing: &Routing) -> Map {
    let mut m = result.as_object().cloned().unwrap_or_default();
    if !m.contains_key("routing") {
        m.insert("routing".into(), routing.to_value());
    }
    m
}

/// The `POST /v1/systemone` body for laya's result document `result` (`{model, answers,
/// usage}`), chosen by `routing`; `strict` is `LAYA_JEV_STRICT`.
pub fn render(result: &Value, routing: &Routing, strict: bool) -> Value {
    let full = with_routing(result, routing);
    Value::Object(if strict { project_strict(&full) } else { add_jev_confidence(&full) })
}

/// [`render`] for a typed result. Check [`question_refusal`] first: laya.serve has no answer
/// for a request with a refused question.
pub fn render_result(result: &PredictResult, routing: &Routing, strict: bool) -> Value {
    render(&result.to_value(), routing, strict)
}

/// The `POST /v1/systemone/batch` body: `{results, total_usage}`, `total_usage` summed over
/// laya's results before any projection.
pub fn render_batch(results: &[(Value, Routing)], strict: bool) -> Value {
    let mut total_in: i128 = 0;
    let mut total_out: i128 = 0;
    let mut rendered = Vec::with_capacity(results.len());
    for (result, routing) in results {
        let tokens = |k: &str| result.get("usage").and_then(|u| u.get(k)).and_then(|v| v.as_i64()).unwrap_or(0);
        total_in += i128::from(tokens("input_tokens"));
        total_out += i128::from(tokens("output_tokens"));
        rendered.push(render(result, routing, strict));
    }
    let mut usage = Map::new();
    usage.insert("input_tokens".into(), Value::Int(total_in.into()));
    usage.insert("output_tokens".into(), Value::Int(total_out.into()));
    let mut out = Map::new();
    out.insert("results".into(), Value::Array(rendered));
    out.insert("total_usage".into(), Value::Object(usage));
    Value::Object(out)
}

/// The body's bytes as Starlette's `JSONResponse` writes them: compact, UTF-8, not ASCII-escaped.
/// (Starlette also refuses NaN and the infinities, which a rendered answer never holds.)
pub fn body_text(value: &Value) -> String {
    crate::json::to_string(value, crate::json::Style::COMPACT)
}
