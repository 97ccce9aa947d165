//! The HTTP front door: laya.serve 0.4.15's `/v1/systemone` API, `/health` and `/metrics`
//! (feature `http`, `[http]` in the configuration).
//!
//! Why: apps in the Laya ecosystem speak HTTP (TypeSafe Jev clients, laya's own MCP server
//! through `RemoteRouter`), and an operator's Prometheus scrapes HTTP. This door makes a board a
//! drop-in laya-serve without a second question path: a handler turns a request into the one
//! internal question, awaits [`Asker::ask`] (the service's one path: admission, limits, pipeline,
//! engine, telemetry), and turns the outcome into laya.serve's response (STYLE.md item 12). What
//! laya.serve decides without the model (the checks, the texts, the rendering) is
//! `laya_topics::jev`; what is left here is I/O, each concern in its own file:
//!
//! - [`conn`]: accepting connections within `max_connections`, the request head's timeout and
//!   size (slowloris), reaping idle keep-alive connections, the graceful stop;
//! - [`auth`]: the bearer, compared as bytes in constant time;
//! - [`body`]: reading a body within 2 MiB and `body_read_timeout_s`, never buffering past it
//!   (then it is decoded only while it holds its share of the memory budget, [`Asker::decoding`]);
//! - [`routes`]: the routes, statuses and headers laya.serve and Starlette answer with.
//!
//! Where the door knowingly differs from laya.serve is listed in `docs/http-contract.md`
//! ("laya-edge's door").

pub mod auth;
pub mod body;
pub mod conn;
pub mod routes;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use laya_topics::jev;

use crate::metrics::Metrics;

/// A part of the agent's memory budget a door holds while it decodes a body (given back when
/// dropped).
pub type Decoding = Box<dyn Send>;

/// What the door asks of the one question path (the service implements it).
pub trait Asker: Send + Sync + 'static {
    /// The memory budget's share for decoding a body of `bytes` (`limits.decoded_bytes`, reckoned
    /// as an MQTT payload of that size), taken in turn with every question's: the door decodes a
    /// body only while it holds one, and gives it back before [`Asker::ask`] (which takes the
    /// request's own share once it has a place in the queue: holding one while waiting for a
    /// place could leave the places' holders waiting for the budget).
    fn decoding(&self, bytes: usize) -> Pin<Box<dyn Future<Output = Decoding> + Send + 'static>>;
    /// One laya request through the one question path, as `caller` (the fairness key:
    /// `http/{peer ip}`); `bytes`, its share of the body as it came, is what the waiting room
    /// and the memory budget reckon it by.
    fn ask(
        &self,
        request: laya_topics::Request,
        caller: String,
        bytes: usize,
    ) -> Pin<Box<dyn Future<Output = Result<laya_topics::PredictResult, Refused>> + Send + 'static>>;
    /// What `/health` reports now.
    fn health(&self) -> jev::Health;
    /// Where the served model was loaded from (`routing.repo` in every answer): what
    /// [`Asker::health`] says, which an implementation may give without the rest of it.
    fn source(&self) -> String {
        self.health().source
    }
}

/// The one question path as the service offers it to a door: its callers are clients
/// `http/{peer}`.
impl Asker for crate::service::Doorway {
    fn decoding(&self, bytes: usize) -> Pin<Box<dyn Future<Output = Decoding> + Send + 'static>> {
        let door = self.clone();
        Box::pin(async move { Box::new(door.decoding(bytes).await) as Decoding })
    }

    fn ask(
        &self,
        request: laya_topics::Request,
        caller: String,
        bytes: usize,
    ) -> Pin<Box<dyn Future<Output = Result<laya_topics::PredictResult, Refused>> + Send + 'static>> {
        let door = self.clone();
        Box::pin(
            async move { crate::service::Doorway::ask(&door, request, caller, bytes).await.map(|reply| reply.result) },
        )
    }

    fn health(&self) -> jev::Health {
        self.reporter().health()
    }

    /// Read on every request: the serving bundle's directory alone, not the engine's status.
    fn source(&self) -> String {
        self.served_from()
    }
}

