//! A misbehaving MQTT 5 broker for tests: the worst broker an agent can meet, on purpose.
//!
//! It speaks just enough MQTT 5 for one client (CONNECT, SUBSCRIBE, QoS 1 PUBLISH both ways,
//! PINGREQ, DISCONNECT), and does what real brokers do wrong: it sends questions past the
//! client's Receive Maximum (as mosquitto 2.0.11, Debian 12's own, does: eclipse/mosquitto#2306),
//! it can hold back its acknowledgements of the client's publishes for as long as a test likes,
//! and it can go silent (read, answer nothing, keep the TCP connection open) like a broker behind
//! a dead link. Its CONNACKs say what a test chooses, one [`Terms`] a connection in turn: a
//! Server Keep Alive of its own (then it enforces it, as brokers do, if asked), a Receive Maximum
//! of 0 (a protocol error), a session present. It can close the connection (a broker restart) and
//! send a question with the retain or DUP flag. It records each connection: the keep-alive asked,
//! the PINGREQs and when, whether it closed it for silence. Each connection is served by a thread;
//! a new connection replaces the old one. Packets are encoded and decoded with rumqttc's own
//! `mqttbytes`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{
    ConnAck, ConnAckProperties, ConnectReturnCode, Packet, PingResp, PubAck, Publish, PublishProperties, SubAck,
    SubscribeReasonCode,
};

/// What a CONNACK says; the broker answers each connection with the next of its terms (the last
/// one repeats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terms {
    /// The Receive Maximum (None: the property is left out, 65,535).
    pub receive_maximum: Option<u16>,
    /// A Server Keep Alive the client must use instead of its own.
    pub server_keep_alive: Option<u16>,
    pub session_present: bool,
    /// Close the connection once the client sent nothing for one and a half keep-alives (the
    /// assigned one, else the client's), as MQTT 5 §3.1.2.10 has a broker do.
    pub enforce_keep_alive: bool,
}

/// One connection, as the broker saw it.
#[derive(Debug, Clone)]
pub struct Connection {
    /// When its CONNECT arrived.
    pub started: Instant,
    /// The keep-alive the client asked for in its CONNECT (seconds).
    pub keep_alive: u16,
    /// What the CONNACK said.
    pub terms: Terms,
    /// The CONNACK was written (a question sent before it would break the protocol).
    pub connacked: bool,
    /// When each PINGREQ arrived.
    pub pings: Vec<Instant>,
    /// Closed by the broker: the client sent nothing for one and a half keep-alives.
    pub expired: bool,
}

impl Connection {
    /// PINGREQs within `window` of the CONNECT.
    pub fn pings_within(&self, window: Duration) -> usize {
        self.pings.iter().filter(|p| p.duration_since(self.started) <= window).count()
    }
}

/// How a question is flagged.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flags {
    /// RETAIN: a retained message, as sent at subscription (or as published, with Retain As
    /// Published).
    pub retain: bool,
    /// DUP: a copy delivered again.
    pub dup: bool,
}

/// A publish the client sent.
#[derive(Debug, Clone)]
pub struct Sent {
    pub topic: String,
    pub correlation: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

/// What the broker saw, for a test to wait on.
#[derive(Debug, Default)]
pub struct Seen {
    /// CONNECT packets, one a connection.
    pub connects: usize,
    /// The Receive Maximum the client announced in its last CONNECT.
    pub receive_maximum: Option<u16>,
    /// The keep-alive it asked for (seconds).
    pub keep_alive: u16,
    pub subscriptions: Vec<String>,
    /// Every publish of the client, in order.
    pub sent: Vec<Sent>,
    /// Acknowledgements (PUBACK) of the questions this broker sent.
    pub acked: usize,
    /// Questions sent to the client and not acknowledged, most at once.
    pub most_unacked: usize,
    /// Questions sent so far.
    pub questions: usize,
    /// DISCONNECT reason codes the client sent.
    pub disconnects: Vec<u8>,
    /// Every connection, in order.
    pub connections: Vec<Connection>,
}

impl Seen {
    /// Whether connection `n` (from 1) has had its CONNACK.
    pub fn connacked(&self, n: usize) -> bool {
        n >= 1 && self.connections.get(n - 1).is_some_and(|c| c.connacked)
    }

    /// The client's publishes on `topic`.
    pub fn sent_on(&self, topic: &str) -> usize {
        self.sent.iter().filter(|p| p.topic == topic).count()
    }
}

#[derive(Default)]
struct Shared {
    seen: Mutex<Seen>,
    /// The current connection's writing half; every write to a connection holds its lock, so
    /// packets never interleave.
    writer: Mutex<Option<Arc<Mutex<TcpStream>>>>,
    /// Packet ids of the client's publishes waiting for our PUBACK while `hold` is set.
    held: Mutex<Vec<u16>>,
    hold: AtomicBool,
    silent: AtomicBool,
    next_pkid: Mutex<u16>,
    /// The CONNACK of each connection in turn, the last repeated.
    terms: Vec<Terms>,
}

/// The broker: listening on `port` until dropped.
pub struct RogueBroker {
    pub port: u16,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
}

fn write_packet(stream: &mut TcpStream, packet: &Packet) -> std::io::Result<()> {
    let mut buf = bytes::BytesMut::new();
    packet.write(&mut buf, None).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
    stream.write_all(&buf)
}

impl RogueBroker {
    /// Listens on a free port of 127.0.0.1; CONNACK tells the client it may have
    /// `receive_maximum` of its publishes unacknowledged (small values make its outgoing window
    /// fill fast).
    pub fn start(receive_maximum: u16) -> RogueBroker {
        RogueBroker::start_with(vec![Terms { receive_maximum: Some(receive_maximum), ..Terms::default() }])
    }

