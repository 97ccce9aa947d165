//! What to do with an incoming question, decided without I/O.
//!
//! A message is decoded (JSON or CBOR), checked against the limits, matched against the replies
//! already sent (a redelivered question gets the same reply again, not a second inference), and
//! given a destination: the MQTT 5 response topic if the allowlist permits it (the allowlist's
//! filters all lie under `{prefix}/reply/{client}/{key}`: `Config::check` refuses wider ones), else
//! `{prefix}/{device}/reply/{request id}` for clients without response topics (MQTT 3.1.1).
//! A message with no usable destination is not answered anywhere its client listens; it is
//! reported on `{prefix}/{device}/errors` instead ([`Decision::Drop`]).
//!
//! A redelivered question is recognised by its [`RequestKey`]: its id, its reply topic and a
//! digest of its bytes. A reused id with new content is a new question (MQTT 3.1.1 clients share
//! one reply topic per id and device, so they must still use unique ids).
//!
//! A question delivered with the retain flag is never answered, nor replied to: a retained
//! question stays on the broker and would be delivered again to every new session of the agent,
//! each time answered on the response topic it names (anyone allowed to ask could make a device
//! answer a victim at every restart). It is reported on the errors topic instead and acknowledged;
//! a copy of it delivered again in the same session (a lost acknowledgement, a reconnect) is
//! acknowledged without a second report ([`RetainedReports`]). The agent subscribes with Retain
//! As Published, so a live publish with the retain flag is seen as retained too, not only the
//! copy the broker sends at subscription (docs/security.md).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use laya_topics::topic::{Channel, Schema, filter_matches, is_publishable};
use laya_topics::wire::{Encoding, ErrorCode, ErrorReply, Undeliverable};
use laya_topics::{Request, Value};

use crate::config;

/// Where and how a reply goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTo {
    pub topic: String,
    /// MQTT 5 correlation data, echoed.
    pub correlation: Option<Vec<u8>>,
    pub encoding: Encoding,
}

/// The parts of an MQTT message admission looks at.
#[derive(Debug, Clone)]
pub struct Incoming<'a> {
    pub payload: &'a [u8],
    pub content_type: Option<&'a str>,
    pub response_topic: Option<&'a str>,
    pub correlation: Option<&'a [u8]>,
    /// Seconds left of the message's lifetime, as the broker forwarded it.
    pub message_expiry_s: Option<u32>,
    /// Delivered with the retain flag: stored by the broker and sent at subscription, or
    /// published with it (seen through Retain As Published).
    pub retained: bool,
}

/// Who asked a question, as flow control tells clients apart (`flow.rs`: each client's share and
/// turn): the client level of its MQTT 5 response topic, `{prefix}/reply/{client}/{key}` (the
/// shipped ACL lets only that user read it), else one key for every question without one (MQTT
/// 3.1.1 clients). A plain name, read before the payload is decoded; another door (HTTP) names
/// its callers the same way.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientKey {
    Named(String),
    /// Questions with no response topic.
    Unnamed,
}

#[cfg(test)]
impl ClientKey {
    /// The client named `name` (the tests' clients).
    pub fn named(name: &str) -> ClientKey {
        ClientKey::Named(name.into())
    }
}

/// The verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Answer it; `deadline` is when an answer stops being useful. `key` recognises a redelivered
    /// copy while this one is in progress and after it is answered.
    Answer { request: Box<Request>, reply_to: ReplyTo, deadline: Option<Instant>, key: RequestKey },
    /// Reply with this error (no inference).
    Refuse { error: ErrorReply, reply_to: ReplyTo },
    /// The same question was answered already: send this reply again.
    Resend { reply_to: ReplyTo, payload: Vec<u8> },
    /// Nowhere allowed to reply to: reported on the errors topic, acknowledged, dropped.
    Drop { report: Undeliverable },
}

/// What identifies one question across redeliveries: its id, where its reply goes, and a digest
/// of its bytes (with its correlation data and encoding), so a reused id with new content is a
/// new question.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestKey {
    id: String,
    topic: String,
    digest: u64,
}

