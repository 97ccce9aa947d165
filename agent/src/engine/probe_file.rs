//! A bundle's probe file (`probe.jsonl`): requests with the float model's logits for each of
//! their questions, made by the CPU backend when the bundle is assembled
//! (`cli::bundle::make_probe`), read back into the engine's [`Probe`] (rows laid out again by
//! this agent through the pipeline, checked against the recorded tokens). Here, not in
//! `bundle`, because reading it lays requests out: `bundle` only reads files.
//!
//! One line per request: `{"request": {...}, "rows": {qid: {"input_ids": [...], "logits":
//! [...], "act_logits": [...]}}}`. The request is kept as sent, so a person can read what the
//! probe asks; the token ids make a changed tokenizer or layout an error rather than a silent
//! comparison of different rows.

use std::path::Path;

use laya_topics::json::{self, ParseOptions};
use laya_topics::{Request, Value};

use super::probe::{Probe, Thresholds};
use crate::backend::RowResult;
use crate::bundle::{BundleError, HostBundle};
use crate::pipeline;
use crate::prompt::Row;

/// The requests a bundle is probed with when its maker gives none, and what fills a graph the
/// maker's requests leave short of rows (`cli::bundle::make_probe`): short and long states (text,
/// objects, conversations; ten of 130-260 words, long enough to fill a 256-token row however a
/// tokenizer counts, and cut to any shorter graph's length when laid out at it) and every
/// question type with two to five options.
pub const DEFAULT_REQUESTS: &str = include_str!("probe_requests.jsonl");

/// Reads JSON-lines requests (a request per line, or `{"request": ...}` as the demo fixtures
/// have them); blank lines are skipped.
pub fn parse_requests(text: &str, origin: &Path) -> Result<Vec<Value>, BundleError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| BundleError::Probe { path: origin.to_owned(), message };
        let v = json::parse_str(line, ParseOptions::default()).map_err(|e| bad(format!("line {}: {e}", n + 1)))?;
        let v = match v.get("request") {
            Some(r @ Value::Object(_)) => r.clone(),
            _ => v,
        };
        Request::from_value(v.clone()).map_err(|e| bad(format!("line {}: {e}", n + 1)))?;
        out.push(v);
    }
    Ok(out)
}

/// The valid questions of `request` laid out for `bundle` (qid and row).
pub fn rows_of(bundle: &HostBundle, request: &Value, origin: &Path) -> Result<Vec<(String, Row)>, BundleError> {
    let bad = |message: String| BundleError::Probe { path: origin.to_owned(), message };
    let r = Request::from_value(request.clone()).map_err(|e| bad(e.to_string()))?;
    let prepared = pipeline::prepare(bundle, &r, usize::MAX).map_err(|e| bad(e.to_string()))?;
    Ok(prepared.questions.into_iter().filter_map(|p| p.outcome.ok().map(|(_, row)| (p.qid, row))).collect())
}

fn float_list(v: Option<&Value>) -> Option<Vec<f32>> {
    v?.as_array()?.iter().map(|x| x.as_f64().map(|f| f as f32)).collect()
}

/// Reads a probe file for `bundle`: every recorded row is laid out again and must give the
/// same token ids.
pub fn load(path: &Path, bundle: &HostBundle, thresholds: Thresholds) -> Result<Probe, BundleError> {
    let text = std::fs::read_to_string(path).map_err(|source| BundleError::Read { path: path.to_owned(), source })?;
    let bad = |message: String| BundleError::Probe { path: path.to_owned(), message };
    let mut probe = Probe { rows: Vec::new(), expected: Vec::new(), thresholds };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |m: String| bad(format!("line {}: {m}", n + 1));
        let v = json::parse_str(line, ParseOptions::default()).map_err(|e| at(e.to_string()))?;
        let request = v.get("request").ok_or_else(|| at("no 'request'".into()))?;
        let recorded = v.get("rows").and_then(Value::as_object).ok_or_else(|| at("no 'rows' object".into()))?;
        let rows = rows_of(bundle, request, path)?;
        for (qid, row) in rows {
            let Some(rec) = recorded.get(&qid) else {
                return Err(at(format!("question {qid:?} has no recorded row")));
            };
            let ids = rec.get("input_ids").and_then(Value::as_array).unwrap_or_default();
            let same = ids.len() == row.input_ids.len()
                && ids.iter().zip(&row.input_ids).all(|(a, b)| a.as_i64() == Some(i64::from(*b)));
            if !same {
                return Err(at(format!(
                    "question {qid:?} lays out to {} tokens here but was recorded with {}: the tokenizer or the layout differs from the one the probe was made with",
                    row.input_ids.len(),
                    ids.len()
                )));
            }
            let logits = float_list(rec.get("logits")).ok_or_else(|| at(format!("{qid}: 'logits' must be numbers")))?;
            if logits.len() != row.marker_pos.len() {
                return Err(at(format!("{qid}: {} logits for {} options", logits.len(), row.marker_pos.len())));
            }
            let act_logits = float_list(rec.get("act_logits")).unwrap_or_default();
            probe.rows.push(row);
            probe.expected.push(RowResult { logits, act_logits });
        }
    }
    if probe.rows.is_empty() {
        return Err(bad("the probe has no rows".into()));
    }
    Ok(probe)
}

/// The bundle's probe, if its manifest names one.
pub fn of_bundle(bundle: &HostBundle) -> Result<Option<Probe>, BundleError> {
    match bundle.manifest.as_ref().and_then(|m| m.probe.as_ref()) {
        Some(spec) => load(&spec.file, bundle, Thresholds::with(&spec.thresholds)).map(Some),
        None => Ok(None),
    }
}
