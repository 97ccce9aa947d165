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
pub use test_kit::text;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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

/// A fixture checkpoint directory by name (`bpe-t5`, `wp-t4`, `bpe-small`), as config text wants it.
pub fn model(name: &str) -> String {
    test_kit::model_dir(name).display().to_string()
}