/// Why the one question path did not answer: the service's own reasons (`service::door`), which
/// `routes` turns into laya.serve's statuses (busy 503 `Retry-After: 1`, deadline 504, failed 500
/// `inference failed` with the cause logged only, invalid 422, too large 413).
pub use crate::service::door::Refused;

/// The door's settings, from `[http]` ([`DoorSettings::from_config`]) or a test.
#[derive(Debug, Clone)]
pub struct DoorSettings {
    /// The bearer's key, as bytes; `None`: no authentication.
    pub api_key: Option<Vec<u8>>,
    /// Decision requests past authentication at once; more get 503 at once.
    pub max_concurrent: usize,
    pub body_read_timeout: Duration,
    /// Time for a request head, from its first byte.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress and no byte received for this long is closed.
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_header_bytes: usize,
    /// `LAYA_JEV_STRICT`.
    pub jev_strict: bool,
    /// The names a request's `model` may carry (lower case); the first names the model in
    /// `/health` and in `routing`. Never empty.
    pub model_names: Vec<String>,
    /// laya.serve's checks' settings (its model table: laya 0.4.15's built-in names and these).
    pub checks: jev::Settings,
}

/// Why the door could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DoorError {
    #[error("http.api_key_file {path}: {message}")]
    KeyFile { path: String, message: String },
}

impl DoorSettings {
    /// laya.serve's defaults, with `model_names` (at least one; the served model's name when
    /// empty) and no key.
    pub fn new(model_names: &[String], served_name: &str) -> DoorSettings {
        let mut names: Vec<String> =
            model_names.iter().map(|n| n.trim().to_lowercase()).filter(|n| !n.is_empty()).collect();
        if names.is_empty() {
            names.push(served_name.trim().to_lowercase());
        }
        let extra: Vec<&str> = names.iter().map(String::as_str).collect();
        let defaults = crate::config::Http::default();
        DoorSettings {
            api_key: None,
            max_concurrent: jev::contract::DEFAULT_MAX_CONCURRENT,
            body_read_timeout: Duration::from_secs(defaults.body_read_timeout_s),
            header_read_timeout: Duration::from_secs(defaults.header_read_timeout_s),
            idle_timeout: Duration::from_secs(defaults.idle_timeout_s),
            max_connections: defaults.max_connections,
            max_header_bytes: defaults.max_header_bytes,
            jev_strict: false,
            checks: jev::Settings { models: jev::ModelNames::laya_0_4_15(&extra), ..jev::Settings::default() },
            model_names: names,
        }
    }

    /// The settings of a checked `[http]` (reads `api_key_file`). `served_name` is the served
    /// model's own name, the default of `model_names`.
    pub fn from_config(http: &crate::config::Http, served_name: &str) -> Result<DoorSettings, DoorError> {
        let mut s = DoorSettings::new(&http.model_names, served_name);
        s.api_key = http.api_key_file.as_deref().map(auth::read_key_file).transpose()?;
        s.max_concurrent = http.max_concurrent.max(1);
        s.body_read_timeout = Duration::from_secs(http.body_read_timeout_s.max(1));
        s.header_read_timeout = Duration::from_secs(http.header_read_timeout_s.max(1));
        s.idle_timeout = Duration::from_secs(http.idle_timeout_s.max(1));
        s.max_connections = http.max_connections.max(1);
        s.max_header_bytes = http.max_header_bytes.max(1024);
        s.jev_strict = http.jev_strict;
        Ok(s)
    }

    /// The name of the served model in `/health` and `routing`.
    pub fn name(&self) -> &str {
        self.model_names.first().map_or("", String::as_str)
    }
}

/// The HTTP door: serves `listener` until `shutdown` resolves, then stops accepting, lets
/// every request in progress finish, and returns when the last connection closed.
pub async fn run(
    listener: tokio::net::TcpListener,
    settings: DoorSettings,
    asker: Arc<dyn Asker>,
    metrics: Arc<Metrics>,
    shutdown: impl Future,
) {
    let shared = Arc::new(routes::Shared::new(settings, asker, metrics));
    conn::serve(listener, shared, shutdown).await;
}

/// `read_key_file`'s path type, for callers that hold a `PathBuf`.
pub fn read_key_file(path: &Path) -> Result<Vec<u8>, DoorError> {
    auth::read_key_file(path)
}
