//! `laya-edge serve` processes: started on a config of the test's, killed or stopped, watched
//! until their retained status says online, and their process trees (workers) inspected.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rumqttc::v5::MqttOptions;

use super::{Broker, free_port, model, temp_dir};

/// A `laya-edge serve` process.
pub struct Agent {
    pub child: Option<Child>,
    pub config: PathBuf,
    pub env: Vec<(String, String)>,
}

impl Agent {
    pub fn start(broker: &Broker, device: &str, extra: &str) -> Agent {
        Agent::start_at(&broker.url(), device, extra)
    }

    /// An agent of `device` on the broker at `url` (a mosquitto of the test's, or a
    /// `test_kit::rogue_broker`), with `extra` config lines after `[mqtt]`'s.
    pub fn start_at(url: &str, device: &str, extra: &str) -> Agent {
        Agent::with_config(agent_config(url, device, extra), Vec::new())
    }

    /// An agent on a config file of the caller's, with extra environment.
    pub fn with_config(config: PathBuf, env: Vec<(String, String)>) -> Agent {
        let mut a = Agent { child: None, config, env };
        a.launch();
        a
    }
    pub fn launch(&mut self) {
        let child = Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .spawn()
            .expect("laya-edge starts");
        self.child = Some(child);
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        c.wait().expect("exit status")
    }

    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The config file [`Agent::start_at`] runs on: `device` on the broker at `url`, telemetry every
/// second, `extra` lines after `[mqtt]`'s, the fixture checkpoint `bpe-small` unless `extra` has
/// a `[model]`.
pub fn agent_config(url: &str, device: &str, extra: &str) -> PathBuf {
    let dir = temp_dir(&format!("agent-{device}"));
    let config = dir.join("laya-edge.toml");
    let text = format!(
        "[mqtt]\nbroker = \"{url}\"\ndevice = \"{device}\"\ntelemetry_interval_s = 1\nreconnect_min_ms = 100\nreconnect_max_ms = 500\n{extra}"
    );
    let text =
        if text.contains("[model]") { text } else { format!("{text}\n[model]\ndir = \"{}\"\n", model("bpe-small")) };
    std::fs::write(&config, text).expect("config");
    config
}

/// Waits until the agent's retained status says online.
pub async fn wait_online(port: u16, device: &str) {
    let options = MqttOptions::new(format!("status-watch-{device}-{}", free_port()), "127.0.0.1", port);
    laya_edge::client::ask::wait_online(
        options,
        &laya_topics::topic::Schema::default(),
        device,
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|e| panic!("{device} never came online: {e}"));
}

/// Writes an agent config of its own (no defaults from [`Agent::start`]) and starts the agent.
pub fn agent_with_mqtt(device: &str, mqtt: &str) -> Agent {
    let dir = temp_dir(device);
    let config = dir.join("laya-edge.toml");
    let text = format!(
        "[mqtt]\ndevice = \"{device}\"\nreconnect_min_ms = 100\nreconnect_max_ms = 500\n{mqtt}[engine]\nbackend = \"null\"\n[model]\ndir = \"{}\"\n",
        model("bpe-small")
    );
    std::fs::write(&config, text).expect("config");
    Agent::with_config(config, Vec::new())
}

/// Live (not zombie) child processes of `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // pid (comm) state ppid ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 1 && fields[0] != "Z" && fields[1].parse() == Ok(pid) {
            out.extend(entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()));
        }
    }
    out
}

/// Whether `pid` is gone: no such process, or a zombie waiting to be reaped by its new parent.
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}
