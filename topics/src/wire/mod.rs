//! The documents the agent publishes (replies, error replies, status, telemetry, events) and
//! the choice of encoding.
//!
//! This file holds what every document shares: [`Encoding`], the error codes and the error
//! replies. Each other document has a file of its own (`reply`, `status`, `telemetry`,
//! `event`); everything is re-exported here, so `laya_topics::wire::X` names them all.

use crate::value::{Map, Value};
use crate::{cbor, json};

pub use event::{BackendState, EngineEvent, EventKind, ProbeFigures, ProbeGraph, ReloadRef, Role};
pub use laya::LayaVersion;
pub use reply::{Reply, Timing};
pub use status::{LastReload, ServedModel, Status};
pub use telemetry::{ProbeHistory, Telemetry, TokenMemo};

/// A wire name this version does not know (an enum's `FromStr` error): which kind of name, and
/// the name read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}")]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
}

/// An enum of wire names: `as_str` (the wire string), `ALL` (every variant, for tables and
/// round-trip tests), `Display` (= `as_str`) and `FromStr` (its inverse).
macro_rules! wire_names {
    ($(#[$meta:meta])* $vis:vis enum $name:ident ($what:literal) {
        $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::wire::UnknownName;

            fn from_str(s: &str) -> Result<$name, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::wire::UnknownName { what: $what, name: s.to_owned() }),
                }
            }
        }
    };
}

mod event;
mod laya;
mod reply;
mod status;
mod telemetry;

/// The content types laya-edge speaks.
pub const CONTENT_JSON: &str = "application/json";
pub const CONTENT_CBOR: &str = "application/cbor";

/// A payload encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Cbor,
}

