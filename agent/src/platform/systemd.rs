//! systemd's notify protocol, optional and dependency-free.
//!
//! With `Type=notify` the unit waits for `READY=1`; with `WatchdogSec=` it expects `WATCHDOG=1`
//! at least that often, or it restarts the service. Messages are datagrams on the socket named by
//! `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace). Without `NOTIFY_SOCKET`
//! nothing is sent, so the agent runs the same outside systemd.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// A connection to the service manager, if there is one.
#[derive(Debug)]
pub struct Notifier {
    socket: Option<(UnixDatagram, std::os::unix::net::SocketAddr)>,
    watchdog: Option<Duration>,
}

fn address(path: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    match path.strip_prefix('@') {
        #[cfg(target_os = "linux")]
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        }
        #[cfg(not(target_os = "linux"))]
        Some(_) => Err(std::io::Error::other("abstract sockets need Linux")),
        None => std::os::unix::net::SocketAddr::from_pathname(path),
    }
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET` and `WATCHDOG_USEC` (honouring `WATCHDOG_PID`) from the environment.
    pub fn from_env() -> Notifier {
        let socket = std::env::var("NOTIFY_SOCKET").ok().and_then(|path| {
            let addr = address(&path).ok()?;
            let sock = UnixDatagram::unbound().ok()?;
            Some((sock, addr))
        });
        let for_us = std::env::var("WATCHDOG_PID").ok().is_none_or(|pid| pid.parse() == Ok(std::process::id()));
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&us| us > 0 && for_us)
            .map(Duration::from_micros);
        Notifier { socket, watchdog }
    }

    /// Whether a service manager is listening.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// How often to send `WATCHDOG=1`: half the configured watchdog period.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|d| d / 2)
    }

    fn send(&self, msg: &str) {
        if let Some((sock, addr)) = &self.socket {
            // Best effort: a service manager that went away must not stop the agent.
            let _ = sock.send_to_addr(msg.as_bytes(), addr);
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// `WATCHDOG=1`: the main loop is alive. Only when the watchdog is ours (`WATCHDOG_USEC`
    /// set and `WATCHDOG_PID` naming this process): a ping for another process's watchdog is a
    /// protocol error systemd logs.
    pub fn watchdog(&self) {
        if self.watchdog.is_some() {
            self.send("WATCHDOG=1");
        }
    }

    /// `STATUS=...`.
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    /// `STOPPING=1`.
    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_a_notify_socket() {
        let dir = std::env::temp_dir().join(format!("laya-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), address(path.to_str().unwrap()).unwrap())),
            watchdog: Some(Duration::from_secs(30)),
        };
        n.ready("serving\n2 questions");
        n.watchdog();
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving 2 questions");
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(15)));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn no_watchdog_ping_goes_out_when_the_watchdog_is_not_ours() {
        let dir = std::env::temp_dir().join(format!("laya-notify-nowd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        server.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        // WATCHDOG_PID named another process (or no WATCHDOG_USEC): no period.
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), address(path.to_str().unwrap()).unwrap())),
            watchdog: None,
        };
        n.watchdog();
        n.ready("serving");
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving", "the ping went out first");
        assert!(server.recv(&mut buf).is_err(), "nothing else is sent");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let n = Notifier { socket: None, watchdog: None };
        n.ready("x");
        n.watchdog();
        assert!(!n.enabled());
    }
}
