//! The `laya-edge` commands, one module each; `main.rs` only parses the command line, installs
//! logging and calls a command's `run`. What several commands share is here: reading the
//! configuration file and the runtime of the commands that are clients rather than the service.

pub mod ask;
pub mod check_config;
pub mod layout;
pub mod predict;
pub mod serve;
pub mod worker;

use std::path::Path;

use laya_edge::config::Config;

/// The configuration file, else every key's default.
pub fn load_config(path: Option<&Path>) -> Result<Config, String> {
    match path {
        Some(p) => Config::load(p).map_err(|e| e.to_string()),
        None => Ok(Config::default()),
    }
}

/// A multi-threaded runtime, for `predict`'s engine and `ask`.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}
