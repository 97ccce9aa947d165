//! The routes: one request in, one response out, as laya.serve 0.4.15 (and Starlette under it)
//! answers.
//!
//! Why its own file: this is the thin translation STYLE.md item 12 asks of a front door. The
//! sequence on a decision route is laya.serve's: authenticate (401), take an admission slot or
//! refuse at once (503 `Retry-After: 1`), refuse an announced body over 2 MiB (413), read the
//! body (413, 408), wait for its share of the memory budget, laya.serve's checks
//! (`jev::check_single`/`check_batch`, which decode it), the model's name, give the share back,
//! then ask the one question path ([`super::Asker`]) and render laya.serve's body. The texts
//! and statuses are `laya_topics::jev::Kind`'s, the door's own (504, a model it does not serve)
//! are [`DoorRefusal`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use laya_topics::jev::{self, Kind, ModelChoice, Refusal, Routing};
use laya_topics::pyrepr::{py_str, repr, repr_str_list};
use laya_topics::{PredictResult, Value};
use tokio::sync::Semaphore;

use super::auth::Bearer;
use super::body::{self, BodyError};
use super::{Asker, Decoding, DoorSettings, Refused};
use crate::metrics::{Metrics, Outcome};

/// The response body type.
pub type Body = Full<Bytes>;

/// What every request's handler shares.
pub struct Shared {
    pub settings: DoorSettings,
    bearer: Option<Bearer>,
    asker: Arc<dyn Asker>,
    pub metrics: Arc<Metrics>,
    /// laya.serve's admission: `max_concurrent` slots, taken without waiting.
    admission: Arc<Semaphore>,
}

impl Shared {
    pub fn new(settings: DoorSettings, asker: Arc<dyn Asker>, metrics: Arc<Metrics>) -> Shared {
        Shared {
            bearer: settings.api_key.as_deref().map(Bearer::new),
            admission: Arc::new(Semaphore::new(settings.max_concurrent.max(1))),
            settings,
            asker,
            metrics,
        }
    }
}

/// The door's own refusals, beyond laya.serve's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorRefusal {
    /// The engine's deadline passed (laya.serve has no deadline).
    Deadline,
}

impl DoorRefusal {
    pub const fn status(self) -> u16 {
        match self {
            DoorRefusal::Deadline => 504,
        }
    }

    pub const fn detail(self) -> &'static str {
        match self {
            DoorRefusal::Deadline => "inference did not finish within the deadline",
        }
    }
}

/// The route label in `/metrics`: the path when it is one the door serves.
fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/systemone" => "/v1/systemone",
        "/v1/systemone/batch" => "/v1/systemone/batch",
        "/health" => "/health",
        "/metrics" => "/metrics",
        _ => "other",
    }
}

/// One request: the response, counted in `/metrics`.
pub async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    peer: SocketAddr,
) -> Result<Response<Body>, Infallible> {
    let label = route_label(req.uri().path());
    let response = route(req, &shared, peer).await;
    shared.metrics.http_response(label, response.status().as_u16());
    Ok(response)
}

async fn route(req: Request<Incoming>, shared: &Shared, peer: SocketAddr) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match path.as_str() {
        "/v1/systemone" | "/v1/systemone/batch" if method == Method::POST => {
            let batch = path.ends_with("/batch");
            let response = decide(req, shared, peer, batch).await;
            shared.metrics.request(shared.settings.name(), outcome(response.status()));
            response
        }
        "/v1/systemone" | "/v1/systemone/batch" => method_not_allowed("POST"),
        "/health" if method == Method::GET => health(&req, shared),
        "/metrics" if method == Method::GET => metrics(&req, shared),
        "/health" | "/metrics" => method_not_allowed("GET"),
        // Starlette's redirect_slashes: the route without its trailing slash, any method.
        "/v1/systemone/" | "/v1/systemone/batch/" | "/health/" | "/metrics/" => redirect(&req, &path[..path.len() - 1]),
        _ => refusal(&Kind::NotFound.refusal(&[])),
    }
}

fn outcome(status: StatusCode) -> Outcome {
    match status.as_u16() {
        200 => Outcome::Ok,
        413 => Outcome::TooLarge,
        503 => Outcome::Busy,
        504 => Outcome::Deadline,
        500..=599 => Outcome::Failed,
        _ => Outcome::Invalid,
    }
}

