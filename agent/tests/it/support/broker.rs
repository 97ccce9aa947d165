//! mosquitto brokers of the tests' own: one with a config written here (`Broker`, persistence on,
//! restartable on its port) and one running the shipped `config/mosquitto.conf` and ACL
//! (`ShippedBroker`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{free_port, temp_dir};

/// A mosquitto process with a config of our own, persistence on.
pub struct Broker {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

impl Broker {
    pub fn start(name: &str, extra: &str) -> Broker {
        Broker::start_with_head(name, "", extra)
    }

    /// A broker whose config starts with `head` (lines before the plain listener on `port`:
    /// `per_listener_settings true` must go there) and ends with `extra`.
    pub fn start_with_head(name: &str, head: &str, extra: &str) -> Broker {
        let dir = temp_dir(name);
        let (child, port) = launch_on_a_free_port(&dir, |port| {
            format!(
                // `user root`: when the tests run as root (CI), mosquitto would otherwise switch
                // to its own user and could not write the persistence files or read the test keys.
                "{head}\nuser root\nlistener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nautosave_interval 1\nmax_queued_messages 100000\n{extra}\n",
                dir.display(),
            )
        });
        Broker { child: Some(child), port, dir }
    }

    /// The broker's directory (its config, log and persistence files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the broker cleanly (it saves its sessions) and starts it again on the same port.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
        // The port was free while the broker was down: another test may hold it for a moment.
        let t = Instant::now();
        loop {
            self.child = launch(&self.dir, self.port);
            if self.child.is_some() {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "port {} taken while the broker was down: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// What mosquitto logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shipped broker configuration (`config/mosquitto.conf` with `config/mosquitto.acl`, as they
/// are) in a mosquitto of its own: only its port, persistence directory, password file, ACL file
/// path and log destination changed (the paths the example uses are a board's). Users log in
/// with `users`' passwords.
pub struct ShippedBroker {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl ShippedBroker {
    pub fn start(name: &str, users: &[(&str, &str)]) -> ShippedBroker {
        let dir = temp_dir(name);
        let root = test_kit::workspace();
        let conf = std::fs::read_to_string(root.join("config/mosquitto.conf")).expect("config/mosquitto.conf");
        std::fs::copy(root.join("config/mosquitto.acl"), dir.join("mosquitto.acl")).expect("the ACL file");
        let passwd = dir.join("passwd");
        for (user, password) in users {
            let ok = Command::new("mosquitto_passwd")
                .args(if passwd.exists() { &["-b"][..] } else { &["-c", "-b"][..] })
                .args([passwd.as_os_str(), user.as_ref(), password.as_ref()])
                .status()
                .expect("mosquitto_passwd runs");
            assert!(ok.success());
        }
        let (child, port) = launch_on_a_free_port(&dir, |port| {
            let mut out = String::from("user root\n");
            for line in conf.lines() {
                let key = line.split_whitespace().next().unwrap_or("");
                out += &match key {
                    "listener" => format!("listener {port} 127.0.0.1"),
                    "persistence_location" => format!("persistence_location {}/", dir.display()),
                    "password_file" => format!("password_file {}", passwd.display()),
                    "acl_file" => format!("acl_file {}", dir.join("mosquitto.acl").display()),
                    "log_dest" => "log_dest stderr".to_owned(),
                    _ => line.to_owned(),
                };
                out.push('\n');
            }
            out
        });
        ShippedBroker { child, port, dir }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// A file in the broker's directory holding `password` (for `mqtt.password_file`).
    pub fn password_file(&self, user: &str, password: &str) -> PathBuf {
        let path = self.dir.join(format!("{user}.password"));
        std::fs::write(&path, format!("{password}\n")).expect("password file");
        path
    }

    /// What mosquitto logged so far.
    #[allow(dead_code, reason = "no test reads it today; Broker::log's counterpart, for debugging an ACL test")]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for ShippedBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `dir`'s `mosquitto.conf` (`conf` of the port) for a free port and starts mosquitto on it
/// ([`launch`]): the child and its port.
///
/// The port is one the kernel had free a moment before, and another test may take it in that
/// moment: its own listener, or one of its brokers. That broker would answer on the port, and this
/// test's agent and clients would talk to another test's broker and see its replies. So the broker
/// is only taken once its own process holds the listener; else it starts again on another port.
fn launch_on_a_free_port(dir: &Path, conf: impl Fn(u16) -> String) -> (Child, u16) {
    for _ in 0..5 {
        let port = free_port();
        std::fs::write(dir.join("mosquitto.conf"), conf(port)).expect("conf");
        if let Some(child) = launch(dir, port) {
            return (child, port);
        }
    }
    let log = std::fs::read_to_string(dir.join("mosquitto.log")).unwrap_or_default();
    panic!("no mosquitto of this test's came up on five ports; its last log:\n{log}");
}

/// Starts mosquitto on `dir`'s `mosquitto.conf`, logging to `dir`'s `mosquitto.log`, and waits
/// until its own process holds the listener on `port`: the child, or `None` if it exited first (a
/// port of its config was taken). A port that answers is not enough: another test's broker, or
/// anything else, may be the one listening on it.
fn launch(dir: &Path, port: u16) -> Option<Child> {
    let log = std::fs::File::create(dir.join("mosquitto.log")).expect("log");
    let mut child = Command::new(mosquitto())
        .arg("-c")
        .arg(dir.join("mosquitto.conf"))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("mosquitto starts (apt-get install mosquitto)");
    let t = Instant::now();
    loop {
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        if holds_listener(child.id(), port) {
            return Some(child);
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.join("mosquitto.log")).unwrap_or_default();
            panic!("mosquitto never listened on {port} in 10 s; its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` holds the TCP socket listening on 127.0.0.1:`port` (Linux's
/// `/proc/net/tcp`: the listener's inode, among the process's descriptors).
pub fn holds_listener(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else { return false };
    let local = format!("0100007F:{port:04X}");
    // Columns: sl, local_address, rem_address, st (0A: listening), ..., inode (the tenth).
    let inode = table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let listening = cols.get(1) == Some(&local.as_str()) && cols.get(3) == Some(&"0A");
        if listening { cols.get(9).map(|i| (*i).to_owned()) } else { None }
    });
    let Some(inode) = inode else { return false };
    let socket = PathBuf::from(format!("socket:[{inode}]"));
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == socket))
}

pub fn mosquitto() -> PathBuf {
    for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    "mosquitto".into()
}

/// The harness's own check: a port another process listens on is not taken for the broker's
/// (the listener answers, and a check that only connects would go on with it); the broker starts
/// on another port instead.
#[test]
fn a_broker_never_takes_another_processs_listener_for_its_own() {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = squatter.local_addr().expect("its address").port();
    assert!(holds_listener(std::process::id(), port), "this process holds its own listener");
    let dir = temp_dir("squatted");
    std::fs::write(dir.join("mosquitto.conf"), format!("user root\nlistener {port} 127.0.0.1\n")).expect("conf");
    assert!(launch(&dir, port).is_none(), "mosquitto exits: the port is taken");
    let log = std::fs::read_to_string(dir.join("mosquitto.log")).unwrap_or_default();
    assert!(log.contains("Address already in use"), "{log}");
    let broker = Broker::start("squatted-next", "");
    assert_ne!(broker.port, port);
    let pid = broker.child.as_ref().map(Child::id).expect("running");
    assert!(holds_listener(pid, broker.port) && !holds_listener(pid, port));
    let _ = std::fs::remove_dir_all(&dir);
}
