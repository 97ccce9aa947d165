//! The `laya-edge` binary end to end.

use std::ffi::OsStr;
use std::path::PathBuf;

use crate::support;
use laya_topics::Value;
use laya_topics::json::{ParseOptions, parse_str};
use test_kit::fixtures_dir;

fn run(args: &[&str], stdin: &str) -> (String, String, bool) {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    support::run_cli(&args, &[], stdin)
}

#[test]
fn layout_prints_lavas_rows_and_goes_on_after_a_bad_line() {
    let cases = std::fs::read_to_string(fixtures_dir().join("cases.jsonl")).expect("cases");
    let first = parse_str(cases.lines().next().expect("a case"), ParseOptions::default()).expect("json");
    let request =
        laya_topics::json::to_string(first.get("request").expect("request"), laya_topics::json::Style::COMPACT);
    let input = format!(
        "{request}\nnot json\n\n{{\"state\": 1, \"questions\": {{\"q\": {{\"type\": \"bogus\"}}}}}}\n{request}\n"
    );
    let model = fixtures_dir().join("models/bpe-t5");
    let (stdout, stderr, ok) = run(&["layout", "--model", model.to_str().expect("utf-8 path")], &input);
    assert!(ok, "stderr: {stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| parse_str(l, ParseOptions::default()).expect("json line")).collect();
    assert_eq!(lines.len(), 4, "one line per non-blank input line: {stdout}");
    let want = first.get("layout").expect("layout");
    for qid in ["refund", "dept", "urgency"] {
        let got = lines[0].get("questions").and_then(|q| q.get(qid)).expect("question row");
        assert_eq!(got.get("input_ids"), want.get(qid).and_then(|w| w.get("input_ids")));
        assert_eq!(got.get("marker_pos"), want.get(qid).and_then(|w| w.get("marker_pos")));
    }
    assert_eq!(lines[1].get("error").and_then(|e| e.get("code")), Some(&Value::from("bad_request")));
    let bogus =
        lines[2].get("questions").and_then(|q| q.get("q")).and_then(|q| q.get("error")).expect("error in place");
    assert_eq!(
        bogus.get("message"),
        Some(&Value::from("question 'q': unknown type 'bogus'; use one of ['choice', 'noul', 'score']"))
    );
    assert_eq!(lines[3], lines[0]);
}

#[test]
fn a_missing_model_directory_is_a_clear_error() {
    let (_, stderr, ok) = run(&["layout", "--model", "/nonexistent/model"], "");
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/model"), "{stderr}");
}

#[test]
fn predict_answers_each_line_and_reports_bad_lines() {
    let cases = std::fs::read_to_string(fixtures_dir().join("cases.jsonl")).expect("cases");
    let first = parse_str(cases.lines().next().expect("a case"), ParseOptions::default()).expect("json");
    let request =
        laya_topics::json::to_string(first.get("request").expect("request"), laya_topics::json::Style::COMPACT);
    let input = format!(
        "{request}\n[1, 2]\n{{\"id\": 7, \"state\": \"x\", \"questions\": {{\"ok\": {{\"type\": \"noul\", \"instructions\": \"fine?\"}}, \"bad\": {{\"type\": \"score\", \"instructions\": \"?\", \"criteria\": []}}}}}}\n"
    );
    let model = fixtures_dir().join("models/bpe-t5");
    let (stdout, stderr, ok) =
        run(&["predict", "--model", model.to_str().expect("utf-8 path"), "--threads", "1"], &input);
    assert!(ok, "stderr: {stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| parse_str(l, ParseOptions::default()).expect("json line")).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let want = first.get("result").expect("laya's result");
    assert_eq!(lines[0].get("id"), first.get("request").and_then(|r| r.get("id")));
    assert_eq!(lines[0].get("model"), want.get("model"));
    assert_eq!(lines[0].get("usage"), want.get("usage"));
    let choice = |v: &Value| v.get("answers").and_then(|a| a.get("dept")).and_then(|d| d.get("choice")).cloned();
    assert_eq!(choice(&lines[0]), choice(want));
    assert_eq!(lines[1].get("error").and_then(|e| e.get("code")), Some(&Value::from("bad_request")));
    let answers = lines[2].get("answers").expect("answers");
    assert_eq!(answers.get("ok").and_then(|a| a.get("type")), Some(&Value::from("noul")));
    assert_eq!(
        answers.get("bad").and_then(|a| a.get("error")).and_then(|e| e.get("message")),
        Some(&Value::from("question 'bad': a score question needs at least one level"))
    );
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = support::temp_dir(&format!("cli-{name}"));
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// One request line of the fixtures, for commands that only need something to answer.
fn one_request() -> String {
    let cases = std::fs::read_to_string(fixtures_dir().join("cases.jsonl")).expect("cases");
    let first = parse_str(cases.lines().next().expect("a case"), ParseOptions::default()).expect("json");
    laya_topics::json::to_string(first.get("request").expect("request"), laya_topics::json::Style::COMPACT) + "\n"
}

#[test]
fn check_config_prints_the_effective_configuration_as_toml_that_reads_back_the_same() {
    let file = temp_file(
        "laya-edge.toml",
        "[mqtt]\ndevice = \"board-7\"\nresponse_topics = [\"{prefix}/reply/apps/+\"]\n[engine]\nbackend = \"null\"\n\
         [rknn]\ncore_mask = 3\n[qnn]\nsoc = \"qcm6490\"\n",
    );
    let (stdout, stderr, ok) = run(&["check-config", "--config", file.to_str().expect("utf-8")], "");
    assert!(ok, "{stderr}");
    assert!(!stdout.contains("Config {"), "TOML, not a debug dump: {stdout}");
    let printed = laya_edge::config::Config::parse(&stdout, std::path::Path::new("check-config output"))
        .unwrap_or_else(|e| panic!("the output is a valid configuration file: {e}\n{stdout}"));
    let loaded = laya_edge::config::Config::load(&file).expect("the file");
    assert_eq!(printed, loaded);
    assert_eq!(printed.mqtt.device, "board-7");
    assert_eq!(printed.rknn.core_mask, 3);
    // Every section is printed with its defaults filled in; qnn.performance is "default", not "".
    for section in ["[mqtt]", "[limits]", "[model]", "[engine]", "[rknn]", "[qnn]", "[log]"] {
        assert!(stdout.contains(section), "{section} missing: {stdout}");
    }
    let qnn = stdout.split("[qnn]").nth(1).expect("[qnn]");
    assert!(qnn.contains("performance = \"default\""), "{qnn}");
    assert!(stdout.contains("client id \"laya-edge-board-7\""), "{stdout}");
}

#[test]
fn check_config_refuses_what_serve_refuses_before_connecting_and_names_it() {
    let dir = support::temp_dir("cli-preflight");
    // A CA certificate that parses, so that the client key is what is missing.
    let ca = dir.join("ca.pem");
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=laya-test-ca"])
        .arg("-keyout")
        .arg(dir.join("ca.key"))
        .arg("-out")
        .arg(&ca)
        .output()
        .expect("openssl runs");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let model = fixtures_dir().join("models/bpe-small");
    let cases = [
        ("device = \"board/+7\"\n".to_owned(), "board/+7"),
        ("broker = \"mqtts://127.0.0.1:1\"\nca_file = \"/nonexistent/ca.pem\"\n".to_owned(), "/nonexistent/ca.pem"),
        (
            "username = \"board-7\"\npassword_file = \"/nonexistent/board-7.password\"\n".to_owned(),
            "/nonexistent/board-7.password",
        ),
        (
            format!(
                "broker = \"mqtts://127.0.0.1:1\"\nca_file = \"{ca}\"\nclient_cert = \"{ca}\"\nclient_key = \"/nonexistent/client.key\"\n",
                ca = ca.display()
            ),
            "/nonexistent/client.key",
        ),
    ];
    for (i, (mqtt, named)) in cases.iter().enumerate() {
        let file = dir.join(format!("case{i}.toml"));
        let text = format!("[mqtt]\n{mqtt}[engine]\nbackend = \"null\"\n[model]\ndir = \"{}\"\n", model.display());
        std::fs::write(&file, text).expect("config");
        let path = file.to_str().expect("utf-8");
        let (stdout, stderr, ok) = run(&["check-config", "--config", path], "");
        assert!(!ok, "check-config accepted {mqtt:?}: {stdout}");
        assert!(stderr.contains(named), "check-config on {mqtt:?} does not name {named:?}: {stderr}");
        // serve refuses it the same way, before it reaches any broker (bounded: a serve that took
        // it would try the broker for ever).
        let out = std::process::Command::new("timeout")
            .arg("60")
            .arg(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
            .args(["serve", "--config", path])
            .output()
            .expect("serve runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.status.code() != Some(124), "serve took {mqtt:?}: {err}");
        assert!(err.contains(named), "serve on {mqtt:?}: {err}");
    }
}

/// A configuration file of the defaults (the null backend, the fixture model) with `keys`
/// (`section.key`, its TOML value) set.
fn config_with(dir: &std::path::Path, name: &str, keys: &[(&str, String)]) -> String {
    let mut sections: std::collections::BTreeMap<&str, Vec<String>> = std::collections::BTreeMap::new();
    sections.entry("engine").or_default().push("backend = \"null\"".into());
    let model = fixtures_dir().join("models/bpe-small");
    sections.entry("model").or_default().push(format!("dir = \"{}\"", model.display()));
    for (key, value) in keys {
        let (section, name) = key.split_once('.').expect("section.key");
        sections.entry(section).or_default().push(format!("{name} = {value}"));
    }
    let text: String = sections.iter().map(|(s, lines)| format!("[{s}]\n{}\n", lines.join("\n"))).collect();
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).expect("config");
    file.to_str().expect("utf-8").to_owned()
}

/// `laya-edge COMMAND --config FILE`, bounded (a `serve` that took the file would try its broker
/// for ever): its exit status and stderr.
fn refusal(command: &str, file: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args([command, "--config", file])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("laya-edge runs");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn every_numeric_key_is_taken_at_its_bounds_and_refused_one_past_them_by_check_config_and_serve_alike() {
    let dir = support::temp_dir("cli-ranges");
    for (range, _) in laya_edge::config::NUMERIC {
        let key = range.key;
        for v in [range.min, range.max] {
            let file = config_with(&dir, &format!("{key}-{v}"), &[(key, v.to_string())]);
            let (code, stderr) = refusal("check-config", &file);
            assert_eq!(code, Some(0), "check-config refused {key} = {v}: {stderr}");
        }
        // One past each end. Two keys' types end where their ranges do (a u32, a u16): the file
        // cannot even say one more, TOML refuses it as the file is read (config.rs's unit tests).
        let typed_to_the_end = ["mqtt.session_expiry_s", "mqtt.receive_maximum"];
        let past = [range.min.checked_sub(1), (!typed_to_the_end.contains(&key)).then(|| range.max + 1)];
        for v in past.into_iter().flatten() {
            let file = config_with(&dir, &format!("{key}-{v}"), &[(key, v.to_string())]);
            let named = format!("{key} = {v} is outside its range, {range}");
            for command in ["check-config", "serve"] {
                let (code, stderr) = refusal(command, &file);
                assert_eq!(code, Some(1), "{command} on {key} = {v}: {stderr}");
                assert!(stderr.contains(&named), "{command} on {key} = {v} does not say {named:?}: {stderr}");
            }
        }
    }
}

#[test]
fn the_settings_that_panicked_serve_or_reconnected_it_for_ever_are_refused_by_check_config_and_serve_with_status_1() {
    let dir = support::temp_dir("cli-hostile");
    let cases = [
        (
            "limits.queue",
            (1u64 << 62).to_string(),
            "limits.queue = 4611686018427387904 is outside its range, 1 to 65535",
        ),
        (
            "mqtt.keep_alive_s",
            i64::MAX.to_string(),
            "mqtt.keep_alive_s = 9223372036854775807 is outside its range, 5 to 65535",
        ),
        (
            "engine.startup_timeout_s",
            i64::MAX.to_string(),
            "engine.startup_timeout_s = 9223372036854775807 is outside its range, 1 to 86400",
        ),
        (
            "mqtt.client_id",
            format!("\"{}\"", "c".repeat(70 * 1024)),
            "mqtt.client_id is 71680 bytes; MQTT carries at most 65535",
        ),
    ];
    for (key, value, named) in cases {
        let file = config_with(&dir, key, &[(key, value)]);
        for command in ["check-config", "serve"] {
            let (code, stderr) = refusal(command, &file);
            assert_eq!(code, Some(1), "{command} on {key}: {}", &stderr[..stderr.len().min(500)]);
            assert!(stderr.contains(named), "{command} on {key}: {}", &stderr[..stderr.len().min(500)]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_comes_online_with_every_numeric_key_at_its_lower_and_at_its_upper_bound() {
    let broker = support::Broker::start("cli-bounds", "");
    let dir = support::temp_dir("cli-bounds");
    for (end, device) in [("min", "dev-min"), ("max", "dev-max")] {
        let mut keys: Vec<(&str, String)> = laya_edge::config::NUMERIC
            .iter()
            .map(|(r, _)| (r.key, if end == "min" { r.min } else { r.max }.to_string()))
            .collect();
        keys.push(("mqtt.broker", format!("\"{}\"", broker.url())));
        keys.push(("mqtt.device", format!("\"{device}\"")));
        let file = config_with(&dir, end, &keys);
        let (code, stderr) = refusal("check-config", &file);
        assert_eq!(code, Some(0), "check-config, every key at its {end}: {stderr}");
        let mut agent = support::Agent::with_config(PathBuf::from(&file), Vec::new());
        support::wait_online(broker.port, device).await;
        let status = agent.terminate();
        assert!(status.success(), "serve, every key at its {end}, stopped with {status:?}");
    }
}

#[test]
fn predict_takes_its_model_and_engine_keys_from_config_and_flags_override_them() {
    let model = fixtures_dir().join("models/bpe-t5");
    // The [engine] keys reach the worker: every call fails with the injected input error.
    let file = temp_file(
        "predict.toml",
        &format!(
            "[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\nnull_faults = \"error=input\"\n",
            model.display()
        ),
    );
    let file = file.to_str().expect("utf-8");
    let input = one_request();
    let (stdout, stderr, ok) = run(&["predict", "--config", file], &input);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("injected input error"), "the null backend's fault from the file: {stdout}");
    // --backend overrides engine.backend: the CPU model answers.
    let (stdout, stderr, ok) = run(&["predict", "--config", file, "--backend", "cpu"], &input);
    assert!(ok, "{stderr}");
    let line = parse_str(stdout.trim(), ParseOptions::default()).expect("json");
    assert!(line.get("answers").is_some(), "{stdout}");
    // --model overrides model.dir.
    let (_, stderr, ok) = run(&["predict", "--config", file, "--model", "/nonexistent/model"], &input);
    assert!(!ok && stderr.contains("/nonexistent/model"), "{stderr}");
}

/// `predict --backend null` on one request with `args` and `env`: its stderr.
fn predict_stderr(args: &[&str], env: &[(&str, &std::path::Path)]) -> String {
    let model = fixtures_dir().join("models/bpe-t5");
    let mut all = vec!["predict", "--backend", "null", "--model", model.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    let all: Vec<&OsStr> = all.iter().map(OsStr::new).collect();
    let (stdout, stderr, ok) = support::run_cli(&all, env, &one_request());
    assert!(ok && stdout.contains("answers"), "{stdout}\n{stderr}");
    stderr
}

const PREDICT_DEBUG: &str = "predict: answering the lines on stdin";
const WORKER_DEBUG: &str = "worker: loading the backend";

#[test]
fn debug_lines_of_the_agent_and_its_worker_show_only_when_the_filter_asks_for_them() {
    let quiet = predict_stderr(&[], &[]);
    assert!(!quiet.contains(PREDICT_DEBUG) && !quiet.contains(WORKER_DEBUG), "{quiet}");
    // The flag; the worker (another process) filters the same way.
    let debug = predict_stderr(&["--log", "debug"], &[]);
    assert!(debug.contains(PREDICT_DEBUG) && debug.contains(WORKER_DEBUG), "{debug}");
    // [log] level in the configuration file.
    let file = temp_file("log.toml", "[log]\nlevel = \"debug\"\n");
    let from_file = predict_stderr(&["--config", file.to_str().expect("utf-8")], &[]);
    assert!(from_file.contains(PREDICT_DEBUG) && from_file.contains(WORKER_DEBUG), "{from_file}");
    // LAYA_LOG, and the flag over it.
    let env = [("LAYA_LOG", std::path::Path::new("debug"))];
    assert!(predict_stderr(&[], &env).contains(WORKER_DEBUG));
    let flag_wins = predict_stderr(&["--log", "info"], &env);
    assert!(!flag_wins.contains(WORKER_DEBUG), "{flag_wins}");
    // A filter that is not one is refused with its name.
    let model = fixtures_dir().join("models/bpe-t5");
    let (_, stderr, ok) = run(&["predict", "--model", model.to_str().expect("utf-8"), "--log", "laya_edge=loud"], "");
    assert!(!ok && stderr.contains("log.level"), "{stderr}");
}

#[test]
fn under_the_journal_each_line_starts_with_its_syslog_priority() {
    let env = [("JOURNAL_STREAM", std::path::Path::new("8:12345"))];
    let stderr = predict_stderr(&["--log", "debug"], &env);
    let debug: Vec<&str> = stderr.lines().filter(|l| l.contains(PREDICT_DEBUG) || l.contains(WORKER_DEBUG)).collect();
    assert_eq!(debug.len(), 2, "{stderr}");
    assert!(debug.iter().all(|l| l.starts_with("<7>") && !l.contains("DEBUG")), "{stderr}");
    // No terminal colours in the journal, span fields included (the worker's lifetime span).
    // (A worker's escape codes would come through the agent's log escaped: `\x1b` as text.)
    assert!(debug.iter().all(|l| !l.contains('\x1b') && !l.contains("\\x1b")), "{stderr:?}");
    // An error line of a failing command: <3>.
    let (_, stderr, ok) =
        support::run_cli(&[OsStr::new("layout"), OsStr::new("--model"), OsStr::new("/nonexistent/model")], &env, "");
    assert!(!ok);
    let line = stderr.lines().find(|l| l.contains("/nonexistent/model")).expect("the error line");
    assert!(line.starts_with("<3>"), "{stderr}");
}

#[test]
fn predict_names_the_root_cause_on_every_line_while_the_backend_is_degraded() {
    let model = fixtures_dir().join("models/bpe-t5");
    let file = temp_file(
        "degraded.toml",
        &format!("[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\nnull_faults = \"load-fail\"\n", model.display()),
    );
    let input = one_request().repeat(3);
    let (stdout, stderr, ok) = run(&["predict", "--config", file.to_str().expect("utf-8")], &input);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for line in lines {
        assert!(line.contains("injected load failure"), "a line without the root cause: {line}");
        // Retryable, as `serve` says it: the backend is degraded, not the request wrong.
        assert!(line.contains(r#""code":"backend_unavailable""#), "not backend_unavailable: {line}");
    }
}

/// `predict --cpu-weights int8` on `model`: (stdout, stderr, success).
fn predict_int8(model: &std::path::Path) -> (String, String, bool) {
    run(
        &["predict", "--backend", "cpu", "--cpu-weights", "int8", "--model", model.to_str().expect("utf-8")],
        &one_request(),
    )
}

#[test]
fn a_quantised_cpu_mode_that_fails_its_probe_is_refused_at_start_and_one_that_passes_answers_under_its_own_name() {
    // The demo model in int8 (Wqkv in f32, the rest int8) agrees with f32 on every built-in
    // probe row: it answers, as cpu-int8.
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
    let (stdout, stderr, ok) = predict_int8(&demo);
    assert!(ok, "{stderr}");
    let line = parse_str(stdout.trim(), ParseOptions::default()).expect("json");
    assert!(line.get("answers").is_some(), "{stdout}");
    assert_eq!(line.get("backend"), Some(&Value::from("cpu-int8")), "{stdout}");
    // wp-t4 in int8 flips two of its 60 probe rows (0.967 < 0.99): refused before any line is
    // answered, naming the mode and the figures.
    let (stdout, stderr, ok) = predict_int8(&fixtures_dir().join("models/wp-t4"));
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("the cpu-int8 mode is refused") && stderr.contains("argmax agreement 0.967 < 0.99"),
        "{stderr}"
    );
    // f32, the reference, is never gated.
    let (stdout, stderr, ok) =
        run(&["predict", "--backend", "cpu", "--model", demo.to_str().expect("utf-8")], &one_request());
    assert!(
        ok && stdout.contains("\"backend\": \"cpu\"") || stdout.contains("\"backend\":\"cpu\""),
        "{stdout} {stderr}"
    );
}