fn authorized(req: &Request<Incoming>, shared: &Shared) -> bool {
    shared.bearer.as_ref().is_none_or(|b| b.admits(req.headers().get(header::AUTHORIZATION).map(HeaderValue::as_bytes)))
}

/// `POST /v1/systemone` and `/v1/systemone/batch`.
async fn decide(req: Request<Incoming>, shared: &Shared, peer: SocketAddr, batch: bool) -> Response<Body> {
    if !authorized(&req, shared) {
        shared.metrics.rejected("unauthorized");
        return refusal(&Kind::Unauthorized.refusal(&[]));
    }
    // Held through the body's read and the answer, released when this returns.
    let Ok(_slot) = shared.admission.clone().try_acquire_owned() else {
        shared.metrics.rejected("busy");
        return refusal(&Kind::Busy.refusal(&[]));
    };
    if body::announced_too_large(req.headers().get(header::CONTENT_LENGTH).map(HeaderValue::as_bytes)) {
        shared.metrics.rejected("body_too_large");
        return refusal(&Kind::BodyTooLarge.refusal(&[]));
    }
    let bytes = match body::read(req.into_body(), shared.settings.body_read_timeout).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            shared.metrics.rejected("body_too_large");
            return refusal(&Kind::BodyTooLarge.refusal(&[]));
        }
        Err(BodyError::Timeout) => {
            shared.metrics.rejected("body_timeout");
            return refusal(&Kind::BodyTimeout.refusal(&[]));
        }
        // The peer is gone or broke the framing: nobody may read this; laya.serve's read
        // would have failed as not JSON.
        Err(BodyError::Broken(_)) => return refusal(&Kind::NotJson.refusal(&[])),
    };
    let caller = format!("http/{}", peer.ip());
    // Decoded (laya.serve's checks build the request) only within the memory budget.
    let decoding = shared.asker.decoding(bytes.len()).await;
    let answered = if batch {
        ask_batch(&bytes, shared, caller, decoding).await
    } else {
        ask_single(&bytes, shared, caller, decoding).await
    };
    match answered {
        Ok((body, infer_ms)) => {
            let timing = format!("{infer_ms:.2}");
            let mut r = json(StatusCode::OK, jev::body_text(&body));
            let h = r.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&format!("inference;dur={timing}")) {
                h.insert("server-timing", v);
            }
            if let Ok(v) = HeaderValue::from_str(&timing) {
                h.insert("x-inference-time-ms", v);
            }
            r
        }
        Err(Answer::Refusal(r)) => refusal(&r),
        Err(Answer::Door(d)) => json(status(d.status()), detail_body(d.detail())),
        Err(Answer::Failed(cause)) => {
            tracing::warn!(%cause, "HTTP request: inference failed");
            refusal(&Kind::InferenceFailed.refusal(&[]))
        }
    }
}

/// Why a decision request got no 200.
enum Answer {
    Refusal(Refusal),
    Door(DoorRefusal),
    /// 500; the cause goes to the log only.
    Failed(String),
}

impl From<Refusal> for Answer {
    fn from(r: Refusal) -> Answer {
        Answer::Refusal(r)
    }
}

/// The one question path's refusal as the response's.
fn refused(r: Refused) -> Answer {
    match r {
        Refused::Busy => Answer::Refusal(Kind::Busy.refusal(&[])),
        Refused::Deadline => Answer::Door(DoorRefusal::Deadline),
        Refused::Failed(cause) => Answer::Failed(cause),
        Refused::Invalid(text) => Answer::Refusal(Kind::LayaValueError.refusal(&[&text])),
        Refused::TooLarge(text) => {
            Answer::Refusal(Refusal { kind: Kind::BodyTooLarge, status: 413, detail: text, retry_after: None })
        }
    }
}

