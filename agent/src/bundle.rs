//! A model directory as `laya.Agent` loads it: `rl_agent_config.json`, `tokenizer/`,
//! `encoder/config.json`, `model.safetensors`.
//!
//! This module reads what the host pipeline needs (token budget, temperatures, tokenizer, head
//! sizes). laya-edge also reads an optional `lang_temperatures.json` beside the config: laya takes
//! per-language temperatures as a constructor argument, a file is how a board gets them.

use std::path::{Path, PathBuf};

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};

use crate::decide::{TemperatureError, Temperatures};
use crate::prompt::{Limits, Tokenizer, TokenizerError};

/// The `model` laya reports in every result.
pub const MODEL_NAME: &str = "laya-rl-agent";

/// Why a model directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("model directory {0} does not exist")]
    NoDirectory(PathBuf),
    #[error(
        "incompatible model: {0} does not contain 'rl_agent_config.json'; that file ships with the weights of a Laya checkpoint"
    )]
    NoConfig(PathBuf),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("incompatible model config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error(transparent)]
    Temperature(#[from] TemperatureError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// What `rl_agent_config.json` says.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The encoder's name or path (informational: the architecture comes from `encoder/`).
    pub encoder: String,
    /// Decision-head transformer layers.
    pub head_layers: usize,
    /// Act head classes: `len(act_costs) + 1`.
    pub n_act: usize,
    /// The checkpoint's token budget (laya's defaults 512 and 192).
    pub limits: Limits,
    pub temperatures: Temperatures,
}

/// Reads a JSON file with Python's semantics (`NaN` allowed, key order kept).
pub fn read_json(path: &Path) -> Result<Value, BundleError> {
    let bytes = std::fs::read(path).map_err(|source| BundleError::Read { path: path.to_owned(), source })?;
    json::parse(&bytes, ParseOptions::default())
        .map_err(|e| BundleError::Parse { path: path.to_owned(), message: e.to_string() })
}

impl AgentConfig {
    /// Reads `dir/rl_agent_config.json` and the optional `dir/lang_temperatures.json`.
    pub fn load(dir: &Path) -> Result<AgentConfig, BundleError> {
        if !dir.is_dir() {
            return Err(BundleError::NoDirectory(dir.to_owned()));
        }
        let path = dir.join("rl_agent_config.json");
        if !path.is_file() {
            return Err(BundleError::NoConfig(dir.to_owned()));
        }
        let cfg = read_json(&path)?;
        let bad = |message: String| BundleError::Config { path: path.clone(), message };
        if !matches!(cfg, Value::Object(_)) {
            return Err(bad("expected a JSON object".into()));
        }
        let missing: Vec<&str> = ["encoder", "head_layers"].into_iter().filter(|k| cfg.get(k).is_none()).collect();
        if !missing.is_empty() {
            return Err(bad(format!("missing configuration keys {missing:?}")));
        }
        let count = |key: &str, default: i64| -> Result<i64, BundleError> {
            match cfg.get(key) {
                None => Ok(default),
                Some(v) => v.as_i64().ok_or_else(|| bad(format!("'{key}' must be an integer"))),
            }
        };
        let head_layers = usize::try_from(count("head_layers", 2)?)
            .map_err(|_| bad("'head_layers' must not be negative".into()))?;
        let limits = Limits { max_len: count("max_len", 512)?, head_max_len: count("head_max_len", 192)? };
        let n_act = match cfg.get("act_costs") {
            None | Some(Value::Null) => 1,
            Some(Value::Object(m)) => m.len() + 1,
            Some(Value::Array(a)) => a.len() + 1,
            Some(_) => return Err(bad("'act_costs' must be an object".into())),
        };
        let encoder = cfg.get("encoder").and_then(Value::as_str).unwrap_or_default().to_owned();
        let langs_path = dir.join("lang_temperatures.json");
        let langs = if langs_path.is_file() { Some(read_json(&langs_path)?) } else { None };
        let temperatures = Temperatures::from_config(
            cfg.get("temperature"),
            cfg.get("temperature_by_options"),
            langs.as_ref(),
        )?;
        Ok(AgentConfig { encoder, head_layers, n_act, limits, temperatures })
    }
}

/// What the host side of the pipeline needs from a model directory.
#[derive(Debug)]
pub struct HostBundle {
    pub dir: PathBuf,
    pub config: AgentConfig,
    pub tokenizer: Tokenizer,
}

impl HostBundle {
    /// Loads the config and `dir/tokenizer/`.
    pub fn load(dir: &Path) -> Result<HostBundle, BundleError> {
        let config = AgentConfig::load(dir)?;
        let tokenizer = Tokenizer::load(&dir.join("tokenizer"))?;
        Ok(HostBundle { dir: dir.to_owned(), config, tokenizer })
    }
}
