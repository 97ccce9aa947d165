//! `laya-edge check-config`: validates a configuration file and prints the effective
//! configuration as TOML (every key, defaults filled in), which is itself a valid configuration
//! file; the device id and MQTT client id it resolves to are printed as comments. It refuses
//! what `serve` refuses before connecting: the file's values, and `[mqtt]` as the connection
//! would take it (`service::connection::preflight`: topics, password, CA, client certificate and key).

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::service;

#[derive(clap::Args)]
pub struct Args {
    /// The configuration file (TOML); without it every key has its default.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl Args {
    /// The file's configuration.
    pub fn config(&self) -> Result<Config, String> {
        super::load_config(self.config.as_deref())
    }
}

pub fn run(args: Args, config: Config) -> Result<(), String> {
    service::connection::preflight(&config).map_err(|e| e.to_string())?;
    let text = config.to_toml().map_err(|e| e.to_string())?;
    let source = args.config.as_deref().unwrap_or(Path::new("(defaults)")).display().to_string();
    println!("# laya-edge: the effective configuration of {source}");
    println!("# device {:?}, MQTT client id {:?}", config.device(), config.client_id());
    print!("{text}");
    Ok(())
}