/// The longest request id usable as a reply topic level, in bytes.
pub const MAX_ID_LEVEL: usize = 256;

/// What a retained question's report says.
pub const RETAINED_QUESTION: &str = "a question published with the retain flag is not answered: the broker would \
     deliver it again to every new session of this device, to be answered each time; publish questions without it \
     (an empty retained message on the topic clears it from the broker)";

/// What the report of an empty retained message says: what clears a retained question, seen live.
pub const RETAINED_CLEARED: &str =
    "an empty retained message: a retained question was cleared from this topic (nothing to answer)";

/// The agent's identity and limits, as admission needs them.
#[derive(Debug, Clone)]
pub struct Admission {
    pub schema: Schema,
    pub device: String,
    pub allowlist: Vec<String>,
    pub limits: config::Limits,
    pub max_payload: usize,
    /// Keys the payload digest (SipHash with this process's random keys): a client cannot craft
    /// a payload whose digest collides with another client's question.
    digests: std::collections::hash_map::RandomState,
}

/// A request id as a topic level for the fallback reply topic, or why it cannot be one.
fn id_level(id: Option<&Value>) -> Result<String, String> {
    let text = match id {
        Some(Value::Str(s)) => s.clone(),
        Some(Value::Int(i)) => i.as_str().to_owned(),
        None | Some(Value::Null) => return Err("the request has no id".into()),
        Some(_) => return Err("the request id is neither a string nor an integer".into()),
    };
    if text.is_empty() {
        Err("the request id is empty".into())
    } else if text.len() > MAX_ID_LEVEL {
        Err(format!("the request id is {} bytes long; the limit is {MAX_ID_LEVEL}", text.len()))
    } else if text.contains(['/', '+', '#', '\0']) {
        Err("the request id contains '/', '+', '#' or NUL".into())
    } else {
        Ok(text)
    }
}

/// Counts the options a question definition would render (0 for anything malformed: the
/// validator will say what is wrong with it).
fn option_count(def: &Value) -> usize {
    match def.get("criteria") {
        Some(Value::Array(a)) => a.len(),
        Some(Value::Object(m)) => m.len(),
        _ => 0,
    }
}

impl Admission {
    /// Builds admission from the configuration.
    pub fn new(schema: Schema, device: String, cfg: &config::Config) -> Admission {
        let allowlist = cfg.mqtt.response_topics.iter().map(|f| f.replace("{prefix}", schema.prefix())).collect();
        Admission {
            schema,
            device,
            allowlist,
            limits: cfg.limits.clone(),
            max_payload: cfg.mqtt.max_payload,
            digests: Default::default(),
        }
    }

    fn fallback_reply(
        &self,
        id: Option<&Value>,
        correlation: Option<&[u8]>,
        encoding: Encoding,
    ) -> Result<ReplyTo, String> {
        let level = id_level(id)?;
        let topic = self.schema.topic(&self.device, Channel::Reply(level)).map_err(|e| e.to_string())?.to_string();
        Ok(ReplyTo { topic, correlation: correlation.map(<[u8]>::to_vec), encoding })
    }

    /// The key of a question with this id going to `reply_to`.
    fn key(&self, id: Option<&Value>, reply_to: &ReplyTo, payload: &[u8]) -> RequestKey {
        let mut h = self.digests.build_hasher();
        h.write_u8(reply_to.encoding as u8);
        h.write_usize(payload.len());
        h.write(payload);
        if let Some(c) = &reply_to.correlation {
            h.write_usize(c.len());
            h.write(c);
        }
        RequestKey { id: id.map(id_key).unwrap_or_default(), topic: reply_to.topic.clone(), digest: h.finish() }
    }

