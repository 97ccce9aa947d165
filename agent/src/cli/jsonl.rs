//! The JSON-lines front end of `laya-edge layout` and `laya-edge predict`: one request per line
//! in, one result per line out. A line that is not a request is answered with an error line and
//! the stream goes on.

use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::{Map, Request, Value};

use crate::bundle::HostBundle;
use crate::config;
use crate::pipeline;

/// Nesting allowed in a request line (the same default as the MQTT front end).
pub const MAX_DEPTH: usize = 64;

/// `{"id"?, "error": {"code", "message"}}` for a line that could not be handled.
pub fn error_line(id: Option<Value>, code: &str, message: &str) -> String {
    let mut err = Map::new();
    err.insert("code".into(), code.into());
    err.insert("message".into(), message.into());
    let mut m = Map::new();
    if let Some(id) = id {
        m.insert("id".into(), id);
    }
    m.insert("error".into(), Value::Object(err));
    json::to_string(&Value::Object(m), Style::COMPACT)
}

/// Decodes one line into a request, or the error line to print instead.
pub fn read_request(line: &str) -> Result<Request, String> {
    let value = json::parse_str(line, ParseOptions { max_depth: MAX_DEPTH })
        .map_err(|e| error_line(None, "bad_request", &format!("not valid JSON: {e}")))?;
    let id = value.get("id").cloned();
    Request::from_value(value).map_err(|e| error_line(id, "bad_request", &e.to_string()))
}

fn ids_value(ids: &[u32]) -> Value {
    Value::Array(ids.iter().map(|&i| Value::int(i64::from(i))).collect())
}

/// `laya-edge layout` for one line: each question's token ids, marker positions and type.
pub fn layout_line(bundle: &HostBundle, line: &str) -> String {
    let request = match read_request(line) {
        Ok(r) => r,
        Err(error_line) => return error_line,
    };
    // The rows `predict` would run: within the bundle's capacity and the default request limit.
    let prepared = match pipeline::prepare(bundle, &request, config::Limits::default().max_request_tokens) {
        Ok(p) => p,
        Err(e) => return error_line(request.id, e.code().as_str(), &e.to_string()),
    };
    let mut questions = Map::new();
    for p in prepared.questions {
        let v = match p.outcome {
            Ok((_, row)) => {
                let mut m = Map::new();
                m.insert("input_ids".into(), ids_value(&row.input_ids));
                m.insert("marker_pos".into(), ids_value(&row.marker_pos));
                m.insert("qtype".into(), Value::int(row.qtype.index() as i64));
                // A parallel-layout checkpoint's rows: laya 0.4.15's `build_sequence` layout.
                if let Some(layout) = &row.layout {
                    m.insert("position_ids".into(), ids_value(&layout.position_ids));
                    m.insert("option_ids".into(), ids_value(&layout.option_ids));
                }
                Value::Object(m)
            }
            Err(e) => laya_topics::AnswerError { code: e.code().to_owned(), message: e.message }.to_value(),
        };
        questions.insert(p.qid, v);
    }
    let mut out = Map::new();
    out.insert("id".into(), request.id.unwrap_or(Value::Null));
    out.insert("questions".into(), Value::Object(questions));
    json::to_string(&Value::Object(out), Style::COMPACT)
}

/// `laya-edge predict` for one line: laya's result `{"id", "model", "answers", "usage"}` and
/// which backend answered it (`backend`, `serving`: `primary` or `fallback`).
pub fn predict_line(
    bundle: &HostBundle,
    backend: &mut crate::cli::CommandBackend,
    max_request_tokens: usize,
    line: &str,
) -> String {
    let request = match read_request(line) {
        Ok(r) => r,
        Err(error_line) => return error_line,
    };
    backend.forget_answer();
    match pipeline::answer_within(bundle, backend.backend(), &request, max_request_tokens) {
        Ok(result) => {
            let mut out = Map::new();
            out.insert("id".into(), request.id.unwrap_or(Value::Null));
            if let Value::Object(m) = result.to_value() {
                out.extend(m);
            }
            let (name, role) = backend.answered_by();
            out.insert("backend".into(), name.into());
            out.insert("serving".into(), role.as_str().into());
            json::to_string(&Value::Object(out), Style::COMPACT)
        }
        Err(e) => error_line(request.id, e.code().as_str(), &e.to_string()),
    }
}

/// Runs `handle` on every non-blank line of `input` and writes its answer line to `output`,
/// flushed per line; a line that is not UTF-8 gets an error line and the stream goes on.
pub fn for_each_line(
    input: impl std::io::BufRead,
    mut output: impl std::io::Write,
    mut handle: impl FnMut(&str) -> String,
) -> std::io::Result<()> {
    for line in input.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                writeln!(output, "{}", error_line(None, "bad_request", "the line is not valid UTF-8"))?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if line.trim().is_empty() {
            continue;
        }
        writeln!(output, "{}", handle(&line))?;
        output.flush()?;
    }
    Ok(())
}
