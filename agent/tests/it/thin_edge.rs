//! `[thin_edge]` (issue #42, item 4): a real `laya-edge serve` on a real mosquitto, watched as a
//! thin-edge fleet watches it (`tedge mqtt sub 'te/#'`): the service registered (retained), its
//! health up once it serves and down by the will when it is killed, up again when restarted,
//! down by the bridge itself when stopped; telemetry as measurements; reload outcomes as events;
//! registration and health published again after a broker restart.

use std::process::Command;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;

use crate::support::*;
use laya_topics::Value;
use laya_topics::json;

const ENTITY: &str = "te/device/main/service/laya-edge";
const HEALTH: &str = "te/device/main/service/laya-edge/status/health";
const MEASUREMENT: &str = "te/device/main/service/laya-edge/m/laya_edge";
/// The agents' extra config: the null backend and the publication on.
const THIN_EDGE: &str = "[engine]\nbackend = \"null\"\n[thin_edge]\nenabled = true\n";

/// A client that sees everything under `te/`, retained messages first.
async fn watch(port: u16, id: &str) -> Client {
    let c = Client::connect(port, id).await;
    c.subscribe("te/#").await;
    c
}

/// A message as the watcher saw it: topic, document (none for an empty payload), retain flag.
struct Seen {
    topic: String,
    doc: Option<Value>,
    retain: bool,
}

fn seen(p: &Publish) -> Seen {
    Seen {
        topic: String::from_utf8_lossy(&p.topic).into_owned(),
        doc: json::parse(&p.payload, Default::default()).ok(),
        retain: p.retain,
    }
}

/// The next message on `topic` whose document `want` accepts, within 60 s (panics naming `what`
/// and what came instead).
async fn next_on(c: &mut Client, topic: &str, what: &str, want: impl Fn(&Value) -> bool) -> Seen {
    let until = Instant::now() + Duration::from_secs(60);
    let mut other = Vec::new();
    while let Some(p) = c.next(until.saturating_duration_since(Instant::now())).await {
        let s = seen(&p);
        if s.topic == topic && s.doc.as_ref().is_some_and(&want) {
            return s;
        }
        other.push(format!("{} {}", s.topic, String::from_utf8_lossy(&p.payload)));
    }
    panic!("no {what} on {topic}; saw:\n{}", other.join("\n"));
}

fn status_is(v: &Value, status: &str) -> bool {
    v.get("status").and_then(Value::as_str) == Some(status)
}

/// The will's `down` has neither a time nor a pid; the bridge's own health messages have both.
fn is_will(v: &Value) -> bool {
    status_is(v, "down") && v.get("time").is_none() && v.get("pid").is_none()
}

fn is_bridges(v: &Value, status: &str) -> bool {
    status_is(v, status) && v.get("time").and_then(Value::as_i64).is_some() && v.get("pid").is_some()
}

fn text_of(v: &Value) -> &str {
    v.get("text").and_then(Value::as_str).unwrap_or_default()
}

/// Every value a number, or an object of numbers (thin-edge's measurement: one level of groups).
fn only_numbers(v: &Value) -> bool {
    let number = |x: &Value| matches!(x, Value::Int(_) | Value::Float(_));
    v.as_object().is_some_and(|m| {
        m.values().all(|x| number(x) || x.as_object().is_some_and(|g| !g.is_empty() && g.values().all(number)))
    })
}

fn hup(agent: &Agent) {
    let pid = agent.child.as_ref().expect("running").id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
}

/// The bridge's DISCONNECT in the broker's log after `from` bytes of it, and no unclean end of
/// its connection (which would have fired the will).
/// The broker logs the end of the connection once it has read it, which may be after the agent
/// has exited: the log is read until it tells how the connection ended (a bound for a broken
/// agent only).
fn assert_clean_disconnect(broker: &Broker, from: usize, client_id: &str) {
    let unclean = ["closed its connection", "disconnected due to", "disconnected: ", "exceeded timeout"]
        .map(|u| format!("Client {client_id} {u}"));
    let clean = format!("Received DISCONNECT from {client_id}\n");
    let ended = |log: &str| log.contains(&clean) || unclean.iter().any(|u| log.contains(u.as_str()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = broker.log().get(from..).unwrap_or_default().to_owned();
    while !ended(&log) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        log = broker.log().get(from..).unwrap_or_default().to_owned();
    }
    assert!(log.contains(&clean), "no DISCONNECT in\n{log}");
    for line in &unclean {
        assert!(!log.contains(line.as_str()), "{line:?} in\n{log}");
    }
}

/// Registration (retained, as thin-edge's own services register), health `up` once the agent
/// serves, telemetry's numbers as measurements, and each reload's outcome as an event naming it
/// and the model that serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_edge_fleet_sees_the_agent_registered_up_measured_and_each_reload_outcome() {
    let broker = Broker::start("tedge-sees", "");
    let mut c = watch(broker.port, "tedge-sees-watch").await;
    let agent = Agent::start(&broker, "dev-tedge-sees", THIN_EDGE);

    let reg =
        next_on(&mut c, ENTITY, "registration", |v| v.get("@type").and_then(Value::as_str) == Some("service")).await;
    let reg = reg.doc.expect("a document");
    assert_eq!(reg.get("name").and_then(Value::as_str), Some("laya-edge"), "{reg:?}");
    assert_eq!(reg.get("@parent").and_then(Value::as_str), Some("device/main//"), "{reg:?}");
    next_on(&mut c, HEALTH, "health up", |v| is_bridges(v, "up")).await;
    // Both are retained: a client that comes later (thin-edge's mapper after a restart) reads them.
    let mut late = watch(broker.port, "tedge-sees-late").await;
    let r = next_on(&mut late, ENTITY, "the retained registration", |v| v.get("@type").is_some()).await;
    assert!(r.retain, "the registration is retained");
    let h = next_on(&mut late, HEALTH, "the retained health", |v| status_is(v, "up")).await;
    assert!(h.retain, "the health is retained");

    let m = next_on(&mut c, MEASUREMENT, "a measurement", |v| v.get("uptime_s").is_some()).await;
    let m = m.doc.expect("a document");
    assert!(only_numbers(&m), "a thin-edge measurement has only numbers and groups of numbers: {m:?}");
    for group in ["token_memo", "rss_kb"] {
        assert!(m.get(group).and_then(Value::as_object).is_some(), "{group} as a group: {m:?}");
    }

    // A changed model: `reloaded`, naming it.
    let text = std::fs::read_to_string(&agent.config).expect("config");
    std::fs::write(&agent.config, text.replace("models/bpe-small", "models/wp-t4")).expect("config");
    hup(&agent);
    let e = next_on(&mut c, &format!("{ENTITY}/e/reloaded"), "a reloaded event", |_| true).await;
    let e = e.doc.expect("a document");
    assert!(text_of(&e).starts_with("reloaded (reload request 1)"), "{e:?}");
    assert!(text_of(&e).contains("serving wp-t4"), "{e:?}");
    assert_eq!(e.get("serving").and_then(|s| s.get("name")).and_then(Value::as_str), Some("wp-t4"), "{e:?}");
    // A model that cannot be loaded: `reload_rejected`, the old one serving on.
    std::fs::write(&agent.config, text.replace("models/bpe-small", "models/no-such-model")).expect("config");
    hup(&agent);
    let e = next_on(&mut c, &format!("{ENTITY}/e/reload_rejected"), "a reload_rejected event", |_| true).await;
    let e = e.doc.expect("a document");
    assert!(text_of(&e).starts_with("reload_rejected (reload request 2)"), "{e:?}");
    assert!(text_of(&e).contains("no-such-model") && text_of(&e).contains("serving wp-t4"), "{e:?}");
}

