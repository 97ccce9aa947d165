//! The agent's configuration file (TOML). Every key has a default; `laya-edge check-config`
//! prints the effective configuration. docs/config.md is the reference, and
//! `config/laya-edge.example.toml` a complete example.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A path key: absent or `""` is none, and none is written as `""`, so a file reads and writes
/// as it did when paths were strings.
mod opt_path {
    use std::path::PathBuf;

    use serde::{Deserialize, Deserializer, Serializer, de, ser};

    pub fn serialize<S: Serializer>(path: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        match path {
            Some(p) => s.serialize_str(p.to_str().ok_or_else(|| ser::Error::custom("a path that is not UTF-8"))?),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        let text = String::deserialize(d)?;
        if text.contains('\0') {
            return Err(de::Error::custom("a path with a NUL byte"));
        }
        Ok((!text.is_empty()).then(|| PathBuf::from(text)))
    }
}

/// `[model] laya`: one of laya-topics' [`LayaVersion`](laya_topics::wire::LayaVersion) names.
mod laya_version {
    use laya_topics::wire::LayaVersion;
    use serde::{Deserialize, Deserializer, Serializer, de};

    pub fn serialize<S: Serializer>(v: &LayaVersion, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LayaVersion, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|_| {
            let known: Vec<&str> = LayaVersion::ALL.iter().map(|v| v.as_str()).collect();
            de::Error::custom(format!("laya must be one of {}, got {text:?}", known.join(", ")))
        })
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("invalid configuration: {key} = {value} is outside its range, {range}")]
    OutOfRange { key: &'static str, value: u64, range: Range },
}

/// The values a numeric key accepts: `min` to `max`, both included, in the key's own unit (the
/// suffix of its name). Written `min to max`, as docs/config.md's range column writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub key: &'static str,
    pub min: u64,
    pub max: u64,
}

impl Range {
    const fn new(key: &'static str, min: u64, max: u64) -> Range {
        Range { key, min, max }
    }

    /// `value`, if it is in the range.
    pub fn check(&self, value: u64) -> Result<u64, ConfigError> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(ConfigError::OutOfRange { key: self.key, value, range: *self })
        }
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} to {}", self.min, self.max)
    }
}

/// The longest string MQTT carries (its length is two bytes): a client id, a user name, a
/// password, a topic name or filter, a Last Will's payload.
pub const MQTT_STRING_MAX: usize = 65_535;

/// The largest MQTT packet (its length is a variable byte integer of at most four bytes).
const MQTT_PACKET_MAX: u64 = 268_435_455;
/// What `serve` announces as its Maximum Packet Size beyond `mqtt.max_payload`
/// (`service::connection::PACKET_HEADROOM`).
const PACKET_HEADROOM: u64 = 16 * 1024;
const DAY_S: u64 = 86_400;
const HOUR_S: u64 = 3_600;
const HOUR_MS: u64 = 3_600_000;
const GIB: u64 = 1 << 30;

/// Every numeric key, its range and its value: the one table [`Config::check`] reads (and
/// docs/config.md's range column says, a test compares them). The bounds are what an edge board
/// can mean, and keep every use of a value in range of its arithmetic: durations within a day
/// (an hour in milliseconds), so no `Instant` or `Duration` sum, product or timer overflows;
/// counts that MQTT carries as two bytes within a `u16`.
#[allow(clippy::type_complexity)]
pub const NUMERIC: &[(Range, fn(&Config) -> u64)] = &[
    // MQTT's own: a four-byte interval, 4294967295 meaning "never expires".
    (Range::new("mqtt.session_expiry_s", 0, u32::MAX as u64), |c| u64::from(c.mqtt.session_expiry_s)),
    // MQTT's keep-alive is two bytes; below 5 s a busy link would be taken for lost.
    (Range::new("mqtt.keep_alive_s", 5, u16::MAX as u64), |c| c.mqtt.keep_alive_s),
    // The announced Maximum Packet Size (this plus the headroom) is at most MQTT's largest packet.
    (Range::new("mqtt.max_payload", 1, MQTT_PACKET_MAX - PACKET_HEADROOM), |c| c.mqtt.max_payload as u64),
    // MQTT's Receive Maximum is two bytes (0 here: `limits.queue`).
    (Range::new("mqtt.receive_maximum", 0, u16::MAX as u64), |c| u64::from(c.mqtt.receive_maximum)),
    (Range::new("mqtt.shutdown_grace_s", 0, HOUR_S), |c| c.mqtt.shutdown_grace_s),
    (Range::new("mqtt.reconnect_min_ms", 1, HOUR_MS), |c| c.mqtt.reconnect_min_ms),
    (Range::new("mqtt.reconnect_max_ms", 1, HOUR_MS), |c| c.mqtt.reconnect_max_ms),
    (Range::new("mqtt.telemetry_interval_s", 0, DAY_S), |c| c.mqtt.telemetry_interval_s),
    // The Receive Maximum it becomes is two bytes.
    (Range::new("limits.queue", 1, u16::MAX as u64), |c| c.limits.queue as u64),
    (Range::new("limits.questions_per_request", 1, u16::MAX as u64), |c| c.limits.questions_per_request as u64),
    (Range::new("limits.options_per_question", 1, u16::MAX as u64), |c| c.limits.options_per_question as u64),
    // Decoding, laying out and dropping a document recurse once per level: the stack's bound.
    (Range::new("limits.nesting_depth", 1, 256), |c| c.limits.nesting_depth as u64),
    (Range::new("limits.remember_replies", 0, 1 << 20), |c| c.limits.remember_replies as u64),
    (Range::new("limits.remember_bytes", 0, GIB), |c| c.limits.remember_bytes as u64),
    (Range::new("limits.max_request_tokens", 1, 1 << 20), |c| c.limits.max_request_tokens as u64),
    (Range::new("limits.waiting_bytes", 0, GIB), |c| c.limits.waiting_bytes as u64),
    (Range::new("limits.decoded_bytes", 1 << 20, 1 << 40), |c| c.limits.decoded_bytes as u64),
    (Range::new("limits.loop_stall_s", 0, HOUR_S), |c| c.limits.loop_stall_s),
    (Range::new("engine.deadline_ms", 0, HOUR_MS), |c| c.engine.deadline_ms),
    (Range::new("engine.max_restarts", 0, 1000), |c| c.engine.max_restarts as u64),
    (Range::new("engine.restart_window_s", 0, DAY_S), |c| c.engine.restart_window_s),
    (Range::new("engine.max_failed_health", 0, 1000), |c| c.engine.max_failed_health as u64),
    (Range::new("engine.ready_wait_s", 0, DAY_S), |c| c.engine.ready_wait_s),
    (Range::new("engine.retry_primary_s", 1, DAY_S), |c| c.engine.retry_primary_s),
    (Range::new("engine.load_allowance_ms", 1, HOUR_MS), |c| c.engine.load_allowance_ms),
    (Range::new("engine.expected_ms", 0, HOUR_MS), |c| c.engine.expected_ms),
    (Range::new("engine.startup_timeout_s", 1, DAY_S), |c| c.engine.startup_timeout_s),
    (Range::new("engine.threads", 0, 256), |c| c.engine.threads as u64),
    // librknnrt's masks: 0 (auto), one bit per core, 0xFFFF (all).
    (Range::new("rknn.core_mask", 0, u16::MAX as u64), |c| u64::from(c.rknn.core_mask)),
    // One context per NPU core of the RK3588.
    (Range::new("rknn.contexts", 1, 3), |c| c.rknn.contexts as u64),
    // A week.
    (Range::new("probe.interval_min", 0, 7 * 24 * 60), |c| c.probe.interval_min),
    // Requests past authentication at once (laya.serve's LAYA_MAX_CONCURRENT); more get 503.
    (Range::new("http.max_concurrent", 1, 4096), |c| c.http.max_concurrent as u64),
    (Range::new("http.body_read_timeout_s", 1, HOUR_S), |c| c.http.body_read_timeout_s),
    (Range::new("http.header_read_timeout_s", 1, HOUR_S), |c| c.http.header_read_timeout_s),
    (Range::new("http.idle_timeout_s", 1, HOUR_S), |c| c.http.idle_timeout_s),
    // Each open connection costs a task and its buffers.
    (Range::new("http.max_connections", 1, 65_535), |c| c.http.max_connections as u64),
    // A request head within this many bytes; below 1 KiB a browser's or curl's would not fit.
    (Range::new("http.max_header_bytes", 1024, 1 << 20), |c| c.http.max_header_bytes as u64),
];

