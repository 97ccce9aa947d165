//! One question path behind two front doors (issue #41, item 6): `serve` with `[http]` answers
//! laya.serve's API on the same queue, waiting room and engine as MQTT, a flood at one door does
//! not hold the other's question behind it, and with no broker the HTTP door serves alone.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

/// laya.serve's body for one choice question.
const BODY: &str = r#"{"state": "My parcel arrived broken, order 4471.", "questions": {"intent": {"type": "choice", "instructions": "What does the customer want?", "criteria": {"refund": "wants the money back", "exchange": "wants another item"}}}}"#;

/// One HTTP/1.1 request on its own connection: the status and the body.
async fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("the HTTP door listens");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("request sent");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("response read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Waits until the door answers `/health`.
async fn wait_http(port: u16) {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the HTTP door on {port} never listened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_question_takes_its_turn_beside_an_mqtt_flood_on_the_one_queue() {
    let broker = Broker::start("two-doors", "");
    let port = free_port();
    let _agent = Agent::start(
        &broker,
        "dev-doors",
        &format!(
            "[limits]\nqueue = 1\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=400\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    );
    wait_online(broker.port, "dev-doors").await;
    wait_http(port).await;
    let mut c = Client::connect(broker.port, "doors-asker").await;
    c.subscribe("laya/v1/reply/flood/#").await;
    for i in 0..6 {
        let id = format!("f{i}");
        let to = format!("laya/v1/reply/flood/{id}");
        c.ask("laya/v1/dev-doors/ask", Encoding::Json.encode(&request(&id)), Some(&to), None, Encoding::Json).await;
    }
    // The flood's first question holds the one place and the rest wait; then the HTTP caller asks.
    let first = c.next(Duration::from_secs(30)).await.expect("the flood's first reply");
    assert_eq!(decode(&first).get("id").and_then(Value::as_str), Some("f0"));
    let mut asked = tokio::spawn(http(port, "POST", "/v1/systemone", BODY));
    let mut flood_replies_before = 0;
    let (status, body) = loop {
        tokio::select! {
            answer = &mut asked => break answer.expect("the HTTP task"),
            reply = c.next(Duration::from_secs(30)) => match reply {
                Some(_) => flood_replies_before += 1,
                None => panic!("neither the HTTP answer nor a flood reply came"),
            },
        }
    };
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"intent\""), "the answer names the question: {body}");
    // In arrival order the HTTP question would wait for all five of the flood's: in clients'
    // turns it goes after at most the one the flood holds and the one whose turn came first.
    assert!(flood_replies_before <= 2, "{flood_replies_before} flood replies came before the HTTP answer");
    // Both doors' questions were counted by the one path.
    let (status, metrics) = http(port, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("laya_inference_seconds_count"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_broker_the_http_door_serves_alone_and_says_what_it_serves() {
    let port = free_port();
    let dir = temp_dir("http-alone");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\ndevice = \"alone\"\n[engine]\nbackend = \"null\"\n[model]\ndir = \"{}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
            model("bpe-small")
        ),
    )
    .expect("config");
    let _agent = Agent::with_config(config, Vec::new());
    wait_http(port).await;
    let (status, body) = http(port, "POST", "/v1/systemone", BODY).await;
    assert_eq!(status, 200, "{body}");
    let (status, health) = http(port, "GET", "/health", "").await;
    assert_eq!(status, 200, "{health}");
    let health = laya_topics::json::parse_str(&health, Default::default()).expect("health is JSON");
    assert_eq!(health.get("backend_state").and_then(Value::as_str), Some("ready"), "{health:?}");
    assert!(health.get("served").and_then(|s| s.get("name")).is_some(), "{health:?}");
}
