//! `GET /health`: laya.serve 0.4.15's document, with what laya-edge adds about its backend.
//!
//! laya.serve answers `{status, loaded, revisions, device, device_is_preference,
//! checkpoint_devices, cpu_fallbacks}` to a caller with the bearer (or to anyone without a key),
//! and `{"status": "ok"}` alone to anyone else. laya-edge serves one checkpoint under the name a
//! client puts in `model`, so the maps have at most one entry; it appends `backend_state` (the
//! engine's [`BackendState`]), `served` (the [`ServedModel`]) and `last_reload`
//! ([`LastReload`]), which laya's `RemoteRouter` ignores as it ignores any key it does not read.

use crate::value::{Map, Value};
use crate::wire::{BackendState, LastReload, ServedModel};

/// What `/health` reports, as the agent knows it now.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// A worker holds the model (laya.serve: the checkpoint is resident). When not, `loaded` is
    /// empty and `device` is the configured preference.
    pub loaded: bool,
    /// Where the model computes: `cpu`, `qnn`, `rknn` (the backend that serves now, the CPU
    /// fallback included).
    pub device: String,
    /// The model's revision (laya.serve: the Hub revision; here the bundle's SHA-256, when the
    /// model came from a bundle).
    pub revision: Option<String>,
    /// Times the engine fell back to the CPU, and the last reason.
    pub cpu_fallbacks: u64,
    pub last_fallback_reason: Option<String>,
    pub backend_state: BackendState,
    pub served: Option<ServedModel>,
    pub last_reload: Option<LastReload>,
    /// Where the served model was loaded from (its directory): `routing.repo` in answers.
    pub source: String,
}

impl Health {
    /// The document without the bearer when a key is set: `{"status": "ok"}`.
    pub fn liveness() -> Value {
        let mut m = Map::new();
        m.insert("status".into(), "ok".into());
        Value::Object(m)
    }

    /// The whole document, the checkpoint named `name` (the first of `[http] model_names`).
    pub fn to_value(&self, name: &str) -> Value {
        let one = |v: Value| -> Value {
            let mut m = Map::new();
            if self.loaded {
                m.insert(name.to_string(), v);
            }
            Value::Object(m)
        };
        let mut m = Map::new();
        m.insert("status".into(), "ok".into());
        let loaded = if self.loaded { vec![Value::from(name)] } else { Vec::new() };
        m.insert("loaded".into(), Value::Array(loaded));
        m.insert("revisions".into(), one(self.revision.as_deref().map_or(Value::Null, Value::from)));
        m.insert("device".into(), self.device.as_str().into());
        m.insert("device_is_preference".into(), (!self.loaded).into());
        m.insert("checkpoint_devices".into(), one(self.device.as_str().into()));
        let mut fallback = Map::new();
        fallback.insert("count".into(), Value::Int(self.cpu_fallbacks.into()));
        fallback.insert("last_reason".into(), self.last_fallback_reason.as_deref().map_or(Value::Null, Value::from));
        m.insert("cpu_fallbacks".into(), one(Value::Object(fallback)));
        m.insert("backend_state".into(), self.backend_state.to_string().into());
        m.insert("served".into(), self.served.as_ref().map_or(Value::Null, ServedModel::to_value));
        m.insert("last_reload".into(), self.last_reload.as_ref().map_or(Value::Null, LastReload::to_value));
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{self, Style};

    fn health(loaded: bool) -> Health {
        Health {
            loaded,
            device: "cpu".into(),
            revision: None,
            cpu_fallbacks: 0,
            last_fallback_reason: None,
            backend_state: BackendState::Ready,
            served: None,
            last_reload: None,
            source: "m".into(),
        }
    }

    #[test]
    fn the_document_starts_with_laya_serves_keys_in_its_order() {
        let text = json::to_string(&health(true).to_value("edge"), Style::COMPACT);
        assert!(
            text.starts_with(
                r#"{"status":"ok","loaded":["edge"],"revisions":{"edge":null},"device":"cpu","device_is_preference":false,"checkpoint_devices":{"edge":"cpu"},"cpu_fallbacks":{"edge":{"count":0,"last_reason":null}},"backend_state":"ready""#
            ),
            "{text}"
        );
        let text = json::to_string(&health(false).to_value("edge"), Style::COMPACT);
        assert!(text.starts_with(r#"{"status":"ok","loaded":[],"revisions":{},"device":"cpu","device_is_preference":true,"checkpoint_devices":{},"cpu_fallbacks":{}"#), "{text}");
    }
}
