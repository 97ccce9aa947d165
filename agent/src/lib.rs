//! laya-edge: the Laya decision model on edge NPUs.
//!
//! Data flows one way: `bus -> prompt -> engine -> decide -> bus`. See ARCHITECTURE.md.

pub mod backend;
pub mod bundle;
pub mod bus;
pub mod config;
pub mod decide;
pub mod engine;
pub mod heap;
pub mod lines;
pub mod logging;
pub mod pipeline;
pub mod prompt;
pub mod systemd;
pub mod vitals;