/// The range of a numeric key (`section.key`).
pub fn range_of(key: &str) -> Option<Range> {
    NUMERIC.iter().map(|(r, _)| *r).find(|r| r.key == key)
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub mqtt: Mqtt,
    pub limits: Limits,
    pub model: Model,
    pub engine: Engine,
    pub rknn: Rknn,
    pub qnn: Qnn,
    pub cpu: Cpu,
    pub log: Log,
    pub probe: ProbeConfig,
    pub thin_edge: ThinEdge,
    pub http: Http,
}

/// `[mqtt]`: the broker connection and the topic tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Mqtt {
    /// `mqtt://host:port` or `mqtts://host:port`.
    pub broker: String,
    /// This device's id; empty means the hostname.
    pub device: String,
    /// MQTT client id; empty means `laya-edge-{device}` (stable, so the session persists).
    pub client_id: String,
    pub prefix: String,
    /// Fleet name; with `share_group`, also take questions from `$share/{group}/{prefix}/fleet/{fleet}/ask`.
    pub fleet: String,
    pub share_group: String,
    /// How long the broker keeps this device's session (and its unacknowledged questions).
    pub session_expiry_s: u32,
    pub keep_alive_s: u64,
    pub username: String,
    /// A file holding the password (never the password itself in this file).
    #[serde(with = "opt_path")]
    pub password_file: Option<PathBuf>,
    /// CA certificates (PEM) to verify the broker for `mqtts://` (required with mqtts).
    #[serde(with = "opt_path")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    #[serde(with = "opt_path")]
    pub client_cert: Option<PathBuf>,
    #[serde(with = "opt_path")]
    pub client_key: Option<PathBuf>,
    /// Topic filters a request's response topic must match; `{prefix}` is substituted. Each
    /// must lie under `{prefix}/reply/{client}/{key}` (checked: a wider filter would let a
    /// question make the device publish on status, ask or another device's topics).
    pub response_topics: Vec<String>,
    /// Largest request payload in bytes; larger ones get `too_large`. The broker itself drops
    /// packets above `max_payload` + 16 KiB (the Maximum Packet Size the agent announces).
    pub max_payload: usize,
    /// MQTT 5 Receive Maximum: questions the broker may have delivered and not yet had
    /// acknowledged; 0 means 65535 (the most there is) with a waiting room, `limits.queue`
    /// without one (`limits.waiting_bytes` 0). The broker keeps the rest in its queue for this
    /// session, in the order they came: questions wait in the agent instead, where each client
    /// gets its turn (issue #40).
    pub receive_maximum: u16,
    /// On SIGTERM, how long questions in progress may take to finish; those still unanswered
    /// then are neither answered nor acknowledged (the broker delivers them again).
    pub shutdown_grace_s: u64,
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    /// Seconds between telemetry messages (0: none).
    pub telemetry_interval_s: u64,
    /// `json` or `cbor` (smaller, for constrained links): how telemetry documents are encoded;
    /// the MQTT 5 content type says which.
    pub telemetry_encoding: TelemetryEncoding,
}

impl Default for Mqtt {
    fn default() -> Self {
        Mqtt {
            broker: "mqtt://localhost:1883".into(),
            device: String::new(),
            client_id: String::new(),
            prefix: laya_topics::topic::DEFAULT_PREFIX.into(),
            fleet: String::new(),
            share_group: String::new(),
            session_expiry_s: 3600,
            keep_alive_s: 30,
            username: String::new(),
            password_file: None,
            ca_file: None,
            client_cert: None,
            client_key: None,
            response_topics: vec![laya_topics::topic::DEFAULT_RESPONSE_TOPICS.into()],
            max_payload: 256 * 1024,
            receive_maximum: 0,
            shutdown_grace_s: 30,
            reconnect_min_ms: 500,
            reconnect_max_ms: 30_000,
            telemetry_interval_s: 60,
            telemetry_encoding: TelemetryEncoding::Json,
        }
    }
}

/// `[limits]`: what one request may ask and how much may wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Requests admitted but not yet answered; beyond this, `overloaded`.
    pub queue: usize,
    pub questions_per_request: usize,
    pub options_per_question: usize,
    pub nesting_depth: usize,
    /// Recent request ids remembered to re-send the same reply on redelivery.
    pub remember_replies: usize,
    /// Bytes those remembered replies may take in all; the oldest are forgotten beyond.
    pub remember_bytes: usize,
    /// Tokens one request's rows may carry together (after layout, within the model's
    /// `max_len`); beyond this the request gets `too_large`. Bounds one request's work and the
    /// CPU worker's memory (docs/config.md, "What one request can cost").
    pub max_request_tokens: usize,
    /// Payload bytes of questions a broker delivers beyond `queue` (one that does not honour the
    /// Receive Maximum, such as mosquitto before 2.0.13) that may wait, unacknowledged, for a
    /// place; beyond this they get `overloaded`. `0`: no waiting.
    pub waiting_bytes: usize,
    /// The memory budget of requests being decoded and laid out, and of their rows until
    /// answered, as reckoned from their payloads (docs/config.md, "What the agent's memory is
    /// bounded by"): a request waits, undecoded, while the budget lacks its part; one reckoned at
    /// more than the whole budget runs alone.
    pub decoded_bytes: usize,
    /// Seconds the service loop may go without a turn (and the broker connection task without
    /// one, beyond its own longest wait) before `serve` exits with status 70 for its supervisor
    /// to restart it; under systemd the watchdog pings stop as well. `0`: no watch.
    pub loop_stall_s: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue: 64,
            questions_per_request: 64,
            options_per_question: 255,
            nesting_depth: 64,
            remember_replies: 1024,
            remember_bytes: 8 << 20,
            max_request_tokens: 16_384,
            waiting_bytes: 16 << 20,
            decoded_bytes: 96 << 20,
            loop_stall_s: 60,
        }
    }
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Model {
    /// A laya checkpoint directory or an NPU bundle (with `laya-bundle.json`).
    pub dir: PathBuf,
    /// A model store (`crate::store`; empty: none): when set, the agent serves its `current`
    /// version, resolved when the configuration is read (at start and at every reload), and `dir`
    /// is that version's directory ([`Model::store`]).
    pub store: PathBuf,
    /// The laya whose semantics the model is answered with: `"0.3.20"` (the default) or
    /// `"0.4.15"` (docs/config.md says what differs).
    #[serde(with = "laya_version")]
    pub laya: laya_topics::wire::LayaVersion,
}

