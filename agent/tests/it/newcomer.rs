//! What a newcomer meets first: `serve --demo` prints its answers and how to ask it (no broker
//! log lines), the printed `ask` line works and `ask`'s exit status tells an answer from an error
//! reply and from no reply, `fleet --once` on the demo shows figures, `--version` says what was
//! built, the demo model is found where an install puts it, stopping without a broker says so and
//! ends, and the demo's training script will not overwrite the shipped model by default.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};

fn bin() -> PathBuf {
    test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge"))
}

/// A running `serve --demo` with its stdout and stderr lines as they come.
struct Demo {
    child: Child,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Demo {
    fn start(exe: &Path, port: u16) -> Demo {
        let mut child = Command::new(exe)
            .args(["serve", "--demo", "--port", &port.to_string()])
            .env_remove("LAYA_LOG")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo starts");
        let out = lines_of(child.stdout.take().expect("stdout"));
        let err = lines_of(child.stderr.take().expect("stderr"));
        Demo { child, out, err }
    }

    /// Stdout lines up to and including the first one `stop` accepts (panics if the demo ends or
    /// says nothing for a minute).
    fn read_until(&self, stop: impl Fn(&str) -> bool) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let line = self.out.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}: after {seen:?}"));
            let done = stop(&line);
            seen.push(line);
            if done {
                return seen;
            }
        }
    }

    fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.err.try_iter().collect()
    }
}

/// Splits a printed shell line into its words (single quotes as a POSIX shell reads them).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.trim().chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

fn ask(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin()).arg("ask").args(args).output().expect("ask runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_demo_prints_answers_and_a_working_ask_line_and_no_broker_lines_and_ask_exits_by_outcome() {
    let port = free_port();
    let demo = Demo::start(&bin(), port);
    let printed = demo.read_until(|l| l.starts_with("watch it:"));
    let broker = format!("mqtt://127.0.0.1:{port}");
    assert!(printed[0].contains(&broker), "the banner names the broker: {printed:?}");

    // The printed `ask` line, run as a user pastes it: answered, exit 0.
    let line = printed.iter().find(|l| l.trim_start().contains(" ask --broker ")).expect("an ask line");
    let words = shell_words(line);
    let out = Command::new(&words[0]).args(&words[1..]).output().expect("the printed ask line runs");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let reply = json::parse_str(String::from_utf8_lossy(&out.stdout).trim(), ParseOptions::default()).expect("a reply");
    assert_eq!(reply.get("device"), Some(&Value::from("demo")));
    assert!(reply.get("answers").and_then(|a| a.get("refund")).and_then(|a| a.get("noul")).is_some(), "{reply:?}");
    assert!(printed.iter().any(|l| l.trim_start().starts_with("mosquitto_rr -h 127.0.0.1 -p ")), "{printed:?}");

    // An error is not an answer: exit 2, for an error in place of an answer (a question without
    // instructions) and for a refused request (not an object).
    let bad = r#"{"id": "x", "state": "s", "questions": {"q": {"type": "noul"}}}"#;
    let (code, stdout, _) = ask(&["--broker", &broker, "--device", "demo", bad]);
    assert_eq!(code, 2, "{stdout}");
    let (code, stdout, _) = ask(&["--broker", &broker, "--device", "demo", "[1, 2]"]);
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.contains("\"error\""), "{stdout}");
    // From a file (`@FILE`) and from stdin (`-`) too.
    let file = temp_dir("newcomer-ask").join("request.json");
    std::fs::write(&file, bad).unwrap();
    let (code, _, _) = ask(&["--broker", &broker, "--device", "demo", &format!("@{}", file.display())]);
    assert_eq!(code, 2);
    let mut child = Command::new(bin())
        .args(["ask", "--broker", &broker, "--device", "demo", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), bad.as_bytes()).unwrap();
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(2));
    // No reply from a device that is not there: exit 3, saying no status was seen for it.
    let (code, _, stderr) = ask(&["--broker", &broker, "--device", "nobody", "--timeout-s", "1", bad]);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("no status from the device"), "{stderr}");

    // `fleet --once` shows the demo's figures (its telemetry comes every 2 s), not dashes.
    let out = Command::new(bin()).args(["fleet", "--broker", &broker, "--once", "--json"]).output().unwrap();
    let view = json::parse_str(String::from_utf8_lossy(&out.stdout).trim(), ParseOptions::default()).expect("json");
    let device = view.get("devices").and_then(Value::as_array).and_then(|d| d.first()).cloned().expect("a device");
    assert_eq!(device.get("device"), Some(&Value::from("demo")));
    assert!(matches!(device.get("questions_per_s"), Some(Value::Float(_) | Value::Int(_))), "{device:?}");

    let stderr = demo.stop();
    let broker_lines: Vec<&String> = stderr.iter().filter(|l| l.contains("rumqttd") || l.contains("ERROR")).collect();
    assert!(broker_lines.is_empty(), "broker or error lines on a healthy run: {broker_lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_a_device_that_went_offline_exits_3_and_shows_its_last_status() {
    let broker = Broker::start("newcomer-offline", "");
    let mut agent = Agent::start(&broker, "gone", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "gone").await;
    // Stopped as systemd stops it: its retained status says offline.
    assert!(agent.terminate().success());
    let url = broker.url();
    let request = r#"{"id": "z", "state": "s", "questions": {}}"#;
    let (code, _, stderr) =
        tokio::task::spawn_blocking(move || ask(&["--broker", &url, "--device", "gone", "--timeout-s", "2", request]))
            .await
            .unwrap();
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("last status") && stderr.contains("\"offline\""), "{stderr}");
}

