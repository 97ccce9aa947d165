//! The MQTT front door: `laya-edge serve`.
//!
//! `admission` decides what to do with a message (pure), `connection` builds the broker options,
//! `server` runs the service loop.

pub mod admission;
pub mod ask;
pub mod connection;
pub mod demo;
pub mod fleet;
pub mod fleet_view;
pub mod latency;
pub mod report;
pub mod server;
