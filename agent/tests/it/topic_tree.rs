//! Where the agent listens and speaks: a fleet's shared subscription spreads questions over
//! its agents, and a custom prefix with its own response topics moves the whole topic tree.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::v5::Publish;

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_subscription_spreads_a_fleets_questions_over_three_agents() {
    let broker = Broker::start("fleet", "");
    let fleet = "[mqtt]\nfleet = \"north\"\nshare_group = \"workers\"\n[engine]\nbackend = \"null\"\n";
    // The [mqtt] table is already open in the agent's config: put the keys in it.
    let extra = fleet.replacen("[mqtt]\n", "", 1);
    let agents: Vec<Agent> = (0..3).map(|i| Agent::start(&broker, &format!("fleet-dev{i}"), &extra)).collect();
    for i in 0..3 {
        wait_online(broker.port, &format!("fleet-dev{i}")).await;
    }
    let mut c = Client::connect(broker.port, "fleet-asker").await;
    c.subscribe("laya/v1/reply/fleet-asker/#").await;
    let n = 60;
    for i in 0..n {
        let id = format!("f{i}");
        c.ask(
            "laya/v1/fleet/north/ask",
            Encoding::Json.encode(&request(&id)),
            Some(&format!("laya/v1/reply/fleet-asker/{id}")),
            None,
            Encoding::Json,
        )
        .await;
    }
    // Every reply, duplicates included: agents subscribed without `$share` would each answer
    // every question.
    let mut replies: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let distinct = |r: &[(String, String)]| r.iter().map(|(id, _)| id.clone()).collect::<HashSet<_>>().len();
    while distinct(&replies) < n && Instant::now() < deadline {
        if let Some(p) = c.next(Duration::from_secs(2)).await {
            replies.push(reply_id_and_device(&p));
        }
    }
    // Then keep listening: a second answer to any question may still be on its way.
    while let Some(p) = c.next(Duration::from_secs(2)).await {
        replies.push(reply_id_and_device(&p));
    }
    let mut per_id: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, device) in &replies {
        per_id.entry(id).or_default().push(device);
    }
    let twice: Vec<_> = per_id.iter().filter(|(_, d)| d.len() > 1).collect();
    assert!(twice.is_empty(), "questions answered more than once: {twice:?}");
    let missing: Vec<String> = (0..n).map(|i| format!("f{i}")).filter(|id| !per_id.contains_key(id.as_str())).collect();
    assert!(missing.is_empty(), "unanswered fleet questions: {missing:?}");
    assert_eq!(replies.len(), n, "exactly one reply per question: {replies:?}");
    let devices: HashSet<&str> = replies.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(devices.len(), 3, "the load is spread over all three agents: {devices:?}");
    drop(agents);
}

/// A reply's `id` and `device`.
fn reply_id_and_device(p: &Publish) -> (String, String) {
    let v = decode(p);
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    (field("id"), field("device"))
}

/// Waits until `{prefix}/{device}/status` says online (for a prefix of the test's own).
async fn wait_online_under(port: u16, prefix: &str, device: &str) {
    let mut c = Client::connect(port, &format!("online-{device}-{}", free_port())).await;
    c.subscribe(&format!("{prefix}/{device}/status")).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = c.next(deadline.saturating_duration_since(Instant::now())).await;
        let p = p.unwrap_or_else(|| panic!("{device} never came online under {prefix}"));
        if decode(&p).get("state") == Some(&Value::from("online")) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_prefix_and_response_topics_move_the_whole_topic_tree() {
    let broker = Broker::start("prefix", "");
    let mqtt = format!(
        "broker = \"{}\"\nprefix = \"acme/edge\"\nresponse_topics = [\"{{prefix}}/reply/+/inbox\"]\ntelemetry_interval_s = 1\n",
        broker.url()
    );
    let _agent = agent_with_mqtt("dev-prefix", &mqtt);
    let mut everything = Client::connect(broker.port, "prefix-everything").await;
    everything.subscribe("laya/#").await;
    wait_online_under(broker.port, "acme/edge", "dev-prefix").await;
    let mut c = Client::connect(broker.port, "prefix-asker").await;
    c.subscribe("acme/edge/#").await;
    // A response topic outside the configured filter (the default filter's shape) gets nothing.
    let default_shape = "acme/edge/reply/prefix-asker/p0";
    c.ask("acme/edge/dev-prefix/ask", Encoding::Json.encode(&request("p0")), Some(default_shape), None, Encoding::Json)
        .await;
    let inbox = "acme/edge/reply/c1/inbox";
    c.ask("acme/edge/dev-prefix/ask", Encoding::Json.encode(&request("p1")), Some(inbox), None, Encoding::Json).await;
    // Under the old prefix the agent neither listens nor speaks.
    c.ask("laya/v1/dev-prefix/ask", Encoding::Json.encode(&request("p2")), Some(inbox), None, Encoding::Json).await;
    let (mut replies, mut refused, mut telemetry, mut status) = (Vec::new(), Vec::new(), 0, 0);
    // Telemetry arrives every second: listen for a bounded time, not until silence.
    let until = Instant::now() + Duration::from_secs(8);
    while let Some(p) = c.next(until.saturating_duration_since(Instant::now())).await {
        match String::from_utf8_lossy(&p.topic).as_ref() {
            "acme/edge/dev-prefix/ask" => {}
            "acme/edge/dev-prefix/telemetry" => telemetry += 1,
            "acme/edge/dev-prefix/status" => status += 1,
            "acme/edge/dev-prefix/errors" => {
                refused.push(decode(&p).get("response_topic").and_then(Value::as_str).unwrap_or("?").to_owned())
            }
            topic => {
                replies.push((topic.to_owned(), decode(&p).get("id").and_then(Value::as_str).unwrap_or("?").to_owned()))
            }
        }
    }
    assert_eq!(replies, [(inbox.to_owned(), "p1".to_owned())], "one reply, on the allowed response topic");
    assert_eq!(refused, [default_shape], "the refused response topic is reported on the errors topic under acme/edge");
    assert!(telemetry >= 1 && status >= 1, "status and telemetry under acme/edge: {telemetry} {status}");
    let mut stray = Vec::new();
    while let Some(p) = everything.next(Duration::from_millis(100)).await {
        stray.push(String::from_utf8_lossy(&p.topic).into_owned());
    }
    // Only the test's own question under laya/v1, nothing from the agent.
    assert_eq!(stray, ["laya/v1/dev-prefix/ask"]);
}
