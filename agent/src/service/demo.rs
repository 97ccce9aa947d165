//! `laya-edge serve --demo`: an in-process broker (rumqttd) on 127.0.0.1 so the whole service can
//! be tried with nothing installed. One MQTT 5 listener: the agent and `laya-edge ask` speak 5.

use std::net::TcpListener;

/// Starts rumqttd on loopback, on `port` or a free one, in a background thread; returns the port.
pub fn start_broker(port: Option<u16>) -> Result<u16, String> {
    let port = match port {
        Some(p) => {
            // Said here rather than by the broker thread, which would only log it.
            TcpListener::bind(("127.0.0.1", p))
                .map_err(|e| format!("the demo broker cannot listen on port {p}: {e}"))?;
            p
        }
        None => TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port(),
    };
    let text = format!(
        r#"
id = 0
[router]
max_connections = 64
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10

[v5.1]
name = "demo-v5"
listen = "127.0.0.1:{port}"
next_connection_delay_ms = 1
[v5.1.connections]
connection_timeout_ms = 60000
max_payload_size = 2097152
max_inflight_count = 100
dynamic_filters = true
"#
    );
    let config: rumqttd::Config = toml::from_str(&text).map_err(|e| format!("demo broker config: {e}"))?;
    std::thread::Builder::new()
        .name("demo-broker".into())
        .spawn(move || {
            let mut broker = rumqttd::Broker::new(config);
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "demo broker stopped");
            }
        })
        .map_err(|e| format!("cannot start the demo broker: {e}"))?;
    // Wait until it accepts connections.
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err("the demo broker did not start".into())
}
