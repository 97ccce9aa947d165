//! laya-edge against fixtures made by laya's own code, one test binary (rust-analyzer's
//! `tests/slow-tests`): each module holds the tests of one concern, `support` says where the
//! fixtures are and how to read them.
//!
//! Run one module with `cargo test -p laya-edge-conformance --test conformance <module>::`.

mod cpu_model;
mod demo_model;
mod host_pipeline;
mod laya_0_4_15;
mod parallel_layout;
mod probe_defaults;
mod properties;
mod qnn;
mod request_limits;
mod rknn;
mod rknn_simulator;
mod support;
mod toolchain;