    /// What tells one retained question from another ([`RetainedReports`]): a digest of its
    /// bytes, content type, response topic and correlation data.
    pub fn retained_key(&self, msg: &Incoming<'_>) -> u64 {
        let mut h = self.digests.build_hasher();
        for part in [
            msg.payload,
            msg.content_type.unwrap_or_default().as_bytes(),
            msg.response_topic.unwrap_or_default().as_bytes(),
            msg.correlation.unwrap_or_default(),
        ] {
            h.write_usize(part.len());
            h.write(part);
        }
        h.finish()
    }

    /// Who asked `msg` ([`ClientKey`]), from its response topic alone. A topic outside
    /// `{prefix}/reply/` (refused later, by the allowlist) is its own key.
    pub fn client_of(&self, msg: &Incoming<'_>) -> ClientKey {
        match msg.response_topic {
            Some(t) => ClientKey::Named(self.schema.reply_client(t).unwrap_or(t).to_owned()),
            None => ClientKey::Unnamed,
        }
    }

    /// Decides what to do with a message received at `now`.
    pub fn decide(&self, msg: &Incoming<'_>, now: Instant, replies: &ReplyCache) -> Decision {
        self.decide_with(msg, now, |key| replies.get(key).map(<[u8]>::to_vec))
    }

    /// [`Admission::decide`] with the reply cache behind `cached(key)`, so a shared cache is
    /// locked only for the lookup, not while the payload is decoded.
    pub fn decide_with(
        &self,
        msg: &Incoming<'_>,
        now: Instant,
        cached: impl FnOnce(&RequestKey) -> Option<Vec<u8>>,
    ) -> Decision {
        let encoding = Encoding::detect(msg.content_type, msg.payload);
        let drop = |code: ErrorCode, message: String, id: Option<Value>, response_topic: Option<&str>| Decision::Drop {
            report: Undeliverable {
                error: ErrorReply { id, code, message },
                response_topic: response_topic.map(str::to_owned),
            },
        };
        let refuse = |code: ErrorCode, message: String, id: Option<Value>, to: Option<ReplyTo>| match to {
            Some(reply_to) => Decision::Refuse { error: ErrorReply { id, code, message }, reply_to },
            None => drop(code, format!("{message} (and there is no response topic to say so on)"), id, None),
        };
        // A retained question is answered nowhere, whatever it asks and wherever it names.
        if msg.retained {
            if msg.payload.is_empty() {
                return drop(ErrorCode::BadRequest, RETAINED_CLEARED.into(), None, msg.response_topic);
            }
            let id = (msg.payload.len() <= self.max_payload)
                .then(|| encoding.decode(msg.payload, self.limits.nesting_depth).ok())
                .flatten()
                .and_then(|doc| doc.get("id").cloned());
            return drop(ErrorCode::BadRequest, RETAINED_QUESTION.into(), id, msg.response_topic);
        }
        // Where a reply may go, before anything else: a refused response topic is never used.
        let response = match msg.response_topic {
            Some(t) if is_publishable(t) && self.allowlist.iter().any(|f| filter_matches(f, t)) => {
                Some(ReplyTo { topic: t.to_owned(), correlation: msg.correlation.map(<[u8]>::to_vec), encoding })
            }
            Some(t) => {
                let m = format!("the response topic is not in the allowlist {:?}", self.allowlist);
                return drop(ErrorCode::BadRequest, m, None, Some(t));
            }
            None => None,
        };
        if msg.payload.len() > self.max_payload {
            // The id is not read from a payload this large: only a response topic can say so.
            return refuse(
                ErrorCode::TooLarge,
                format!("payload of {} bytes exceeds the limit of {}", msg.payload.len(), self.max_payload),
                None,
                response,
            );
        }
        let doc = match encoding.decode(msg.payload, self.limits.nesting_depth) {
            Ok(d) => d,
            Err(e) => {
                let code = if e.is_too_deep() { ErrorCode::TooLarge } else { ErrorCode::BadRequest };
                return refuse(code, e.to_string(), None, response);
            }
        };
        let id = doc.get("id").cloned();
        let reply_to = match response {
            Some(r) => r,
            None => match self.fallback_reply(id.as_ref(), msg.correlation, encoding) {
                Ok(r) => r,
                Err(why) => {
                    let m = format!("{why}, and there is no response topic: no reply topic to answer on");
                    return drop(ErrorCode::BadRequest, m, id, None);
                }
            },
        };
        let key = self.key(id.as_ref(), &reply_to, msg.payload);
        if let Some(payload) = cached(&key) {
            return Decision::Resend { reply_to, payload };
        }
        let request = match Request::from_value(doc) {
            Ok(r) => r,
            Err(e) => return refuse(ErrorCode::BadRequest, e.to_string(), id, Some(reply_to)),
        };
        if request.questions.len() > self.limits.questions_per_request {
            let m = format!(
                "{} questions exceed the limit of {} per request",
                request.questions.len(),
                self.limits.questions_per_request
            );
            return refuse(ErrorCode::TooLarge, m, id, Some(reply_to));
        }
        if let Some((qid, n)) = request
            .questions
            .iter()
            .map(|(q, d)| (q, option_count(d)))
            .find(|(_, n)| *n > self.limits.options_per_question)
        {
            let m = format!("question {qid:?} has {n} options; the limit is {}", self.limits.options_per_question);
            return refuse(ErrorCode::TooLarge, m, id, Some(reply_to));
        }
        let by_request = request.deadline_ms.map(|ms| now + Duration::from_millis(ms));
        let by_expiry = msg.message_expiry_s.map(|s| now + Duration::from_secs(u64::from(s)));
        let deadline = match (by_request, by_expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if request.deadline_ms == Some(0) || msg.message_expiry_s == Some(0) {
            return refuse(
                ErrorCode::DeadlineExceeded,
                "the request expired before it was answered".into(),
                id,
                Some(reply_to),
            );
        }
        Decision::Answer { request: Box::new(request), reply_to, deadline, key }
    }
}

/// The retained questions reported in this MQTT session, by [`Admission::retained_key`]: a copy
/// delivered again in the same session is acknowledged without another report; a new session
/// (the broker sends retained messages again at subscription) starts afresh. At most
/// [`RetainedReports::CAPACITY`], oldest forgotten first (a forgotten one is reported again).
#[derive(Debug, Default)]
pub struct RetainedReports {
    order: VecDeque<u64>,
}

impl RetainedReports {
    pub const CAPACITY: usize = 256;

