//! `laya-edge serve` with `[model] laya = "0.4.15"` on a real mosquitto: the status document
//! says which laya it answers as, replies carry laya 0.4.15's answers (its `usage`, the
//! `min_confidence` gate, the checkpoint's `calibration.json`) in laya-edge's envelope (`id`,
//! `device`, `backend`, `timing_ms`), equal to the in-process pipeline's and within the CPU
//! model's tolerance of laya 0.4.15's own for a recorded request, and a request laya
//! 0.4.15 refuses gets an error reply with laya's message. The same agent on laya 0.3.20 refuses
//! `min_confidence` rather than ignoring it.

use std::path::Path;
use std::time::Duration;

use crate::support::*;
use laya_edge::bundle::HostBundle;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::{Encoding, LayaVersion};

fn calibrated() -> String {
    test_kit::model_dir_0415("bpe-t5-calibrated").display().to_string()
}

fn parse(s: &str) -> Value {
    json::parse_str(s, ParseOptions::default()).expect("json")
}

/// The next reply on `c` (the status topic it also watches goes on publishing).
async fn next_reply(c: &mut Client) -> Value {
    loop {
        let p = c.next(Duration::from_secs(60)).await.expect("a reply");
        if String::from_utf8_lossy(&p.topic).starts_with("laya/v1/reply/") {
            return decode(&p);
        }
    }
}

