//! What the agent takes in: questions beyond the queue wait within `waiting_bytes` or are
//! refused `overloaded`, a payload over `max_payload` is `too_large`, and ten thousand fuzzed
//! payloads leave it alive and answering.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PublishProperties;

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_and_oversize_get_clear_errors() {
    let broker = Broker::start("limits", "");
    let _agent = Agent::start(
        &broker,
        "dev-lim",
        // A Receive Maximum above the queue, so the broker sends more than the agent holds,
        // and no waiting room: what does not fit the queue is refused at once.
        "max_payload = 2000\nreceive_maximum = 100\n[limits]\nqueue = 1\nwaiting_bytes = 0\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=1500\"\n",
    );
    wait_online(broker.port, "dev-lim").await;
    let mut c = Client::connect(broker.port, "lim-asker").await;
    c.subscribe("laya/v1/reply/lim-asker/#").await;
    for i in 0..4 {
        let id = format!("o{i}");
        c.ask(
            "laya/v1/dev-lim/ask",
            Encoding::Json.encode(&request(&id)),
            Some(&format!("laya/v1/reply/lim-asker/{id}")),
            None,
            Encoding::Json,
        )
        .await;
    }
    let big = format!(r#"{{"id": "big", "state": "{}", "questions": {{}}}}"#, "x".repeat(5000));
    c.ask("laya/v1/dev-lim/ask", big.into_bytes(), Some("laya/v1/reply/lim-asker/big"), None, Encoding::Json).await;
    let mut codes: HashMap<String, String> = HashMap::new();
    while codes.len() < 5 {
        let p = c.next(Duration::from_secs(30)).await.expect("a reply for each question");
        let v = decode(&p);
        // A payload over the limit is not read, so its error carries no id: go by the topic.
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let id = topic.rsplit('/').next().unwrap_or("?").to_owned();
        let code = v.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("ok").to_owned();
        if code == "overloaded" {
            assert_eq!(v.get("error").and_then(|e| e.get("retryable")), Some(&Value::Bool(true)));
        }
        codes.insert(id, code);
    }
    assert_eq!(codes["o0"], "ok");
    assert!(codes.values().filter(|c| *c == "overloaded").count() >= 2, "{codes:?}");
    assert_eq!(codes["big"], "too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_a_broker_sends_beyond_the_queue_wait_within_waiting_bytes_and_the_rest_are_overloaded() {
    let broker = Broker::start("waiting", "");
    // Every question of this test has the same size; the waiting room holds two of them.
    let size = Encoding::Json.encode(&request("w0")).len();
    let _agent = Agent::start(
        &broker,
        "dev-wait",
        // A Receive Maximum above the queue: the broker sends more than the queue holds, as a
        // broker that does not honour the Receive Maximum does.
        &format!(
            "receive_maximum = 100\n[limits]\nqueue = 1\nwaiting_bytes = {}\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=400\"\n",
            2 * size + size / 2
        ),
    );
    wait_online(broker.port, "dev-wait").await;
    let mut c = Client::connect(broker.port, "wait-asker").await;
    c.subscribe("laya/v1/reply/wait-asker/#").await;
    for i in 0..5 {
        let id = format!("w{i}");
        c.ask(
            "laya/v1/dev-wait/ask",
            Encoding::Json.encode(&request(&id)),
            Some(&format!("laya/v1/reply/wait-asker/{id}")),
            None,
            Encoding::Json,
        )
        .await;
    }
    let mut order = Vec::new();
    let mut codes: HashMap<String, String> = HashMap::new();
    while codes.len() < 5 {
        let p = c.next(Duration::from_secs(30)).await.expect("a reply for each question");
        let v = decode(&p);
        let id = v.get("id").and_then(Value::as_str).expect("id").to_owned();
        let code = v.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("ok").to_owned();
        assert!(codes.insert(id.clone(), code.clone()).is_none(), "one reply per question: {id} twice");
        if code == "ok" {
            order.push(id);
        }
    }
    // One runs, two wait for its place and are answered in arrival order, two are refused.
    assert_eq!(order, ["w0", "w1", "w2"], "{codes:?}");
    assert_eq!(codes["w3"], "overloaded", "{codes:?}");
    assert_eq!(codes["w4"], "overloaded", "{codes:?}");
    assert!(c.next(Duration::from_secs(2)).await.is_none(), "nothing more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_fuzzed_payloads_leave_the_agent_alive_and_answering() {
    let broker = Broker::start("fuzz", "");
    let mut agent = Agent::start(&broker, "dev-fuzz", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-fuzz").await;
    let mut c = Client::connect(broker.port, "fuzz-asker").await;
    c.subscribe("laya/v1/reply/fuzz-asker/#").await;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let fragments: [&[u8]; 12] = [
        b"{",
        b"}",
        b"[",
        b"\"state\"",
        b"\"questions\"",
        b":",
        b",",
        b"\"id\"",
        b"NaN",
        b"1e999",
        b"\xa1\x61",
        b"\"type\": \"choice\"",
    ];
    for i in 0..10_000 {
        let mut payload = Vec::new();
        let parts = next() % 12;
        for _ in 0..parts {
            if next() % 3 == 0 {
                let len = next() % 16;
                for _ in 0..len {
                    payload.push((next() & 0xff) as u8);
                }
            } else {
                payload.extend_from_slice(fragments[(next() % 12) as usize]);
            }
        }
        let qos = if i % 2 == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce };
        let reply = (i % 5 == 0).then(|| format!("laya/v1/reply/fuzz-asker/z{i}"));
        let props = PublishProperties { response_topic: reply, ..PublishProperties::default() };
        c.client.publish_with_properties("laya/v1/dev-fuzz/ask", qos, false, payload, props).await.expect("publish");
    }
    c.ask(
        "laya/v1/dev-fuzz/ask",
        Encoding::Json.encode(&request("after-fuzz")),
        Some("laya/v1/reply/fuzz-asker/after-fuzz"),
        None,
        Encoding::Json,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut found = false;
    while Instant::now() < deadline {
        let Some(p) = c.next(Duration::from_secs(5)).await else { continue };
        if decode(&p).get("id") == Some(&Value::from("after-fuzz")) {
            found = true;
            break;
        }
    }
    assert!(found, "the agent answers after the fuzz");
    assert!(agent.alive());
}
