//! `laya-edge model` on a model store (issue #42): installs that wait for the running agent's
//! outcome, a rejected version put back, rollback and commit, `list`, and every question asked
//! meanwhile answered once.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;
use laya_topics::Value;
use laya_topics::json;
use laya_topics::wire::Encoding;

/// Runs `laya-edge model ARGS...` off the runtime's threads.
async fn model_cli(args: Vec<std::ffi::OsString>) -> (String, String, bool) {
    tokio::task::spawn_blocking(move || {
        let mut all: Vec<&OsStr> = vec![OsStr::new("model")];
        all.extend(args.iter().map(|a| a.as_os_str()));
        run_cli(&all, &[], "")
    })
    .await
    .expect("the model command")
}

fn args(words: &[&dyn AsRef<OsStr>]) -> Vec<std::ffi::OsString> {
    words.iter().map(|w| w.as_ref().to_owned()).collect()
}

/// `model list`'s lines as (version, marks).
async fn listed(store: &Path) -> Vec<(String, String)> {
    let (out, err, ok) = model_cli(args(&[&"list", &"--store", &store])).await;
    assert!(ok, "model list: {err}");
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 3, "name, sha256, marks: {l:?}");
            assert!(f[1].len() == 64 || f[1] == "-", "a sha256: {l:?}");
            (f[0].to_owned(), f[2].to_owned())
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// A copy of checkpoint `name` whose weights are all zero: it loads and passes `check` (the
/// header and sizes are the original's), and answers every row alike.
fn constant_copy(name: &str) -> PathBuf {
    let from = PathBuf::from(model(name));
    let to = temp_dir("constant-model").join(name);
    copy_dir(&from, &to);
    let weights = to.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).expect("weights");
    let header = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    bytes[8 + header..].fill(0);
    std::fs::write(&weights, bytes).expect("weights");
    to
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for e in std::fs::read_dir(from).expect("read").flatten() {
        let (s, d) = (e.path(), to.join(e.file_name()));
        if s.is_dir() { copy_dir(&s, &d) } else { std::fs::copy(&s, &d).map(|_| ()).expect("copy") }
    }
}

async fn status_of(port: u16, device: &str) -> Value {
    let mut s = Client::connect(port, &format!("{device}-status-{}", free_port())).await;
    s.subscribe(&format!("laya/v1/{device}/status")).await;
    decode(&s.next(Duration::from_secs(10)).await.expect("the retained status"))
}

