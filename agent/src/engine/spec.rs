//! How a worker process is started, and how it reads its settings back.
//!
//! Worker plumbing, kept apart from the driver that starts the process (`child.rs`) so the
//! command line can be built and checked without starting anything. The worker gets its
//! settings from the agent's effective configuration, not from a list of variables: the agent
//! writes the whole `Config` as TOML into the worker's environment ([`CONFIG_VAR`]) and the
//! worker reads it back with [`worker_config`]. The only other variable set for the worker is
//! `ADSP_LIBRARY_PATH` (from `qnn.adsp_library_path`), which Qualcomm's FastRPC loader reads
//! from the process environment.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::BackendKind;
use crate::config::{Config, ConfigError};

/// The environment variable that carries the agent's effective configuration (TOML) to its
/// worker. A worker started without it runs on the defaults and its command line.
pub const CONFIG_VAR: &str = "LAYA_WORKER_CONFIG";

/// How to start a worker process.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

/// The worker command line for `kind` on `config`'s model directory, carrying `config` as the
/// worker's settings and this process's id as the parent the worker must die with.
pub fn worker_spec(program: &Path, kind: BackendKind, config: &Config) -> Result<WorkerSpec, ConfigError> {
    let args: Vec<OsString> = vec![
        "worker".into(),
        "--backend".into(),
        kind.name().into(),
        "--model".into(),
        config.model.dir.clone().into(),
        "--parent".into(),
        std::process::id().to_string().into(),
    ];
    let mut env = vec![(OsString::from(CONFIG_VAR), OsString::from(config.to_toml()?))];
    if !config.qnn.adsp_library_path.is_empty() {
        env.push(("ADSP_LIBRARY_PATH".into(), config.qnn.adsp_library_path.clone().into()));
    }
    Ok(WorkerSpec { program: program.to_owned(), args, env })
}

/// The worker's settings: the configuration its agent wrote into [`CONFIG_VAR`], else the
/// defaults (a worker started by hand).
pub fn worker_config() -> Result<Config, ConfigError> {
    match std::env::var(CONFIG_VAR) {
        Ok(text) => Config::parse(&text, Path::new("$LAYA_WORKER_CONFIG")),
        Err(std::env::VarError::NotPresent) => Ok(Config::default()),
        Err(e) => Err(ConfigError::Invalid(format!("{CONFIG_VAR}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_spec_carries_the_whole_configuration_and_the_parent_pid() {
        let mut config = Config::default();
        config.model.dir = "/models/laya".into();
        config.engine.threads = 2;
        config.engine.null_faults = "hang@3".into();
        config.rknn.core_mask = 1;
        config.qnn.backend_lib = Some("/opt/qairt/lib/libQnnHtp.so".into());
        config.qnn.adsp_library_path = "/usr/lib/rfsa/adsp".into();
        let spec = worker_spec(Path::new("/usr/bin/laya-edge"), BackendKind::Qnn, &config).unwrap();
        let args: Vec<&str> = spec.args.iter().map(|a| a.to_str().unwrap()).collect();
        let pid = std::process::id().to_string();
        assert_eq!(args, ["worker", "--backend", "qnn", "--model", "/models/laya", "--parent", pid.as_str()]);
        let env = |k: &str| spec.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.to_str().unwrap().to_owned());
        let carried = Config::parse(&env(CONFIG_VAR).unwrap(), Path::new("test")).unwrap();
        assert_eq!(carried, config);
        assert_eq!(env("ADSP_LIBRARY_PATH").as_deref(), Some("/usr/lib/rfsa/adsp"));
        assert_eq!(spec.env.len(), 2, "no other variable: {:?}", spec.env);
    }
}
