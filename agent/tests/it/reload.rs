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

/// The reload events `seen` carries, in order: (event, request number, model).
fn reload_outcomes(seen: &[(String, Value)]) -> Vec<(String, i64, String)> {
    seen.iter()
        .filter(|(t, v)| is_event(t, v, &["reloaded", "reload_rejected", "reload_superseded"]))
        .map(|(_, v)| {
            let reload = v.get("reload").cloned().unwrap_or(Value::Null);
            (
                text_of(v, "event"),
                reload.get("request").and_then(Value::as_i64).unwrap_or(-1),
                reload.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Waits until `pid` has `n` live children (its workers), for up to `within`.
async fn until_children(pid: u32, n: usize, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if children(pid).len() == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn status_of(port: u16, device: &str) -> Value {
    let mut s = Client::connect(port, &format!("{device}-status-{}", free_port())).await;
    s.subscribe(&format!("laya/v1/{device}/status")).await;
    decode(&s.next(Duration::from_secs(10)).await.expect("the retained status"))
}

/// Issue #40, item 1: a reload is a transaction and the last one wins. A reload whose model
/// takes seconds to load is superseded by a newer one that loads at once: the older candidate's
/// worker is stopped and named by a `reload_superseded` event, the newer one serves, and when
/// the older one's load time has passed nothing else happens: it never takes over (it did: the
/// agent served the first configuration while the file named the second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_slower_reload_is_superseded_by_a_newer_one_and_never_overtakes_it() {
    let broker = Broker::start("reload-race", "");
    let engine = "[engine]\nbackend = \"null\"\n";
    let agent = Agent::start(&broker, "dev-race", engine);
    let text = std::fs::read_to_string(&agent.config).expect("config");
    let pid = agent.child.as_ref().expect("running").id();
    let hup = || assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().expect("kill").success());
    let mut c = Client::connect(broker.port, "race-asker").await;
    c.subscribe("laya/v1/reply/race-asker/#").await;
    c.subscribe("laya/v1/dev-race/events").await;
    wait_online(broker.port, "dev-race").await;
    assert!(until_children(pid, 1, Duration::from_secs(30)).await, "one serving worker");

    // 1. wp-t4, whose engine takes 8 s to load: its candidate worker starts beside the serving one.
    // Every call its workers get is recorded: none may ever reach it.
    let record = temp_dir("reload-race-record").join("calls");
    let slow = format!("[engine]\nbackend = \"null\"\nnull_faults = \"load-sleep=8000,record={}\"\n", record.display());
    std::fs::write(&agent.config, text.replace(engine, &slow).replace("models/bpe-small", "models/wp-t4"))
        .expect("config");
    hup();
    assert!(until_children(pid, 2, Duration::from_secs(30)).await, "the first reload's candidate is loading");

    // 2. bpe-t5, loading at once, while the first is still loading.
    std::fs::write(&agent.config, text.replace("models/bpe-small", "models/bpe-t5")).expect("config");
    hup();
    for i in 0..5 {
        ask_as(&c, "race-asker", "dev-race", format!("r{i}")).await;
    }
    let (mut seen, hit) =
        collect_until(&mut c, Duration::from_secs(60), |t, v| is_event(t, v, &["reloaded", "reload_rejected"])).await;
    assert!(hit, "a verdict on the second reload: {:?}", reload_outcomes(&seen));
    let outcomes = reload_outcomes(&seen);
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert_eq!((outcomes[0].0.as_str(), outcomes[0].1), ("reload_superseded", 1), "{outcomes:?}");
    assert!(outcomes[0].2.ends_with("wp-t4"), "{outcomes:?}");
    assert_eq!((outcomes[1].0.as_str(), outcomes[1].1), ("reloaded", 2), "{outcomes:?}");
    assert!(outcomes[1].2.ends_with("bpe-t5"), "{outcomes:?}");

    // The superseded candidate's worker is gone; after its load time nothing else happens.
    assert!(until_children(pid, 1, Duration::from_secs(30)).await, "only the serving worker left: {:?}", children(pid));
    let (later, hit) = collect_until(&mut c, Duration::from_secs(12), |t, v| {
        is_event(t, v, &["reloaded", "reload_rejected", "reload_superseded"])
    })
    .await;
    assert!(!hit, "no outcome after the last request's: {:?}", reload_outcomes(&later));
    let calls = std::fs::read_to_string(&record).unwrap_or_default();
    assert!(calls.is_empty(), "the superseded candidate was stopped while loading, never called: {calls}");
    seen.extend(later);
    let status = status_of(broker.port, "dev-race").await;
    assert_eq!(text_of(&status, "model_name"), "bpe-t5", "the last configuration read serves");
    let answered: HashSet<String> = seen
        .iter()
        .filter(|(t, v)| t.contains("/reply/") && v.get("answers").is_some())
        .map(|(_, v)| text_of(v, "id"))
        .collect();
    assert_eq!(answered.len(), 5, "every question answered: {answered:?}");
}

/// Issue #40, item 1: ten SIGHUPs in a row with slow-loading models never start more than one
/// candidate beside the serving worker (they started one each: nine models loaded at once), each
/// request is settled by exactly one event, and the last one serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_reloads_in_a_row_load_one_candidate_at_a_time_and_settle_each_request_once() {
    let broker = Broker::start("reload-storm", "");
    let engine = "[engine]\nbackend = \"null\"\n";
    let agent = Agent::start(&broker, "dev-storm", engine);
    let text = std::fs::read_to_string(&agent.config).expect("config");
    let pid = agent.child.as_ref().expect("running").id();
    let mut c = Client::connect(broker.port, "storm-asker").await;
    c.subscribe("laya/v1/reply/storm-asker/#").await;
    c.subscribe("laya/v1/dev-storm/events").await;
    wait_online(broker.port, "dev-storm").await;

    // The agent's workers, counted every few milliseconds while the reloads come.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(children(pid).len());
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        }
    });
    let slow = "[engine]\nbackend = \"null\"\nnull_faults = \"load-sleep=3000\"\n";
    let models = ["models/wp-t4", "models/bpe-t5"];
    for i in 0..10 {
        let model = models[i % 2];
        std::fs::write(&agent.config, text.replace(engine, slow).replace("models/bpe-small", model)).expect("config");
        assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().expect("kill").success());
        ask_as(&c, "storm-asker", "dev-storm", format!("s{i}")).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let (mut seen, hit) =
        collect_until(&mut c, Duration::from_secs(60), |t, v| is_event(t, v, &["reloaded", "reload_rejected"])).await;
    assert!(hit, "a verdict on the last reload: {:?}", reload_outcomes(&seen));
    let (later, _) = collect_until(&mut c, Duration::from_secs(8), |_, _| false).await;
    seen.extend(later);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = sampler.join().expect("sampler");
    assert!(most <= 2, "at most the serving worker and one candidate at once, saw {most}");

    let outcomes = reload_outcomes(&seen);
    let last = outcomes.iter().map(|o| o.1).max().expect("outcomes");
    let mut requests: Vec<i64> = outcomes.iter().map(|o| o.1).collect();
    requests.sort_unstable();
    assert_eq!(requests, (1..=last).collect::<Vec<_>>(), "each request settled exactly once: {outcomes:?}");
    for (event, request, _) in &outcomes {
        let want = if *request == last { "reloaded" } else { "reload_superseded" };
        assert_eq!(event, want, "{outcomes:?}");
    }
    assert!(last >= 2, "several requests (SIGHUPs coming while one is read are one): {outcomes:?}");
    let status = status_of(broker.port, "dev-storm").await;
    assert_eq!(text_of(&status, "model_name"), "bpe-t5", "the last configuration read serves");
    let answered: HashSet<String> = seen
        .iter()
        .filter(|(t, v)| t.contains("/reply/") && v.get("answers").is_some())
        .map(|(_, v)| text_of(v, "id"))
        .collect();
    assert_eq!(answered.len(), 10, "every question answered: {answered:?}");
}

async fn ask_as(c: &Client, asker: &str, device: &str, id: String) {
    let body = json::to_string(&request(&id), json::Style::COMPACT).into_bytes();
    let to = format!("laya/v1/reply/{asker}/{id}");
    c.ask(&format!("laya/v1/{device}/ask"), body, Some(&to), Some(id.as_bytes()), Encoding::Json).await
}
