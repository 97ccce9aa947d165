//! What an operator sees without logging in (issue #15), against a real mosquitto: telemetry
//! with latency percentiles consistent with known latencies (the `null` backend's `sleep=`),
//! the status's identity, CBOR telemetry, events with reasons on a hang and a fatal error, and
//! `laya-edge fleet --once --json` over three agents, one killed (its Last Will).

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use crate::support::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;

/// The next document on `c` whose topic ends with `suffix` and that `want` accepts.
async fn next_where(c: &mut Client, suffix: &str, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let p = c.next(left).await.unwrap_or_else(|| panic!("no {suffix} with {what}"));
        if !String::from_utf8_lossy(&p.topic).ends_with(suffix) {
            continue;
        }
        let v = decode(&p);
        if want(&v) {
            return v;
        }
    }
}

fn f64_at(v: &Value, path: &[&str]) -> f64 {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_f64).unwrap_or_else(|| panic!("{path:?} in {v:?}"))
}

fn i64_at(v: &Value, path: &[&str]) -> i64 {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_i64).unwrap_or_else(|| panic!("{path:?} in {v:?}"))
}

/// A directory of thermal zones of known temperature, for `LAYA_THERMAL_DIR`: the hottest
/// readable zone is 41.3 °C (a disabled sensor's nonsense and an unreadable zone beside it).
fn thermal_zones(name: &str) -> std::path::PathBuf {
    let dir = temp_dir(&format!("thermal-{name}"));
    for (zone, text) in [("thermal_zone0", "38000\n"), ("thermal_zone1", "41300\n"), ("thermal_zone2", "oops\n")] {
        std::fs::create_dir_all(dir.join(zone)).expect("zone");
        std::fs::write(dir.join(zone).join("temp"), text).expect("temp");
    }
    std::fs::create_dir_all(dir.join("thermal_zone3")).expect("zone");
    std::fs::write(dir.join("thermal_zone3").join("temp"), "999999999\n").expect("temp");
    dir
}

/// The temperature [`thermal_zones`] holds.
const HOTTEST_ZONE_C: f64 = 41.3;

/// An agent of `device` on the null backend (`engine` lines added to its `[engine]`), reading the
/// thermal zones of [`thermal_zones`], with `mqtt` lines after `[mqtt]`'s.
fn agent_with_zones(broker: &Broker, device: &str, mqtt: &str, engine: &str) -> Agent {
    let config = agent_config(&broker.url(), device, &format!("{mqtt}[engine]\nbackend = \"null\"\n{engine}"));
    let zones = thermal_zones(device).display().to_string();
    Agent::with_config(config, vec![("LAYA_THERMAL_DIR".to_owned(), zones)])
}