/// The checkpoint `controls` name, as this door serves it: its routing report, or laya.serve's
/// refusal (an unknown `task`), or a refusal for a laya checkpoint this device does not serve.
fn routing(controls: &jev::Controls, shared: &Shared) -> Result<Routing, Refusal> {
    let settings = &shared.settings;
    let source = shared.asker.source();
    let served = |name: &str| settings.model_names.iter().any(|n| n == name);
    let not_served = |given: &Value| {
        // laya.serve would load that checkpoint (offline: 500); this device has one model.
        Kind::LayaValueError.refusal(&[&format!(
            "model {} is not served here; this device serves {} (or omit model)",
            repr(given),
            repr_str_list(&settings.model_names)
        )])
    };
    match (&controls.model, &controls.task) {
        (ModelChoice::Named(name), _) if served(name) => Ok(Routing::explicit_model(name, &source)),
        (ModelChoice::Named(name), _) => Err(not_served(&Value::from(name.as_str()))),
        (ModelChoice::Auto, Some(task)) => {
            let name = settings.checks.models.resolve_task(task)?;
            if served(&name) {
                Ok(Routing::explicit_task(&name, &source, &py_str(task)))
            } else {
                Err(not_served(task))
            }
        }
        (ModelChoice::Auto, None) => Ok(Routing {
            model: settings.name().into(),
            repo: source.as_str().into(),
            reason: "the one model this device serves".into(),
            detection: Value::Null,
            workflow: Value::Null,
        }),
    }
}

