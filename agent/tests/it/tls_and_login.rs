//! How the agent logs in to its broker: TLS and mutual TLS serve questions, a wrong CA or a
//! missing client certificate is refused without ever falling back to plaintext, and a user name
//! with a password file logs in where a wrong password does not.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use laya_topics::Value;
use laya_topics::wire::Encoding;

/// Certificates for a CA, the broker and a client, made with the openssl command line.
fn make_certs(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=laya-test-ca",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").expect("ext");
    for name in ["server", "client"] {
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls_connections_serve_questions() {
    let certs = temp_dir("certs");
    make_certs(&certs);
    let p = |f: &str| certs.join(f).display().to_string();
    for mutual in [false, true] {
        let tls_port = free_port();
        let extra = format!(
            "listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate {}\n",
            p("ca.crt"),
            p("server.crt"),
            p("server.key"),
            mutual
        );
        let broker = Broker::start(if mutual { "mtls" } else { "tls" }, &extra);
        wait_for_port(tls_port);
        let client_auth = if mutual {
            format!("client_cert = \"{}\"\nclient_key = \"{}\"\n", p("client.crt"), p("client.key"))
        } else {
            String::new()
        };
        let device = if mutual { "dev-mtls" } else { "dev-tls" };
        let dir = temp_dir(device);
        let config = dir.join("laya-edge.toml");
        std::fs::write(
            &config,
            format!(
                "[mqtt]\nbroker = \"mqtts://127.0.0.1:{tls_port}\"\ndevice = \"{device}\"\nca_file = \"{}\"\n{client_auth}[engine]\nbackend = \"null\"\n[model]\ndir = \"{}\"\n",
                p("ca.crt"),
                model("bpe-small")
            ),
        )
        .expect("config");
        let mut agent = Agent::with_config(config, Vec::new());
        // The agent's status reaches plain-TCP clients of the same broker.
        wait_online(broker.port, device).await;
        let mut c = Client::connect(broker.port, &format!("{device}-asker")).await;
        c.subscribe(&format!("laya/v1/reply/{device}-asker/#")).await;
        c.ask(
            &format!("laya/v1/{device}/ask"),
            Encoding::Json.encode(&request("t1")),
            Some(&format!("laya/v1/reply/{device}-asker/t1")),
            None,
            Encoding::Json,
        )
        .await;
        let reply = c.next(Duration::from_secs(30)).await.expect("a reply over TLS");
        assert_eq!(decode(&reply).get("id"), Some(&Value::from("t1")));
        agent.kill9();
    }
}

/// Watches `{prefix}/{device}/status` on the broker's plain port for `within` and returns the
/// `state` of every status seen (retained or live).
async fn states_seen(port: u16, prefix: &str, device: &str, within: Duration) -> Vec<String> {
    let mut c = Client::connect(port, &format!("states-{device}-{}", free_port())).await;
    c.subscribe(&format!("{prefix}/{device}/status")).await;
    let mut states = Vec::new();
    let deadline = Instant::now() + within;
    while let Some(p) = c.next(deadline.saturating_duration_since(Instant::now())).await {
        states.push(decode(&p).get("state").and_then(Value::as_str).unwrap_or("?").to_owned());
    }
    states
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_refused_with_the_wrong_ca_or_without_the_required_client_certificate_and_never_falls_back_to_plaintext()
{
    let certs = temp_dir("certs-refused");
    make_certs(&certs);
    // A second CA that signed nothing the broker presents.
    let other = certs.join("other");
    std::fs::create_dir_all(&other).expect("dir");
    make_certs(&other);
    let p = |f: &str| certs.join(f).display().to_string();
    let (tls_port, mtls_port) = (free_port(), free_port());
    let extra = format!(
        "listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {crt}\nkeyfile {key}\nrequire_certificate false\n\
         listener {mtls_port} 127.0.0.1\ncafile {ca}\ncertfile {crt}\nkeyfile {key}\nrequire_certificate true\n",
        ca = p("ca.crt"),
        crt = p("server.crt"),
        key = p("server.key"),
    );
    let broker = Broker::start("tls-refused", &extra);
    wait_for_port(tls_port);
    wait_for_port(mtls_port);
    let wrong_ca = format!("ca_file = \"{}\"\n", other.join("ca.crt").display());
    let right_ca = format!("ca_file = \"{}\"\n", p("ca.crt"));
    let cases = [
        // The broker's certificate does not chain to the configured CA.
        ("dev-wrong-ca", format!("broker = \"mqtts://127.0.0.1:{tls_port}\"\n{wrong_ca}")),
        // The broker requires a client certificate and the agent has none.
        ("dev-no-client-cert", format!("broker = \"mqtts://127.0.0.1:{mtls_port}\"\n{right_ca}")),
        // mqtts:// pointed at a plaintext listener: a plaintext fallback would connect here.
        ("dev-plain-listener", format!("broker = \"mqtts://127.0.0.1:{}\"\n{right_ca}", broker.port)),
    ];
    let agents: Vec<Agent> = cases.iter().map(|(device, mqtt)| agent_with_mqtt(device, mqtt)).collect();
    for (device, _) in &cases {
        // The agents retry every 100-500 ms; none of them may ever get through.
        let states = states_seen(broker.port, "laya/v1", device, Duration::from_secs(5)).await;
        assert!(states.is_empty(), "{device} reached the broker: {states:?}");
    }
    // The broker saw the refused handshakes (so the agents did try), and a control agent with the
    // right CA and a client certificate connects to the same mutual-TLS listener.
    let log = std::fs::read_to_string(broker.dir().join("mosquitto.log")).expect("broker log");
    assert!(log.contains("OpenSSL Error") || log.contains("protocol error"), "{log}");
    let client_auth = format!("client_cert = \"{}\"\nclient_key = \"{}\"\n", p("client.crt"), p("client.key"));
    let _control = agent_with_mqtt(
        "dev-tls-control",
        &format!("broker = \"mqtts://127.0.0.1:{mtls_port}\"\n{right_ca}{client_auth}"),
    );
    wait_online(broker.port, "dev-tls-control").await;
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_and_password_file_log_in_and_a_wrong_password_is_refused() {
    let dir = temp_dir("passwd");
    let passwd = dir.join("mosquitto.passwd");
    // A password with a space: the agent reads the whole file, only the trailing newline trimmed.
    let password = "s3cret with spaces";
    let out = Command::new("mosquitto_passwd")
        .args(["-c", "-b"])
        .arg(&passwd)
        .args(["edge-agent", password])
        .output()
        .expect("mosquitto_passwd runs (apt-get install mosquitto)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let auth_port = free_port();
    // Per listener: the plain one stays anonymous for the test clients, the other needs a login.
    let extra = format!("listener {auth_port} 127.0.0.1\nallow_anonymous false\npassword_file {}\n", passwd.display());
    let broker = Broker::start_with_head("passwd", "per_listener_settings true", &extra);
    wait_for_port(auth_port);
    let right = dir.join("right.txt");
    std::fs::write(&right, format!("{password}\n")).expect("password file");
    let wrong = dir.join("wrong.txt");
    std::fs::write(&wrong, "s3cret\n").expect("password file");
    let login = |file: &Path| {
        format!(
            "broker = \"mqtt://127.0.0.1:{auth_port}\"\nusername = \"edge-agent\"\npassword_file = \"{}\"\n",
            file.display()
        )
    };
    let _refused = agent_with_mqtt("dev-wrong-password", &login(&wrong));
    let _anonymous = agent_with_mqtt("dev-anonymous", &format!("broker = \"mqtt://127.0.0.1:{auth_port}\"\n"));
    let _agent = agent_with_mqtt("dev-password", &login(&right));
    wait_online(broker.port, "dev-password").await;
    for device in ["dev-wrong-password", "dev-anonymous"] {
        let states = states_seen(broker.port, "laya/v1", device, Duration::from_secs(3)).await;
        assert!(states.is_empty(), "{device} logged in: {states:?}");
    }
    // And the logged-in agent answers.
    let mut c = Client::connect(broker.port, "passwd-asker").await;
    c.subscribe("laya/v1/reply/passwd-asker/#").await;
    let body = Encoding::Json.encode(&request("pw1"));
    c.ask("laya/v1/dev-password/ask", body, Some("laya/v1/reply/passwd-asker/pw1"), None, Encoding::Json).await;
    let reply = c.next(Duration::from_secs(30)).await.expect("a reply");
    assert_eq!(decode(&reply).get("id"), Some(&Value::from("pw1")));
}
