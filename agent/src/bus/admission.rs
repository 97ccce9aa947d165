//! What to do with an incoming question, decided without I/O.
//!
//! A message is decoded (JSON or CBOR), checked against the limits, matched against the replies
//! already sent (a redelivered question gets the same reply again, not a second inference), and
//! given a destination: the MQTT 5 response topic if the allowlist permits it, else
//! `{prefix}/{device}/reply/{request id}` for clients without response topics (MQTT 3.1.1).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use laya_topics::topic::{Channel, Schema, filter_matches, is_publishable};
use laya_topics::wire::{Encoding, ErrorCode, ErrorReply};
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
}

/// The verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Answer it; `deadline` is when an answer stops being useful.
    Answer { request: Request, reply_to: ReplyTo, deadline: Option<Instant> },
    /// Reply with this error (no inference).
    Refuse { error: ErrorReply, reply_to: ReplyTo },
    /// The same question was answered already: send this reply again.
    Resend { reply_to: ReplyTo, payload: Vec<u8> },
    /// Nowhere allowed to reply to (logged, acknowledged, dropped).
    Drop { reason: String },
}

/// The agent's identity and limits, as admission needs them.
#[derive(Debug, Clone)]
pub struct Admission {
    pub schema: Schema,
    pub device: String,
    pub allowlist: Vec<String>,
    pub limits: config::Limits,
    pub max_payload: usize,
}