/// The inference time in milliseconds, as laya.serve's headers report it.
fn millis(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

async fn ask_single(bytes: &[u8], shared: &Shared, caller: String, decoding: Decoding) -> Result<(Value, f64), Answer> {
    let single = jev::check_single(bytes, &shared.settings.checks)?;
    let routing = routing(&single.controls, shared)?;
    let request = single.request();
    // Decoded: the request's own share is taken on the one path, once it has its place.
    drop(single);
    drop(decoding);
    let t0 = Instant::now();
    let result = shared.asker.ask(request, caller, bytes.len()).await.map_err(refused)?;
    let ms = millis(t0);
    if let Some(r) = jev::question_refusal(&result) {
        return Err(r.into());
    }
    Ok((jev::render_result(&result, &routing, shared.settings.jev_strict), ms))
}

/// Aborts the tasks it holds when dropped (the client went away).
struct Tasks(Vec<tokio::task::JoinHandle<Result<PredictResult, Refused>>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

async fn ask_batch(bytes: &[u8], shared: &Shared, caller: String, decoding: Decoding) -> Result<(Value, f64), Answer> {
    let batch = jev::check_batch(bytes, &shared.settings.checks)?;
    let routing = routing(&batch.controls, shared)?;
    let requests = batch.requests();
    drop(batch);
    drop(decoding);
    let t0 = Instant::now();
    // One ask per state, all at once, so the engine can merge them into one call.
    let share = bytes.len() / requests.len().max(1);
    let mut tasks =
        Tasks(requests.into_iter().map(|r| tokio::spawn(shared.asker.ask(r, caller.clone(), share))).collect());
    let mut results = Vec::with_capacity(tasks.0.len());
    for task in &mut tasks.0 {
        let result = task.await.map_err(|e| Answer::Failed(format!("a batch task ended: {e}")))?.map_err(refused)?;
        results.push(result);
    }
    let ms = millis(t0);
    if let Some(r) = results.iter().find_map(jev::question_refusal) {
        return Err(r.into());
    }
    let rendered: Vec<(Value, Routing)> = results.iter().map(|r| (r.to_value(), routing.clone())).collect();
    Ok((jev::render_batch(&rendered, shared.settings.jev_strict), ms))
}

/// `GET /health`: no slot, no bearer needed; the whole document only with it when a key is set.
fn health(req: &Request<Incoming>, shared: &Shared) -> Response<Body> {
    let body = if authorized(req, shared) {
        shared.asker.health().to_value(shared.settings.name())
    } else {
        jev::Health::liveness()
    };
    json(StatusCode::OK, jev::body_text(&body))
}

/// `GET /metrics`: behind the bearer when a key is set.
fn metrics(req: &Request<Incoming>, shared: &Shared) -> Response<Body> {
    if !authorized(req, shared) {
        return refusal(&Kind::Unauthorized.refusal(&[]));
    }
    let mut r = Response::new(Full::new(Bytes::from(shared.metrics.render())));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    r
}

fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = refusal(&Kind::MethodNotAllowed.refusal(&[]));
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// Starlette's 307 to the path without its slash: `http://{Host}{path}`, no body.
fn redirect(req: &Request<Incoming>, to: &str) -> Response<Body> {
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    if let Ok(v) = HeaderValue::from_str(&format!("http://{host}{to}{query}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn detail_body(detail: &str) -> String {
    let mut out = String::from("{\"detail\":");
    laya_topics::json::write_str(&mut out, detail);
    out.push('}');
    out
}

/// A refusal's response: its status, `{"detail": ...}`, `Retry-After` on a 503.
fn refusal(r: &Refusal) -> Response<Body> {
    let mut resp = json(status(r.status), r.body());
    if let Some(s) = r.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

fn json(code: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;

    use super::*;

    /// The budget as a door sees it: one share, given only when the test says so, and whether
    /// it is still held when the door asks.
    struct Budget {
        release: Mutex<Option<oneshot::Receiver<()>>>,
        taken: AtomicUsize,
        held: Arc<AtomicBool>,
        asked_while_held: AtomicUsize,
        asked: AtomicUsize,
    }

    struct Share(Arc<AtomicBool>);

    impl Drop for Share {
        fn drop(&mut self) {
            self.0.store(false, Ordering::SeqCst);
        }
    }

    impl Asker for Budget {
        fn decoding(&self, _bytes: usize) -> Pin<Box<dyn Future<Output = Decoding> + Send + 'static>> {
            self.taken.fetch_add(1, Ordering::SeqCst);
            let release = self.release.lock().unwrap_or_else(|e| e.into_inner()).take();
            let held = self.held.clone();
            Box::pin(async move {
                if let Some(r) = release {
                    let _ = r.await;
                }
                held.store(true, Ordering::SeqCst);
                Box::new(Share(held)) as Decoding
            })
        }

        fn ask(
            &self,
            _: laya_topics::Request,
            _: String,
            _: usize,
        ) -> Pin<Box<dyn Future<Output = Result<PredictResult, Refused>> + Send + 'static>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            if self.held.load(Ordering::SeqCst) {
                self.asked_while_held.fetch_add(1, Ordering::SeqCst);
            }
            Box::pin(async { Err(Refused::Busy) })
        }

        fn health(&self) -> jev::Health {
            unreachable!("this test asks no /health")
        }

        fn source(&self) -> String {
            "/models/fake".into()
        }
    }

    async fn door(budget: Arc<Budget>) -> (SocketAddr, oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listener");
        let addr = listener.local_addr().expect("address");
        let settings = DoorSettings::new(&[], "laya-rl-agent");
        let shared = Arc::new(Shared::new(settings, budget, Arc::new(Metrics::new())));
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(super::super::conn::serve(listener, shared, stopped));
        (addr, stop)
    }

    async fn send(addr: SocketAddr, body: &str) -> tokio::net::TcpStream {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.expect("head");
        s.write_all(body.as_bytes()).await.expect("body");
        s
    }

    async fn until(what: impl Fn() -> bool) {
        // A bound for a broken door only; the test waits on the event, not the time.
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while !what() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the awaited event");
    }

    #[tokio::test]
    async fn a_body_is_decoded_only_within_its_share_of_the_memory_budget_and_asks_without_it() {
        let (release, wait) = oneshot::channel();
        let budget = Arc::new(Budget {
            release: Mutex::new(Some(wait)),
            taken: AtomicUsize::new(0),
            held: Arc::new(AtomicBool::new(false)),
            asked_while_held: AtomicUsize::new(0),
            asked: AtomicUsize::new(0),
        });
        let (addr, _stop) = door(budget.clone()).await;
        // Not JSON: refused as soon as it is decoded, so its answer shows when that happened.
        let mut first = send(addr, "{not json").await;
        until(|| budget.taken.load(Ordering::SeqCst) == 1).await;
        let mut byte = [0u8; 1];
        assert!(
            matches!(first.try_read(&mut byte), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "answered before its share of the budget was given"
        );
        release.send(()).expect("the door waits for the share");
        let mut answer = String::new();
        first.read_to_string(&mut answer).await.expect("answer");
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(!budget.held.load(Ordering::SeqCst), "the share is given back once decoded");
        // A well-formed request: decoded within a share, which is given back before it asks.
        let ask = r#"{"state": "Hi", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}"#;
        let mut second = send(addr, ask).await;
        let mut answer = String::new();
        second.read_to_string(&mut answer).await.expect("answer");
        assert!(answer.starts_with("HTTP/1.1 503"), "the fake path is busy: {answer}");
        assert_eq!(budget.taken.load(Ordering::SeqCst), 2);
        assert_eq!(budget.asked.load(Ordering::SeqCst), 1);
        assert_eq!(budget.asked_while_held.load(Ordering::SeqCst), 0, "asked while holding the decoding share");
    }
}
