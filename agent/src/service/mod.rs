//! The MQTT front door: `laya-edge serve`.
//!
//! `admission` decides what to do with a message (pure), `connection` builds the broker options,
//! `link` decides when the broker connection is lost and how long to wait (pure), `outbox` queues
//! what the loop publishes for itself, `liveness` watches the loop and the connection task,
//! `server` runs the service loop.

pub mod admission;
pub mod connection;
#[cfg(feature = "demo")]
pub mod demo;
pub mod latency;
pub mod link;
pub mod liveness;
pub mod outbox;
pub mod report;
pub mod server;