/// SIGKILL: the broker publishes the bridge's will, `down`; a restarted agent is `up` again;
/// SIGTERM: the bridge publishes `down` itself and disconnects cleanly (no will).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_is_down_by_its_will_up_again_when_restarted_and_a_stopped_one_says_down_itself() {
    let broker = Broker::start("tedge-life", "log_type all\n");
    let mut c = watch(broker.port, "tedge-life-watch").await;
    let mut agent = Agent::start(&broker, "dev-tedge-life", THIN_EDGE);
    next_on(&mut c, HEALTH, "health up", |v| is_bridges(v, "up")).await;

    agent.kill9();
    next_on(&mut c, HEALTH, "the will's down", is_will).await;

    agent.launch();
    next_on(&mut c, HEALTH, "health up after the restart", |v| is_bridges(v, "up")).await;

    let from = broker.log().len();
    let status = agent.terminate();
    assert!(status.success(), "{status:?}");
    next_on(&mut c, HEALTH, "the bridge's own down", |v| is_bridges(v, "down")).await;
    assert_clean_disconnect(&broker, from, "laya-edge-dev-tedge-life-tedge");
    // And the health thin-edge keeps is the bridge's down, not the will's.
    let mut late = watch(broker.port, "tedge-life-late").await;
    let h = next_on(&mut late, HEALTH, "the retained health", |v| status_is(v, "down")).await;
    assert!(h.doc.as_ref().is_some_and(|v| is_bridges(v, "down")), "{:?}", h.doc);
}

/// A broker that restarted without the registration and the health (deleted here before the
/// restart) gets both again from the bridge when it reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_broker_restart_the_registration_and_the_health_are_published_again() {
    let mut broker = Broker::start("tedge-restart", "");
    let mut c = watch(broker.port, "tedge-restart-watch").await;
    let _agent = Agent::start(&broker, "dev-tedge-restart", THIN_EDGE);
    next_on(&mut c, ENTITY, "registration", |v| v.get("@type").is_some()).await;
    next_on(&mut c, HEALTH, "health up", |v| is_bridges(v, "up")).await;
    drop(c);

    // Forget both (an empty retained message deletes one; the marker comes back once the
    // broker has handled them), and see that they are gone, then restart the broker.
    let mut eraser = Client::connect(broker.port, "tedge-restart-eraser").await;
    let marker = "tedge-restart/marker";
    eraser.subscribe(marker).await;
    for topic in [ENTITY, HEALTH] {
        eraser.client.publish(topic, QoS::AtLeastOnce, true, Vec::new()).await.expect("publish");
    }
    eraser.client.publish(marker, QoS::AtLeastOnce, false, b"{}".to_vec()).await.expect("publish");
    assert!(eraser.next(Duration::from_secs(10)).await.is_some(), "the marker");
    let mut check = watch(broker.port, "tedge-restart-check").await;
    check.subscribe(marker).await;
    check.client.publish(marker, QoS::AtLeastOnce, false, b"{}".to_vec()).await.expect("publish");
    while let Some(p) = check.next(Duration::from_secs(10)).await {
        let s = seen(&p);
        assert!(s.topic != ENTITY && s.topic != HEALTH, "{} still retained", s.topic);
        if s.topic == marker {
            break;
        }
    }
    drop((eraser, check));
    broker.restart();

    let mut c = watch(broker.port, "tedge-restart-after").await;
    next_on(&mut c, ENTITY, "the registration again", |v| v.get("@type").and_then(Value::as_str) == Some("service"))
        .await;
    next_on(&mut c, HEALTH, "health up again", |v| is_bridges(v, "up")).await;
}
