//! SIGHUP (`systemctl reload`): a new configuration and model started beside the serving engine,
//! taking over once healthy, bad reloads rejected while questions go on.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use laya_topics::Value;
use laya_topics::json;
use laya_topics::wire::Encoding;

/// What `c` receives until `done` holds for one message (decoded, with its topic), or `within`
/// passes: the messages, the last one the match (if any).
async fn collect_until(
    c: &mut Client,
    within: Duration,
    done: impl Fn(&str, &Value) -> bool,
) -> (Vec<(String, Value)>, bool) {
    let until = Instant::now() + within;
    let mut seen = Vec::new();
    while let Some(p) = c.next(until.saturating_duration_since(Instant::now())).await {
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let v = decode(&p);
        let hit = done(&topic, &v);
        seen.push((topic, v));
        if hit {
            return (seen, true);
        }
    }
    (seen, false)
}

fn is_event(topic: &str, v: &Value, kinds: &[&str]) -> bool {
    topic.ends_with("/events") && v.get("event").and_then(Value::as_str).is_some_and(|e| kinds.contains(&e))
}

/// Issue #31, defect 6: SIGHUP (`systemctl reload`, an OTA tool that installed a new model)
/// re-reads the configuration and the model, starts the new engine beside the serving one and
/// lets it take over only once its health call passed; a new engine that fails it, a change only
/// a restart applies, and a model that cannot be loaded are each rejected with a
/// `reload_rejected` event while the serving engine answers on. Every question asked around the
/// reloads is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_a_new_model_beside_the_serving_one_and_bad_reloads_are_rejected_while_questions_go_on() {
    let broker = Broker::start("reload", "");
    let engine = "[engine]\nbackend = \"null\"\n";
    let agent = Agent::start(&broker, "dev-reload", engine);
    let text = std::fs::read_to_string(&agent.config).expect("config");
    let pid = agent.child.as_ref().expect("running").id().to_string();
    let hup = || assert!(Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    let mut c = Client::connect(broker.port, "reload-asker").await;
    c.subscribe("laya/v1/reply/reload-asker/#").await;
    c.subscribe("laya/v1/dev-reload/events").await;
    wait_online(broker.port, "dev-reload").await;
    let mut asked = 0;
    let mut answered = HashSet::new();
    let note = |seen: &[(String, Value)], answered: &mut HashSet<String>| {
        for (t, v) in seen {
            if t.contains("/reply/") && v.get("answers").is_some() {
                answered.insert(v.get("id").and_then(Value::as_str).unwrap_or_default().to_owned());
            }
        }
    };

    // 1. A new engine whose every call fails: its health call fails, the reload is rejected.
    std::fs::write(
        &agent.config,
        text.replace(engine, "[engine]\nbackend = \"null\"\nnull_faults = \"error=fatal\"\n"),
    )
    .expect("config");
    hup();
    for _ in 0..5 {
        ask(&c, format!("q{asked}")).await;
        asked += 1;
    }
    let (seen, hit) =
        collect_until(&mut c, Duration::from_secs(90), |t, v| is_event(t, v, &["reloaded", "reload_rejected"])).await;
    note(&seen, &mut answered);
    let last = &seen.last().expect("a message").1;
    assert!(hit, "a verdict on the reload");
    assert_eq!(last.get("event").and_then(Value::as_str), Some("reload_rejected"), "{last:?}");
    assert!(text_of(last, "message").contains("health call"), "{last:?}");

    // 2. Another model: started beside the serving one, then serving; questions asked meanwhile
    // are answered.
    std::fs::write(&agent.config, text.replace("models/bpe-small", "models/wp-t4")).expect("config");
    hup();
    for _ in 0..10 {
        ask(&c, format!("q{asked}")).await;
        asked += 1;
    }
    let (seen, hit) =
        collect_until(&mut c, Duration::from_secs(90), |t, v| is_event(t, v, &["reloaded", "reload_rejected"])).await;
    note(&seen, &mut answered);
    let last = &seen.last().expect("a message").1;
    assert!(hit, "a verdict on the reload");
    assert_eq!(last.get("event").and_then(Value::as_str), Some("reloaded"), "{last:?}");
    assert!(text_of(last, "message").contains("wp-t4"), "{last:?}");

    // 3. A change only a restart applies, and 4. a model that cannot be loaded: rejected.
    for (changed, says) in [
        (
            text.replace("models/bpe-small", "models/wp-t4")
                .replace("telemetry_interval_s = 1", "telemetry_interval_s = 7"),
            "[mqtt]",
        ),
        (text.replace("models/bpe-small", "models/no-such-model"), "no-such-model"),
    ] {
        std::fs::write(&agent.config, changed).expect("config");
        hup();
        ask(&c, format!("q{asked}")).await;
        asked += 1;
        let (seen, hit) =
            collect_until(&mut c, Duration::from_secs(60), |t, v| is_event(t, v, &["reloaded", "reload_rejected"]))
                .await;
        note(&seen, &mut answered);
        let last = &seen.last().expect("a message").1;
        assert!(hit, "a verdict on the reload");
        assert_eq!(last.get("event").and_then(Value::as_str), Some("reload_rejected"), "{last:?}");
        assert!(text_of(last, "message").contains(says), "{last:?}");
    }

    // Every question answered (the stragglers too), by the model now serving.
    let (seen, _) = collect_until(&mut c, Duration::from_secs(30), |_, _| false).await;
    note(&seen, &mut answered);
    assert_eq!(answered.len(), asked, "every question asked around the reloads answered");
    let mut s = Client::connect(broker.port, "reload-status").await;
    s.subscribe("laya/v1/dev-reload/status").await;
    let status = decode(&s.next(Duration::from_secs(10)).await.expect("the retained status"));
    assert_eq!(text_of(&status, "model_name"), "wp-t4");
    assert_eq!(text_of(&status, "state"), "online", "SIGHUP never stopped the agent");
}

async fn ask(c: &Client, id: String) {
    let body = json::to_string(&request(&id), json::Style::COMPACT).into_bytes();
    let to = format!("laya/v1/reply/reload-asker/{id}");
    c.ask("laya/v1/dev-reload/ask", body, Some(&to), Some(id.as_bytes()), Encoding::Json).await
}

fn text_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}