async fn model_name(port: u16, device: &str) -> String {
    let status = status_of(port, device).await;
    status.get("model_name").and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// Reads `c`'s replies until `asked` distinct questions are answered and nothing more comes
/// (3 s of quiet after the last), then asserts each was answered exactly once.
async fn each_answered_once(c: &mut Client, asked: usize) {
    let mut replies: HashMap<String, usize> = HashMap::new();
    while let Some(p) = c.next(Duration::from_secs(if replies.len() < asked { 30 } else { 3 })).await {
        let v = decode(&p);
        if v.get("answers").is_some() {
            *replies.entry(v.get("id").and_then(Value::as_str).unwrap_or_default().to_owned()).or_default() += 1;
        }
    }
    assert_eq!(replies.len(), asked, "every question answered: {replies:?}");
    assert!(replies.values().all(|&k| k == 1), "each exactly once: {replies:?}");
}

/// Issue #42, item 1: `model install` with no agent installs and switches `current`; with one it
/// exits 0 only once the new version serves, and when the agent rejects a version (weights that
/// answer every row alike fail the health call) it exits non-zero with the reason, the store is
/// back as it was and the old version serves on; `rollback` and `commit` move the links the same
/// way; `list` marks what serves. Every question asked throughout is answered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_install_serves_a_good_version_puts_a_rejected_one_back_and_every_question_is_answered_once() {
    let store = temp_dir("model-store").join("models");

    // 1. No agent: installed, current, nothing else.
    let (out, err, ok) =
        model_cli(args(&[&"install", &"--store", &store, &model("bpe-small"), &"--version", &"v1"])).await;
    assert!(ok, "install without an agent: {out} {err}");
    assert!(out.contains("no agent runs on this store"), "{out}");
    assert_eq!(listed(&store).await, pairs(&[("v1", "current")]));

    // 2. An agent serving the store's current version.
    let broker = Broker::start("model-store", "");
    let extra = format!("[engine]\nbackend = \"cpu\"\n[model]\nstore = \"{}\"\n", store.display());
    let agent = Agent::start(&broker, "dev-store", &extra);
    wait_online(broker.port, "dev-store").await;
    assert_eq!(model_name(broker.port, "dev-store").await, "v1");
    assert_eq!(listed(&store).await, pairs(&[("v1", "serving,current")]));

    // Questions asked before each step, in flight while it runs; answered by the end.
    let mut c = Client::connect(broker.port, "store-asker").await;
    c.subscribe("laya/v1/reply/store-asker/#").await;
    let mut asked = 0;
    let mut ask_some = async |c: &Client| {
        for _ in 0..5 {
            let id = format!("m{asked}");
            let body = json::to_string(&request(&id), json::Style::COMPACT).into_bytes();
            let to = format!("laya/v1/reply/store-asker/{id}");
            c.ask("laya/v1/dev-store/ask", body, Some(&to), Some(id.as_bytes()), Encoding::Json).await;
            asked += 1;
        }
    };

    // 3. A good version: the command returns once it serves.
    let mut watch = Client::connect(broker.port, "store-watch").await;
    watch.subscribe("laya/v1/dev-store/events").await;
    watch.subscribe("laya/v1/dev-store/telemetry").await;
    ask_some(&c).await;
    let (out, err, ok) = model_cli(args(&[&"install", &"--store", &store, &model("wp-t4"), &"--version", &"v2"])).await;
    assert!(ok, "install of a good version: {out} {err}");
    assert!(out.contains("v2 serves"), "{out}");
    // Issue #42, item 2: the reload's event and the telemetry name what serves now.
    let (mut event, mut telemetry) = (None, None);
    while event.is_none() || telemetry.is_none() {
        let p = watch.next(Duration::from_secs(10)).await.expect("the reload's event and telemetry");
        let v = decode(&p);
        let version = |k: &str| v.get(k).and_then(|m| m.get("version")).and_then(Value::as_str).map(str::to_owned);
        if p.topic.ends_with(b"/events") && v.get("event").and_then(Value::as_str) == Some("reloaded") {
            event = version("serving");
            assert!(
                v.get("serving").and_then(|s| s.get("since")).and_then(Value::as_i64).is_some_and(|t| t > 0),
                "{v:?}"
            );
        } else if p.topic.ends_with(b"/telemetry") && version("model").as_deref() == Some("v2") {
            telemetry = version("model");
        }
    }
    assert_eq!(event.as_deref(), Some("v2"));
    assert_eq!(model_name(broker.port, "dev-store").await, "v2");
    assert_eq!(listed(&store).await, pairs(&[("v1", "previous"), ("v2", "serving,current,pending")]));
    let (_, err, ok) = model_cli(args(&[&"commit", &"--store", &store])).await;
    assert!(ok, "commit: {err}");
    assert_eq!(listed(&store).await, pairs(&[("v1", ""), ("v2", "serving,current")]));

    // 4. A version the agent rejects: non-zero, the reason, the store as it was, v2 serving.
    let bad = constant_copy("bpe-small");
    ask_some(&c).await;
    let (out, err, ok) = model_cli(args(&[&"install", &"--store", &store, &bad, &"--version", &"v3"])).await;
    assert!(!ok, "install of a rejected version must fail: {out}");
    assert!(err.contains("rejected") && err.contains("back as it was"), "{err}");
    assert_eq!(listed(&store).await, pairs(&[("v1", ""), ("v2", "serving,current")]));
    assert_eq!(model_name(broker.port, "dev-store").await, "v2");
    // Issue #42, item 2: the status says what serves, since when, and the last reload's outcome.
    let status = status_of(broker.port, "dev-store").await;
    assert_eq!(status.get("model_version").and_then(Value::as_str), Some("v2"), "{status:?}");
    assert!(status.get("serving_since").and_then(Value::as_i64).is_some_and(|t| t > 1_700_000_000), "{status:?}");
    // The last reload: the one the failed install asked for after putting the store back (v3's
    // own was rejected before it).
    let last = status.get("last_reload").cloned().unwrap_or(Value::Null);
    assert_eq!(last.get("event").and_then(Value::as_str), Some("reloaded"), "{status:?}");
    assert!(last.get("model").and_then(Value::as_str).is_some_and(|m| m.ends_with("/v2")), "{status:?}");
    assert_eq!(last.get("request").and_then(Value::as_i64), Some(3), "v2, v3, v2 again: {status:?}");

    // 5. Install v1 again (already in the store), then roll it back: v2 serves again.
    ask_some(&c).await;
    let (out, err, ok) =
        model_cli(args(&[&"install", &"--store", &store, &model("bpe-small"), &"--version", &"v1"])).await;
    assert!(ok && out.contains("v1 serves"), "{out} {err}");
    ask_some(&c).await;
    let (out, err, ok) = model_cli(args(&[&"rollback", &"--store", &store])).await;
    assert!(ok, "rollback: {out} {err}");
    assert!(out.contains("rolled back from v1 to v2"), "{out}");
    assert_eq!(model_name(broker.port, "dev-store").await, "v2");
    assert_eq!(listed(&store).await, pairs(&[("v1", ""), ("v2", "serving,current")]));
    // Nothing left to roll back: a no-op that succeeds (Mender's rollback after a failed install).
    let (out, _, ok) = model_cli(args(&[&"rollback", &"--store", &store])).await;
    assert!(ok && out.contains("nothing to roll back"), "{out}");

    each_answered_once(&mut c, asked).await;
    drop(agent);
}

