//! The agent as a systemd service (`Type=notify`, the Yocto layer's unit): READY=1 after the
//! warm-up, watchdog pings while healthy (none for another `WATCHDOG_PID`, none while stopped),
//! notifications from the main process only, a stop signal to the whole unit that lets the worker
//! finish its question, and a worker that never outlives its agent.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

// SIGTERM (questions in flight, STOPPING=1, a clean DISCONNECT and no Last Will) is tested in
// delivery.rs: `sigterm_mid_stream_answers_and_acknowledges_each_question_or_leaves_it_for_the_next_run`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_gets_ready_after_the_warm_up_and_watchdog_pings_while_healthy() {
    let broker = Broker::start("notify", "");
    let dir = std::env::temp_dir().join(format!("laya-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let socket_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"dev-notify\"\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n",
            broker.url(),
            model("bpe-small")
        ),
    )
    .expect("config");
    let env = vec![
        ("NOTIFY_SOCKET".to_owned(), socket_path.display().to_string()),
        ("WATCHDOG_USEC".to_owned(), "400000".to_owned()),
    ];
    let _agent = Agent::with_config(config, env);
    let mut messages = Vec::new();
    let mut buf = [0u8; 512];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let n = socket.recv(&mut buf).expect("a notification");
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        messages.push(m);
        let ready = messages.iter().position(|m| m.starts_with("READY=1"));
        if let Some(r) = ready
            && messages[r..].iter().filter(|m| *m == "WATCHDOG=1").count() >= 3
        {
            break;
        }
    }
    let ready = messages.iter().find(|m| m.starts_with("READY=1")).expect("READY=1 was sent");
    assert!(ready.contains("STATUS=serving as dev-notify"), "{ready}");
    assert!(messages.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3, "{messages:?}");
}

/// The unit file the Yocto layer installs: `key=value` of its [Service] section.
fn unit_setting(key: &str) -> String {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../yocto-layer/recipes-laya/laya-edge/files/laya-edge.service"),
    )
    .expect("the unit file");
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_owned))
        .unwrap_or_else(|| panic!("the unit sets no {key}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_units_settings_the_agent_notifies_ready_and_pings_from_its_main_process() {
    assert_eq!(unit_setting("Type"), "notify");
    assert_eq!(unit_setting("NotifyAccess"), "main", "notifications come from the main process only");
    let watchdog_sec: u64 = unit_setting("WatchdogSec").parse().expect("seconds");
    let broker = Broker::start("unit", "");
    let dir = std::env::temp_dir().join(format!("laya-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let socket_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind");
    // Bounded only so that no notification fails the test instead of hanging it. The period
    // (half of WATCHDOG_USEC) is platform::systemd's unit test's, not timed here.
    socket.set_read_timeout(Some(Duration::from_secs(3 * watchdog_sec))).expect("timeout");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"dev-unit\"\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n",
            broker.url(),
            model("bpe-small")
        ),
    )
    .expect("config");
    // What systemd sets for WatchdogSec= in the service's environment.
    let env = vec![
        ("NOTIFY_SOCKET".to_owned(), socket_path.display().to_string()),
        ("WATCHDOG_USEC".to_owned(), (watchdog_sec * 1_000_000).to_string()),
    ];
    let agent = Agent::with_config(config, env);
    let main_pid = agent.child.as_ref().map(|c| c.id()).expect("pid");
    let mut buf = [0u8; 512];
    let mut ready = false;
    // READY, then a watchdog ping (WATCHDOG_USEC is set, so the watchdog is the agent's).
    let mut senders = HashSet::new();
    let mut pings = 0;
    while pings < 1 {
        let (n, sender) = recv_with_sender(&socket, &mut buf).expect("READY=1 and a ping");
        senders.insert(sender);
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        if m.starts_with("READY=1") {
            ready = true;
        } else if m == "WATCHDOG=1" && ready {
            pings += 1;
        }
    }
    // Notifications come from the main process (NotifyAccess=main): the process we started, as
    // the kernel reports each datagram's sender; its worker has no NOTIFY_SOCKET to send to.
    assert_eq!(senders, HashSet::from([main_pid]), "senders of notifications");
    let workers = children(main_pid);
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    let environ = std::fs::read(format!("/proc/{}/environ", workers[0])).expect("the worker's environment");
    let names: Vec<String> = environ
        .split(|&b| b == 0)
        .filter_map(|kv| kv.split(|&b| b == b'=').next())
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert!(names.iter().any(|k| k == "WATCHDOG_USEC"), "the environment was read: {names:?}");
    assert!(!names.iter().any(|k| k == "NOTIFY_SOCKET"), "the worker inherited NOTIFY_SOCKET: {names:?}");
}

