//! The engine's recovery seen from MQTT: `laya-edge serve` with the `null` backend's faults,
//! against a real mosquitto. Events and the retained status go out when they happen (here with
//! telemetry off), READY=1 does not wait for the backend, and a worker slower to load than
//! `startup_timeout_s` is replaced (counted in telemetry).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

fn config(broker: &Broker, device: &str, engine: &str) -> PathBuf {
    let dir = temp_dir(&format!("healing-{device}"));
    let path = dir.join("laya-edge.toml");
    let text = format!(
        "[mqtt]\nbroker = \"{}\"\ndevice = \"{device}\"\ntelemetry_interval_s = 0\nreconnect_min_ms = 100\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n{engine}",
        broker.url(),
        model("bpe-small")
    );
    std::fs::write(&path, text).expect("config");
    path
}

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Collects what arrives until `want` has been seen on `topic`.
async fn until(c: &mut Client, within: Duration, seen: &mut Vec<(String, Value)>, want: impl Fn(&str, &Value) -> bool) {
    let t = Instant::now();
    while t.elapsed() < within {
        let Some(p) = c.next(Duration::from_millis(200)).await else { continue };
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let v = decode(&p);
        let hit = want(&topic, &v);
        seen.push((topic, v));
        if hit {
            return;
        }
    }
    panic!("not seen within {within:?}: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backend_degrades_and_recovers_with_events_and_status_published_as_it_happens() {
    let broker = Broker::start("healing", "");
    let marker = temp_dir("healing-once").join("failed-once");
    let _ = std::fs::remove_file(&marker);
    // The first worker fails to load (degraded at once); the try 2 s later loads.
    let engine =
        format!("null_faults = \"load-fail,once={}\"\nmax_restarts = 0\nretry_primary_s = 2\n", marker.display());
    let mut watch = Client::connect(broker.port, "healing-watch").await;
    watch.subscribe("laya/v1/dev-heal/status").await;
    watch.subscribe("laya/v1/dev-heal/events").await;
    let _agent = Agent::with_config(config(&broker, "dev-heal", &engine), Vec::new());
    let mut seen = Vec::new();
    until(&mut watch, Duration::from_secs(20), &mut seen, |t, v| {
        t.ends_with("/events") && field(v, "event") == Some("backend_recovered")
    })
    .await;
    let events: Vec<&Value> = seen.iter().filter(|(t, _)| t.ends_with("/events")).map(|(_, v)| v).collect();
    let restart = events.iter().find(|v| field(v, "event") == Some("worker_restart")).expect("a restart event");
    assert_eq!(field(restart, "reason"), Some("load_failed"), "{restart:?}");
    assert!(field(restart, "message").is_some_and(|m| m.contains("injected load failure")), "{restart:?}");
    assert_eq!(field(restart, "role"), Some("primary"));
    let kinds: Vec<&str> = events.iter().filter_map(|v| field(v, "event")).collect();
    assert_eq!(kinds, ["worker_restart", "backend_degraded", "backend_recovered"]);
    // The retained status followed: degraded, then ready (telemetry is off: no tick carried it).
    let ready = |t: &str, v: &Value| t.ends_with("/status") && field(v, "backend_state") == Some("ready");
    // The status may go out before or after the recovered event.
    if !seen.iter().any(|(t, v)| ready(t, v)) {
        until(&mut watch, Duration::from_secs(5), &mut seen, ready).await;
    }
    let states: Vec<&str> =
        seen.iter().filter(|(t, _)| t.ends_with("/status")).filter_map(|(_, v)| field(v, "backend_state")).collect();
    assert!(states.contains(&"degraded"), "{states:?}");
    // And questions are answered, naming who answered.
    let mut c = Client::connect(broker.port, "heal-asker").await;
    c.subscribe("laya/v1/reply/heal-asker/#").await;
    let reply_to = "laya/v1/reply/heal-asker/h1";
    c.ask("laya/v1/dev-heal/ask", Encoding::Json.encode(&request("h1")), Some(reply_to), None, Encoding::Json).await;
    let reply = decode(&c.next(Duration::from_secs(10)).await.expect("answered"));
    assert_eq!((field(&reply, "backend"), field(&reply, "serving")), (Some("null"), Some("primary")), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_is_sent_once_connected_however_slowly_the_backend_loads() {
    let broker = Broker::start("healing-ready", "");
    let dir = temp_dir("healing-ready-sock");
    let socket_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind");
    // Longer than the backend's 30 s load, so a READY=1 that waited for it still comes (and the
    // status below then says so); bounded only so that no READY=1 at all fails the test.
    socket.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let config = config(&broker, "dev-slow", "null_faults = \"load-sleep=30000\"\n");
    let env = vec![("NOTIFY_SOCKET".to_owned(), socket_path.display().to_string())];
    let _agent = Agent::with_config(config, env);
    let mut buf = [0u8; 512];
    // Other notifications (STATUS=, WATCHDOG=1) may come first: wait for the one with READY=1.
    loop {
        let n = socket.recv(&mut buf).expect("READY=1");
        if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "READY=1") {
            break;
        }
    }
    // Sent while the backend still loads: the retained status says it is not answering yet.
    let mut watch = Client::connect(broker.port, "slow-watch").await;
    watch.subscribe("laya/v1/dev-slow/status").await;
    let status = decode(&watch.next(Duration::from_secs(5)).await.expect("the retained status"));
    assert_eq!((field(&status, "state"), field(&status, "backend_state")), (Some("online"), Some("starting")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_from_the_cpu_fallback_names_the_cpu_backend_and_the_fallback() {
    let broker = Broker::start("healing-fallback", "");
    // The configured backend never loads: degraded at once, the CPU fallback answers.
    let engine = "null_faults = \"load-fail\"\nmax_restarts = 0\nfallback = \"cpu\"\n";
    let _agent = Agent::with_config(config(&broker, "dev-fb", engine), Vec::new());
    wait_online(broker.port, "dev-fb").await;
    let mut c = Client::connect(broker.port, "fb-asker").await;
    c.subscribe("laya/v1/reply/fb-asker/#").await;
    let reply_to = "laya/v1/reply/fb-asker/f1";
    c.ask("laya/v1/dev-fb/ask", Encoding::Json.encode(&request("f1")), Some(reply_to), None, Encoding::Json).await;
    let reply = decode(&c.next(Duration::from_secs(30)).await.expect("answered"));
    assert!(reply.get("answers").is_some(), "{reply:?}");
    assert_eq!((field(&reply, "backend"), field(&reply, "serving")), (Some("cpu"), Some("fallback")), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_merged_into_a_batch_that_kills_the_worker_are_each_answered_after_one_restart() {
    let broker = Broker::start("healing-merge", "");
    // Each request lays out two rows; a worker call of three rows or more aborts the worker, and
    // each row takes 500 ms, so the second and third requests queue behind the first.
    let engine = "null_faults = \"row-sleep=500,abort-rows=3\"\n";
    let mut watch = Client::connect(broker.port, "merge-watch").await;
    watch.subscribe("laya/v1/dev-merge/events").await;
    let _agent = Agent::with_config(config(&broker, "dev-merge", engine), Vec::new());
    wait_online(broker.port, "dev-merge").await;
    let mut c = Client::connect(broker.port, "merge-asker").await;
    c.subscribe("laya/v1/reply/merge-asker/#").await;
    for id in ["m0", "m1", "m2"] {
        let reply_to = format!("laya/v1/reply/merge-asker/{id}");
        c.ask("laya/v1/dev-merge/ask", Encoding::Json.encode(&request(id)), Some(&reply_to), None, Encoding::Json)
            .await;
    }
    let mut ids = Vec::new();
    while ids.len() < 3 {
        let reply = decode(&c.next(Duration::from_secs(30)).await.expect("every request answered"));
        assert!(reply.get("answers").is_some() && reply.get("error").is_none(), "{reply:?}");
        ids.push(field(&reply, "id").unwrap_or_default().to_owned());
    }
    ids.sort();
    assert_eq!(ids, ["m0", "m1", "m2"]);
    // The merged batch of m1 and m2 (four rows) killed the worker once; each then ran alone.
    let mut restarts = Vec::new();
    while let Some(p) = watch.next(Duration::from_millis(500)).await {
        let v = decode(&p);
        if field(&v, "event") == Some("worker_restart") {
            restarts.push(field(&v, "reason").unwrap_or_default().to_owned());
        }
    }
    assert_eq!(restarts, ["crash"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_slower_to_load_than_the_configured_startup_timeout_is_replaced() {
    let broker = Broker::start("startup", "");
    // The first worker takes 30 s to load; the ones after it load at once.
    let marker = temp_dir("startup-once").join("loaded-slowly");
    let _ = std::fs::remove_file(&marker);
    let engine = format!(
        "[engine]\nbackend = \"null\"\nstartup_timeout_s = 1\nnull_faults = \"load-sleep=30000,once={}\"\n",
        marker.display()
    );
    let _agent = Agent::start(&broker, "dev-startup", &engine);
    wait_online(broker.port, "dev-startup").await;
    let mut watch = Client::connect(broker.port, "startup-watch").await;
    watch.subscribe("laya/v1/dev-startup/telemetry").await;
    let mut c = Client::connect(broker.port, "startup-asker").await;
    c.subscribe("laya/v1/reply/startup-asker/#").await;
    let reply_to = "laya/v1/reply/startup-asker/s1";
    c.ask("laya/v1/dev-startup/ask", Encoding::Json.encode(&request("s1")), Some(reply_to), None, Encoding::Json).await;
    // Answered; by the replacement worker, as the restart counted below shows (the slow one would
    // have loaded after 30 s with no restart).
    let reply = decode(&c.next(Duration::from_secs(60)).await.expect("answered"));
    assert!(reply.get("answers").is_some(), "{reply:?}");
    telemetry_where(&mut watch, "the restart counted", |v| {
        v.get("restarts").and_then(|r| r.get("load_failed")).and_then(Value::as_i64) == Some(1)
    })
    .await;
}
