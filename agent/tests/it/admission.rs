//! What the agent takes in: questions beyond the queue wait within `waiting_bytes` or are
//! refused `overloaded`, a payload over `max_payload` is `too_large`, one client's flood gives
//! way to another client's questions and never goes before them (issue #40), and ten thousand
//! fuzzed payloads leave it alive and answering.

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
    let size = laya_edge::service::flow::waiting_charge(Encoding::Json.encode(&request("w0")).len());
    let _agent = Agent::start(
        &broker,
        "dev-wait",
        // A Receive Maximum above the queue: the broker sends more than the queue holds.
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

/// Publishes a request `id` on `c` as client `client` (its response topic's client level).
async fn ask_as(c: &Client, device: &str, client: &str, id: &str) {
    let to = format!("laya/v1/reply/{client}/{id}");
    c.ask(&format!("laya/v1/{device}/ask"), Encoding::Json.encode(&request(id)), Some(&to), None, Encoding::Json).await;
}

/// The next `n` replies on `c`, in the order they came: (id, error code or "ok", message).
async fn replies_in_order(c: &mut Client, n: usize) -> Vec<(String, String, String)> {
    let mut seen = Vec::new();
    while seen.len() < n {
        let Some(p) = c.next(Duration::from_secs(30)).await else { panic!("{} of {n} replies: {seen:?}", seen.len()) };
        let v = decode(&p);
        let id = v.get("id").and_then(Value::as_str).expect("id").to_owned();
        let error = v.get("error");
        let code = error.and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("ok").to_owned();
        let message = error.and_then(|e| e.get("message")).and_then(Value::as_str).unwrap_or("").to_owned();
        seen.push((id, code, message));
    }
    seen
}

/// Where `id` is among `answered`.
fn position(answered: &[&str], id: &str) -> usize {
    answered.iter().position(|a| *a == id).unwrap_or_else(|| panic!("{id} answered: {answered:?}"))
}

/// Issue #40. One place, a waiting room for four questions, calls of 400 ms. One connection
/// publishes ten questions as client `flood`, then one as client `other`, so that they reach the
/// agent in that order (the broker sends them all: its Receive Maximum is 65535). The flood takes
/// the place and fills the room; its own next questions find it full and are refused. `other`'s
/// does not: the flood's newest waiting question gives way to it, refused `overloaded` (no
/// question of `other` is), and `other`'s is served in its turn, before the flood's later
/// questions. Then the flood's client is served again as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floods_newest_question_gives_way_to_another_clients_in_a_full_waiting_room_which_goes_first() {
    let broker = Broker::start("fair", "");
    let charge = laya_edge::service::flow::waiting_charge(Encoding::Json.encode(&request("f0")).len());
    let _agent = Agent::start(
        &broker,
        "dev-fair",
        &format!(
            "[limits]\nqueue = 1\nwaiting_bytes = {}\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=400\"\n",
            4 * charge + charge / 2
        ),
    );
    wait_online(broker.port, "dev-fair").await;
    let mut c = Client::connect(broker.port, "fair-asker").await;
    c.subscribe("laya/v1/reply/flood/#").await;
    c.subscribe("laya/v1/reply/other/#").await;
    for i in 0..10 {
        ask_as(&c, "dev-fair", "flood", &format!("f{i}")).await;
    }
    ask_as(&c, "dev-fair", "other", "o0").await;
    let replies = replies_in_order(&mut c, 11).await;
    let reply = |id: &str| replies.iter().find(|r| r.0 == id).unwrap_or_else(|| panic!("{id}: {replies:?}"));
    // f0 took the place, f1..f4 the room; f5..f9 found it full.
    for i in 5..10 {
        let (_, code, message) = reply(&format!("f{i}"));
        assert_eq!((code.as_str(), message.as_str()), ("overloaded", "the question queue is full; retry later"));
    }
    // o0 did not: the flood's newest waiting question, f4, gave way to it.
    let (_, code, message) = reply("f4");
    assert_eq!(code, "overloaded", "{replies:?}");
    assert!(message.contains("gave way to another client's"), "{message}");
    let answered: Vec<&str> = replies.iter().filter(|r| r.1 == "ok").map(|r| r.0.as_str()).collect();
    // The place in turn: the flood's next (f1), then o0, before the flood's later f2 and f3.
    assert_eq!(answered, ["f0", "f1", "o0", "f2", "f3"], "{replies:?}");
    // The flood's client is served again as any.
    ask_as(&c, "dev-fair", "flood", "f10").await;
    assert_eq!(replies_in_order(&mut c, 1).await[0].1, "ok");
}

/// Issue #40, in the engine: eight places (four for each client at most), so the flood's four
/// calls and another client's one all reach the engine's queue, which runs one call at a time
/// (two questions per request and per batch) of 400 ms. `other`'s call, queued behind the
/// flood's, takes its turn after the flood's next one, not after all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clients_call_takes_its_turn_in_the_engine_before_a_floods_later_calls() {
    let broker = Broker::start("fair-engine", "");
    let _agent = Agent::start(
        &broker,
        "dev-faire",
        "[limits]\nqueue = 8\nquestions_per_request = 2\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=400\"\n",
    );
    wait_online(broker.port, "dev-faire").await;
    let mut c = Client::connect(broker.port, "faire-asker").await;
    c.subscribe("laya/v1/reply/flood/#").await;
    c.subscribe("laya/v1/reply/other/#").await;
    for i in 0..4 {
        ask_as(&c, "dev-faire", "flood", &format!("f{i}")).await;
    }
    ask_as(&c, "dev-faire", "other", "o0").await;
    let replies = replies_in_order(&mut c, 5).await;
    let answered: Vec<&str> = replies.iter().filter(|r| r.1 == "ok").map(|r| r.0.as_str()).collect();
    assert_eq!(answered.len(), 5, "{replies:?}");
    // f0 was running and f1 next when o0 came: o0 goes after f1 when it arrives within f0's
    // 400 ms, as it does; in any case before the flood's last.
    assert!(position(&answered, "o0") < position(&answered, "f3"), "{answered:?}");
}

/// Issue #40: the waiting room hands free places to its clients in turn. One place, calls of
/// 400 ms; eight questions of `flood` then two of `other` all arrive at once: `other`'s go
/// between the flood's, not after all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_room_hands_free_places_to_its_clients_in_turn() {
    let broker = Broker::start("fair-wait", "");
    let _agent = Agent::start(
        &broker,
        "dev-fairw",
        "[limits]\nqueue = 1\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=400\"\n",
    );
    wait_online(broker.port, "dev-fairw").await;
    let mut c = Client::connect(broker.port, "fairw-asker").await;
    c.subscribe("laya/v1/reply/flood/#").await;
    c.subscribe("laya/v1/reply/other/#").await;
    for i in 0..8 {
        ask_as(&c, "dev-fairw", "flood", &format!("f{i}")).await;
    }
    for i in 0..2 {
        ask_as(&c, "dev-fairw", "other", &format!("o{i}")).await;
    }
    let replies = replies_in_order(&mut c, 10).await;
    let answered: Vec<&str> = replies.iter().filter(|r| r.1 == "ok").map(|r| r.0.as_str()).collect();
    // f0 took the place; the others waited. The place goes to the flood and to `other` in turn
    // (in arrival order, o0 and o1 would come last).
    assert_eq!(answered, ["f0", "f1", "o0", "f2", "o1", "f3", "f4", "f5", "f6", "f7"], "{replies:?}");
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