/// Removes a path it made when dropped (a system path a test had to use).
struct MadeHere(PathBuf);

impl Drop for MadeHere {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Links `ota/mender/laya-model` where Debian's mender-client 3.4 reads update modules (it reads
/// no other directory), and writes the `/etc/mender/artifact_info` it needs before its first
/// install, each only if absent and removed afterwards.
fn mender_module() -> (MadeHere, Option<MadeHere>) {
    let dir = Path::new("/usr/share/mender/modules/v3");
    std::fs::create_dir_all(dir).expect("the update modules' directory (run as root)");
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ota/mender/laya-model");
    let link = dir.join("laya-model");
    match std::fs::read_link(&link) {
        Ok(t) if t == module => {}
        Ok(_) | Err(_) if link.exists() => panic!("{} exists and is not this checkout's module", link.display()),
        _ => std::os::unix::fs::symlink(&module, &link).expect("link the update module"),
    }
    let info = Path::new("/etc/mender/artifact_info");
    let made = (!info.exists()).then(|| {
        std::fs::create_dir_all("/etc/mender").expect("/etc/mender");
        std::fs::write(info, "artifact_name=laya-edge-test-base\n").expect("artifact_info");
        MadeHere(info.to_owned())
    });
    (MadeHere(link), made)
}

/// Runs a command off the runtime's threads: (stdout and stderr, success).
async fn run(cmd: &'static str, args: Vec<std::ffi::OsString>, env: Vec<(String, PathBuf)>) -> (String, bool) {
    tokio::task::spawn_blocking(move || {
        let out =
            std::process::Command::new(cmd).args(&args).envs(env).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (text, out.status.success())
    })
    .await
    .expect("the command")
}

/// A Mender artifact of `model` for the `laya-model` update module, named `version`.
async fn artifact(model: &Path, version: &str, dir: &Path) -> PathBuf {
    let tar = dir.join(format!("{version}.tar"));
    let (out, ok) = run("tar", args(&[&"-C", &model, &"-cf", &tar, &"."]), vec![]).await;
    assert!(ok, "tar: {out}");
    let file = dir.join(format!("{version}.mender"));
    let words: [&dyn AsRef<OsStr>; 14] = [
        &"write",
        &"module-image",
        &"-T",
        &"laya-model",
        &"-n",
        &version,
        &"-t",
        &"laya-edge-test",
        &"-f",
        &tar,
        &"-o",
        &file,
        &"--compression",
        &"none",
    ];
    let (out, ok) = run("mender-artifact", args(&words), vec![]).await;
    assert!(ok, "mender-artifact: {out}");
    file
}

/// Issue #42, item 3: the real Mender client (Debian 12's mender-client 3.4.0, standalone) drives
/// `ota/mender/laya-model` against a running agent on mosquitto: a good artifact installs and
/// serves, and commits; an artifact whose model the agent rejects makes the install fail, Mender
/// rolls back and the old model serves on; a corrupted artifact is refused; every question asked
/// meanwhile is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Debian's mender-client and mender-artifact, and root for Mender's own paths (tools/test.sh installs them and runs it)"]
async fn mender_installs_a_model_that_serves_rolls_a_rejected_one_back_and_refuses_a_corrupted_artifact() {
    let work = temp_dir("mender");
    let store = work.join("models");
    let (out, err, ok) =
        model_cli(args(&[&"install", &"--store", &store, &model("bpe-small"), &"--version", &"v1"])).await;
    assert!(ok, "{out} {err}");
    let broker = Broker::start("mender", "");
    let extra = format!("[engine]\nbackend = \"cpu\"\n[model]\nstore = \"{}\"\n", store.display());
    let agent = Agent::start(&broker, "dev-mender", &extra);
    wait_online(broker.port, "dev-mender").await;
    let _module = mender_module();
    let data = work.join("mender-data");
    std::fs::create_dir_all(&data).expect("data");
    std::fs::write(data.join("device_type"), "device_type=laya-edge-test\n").expect("device_type");
    let conf = work.join("mender.conf");
    std::fs::write(&conf, "{}\n").expect("mender.conf");
    let env = vec![
        ("LAYA_EDGE_BIN".to_owned(), test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge"))),
        ("LAYA_EDGE_CONFIG".to_owned(), agent.config.clone()),
    ];
    let mender = |verb: &'static str, file: Option<&Path>| {
        let mut a = args(&[&"--no-syslog", &"--config", &conf, &"--data", &data, &verb]);
        a.extend(file.map(|f| f.as_os_str().to_owned()));
        run("mender", a, env.clone())
    };
    let mut c = Client::connect(broker.port, "mender-asker").await;
    c.subscribe("laya/v1/reply/mender-asker/#").await;
    let mut asked = 0;
    let mut ask_some = async |c: &Client| {
        for _ in 0..5 {
            let id = format!("q{asked}");
            let body = json::to_string(&request(&id), json::Style::COMPACT).into_bytes();
            let to = format!("laya/v1/reply/mender-asker/{id}");
            c.ask("laya/v1/dev-mender/ask", body, Some(&to), Some(id.as_bytes()), Encoding::Json).await;
            asked += 1;
        }
    };

    // A good artifact: installed, serving, committed.
    let good = artifact(Path::new(&model("wp-t4")), "v2", &work).await;
    ask_some(&c).await;
    let (out, ok) = mender("install", Some(&good)).await;
    assert!(ok, "mender install of a good model: {out}");
    assert_eq!(model_name(broker.port, "dev-mender").await, "v2");
    assert_eq!(listed(&store).await, pairs(&[("v1", "previous"), ("v2", "serving,current,pending")]));
    let (out, ok) = mender("commit", None).await;
    assert!(ok, "mender commit: {out}");
    assert_eq!(listed(&store).await, pairs(&[("v1", ""), ("v2", "serving,current")]));

    // A model the agent rejects: the install fails, Mender rolls back, v2 serves on.
    let bad = artifact(&constant_copy("bpe-small"), "v3", &work).await;
    ask_some(&c).await;
    let (out, ok) = mender("install", Some(&bad)).await;
    assert!(!ok, "mender install of a rejected model must fail: {out}");
    assert_eq!(model_name(broker.port, "dev-mender").await, "v2");
    assert_eq!(listed(&store).await, pairs(&[("v1", ""), ("v2", "serving,current")]));
    let (out, _) = mender("show-artifact", None).await;
    assert!(out.lines().any(|l| l.trim() == "v2"), "Mender's installed artifact is still v2: {out}");

    // A corrupted artifact: refused before the module runs.
    let corrupted = work.join("corrupted.mender");
    let mut bytes = std::fs::read(&good).expect("artifact");
    let n = bytes.len();
    bytes.truncate(n / 2);
    std::fs::write(&corrupted, bytes).expect("corrupted");
    ask_some(&c).await;
    let (out, ok) = mender("install", Some(&corrupted)).await;
    assert!(!ok, "a corrupted artifact must be refused: {out}");
    assert_eq!(model_name(broker.port, "dev-mender").await, "v2");
    assert_eq!(listed(&store).await, pairs(&[("v1", ""), ("v2", "serving,current")]));

    each_answered_once(&mut c, asked).await;
    drop(agent);
}

/// Issue #42, item 4: `ota/thin-edge/laya-model` through thin-edge.io's documented plugin
/// contract (thin-edge itself is not in the package registries here): `list` prints the current
/// version, `install` with the bundle as a tar exits 0 once the agent serves it and 2 when the agent
/// rejects it (the old model serving on), `finalize` commits, `remove` of a version not pending is
/// a failure (2), wrong usage is 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thin_edge_plugin_lists_installs_refuses_a_rejected_model_and_finalizes_by_its_exit_codes() {
    let work = temp_dir("tedge");
    let store = work.join("models");
    let (out, err, ok) =
        model_cli(args(&[&"install", &"--store", &store, &model("bpe-small"), &"--version", &"v1"])).await;
    assert!(ok, "{out} {err}");
    let broker = Broker::start("tedge", "");
    let extra = format!("[engine]\nbackend = \"cpu\"\n[model]\nstore = \"{}\"\n", store.display());
    let agent = Agent::start(&broker, "dev-tedge", &extra);
    wait_online(broker.port, "dev-tedge").await;
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ota/thin-edge/laya-model");
    let env = vec![
        ("LAYA_EDGE_BIN".to_owned(), test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge"))),
        ("LAYA_EDGE_CONFIG".to_owned(), agent.config.clone()),
    ];
    let plugin_run = |words: Vec<std::ffi::OsString>| {
        let (plugin, env) = (plugin.clone(), env.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                let out = std::process::Command::new(&plugin).args(&words).envs(env).output().expect("the plugin runs");
                let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
                (String::from_utf8_lossy(&out.stdout).into_owned(), text, out.status.code())
            })
            .await
            .expect("the plugin")
        }
    };
    let tar = |model: PathBuf, name: &str| {
        let file = work.join(format!("{name}.tar"));
        let ok = std::process::Command::new("tar")
            .arg("-C")
            .arg(&model)
            .args(["-cf"])
            .arg(&file)
            .arg(".")
            .status()
            .expect("tar")
            .success();
        assert!(ok, "tar {name}");
        file
    };

    let (out, all, code) = plugin_run(args(&[&"list"])).await;
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(out, "laya-model\tv1\n");
    assert_eq!(plugin_run(args(&[&"prepare"])).await.2, Some(0));

    let good = tar(PathBuf::from(model("wp-t4")), "v2");
    let (_, all, code) =
        plugin_run(args(&[&"install", &"laya-model", &"--module-version", &"v2", &"--file", &good])).await;
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(model_name(broker.port, "dev-tedge").await, "v2");
    assert_eq!(plugin_run(args(&[&"list"])).await.0, "laya-model\tv2\n");
    let (_, all, code) = plugin_run(args(&[&"finalize"])).await;
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(listed(&store).await, pairs(&[("v1", ""), ("v2", "serving,current")]));

    let bad = tar(constant_copy("bpe-small"), "v3");
    let (_, all, code) =
        plugin_run(args(&[&"install", &"laya-model", &"--module-version", &"v3", &"--file", &bad])).await;
    assert_eq!(code, Some(2), "a rejected model is a failure: {all}");
    assert_eq!(model_name(broker.port, "dev-tedge").await, "v2");
    assert_eq!(plugin_run(args(&[&"list"])).await.0, "laya-model\tv2\n");

    let (_, all, code) = plugin_run(args(&[&"remove", &"laya-model", &"--module-version", &"v2"])).await;
    assert_eq!(code, Some(2), "the committed, serving version cannot be removed: {all}");
    assert_eq!(plugin_run(args(&[&"install", &"laya-model"])).await.2, Some(1), "install without its options");
    assert_eq!(plugin_run(args(&[&"update-list"])).await.2, Some(1), "no update-list");
    assert_eq!(plugin_run(args(&[])).await.2, Some(1));
    drop(agent);
}

