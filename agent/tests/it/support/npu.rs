//! What the NPU backends' tests (`rknn_cli`, `qnn_cli`) share: fixture requests that fit a
//! bundle's graphs, `predict --config`, asking a serving agent until its backend answers, and how
//! close an NPU backend's answers must be to the CPU backend's. Compiled with either NPU feature.

use std::ffi::OsStr;
use std::time::Duration;

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::wire::Encoding;

use super::{Client, decode, request, run_cli, temp_dir};

/// Asks `device` one question as client `asker` until it is answered rather than refused (a
/// backend that is still restarting refuses with `backend_unavailable`), for up to `within`;
/// returns the answered reply.
pub async fn ask_until_answered(port: u16, device: &str, asker: &str, within: Duration) -> Value {
    let mut c = Client::connect(port, asker).await;
    c.subscribe(&format!("laya/v1/reply/{asker}/#")).await;
    let deadline = std::time::Instant::now() + within;
    loop {
        let reply_to = format!("laya/v1/reply/{asker}/q");
        c.ask(
            &format!("laya/v1/{device}/ask"),
            Encoding::Json.encode(&request("q")),
            Some(&reply_to),
            None,
            Encoding::Json,
        )
        .await;
        let reply = decode(&c.next(within).await.expect("a reply"));
        if reply.get("answers").is_some() {
            return reply;
        }
        assert!(std::time::Instant::now() < deadline, "{device} never answered: {reply:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs `laya-edge predict --config FILE` with `config` (TOML) in FILE on `input` (JSON lines)
/// and returns its output lines.
pub fn run_predict_with_config(config: &str, input: &str) -> Vec<Value> {
    let file = temp_dir("predict-config").join("laya-edge.toml");
    std::fs::write(&file, config).expect("config");
    let (out, err, ok) = run_cli(&[OsStr::new("predict"), OsStr::new("--config"), file.as_os_str()], &[], input);
    assert!(ok, "predict --config with {config:?} failed: {err}");
    out.lines().map(|l| json::parse_str(l, ParseOptions::default()).expect("json")).collect()
}

/// How close an NPU backend's answers must be to the CPU backend's.
pub struct Closeness<'a> {
    /// Largest difference of any probability.
    pub tol: f64,
    /// A `choice` must be the CPU's where the CPU's top two probabilities are more than this
    /// apart (0: always).
    pub clear_gap: f64,
    /// Keys not compared (parts of the answer the backend does not compute).
    pub skip: &'a [&'a str],
}

/// Walks two answers (`answers` objects or whole replies): the same structure and strings, every
/// float within `c.tol`, and the same `choice` wherever the CPU's decision is clear. Returns the
/// largest float difference it met, for the tests to print what they measured.
pub fn assert_answers_close(ours: &Value, cpu: &Value, c: &Closeness, at: &str) -> f64 {
    match (ours, cpu) {
        (Value::Object(x), Value::Object(y)) => {
            let mut worst = 0.0f64;
            for (k, v) in x {
                if c.skip.contains(&k.as_str()) || k == "timing_ms" || k == "backend" {
                    continue;
                }
                let w = y.get(k).unwrap_or_else(|| panic!("{at}: the CPU answer has no {k}"));
                if k == "choice"
                    && c.clear_gap > 0.0
                    && test_kit::decision_margin(cpu).is_some_and(|m| m <= c.clear_gap)
                {
                    continue;
                }
                worst = worst.max(assert_answers_close(v, w, c, &format!("{at}.{k}")));
            }
            worst
        }
        (Value::Float(x), Value::Float(y)) => {
            assert!((x - y).abs() <= c.tol, "{at}: {x} vs cpu {y}");
            (x - y).abs()
        }
        (x, y) => {
            assert_eq!(x, y, "{at}");
            0.0
        }
    }
}

/// The first `n` recorded requests of fixture model `model` (as JSON lines) none of whose token
/// rows is longer than `max_tokens` (requests laya refused have no rows and are kept).
pub fn fixture_requests(model: &str, n: usize, max_tokens: usize) -> String {
    let text = std::fs::read_to_string(test_kit::fixtures_dir().join("cases.jsonl")).expect("cases");
    let fits = |c: &Value| {
        c.get("layout").and_then(Value::as_object).is_none_or(|layout| {
            layout
                .values()
                .all(|q| q.get("input_ids").and_then(Value::as_array).is_none_or(|ids| ids.len() <= max_tokens))
        })
    };
    text.lines()
        .filter_map(|l| json::parse_str(l, ParseOptions { max_depth: 10_000 }).ok())
        .filter(|c| c.get("model") == Some(&Value::from(model)) && fits(c))
        .take(n)
        .map(|c| json::to_string(c.get("request").expect("request"), Style::COMPACT) + "\n")
        .collect()
}