/// What the CPU pipeline in this process answers `req` as laya 0.4.15 on `model`.
fn in_process(model: &str, req: &Value) -> Value {
    let bundle = HostBundle::load_as(Path::new(model), LayaVersion::V0_4_15).expect("bundle");
    let mut cpu = laya_edge::backend::cpu::CpuBackend::load(Path::new(model), &bundle.config).expect("cpu");
    let req = laya_topics::Request::from_value(req.clone()).expect("request");
    laya_edge::pipeline::answer(&bundle, &mut cpu, &req).expect("answer").to_value()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_serving_laya_0_4_15_says_so_and_answers_with_its_usage_gate_and_calibration() {
    let broker = Broker::start("l415", "");
    let model = calibrated();
    let _agent = Agent::start(&broker, "dev415", &format!("[model]\ndir = \"{model}\"\nlaya = \"0.4.15\"\n"));
    let mut c = Client::connect(broker.port, "asker-415").await;
    c.subscribe("laya/v1/dev415/status").await;
    let status = loop {
        let p = c.next(Duration::from_secs(60)).await.expect("a status");
        let v = decode(&p);
        if v.get("state") == Some(&Value::from("online")) {
            break v;
        }
    };
    assert_eq!(status.get("laya"), Some(&Value::from("0.4.15")), "{status:?}");

    c.subscribe("laya/v1/reply/asker-415/#").await;
    let long = "The invoice was charged twice and nobody answers my emails. ".repeat(40);
    let requests = [
        parse(&format!(
            r#"{{"id": "g1", "state": "{long}", "min_confidence": {{"choice:3-5": 0.9, "default": 0.2}}, "questions": {{
                "team": {{"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical", "sales"], "option_order": [2, 0, 1]}},
                "urgency": {{"type": "score", "instructions": "How urgent?", "criteria": ["low", {{"level": "high"}}]}},
                "refund": {{"type": "noul", "instructions": "Is a refund asked for?"}}}}}}"#
        )),
        parse(
            r#"{"id": "g2", "state": "hello", "min_confidence": 0.5, "questions": {"x": {"type": "choice", "instructions": "Pick", "criteria": [2, 2.5, true, "x"]}}}"#,
        ),
    ];
    for req in &requests {
        let id = req.get("id").and_then(Value::as_str).unwrap().to_owned();
        let body = Encoding::Json.encode(req);
        c.ask("laya/v1/dev415/ask", body, Some(&format!("laya/v1/reply/asker-415/{id}")), None, Encoding::Json).await;
        let v = next_reply(&mut c).await;
        assert_eq!(v.get("id"), Some(&Value::from(id.as_str())));
        assert_eq!(v.get("device"), Some(&Value::from("dev415")));
        assert_eq!(v.get("backend"), Some(&Value::from("cpu")));
        assert!(v.get("timing_ms").and_then(|t| t.get("total")).is_some(), "{v:?}");
        let want = in_process(&model, req);
        assert_eq!(text(v.get("answers").expect("answers")), text(want.get("answers").unwrap()), "{id}");
        assert_eq!(text(v.get("usage").expect("usage")), text(want.get("usage").unwrap()), "{id}");
        let answers = v.get("answers").and_then(Value::as_object).unwrap();
        for a in answers.values() {
            assert!(a.get("abstention").is_some() && a.get("abstention_threshold").is_some(), "{id}: {a:?}");
        }
        let usage = v.get("usage").unwrap();
        for k in ["state_tokens", "state_tokens_dropped", "truncated", "truncated_questions"] {
            assert!(usage.get(k).is_some(), "{id}: usage without {k}: {usage:?}");
        }
    }

    // A recorded request on the calibrated checkpoint, gated: laya 0.4.15's own answers (the
    // calibration's temperatures and binned confidences, the gate's verdicts), within the CPU
    // model's tolerance of laya's (tests/conformance/it/cpu_model.rs).
    let fixtures = std::fs::read_to_string(test_kit::fixtures_0415_dir().join("cases.jsonl")).expect("cases");
    let case = fixtures
        .lines()
        .map(parse)
        .find(|c| c.get("id") == Some(&Value::from("bpe-t5-calibrated/v4-0011")))
        .expect("the recorded gated request");
    let req = case.get("request").expect("request");
    assert!(req.get("min_confidence").is_some_and(|m| *m != Value::Null));
    c.ask("laya/v1/dev415/ask", Encoding::Json.encode(req), Some("laya/v1/reply/asker-415/rec"), None, Encoding::Json)
        .await;
    let v = next_reply(&mut c).await;
    let laya = case.get("result").and_then(|r| r.get("answers")).and_then(Value::as_object).expect("laya's answers");
    let ours = v.get("answers").and_then(Value::as_object).unwrap_or_else(|| panic!("{v:?}"));
    assert_eq!(ours.keys().collect::<Vec<_>>(), laya.keys().collect::<Vec<_>>());
    for (qid, a) in ours {
        test_kit::assert_like_laya("v4-0011", qid, a, &laya[qid], 1e-3);
    }
    assert_eq!(v.get("usage"), case.get("result").and_then(|r| r.get("usage")));

    // Refused as laya 0.4.15 refuses them, with its message.
    for (id, body, message) in [
        (
            "bad-gate",
            r#"{"id": "bad-gate", "state": "s", "min_confidence": 1.5, "questions": {}}"#,
            "min_confidence must be a float in [0.0, 1.0], got 1.5",
        ),
        (
            "null-state",
            r#"{"id": "null-state", "state": null, "questions": {"q": {"type": "noul", "instructions": "i"}}}"#,
            "state must not be None; pass a string, dict, or list",
        ),
    ] {
        c.ask(
            "laya/v1/dev415/ask",
            body.as_bytes().to_vec(),
            Some(&format!("laya/v1/reply/asker-415/{id}")),
            None,
            Encoding::Json,
        )
        .await;
        let v = next_reply(&mut c).await;
        assert_eq!(v.get("id"), Some(&Value::from(id)));
        let error = v.get("error").unwrap_or_else(|| panic!("{id}: {v:?}"));
        assert_eq!(error.get("code"), Some(&Value::from("bad_request")), "{id}");
        assert_eq!(error.get("message"), Some(&Value::from(message)), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_serving_laya_0_3_20_refuses_min_confidence_instead_of_ignoring_it() {
    let broker = Broker::start("l320", "");
    let _agent = Agent::start(&broker, "dev320", "");
    wait_online(broker.port, "dev320").await;
    let mut c = Client::connect(broker.port, "asker-320").await;
    c.subscribe("laya/v1/reply/asker-320/#").await;
    let body = r#"{"id": "g", "state": "s", "min_confidence": 0.5, "questions": {"q": {"type": "noul", "instructions": "i"}}}"#;
    c.ask("laya/v1/dev320/ask", body.as_bytes().to_vec(), Some("laya/v1/reply/asker-320/g"), None, Encoding::Json)
        .await;
    let v = decode(&c.next(Duration::from_secs(60)).await.expect("a reply"));
    let error = v.get("error").unwrap_or_else(|| panic!("{v:?}"));
    assert_eq!(error.get("code"), Some(&Value::from("bad_request")));
    let message = error.get("message").and_then(Value::as_str).unwrap();
    assert!(message.contains("laya = \"0.4.15\""), "{message}");
}

#[test]
fn bundle_refuses_npu_graphs_for_a_parallel_checkpoint_before_copying_anything() {
    let ckpt = test_kit::model_dir_0415("bpe-t5-parallel");
    let out = temp_dir("bundle-parallel").join("b");
    for flag in ["--rknn", "--qnn"] {
        let args = ["bundle", "--checkpoint", ckpt.to_str().unwrap(), "--out", out.to_str().unwrap(), flag, "g.bin"];
        let (_, err, ok) = run_cli(&args.map(std::ffi::OsStr::new), &[], "");
        assert!(!ok && err.contains("option_layout 'parallel'") && err.contains("no position ids"), "{flag}: {err}");
        assert!(!out.exists(), "{flag}: {} was written", out.display());
    }
}