    /// Whether this is the first copy of `key` in this session (then it is remembered).
    pub fn first(&mut self, key: u64) -> bool {
        if self.order.contains(&key) {
            return false;
        }
        if self.order.len() >= RetainedReports::CAPACITY {
            self.order.pop_front();
        }
        self.order.push_back(key);
        true
    }

    /// A new MQTT session began: every retained question is reported again.
    pub fn new_session(&mut self) {
        self.order.clear();
    }
}

/// Replies recently sent, by [`RequestKey`], oldest forgotten first. In memory: a redelivery
/// after the agent restarts is answered again. Bounded by count and by bytes: a reply to 64
/// questions of 255 options each is hundreds of KB, so a count alone would let legal traffic
/// hold hundreds of MB.
#[derive(Debug, Default)]
pub struct ReplyCache {
    capacity: usize,
    max_bytes: usize,
    bytes: usize,
    order: VecDeque<RequestKey>,
    map: HashMap<RequestKey, Vec<u8>>,
}

fn id_key(id: &Value) -> String {
    laya_topics::json::to_string(id, laya_topics::json::Style::COMPACT)
}

impl ReplyCache {
    pub fn new(capacity: usize) -> ReplyCache {
        ReplyCache::bounded(capacity, usize::MAX)
    }

    /// At most `capacity` replies of `max_bytes` in all (keys and payloads).
    pub fn bounded(capacity: usize, max_bytes: usize) -> ReplyCache {
        ReplyCache { capacity, max_bytes, ..ReplyCache::default() }
    }

    fn cost(key: &RequestKey, payload: &[u8]) -> usize {
        payload.len() + key.id.len() + key.topic.len() + std::mem::size_of::<RequestKey>() * 2
    }

