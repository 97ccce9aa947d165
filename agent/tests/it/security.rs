//! Who may read and forge what: a response topic outside the allowlist is never published to,
//! the shipped ACL (`config/mosquitto.acl`, what its generator writes) lets only devices answer,
//! clients read their own replies and operators the fleet, the `ask` command ignores a reply
//! another client reflected onto its response topic, and a question planted with the retain flag
//! is reported, never answered.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::PublishProperties;

use crate::support::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_topic_outside_the_allowlist_is_never_published_to() {
    let broker = Broker::start("allow", "");
    let _agent = Agent::start(&broker, "dev-allow", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-allow").await;
    let mut c = Client::connect(broker.port, "allow-asker").await;
    c.subscribe("factory/#").await;
    c.subscribe("laya/v1/reply/allow-asker/#").await;
    c.ask(
        "laya/v1/dev-allow/ask",
        Encoding::Json.encode(&request("evil")),
        Some("factory/valves/open"),
        None,
        Encoding::Json,
    )
    .await;
    c.ask(
        "laya/v1/dev-allow/ask",
        Encoding::Json.encode(&request("good")),
        Some("laya/v1/reply/allow-asker/good"),
        None,
        Encoding::Json,
    )
    .await;
    let p = c.next(Duration::from_secs(30)).await.expect("the allowed reply");
    assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/allow-asker/good");
    assert!(c.next(Duration::from_secs(2)).await.is_none(), "nothing on the refused topic");
}

/// The response topic and correlation data of the next question on `c`'s subscriptions.
async fn next_question(c: &mut Client, within: Duration) -> (String, Option<Vec<u8>>) {
    let p = c.next(within).await.expect("the question");
    let props = p.properties.expect("MQTT 5 properties");
    (props.response_topic.expect("a response topic"), props.correlation_data.map(|c| c.to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_reflected_onto_the_ask_commands_response_topic_is_ignored() {
    // Anyone may name another client's response topic: the device answers there with the
    // correlation data of the question it answers. Here a snooper learns the topic (no ACL), and a
    // hostile client's question, refused at once, is answered there before the genuine one
    // (which the backend takes 2 s to compute).
    let broker = Broker::start("reflect", "");
    let _agent = Agent::start(&broker, "dev-reflect", "[engine]\nbackend = \"null\"\nnull_faults = \"sleep=2000\"\n");
    wait_online(broker.port, "dev-reflect").await;
    let mut snooper = Client::connect(broker.port, "reflect-snooper").await;
    snooper.subscribe("laya/v1/dev-reflect/ask").await;
    let req = json::to_string(&request("genuine"), json::Style::COMPACT);
    let ask = std::process::Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args(["ask", "--broker", &broker.url(), "--device", "dev-reflect", "--username", "victim"])
        .args(["--timeout-s", "60", &req])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ask runs");
    let (victim_topic, victim_correlation) = next_question(&mut snooper, Duration::from_secs(30)).await;
    assert!(victim_topic.starts_with("laya/v1/reply/victim/"), "{victim_topic}");
    snooper.subscribe(&victim_topic).await;
    snooper
        .ask(
            "laya/v1/dev-reflect/ask",
            br#"{"id": "forged", "state": "s"}"#.to_vec(),
            Some(&victim_topic),
            Some(b"hostile"),
            Encoding::Json,
        )
        .await;
    // What reached the victim's topic, in order: the reflected reply first (the precondition of
    // this test), then the genuine one.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let p = snooper.next(Duration::from_secs(30)).await.expect("replies on the victim's topic");
        if String::from_utf8_lossy(&p.topic) == victim_topic {
            let correlation = p.properties.as_ref().and_then(|x| x.correlation_data.as_ref()).map(|c| c.to_vec());
            seen.push((decode(&p).get("id").cloned(), correlation));
        }
    }
    assert_eq!(seen[0], (Some(Value::from("forged")), Some(b"hostile".to_vec())), "{seen:?}");
    assert_eq!(seen[1], (Some(Value::from("genuine")), victim_correlation), "{seen:?}");
    let out = ask.wait_with_output().expect("ask exits");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json::parse(&out.stdout, ParseOptions::default()).expect("a JSON reply");
    assert_eq!(v.get("id"), Some(&Value::from("genuine")), "ask printed another question's reply: {v:?}");
    assert!(v.get("answers").is_some(), "{v:?}");
}

/// `laya-edge fleet --once --json` as `user`: the snapshot's row of `device`.
fn fleet_row(broker: &ShippedBroker, user: &str, password: &Path, device: &str) -> Value {
    let url = broker.url();
    let args = ["fleet", "--broker", &url, "--once", "--json", "--window-s", "3", "--username", user];
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    args.extend([std::ffi::OsStr::new("--password-file"), password.as_os_str()]);
    let (out, err, ok) = run_cli(&args, &[], "");
    assert!(ok, "fleet as {user}: {err}");
    let v = json::parse_str(out.trim(), ParseOptions::default()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let devices = v.get("devices").and_then(Value::as_array).expect("devices").to_vec();
    devices
        .into_iter()
        .find(|d| d.get("device") == Some(&Value::from(device)))
        .unwrap_or_else(|| panic!("{device} in {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_acl_lets_only_devices_answer_clients_read_their_own_replies_and_operators_the_fleet() {
    let users = [("board-7", "pw-device"), ("app-1", "pw-app-1"), ("app-2", "pw-app-2"), ("operator", "pw-operator")];
    let broker = ShippedBroker::start("shipped-acl", &users);
    let password = |user: &str| broker.password_file(user, users.iter().find(|(u, _)| *u == user).expect("a user").1);
    // The device: its first worker dies on its first question, so it has an event to publish.
    let once = broker.dir.join("once");
    let config = broker.dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"board-7\"\nusername = \"board-7\"\npassword_file = \"{}\"\ntelemetry_interval_s = 1\n[engine]\nbackend = \"null\"\nnull_faults = \"exit@2,once={}\"\n[model]\ndir = \"{}\"\n",
            broker.url(),
            password("board-7").display(),
            once.display(),
            model("bpe-small")
        ),
    )
    .expect("config");
    let login = |user: &'static str| Some((user, users.iter().find(|(u, _)| *u == user).expect("a user").1));
    let mut operator = Client::connect_as(broker.port, "ops-watch", login("operator")).await;
    for filter in ["laya/v1/+/status", "laya/v1/+/telemetry", "laya/v1/+/events"] {
        operator.subscribe(filter).await;
    }
    let mut app1 = Client::connect_as(broker.port, "app-1-client", login("app-1")).await;
    app1.subscribe("laya/v1/reply/app-1/#").await;
    app1.subscribe("laya/v1/+/telemetry").await;
    // app-2 tries to read everything it should not.
    let mut app2 = Client::connect_as(broker.port, "app-2-client", login("app-2")).await;
    for filter in
        ["laya/v1/reply/#", "laya/v1/reply/app-1/#", "laya/v1/+/telemetry", "laya/v1/+/events", "laya/v1/+/errors"]
    {
        app2.subscribe(filter).await;
    }
    let _agent = Agent::with_config(config, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = operator.next(deadline.saturating_duration_since(Instant::now())).await.expect("board-7 online");
        if String::from_utf8_lossy(&p.topic) == "laya/v1/board-7/status"
            && decode(&p).get("state") == Some(&Value::from("online"))
        {
            break;
        }
    }
    // app-2 asks first (its question kills the first worker: a restart event), then forges a
    // reply for app-1 and the device's own topics: the broker drops every forgery.
    app2.ask(
        "laya/v1/board-7/ask",
        Encoding::Json.encode(&request("a2")),
        Some("laya/v1/reply/app-2/a2"),
        Some(b"c-app-2"),
        Encoding::Json,
    )
    .await;
    let forged = b"forged".to_vec();
    for topic in [
        "laya/v1/reply/app-1/x",
        "laya/v1/board-7/status",
        "laya/v1/board-7/telemetry",
        "laya/v1/board-7/events",
        "laya/v1/board-7/reply/r1",
    ] {
        app2.client.publish(topic, QoS::AtLeastOnce, false, forged.clone()).await.expect("publish");
    }
    app1.ask(
        "laya/v1/board-7/ask",
        Encoding::Json.encode(&request("a1")),
        Some("laya/v1/reply/app-1/x"),
        Some(b"c-app-1"),
        Encoding::Json,
    )
    .await;
    // A question of app-2's naming app-1's response topic: the device answers there (it cannot
    // know who asks), with app-2's correlation data, which app-1 does not take for its own.
    app2.ask(
        "laya/v1/board-7/ask",
        Encoding::Json.encode(&request("a1")),
        Some("laya/v1/reply/app-1/x"),
        Some(b"c-app-2"),
        Encoding::Json,
    )
    .await;
    let mut app1_got = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    while app1_got.len() < 2 {
        let p = app1.next(until.saturating_duration_since(Instant::now())).await.expect("app-1's replies");
        assert_ne!(p.payload.as_ref(), forged.as_slice(), "app-1 received a forged reply on {:?}", p.topic);
        assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/app-1/x", "app-1 reads only its replies");
        let correlation = p.properties.as_ref().and_then(|x| x.correlation_data.as_ref()).map(|c| c.to_vec());
        app1_got.push((decode(&p).get("id").cloned(), correlation));
    }
    app1_got.sort_by(|a, b| a.1.cmp(&b.1));
    let a1 = Some(Value::from("a1"));
    assert_eq!(app1_got, [(a1.clone(), Some(b"c-app-1".to_vec())), (a1, Some(b"c-app-2".to_vec()))]);
    // The operator saw the device's telemetry and its restart event, and no forgery.
    let (mut telemetry, mut restart) = (false, false);
    let until = Instant::now() + Duration::from_secs(30);
    while !(telemetry && restart) {
        let p = operator
            .next(until.saturating_duration_since(Instant::now()))
            .await
            .unwrap_or_else(|| panic!("telemetry {telemetry}, restart event {restart}"));
        assert_ne!(p.payload.as_ref(), forged.as_slice(), "the operator received a forgery on {:?}", p.topic);
        match String::from_utf8_lossy(&p.topic).as_ref() {
            "laya/v1/board-7/telemetry" => telemetry = true,
            "laya/v1/board-7/events" => restart |= decode(&p).get("event") == Some(&Value::from("worker_restart")),
            _ => {}
        }
    }
    // And so does `laya-edge fleet` as the operator (telemetry: how busy, one restart); as a
    // client it sees only the status.
    let ops = fleet_row(&broker, "operator", &password("operator"), "board-7");
    assert!(ops.get("busy").is_some_and(|b| *b != Value::Null), "{ops:?}");
    assert_eq!(ops.get("restarts").and_then(Value::as_i64), Some(1), "{ops:?}");
    let client = fleet_row(&broker, "app-1", &password("app-1"), "board-7");
    assert_eq!(client.get("state"), Some(&Value::from("online")), "{client:?}");
    assert_eq!(client.get("busy"), Some(&Value::Null), "{client:?}");
    assert_eq!(client.get("restarts").and_then(Value::as_i64), Some(0), "{client:?}");
    // app-2 got its own reply and nothing else: not app-1's, not telemetry, events or errors.
    while let Some(p) = app2.next(Duration::from_secs(2)).await {
        assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/app-2/a2", "app-2 read {:?}", decode(&p));
    }
    while let Some(p) = app1.next(Duration::from_millis(200)).await {
        assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/app-1/x", "app-1 read {:?}", p.topic);
    }
}

#[test]
fn the_shipped_acl_is_what_its_generator_writes_for_the_fleet_it_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shipped = std::fs::read_to_string(root.join("config/mosquitto.acl")).expect("the ACL");
    let command = shipped.lines().next().and_then(|l| l.strip_prefix("# Generated by: python3 ")).expect("its command");
    let mut words = command.split_whitespace();
    let script = words.next().expect("the script");
    let out = Command::new("python3").arg(root.join(script)).args(words).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), shipped, "config/mosquitto.acl is stale: regenerate it");
}

/// Issue #40, item 3: any client allowed to ask could publish a question with the retain flag,
/// and the agent answered it again on every new session (1, 2, 3 replies to the victim over three
/// starts). Here it is planted live while the agent is subscribed (mosquitto clears the flag for
/// existing subscribers unless they asked for Retain As Published) and then sent by the broker at
/// each new subscription: three sessions (`session_expiry_s = 0`, each start a new one), a report
/// on the errors topic in each, nothing ever on the victim's topic, and the device answering its
/// own questions beside it. Then an operator clears it with an empty retained publish (reported
/// as such), and a fourth session gets nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_question_is_reported_once_a_session_and_never_answered() {
    let broker = Broker::start("retained", "");
    let device = "dev-retained";
    let ask = format!("laya/v1/{device}/ask");
    let config = agent_config(&broker.url(), device, "session_expiry_s = 0\n[engine]\nbackend = \"null\"\n");
    let mut victim = Client::connect(broker.port, "retained-victim").await;
    victim.subscribe("laya/v1/reply/victim/#").await;
    let mut errors = Client::connect(broker.port, "retained-errors").await;
    errors.subscribe(&format!("laya/v1/{device}/errors")).await;
    let hostile = Client::connect(broker.port, "retained-hostile").await;
    let planted_to = "laya/v1/reply/victim/planted";
    let props = PublishProperties {
        response_topic: Some(planted_to.into()),
        correlation_data: Some(b"hostile".to_vec().into()),
        content_type: Some(Encoding::Json.content_type().into()),
        ..PublishProperties::default()
    };
    for session in 1..=4 {
        let mut agent = Agent::with_config(config.clone(), Vec::new());
        wait_online(broker.port, device).await;
        if session == 1 {
            let planted = Encoding::Json.encode(&request("planted"));
            hostile
                .client
                .publish_with_properties(&ask, QoS::AtLeastOnce, true, planted, props.clone())
                .await
                .expect("publish");
        }
        if session <= 3 {
            let p =
                errors.next(Duration::from_secs(30)).await.unwrap_or_else(|| panic!("session {session}: no report"));
            let v = decode(&p);
            assert_eq!(v.get("id"), Some(&Value::from("planted")), "session {session}: {v:?}");
            let error = v.get("error").expect("an error");
            assert_eq!(error.get("code"), Some(&Value::from("bad_request")), "{v:?}");
            assert!(error.get("message").and_then(Value::as_str).is_some_and(|m| m.contains("retain flag")), "{v:?}");
            assert_eq!(v.get("response_topic"), Some(&Value::from(planted_to)), "{v:?}");
        }
        // The device answers a question of the victim's own; the planted question's topic gets
        // nothing before it.
        let marker = format!("laya/v1/reply/victim/marker-{session}");
        let body = Encoding::Json.encode(&request(&format!("marker-{session}")));
        victim.ask(&ask, body, Some(&marker), Some(b"m"), Encoding::Json).await;
        let p = victim.next(Duration::from_secs(30)).await.expect("the victim's own question answered");
        assert_eq!(String::from_utf8_lossy(&p.topic), marker, "session {session}: the planted question was answered");
        if session == 3 {
            // The operator's remedy (docs/security.md): an empty retained message clears it. The
            // agent sees that too, and says so.
            hostile.client.publish(&ask, QoS::AtLeastOnce, true, Vec::<u8>::new()).await.expect("publish");
            let p = errors.next(Duration::from_secs(30)).await.expect("the clearing reported");
            let v = decode(&p);
            let message = v.get("error").and_then(|e| e.get("message")).and_then(Value::as_str).unwrap_or_default();
            assert!(message.contains("cleared"), "{v:?}");
        }
        assert!(
            errors.next(Duration::from_secs(2)).await.is_none(),
            "session {session}: one report, and nothing delivered again"
        );
        assert!(agent.terminate().success(), "the agent stops cleanly");
    }
    assert!(victim.next(Duration::from_millis(500)).await.is_none(), "nothing more on the victim's topics");
}

