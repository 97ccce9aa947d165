//! The agent's integration tests, one binary (rust-analyzer's `tests/slow-tests`): each module
//! holds the tests of one concern, `support` the brokers, agents and clients they start.
//!
//! Run one module with `cargo test -p laya-edge --test it <module>::`.

mod admission;
mod bundle;
mod cli;
mod delivery;
mod engine;
mod examples;
mod fixtures_cli;
mod front_end_limits;
mod healing;
#[cfg(feature = "http")]
mod http_door;
mod laya_0_4_15;
mod model_store;
mod newcomer;
mod panics;
#[cfg(feature = "qnn")]
mod probe_graphs;
#[cfg(feature = "qnn")]
mod qnn_cli;
mod reload;
#[cfg(feature = "rknn")]
mod rknn_cli;
mod round_trips;
mod security;
mod serve_restart;
mod sessions;
mod support;
mod systemd;
mod telemetry;
mod thin_edge;
mod tls_and_login;
mod topic_tree;
#[cfg(feature = "http")]
mod two_doors;
