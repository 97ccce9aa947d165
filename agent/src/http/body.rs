//! A request body read within laya.serve's limits: at most 2 MiB, within
//! `body_read_timeout_s`.
//!
//! Why its own file: the admission slot is taken before the body is read (as laya.serve
//! does), so a body that never comes or never ends would hold it. `Content-Length` over the
//! limit is refused before a byte of the body is read; a body without one (chunked) or lying
//! about it is read frame by frame and abandoned as soon as it passes the limit, so the door
//! never holds more than the limit plus one frame; the whole read is bounded in time.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use laya_topics::jev::contract::MAX_BODY_BYTES;

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Announced or read past [`MAX_BODY_BYTES`]: 413.
    #[error("request body too large")]
    TooLarge,
    /// Not complete within the timeout: 408.
    #[error("request body was not received in time")]
    Timeout,
    /// The connection failed or the framing was broken.
    #[error("the body could not be read: {0}")]
    Broken(String),
}

/// laya.serve's check before reading: a `Content-Length` that is a number over the limit (a
/// header that is not a number is left to the read, as laya.serve's `int()` failing is).
pub fn announced_too_large(content_length: Option<&[u8]>) -> bool {
    content_length
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        // A number too long for u64 is over 2 MiB too.
        .is_some_and(|v| v.parse::<u64>().map_or(true, |n| n > MAX_BODY_BYTES as u64))
}

/// Reads `body` whole, or says why not.
pub async fn read(body: Incoming, timeout: Duration) -> Result<Vec<u8>, BodyError> {
    match tokio::time::timeout(timeout, collect(body, MAX_BODY_BYTES)).await {
        Ok(r) => r,
        Err(_) => Err(BodyError::Timeout),
    }
}

async fn collect<B>(mut body: B, limit: usize) -> Result<Vec<u8>, BodyError>
where
    B: Body<Data = hyper::body::Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Broken(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(BodyError::TooLarge);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_number_over_the_limit_is_refused_before_reading() {
        assert!(announced_too_large(Some(b"2097153")));
        assert!(announced_too_large(Some(b"99999999999999999999999999")));
        assert!(!announced_too_large(Some(b"2097152")));
        assert!(!announced_too_large(Some(b"abc")));
        assert!(!announced_too_large(Some(b"-5")));
        assert!(!announced_too_large(None));
    }
}
