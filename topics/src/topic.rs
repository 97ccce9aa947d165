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
//! ```
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

/// Why a topic could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("{what} {value:?} must be non-empty and contain no '/', '+', '#' or NUL")]
    BadLevel { what: &'static str, value: String },
    #[error("the prefix {0:?} must be non-empty levels without wildcards, not starting with '$'")]
    BadPrefix(String),
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

    /// A device topic.
    pub fn topic(&self, device: &str, channel: Channel) -> Result<Topic, TopicError> {
        check_level("device id", device)?;
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

    /// The default response-topic allowlist: `{prefix}/+/reply/#`.
    pub fn default_reply_filter(&self) -> String {
        format!("{}/+/reply/#", self.prefix)
    }

    /// Parses a device topic of this schema.
    pub fn parse(&self, topic: &str) -> Option<Topic> {
        let rest = topic.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        let mut parts = rest.splitn(3, '/');
        let device = parts.next()?.to_owned();
        if device.is_empty() || device == "fleet" {
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
    fn filters_match_like_a_broker() {
        assert!(filter_matches("laya/v1/+/reply/#", "laya/v1/c1/reply/r1"));
        assert!(filter_matches("laya/v1/+/reply/#", "laya/v1/c1/reply"));
        assert!(!filter_matches("laya/v1/+/reply/#", "laya/v1/c1/ask"));
        assert!(!filter_matches("laya/v1/+/reply/#", "other/c1/reply/x"));
        assert!(!filter_matches("#", "$SYS/broker"));
        assert!(filter_matches("a/+", "a/b") && !filter_matches("a/+", "a/b/c"));
    }
}
