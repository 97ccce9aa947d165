//! The topic tree. Every topic string laya-edge uses is built and parsed here.
//!
//! ```text
//! {prefix}/{device}/ask                       questions to one device
//! {prefix}/fleet/{fleet}/ask                  questions to any device of a fleet
//! $share/{group}/{prefix}/fleet/{fleet}/ask   how a device subscribes to its fleet
//! {prefix}/{device}/reply/{request}           answers to clients without a response topic
//! {prefix}/{device}/status                    retained online/offline status
//! {prefix}/{device}/telemetry                 periodic counters
//! {prefix}/{device}/events                    restarts, degradation, refusals
//! {prefix}/{device}/errors                    questions that had no reply topic to be refused on
//! {prefix}/reply/{client}/{key}...            answers on MQTT 5 response topics, under the
//!                                             asking client's user name (ACL: only it reads them)
//! ```
//!
//! `fleet` and `reply` are therefore not device ids. A request's response topic is published to
//! only if an allowlist filter matches it (`mqtt.response_topics`), and every filter must lie
//! under `{prefix}/reply/{client}/{key}` ([`Schema::check_response_filter`]): a question can
//! never make a device publish on a status, ask, telemetry, events or errors topic, or on
//! another device's topics.
//!
//! ```
//! use laya_topics::topic::{Channel, Schema, Topic};
//! let schema = Schema::new("laya/v1").unwrap();
//! let t = schema.topic("board-7", Channel::Ask).unwrap();
//! assert_eq!(t.to_string(), "laya/v1/board-7/ask");
//! assert_eq!(schema.parse(&t.to_string()), Some(t));
//! ```

use std::fmt;

/// The default topic prefix.
pub const DEFAULT_PREFIX: &str = "laya/v1";

/// The default response-topic allowlist entry (`mqtt.response_topics`), `{prefix}` substituted
/// by [`Schema::response_filter`]: any client's replies, `{prefix}/reply/{client}/{key}...`.
pub const DEFAULT_RESPONSE_TOPICS: &str = "{prefix}/reply/+/+/#";

/// The level under the prefix that holds clients' replies; not a device id.
pub const REPLY_LEVEL: &str = "reply";

/// The level under the prefix that holds fleet questions; not a device id.
pub const FLEET_LEVEL: &str = "fleet";

/// Why a topic could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("{what} {value:?} must be non-empty and contain no '/', '+', '#' or NUL")]
    BadLevel { what: &'static str, value: String },
    #[error("the prefix {0:?} must be non-empty levels without wildcards, not starting with '$'")]
    BadPrefix(String),
    #[error("{what} {value:?} is reserved: {{prefix}}/{value}/... holds {holds}, not a device's topics")]
    Reserved { what: &'static str, value: String, holds: &'static str },
    #[error(
        "the response topic filter {filter:?} {why}: response topics must lie under {prefix}/reply/{{client}}/{{key}} (e.g. {prefix}/reply/+/+/#), so that no question can make a device publish on a status, ask, telemetry, events or errors topic or another device's topics"
    )]
    BadResponseFilter { filter: String, prefix: String, why: String },
}

fn check_level(what: &'static str, value: &str) -> Result<(), TopicError> {
    if value.is_empty() || value.contains(['/', '+', '#', '\0']) {
        return Err(TopicError::BadLevel { what, value: value.to_owned() });
    }
    Ok(())
}

/// What a device-level topic is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channel {
    Ask,
    /// Replies to the request with this id.
    Reply(String),
    Status,
    Telemetry,
    Events,
    /// Why a question could not be answered anywhere its client listens (an MQTT 3.1.1 request
    /// without a usable id, a refused response topic): the agent says so here, never silently.
    Errors,
}

