//! laya-edge: the Laya decision model on edge NPUs.
//!
//! Data flows one way: `bus -> prompt -> engine -> decide -> bus`. See ARCHITECTURE.md.

pub mod backend;
pub mod bundle;
pub mod cli;
pub mod client;
pub mod config;
pub mod decide;
pub mod engine;
#[cfg(feature = "http")]
pub mod http;
#[cfg(test)]
mod layers;
pub mod metrics;
pub mod service;
pub mod store;
pub mod thin_edge;

pub mod pipeline;
pub mod platform;
pub mod prompt;
