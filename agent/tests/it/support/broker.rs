//! mosquitto brokers of the tests' own: one with a config written here (`Broker`, persistence on,
//! restartable on its port) and one running the shipped `config/mosquitto.conf` and ACL
//! (`ShippedBroker`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use super::{free_port, temp_dir, wait_for_port};

/// A mosquitto process with a config of our own, persistence on.
pub struct Broker {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// Config lines before the first listener (`per_listener_settings true` must go there).
    head: String,
}

impl Broker {
    pub fn start(name: &str, extra: &str) -> Broker {
        Broker::start_with_head(name, "", extra)
    }

    /// A broker whose config starts with `head` (before the plain listener on `port`).
    pub fn start_with_head(name: &str, head: &str, extra: &str) -> Broker {
        let dir = temp_dir(name);
        let port = free_port();
        let mut b = Broker { child: None, port, dir, head: head.to_owned() };
        b.write_conf(extra);
        b.launch();
        b
    }

    /// The broker's directory (its config, log and persistence files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn write_conf(&self, extra: &str) {
        let conf = format!(
            // `user root`: when the tests run as root (CI), mosquitto would otherwise switch to its
            // own user and could not write the persistence files or read the test keys.
            "{}\nuser root\nlistener {} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nautosave_interval 1\nmax_queued_messages 100000\n{extra}\n",
            self.head,
            self.port,
            self.dir.display()
        );
        std::fs::write(self.dir.join("mosquitto.conf"), conf).expect("conf");
    }

    pub fn launch(&mut self) {
        let log = std::fs::File::create(self.dir.join("mosquitto.log")).expect("log");
        let child = Command::new(mosquitto())
            .arg("-c")
            .arg(self.dir.join("mosquitto.conf"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("mosquitto starts (apt-get install mosquitto)");
        self.child = Some(child);
        wait_for_port(self.port);
    }

    /// Stops the broker cleanly (it saves its sessions) and starts it again on the same port.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
        self.launch();
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
        let port = free_port();
        let root = test_kit::workspace();
        let conf = std::fs::read_to_string(root.join("config/mosquitto.conf")).expect("config/mosquitto.conf");
        std::fs::copy(root.join("config/mosquitto.acl"), dir.join("mosquitto.acl")).expect("the ACL file");
        let mut out = String::from("user root\n");
        for line in conf.lines() {
            let key = line.split_whitespace().next().unwrap_or("");
            out += &match key {
                "listener" => format!("listener {port} 127.0.0.1"),
                "persistence_location" => format!("persistence_location {}/", dir.display()),
                "password_file" => format!("password_file {}", dir.join("passwd").display()),
                "acl_file" => format!("acl_file {}", dir.join("mosquitto.acl").display()),
                "log_dest" => "log_dest stderr".to_owned(),
                _ => line.to_owned(),
            };
            out.push('\n');
        }
        std::fs::write(dir.join("mosquitto.conf"), out).expect("conf");
        let passwd = dir.join("passwd");
        for (user, password) in users {
            let ok = Command::new("mosquitto_passwd")
                .args(if passwd.exists() { &["-b"][..] } else { &["-c", "-b"][..] })
                .args([passwd.as_os_str(), user.as_ref(), password.as_ref()])
                .status()
                .expect("mosquitto_passwd runs");
            assert!(ok.success());
        }
        let log = std::fs::File::create(dir.join("mosquitto.log")).expect("log");
        let child = Command::new(mosquitto())
            .arg("-c")
            .arg(dir.join("mosquitto.conf"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("mosquitto starts");
        wait_for_port(port);
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

pub fn mosquitto() -> PathBuf {
    for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    "mosquitto".into()
}