/// `value` as a device id: a level, and not one of the levels the tree reserves.
fn check_device(value: &str) -> Result<(), TopicError> {
    check_level("device id", value)?;
    match value {
        REPLY_LEVEL => Err(TopicError::Reserved { what: "device id", value: value.into(), holds: "clients' replies" }),
        FLEET_LEVEL => Err(TopicError::Reserved { what: "device id", value: value.into(), holds: "fleet questions" }),
        _ => Ok(()),
    }
}

/// A device-level topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    pub prefix: String,
    pub device: String,
    pub channel: Channel,
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (p, d) = (&self.prefix, &self.device);
        match &self.channel {
            Channel::Ask => write!(f, "{p}/{d}/ask"),
            Channel::Reply(id) => write!(f, "{p}/{d}/reply/{id}"),
            Channel::Status => write!(f, "{p}/{d}/status"),
            Channel::Telemetry => write!(f, "{p}/{d}/telemetry"),
            Channel::Events => write!(f, "{p}/{d}/events"),
            Channel::Errors => write!(f, "{p}/{d}/errors"),
        }
    }
}

/// The topic tree under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    prefix: String,
}

impl Default for Schema {
    fn default() -> Self {
        Schema { prefix: DEFAULT_PREFIX.to_owned() }
    }
}

