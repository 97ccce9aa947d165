//! Helpers shared by the modules of this test binary that run real processes: a mosquitto broker
//! of their own (`broker`), `laya-edge serve` agents (`agent`), MQTT 5 test clients (`client`),
//! the binary's other commands (`cli`), and what the NPU backends' tests compare (`npu`).

mod agent;
mod broker;
mod cli;
mod client;
#[cfg(any(feature = "rknn", feature = "qnn"))]
mod npu;

pub use agent::*;
pub use broker::*;
pub use cli::*;
pub use client::*;
#[cfg(any(feature = "rknn", feature = "qnn"))]
pub use npu::*;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use laya_topics::Value;
use laya_topics::json::{self, Style};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("laya-mqtt-{name}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub fn wait_for_port(port: u16) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn model(name: &str) -> String {
    format!("{}/../tests/fixtures/laya-0.3.20/models/{name}", env!("CARGO_MANIFEST_DIR"))
}

pub fn text(v: &Value) -> String {
    json::to_string(v, Style::COMPACT)
}