/// The smallest and largest of the replies' `timing_ms` of `stage`.
fn reply_range(replies: &[Value], stage: &str) -> (f64, f64) {
    let values: Vec<f64> = replies.iter().map(|r| f64_at(r, &["timing_ms", stage])).collect();
    (values.iter().copied().fold(f64::INFINITY, f64::min), values.iter().copied().fold(0.0, f64::max))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_counts_each_answer_once_with_percentiles_and_busy_time_that_agree_with_the_replies() {
    let broker = Broker::start("tm-load", "");
    // Every call takes 150 ms in the backend; 1 s telemetry intervals.
    let mut agent = agent_with_zones(&broker, "dev-load", "", "null_faults = \"sleep=150\"\n");
    let mut watch = Client::connect(broker.port, "load-watch").await;
    watch.subscribe("laya/v1/dev-load/telemetry").await;
    watch.subscribe("laya/v1/dev-load/status").await;
    let status = next_where(&mut watch, "/status", "online", |v| v.get("state") == Some(&Value::from("online"))).await;
    // The status's identity: the birth is this run's start in ms, the model is named.
    let birth = i64_at(&status, &["birth"]);
    let started_ms = i64_at(&status, &["started_at"]) * 1000;
    assert!((started_ms..started_ms + 1000).contains(&birth), "birth {birth} within the start second {started_ms}");
    assert_eq!(status.get("model_name"), Some(&Value::from("bpe-small")));
    assert_eq!(status.get("bundle_sha256"), Some(&Value::Null), "a plain checkpoint has no manifest");
    assert_eq!(status.get("runtime"), Some(&Value::from("")), "the null backend has no runtime");
    // An idle interval that began after the backend was ready (the one before may hold the end of
    // the health call): no answers, no percentiles, no busy time.
    let ready = next_where(&mut watch, "/telemetry", "a ready backend", |v| {
        v.get("backend_state") == Some(&Value::from("ready")) && i64_at(v, &["questions"]) == 0
    })
    .await;
    let idle = next_where(&mut watch, "/telemetry", "an idle interval", |_| true).await;
    assert_eq!(i64_at(&idle, &["questions"]), 0, "{idle:?}");
    assert_eq!(idle.get("latency_ms").and_then(|l| l.get("total")), Some(&Value::Null), "{idle:?}");
    assert_eq!(f64_at(&idle, &["busy"]), 0.0, "{idle:?}");
    // uptime_s counts the intervals: from one document to a later one it grows by their
    // interval_s (in whole seconds, so within one), summed below from `ready` on.
    let mut intervals_s = f64_at(&idle, &["interval_s"]);
    // Ten questions one after the other, then one the agent refuses.
    let mut c = Client::connect(broker.port, "load-asker").await;
    c.subscribe("laya/v1/reply/load-asker/#").await;
    let mut replies = Vec::new();
    for i in 0..10 {
        let id = format!("q{i}");
        let to = format!("laya/v1/reply/load-asker/{id}");
        c.ask("laya/v1/dev-load/ask", Encoding::Json.encode(&request(&id)), Some(&to), None, Encoding::Json).await;
        let reply = decode(&c.next(Duration::from_secs(30)).await.expect("a reply"));
        assert_eq!(reply.get("id"), Some(&Value::from(id.as_str())));
        replies.push(reply);
    }
    let bad = json::parse_str(r#"{"id": "bad", "questions": {}}"#, ParseOptions::default()).expect("json");
    c.ask(
        "laya/v1/dev-load/ask",
        Encoding::Json.encode(&bad),
        Some("laya/v1/reply/load-asker/bad"),
        None,
        Encoding::Json,
    )
    .await;
    let refusal = decode(&c.next(Duration::from_secs(30)).await.expect("a reply"));
    let code = refusal.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).expect("an error").to_owned();
    // Every telemetry document after the idle one until all ten answers are counted: each answer
    // in exactly one interval; each interval's percentiles read off the replies it holds, so
    // within the smallest and largest of all the replies' timings, and the largest p99 of a stage
    // is the largest reply's (a p99 of at most ten values is the interval's largest).
    let (mut answered, mut busy_s, mut p99_max) = (0, 0.0, [0.0f64; 5]);
    // Bounded so that answers that are never counted fail the test instead of hanging it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered < 10 {
        assert!(Instant::now() < deadline, "only {answered} of the 10 answers counted in telemetry");
        let t = next_where(&mut watch, "/telemetry", "the answers", |_| true).await;
        let interval = f64_at(&t, &["interval_s"]);
        intervals_s += interval;
        let grew = i64_at(&t, &["uptime_s"]) - i64_at(&ready, &["uptime_s"]);
        assert!((grew as f64 - intervals_s).abs() <= 1.0, "uptime_s grew {grew} over intervals of {intervals_s} s");
        let n = i64_at(&t, &["questions"]);
        answered += n;
        let qps = f64_at(&t, &["questions_per_s"]);
        assert!((qps - n as f64 / interval).abs() < 0.01, "{qps} for {n} in {interval} s");
        let busy = f64_at(&t, &["busy"]);
        assert!((0.0..=1.0).contains(&busy), "{t:?}");
        busy_s += busy * interval;
        assert_eq!(i64_at(&t, &["queue_depth"]), 0, "questions asked one at a time: {t:?}");
        assert!(i64_at(&t, &["rss_kb", "agent"]) > 1000, "{t:?}");
        assert!(i64_at(&t, &["rss_kb", "worker"]) > 1000, "{t:?}");
        assert_eq!(f64_at(&t, &["temperature_c"]), HOTTEST_ZONE_C, "the hottest readable zone: {t:?}");
        for (s, stage) in ["queue", "tokenize", "infer", "decode", "total"].into_iter().enumerate() {
            let (lo, hi) = reply_range(&replies, stage);
            if n == 0 {
                assert_eq!(t.get("latency_ms").and_then(|l| l.get(stage)), Some(&Value::Null), "{t:?}");
                continue;
            }
            let (p50, p95, p99) = (
                f64_at(&t, &["latency_ms", stage, "p50"]),
                f64_at(&t, &["latency_ms", stage, "p95"]),
                f64_at(&t, &["latency_ms", stage, "p99"]),
            );
            assert!(p50 <= p95 && p95 <= p99, "{stage}: {t:?}");
            // Both sides are rounded to the microsecond.
            assert!(p50 >= lo - 0.001 && p99 <= hi + 0.001, "{stage} {p50}..{p99} outside the replies' {lo}..{hi}");
            p99_max[s] = p99_max[s].max(p99);
        }
    }
    assert_eq!(answered, 10, "each answer in exactly one interval");
    for (s, stage) in ["queue", "tokenize", "infer", "decode", "total"].into_iter().enumerate() {
        let (_, hi) = reply_range(&replies, stage);
        assert!(
            (p99_max[s] - hi).abs() <= 0.001,
            "{stage}: the largest p99 {} is not the largest reply's {hi}",
            p99_max[s]
        );
    }
    // The backend's busy time covers the replies' inference (each call runs within its reply's
    // infer span, which adds only the hand-over between the service and the worker).
    let infer_s: f64 = replies.iter().map(|r| f64_at(r, &["timing_ms", "infer"])).sum::<f64>() / 1000.0;
    assert!(busy_s <= infer_s + 0.01 && busy_s >= infer_s / 2.0, "busy {busy_s} s for {infer_s} s of inference");
    // The refusal is counted by its code, and answers are not.
    let counted = next_where(&mut watch, "/telemetry", "the refusal", |v| {
        v.get("refused").and_then(|r| r.get(code.as_str())).is_some()
    })
    .await;
    let mut refused = std::collections::BTreeMap::new();
    for (k, v) in counted.get("refused").and_then(Value::as_object).expect("refused") {
        refused.insert(k.clone(), v.as_i64().expect("a count"));
    }
    assert_eq!(refused, [(code.clone(), 1)].into_iter().collect(), "{counted:?}");
    assert_eq!(i64_at(&counted, &["answered"]), 10, "{counted:?}");
    // The Last Will on a kill: offline, with this run's birth.
    agent.kill9();
    let will =
        next_where(&mut watch, "/status", "the Last Will", |v| v.get("state") == Some(&Value::from("offline"))).await;
    assert_eq!(i64_at(&will, &["birth"]), birth, "{will:?}");
}