impl Schema {
    /// A schema under `prefix` (e.g. `laya/v1`).
    pub fn new(prefix: &str) -> Result<Schema, TopicError> {
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty()
            || prefix.starts_with('$')
            || prefix.split('/').any(|l| l.is_empty() || l.contains(['+', '#', '\0']))
        {
            return Err(TopicError::BadPrefix(prefix.to_owned()));
        }
        Ok(Schema { prefix: prefix.to_owned() })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A device topic (`device` a level, not `fleet` or `reply`).
    pub fn topic(&self, device: &str, channel: Channel) -> Result<Topic, TopicError> {
        check_device(device)?;
        if let Channel::Reply(id) = &channel {
            check_level("request id", id)?;
        }
        Ok(Topic { prefix: self.prefix.clone(), device: device.to_owned(), channel })
    }

    /// `{prefix}/fleet/{fleet}/ask`: where clients send questions for a whole fleet.
    pub fn fleet_ask(&self, fleet: &str) -> Result<String, TopicError> {
        check_level("fleet", fleet)?;
        Ok(format!("{}/fleet/{fleet}/ask", self.prefix))
    }

    /// `$share/{group}/{prefix}/fleet/{fleet}/ask`: the shared subscription a device takes.
    pub fn fleet_subscription(&self, group: &str, fleet: &str) -> Result<String, TopicError> {
        check_level("share group", group)?;
        Ok(format!("$share/{group}/{}", self.fleet_ask(fleet)?))
    }

    /// `{prefix}/+/status`, `{prefix}/+/telemetry`, `{prefix}/+/events`: one channel of every
    /// device, for a fleet view (`None` for channels that are per request or per device only).
    pub fn every_device(&self, channel: &Channel) -> Option<String> {
        let name = match channel {
            Channel::Status => "status",
            Channel::Telemetry => "telemetry",
            Channel::Events => "events",
            Channel::Errors => "errors",
            Channel::Ask | Channel::Reply(_) => return None,
        };
        Some(format!("{}/+/{name}", self.prefix))
    }

    /// `{prefix}/reply/{client}/{key}`: a response topic of `client` (its user name on a broker
    /// with the shipped ACL, which lets only that user read it), `key` telling its questions
    /// apart. Clients still match the correlation data: any client may name this topic as the
    /// response topic of a question of its own (docs/security.md).
    ///
    /// ```
    /// let s = laya_topics::topic::Schema::default();
    /// assert_eq!(s.client_reply("app-1", "4f2a").unwrap(), "laya/v1/reply/app-1/4f2a");
    /// assert!(s.check_response_filter(&s.client_reply("app-1", "4f2a").unwrap()).is_ok());
    /// ```
    pub fn client_reply(&self, client: &str, key: &str) -> Result<String, TopicError> {
        check_level("client", client)?;
        check_level("reply key", key)?;
        Ok(format!("{}/{REPLY_LEVEL}/{client}/{key}", self.prefix))
    }

    /// The client level of a response topic `{prefix}/reply/{client}/{key}...` ([`Schema::client_reply`]
    /// read back); `None` for any other topic.
    ///
    /// ```
    /// let s = laya_topics::topic::Schema::default();
    /// assert_eq!(s.reply_client("laya/v1/reply/app-1/4f2a/x"), Some("app-1"));
    /// assert_eq!(s.reply_client("laya/v1/reply/app-1"), None);
    /// assert_eq!(s.reply_client("laya/v1/dev1/reply/r1"), None);
    /// ```
    pub fn reply_client<'t>(&self, topic: &'t str) -> Option<&'t str> {
        let rest = topic.strip_prefix(self.prefix.as_str())?.strip_prefix('/')?.strip_prefix(REPLY_LEVEL)?;
        let (client, key) = rest.strip_prefix('/')?.split_once('/')?;
        (!key.is_empty()).then_some(client)
    }

    /// The default response-topic allowlist: [`DEFAULT_RESPONSE_TOPICS`] under this prefix,
    /// `{prefix}/reply/+/+/#`.
    pub fn default_reply_filter(&self) -> String {
        self.expand(DEFAULT_RESPONSE_TOPICS)
    }

    /// A configured filter with `{prefix}` substituted.
    fn expand(&self, template: &str) -> String {
        template.replace("{prefix}", &self.prefix)
    }

    /// A `mqtt.response_topics` entry with `{prefix}` substituted, checked by
    /// [`Schema::check_response_filter`].
    pub fn response_filter(&self, template: &str) -> Result<String, TopicError> {
        let filter = self.expand(template);
        self.check_response_filter(&filter)?;
        Ok(filter)
    }

    /// Whether every topic `filter` can match lies under `{prefix}/reply/{client}/{key}`: the
    /// prefix and `reply` spelled out, then a client level (a name or `+`) and at least one more
    /// level that is not `#`. Anything wider could match `{prefix}/+/status`, `.../ask`,
    /// `.../telemetry`, `.../events`, `.../errors`, the fleet ask topics, or another device's
    /// topics (its MQTT 3.1.1 replies `{prefix}/{device}/reply/{id}` included).
    pub fn check_response_filter(&self, filter: &str) -> Result<(), TopicError> {
        let bad = |why: &str| TopicError::BadResponseFilter {
            filter: filter.to_owned(),
            prefix: self.prefix.clone(),
            why: why.to_owned(),
        };
        let levels: Vec<&str> = filter.split('/').collect();
        for (i, l) in levels.iter().enumerate() {
            let wildcard_misused =
                (l.contains('+') && *l != "+") || (l.contains('#') && (*l != "#" || i + 1 != levels.len()));
            if filter.is_empty() || filter.len() > 65535 || l.contains('\0') || wildcard_misused {
                return Err(bad("is not a valid MQTT topic filter"));
            }
        }
        let prefix: Vec<&str> = self.prefix.split('/').collect();
        let n = prefix.len();
        if levels.len() < n || levels[..n] != prefix[..] {
            return Err(bad("is not under the prefix"));
        }
        if levels.get(n) != Some(&REPLY_LEVEL) {
            return Err(bad(&format!("does not start with {}/{REPLY_LEVEL}/", self.prefix)));
        }
        match levels.get(n + 1) {
            None | Some(&"#") | Some(&"") => return Err(bad("has no client level after reply/")),
            Some(_) => {}
        }
        match levels.get(n + 2) {
            None | Some(&"#") => Err(bad(
                "has no key level after the client (it could match {prefix}/reply/{client} and, with a wildcard, {prefix}/reply/status)",
            )),
            Some(_) => Ok(()),
        }
    }

    /// Parses a device topic of this schema.
    pub fn parse(&self, topic: &str) -> Option<Topic> {
        let rest = topic.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        let mut parts = rest.splitn(3, '/');
        let device = parts.next()?.to_owned();
        if check_device(&device).is_err() {
            return None;
        }
        let channel = match (parts.next()?, parts.next()) {
            ("ask", None) => Channel::Ask,
            ("status", None) => Channel::Status,
            ("telemetry", None) => Channel::Telemetry,
            ("events", None) => Channel::Events,
            ("errors", None) => Channel::Errors,
            ("reply", Some(id)) if !id.is_empty() && !id.contains('/') => Channel::Reply(id.to_owned()),
            _ => return None,
        };
        Some(Topic { prefix: self.prefix.clone(), device, channel })
    }

    /// Whether `topic` is this schema's fleet ask topic (as delivered, without `$share/...`).
    pub fn is_fleet_ask(&self, topic: &str) -> bool {
        topic
            .strip_prefix(&self.prefix)
            .and_then(|r| r.strip_prefix("/fleet/"))
            .and_then(|r| r.strip_suffix("/ask"))
            .is_some_and(|fleet| !fleet.is_empty() && !fleet.contains('/'))
    }
}