/// Issue #40, item 3: a retained question is reported once a session. A copy the broker delivers
/// again in the same session (the connection dropped before the acknowledgement reached it, the
/// session kept: DUP and RETAIN set) is acknowledged without a second report; in a new session
/// the broker sends it at subscription again, and it is reported again. Never answered.
#[test]
fn a_retained_question_delivered_again_in_its_session_is_reported_once_and_again_in_a_new_session() {
    use test_kit::rogue_broker::{Flags, RogueBroker, Terms};
    let kept = Terms { session_present: true, ..Terms::default() };
    let broker = RogueBroker::start_with(vec![Terms::default(), kept, Terms::default()]);
    let device = "dev-rogue-retained";
    let _agent = Agent::start_at(&broker.url(), device, "keep_alive_s = 5\n[engine]\nbackend = \"null\"\n");
    let (ask, errors) = (format!("laya/v1/{device}/ask"), format!("laya/v1/{device}/errors"));
    let planted_to = "laya/v1/reply/victim/planted";
    let planted = [(Encoding::Json.encode(&request("planted")), planted_to.to_owned(), b"hostile".to_vec())];
    let retained = Flags { retain: true, dup: false };
    let subscribed = |s: &test_kit::rogue_broker::Seen, n| s.subscriptions.iter().filter(|t| **t == ask).count() == n;
    // Each acknowledgement follows its report on the wire: once acknowledged, the report is in.
    let acknowledged = |n: usize| broker.wait_for(Duration::from_secs(30), |s| s.acked >= n);

    // Session 1: sent at subscription.
    assert!(broker.wait_for(Duration::from_secs(60), |s| s.connacked(1) && subscribed(s, 1)), "the agent subscribes");
    broker.ask_flagged(&ask, &planted, retained).expect("sent");
    assert!(acknowledged(1), "the retained question is acknowledged");
    assert_eq!(broker.seen(|s| s.sent_on(&errors)), 1, "and reported");
    // The connection drops; the session is kept: the broker delivers it again.
    broker.drop_connection();
    assert!(broker.wait_for(Duration::from_secs(60), |s| s.connacked(2)), "the agent connects again");
    broker.ask_flagged(&ask, &planted, Flags { retain: true, dup: true }).expect("sent");
    assert!(acknowledged(2), "the copy is acknowledged");
    assert_eq!(broker.seen(|s| s.sent_on(&errors)), 1, "and not reported again in the same session");
    // A new session: subscribed again, sent at subscription again, reported again.
    broker.drop_connection();
    assert!(broker.wait_for(Duration::from_secs(60), |s| s.connacked(3) && subscribed(s, 2)), "a new session");
    broker.ask_flagged(&ask, &planted, retained).expect("sent");
    assert!(acknowledged(3), "acknowledged");
    let (reports, answers) = broker.seen(|s| (s.sent_on(&errors), s.sent_on(planted_to)));
    assert_eq!(reports, 2, "reported again in the new session");
    assert_eq!(answers, 0, "never answered");
}