    /// The reply sent for this question, if remembered.
    pub fn get(&self, key: &RequestKey) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }

    /// Remembers a reply.
    pub fn put(&mut self, key: RequestKey, payload: Vec<u8>) {
        let cost = ReplyCache::cost(&key, &payload);
        if self.capacity == 0 || cost > self.max_bytes {
            return;
        }
        self.bytes += cost;
        match self.map.insert(key.clone(), payload) {
            Some(old) => self.bytes -= ReplyCache::cost(&key, &old),
            None => self.order.push_back(key),
        }
        while self.order.len() > self.capacity || self.bytes > self.max_bytes {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(p) = self.map.remove(&old) {
                self.bytes -= ReplyCache::cost(&old, &p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_cache_forgets_the_oldest_replies_beyond_its_bytes() {
        let key = |i: usize| RequestKey { id: format!("r{i}"), topic: "t".into(), digest: i as u64 };
        let one = ReplyCache::cost(&key(0), &[0; 1000]);
        let mut cache = ReplyCache::bounded(100, 3 * one);
        for i in 0..10 {
            cache.put(key(i), vec![0; 1000]);
        }
        assert_eq!(cache.map.len(), 3);
        assert!(cache.bytes <= 3 * one);
        assert!(cache.get(&key(9)).is_some() && cache.get(&key(6)).is_none());
        // A reply larger than the whole cache is not kept (nor does it empty the cache).
        cache.put(key(99), vec![0; 4 * one]);
        assert!(cache.get(&key(99)).is_none());
        assert_eq!(cache.map.len(), 3);
    }

    fn admission() -> Admission {
        let cfg = config::Config::default();
        Admission::new(Schema::default(), "dev1".into(), &cfg)
    }

    fn msg(payload: &[u8]) -> Incoming<'_> {
        Incoming {
            payload,
            content_type: None,
            response_topic: None,
            correlation: None,
            message_expiry_s: None,
            retained: false,
        }
    }

    #[test]
    fn a_retained_question_is_reported_and_not_computed_whatever_it_asks() {
        let a = Admission { max_payload: 200, ..admission() };
        let good = br#"{"id": "planted", "state": "s", "questions": {}}"#;
        let to_victim = Incoming { response_topic: Some(REPLY_TOPIC), correlation: Some(b"c"), ..msg(good) };
        assert!(matches!(a.decide(&to_victim, Instant::now(), &ReplyCache::new(4)), Decision::Answer { .. }));
        let retained = Incoming { retained: true, ..to_victim.clone() };
        match a.decide(&retained, Instant::now(), &ReplyCache::new(4)) {
            Decision::Drop { report } => {
                assert_eq!(report.error.code, ErrorCode::BadRequest);
                assert_eq!(report.error.message, RETAINED_QUESTION);
                assert_eq!(report.error.id, Some(Value::from("planted")));
                assert_eq!(report.response_topic.as_deref(), Some(REPLY_TOPIC), "the topic it named, not published to");
            }
            other => panic!("{other:?}"),
        }
        // Even one already answered (no resend), one without a response topic, one refused for
        // its size or its content, and one whose response topic is outside the allowlist.
        let mut cache = ReplyCache::new(4);
        cache.put(key_of(&a, &to_victim), b"the first answer".to_vec());
        let big = format!(r#"{{"id": "big", "state": "{}"}}"#, "x".repeat(300));
        for m in [
            retained.clone(),
            Incoming { retained: true, ..msg(good) },
            Incoming { retained: true, ..msg(big.as_bytes()) },
            Incoming { retained: true, ..msg(b"{not json") },
            Incoming { retained: true, response_topic: Some("factory/valves/open"), ..msg(good) },
        ] {
            match a.decide(&m, Instant::now(), &cache) {
                Decision::Drop { report } => assert_eq!(report.error.message, RETAINED_QUESTION, "{m:?}"),
                other => panic!("{m:?}: {other:?}"),
            }
        }
        // An empty one is what clears a retained question: said so.
        match a.decide(&Incoming { retained: true, ..msg(b"") }, Instant::now(), &cache) {
            Decision::Drop { report } => assert_eq!(report.error.message, RETAINED_CLEARED),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_retained_question_is_reported_once_a_session_and_again_in_a_new_one() {
        let a = admission();
        let planted = Incoming { retained: true, response_topic: Some(REPLY_TOPIC), ..msg(b"{}") };
        let other = Incoming { correlation: Some(b"other"), ..planted.clone() };
        assert_eq!(a.retained_key(&planted), a.retained_key(&planted.clone()));
        assert_ne!(a.retained_key(&planted), a.retained_key(&other));
        let mut reports = RetainedReports::default();
        assert!(reports.first(a.retained_key(&planted)));
        assert!(!reports.first(a.retained_key(&planted)), "delivered again in the session: acknowledged only");
        assert!(reports.first(a.retained_key(&other)));
        reports.new_session();
        assert!(reports.first(a.retained_key(&planted)), "a new session: reported again");
        // Bounded: the oldest is forgotten (and would be reported again).
        for k in 0..RetainedReports::CAPACITY as u64 {
            reports.first(k);
        }
        assert_eq!(reports.order.len(), RetainedReports::CAPACITY);
        assert!(reports.first(a.retained_key(&planted)));
    }

    #[test]
    fn a_question_is_told_apart_by_the_client_level_of_its_response_topic() {
        let a = admission();
        let with = |t| Incoming { response_topic: Some(t), ..msg(b"") };
        assert_eq!(a.client_of(&with("laya/v1/reply/app-1/k1")), ClientKey::named("app-1"));
        assert_eq!(a.client_of(&with("laya/v1/reply/app-1/k2/deeper")), ClientKey::named("app-1"));
        assert_eq!(a.client_of(&with("laya/v1/reply/app-2/k1")), ClientKey::named("app-2"));
        assert_eq!(a.client_of(&with("factory/valves")), ClientKey::named("factory/valves"));
        assert_eq!(a.client_of(&msg(b"")), ClientKey::Unnamed);
    }

    #[test]
    fn a_good_request_is_answered_on_its_response_topic_with_its_correlation_data() {
        let a = admission();
        let m = Incoming {
            response_topic: Some("laya/v1/reply/client9/x"),
            correlation: Some(b"abc"),
            ..msg(br#"{"id": "r1", "state": "s", "questions": {}}"#)
        };
        match a.decide(&m, Instant::now(), &ReplyCache::new(4)) {
            Decision::Answer { reply_to, .. } => {
                assert_eq!(reply_to.topic, "laya/v1/reply/client9/x");
                assert_eq!(reply_to.correlation.as_deref(), Some(&b"abc"[..]));
                assert_eq!(reply_to.encoding, Encoding::Json);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn without_a_response_topic_the_reply_goes_under_the_request_id() {
        let a = admission();
        match a.decide(&msg(br#"{"id": 42, "state": "s", "questions": {}}"#), Instant::now(), &ReplyCache::new(4)) {
            Decision::Answer { reply_to, .. } => assert_eq!(reply_to.topic, "laya/v1/dev1/reply/42"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            a.decide(&msg(br#"{"state": "s", "questions": {}}"#), Instant::now(), &ReplyCache::new(4)),
            Decision::Drop { .. }
        ));
    }

    #[test]
    fn a_response_topic_outside_the_allowlist_is_never_published_to() {
        let a = admission();
        for t in [
            "laya/v1/dev1/ask",
            "factory/valves/open",
            "laya/v1/+/reply/x",
            "$SYS/x",
            "laya/v1/dev2/reply/r1",
            "laya/v1/dev1/status",
            "laya/v1/reply/status",
            "laya/v1/reply/+/x",
        ] {
            let m = Incoming { response_topic: Some(t), ..msg(br#"{"id": "r", "state": "s", "questions": {}}"#) };
            assert!(matches!(a.decide(&m, Instant::now(), &ReplyCache::new(4)), Decision::Drop { .. }), "{t}");
        }
    }

    /// The error code of a refusal, or of a drop's report.
    fn code(d: &Decision) -> Option<ErrorCode> {
        match d {
            Decision::Refuse { error, .. } => Some(error.code),
            Decision::Drop { report } => Some(report.error.code),
            _ => None,
        }
    }

    const REPLY_TOPIC: &str = "laya/v1/reply/c/1";

    #[test]
    fn an_oversized_payload_is_refused_on_its_response_topic_and_reported_without_one() {
        let a = Admission { max_payload: 100, ..admission() };
        let big = format!(r#"{{"id": "r", "state": "{}", "questions": {{}}}}"#, "x".repeat(200));
        let with = Incoming { response_topic: Some(REPLY_TOPIC), ..msg(big.as_bytes()) };
        match a.decide(&with, Instant::now(), &ReplyCache::new(4)) {
            Decision::Refuse { error, reply_to } => {
                assert_eq!(error.code, ErrorCode::TooLarge);
                assert_eq!(reply_to.topic, REPLY_TOPIC);
            }
            other => panic!("{other:?}"),
        }
        // Without a response topic the id is not read from a payload this large.
        let d = a.decide(&msg(big.as_bytes()), Instant::now(), &ReplyCache::new(4));
        assert!(matches!(d, Decision::Drop { .. }), "{d:?}");
        assert_eq!(code(&d), Some(ErrorCode::TooLarge));
    }

    #[test]
    fn too_deep_nesting_is_refused_on_its_response_topic_and_reported_without_one() {
        let a = admission();
        let deep = format!(r#"{{"id": "r", "state": {}1{}, "questions": {{}}}}"#, "[".repeat(100), "]".repeat(100));
        let with = Incoming { response_topic: Some(REPLY_TOPIC), ..msg(deep.as_bytes()) };
        let d = a.decide(&with, Instant::now(), &ReplyCache::new(4));
        assert!(matches!(d, Decision::Refuse { .. }), "{d:?}");
        assert_eq!(code(&d), Some(ErrorCode::TooLarge));
        let d = a.decide(&msg(deep.as_bytes()), Instant::now(), &ReplyCache::new(4));
        assert!(matches!(d, Decision::Drop { .. }), "{d:?}");
        assert_eq!(code(&d), Some(ErrorCode::TooLarge));
    }

    #[test]
    fn limits_give_clear_errors() {
        let a = admission();
        let many: String = (0..65).map(|i| format!(r#""q{i}": {{}}"#)).collect::<Vec<_>>().join(",");
        let req = format!(r#"{{"id": "r", "state": "s", "questions": {{{many}}}}}"#);
        assert!(matches!(
            a.decide(&msg(req.as_bytes()), Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::TooLarge, .. }, .. }
        ));
        let d = a.decide(&msg(b"{not json"), Instant::now(), &ReplyCache::new(4));
        assert!(matches!(d, Decision::Drop { .. }), "{d:?}");
        assert_eq!(code(&d), Some(ErrorCode::BadRequest));
        let m = Incoming { response_topic: Some(REPLY_TOPIC), ..msg(b"{not json") };
        assert!(matches!(
            a.decide(&m, Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::BadRequest, .. }, .. }
        ));
    }

    #[test]
    fn an_mqtt311_request_whose_id_cannot_be_a_topic_level_is_reported_with_the_reason() {
        let a = admission();
        let long = "x".repeat(MAX_ID_LEVEL + 1);
        let fits = "y".repeat(MAX_ID_LEVEL);
        for (id, why) in [
            (r#""""#.to_owned(), "empty"),
            (format!(r#""{long}""#), "257 bytes long"),
            (r#""a/b""#.to_owned(), "contains"),
            (r#""a+""#.to_owned(), "contains"),
            (r##""#1""##.to_owned(), "contains"),
            ("null".to_owned(), "no id"),
            ("[1]".to_owned(), "neither a string nor an integer"),
        ] {
            let body = format!(r#"{{"id": {id}, "state": "s", "questions": {{}}}}"#);
            match a.decide(&msg(body.as_bytes()), Instant::now(), &ReplyCache::new(4)) {
                Decision::Drop { report } => {
                    assert_eq!(report.error.code, ErrorCode::BadRequest, "{id}");
                    assert!(report.error.message.contains(why), "{id}: {}", report.error.message);
                    assert_eq!(report.response_topic, None);
                }
                other => panic!("{id}: {other:?}"),
            }
        }
        let body = format!(r#"{{"id": "{fits}", "state": "s", "questions": {{}}}}"#);
        assert!(matches!(
            a.decide(&msg(body.as_bytes()), Instant::now(), &ReplyCache::new(4)),
            Decision::Answer { .. }
        ));
    }

    /// Admission's side only: an expired request is refused, never handed on to be answered
    /// (`Decision::Answer` is the only way to the engine). That expired calls never reach the
    /// worker is the engine's own test (agent/tests/it/engine.rs).
    #[test]
    fn an_expired_request_is_refused_deadline_exceeded_and_not_admitted_for_an_answer() {
        let a = admission();
        let m = Incoming { message_expiry_s: Some(0), ..msg(br#"{"id": "r", "state": "s", "questions": {}}"#) };
        assert!(matches!(
            a.decide(&m, Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::DeadlineExceeded, .. }, .. }
        ));
        let m = msg(br#"{"id": "r", "state": "s", "questions": {}, "deadline_ms": 0}"#);
        assert!(matches!(
            a.decide(&m, Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::DeadlineExceeded, .. }, .. }
        ));
    }

    /// The key admission gives a question it answers.
    fn key_of(a: &Admission, m: &Incoming<'_>) -> RequestKey {
        match a.decide(m, Instant::now(), &ReplyCache::new(0)) {
            Decision::Answer { key, .. } => key,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_redelivered_question_gets_the_remembered_reply() {
        let a = admission();
        let mut cache = ReplyCache::new(2);
        let body = br#"{"id": "r1", "state": "s", "questions": {}}"#;
        cache.put(key_of(&a, &msg(body)), b"first".to_vec());
        match a.decide(&msg(body), Instant::now(), &cache) {
            Decision::Resend { payload, reply_to } => {
                assert_eq!(payload, b"first");
                assert_eq!(reply_to.topic, "laya/v1/dev1/reply/r1");
            }
            other => panic!("{other:?}"),
        }
        cache.put(key_of(&a, &msg(br#"{"id": "r2", "state": "s", "questions": {}}"#)), vec![]);
        cache.put(key_of(&a, &msg(br#"{"id": "r3", "state": "s", "questions": {}}"#)), vec![]);
        assert!(cache.get(&key_of(&a, &msg(body))).is_none(), "the oldest is forgotten");
    }

    #[test]
    fn a_reused_id_with_new_content_is_a_new_question() {
        let a = admission();
        let mut cache = ReplyCache::new(8);
        let first = br#"{"id": "same", "state": "s", "questions": {"c0": {"type": "noul", "instructions": "a"}}}"#;
        let again = br#"{"id": "same", "state": "s", "questions": {"s0": {"type": "noul", "instructions": "b"}}}"#;
        cache.put(key_of(&a, &msg(first)), b"answers to c0".to_vec());
        assert!(matches!(a.decide(&msg(again), Instant::now(), &cache), Decision::Answer { .. }));
        // The same bytes with other correlation data, or to another response topic, are another
        // client's question too.
        let corr = Incoming { correlation: Some(b"x"), ..msg(first) };
        assert!(matches!(a.decide(&corr, Instant::now(), &cache), Decision::Answer { .. }));
        let other = Incoming { response_topic: Some(REPLY_TOPIC), ..msg(first) };
        assert!(matches!(a.decide(&other, Instant::now(), &cache), Decision::Answer { .. }));
        assert!(matches!(a.decide(&msg(first), Instant::now(), &cache), Decision::Resend { .. }));
    }
}