/// MQTT topic filter matching (`+` one level, `#` the rest), for the response-topic allowlist.
pub fn filter_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && !filter.starts_with('$') {
        return false;
    }
    let mut t = topic.split('/');
    for f in filter.split('/') {
        match f {
            "#" => return true,
            "+" => {
                if t.next().is_none() {
                    return false;
                }
            }
            level => {
                if t.next() != Some(level) {
                    return false;
                }
            }
        }
    }
    t.next().is_none()
}

/// Whether a string is a valid topic to publish to (no wildcards, not empty, no NUL).
pub fn is_publishable(topic: &str) -> bool {
    !topic.is_empty() && !topic.contains(['+', '#', '\0']) && topic.len() <= 65535
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_round_trip_through_display_and_parse() {
        let s = Schema::new("acme/laya/v1").unwrap();
        for ch in [
            Channel::Ask,
            Channel::Status,
            Channel::Telemetry,
            Channel::Events,
            Channel::Errors,
            Channel::Reply("r-1".into()),
        ] {
            let t = s.topic("dev1", ch).unwrap();
            assert_eq!(s.parse(&t.to_string()), Some(t));
        }
        assert_eq!(s.topic("dev1", Channel::Errors).unwrap().to_string(), "acme/laya/v1/dev1/errors");
        assert_eq!(s.parse("acme/laya/v1/dev1/errors/x"), None);
        assert_eq!(s.parse("acme/laya/v1/dev1/reply/a/b"), None);
        assert_eq!(s.parse("other/dev1/ask"), None);
        assert_eq!(s.parse("acme/laya/v1/fleet/x/ask"), None);
    }

    #[test]
    fn fleet_topics_and_shared_subscriptions() {
        let s = Schema::default();
        assert_eq!(s.fleet_subscription("workers", "north").unwrap(), "$share/workers/laya/v1/fleet/north/ask");
        assert!(s.is_fleet_ask("laya/v1/fleet/north/ask"));
        assert!(!s.is_fleet_ask("laya/v1/dev/ask"));
    }

    #[test]
    fn levels_with_wildcards_or_separators_are_refused() {
        let s = Schema::default();
        assert!(s.topic("a/b", Channel::Ask).is_err());
        assert!(s.topic("a+", Channel::Ask).is_err());
        assert!(s.topic("d", Channel::Reply("#".into())).is_err());
        assert!(Schema::new("$SYS/x").is_err());
        assert!(Schema::new("a//b").is_err());
    }

    #[test]
    fn fleet_and_reply_are_not_device_ids() {
        let s = Schema::default();
        for reserved in ["fleet", "reply"] {
            let err = s.topic(reserved, Channel::Status).unwrap_err();
            assert!(matches!(err, TopicError::Reserved { .. }), "{err}");
            assert_eq!(s.parse(&format!("laya/v1/{reserved}/status")), None);
        }
        assert!(s.topic("replying", Channel::Status).is_ok());
    }

    #[test]
    fn client_replies_lie_under_the_reply_level_and_match_the_default_allowlist() {
        let s = Schema::new("acme/edge").unwrap();
        let t = s.client_reply("app-1", "k1").unwrap();
        assert_eq!(t, "acme/edge/reply/app-1/k1");
        assert!(filter_matches(&s.default_reply_filter(), &t));
        assert_eq!(s.default_reply_filter(), "acme/edge/reply/+/+/#");
        assert_eq!(s.response_filter(DEFAULT_RESPONSE_TOPICS).unwrap(), "acme/edge/reply/+/+/#");
        assert!(s.client_reply("a/b", "k").is_err());
        assert!(s.client_reply("a", "#").is_err());
        assert!(s.client_reply("a", "").is_err());
    }

    #[test]
    fn response_filters_that_could_reach_status_ask_or_another_devices_topics_are_refused() {
        let s = Schema::default();
        for ok in [
            "laya/v1/reply/+/+/#",
            "laya/v1/reply/app-1/+",
            "laya/v1/reply/app-1/inbox/#",
            "laya/v1/reply/+/k",
            "laya/v1/reply/app-1/a/b/c",
        ] {
            assert!(s.check_response_filter(ok).is_ok(), "{ok}: {:?}", s.check_response_filter(ok));
        }
        // Each would let a question send a reply onto a topic that is not a client's reply topic.
        let device_topics = [
            "laya/v1/board-7/status",
            "laya/v1/board-7/ask",
            "laya/v1/board-7/telemetry",
            "laya/v1/board-7/events",
            "laya/v1/board-7/errors",
            "laya/v1/board-8/reply/r1",
            "laya/v1/fleet/north/ask",
            "laya/v1/reply/status",
        ];
        for bad in [
            "#",
            "laya/#",
            "laya/v1/#",
            "laya/v1/+/reply/#",
            "laya/v1/+/+",
            "laya/v1/+/status",
            "laya/v1/reply/#",
            "laya/v1/reply/+",
            "laya/v1/reply/+/#",
            "laya/v1/reply/app-1",
            "laya/v1/reply/#/x",
            "laya/v1/fleet/+/ask",
            "laya/+/reply/a/b",
            "other/reply/a/b",
            "factory/valves/open",
            "laya/v1/reply/a+/b",
            "$SYS/#",
            "",
        ] {
            let err = s.check_response_filter(bad).expect_err(bad);
            assert!(matches!(err, TopicError::BadResponseFilter { .. }), "{bad}: {err}");
        }
        // And no accepted filter matches any of those topics.
        for ok in ["laya/v1/reply/+/+/#", "laya/v1/reply/app-1/+"] {
            for t in device_topics {
                assert!(!filter_matches(ok, t), "{ok} matches {t}");
            }
        }
        // The refused ones that are valid filters match at least one of them, or lie outside the prefix.
        assert!(device_topics.iter().any(|t| filter_matches("laya/v1/+/reply/#", t)));
        assert!(filter_matches("laya/v1/reply/+/#", "laya/v1/reply/status"));
    }

    #[test]
    fn filters_match_like_a_broker() {
        assert!(filter_matches("laya/v1/+/reply/#", "laya/v1/c1/reply/r1"));
        assert!(filter_matches("laya/v1/+/reply/#", "laya/v1/c1/reply"));
        assert!(!filter_matches("laya/v1/+/reply/#", "laya/v1/c1/ask"));
        assert!(!filter_matches("laya/v1/+/reply/#", "other/c1/reply/x"));
        assert!(!filter_matches("#", "$SYS/broker"));
        assert!(filter_matches("a/+", "a/b") && !filter_matches("a/+", "a/b/c"));
    }
}