/// A request id as a topic level for the fallback reply topic.
fn id_level(id: Option<&Value>) -> Option<String> {
    let text = match id? {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.as_str().to_owned(),
        _ => return None,
    };
    (!text.is_empty() && !text.contains(['/', '+', '#', '\0']) && text.len() <= 256).then_some(text)
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
        Admission { schema, device, allowlist, limits: cfg.limits.clone(), max_payload: cfg.mqtt.max_payload }
    }

    fn fallback_reply(&self, id: Option<&Value>, correlation: Option<&[u8]>, encoding: Encoding) -> Option<ReplyTo> {
        let level = id_level(id)?;
        let topic = self.schema.topic(&self.device, Channel::Reply(level)).ok()?.to_string();
        Some(ReplyTo { topic, correlation: correlation.map(<[u8]>::to_vec), encoding })
    }

    /// Decides what to do with a message received at `now`.
    pub fn decide(&self, msg: &Incoming<'_>, now: Instant, replies: &ReplyCache) -> Decision {
        self.decide_with(msg, now, |id, topic| replies.get(id, topic).map(<[u8]>::to_vec))
    }

    /// [`Admission::decide`] with the reply cache behind `cached(id, reply topic)`, so a shared
    /// cache is locked only for the lookup, not while the payload is decoded.
    pub fn decide_with(
        &self,
        msg: &Incoming<'_>,
        now: Instant,
        cached: impl FnOnce(&Value, &str) -> Option<Vec<u8>>,
    ) -> Decision {
        let encoding = Encoding::detect(msg.content_type, msg.payload);
        let refuse = |code: ErrorCode, message: String, id: Option<Value>, to: Option<ReplyTo>| match to {
            Some(reply_to) => Decision::Refuse { error: ErrorReply { id, code, message }, reply_to },
            None => Decision::Drop { reason: format!("{}: {message} (and no reply topic)", code.as_str()) },
        };
        // Where a reply may go, before anything else: a refused response topic is never used.
        let response = match msg.response_topic {
            Some(t) if is_publishable(t) && self.allowlist.iter().any(|f| filter_matches(f, t)) => {
                Some(ReplyTo { topic: t.to_owned(), correlation: msg.correlation.map(<[u8]>::to_vec), encoding })
            }
            Some(t) => {
                return Decision::Drop {
                    reason: format!("response topic {t:?} is not in the allowlist {:?}", self.allowlist),
                };
            }
            None => None,
        };
        if msg.payload.len() > self.max_payload {
            let to = response.or_else(|| self.fallback_reply(None, msg.correlation, encoding));
            return refuse(
                ErrorCode::TooLarge,
                format!("payload of {} bytes exceeds the limit of {}", msg.payload.len(), self.max_payload),
                None,
                to,
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
        let reply_to = match response.or_else(|| self.fallback_reply(id.as_ref(), msg.correlation, encoding)) {
            Some(r) => r,
            None => {
                return Decision::Drop { reason: "no response topic and no usable request id to reply under".into() };
            }
        };
        if let Some(payload) = id.as_ref().and_then(|i| cached(i, &reply_to.topic)) {
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
        Decision::Answer { request, reply_to, deadline }
    }
}

/// Replies recently sent, by request id and reply topic, oldest forgotten first.
#[derive(Debug, Default)]
pub struct ReplyCache {
    capacity: usize,
    order: VecDeque<(String, String)>,
    map: HashMap<(String, String), Vec<u8>>,
}

fn id_key(id: &Value) -> String {
    laya_topics::json::to_string(id, laya_topics::json::Style::COMPACT)
}

impl ReplyCache {
    pub fn new(capacity: usize) -> ReplyCache {
        ReplyCache { capacity, ..ReplyCache::default() }
    }

    /// The reply sent for this request id to this topic, if remembered.
    pub fn get(&self, id: &Value, topic: &str) -> Option<&[u8]> {
        self.map.get(&(id_key(id), topic.to_owned())).map(Vec::as_slice)
    }

    /// Remembers a reply.
    pub fn put(&mut self, id: &Value, topic: &str, payload: Vec<u8>) {
        if self.capacity == 0 {
            return;
        }
        let key = (id_key(id), topic.to_owned());
        if self.map.insert(key.clone(), payload).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission() -> Admission {
        let cfg = config::Config::default();
        Admission::new(Schema::default(), "dev1".into(), &cfg)
    }

    fn msg(payload: &[u8]) -> Incoming<'_> {
        Incoming { payload, content_type: None, response_topic: None, correlation: None, message_expiry_s: None }
    }

    #[test]
    fn a_good_request_is_answered_on_its_response_topic_with_its_correlation_data() {
        let a = admission();
        let m = Incoming {
            response_topic: Some("laya/v1/client9/reply/x"),
            correlation: Some(b"abc"),
            ..msg(br#"{"id": "r1", "state": "s", "questions": {}}"#)
        };
        match a.decide(&m, Instant::now(), &ReplyCache::new(4)) {
            Decision::Answer { reply_to, .. } => {
                assert_eq!(reply_to.topic, "laya/v1/client9/reply/x");
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
        for t in ["laya/v1/dev1/ask", "factory/valves/open", "laya/v1/+/reply/x", "$SYS/x"] {
            let m = Incoming { response_topic: Some(t), ..msg(br#"{"id": "r", "state": "s", "questions": {}}"#) };
            assert!(matches!(a.decide(&m, Instant::now(), &ReplyCache::new(4)), Decision::Drop { .. }), "{t}");
        }
    }

    #[test]
    fn limits_give_clear_errors() {
        let a = Admission { max_payload: 100, ..admission() };
        let big = format!(r#"{{"id": "r", "state": "{}", "questions": {{}}}}"#, "x".repeat(200));
        assert!(matches!(
            a.decide(&msg(big.as_bytes()), Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::TooLarge, .. }, .. } | Decision::Drop { .. }
        ));
        let a = admission();
        let many: String = (0..65).map(|i| format!(r#""q{i}": {{}}"#)).collect::<Vec<_>>().join(",");
        let req = format!(r#"{{"id": "r", "state": "s", "questions": {{{many}}}}}"#);
        assert!(matches!(
            a.decide(&msg(req.as_bytes()), Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::TooLarge, .. }, .. }
        ));
        let deep = format!(r#"{{"id": "r", "state": {}1{}, "questions": {{}}}}"#, "[".repeat(100), "]".repeat(100));
        assert!(matches!(
            a.decide(&msg(deep.as_bytes()), Instant::now(), &ReplyCache::new(4)),
            Decision::Drop { .. } | Decision::Refuse { error: ErrorReply { code: ErrorCode::TooLarge, .. }, .. }
        ));
        assert!(matches!(a.decide(&msg(b"{not json"), Instant::now(), &ReplyCache::new(4)), Decision::Drop { .. }));
        let m = Incoming { response_topic: Some("laya/v1/c/reply/1"), ..msg(b"{not json") };
        assert!(matches!(
            a.decide(&m, Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::BadRequest, .. }, .. }
        ));
    }

    #[test]
    fn an_expired_request_is_refused_without_inference() {
        let a = admission();
        let m = Incoming { message_expiry_s: Some(0), ..msg(br#"{"id": "r", "state": "s", "questions": {}}"#) };
        assert!(matches!(
            a.decide(&m, Instant::now(), &ReplyCache::new(4)),
            Decision::Refuse { error: ErrorReply { code: ErrorCode::DeadlineExceeded, .. }, .. }
        ));
    }

    #[test]
    fn a_redelivered_question_gets_the_remembered_reply() {
        let a = admission();
        let mut cache = ReplyCache::new(2);
        cache.put(&Value::from("r1"), "laya/v1/dev1/reply/r1", b"first".to_vec());
        match a.decide(&msg(br#"{"id": "r1", "state": "s", "questions": {}}"#), Instant::now(), &cache) {
            Decision::Resend { payload, .. } => assert_eq!(payload, b"first"),
            other => panic!("{other:?}"),
        }
        cache.put(&Value::from("r2"), "t", vec![]);
        cache.put(&Value::from("r3"), "t", vec![]);
        assert!(cache.get(&Value::from("r1"), "laya/v1/dev1/reply/r1").is_none(), "the oldest is forgotten");
    }
}