/// A new board: the store does not exist yet, so the agent serves `model.dir` (the image's
/// model); the first `model install` makes the store and serves its version; a bundle as a tar
/// installs as its directory does, and a file that is no tar is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_an_empty_store_serves_model_dir_until_the_first_install() {
    let store = temp_dir("new-board").join("models");
    let broker = Broker::start("new-board", "");
    let extra = format!(
        "[engine]\nbackend = \"cpu\"\n[model]\ndir = \"{}\"\nstore = \"{}\"\n",
        model("bpe-small"),
        store.display()
    );
    let agent = Agent::start(&broker, "dev-new", &extra);
    wait_online(broker.port, "dev-new").await;
    assert_eq!(model_name(broker.port, "dev-new").await, "bpe-small");
    let (out, err, ok) = model_cli(args(&[&"install", &"--store", &store, &model("wp-t4"), &"--version", &"v1"])).await;
    assert!(ok && out.contains("v1 serves"), "{out} {err}");
    assert_eq!(model_name(broker.port, "dev-new").await, "v1");
    assert_eq!(listed(&store).await, pairs(&[("v1", "serving,current")]));

    // A bundle as a tar (an OTA artifact's payload), its version the file's name.
    let tar = temp_dir("new-board-tar").join("v2.tar");
    let packed = std::process::Command::new("tar")
        .arg("-C")
        .arg(model("bpe-t5"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .expect("tar");
    assert!(packed.success());
    let (out, err, ok) = model_cli(args(&[&"install", &"--store", &store, &tar])).await;
    assert!(ok && out.contains("v2 serves"), "{out} {err}");
    assert_eq!(model_name(broker.port, "dev-new").await, "v2");
    assert_eq!(listed(&store).await, pairs(&[("v1", "previous"), ("v2", "serving,current,pending")]));
    // Not a tar: refused, nothing changed.
    let junk = temp_dir("new-board-junk").join("v3.tar");
    std::fs::write(&junk, b"not a tar").expect("junk");
    let (out, err, ok) = model_cli(args(&[&"install", &"--store", &store, &junk])).await;
    assert!(!ok && err.contains("neither a model directory nor a tar"), "{out} {err}");
    assert_eq!(listed(&store).await, pairs(&[("v1", "previous"), ("v2", "serving,current,pending")]));
    drop(agent);
}