impl Default for Model {
    fn default() -> Self {
        Model { dir: PathBuf::from("/usr/share/laya/models/laya"), store: PathBuf::new(), laya: Default::default() }
    }
}

impl Model {
    /// The model store, if one is configured.
    pub fn store(&self) -> Option<&Path> {
        (!self.store.as_os_str().is_empty()).then_some(self.store.as_path())
    }
}

/// Which backend runs the model (`engine.backend`, `--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The CPU reference model.
    Cpu,
    /// Deterministic logits from the input, no model (tests and benchmarks).
    Null,
    /// Rockchip RK3588 NPU through librknnrt (needs an NPU bundle and the `rknn` feature).
    Rknn,
    /// Qualcomm HTP through QNN (needs an NPU bundle and the `qnn` feature).
    Qnn,
}

impl BackendKind {
    /// The name in the configuration (`engine.backend`) and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Null => "null",
            BackendKind::Rknn => "rknn",
            BackendKind::Qnn => "qnn",
        }
    }
}

/// What serves while the backend is degraded (`engine.fallback`): nothing (`""`) or a CPU worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Fallback {
    #[default]
    #[serde(rename = "")]
    None,
    #[serde(rename = "cpu")]
    Cpu,
}

/// How telemetry documents are encoded (`mqtt.telemetry_encoding`): the file's name for a
/// [`laya_topics::wire::Encoding`], which is not serde (laya-topics converts through `Value`, ADR 0001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TelemetryEncoding {
    #[default]
    Json,
    Cbor,
}

impl TelemetryEncoding {
    /// The wire encoding it names.
    pub fn encoding(self) -> laya_topics::wire::Encoding {
        match self {
            TelemetryEncoding::Json => laya_topics::wire::Encoding::Json,
            TelemetryEncoding::Cbor => laya_topics::wire::Encoding::Cbor,
        }
    }
}

/// `qnn.performance`: the runtime's own voting, or burst (DCVS off, top voltage corner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Performance {
    /// Also what an empty string means.
    #[default]
    #[serde(alias = "")]
    Default,
    Burst,
}

/// `[engine]`: the backend and its supervision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Engine {
    /// `cpu`, `null`, `rknn` or `qnn`.
    pub backend: BackendKind,
    /// Fixed deadline per question (per NPU job); 0 derives it from recent calls (4 x p99 per
    /// row, at least 1 s a call).
    pub deadline_ms: u64,
    /// `cpu` to serve from a CPU worker while the backend is degraded; empty for none.
    pub fallback: Fallback,
    /// Restarts within `restart_window_s` before the backend counts as degraded.
    pub max_restarts: usize,
    pub restart_window_s: u64,
    /// Failed health calls in a row that degrade the backend at once, whatever the window
    /// (0: only `max_restarts`).
    pub max_failed_health: usize,
    /// How long a question waits for a backend that is not serving (loading, health-checked,
    /// restarting) before the fallback is started for it, or, without one, it is refused (0:
    /// it waits).
    pub ready_wait_s: u64,
    /// How often a degraded backend is tried again.
    pub retry_primary_s: u64,
    /// The health call's deadline while nothing is known about the backend's speed (the first
    /// inference of a fresh runtime: graph finalize, first DSP session).
    pub load_allowance_ms: u64,
    /// The expected time of one question (one NPU job) in ms; seeds the deadline until enough
    /// calls were measured (0: the health call's measured time alone).
    pub expected_ms: u64,
    /// How long a worker may take to load its backend before it is killed and restarted
    /// (generating QNN context binaries from DLCs on first start takes ~33 s a graph).
    pub startup_timeout_s: u64,
    /// Tensor-math threads for the CPU backend (0: all cores).
    pub threads: usize,
    /// Faults for the `null` backend (testing only), e.g. `hang@3`.
    pub null_faults: String,
}

impl Default for Engine {
    fn default() -> Self {
        Engine {
            backend: BackendKind::Cpu,
            deadline_ms: 0,
            fallback: Fallback::None,
            max_restarts: 5,
            restart_window_s: 300,
            max_failed_health: 3,
            ready_wait_s: 20,
            retry_primary_s: 300,
            load_allowance_ms: 60_000,
            expected_ms: 0,
            startup_timeout_s: 120,
            threads: 0,
            null_faults: String::new(),
        }
    }
}

/// `[cpu] weights`: what the CPU model's encoder multiplies with. `f32` is the default and the
/// reference; `int8` and `bf16` are opt-in modes for boards (issue #43), each judged by the
/// bundle's probe as its own path (`cpu-int8`, `cpu-bf16`) and refused at start when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CpuWeights {
    /// The f32 weights as the checkpoint has them (widened from f16/bf16).
    #[default]
    F32,
    /// The encoder's dense weights but the attention's `Wqkv` (three of four per layer)
    /// quantised at load to int8 per output channel, activations per row, int8 products with i32
    /// sums; `Wqkv`, embeddings, norms, attention and the head stay f32.
    Int8,
    /// The encoder's dense weights and their inputs rounded to bf16, f32 sums (CPUs with AVX-512
    /// BF16 only).
    Bf16,
}

impl CpuWeights {
    /// The name in the configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CpuWeights::F32 => "f32",
            CpuWeights::Int8 => "int8",
            CpuWeights::Bf16 => "bf16",
        }
    }
}

/// `[cpu]`: the CPU backend's own settings (the primary's and the fallback's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Cpu {
    /// `f32` (the default), `int8` or `bf16` ([`CpuWeights`]).
    pub weights: CpuWeights,
}

/// `[rknn]`: the Rockchip runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rknn {
    /// Explicit path of librknnrt.so (2.3.2 for the published graph); `RKNN_LIB` if empty.
    #[serde(with = "opt_path")]
    pub library: Option<PathBuf>,
    /// The core mask of the one context when `contexts` is 1.
    pub core_mask: u32,
    /// Contexts per graph, 1 to 3; with more than one, each is pinned to its own NPU core and a
    /// request's questions run side by side.
    pub contexts: usize,
}