/// Why a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("invalid JSON: {0}")]
    Json(#[from] json::ParseError),
    #[error("invalid CBOR: {0}")]
    Cbor(#[from] cbor::CborError),
}

impl DecodeError {
    /// Whether the document nests deeper than allowed (a size limit, not malformed input).
    pub fn is_too_deep(&self) -> bool {
        matches!(
            self,
            DecodeError::Json(json::ParseError { kind: json::ParseErrorKind::TooDeep(_), .. })
                | DecodeError::Cbor(cbor::CborError::TooDeep(_))
        )
    }
}

impl Encoding {
    /// From the MQTT 5 content type if it names one, else from the payload's first byte (JSON
    /// documents start with whitespace, `{`, `[`, `"`, a digit, `-`, or a literal's letter).
    pub fn detect(content_type: Option<&str>, payload: &[u8]) -> Encoding {
        match content_type.map(|c| c.split(';').next().unwrap_or(c).trim().to_ascii_lowercase()) {
            Some(c) if c == CONTENT_CBOR => return Encoding::Cbor,
            Some(c) if c == CONTENT_JSON => return Encoding::Json,
            _ => {}
        }
        match payload.first() {
            Some(
                b'{'
                | b'['
                | b'"'
                | b' '
                | b'\t'
                | b'\n'
                | b'\r'
                | b'-'
                | b'0'..=b'9'
                | b't'
                | b'f'
                | b'n'
                | b'N'
                | b'I',
            ) => Encoding::Json,
            Some(0xEF) => Encoding::Json, // UTF-8 BOM
            _ => Encoding::Cbor,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => CONTENT_JSON,
            Encoding::Cbor => CONTENT_CBOR,
        }
    }

    /// Decodes a payload with a nesting limit.
    pub fn decode(self, payload: &[u8], max_depth: usize) -> Result<Value, DecodeError> {
        Ok(match self {
            Encoding::Json => json::parse(payload, json::ParseOptions { max_depth })?,
            Encoding::Cbor => cbor::decode(payload, max_depth)?,
        })
    }

    /// Encodes a document (compact JSON).
    pub fn encode(self, value: &Value) -> Vec<u8> {
        match self {
            Encoding::Json => json::to_string(value, json::Style::COMPACT).into_bytes(),
            Encoding::Cbor => cbor::encode(value),
        }
    }
}

/// Error codes of an error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    TooLarge,
    Overloaded,
    DeadlineExceeded,
    BackendUnavailable,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::BackendUnavailable => "backend_unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether sending the same request again may succeed.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::Overloaded | ErrorCode::BackendUnavailable | ErrorCode::Internal)
    }

    pub fn parse(s: &str) -> Option<ErrorCode> {
        [
            ErrorCode::BadRequest,
            ErrorCode::TooLarge,
            ErrorCode::Overloaded,
            ErrorCode::DeadlineExceeded,
            ErrorCode::BackendUnavailable,
            ErrorCode::Internal,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

/// `{"id", "error": {"code", "message", "retryable"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorReply {
    pub id: Option<Value>,
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorReply {
    pub fn to_value(&self) -> Value {
        let mut e = Map::new();
        e.insert("code".into(), self.code.as_str().into());
        e.insert("message".into(), self.message.as_str().into());
        e.insert("retryable".into(), Value::Bool(self.code.retryable()));
        let mut m = Map::new();
        m.insert("id".into(), self.id.clone().unwrap_or(Value::Null));
        m.insert("error".into(), Value::Object(e));
        Value::Object(m)
    }
}

/// A question that could not be answered where its client listens, published on
/// `{prefix}/{device}/errors` (QoS 1, not retained): an MQTT 3.1.1 request whose id cannot be a
/// topic level (empty, longer than 256 bytes, or containing `/`, `+`, `#`), one without an id,
/// an MQTT 5 response topic outside the allowlist, or a question delivered with the retain flag
/// (never answered). The error part is an error reply's; `response_topic` is the refused one
/// (for a retained question the one it named), if there was one.
///
/// `{"id", "error": {"code", "message", "retryable"}, "response_topic"?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Undeliverable {
    pub error: ErrorReply,
    pub response_topic: Option<String>,
}

impl Undeliverable {
    pub fn to_value(&self) -> Value {
        let mut v = self.error.to_value();
        if let (Value::Object(m), Some(t)) = (&mut v, &self.response_topic) {
            m.insert("response_topic".into(), t.as_str().into());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;

    #[test]
    fn encoding_follows_the_content_type_then_the_first_byte() {
        assert_eq!(Encoding::detect(Some("application/cbor"), b"{"), Encoding::Cbor);
        assert_eq!(Encoding::detect(Some("application/json; charset=utf-8"), &[0xa1]), Encoding::Json);
        assert_eq!(Encoding::detect(None, b" {\"a\":1}"), Encoding::Json);
        assert_eq!(Encoding::detect(None, &[0xa2, 0x61]), Encoding::Cbor);
        assert_eq!(Encoding::detect(Some("text/plain"), b"{}"), Encoding::Json);
    }

    #[test]
    fn error_replies_say_whether_to_retry() {
        let e = ErrorReply { id: Some("r".into()), code: ErrorCode::Overloaded, message: "queue full".into() };
        assert_eq!(
            json::to_string(&e.to_value(), json::Style::COMPACT),
            r#"{"id":"r","error":{"code":"overloaded","message":"queue full","retryable":true}}"#
        );
        assert!(!ErrorCode::BadRequest.retryable());
        assert_eq!(ErrorCode::parse("too_large"), Some(ErrorCode::TooLarge));
    }

    #[test]
    fn an_undeliverable_question_names_its_id_reason_and_refused_topic() {
        let e = ErrorReply { id: Some("".into()), code: ErrorCode::BadRequest, message: "empty id".into() };
        let u = Undeliverable { error: e.clone(), response_topic: None };
        assert_eq!(
            json::to_string(&u.to_value(), json::Style::COMPACT),
            r#"{"id":"","error":{"code":"bad_request","message":"empty id","retryable":false}}"#
        );
        let u = Undeliverable { error: e, response_topic: Some("factory/valves".into()) };
        assert_eq!(
            json::to_string(&u.to_value(), json::Style::COMPACT),
            r#"{"id":"","error":{"code":"bad_request","message":"empty id","retryable":false},"response_topic":"factory/valves"}"#
        );
    }
}