#[test]
fn version_names_the_commit_the_features_the_laya_semantics_and_the_cpu_kernels() {
    let out = Command::new(bin()).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("laya-edge {}", env!("CARGO_PKG_VERSION"))), "{text}");
    let line =
        |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in {text}"));
    let commit = line("commit: ");
    assert!(
        commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()) || commit.starts_with("unknown"),
        "{commit}"
    );
    assert!(line("features: ").split(", ").any(|f| f == "demo"), "{text}");
    assert_eq!(line("laya semantics: "), "0.3.20 (default), 0.4.15");
    // The kernel set is chosen at run time: AVX-512 or FMA on an x86-64 that has it, NEON on
    // aarch64.
    #[cfg(target_arch = "x86_64")]
    let want = if std::arch::is_x86_feature_detected!("avx512f") {
        "avx512f"
    } else if std::arch::is_x86_feature_detected!("fma") {
        "fma"
    } else {
        "scalar"
    };
    #[cfg(target_arch = "aarch64")]
    let want = "neon";
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let want = "scalar";
    assert_eq!(line("cpu kernels: "), want, "{text}");
    // The vectorised passes (softmax's exp, the erf GELU, layer norm) on the same set.
    assert_eq!(line("cpu vector passes: "), want, "{text}");
    // Each `[cpu] weights` mode and its products' kernels: the int8 set and bf16's (or that this
    // CPU cannot run it).
    let weights = line("cpu weights: ");
    assert!(weights.starts_with(&format!("f32 (default) on {want}, int8 on ")), "{weights}");
    #[cfg(target_arch = "x86_64")]
    let int8 = if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw") {
        "avx512-vnni"
    } else if std::arch::is_x86_feature_detected!("avx2") {
        "avx2"
    } else {
        "scalar"
    };
    #[cfg(target_arch = "aarch64")]
    let int8 = if std::arch::is_aarch64_feature_detected!("dotprod") { "neon-sdot" } else { "scalar" };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let int8 = "scalar";
    #[cfg(target_arch = "x86_64")]
    let bf16 =
        if std::arch::is_x86_feature_detected!("avx512bf16") { "avx512-bf16" } else { "unavailable on this CPU" };
    #[cfg(not(target_arch = "x86_64"))]
    let bf16 = "unavailable on this CPU";
    assert_eq!(weights, format!("f32 (default) on {want}, int8 on {int8}, bf16 on {bf16}"), "{text}");
}

#[test]
fn the_demo_model_is_found_where_an_install_puts_it() {
    // An install layout: bin/laya-edge and share/laya-edge/demo beside it.
    let root = temp_dir("newcomer-install");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let exe = root.join("bin").join("laya-edge");
    std::fs::copy(bin(), &exe).unwrap();
    let demo = root.join("share").join("laya-edge").join("demo");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo"), &demo);
    let d = Demo::start(&exe, free_port());
    let banner = d.read_until(|l| l.starts_with("demo broker on"));
    d.stop();
    let installed = std::fs::canonicalize(&demo).unwrap();
    assert!(banner[0].ends_with(&format!("model {}", installed.display())), "{banner:?}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().map(Result::unwrap) {
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst)
        } else {
            std::fs::copy(e.path(), dst).map(|_| ()).unwrap()
        }
    }
}

#[test]
fn stopping_without_a_broker_says_so_and_ends() {
    let dir = temp_dir("newcomer-stop");
    let config = dir.join("laya-edge.toml");
    // Nothing listens on this port.
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"mqtt://127.0.0.1:{port}\"\ndevice = \"lonely\"\nreconnect_min_ms = 100\nreconnect_max_ms = 200\n[engine]\nbackend = \"null\"\n[model]\ndir = \"{}\"\n",
            model("bpe-small")
        ),
    )
    .unwrap();
    let mut child = Command::new(bin())
        .args(["serve", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = lines_of(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("reconnecting to the broker")) {
        seen.push(err.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}: {seen:?}")));
    }
    // SIGTERM, as systemd stops it.
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    seen.extend(err.iter());
    assert!(status.success(), "{status:?}: {seen:?}");
    assert!(seen.iter().any(|l| l.contains("stopping") && l.contains("connected=false")), "{seen:?}");
    assert!(seen.iter().any(|l| l.contains("not connected to the broker")), "{seen:?}");
}

#[test]
fn the_demo_training_script_needs_an_out_directory_and_writes_nothing_without_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let before = std::fs::read(root.join("models/demo/model.safetensors")).unwrap();
    let out = Command::new("python3").arg(root.join("tools/demo/train.py")).output().expect("python3 runs");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--out"));
    assert_eq!(std::fs::read(root.join("models/demo/model.safetensors")).unwrap(), before);
    let help = Command::new("python3").arg(root.join("tools/demo/train.py")).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--seed"));
}