/// The members of a telemetry document that differ between two idle agents of one configuration
/// (their names, clocks and memory), blanked for comparing the rest.
fn without_what_differs(v: &Value) -> Value {
    let mut v = v.clone();
    if let Value::Object(m) = &mut v {
        for k in ["device", "uptime_s", "interval_s", "busy", "rss_kb"] {
            let slot = m.get_mut(k).unwrap_or_else(|| panic!("no {k}"));
            *slot = Value::Null;
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cbor_telemetry_says_so_and_carries_the_document_json_telemetry_carries() {
    let broker = Broker::start("tm-cbor", "");
    // Two agents of one configuration but the encoding, on thermal zones of the same temperature.
    let _cbor = agent_with_zones(&broker, "dev-cbor", "telemetry_encoding = \"cbor\"\n", "");
    let _json = agent_with_zones(&broker, "dev-json", "", "");
    let mut watch = Client::connect(broker.port, "cbor-watch").await;
    watch.subscribe("laya/v1/dev-cbor/telemetry").await;
    watch.subscribe("laya/v1/dev-json/telemetry").await;
    // Each agent's second document once its backend is ready (the first may hold the end of the
    // health call's busy time).
    let mut seen: std::collections::HashMap<String, Vec<Value>> = std::collections::HashMap::new();
    while seen.get("dev-cbor").is_none_or(|v| v.len() < 2) || seen.get("dev-json").is_none_or(|v| v.len() < 2) {
        let p = watch.next(Duration::from_secs(30)).await.expect("telemetry");
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let props = p.properties.clone().expect("properties");
        let v = if topic.contains("dev-cbor") {
            assert_eq!(props.content_type.as_deref(), Some("application/cbor"));
            assert_eq!(p.payload.first().map(|b| b >> 5), Some(5), "a CBOR map, not JSON text");
            Encoding::Cbor.decode(&p.payload, 32).expect("CBOR")
        } else {
            assert_eq!(props.content_type.as_deref(), Some("application/json"));
            Encoding::Json.decode(&p.payload, 32).expect("JSON")
        };
        if v.get("backend_state") == Some(&Value::from("ready")) {
            seen.entry(v.get("device").and_then(Value::as_str).expect("device").to_owned()).or_default().push(v);
        }
    }
    let (cbor, json) = (&seen["dev-cbor"][1], &seen["dev-json"][1]);
    assert_eq!(cbor.get("device"), Some(&Value::from("dev-cbor")));
    assert_eq!(f64_at(cbor, &["temperature_c"]), HOTTEST_ZONE_C, "{cbor:?}");
    // The same members in the same order with the same values (what differs between the two
    // agents blanked), floats included.
    assert_eq!(text(&without_what_differs(cbor)), text(&without_what_differs(json)));
    // A bad encoding is refused at start, with the key's name.
    let dir = temp_dir("tm-bad-encoding");
    let file = dir.join("laya-edge.toml");
    std::fs::write(&file, "[mqtt]\ntelemetry_encoding = \"xml\"\n").expect("config");
    let (_, stderr, ok) = run_cli(&[OsStr::new("check-config"), OsStr::new("--config"), file.as_os_str()], &[], "");
    assert!(!ok && stderr.contains("telemetry_encoding"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_and_a_fatal_error_are_published_as_restart_events_with_their_reasons_and_counted() {
    let broker = Broker::start("tm-events", "");
    let mut watch = Client::connect(broker.port, "events-watch").await;
    watch.subscribe("laya/v1/+/events").await;
    watch.subscribe("laya/v1/+/telemetry").await;
    // One agent's first worker hangs on its first question (call 2, after the health call),
    // another's fails fatally; the workers after the restart run clean.
    let once = |name: &str| {
        let m = temp_dir(name).join("once");
        let _ = std::fs::remove_file(&m);
        m.display().to_string()
    };
    let _hang = Agent::start(
        &broker,
        "dev-hang",
        &format!("[engine]\nbackend = \"null\"\ndeadline_ms = 1000\nnull_faults = \"hang@2,once={}\"\n", once("hang")),
    );
    let _fatal = Agent::start(
        &broker,
        "dev-fatal",
        &format!("[engine]\nbackend = \"null\"\nnull_faults = \"error=fatal@2,once={}\"\n", once("fatal")),
    );
    wait_online(broker.port, "dev-hang").await;
    wait_online(broker.port, "dev-fatal").await;
    let mut c = Client::connect(broker.port, "events-asker").await;
    c.subscribe("laya/v1/reply/events-asker/#").await;
    for device in ["dev-hang", "dev-fatal"] {
        let to = format!("laya/v1/reply/events-asker/{device}");
        let topic = format!("laya/v1/{device}/ask");
        c.ask(&topic, Encoding::Json.encode(&request(device)), Some(&to), None, Encoding::Json).await;
        // Answered all the same, by the restarted worker.
        let reply = decode(&c.next(Duration::from_secs(30)).await.expect("a reply"));
        assert!(reply.get("answers").is_some(), "{reply:?}");
    }
    let restart = |v: &Value| v.get("event") == Some(&Value::from("worker_restart"));
    let hang = next_where(&mut watch, "dev-hang/events", "a restart", restart).await;
    assert_eq!(hang.get("reason"), Some(&Value::from("deadline")), "{hang:?}");
    // 1000 ms a question, times the questions in the call.
    let deadline = hang.get("deadline_ms").and_then(Value::as_i64);
    assert!(deadline.is_some_and(|d| d >= 1000 && d % 1000 == 0), "{hang:?}");
    let fatal = next_where(&mut watch, "dev-fatal/events", "a restart", restart).await;
    assert_eq!(fatal.get("reason"), Some(&Value::from("fatal")), "{fatal:?}");
    assert_eq!(fatal.get("code").and_then(Value::as_i64), Some(-1), "{fatal:?}");
    assert!(fatal.get("message").and_then(Value::as_str).is_some_and(|m| m.contains("injected fatal error")));
    // Telemetry counts each restart by its reason.
    next_where(&mut watch, "dev-hang/telemetry", "the deadline restart", |v| {
        v.get("restarts").and_then(|r| r.get("deadline")).and_then(Value::as_i64) == Some(1)
    })
    .await;
    next_where(&mut watch, "dev-fatal/telemetry", "the fatal restart", |v| {
        v.get("restarts").and_then(|r| r.get("fatal")).and_then(Value::as_i64) == Some(1)
    })
    .await;
}

/// `laya-edge fleet --once --json` against the broker: the snapshot's devices.
fn fleet_snapshot(broker: &Broker, extra: &[&str]) -> Vec<Value> {
    let url = broker.url();
    let mut args = vec!["fleet", "--broker", url.as_str(), "--once", "--json", "--window-s", "3"];
    args.extend_from_slice(extra);
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let (out, err, ok) = run_cli(&args, &[], "");
    assert!(ok, "fleet failed: {err}");
    let v = json::parse_str(out.trim(), ParseOptions::default()).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.get("devices").and_then(Value::as_array).expect("devices").to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_once_json_lists_three_agents_trouble_first_with_the_killed_one_offline() {
    let broker = Broker::start("tm-fleet", "");
    let fleet = "fleet = \"line-3\"\nshare_group = \"g\"\n";
    let _ok = Agent::start(&broker, "fl-ok", &format!("{fleet}[engine]\nbackend = \"null\"\n"));
    // Its backend never loads and there is no fallback: degraded.
    let _degraded = Agent::start(
        &broker,
        "fl-degraded",
        &format!("{fleet}[engine]\nbackend = \"null\"\nnull_faults = \"load-fail\"\nmax_restarts = 0\n"),
    );
    let mut killed = Agent::start(&broker, "fl-killed", &format!("{fleet}[engine]\nbackend = \"null\"\n"));
    // Another fleet's device, left out by --fleet.
    let _other = Agent::start(&broker, "fl-other", "[engine]\nbackend = \"null\"\n");
    for d in ["fl-ok", "fl-degraded", "fl-killed", "fl-other"] {
        wait_online(broker.port, d).await;
    }
    let mut watch = Client::connect(broker.port, "fleet-watch").await;
    watch.subscribe("laya/v1/fl-killed/status").await;
    watch.subscribe("laya/v1/fl-degraded/status").await;
    next_where(&mut watch, "fl-degraded/status", "degraded", |v| {
        v.get("backend_state") == Some(&Value::from("degraded"))
    })
    .await;
    killed.kill9();
    next_where(&mut watch, "fl-killed/status", "the Last Will", |v| v.get("state") == Some(&Value::from("offline")))
        .await;

    let devices = fleet_snapshot(&broker, &["--fleet", "line-3"]);
    let got: Vec<(&str, &str)> = devices
        .iter()
        .map(|d| {
            (
                d.get("device").and_then(Value::as_str).unwrap_or(""),
                d.get("health").and_then(Value::as_str).unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(got, [("fl-killed", "offline"), ("fl-degraded", "degraded"), ("fl-ok", "ok")], "{devices:?}");
    let ok = &devices[2];
    assert_eq!(ok.get("state"), Some(&Value::from("online")));
    assert_eq!(ok.get("backend"), Some(&Value::from("null")));
    assert_eq!(ok.get("model"), Some(&Value::from("bpe-small")));
    assert!(ok.get("questions_per_s").and_then(Value::as_f64).is_some(), "its telemetry was seen: {ok:?}");
    let degraded = &devices[1];
    assert!(degraded.get("restarts").and_then(Value::as_i64) >= Some(1), "{degraded:?}");
    // Without --fleet every device is there.
    assert_eq!(fleet_snapshot(&broker, &[]).len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_once_waits_for_every_retained_status_when_the_first_is_an_offline_device() {
    // mosquitto sends retained messages in the order their topics were first published: the
    // device killed first comes first. Its offline status alone must not pass for the fleet.
    let broker = Broker::start("tm-fleet-order", "");
    let mut gone = Agent::start(&broker, "fo-gone", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "fo-gone").await;
    let mut watch = Client::connect(broker.port, "fleet-order-watch").await;
    watch.subscribe("laya/v1/fo-gone/status").await;
    gone.kill9();
    next_where(&mut watch, "fo-gone/status", "the Last Will", |v| v.get("state") == Some(&Value::from("offline")))
        .await;
    let _up = Agent::start(&broker, "fo-up", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "fo-up").await;
    let devices = fleet_snapshot(&broker, &[]);
    let mut got: Vec<&str> = devices.iter().filter_map(|d| d.get("device").and_then(Value::as_str)).collect();
    got.sort();
    assert_eq!(got, ["fo-gone", "fo-up"], "{devices:?}");
}

/// `serve` with `--log FILTER`, its stderr in a file: asks one good question and one bad one,
/// stops the agent and returns what it logged.
async fn serve_log(filter: &str, engine: &str) -> String {
    let broker = Broker::start(&format!("tm-log-{}", filter.replace([',', '=', ':'], "-")), "");
    let dir = temp_dir("tm-log");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"dev-log\"\ntelemetry_interval_s = 0\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n{engine}",
            broker.url(),
            model("bpe-small")
        ),
    )
    .expect("config");
    let log = dir.join("stderr.log");
    let mut agent = std::process::Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args([
            OsStr::new("serve"),
            OsStr::new("--config"),
            config.as_os_str(),
            OsStr::new("--log"),
            OsStr::new(filter),
        ])
        .env_remove("LAYA_LOG")
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("serve starts");
    wait_online(broker.port, "dev-log").await;
    let mut c = Client::connect(broker.port, "log-asker").await;
    c.subscribe("laya/v1/reply/log-asker/#").await;
    let to = "laya/v1/reply/log-asker/x";
    c.ask("laya/v1/dev-log/ask", Encoding::Json.encode(&request("log-good")), Some(to), None, Encoding::Json).await;
    assert!(decode(&c.next(Duration::from_secs(30)).await.expect("a reply")).get("answers").is_some());
    let bad = json::parse_str(r#"{"id": "log-bad", "questions": {}}"#, ParseOptions::default()).expect("json");
    c.ask("laya/v1/dev-log/ask", Encoding::Json.encode(&bad), Some(to), None, Encoding::Json).await;
    assert!(decode(&c.next(Duration::from_secs(30)).await.expect("a reply")).get("error").is_some());
    let _ = std::process::Command::new("kill").arg("-TERM").arg(agent.id().to_string()).status();
    let _ = agent.wait();
    std::fs::read_to_string(&log).expect("the log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_name_the_question_and_the_worker_pid_at_their_level_and_the_filter_holds() {
    let debug = serve_log("debug", "").await;
    let answered = debug.lines().find(|l| l.contains("answered")).unwrap_or_else(|| panic!("{debug}"));
    assert!(answered.contains("DEBUG") && answered.contains(r#"question{id="log-good""#), "{answered}");
    assert!(answered.contains("questions=2"), "{answered}");
    let refused = debug.lines().find(|l| l.contains("question refused")).unwrap_or_else(|| panic!("{debug}"));
    assert!(
        refused.contains("INFO") && refused.contains(r#"id="log-bad""#) && refused.contains("bad_request"),
        "{refused}"
    );
    // The worker's own debug line, through the agent's log with the worker's pid (not the agent's).
    let worker = debug.lines().find(|l| l.contains("worker: loading the backend")).unwrap_or_else(|| panic!("{debug}"));
    let pid: u32 = worker
        .split("worker_pid=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a worker pid in {worker}"));
    assert!(worker.contains("DEBUG") && pid > 0, "{worker}");
    assert!(worker.contains(r#"worker{backend="null"}"#), "the worker's lifetime span: {worker}");
    assert!(!worker.contains("<7>"), "the worker's priority prefix is read, not printed: {worker}");
    // At info: refusals still, no debug line of either process.
    let info = serve_log("info", "").await;
    assert!(info.contains("question refused"), "{info}");
    assert!(!info.contains("answered") && !info.contains("worker: loading the backend"), "{info}");
    // A worker that dies on the first question: its restart is logged once, at warning, with the reason.
    let once = temp_dir("tm-log-once").join("once");
    let _ = std::fs::remove_file(&once);
    let crash = serve_log("info", &format!("null_faults = \"exit@2,once={}\"\n", once.display())).await;
    let restarts: Vec<&str> = crash.lines().filter(|l| l.contains("worker died")).collect();
    assert_eq!(restarts.len(), 1, "{crash}");
    assert!(restarts[0].contains("WARN") && restarts[0].contains(r#"reason="crash""#), "{crash}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_the_agent_cannot_load_is_published_as_config_error_before_it_exits() {
    let broker = Broker::start("tm-config-error", "");
    let mut watch = Client::connect(broker.port, "config-error-watch").await;
    watch.subscribe("laya/v1/dev-noconfig/events").await;
    let mut agent = Agent::start(&broker, "dev-noconfig", "[model]\ndir = \"/nonexistent/laya-model\"\n");
    let event =
        next_where(&mut watch, "/events", "config_error", |v| v.get("event") == Some(&Value::from("config_error")))
            .await;
    let message = event.get("message").and_then(Value::as_str).unwrap_or_default();
    assert!(message.contains("/nonexistent/laya-model"), "{event:?}");
    // And it exits with the error, as without a broker.
    let mut child = agent.child.take().expect("started");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "the agent did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    // The report connected under its own client id, never the agent's (whose persistent session
    // holds the device's queued questions).
    let log = broker.log();
    assert!(log.contains("as laya-edge-dev-noconfig-report "), "{log}");
    assert!(!log.contains("as laya-edge-dev-noconfig "), "{log}");
}
