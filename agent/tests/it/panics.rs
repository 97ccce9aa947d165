//! A panic never leaves a dead agent online (issue #40): a task that panics ends `serve` with
//! status 101 and the panic in its log, the broker publishes the Last Will (`offline`), and the
//! question that was in progress, never acknowledged, is answered by the next run.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use laya_topics::Value;
use rumqttc::v5::mqttbytes::v5::Publish;

use crate::support::*;

fn topic(p: &Publish) -> String {
    String::from_utf8_lossy(&p.topic).into_owned()
}

fn state(p: &Publish) -> Option<String> {
    topic(p).ends_with("/status").then(|| decode(p).get("state").and_then(Value::as_str).map(str::to_owned)).flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_ends_serve_with_the_panic_logged_the_last_will_offline_and_the_question_for_the_next_run() {
    let broker = Broker::start("panic-task", "");
    let device = "dev-panic";
    let config = agent_config(&broker.url(), device, "[engine]\nbackend = \"null\"\n");
    // The engine's driver task panics when it takes its first call (a hidden, test-only switch).
    let mut child = Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args(["serve", "--config"])
        .arg(&config)
        .env("LAYA_TEST_PANIC", "engine-call")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut stderr = child.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    wait_online(broker.port, device).await;
    let mut c = Persistent::connect(broker.port, "panic-asker").await;
    c.subscribe("laya/v1/reply/panic-asker/#").await;
    c.subscribe(&format!("laya/v1/{device}/status")).await;
    c.until("the online status", Duration::from_secs(10), |p| state(p).as_deref() == Some("online")).await;

    let reply_to = "laya/v1/reply/panic-asker/p1";
    let body = laya_topics::wire::Encoding::Json.encode(&request("p1"));
    c.ask(&format!("laya/v1/{device}/ask"), body, Some(reply_to)).await;

    // The process ends by itself, with Rust's status for a panic (waited for up to a bound: not a
    // timing, a hang is the failure).
    let give_up = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < give_up, "serve is still running after its task panicked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(101), "{status:?}");
    let log = log.join().expect("the log");
    assert!(
        log.contains("panic: LAYA_TEST_PANIC=engine-call") && log.contains("exiting with status 101"),
        "the panic is logged: {log}"
    );
    // Through the log's own format (tracing), with where it happened.
    assert!(log.lines().any(|l| l.contains("ERROR") && l.contains("engine/driver.rs")), "{log}");

    // The broker saw the connection drop without a DISCONNECT: the Last Will says offline.
    let seen = c
        .until("the Last Will's offline status", Duration::from_secs(30), |p| state(p).as_deref() == Some("offline"))
        .await;
    assert!(seen.iter().all(|p| !topic(p).contains("/reply/")), "no reply from the panicked run");

    // Not acknowledged: the next run gets the question again and answers it, once.
    let mut next = Agent::with_config(config, Vec::new());
    let seen = c.until("the reply from the next run", Duration::from_secs(60), |p| topic(p) == reply_to).await;
    let reply = decode(seen.last().expect("the reply"));
    assert_eq!(reply.get("id"), Some(&Value::from("p1")));
    assert!(reply.get("answers").is_some(), "answered, not refused: {reply:?}");
    assert!(c.next(Duration::from_secs(2)).await.is_none_or(|p| topic(&p) != reply_to), "answered twice");
    assert!(next.alive(), "the next run serves on");
}
