//! What MQTT sessions keep across an outage: a broker restarted under load and an agent killed
//! mid-question lose no question, a byte-identical redelivery gets the remembered reply, and two
//! agents sharing one client id (a cloned SD card) name the takeover and back off. And what a
//! connection's CONNACK settles: the keep-alive a broker assigns is the one pinged at and watched,
//! a Receive Maximum of 0 makes the agent connect again.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_under_load_loses_no_question() {
    let mut broker = Broker::start("restart", "");
    let _agent = Agent::start(&broker, "dev-restart", "[engine]\nbackend = \"null\"\nnull_faults = \"sleep=20\"\n");
    wait_online(broker.port, "dev-restart").await;
    // The asker keeps a persistent session too, so replies published while it is away wait for it.
    let mut c = Persistent::connect(broker.port, "restart-asker").await;
    c.subscribe("laya/v1/reply/restart-asker/#").await;
    let n = 80;
    for i in 0..n {
        let id = format!("q{i}");
        let to = format!("laya/v1/reply/restart-asker/{id}");
        c.ask("laya/v1/dev-restart/ask", Encoding::Json.encode(&request(&id)), Some(&to)).await;
        if i == n / 2 {
            broker.restart();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut answered = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while answered.len() < n && Instant::now() < deadline {
        if let Some(p) = c.next(Duration::from_secs(2)).await
            && let Some(id) = decode(&p).get("id").and_then(Value::as_str)
        {
            answered.insert(id.to_owned());
        }
    }
    let missing: Vec<usize> = (0..n).filter(|i| !answered.contains(&format!("q{i}"))).collect();
    assert!(missing.is_empty(), "unanswered after the broker restart: {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_question_answers_it_after_restarting() {
    let broker = Broker::start("kill9", "");
    let mut agent = Agent::start(&broker, "dev-kill", "[engine]\nbackend = \"null\"\nnull_faults = \"sleep=3000\"\n");
    wait_online(broker.port, "dev-kill").await;
    let mut c = Client::connect(broker.port, "kill-asker").await;
    c.subscribe("laya/v1/reply/kill-asker/#").await;
    let mut watch = Client::connect(broker.port, "kill-watch").await;
    watch.subscribe("laya/v1/dev-kill/telemetry").await;
    c.ask(
        "laya/v1/dev-kill/ask",
        Encoding::Json.encode(&request("k1")),
        Some("laya/v1/reply/kill-asker/k1"),
        None,
        Encoding::Json,
    )
    .await;
    // Killed while it computes the answer (not before the question reached it).
    telemetry_where(&mut watch, "the question in flight", |v| v.get("in_flight").and_then(Value::as_i64) >= Some(1))
        .await;
    agent.kill9();
    assert!(c.next(Duration::from_millis(500)).await.is_none(), "no reply from a killed agent");
    agent.launch();
    let p = c.next(Duration::from_secs(60)).await.expect("the question is redelivered and answered");
    assert_eq!(decode(&p).get("id"), Some(&Value::from("k1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_identical_redelivery_gets_the_remembered_reply_and_counts_as_resent() {
    let broker = Broker::start("resend", "");
    let _agent = Agent::start(&broker, "dev-resend", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-resend").await;
    let mut watch = Client::connect(broker.port, "resend-watch").await;
    watch.subscribe("laya/v1/dev-resend/telemetry").await;
    let mut c = Client::connect(broker.port, "resend-asker").await;
    c.subscribe("laya/v1/reply/resend-asker/#").await;
    let body = Encoding::Json.encode(&request("same"));
    let reply_to = "laya/v1/reply/resend-asker/same";
    let mut replies = Vec::new();
    for _ in 0..2 {
        // The same bytes, id and response topic: what a broker's redelivery looks like.
        c.ask("laya/v1/dev-resend/ask", body.clone(), Some(reply_to), Some(b"c-1"), Encoding::Json).await;
        let p = c.next(Duration::from_secs(30)).await.expect("a reply");
        assert_eq!(p.properties.as_ref().and_then(|x| x.correlation_data.as_deref()), Some(&b"c-1"[..]));
        replies.push(p.payload.to_vec());
    }
    assert_eq!(replies[0], replies[1], "the remembered reply, byte for byte (timings included)");
    let t = telemetry_where(&mut watch, "the resend counted", |v| counter(v, &["resent"]) == 1).await;
    assert_eq!(counter(&t, &["answered"]), 1, "answered once, resent once: {t:?}");
}

/// Issue #31, defect 7: a cloned SD card, two agents with one client id. Each connection takes
/// the other's session (DISCONNECT 0x8E); the agent names it (an event, the status's
/// `takeovers`) and waits at least 5 s, doubling, before it connects again, so the pair costs
/// the broker at most one takeover every few seconds (without the backoff the clones took over
/// 3.4 times a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_with_one_client_id_name_the_takeover_and_back_off_to_one_every_few_seconds() {
    let broker = Broker::start("clones", "");
    let mut c = Persistent::connect(broker.port, "clone-watcher").await;
    c.subscribe("laya/v1/dev-clone/events").await;
    c.subscribe("laya/v1/dev-clone/status").await;
    let _a = Agent::start(&broker, "dev-clone", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-clone").await;
    let _b = Agent::start(&broker, "dev-clone", "[engine]\nbackend = \"null\"\n");
    let watch = Duration::from_secs(20);
    let until = Instant::now() + watch;
    let (mut takeovers, mut named, mut most_in_status) = (0, false, 0);
    while let Some(p) = c.next(until.saturating_duration_since(Instant::now())).await {
        let v = decode(&p);
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        if topic.ends_with("/events") && v.get("event").and_then(Value::as_str) == Some("session_taken_over") {
            takeovers += 1;
            named |= v.get("message").and_then(Value::as_str).is_some_and(|m| m.contains("laya-edge-dev-clone"));
        }
        if topic.ends_with("/status") {
            most_in_status = most_in_status.max(v.get("takeovers").and_then(Value::as_i64).unwrap_or(0));
        }
    }
    assert!(takeovers >= 1, "a takeover is published as a session_taken_over event");
    assert!(named, "the event names the shared client id");
    assert!(most_in_status >= 1, "the status counts the takeovers");
    assert!(takeovers <= 8, "{takeovers} takeovers in {watch:?}: the clones do not back off");
}

/// Issue #40, item 2: a broker may assign its own keep-alive in its CONNACK (MQTT 5 Server Keep
/// Alive: EMQX's `mqtt.server_keepalive`, several cloud brokers), higher or lower than the
/// agent's. rumqttc pings at the broker's value; the link's silence check kept the agent's own,
/// so a broker assigning 60 s against the default 30 had a healthy idle link dropped every
/// 45.7 s before any PINGREQ (and a real broker published the Last Will each time). Here the
/// agent asks 5 s; the broker assigns 8 s (more than one and a half times 5), then, on the next
/// connection, 2 s, and closes a connection silent for one and a half of what it assigned, as
/// brokers do. Idle for several periods of each, there is one connection per setting, pinged at
/// the broker's period (counted in the broker's own clock), and the second CONNECT asks for the
/// agent's 5 s again, not the 8 the first broker assigned.
#[test]
fn the_agent_pings_and_watches_the_link_at_the_keep_alive_its_broker_assigns_higher_or_lower() {
    use test_kit::rogue_broker::{RogueBroker, Terms};
    let assigned = |secs| Terms { server_keep_alive: Some(secs), enforce_keep_alive: true, ..Terms::default() };
    let broker = RogueBroker::start_with(vec![assigned(8), assigned(2)]);
    // No telemetry: nothing but the pings goes to the broker while the agent is idle.
    let _agent = agent_with_mqtt(
        "dev-keepalive",
        &format!("broker = \"{}\"\nkeep_alive_s = 5\ntelemetry_interval_s = 0\n", broker.url()),
    );
    // Three and a half periods of 8 s: pings at 8, 16 and 24 s (at the agent's own 5 s there
    // would be five; with the silence check at 7.5 s, a second connection before the first). One
    // late ping is allowed for a loaded machine: a count, not a timing.
    let (first, second) = (Duration::from_secs(28), Duration::from_secs(11));
    assert!(
        broker.wait_for(Duration::from_secs(120), |s| s.connections.len() > 1
            || s.connections.first().is_some_and(|c| c.started.elapsed() >= first)),
        "the agent connects"
    );
    // (Read out of the broker's lock: an assertion failing under it would poison it.)
    let connections = broker.seen(|s| s.connections.clone());
    assert_eq!(connections.len(), 1, "one connection while idle for three periods of 8 s: {connections:?}");
    let c = &connections[0];
    assert_eq!(c.keep_alive, 5, "the agent asks for its own keep-alive");
    assert!(!c.expired, "the broker never found the link silent");
    let pings = c.pings_within(first);
    assert!((2..=3).contains(&pings), "PINGREQs every 8 s, the broker's period: {pings} in {first:?}: {:?}", c.pings);
    // The broker restarts and assigns 2 s: five periods and a half, pings at 2, 4, 6, 8 and 10 s
    // (at the agent's 5 s the broker would close the connection after 3 s).
    broker.drop_connection();
    assert!(
        broker.wait_for(Duration::from_secs(60), |s| s.connections.len() > 2
            || s.connections.get(1).is_some_and(|c| c.started.elapsed() >= second)),
        "the agent connects again"
    );
    let connections = broker.seen(|s| s.connections.clone());
    assert_eq!(connections.len(), 2, "one connection while idle for five periods of 2 s: {connections:?}");
    let c = &connections[1];
    assert_eq!(c.keep_alive, 5, "the agent asks for its own keep-alive again, not the one the last broker assigned");
    assert!(!c.expired, "the broker never found the link silent");
    let pings = c.pings_within(second);
    assert!((4..=5).contains(&pings), "PINGREQs every 2 s, the broker's period: {pings} in {second:?}: {:?}", c.pings);
}

/// Issue #40, item 2: a CONNACK with Receive Maximum 0 (a protocol error, MQTT 5 §3.2.2.3.3) left
/// the agent connected and silent: rumqttc read it as a window of no publish at all, so not one
/// subscription, status, reply or acknowledgement went out, while the pings kept the link alive.
/// The agent logs it and connects again; the next CONNACK, which names no Receive Maximum (so
/// rumqttc's own earlier 0 must not linger), is served: subscribed, online, a question answered.
#[test]
fn a_connack_with_receive_maximum_zero_makes_the_agent_connect_again_and_the_next_connection_serves() {
    use test_kit::rogue_broker::{RogueBroker, Terms};
    let broker =
        RogueBroker::start_with(vec![Terms { receive_maximum: Some(0), ..Terms::default() }, Terms::default()]);
    let _agent = Agent::start_at(&broker.url(), "dev-rm0", "keep_alive_s = 5\n[engine]\nbackend = \"null\"\n");
    let ask = "laya/v1/dev-rm0/ask";
    assert!(
        broker.wait_for(Duration::from_secs(60), |s| s.connacked(2) && s.subscriptions.iter().any(|t| t == ask)),
        "the agent drops the connection whose CONNACK says Receive Maximum 0 and subscribes on the next: {:?}",
        broker.seen(|s| (s.connections.clone(), s.subscriptions.clone()))
    );
    let reply_to = "laya/v1/reply/rogue/rm0";
    broker
        .ask(ask, &[(Encoding::Json.encode(&request("rm0")), reply_to.to_owned(), b"c".to_vec())])
        .expect("a question on the second connection");
    assert!(broker.wait_for(Duration::from_secs(60), |s| s.sent_on(reply_to) == 1), "the question is answered");
    let (connections, subscriptions, online) = broker.seen(|s| {
        let online = s.sent.iter().any(|p| {
            p.topic == "laya/v1/dev-rm0/status" && String::from_utf8_lossy(&p.payload).contains(r#""state":"online""#)
        });
        (s.connections.len(), s.subscriptions.clone(), online)
    });
    assert_eq!(connections, 2, "one connection refused, one served");
    assert_eq!(subscriptions.len(), 1, "nothing was sent on the first connection: {subscriptions:?}");
    assert!(online, "the status says online on the second connection");
}
