//! One question round trip through `laya-edge serve` on the CPU backend, then its worker process
//! is killed and the next question is answered by the worker that replaces it, each answer equal
//! to the in-process CPU pipeline's. tools/cross/aarch64.sh runs this with an aarch64 agent under
//! qemu-user against the x86 broker, so it proves the board's binary speaks MQTT, supervises its
//! worker and computes the same answers.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

/// The arguments process `pid` was started with (`/proc/PID/cmdline`).
fn cmdline(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// Asserts that process `pid` runs the `laya-edge` under test: its path is the first argument,
/// or under binfmt_misc emulation the second (the kernel starts `qemu-aarch64 PATH ARGS...`). With
/// `LAYA_EDGE_BIN` set, this is what proves the emulated run did not fall back to the x86 build.
fn assert_runs_laya_edge(pid: u32, what: &str) {
    let bin = test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge"));
    let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
    let args = cmdline(pid);
    let runs = args.iter().take(2).any(|a| std::fs::canonicalize(a).is_ok_and(|a| a == bin));
    assert!(runs, "the {what} (pid {pid}) does not run {}: {args:?}", bin.display());
}

/// The answers the CPU pipeline gives `request` in this process.
fn cpu_answers(request: &Value) -> String {
    let dir = model("bpe-small");
    let bundle = laya_edge::bundle::HostBundle::load(Path::new(&dir)).expect("bundle");
    let mut cpu = laya_edge::backend::cpu::CpuBackend::load(Path::new(&dir), &bundle.config).expect("cpu");
    let request = laya_topics::Request::from_value(request.clone()).expect("request");
    let result = laya_edge::pipeline::answer(&bundle, &mut cpu, &request).expect("answer").to_value();
    text(result.get("answers").expect("answers"))
}

async fn ask(c: &mut Client, id: &str) -> Value {
    let reply_to = format!("laya/v1/reply/rs-asker/{id}");
    let body = Encoding::Json.encode(&request(id));
    c.ask("laya/v1/dev-rs/ask", body, Some(&reply_to), None, Encoding::Json).await;
    let p = c.next(Duration::from_secs(120)).await.unwrap_or_else(|| panic!("no reply to {id}"));
    decode(&p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_like_the_cpu_pipeline_before_and_after_its_worker_is_killed() {
    let broker = Broker::start("serve-restart", "");
    let mut agent = Agent::start(&broker, "dev-rs", "");
    wait_online(broker.port, "dev-rs").await;
    let mut c = Client::connect(broker.port, "rs-asker").await;
    c.subscribe("laya/v1/reply/rs-asker/#").await;

    let first = ask(&mut c, "before").await;
    assert_eq!(first.get("id"), Some(&Value::from("before")));
    assert_eq!(text(first.get("answers").expect("answers")), cpu_answers(&request("before")));

    let pid = agent.child.as_ref().expect("the agent runs").id();
    let workers = children(pid);
    assert_eq!(workers.len(), 1, "one worker process under the agent: {workers:?}");
    assert_runs_laya_edge(pid, "agent");
    assert_runs_laya_edge(workers[0], "worker");
    let killed = std::process::Command::new("kill").args(["-KILL", &workers[0].to_string()]).status();
    assert!(killed.is_ok_and(|s| s.success()), "kill -9 the worker");

    let second = ask(&mut c, "after").await;
    assert_eq!(second.get("id"), Some(&Value::from("after")));
    assert_eq!(text(second.get("answers").expect("answers")), cpu_answers(&request("after")));
    // A new worker answered it.
    let t = Instant::now();
    let now = loop {
        let now = children(pid);
        if now.len() == 1 || t.elapsed() > Duration::from_secs(10) {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], workers[0], "the killed worker was replaced");
    assert_runs_laya_edge(now[0], "new worker");
    assert!(agent.alive(), "the agent itself never went down");
}
