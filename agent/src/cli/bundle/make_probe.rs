//! Making a bundle's probe file (`laya-edge bundle`): the float model's logits for every
//! question of the probe requests, written in the form [`crate::engine::probe_file`] reads back.

use std::path::Path;

use laya_topics::json::{self, Style};
use laya_topics::{Map, Value};

use crate::backend::Backend;
use crate::bundle::HostBundle;
use crate::engine::probe_file::rows_of;
use crate::prompt::Row;

fn floats(v: &[f32]) -> Value {
    Value::Array(v.iter().map(|x| Value::Float(f64::from(*x))).collect())
}

/// How many rows a probe holds at most: enough to see a few percent of flipped decisions,
/// few enough to run on every new worker.
pub const MAX_ROWS: usize = 48;

/// Runs `requests` on `backend` (the CPU reference when a bundle is assembled), in order until
/// [`MAX_ROWS`] rows, and returns the probe file's text and how many rows it holds.
pub fn make(bundle: &HostBundle, backend: &mut dyn Backend, requests: &[Value]) -> Result<(String, usize), String> {
    let origin = Path::new("probe requests");
    let mut text = String::new();
    let mut total = 0;
    for request in requests {
        if total >= MAX_ROWS {
            break;
        }
        let rows = rows_of(bundle, request, origin).map_err(|e| e.to_string())?;
        if rows.is_empty() {
            continue;
        }
        let refs: Vec<&Row> = rows.iter().map(|(_, r)| r).collect();
        let outputs = backend.run(&refs).map_err(|e| e.to_string())?;
        let mut m = Map::new();
        for ((qid, row), out) in rows.iter().zip(&outputs) {
            let mut r = Map::new();
            r.insert(
                "input_ids".into(),
                Value::Array(row.input_ids.iter().map(|&i| Value::int(i64::from(i))).collect()),
            );
            r.insert("logits".into(), floats(&out.logits));
            r.insert("act_logits".into(), floats(&out.act_logits));
            m.insert(qid.clone(), Value::Object(r));
        }
        total += rows.len();
        let mut line = Map::new();
        line.insert("request".into(), request.clone());
        line.insert("rows".into(), Value::Object(m));
        text.push_str(&json::to_string(&Value::Object(line), Style::COMPACT));
        text.push('\n');
    }
    if total == 0 {
        return Err("none of the probe requests has a question this model can answer".into());
    }
    Ok((text, total))
}