    /// Listens on a free port of 127.0.0.1; each connection's CONNACK says the next of `terms`
    /// (the last one repeats).
    pub fn start_with(terms: Vec<Terms>) -> RogueBroker {
        assert!(!terms.is_empty(), "terms for at least the first connection");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let shared = Arc::new(Shared { terms, ..Shared::default() });
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let _ = conn.set_nodelay(true);
                let s = s.clone();
                let Ok(w) = conn.try_clone() else { continue };
                // A client that stops reading must not hang the test: its writes fail instead.
                let _ = w.set_write_timeout(Some(Duration::from_secs(20)));
                let w = Arc::new(Mutex::new(w));
                // A new connection replaces the old one (a reconnect); the old one is closed.
                if let Some(old) = s.writer.lock().unwrap().replace(w.clone()) {
                    let _ = old.lock().unwrap().shutdown(std::net::Shutdown::Both);
                }
                s.silent.store(false, Ordering::Relaxed);
                std::thread::spawn(move || serve(conn, w, &s));
            }
        });
        RogueBroker { port, shared, stop }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// Waits until `done` holds for what was seen, or `within` passes (a failure guard, not a
    /// measurement): whether it held.
    pub fn wait_for(&self, within: Duration, done: impl Fn(&Seen) -> bool) -> bool {
        // Checked every 50 ms, not on every packet: `done` may be costly, and the connection's
        // thread needs the lock.
        let end = Instant::now() + within;
        loop {
            if done(&self.shared.seen.lock().unwrap()) {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reads what was seen.
    pub fn seen<T>(&self, read: impl FnOnce(&Seen) -> T) -> T {
        read(&self.shared.seen.lock().unwrap())
    }

    /// Holds back (true) or sends (false, and at once for those held) the PUBACKs of the
    /// client's publishes.
    pub fn hold_acks(&self, hold: bool) {
        self.shared.hold.store(hold, Ordering::Relaxed);
        if !hold {
            let held: Vec<u16> = std::mem::take(&mut *self.shared.held.lock().unwrap());
            if let Some(w) = self.current() {
                let mut w = w.lock().unwrap();
                for pkid in held {
                    let _ = write_packet(&mut w, &Packet::PubAck(PubAck::new(pkid, None)));
                }
            }
        }
    }

    /// From now on this connection reads and answers nothing (no PINGRESP, no acks) and stays
    /// open, like a broker behind a dead link. A new connection is served normally.
    pub fn go_silent(&self) {
        self.shared.silent.store(true, Ordering::Relaxed);
    }

    /// Closes the current connection, as a broker that restarts does (no DISCONNECT).
    pub fn drop_connection(&self) {
        if let Some(w) = self.current() {
            let _ = w.lock().unwrap().shutdown(std::net::Shutdown::Both);
        }
    }

    fn current(&self) -> Option<Arc<Mutex<TcpStream>>> {
        self.shared.writer.lock().unwrap().clone()
    }

    /// Sends each `(payload, response topic, correlation data)` as a QoS 1 question on
    /// `topic`, all at once, whatever the client's Receive Maximum. An error if there is no
    /// client or it stopped reading (the write timed out).
    pub fn ask(&self, topic: &str, questions: &[(Vec<u8>, String, Vec<u8>)]) -> std::io::Result<()> {
        self.ask_flagged(topic, questions, Flags::default())
    }

    /// [`RogueBroker::ask`] with the RETAIN and DUP flags of `flags`.
    pub fn ask_flagged(
        &self,
        topic: &str,
        questions: &[(Vec<u8>, String, Vec<u8>)],
        flags: Flags,
    ) -> std::io::Result<()> {
        let mut buf = bytes::BytesMut::new();
        for (payload, response_topic, correlation) in questions {
            let pkid = {
                let mut n = self.shared.next_pkid.lock().unwrap();
                *n = if *n == u16::MAX { 1 } else { *n + 1 };
                *n
            };
            let props = PublishProperties {
                response_topic: Some(response_topic.clone()),
                correlation_data: Some(correlation.clone().into()),
                content_type: Some("application/json".into()),
                ..PublishProperties::default()
            };
            let mut p = Publish::new(topic, QoS::AtLeastOnce, payload.clone(), Some(props));
            p.pkid = pkid;
            p.retain = flags.retain;
            p.dup = flags.dup;
            Packet::Publish(p).write(&mut buf, None).expect("encode");
        }
        {
            let mut seen = self.shared.seen.lock().unwrap();
            seen.questions += questions.len();
            seen.most_unacked = seen.most_unacked.max(seen.questions - seen.acked);
        }
        let w = self.current().ok_or_else(|| std::io::Error::other("no client connected"))?;
        let mut w = w.lock().unwrap();
        w.write_all(&buf)
    }
}

impl Drop for RogueBroker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.shared.writer.lock().unwrap().take() {
            let _ = w.lock().unwrap().shutdown(std::net::Shutdown::Both);
        }
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(mut conn: TcpStream, out: Arc<Mutex<TcpStream>>, s: &Shared) {
    let mut buf = bytes::BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    // This connection's index in `Seen::connections`, once its CONNECT arrived.
    let mut this: Option<usize> = None;
    loop {
        let packet = match Packet::read(&mut buf, None) {
            Ok(p) => p,
            Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => match conn.read(&mut chunk) {
                Ok(0) => return,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    // The keep-alive ran out: the broker closes the connection.
                    if let Some(i) = this {
                        s.seen.lock().unwrap().connections[i].expired = true;
                    }
                    let _ = conn.shutdown(std::net::Shutdown::Both);
                    return;
                }
                Err(_) => return,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
            },
            Err(_) => return,
        };
        if s.silent.load(Ordering::Relaxed) {
            continue;
        }
        let reply = {
            let mut seen = s.seen.lock().unwrap();
            match packet {
                Packet::Connect(c, _, _) => {
                    let terms = s.terms[seen.connections.len().min(s.terms.len() - 1)].clone();
                    seen.connects += 1;
                    seen.keep_alive = c.keep_alive;
                    seen.receive_maximum = c.properties.as_ref().and_then(|p| p.receive_maximum);
                    let keep_alive = terms.server_keep_alive.unwrap_or(c.keep_alive);
                    if terms.enforce_keep_alive && keep_alive > 0 {
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(u64::from(keep_alive)) * 3 / 2));
                    }
                    this = Some(seen.connections.len());
                    seen.connections.push(Connection {
                        started: Instant::now(),
                        keep_alive: c.keep_alive,
                        terms: terms.clone(),
                        connacked: false,
                        pings: Vec::new(),
                        expired: false,
                    });
                    Some(Packet::ConnAck(ConnAck {
                        session_present: terms.session_present,
                        code: ConnectReturnCode::Success,
                        properties: Some(ConnAckProperties {
                            session_expiry_interval: None,
                            receive_max: terms.receive_maximum,
                            max_qos: None,
                            retain_available: None,
                            max_packet_size: None,
                            assigned_client_identifier: None,
                            topic_alias_max: None,
                            reason_string: None,
                            user_properties: Vec::new(),
                            wildcard_subscription_available: None,
                            subscription_identifiers_available: None,
                            shared_subscription_available: None,
                            server_keep_alive: terms.server_keep_alive,
                            response_information: None,
                            server_reference: None,
                            authentication_method: None,
                            authentication_data: None,
                        }),
                    }))
                }
                Packet::Subscribe(sub) => {
                    seen.subscriptions.extend(sub.filters.iter().map(|f| f.path.clone()));
                    Some(Packet::SubAck(SubAck {
                        pkid: sub.pkid,
                        return_codes: sub
                            .filters
                            .iter()
                            .map(|_| SubscribeReasonCode::Success(QoS::AtLeastOnce))
                            .collect(),
                        properties: None,
                    }))
                }
                Packet::Publish(p) => {
                    seen.sent.push(Sent {
                        topic: String::from_utf8_lossy(&p.topic).into_owned(),
                        correlation: p
                            .properties
                            .as_ref()
                            .and_then(|x| x.correlation_data.as_ref())
                            .map(|c| c.to_vec()),
                        payload: p.payload.to_vec(),
                    });
                    match p.qos {
                        QoS::AtMostOnce => None,
                        _ if s.hold.load(Ordering::Relaxed) => {
                            s.held.lock().unwrap().push(p.pkid);
                            None
                        }
                        _ => Some(Packet::PubAck(PubAck::new(p.pkid, None))),
                    }
                }
                Packet::PubAck(_) => {
                    seen.acked += 1;
                    None
                }
                Packet::PingReq(_) => {
                    if let Some(i) = this {
                        seen.connections[i].pings.push(Instant::now());
                    }
                    Some(Packet::PingResp(PingResp))
                }
                Packet::Disconnect(d) => {
                    seen.disconnects.push(d.reason_code as u8);
                    None
                }
                _ => None,
            }
        };
        if let Some(r) = reply {
            if write_packet(&mut out.lock().unwrap(), &r).is_err() {
                return;
            }
            if let (Packet::ConnAck(_), Some(i)) = (&r, this) {
                s.seen.lock().unwrap().connections[i].connacked = true;
            }
        }
    }
}
