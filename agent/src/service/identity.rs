//! What is served, as every document that names the model says it (status, telemetry, reload
//! events, the HTTP door's health): the bundle's identity, since when, and the last reload's
//! outcome. Its own module so that `reload` (which replaces what is served) and `telemetry`
//! (which reports it) both read it without depending on each other.

use std::time::{SystemTime, UNIX_EPOCH};

use laya_topics::wire;

use crate::bundle::HostBundle;

/// What the status document says about the model being served.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// The manifest's `name`, else the model directory's name (empty: not known yet).
    pub model_name: String,
    /// The sha256 of the bundle's manifest (none: a plain checkpoint directory).
    pub bundle_sha256: Option<String>,
    /// The laya whose semantics the model is answered with.
    pub laya: laya_topics::wire::LayaVersion,
    /// The manifest's `version`, else the model directory's name (a store's version name).
    pub model_version: String,
}

impl Identity {
    pub fn new(bundle: &HostBundle) -> Identity {
        let manifest = bundle.dir.join(crate::bundle::MANIFEST);
        let bundle_sha256 = if manifest.is_file() {
            match crate::bundle::digest::sha256_file(&manifest) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!(file = %manifest.display(), error = %e, "cannot hash the bundle manifest");
                    None
                }
            }
        } else {
            None
        };
        let field = |key| bundle.manifest.as_ref().and_then(|m| m.raw.get(key)).and_then(|v| v.as_str());
        let dir_name = || bundle.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let model_name = field("name").map_or_else(dir_name, str::to_owned);
        let model_version = field("version").map_or_else(dir_name, str::to_owned);
        Identity { model_name, bundle_sha256, laya: bundle.laya, model_version }
    }
}

/// What is served: the backend's name, the model directory and its identity, since when (seconds
/// since the epoch; 0: not serving yet), and the last reload's outcome.
pub struct Served<'a> {
    pub backend: &'a str,
    pub model: String,
    pub identity: &'a Identity,
    pub since: u64,
    pub last_reload: Option<wire::LastReload>,
}

/// Seconds since the Unix epoch, now.
pub fn epoch_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}