impl Default for Rknn {
    fn default() -> Self {
        Rknn { library: None, core_mask: 0xFFFF, contexts: 3 }
    }
}

/// `[qnn]`: the Qualcomm runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Qnn {
    /// Path of libQnnHtp.so.
    #[serde(with = "opt_path")]
    pub backend_lib: Option<PathBuf>,
    /// Path of libQnnSystem.so.
    #[serde(with = "opt_path")]
    pub system_lib: Option<PathBuf>,
    /// Where the DSP skeleton libraries are (`ADSP_LIBRARY_PATH`).
    /// (A search list, `;`-separated as FastRPC reads it, not one path; empty: none.)
    pub adsp_library_path: String,
    /// `default` (the runtime's own voting) or `burst` (DCVS off, top voltage corner).
    pub performance: Performance,
    /// `qnn-context-binary-generator`, for bundles whose graphs ship only a DLC; empty: none.
    #[serde(with = "opt_path")]
    pub generator: Option<PathBuf>,
    /// The DLC loader the generator needs (`libQnnModelDlc.so`).
    #[serde(with = "opt_path")]
    pub model_lib: Option<PathBuf>,
    /// Where generated context binaries are cached; empty: systemd's `$STATE_DIRECTORY`.
    #[serde(with = "opt_path")]
    pub state_dir: Option<PathBuf>,
    /// The SoC generated binaries are for (part of their cache key); empty: `qcs6490`.
    pub soc: String,
}

impl Default for Qnn {
    fn default() -> Self {
        Qnn {
            backend_lib: None,
            system_lib: None,
            adsp_library_path: String::new(),
            performance: Performance::Default,
            generator: None,
            model_lib: None,
            state_dir: None,
            soc: String::new(),
        }
    }
}

/// `[log]`: what the agent and its worker log (see `crate::platform::logging`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Log {
    /// A `RUST_LOG`-style filter (`info`, `debug`, `laya_edge::engine=debug,warn`); the `--log`
    /// flag overrides it; empty: `$LAYA_LOG`, else `$RUST_LOG`, else `info`.
    pub level: String,
}

/// `[probe]`: when the bundle's probe runs (it always runs on every new worker, with the health
/// call; see `engine::probe`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProbeConfig {
    /// Run it again on the serving worker every this many minutes (0: only on new workers).
    pub interval_min: u64,
}

impl Default for ProbeConfig {
    fn default() -> ProbeConfig {
        ProbeConfig { interval_min: 60 }
    }
}

/// `[thin_edge]`: the agent as a thin-edge.io service (the `thin_edge` module; the topics and
/// documents are `laya_topics::thin_edge`'s), on the `[mqtt]` broker under a client id of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ThinEdge {
    /// Publish the registration, health, measurements and events (off: nothing on `te/`).
    pub enabled: bool,
    /// thin-edge's topic root (its `mqtt.topic_root`).
    pub topic_root: String,
    /// The thin-edge device the agent runs on: `main`, or a child device's id.
    pub device: String,
    /// The service name the agent registers as.
    pub service: String,
}

impl Default for ThinEdge {
    fn default() -> ThinEdge {
        ThinEdge {
            enabled: false,
            topic_root: laya_topics::thin_edge::DEFAULT_ROOT.into(),
            device: laya_topics::thin_edge::DEFAULT_DEVICE.into(),
            service: laya_topics::thin_edge::DEFAULT_SERVICE.into(),
        }
    }
}

/// `[http]`: laya.serve's `/v1/systemone` API, `/health` and `/metrics` (agent/src/http/,
/// feature `http`). Off while `listen` is empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Http {
    /// `IP:port` to listen on (`127.0.0.1:8000`); empty: no HTTP door. An address that is not
    /// loopback needs `api_key_file`.
    pub listen: String,
    /// A file holding the bearer (its whole content, trailing newlines trimmed); empty: none.
    #[serde(with = "opt_path")]
    pub api_key_file: Option<PathBuf>,
    /// Decision requests past authentication at once; more get 503 (laya.serve's default).
    pub max_concurrent: usize,
    /// Time for a whole request body; then 408.
    pub body_read_timeout_s: u64,
    /// Leave out what laya.serve's `LAYA_JEV_STRICT` leaves out.
    pub jev_strict: bool,
    /// The names a request's `model` may carry; empty: the served model's own name.
    pub model_names: Vec<String>,
    /// Time for a request head (the request line and headers): a slower client is cut off.
    pub header_read_timeout_s: u64,
    /// A keep-alive connection with no request for this long is closed.
    pub idle_timeout_s: u64,
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// The largest request head, in bytes; a larger one is answered 431 and closed.
    pub max_header_bytes: usize,
}

impl Default for Http {
    fn default() -> Http {
        Http {
            listen: String::new(),
            api_key_file: None,
            max_concurrent: 16,
            body_read_timeout_s: 10,
            jev_strict: false,
            model_names: Vec::new(),
            header_read_timeout_s: 10,
            idle_timeout_s: 30,
            max_connections: 64,
            max_header_bytes: 16 * 1024,
        }
    }
}

impl ThinEdge {
    /// The thin-edge service these keys name (checked: topic-safe names, lengths).
    pub fn service(&self) -> Result<laya_topics::thin_edge::Service, laya_topics::thin_edge::NameError> {
        laya_topics::thin_edge::Service::new(&self.topic_root, &self.device, &self.service)
    }
}

impl Http {
    /// The address to listen on, or `None` when the door is off.
    pub fn listen_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        if self.listen.trim().is_empty() {
            return Ok(None);
        }
        let addr: std::net::SocketAddr = self.listen.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "http.listen {:?} must be an IP address and a port, such as \"127.0.0.1:8000\" or \"[::1]:8000\"",
                self.listen
            ))
        })?;
        if !addr.ip().is_loopback() && self.api_key_file.is_none() {
            return Err(ConfigError::Invalid(format!(
                "http.listen {:?} is not a loopback address: anyone on the network could ask the model; set http.api_key_file (a file holding the bearer), or listen on 127.0.0.1",
                self.listen
            )));
        }
        Ok(Some(addr))
    }
}