/// Receives one datagram on a socket with SO_PASSCRED and returns its length and its sender's
/// process id, as the kernel reports it (SCM_CREDENTIALS).
fn recv_with_sender(socket: &std::os::unix::net::UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, u32)> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: SO_PASSCRED reads one c_int from the pointer we pass with its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut control = [0u64; 16]; // 128 bytes, aligned for cmsghdr
    // SAFETY: msghdr is plain data; all-zero is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at `iov` (over `buf`) and `control`, both alive and of the given sizes.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the CMSG_* walk stays within msg_controllen of `control`, which recvmsg filled in.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                return Ok((n as usize, cred.pid as u32));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Err(std::io::Error::other("a datagram without the sender's credentials"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_hung_in_a_call_dies_with_its_agent_when_the_agent_is_killed() {
    let broker = Broker::start("orphan", "");
    // Every call hangs, and no deadline kills the worker before the agent is killed.
    let settings = "[engine]\nbackend = \"null\"\nnull_faults = \"hang\"\ndeadline_ms = 600000\n";
    let mut agent = Agent::start(&broker, "dev-orphan", settings);
    let agent_pid = agent.child.as_ref().map(|c| c.id()).expect("pid");
    wait_online(broker.port, "dev-orphan").await;
    let mut c = Client::connect(broker.port, "orphan-asker").await;
    c.subscribe("laya/v1/dev-orphan/telemetry").await;
    c.ask("laya/v1/dev-orphan/ask", Encoding::Json.encode(&request("hung")), None, None, Encoding::Json).await;
    // The question is in flight (admitted, behind the hanging warm-up call or in the worker).
    telemetry_where(&mut c, "a question in flight", |v| v.get("in_flight").and_then(Value::as_i64) >= Some(1)).await;
    let workers = children(agent_pid);
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    agent.kill9();
    let t = Instant::now();
    while !gone(workers[0]) {
        assert!(t.elapsed() < Duration::from_secs(5), "the worker {} outlived its agent by 5 s", workers[0]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_to_the_whole_unit_lets_the_worker_finish_the_question_it_computes() {
    let broker = Broker::start("unit-stop", "");
    // systemd's default stop (KillMode=control-group) and Ctrl-C signal every process, the worker
    // too. The question in progress must still be answered within the grace, by that worker.
    let settings = "shutdown_grace_s = 10\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=1500\"\n";
    let mut agent = Agent::start(&broker, "dev-unit", settings);
    let agent_pid = agent.child.as_ref().map(|c| c.id()).expect("pid");
    wait_online(broker.port, "dev-unit").await;
    let mut c = Client::connect(broker.port, "unit-asker").await;
    c.subscribe("laya/v1/reply/unit-asker/#").await;
    let mut watch = Client::connect(broker.port, "unit-watch").await;
    watch.subscribe("laya/v1/dev-unit/telemetry").await;
    watch.subscribe("laya/v1/dev-unit/events").await;
    c.ask(
        "laya/v1/dev-unit/ask",
        Encoding::Json.encode(&request("u1")),
        Some("laya/v1/reply/unit-asker/u1"),
        None,
        Encoding::Json,
    )
    .await;
    telemetry_where(&mut watch, "the question in flight", |v| v.get("in_flight").and_then(Value::as_i64) >= Some(1))
        .await;
    let workers = children(agent_pid);
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    for pid in [workers[0], agent_pid] {
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    }
    let reply = decode(&c.next(Duration::from_secs(10)).await.expect("the question in progress is answered"));
    assert!(reply.get("answers").is_some(), "answered, not refused: {reply:?}");
    let status = agent.child.take().expect("running").wait().expect("exit status");
    assert!(status.success(), "{status:?}");
    // The worker was not restarted: no worker_restart event went out.
    while let Some(p) = watch.next(Duration::from_millis(500)).await {
        let v = decode(&p);
        assert_ne!(v.get("event").and_then(Value::as_str), Some("worker_restart"), "the worker died: {v:?}");
    }
    assert!(gone(workers[0]), "the worker {} outlived its agent", workers[0]);
}

/// An agent (null backend) with `NOTIFY_SOCKET` pointing at a datagram socket of the test's,
/// `WATCHDOG_USEC` = 400 ms and `env` besides; returns it with the socket (reads time out after
/// 1 s) once `READY=1` arrived.
fn notifying_agent(broker: &Broker, device: &str, env: &[(&str, String)]) -> (Agent, std::os::unix::net::UnixDatagram) {
    let dir = temp_dir(device);
    let socket_path = dir.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"{device}\"\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n",
            broker.url(),
            model("bpe-small")
        ),
    )
    .expect("config");
    let mut vars = vec![
        ("NOTIFY_SOCKET".to_owned(), socket_path.display().to_string()),
        ("WATCHDOG_USEC".to_owned(), "400000".to_owned()),
    ];
    vars.extend(env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let agent = Agent::with_config(config, vars);
    let mut buf = [0u8; 512];
    loop {
        let n = socket.recv(&mut buf).expect("READY=1 within 30 s");
        if buf[..n].starts_with(b"READY=1") {
            break;
        }
    }
    socket.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    (agent, socket)
}

/// The notifications that arrive on `socket` within `within`.
fn notifications(socket: &std::os::unix::net::UnixDatagram, within: Duration) -> Vec<String> {
    let (mut out, mut buf, deadline) = (Vec::new(), [0u8; 512], Instant::now() + within);
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_watchdog_ping_is_sent_when_watchdog_pid_names_another_process() {
    let broker = Broker::start("wdpid", "");
    // systemd sets WATCHDOG_PID to the main pid; here it names this test process instead.
    let (_agent, socket) = notifying_agent(&broker, "dev-wdpid", &[("WATCHDOG_PID", std::process::id().to_string())]);
    let seen = notifications(&socket, Duration::from_secs(2));
    // At 400 ms the agent would ping every 200 ms: ten chances.
    assert!(!seen.iter().any(|m| m == "WATCHDOG=1"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_pings_stop_while_the_agent_is_stopped_and_resume_after() {
    let broker = Broker::start("wdstop", "");
    let (agent, socket) = notifying_agent(&broker, "dev-wdstop", &[]);
    let pings = |m: &[String]| m.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(two_pings(&socket), "no pings while healthy");
    let pid = agent.child.as_ref().expect("running").id().to_string();
    let signal = |s: &str| assert!(Command::new("kill").args([s, &pid]).status().expect("kill").success());
    signal("-STOP");
    // What was sent before the stop took effect is drained first.
    let _ = notifications(&socket, Duration::from_millis(300));
    let stopped = notifications(&socket, Duration::from_secs(2));
    signal("-CONT");
    assert_eq!(pings(&stopped), 0, "a stopped agent sent {stopped:?}");
    // systemd would have killed it after WatchdogSec; resumed, it pings again.
    assert!(two_pings(&socket), "the pings did not resume");
}

/// Whether two watchdog pings arrive on `socket`; bounded (30 s) only so that pings that never
/// come fail the test instead of hanging it.
fn two_pings(socket: &std::os::unix::net::UnixDatagram) -> bool {
    let (mut pings, mut buf, deadline) = (0, [0u8; 512], Instant::now() + Duration::from_secs(30));
    while pings < 2 && Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf)
            && &buf[..n] == b"WATCHDOG=1"
        {
            pings += 1;
        }
    }
    pings == 2
}