/// Whether a configuration file's text sets `[mqtt] broker`.
fn names_a_broker(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("mqtt").and_then(|m| m.as_table()).map(|m| m.contains_key("broker")))
        .unwrap_or(false)
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Config::parse(&text, path)
    }

    /// Parses and checks a configuration read from `origin` (a file, or the worker's environment).
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let mut config: Config =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: origin.to_owned(), message: e.to_string() })?;
        // A file that opens the HTTP door and names no broker serves HTTP alone (a board whose
        // apps are all local): its broker is none, not the default's localhost.
        if !config.http.listen.trim().is_empty() && !names_a_broker(text) {
            config.mqtt.broker = String::new();
        }
        config.check()?;
        Ok(config)
    }

    /// The configuration as TOML: what `check-config` prints and what the agent hands its worker.
    /// [`Config::parse`] reads it back to an equal `Config`.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Invalid(format!("cannot write the configuration: {e}")))
    }

    /// Checks values serde cannot.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.qnn.generator.is_some() && (self.qnn.model_lib.is_none() || self.qnn.backend_lib.is_none()) {
            return bad("qnn.generator needs qnn.model_lib (libQnnModelDlc.so) and qnn.backend_lib".into());
        }
        if self.thin_edge.enabled && self.mqtt.broker.trim().is_empty() {
            return bad("thin_edge.enabled needs [mqtt] broker: the thin-edge publication goes to that broker (thin-edge's own, mqtt://localhost:1883 on a thin-edge device)".into());
        }
        self.thin_edge.service().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.mqtt.broker.is_empty() {
            if self.http.listen.trim().is_empty() {
                return bad(
                    "mqtt.broker is empty and http.listen too: nothing to serve questions on (set one or both)".into(),
                );
            }
        } else if !(self.mqtt.broker.starts_with("mqtt://") || self.mqtt.broker.starts_with("mqtts://")) {
            return bad(format!("mqtt.broker {:?} must be an mqtt:// or mqtts:// URL", self.mqtt.broker));
        }
        if self.mqtt.fleet.is_empty() != self.mqtt.share_group.is_empty() {
            return bad("mqtt.fleet and mqtt.share_group go together".into());
        }
        if self.mqtt.client_cert.is_none() != self.mqtt.client_key.is_none() {
            return bad("mqtt.client_cert and mqtt.client_key go together".into());
        }
        for (range, value) in NUMERIC {
            range.check(value(self))?;
        }
        self.http.listen_addr()?;
        if self.http.model_names.iter().any(|n| n.trim().is_empty()) {
            return bad("http.model_names holds an empty name".into());
        }
        let schema =
            laya_topics::topic::Schema::new(&self.mqtt.prefix).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.check_mqtt_strings(&schema)?;
        for filter in &self.mqtt.response_topics {
            schema.response_filter(filter).map_err(|e| ConfigError::Invalid(format!("mqtt.response_topics: {e}")))?;
        }
        if !self.log.level.trim().is_empty() {
            tracing_subscriber::EnvFilter::try_new(&self.log.level)
                .map_err(|e| ConfigError::Invalid(format!("log.level {:?}: {e}", self.log.level)))?;
        }
        Ok(())
    }

    /// MQTT's own limits on what the configuration puts in its packets: each string at most
    /// [`MQTT_STRING_MAX`] bytes (a longer one cannot be encoded: the broker would refuse every
    /// connection), and no NUL in a client id or user name (a malformed packet). The topics are
    /// those the agent publishes and subscribes to, made of the prefix, the device, the fleet and
    /// the share group; a topic that is not valid otherwise is `preflight`'s to name.
    fn check_mqtt_strings(&self, schema: &laya_topics::topic::Schema) -> Result<(), ConfigError> {
        use laya_topics::topic::Channel;
        let too_long = |what: &str, len: usize| {
            ConfigError::Invalid(format!(
                "{what} is {len} bytes; MQTT carries at most {MQTT_STRING_MAX} (a two-byte length)"
            ))
        };
        let client_id =
            if self.mqtt.client_id.is_empty() { "the client id (laya-edge-{mqtt.device})" } else { "mqtt.client_id" };
        let mut ids = vec![(client_id, self.client_id()), ("mqtt.username", self.mqtt.username.clone())];
        if self.thin_edge.enabled {
            ids.push(("the thin-edge client id ({client id}-tedge)", self.thin_edge_client_id()));
        }
        for (key, value) in ids {
            if value.len() > MQTT_STRING_MAX {
                return Err(too_long(key, value.len()));
            }
            if value.contains('\0') {
                return Err(ConfigError::Invalid(format!("{key} has a NUL character, which MQTT does not allow")));
            }
        }
        let device = self.device();
        let mut topics = Vec::new();
        for channel in [Channel::Ask, Channel::Status, Channel::Telemetry, Channel::Events, Channel::Errors] {
            // A device id that makes no topic is preflight's error, named there.
            if let Ok(topic) = schema.topic(&device, channel) {
                topics.push(("the topic", topic.to_string()));
            }
        }
        if !self.mqtt.fleet.is_empty()
            && let Ok(shared) = schema.fleet_subscription(&self.mqtt.share_group, &self.mqtt.fleet)
        {
            topics.push(("the fleet subscription", shared));
        }
        let filters = self.mqtt.response_topics.iter().map(|f| f.replace("{prefix}", schema.prefix()));
        topics.extend(filters.map(|f| ("the response topic filter", f)));
        for (what, topic) in topics {
            if topic.len() > MQTT_STRING_MAX {
                let start: String = topic.chars().take(60).collect();
                return Err(too_long(
                    &format!("{what} {start:?}... (from mqtt.prefix, device, fleet, share_group)"),
                    topic.len(),
                ));
            }
        }
        Ok(())
    }

    /// The device id: configured, else the hostname.
    pub fn device(&self) -> String {
        if !self.mqtt.device.is_empty() {
            return self.mqtt.device.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .map(|h| h.trim().replace(['/', '+', '#'], "-"))
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "laya-edge".into())
    }

    /// The Receive Maximum announced to the broker: `mqtt.receive_maximum`, else 65535 (the
    /// protocol's limit) with a waiting room, `limits.queue` (at most 65535) without one.
    pub fn receive_maximum(&self) -> u16 {
        match self.mqtt.receive_maximum {
            0 if self.limits.waiting_bytes > 0 => u16::MAX,
            0 => self.limits.queue.clamp(1, usize::from(u16::MAX)) as u16,
            n => n,
        }
    }

    /// The thin-edge publication's own MQTT client id: `{client id}-tedge`.
    pub fn thin_edge_client_id(&self) -> String {
        format!("{}-tedge", self.client_id())
    }

    /// The MQTT client id: configured, else `laya-edge-{device}`.
    pub fn client_id(&self) -> String {
        if self.mqtt.client_id.is_empty() {
            format!("laya-edge-{}", self.device())
        } else {
            self.mqtt.client_id.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_all_defaults() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c, Config::default());
        c.check().unwrap();
        assert_eq!(c.mqtt.session_expiry_s, 3600);
        assert_eq!(c.limits.questions_per_request, 64);
    }

    /// The keys the schema accepts in `section` (`""`: the sections), from serde's refusal of an
    /// unknown one ("unknown field `x`, expected one of `a`, `b`, ...").
    fn schema_keys(section: &str) -> Vec<String> {
        let probe =
            if section.is_empty() { "no_such_key = 0".to_owned() } else { format!("[{section}]\nno_such_key = 0") };
        let err = toml::from_str::<Config>(&probe).expect_err("an unknown key is refused").to_string();
        // serde says "expected one of `a`, `b`" for several fields and "expected `a`" for one.
        let expected = err
            .split("expected one of")
            .nth(1)
            .or_else(|| err.split(", expected").nth(1))
            .unwrap_or_else(|| panic!("no key list in: {err}"));
        let keys: Vec<String> = expected.split('`').skip(1).step_by(2).map(str::to_owned).collect();
        assert!(!keys.is_empty(), "no keys in: {err}");
        keys
    }

    #[test]
    fn the_example_config_is_valid_and_complete() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/laya-edge.example.toml");
        let c = Config::load(&path).unwrap();
        // Every section and every key of the schema is spelled out (a missing key would parse to
        // its default and pass the comparison below unseen).
        let example: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let sorted = |k: Vec<String>| k.into_iter().collect::<std::collections::BTreeSet<_>>();
        assert_eq!(sorted(example.keys().cloned().collect()), sorted(schema_keys("")), "the example's sections");
        for (section, table) in &example {
            let keys = table.as_table().expect("a table").keys().cloned().collect();
            assert_eq!(sorted(keys), sorted(schema_keys(section)), "the example's [{section}] keys");
        }
        // And its values are the defaults, apart from the model dir.
        assert_eq!(c.mqtt, Mqtt::default());
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.engine, Engine::default());
        assert_eq!(c.rknn, Rknn::default());
        assert_eq!(c.qnn, Qnn::default());
        assert_eq!(c.log, Log::default());
        assert_eq!(c.thin_edge, ThinEdge::default());
    }

    #[test]
    fn qnn_performance_defaults_to_default_not_an_empty_string() {
        assert_eq!(Config::default().qnn.performance, Performance::Default);
        let c: Config = toml::from_str("[qnn]\nsoc = \"qcm6490\"").unwrap();
        assert_eq!(c.qnn.performance, Performance::Default);
        assert!(Config::default().to_toml().unwrap().contains("performance = \"default\""));
    }

    #[test]
    fn config_enums_read_and_write_the_strings_of_the_file() {
        let text = "[mqtt]\ntelemetry_encoding = \"cbor\"\n[engine]\nbackend = \"rknn\"\nfallback = \"cpu\"\n[qnn]\nperformance = \"burst\"\n";
        let c = Config::parse(text, Path::new("-")).unwrap();
        assert_eq!(c.mqtt.telemetry_encoding, TelemetryEncoding::Cbor);
        assert_eq!((c.engine.backend, c.engine.fallback), (BackendKind::Rknn, Fallback::Cpu));
        assert_eq!(c.qnn.performance, Performance::Burst);
        let written = c.to_toml().unwrap();
        for line in
            ["telemetry_encoding = \"cbor\"", "backend = \"rknn\"", "fallback = \"cpu\"", "performance = \"burst\""]
        {
            assert!(written.contains(line), "{line} in {written}");
        }
        // An empty fallback is none, an empty performance the default: what the files said before.
        let c = Config::parse("[engine]\nfallback = \"\"\n[qnn]\nperformance = \"\"\n", Path::new("-")).unwrap();
        assert_eq!((c.engine.fallback, c.qnn.performance), (Fallback::None, Performance::Default));
        assert!(Config::default().to_toml().unwrap().contains("fallback = \"\""));
        // Paths: absent or empty is none, and none is written as an empty string, as before.
        let c = Config::parse("[mqtt]\nca_file = \"\"\n[rknn]\nlibrary = \"/usr/lib/r.so\"\n", Path::new("-")).unwrap();
        assert_eq!((c.mqtt.ca_file.as_deref(), c.mqtt.client_key.as_deref()), (None, None));
        assert_eq!(c.rknn.library.as_deref(), Some(Path::new("/usr/lib/r.so")));
        let written = c.to_toml().unwrap();
        assert!(written.contains("ca_file = \"\"") && written.contains("library = \"/usr/lib/r.so\""), "{written}");
        for kind in [BackendKind::Cpu, BackendKind::Null, BackendKind::Rknn, BackendKind::Qnn] {
            let c = Config::parse(&format!("[engine]\nbackend = \"{}\"", kind.name()), Path::new("-")).unwrap();
            assert_eq!(c.engine.backend, kind);
        }
    }

    #[test]
    fn the_toml_a_config_is_written_as_reads_back_to_the_same_config() {
        let mut c = Config::default();
        c.mqtt.device = "board \"7\"".into();
        c.mqtt.response_topics = vec!["{prefix}/reply/plc/+".into(), "{prefix}/reply/+/x/#".into()];
        c.engine.backend = BackendKind::Qnn;
        c.engine.threads = 3;
        c.rknn.core_mask = 3;
        c.qnn.performance = Performance::Burst;
        c.qnn.backend_lib = Some("/opt/qairt/lib/libQnnHtp.so".into());
        c.log.level = "laya_edge::engine=debug,warn".into();
        let text = c.to_toml().unwrap();
        assert!(text.contains("[qnn]") && text.contains("performance = \"burst\""), "{text}");
        assert_eq!(Config::parse(&text, Path::new("round-trip")).unwrap(), c);
        assert_eq!(Config::parse(&Config::default().to_toml().unwrap(), Path::new("-")).unwrap(), Config::default());
    }

    #[test]
    fn rknn_contexts_outside_one_to_three_are_refused() {
        for n in [0, 4, 64] {
            let mut c = Config::default();
            c.rknn.contexts = n;
            let err = c.check().err().unwrap_or_else(|| panic!("contexts = {n} accepted"));
            assert!(err.to_string().contains("rknn.contexts"), "{err}");
        }
        for n in [1, 2, 3] {
            let mut c = Config::default();
            c.rknn.contexts = n;
            c.check().unwrap();
        }
        assert_eq!(Config::default().rknn.contexts, 3);
    }

    #[test]
    fn a_log_level_that_is_not_a_filter_is_refused() {
        let c: Config = toml::from_str("[log]\nlevel = \"laya_edge=loud\"").unwrap();
        assert!(c.check().unwrap_err().to_string().contains("log.level"));
        let c: Config = toml::from_str("[log]\nlevel = \"laya_edge::engine=debug,warn\"").unwrap();
        assert!(c.check().is_ok());
    }

    #[test]
    fn response_topics_that_could_reach_status_ask_or_other_devices_topics_are_refused() {
        for bad in [
            "{prefix}/+/reply/#",
            "{prefix}/#",
            "{prefix}/+/status",
            "{prefix}/board-8/reply/+",
            "{prefix}/fleet/+/ask",
            "{prefix}/reply/+/#",
            "apps/+/reply/#",
            "#",
        ] {
            let c: Config = toml::from_str(&format!("[mqtt]\nresponse_topics = [\"{bad}\"]")).unwrap();
            let err = c.check().err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(err.to_string().contains("mqtt.response_topics") && err.to_string().contains("/reply/"), "{err}");
        }
        let c: Config =
            toml::from_str("[mqtt]\nprefix = \"acme/edge\"\nresponse_topics = [\"{prefix}/reply/+/inbox/#\"]").unwrap();
        c.check().unwrap();
        assert_eq!(Config::default().mqtt.response_topics, ["{prefix}/reply/+/+/#"]);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<Config>("[mqtt]\nbrokr = \"x\"").is_err());
        // Values of a closed set are refused as the file is read, naming the value.
        let e = toml::from_str::<Config>("[engine]\nbackend = \"gpu\"").unwrap_err();
        assert!(e.to_string().contains("gpu") && e.to_string().contains("qnn"), "{e}");
        let e = toml::from_str::<Config>("[engine]\nfallback = \"gpu\"").unwrap_err();
        assert!(e.to_string().contains("gpu"), "{e}");
        let e = toml::from_str::<Config>("[mqtt]\ntelemetry_encoding = \"xml\"").unwrap_err();
        assert!(e.to_string().contains("xml") && e.to_string().contains("telemetry_encoding"), "{e}");
        let c: Config = toml::from_str("[mqtt]\nfleet = \"north\"").unwrap();
        assert!(c.check().is_err());
        let e = toml::from_str::<Config>("[qnn]\nperformance = \"turbo\"").unwrap_err();
        assert!(e.to_string().contains("turbo"), "{e}");
        let c: Config = toml::from_str("[qnn]\nperformance = \"burst\"").unwrap();
        assert!(c.check().is_ok());
        let generator = "[qnn]\nbackend_lib = \"/l/libQnnHtp.so\"\ngenerator = \"/q/qnn-context-binary-generator\"\n";
        let c: Config = toml::from_str(generator).unwrap();
        assert!(c.check().unwrap_err().to_string().contains("model_lib"));
        let c: Config = toml::from_str(&format!("{generator}model_lib = \"/l/libQnnModelDlc.so\"")).unwrap();
        assert!(c.check().is_ok());
    }

    /// The key tables of docs/config.md (`| key | default | range | meaning |` under a
    /// ``## `[section]` `` heading): each documented key as `section.key` with its default as
    /// written (the text in backticks, or the words where the default is not a value) and its
    /// range cell (one for the row's keys, or one each, comma-separated), in the order documented.
    fn documented_keys() -> Vec<(String, String, String)> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md");
        let text = std::fs::read_to_string(&path).expect("docs/config.md");
        let code = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
        let (mut section, mut in_keys, mut out) = (None::<String>, false, Vec::new());
        for line in text.lines() {
            if let Some(h) = line.strip_prefix("## ") {
                section = h.strip_prefix("`[").and_then(|h| h.strip_suffix("]`")).map(str::to_owned);
                in_keys = false;
            } else if line.starts_with("### ") {
                in_keys = false;
            } else if line.starts_with("| key | default | range |") {
                in_keys = section.is_some();
            } else if !line.starts_with('|') {
                in_keys = false;
            } else if in_keys && !line.starts_with("|---") {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let (keys, defaults) = (code(cells[1]), code(cells[2]));
                let ranges: Vec<&str> = cells[3].split(", ").collect();
                assert!(!keys.is_empty(), "a key row without a key: {line}");
                let section = section.as_deref().expect("in a section");
                for (i, key) in keys.iter().enumerate() {
                    let default = match defaults.len() {
                        0 => cells[2].to_owned(),
                        1 => defaults[0].clone(),
                        n if n == keys.len() => defaults[i].clone(),
                        _ => panic!("{section}.{key}: {} defaults for {} keys: {line}", defaults.len(), keys.len()),
                    };
                    let range = match ranges.len() {
                        1 => ranges[0].to_owned(),
                        n if n == keys.len() => ranges[i].to_owned(),
                        _ => panic!("{section}.{key}: {} ranges for {} keys: {line}", ranges.len(), keys.len()),
                    };
                    out.push((format!("{section}.{key}"), default, range));
                }
            }
        }
        out
    }

    #[test]
    fn docs_config_md_lists_every_key_of_the_schema_once_with_the_default_the_code_has() {
        let documented = documented_keys();
        // Once each: a key listed twice has two defaults and two meanings to contradict.
        let mut seen = std::collections::BTreeSet::new();
        for (key, _, _) in &documented {
            assert!(seen.insert(key.clone()), "docs/config.md lists {key} twice");
        }
        // Every key of the schema is documented, and nothing else is.
        let mut schema = std::collections::BTreeSet::new();
        for section in schema_keys("") {
            for key in schema_keys(&section) {
                schema.insert(format!("{section}.{key}"));
            }
        }
        let undocumented: Vec<&String> = schema.difference(&seen).collect();
        let unknown: Vec<&String> = seen.difference(&schema).collect();
        assert!(undocumented.is_empty(), "keys of agent/src/config.rs missing from docs/config.md: {undocumented:?}");
        assert!(unknown.is_empty(), "keys of docs/config.md that agent/src/config.rs does not have: {unknown:?}");
        // Each documented default is the code's: the defaults as the effective configuration
        // writes them (an empty path is ""), the documented text read as a TOML value. Two
        // defaults are derived at run time, and documented as what they become.
        let written: toml::Table = toml::from_str(&Config::default().to_toml().unwrap()).unwrap();
        let derived = [
            ("mqtt.device", "hostname", toml::Value::from("")),
            ("mqtt.client_id", "\"laya-edge-{device}\"", toml::Value::from("")),
        ];
        for (key, doc, _) in &documented {
            let (section, name) = key.split_once('.').expect("section.key");
            let code = written[section].as_table().expect("a section")[name].clone();
            if let Some((_, words, value)) = derived.iter().find(|(k, _, _)| k == key) {
                assert_eq!(doc, words, "{key}: docs/config.md's default");
                assert_eq!(code, *value, "{key}: the code's default, derived at run time");
                continue;
            }
            let doc_value = toml::from_str::<toml::Table>(&format!("v = {doc}"))
                .unwrap_or_else(|e| panic!("{key}: docs/config.md's default {doc:?} is not a TOML value: {e}"))["v"]
                .clone();
            assert_eq!(doc_value, code, "{key}: docs/config.md says {doc}, the code's default is {code}");
        }
    }

    #[test]
    fn every_numeric_key_has_one_range_and_docs_config_md_documents_it() {
        // The numeric keys: those whose default is written as an integer.
        let written: toml::Table = toml::from_str(&Config::default().to_toml().unwrap()).unwrap();
        let mut numeric = std::collections::BTreeSet::new();
        for (section, table) in &written {
            for (key, value) in table.as_table().expect("a section") {
                if value.is_integer() {
                    numeric.insert(format!("{section}.{key}"));
                }
            }
        }
        let ranged: Vec<&str> = NUMERIC.iter().map(|(r, _)| r.key).collect();
        let unique: std::collections::BTreeSet<String> = ranged.iter().map(|k| (*k).to_owned()).collect();
        assert_eq!(unique.len(), ranged.len(), "a key with two ranges: {ranged:?}");
        assert_eq!(unique, numeric, "the numeric keys of the schema and of NUMERIC");
        // The value each entry reads is its own key's: set to a value of its own, it is read.
        for (range, value) in NUMERIC {
            let wanted = if range.max > range.min { range.min + 1 } else { range.min };
            let c = with(range.key, wanted).unwrap_or_else(|e| panic!("{}: {e}", range.key));
            assert_eq!(value(&c), wanted, "{}'s entry reads another key", range.key);
        }
        // The defaults are in range, and docs/config.md's range column is the code's.
        Config::default().check().unwrap();
        for (key, _, doc) in documented_keys() {
            match range_of(&key) {
                Some(range) => assert_eq!(doc, range.to_string(), "{key}: docs/config.md's range"),
                None => assert_eq!(doc, "—", "{key}: docs/config.md gives a range to a key that has none"),
            }
        }
    }

    /// The defaults with `key` (`section.key`) set to `value`, read as a file is, and checked.
    fn with(key: &str, value: u64) -> Result<Config, ConfigError> {
        let (section, name) = key.split_once('.').expect("section.key");
        Config::parse(&format!("[{section}]\n{name} = {value}\n"), Path::new("test"))
    }

    #[test]
    fn each_numeric_key_takes_its_bounds_and_refuses_one_past_them_naming_the_key_and_the_range() {
        for (range, _) in NUMERIC {
            for v in [range.min, range.max] {
                with(range.key, v).unwrap_or_else(|e| panic!("{} = {v} refused: {e}", range.key));
            }
            let outside = [range.min.checked_sub(1), range.max.checked_add(1).filter(|v| *v <= i64::MAX as u64)];
            for v in outside.into_iter().flatten() {
                match with(range.key, v) {
                    Err(e @ ConfigError::OutOfRange { .. }) => {
                        let m = e.to_string();
                        assert!(m.contains(range.key) && m.contains(&range.to_string()), "{}: {m}", range.key);
                    }
                    // A bound that is the type's own (u16, u32): the file cannot even say it.
                    Err(ConfigError::Parse { message, .. }) => {
                        let name = range.key.split_once('.').expect("section.key").1;
                        assert!(
                            message.contains(name) && message.contains("invalid value"),
                            "{}: {message}",
                            range.key
                        );
                    }
                    other => panic!("{} = {v}: {other:?}", range.key),
                }
            }
        }
    }

    #[test]
    fn an_http_door_off_loopback_needs_a_key_file_and_says_which_key() {
        let e = Config::parse("[http]\nlisten = \"0.0.0.0:8000\"", Path::new("test")).expect_err("refused").to_string();
        assert!(e.contains("http.api_key_file") && e.contains("0.0.0.0:8000"), "{e}");
        Config::parse("[http]\nlisten = \"0.0.0.0:8000\"\napi_key_file = \"/k\"", Path::new("test"))
            .expect("with a key");
        Config::parse("[http]\nlisten = \"127.0.0.1:8000\"", Path::new("test")).expect("loopback");
        Config::parse("[http]\nlisten = \"[::1]:0\"", Path::new("test")).expect("loopback v6");
        let e = Config::parse("[http]\nlisten = \"localhost\"", Path::new("test")).expect_err("no port").to_string();
        assert!(e.contains("http.listen"), "{e}");
        assert_eq!(Config::default().http.listen_addr().expect("off"), None);
    }

    #[test]
    fn the_values_that_panicked_serve_are_refused_naming_the_key() {
        for (key, value) in [
            ("limits.queue", 1u64 << 62),
            ("mqtt.keep_alive_s", i64::MAX as u64),
            ("engine.startup_timeout_s", i64::MAX as u64),
            ("probe.interval_min", i64::MAX as u64),
        ] {
            let e = with(key, value).expect_err(key).to_string();
            assert!(e.contains(key) && e.contains("outside its range"), "{e}");
        }
    }

    #[test]
    fn strings_mqtt_cannot_carry_are_refused_at_start() {
        let long = "x".repeat(70_000);
        for (text, named) in [
            (format!("[mqtt]\nclient_id = \"{long}\""), "mqtt.client_id is 70000 bytes"),
            (format!("[mqtt]\nusername = \"{long}\""), "mqtt.username is 70000 bytes"),
            (format!("[mqtt]\ndevice = \"{long}\"\nclient_id = \"c\""), "the topic"),
            (format!("[mqtt]\ndevice = \"{long}\""), "the client id (laya-edge-{mqtt.device}) is 70010 bytes"),
            (format!("[mqtt]\nprefix = \"{long}\""), "the topic"),
            (format!("[mqtt]\nfleet = \"{long}\"\nshare_group = \"g\""), "the fleet subscription"),
            (format!("[mqtt]\nfleet = \"f\"\nshare_group = \"{long}\""), "the fleet subscription"),
            ("[mqtt]\nclient_id = \"a\\u0000b\"".to_owned(), "mqtt.client_id has a NUL"),
        ] {
            let e = Config::parse(&text, Path::new("test")).expect_err(named).to_string();
            assert!(
                e.contains(named) && (e.contains("65535") || e.contains("NUL")),
                "{named}: {}",
                &e[..e.len().min(300)]
            );
        }
        // At the limit: a client id of 65535 bytes is MQTT's longest, and taken.
        Config::parse(&format!("[mqtt]\nclient_id = \"{}\"", "x".repeat(65_535)), Path::new("test")).unwrap();
    }

    #[test]
    fn thin_edge_names_are_checked_and_enabling_it_needs_a_broker() {
        let c = Config::parse("[thin_edge]\nenabled = true\n", Path::new("test")).unwrap();
        assert_eq!(c.thin_edge.service().unwrap().entity(), "te/device/main/service/laya-edge");
        let c =
            Config::parse("[mqtt]\nclient_id = \"c1\"\n[thin_edge]\ndevice = \"child-7\"\n", Path::new("t")).unwrap();
        assert_eq!(c.thin_edge_client_id(), "c1-tedge");
        assert_eq!(c.thin_edge.service().unwrap().entity(), "te/device/child-7/service/laya-edge");
        for (text, named) in [
            ("[thin_edge]\nservice = \"laya/edge\"", "thin_edge.service \"laya/edge\""),
            ("[thin_edge]\ndevice = \"+\"", "thin_edge.device \"+\""),
            ("[thin_edge]\ndevice = \"\"", "thin_edge.device \"\""),
            ("[thin_edge]\ntopic_root = \"te/#\"", "thin_edge.topic_root \"te/#\""),
            ("[mqtt]\nbroker = \"\"\n[thin_edge]\nenabled = true", "thin_edge.enabled needs [mqtt] broker"),
        ] {
            let e = Config::parse(text, Path::new("test")).expect_err(named).to_string();
            assert!(e.contains(named), "{named}: {e}");
        }
        let long = format!("[mqtt]\nclient_id = \"{}\"\n[thin_edge]\nenabled = true", "x".repeat(65_535));
        let e = Config::parse(&long, Path::new("test")).expect_err("too long").to_string();
        assert!(e.contains("the thin-edge client id") && e.contains("65541 bytes"), "{e}");
    }
}
