//! The retained status document and the backend states it names. The one document a consumer
//! reads back (`laya-edge fleet`), so it is the one with a `from_value`.

use super::LayaVersion;
use super::event::{BackendState, EventKind, ReloadRef};
use crate::value::{Map, Value};

/// The retained status document.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub online: bool,
    pub version: String,
    pub backend: String,
    pub model: String,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    pub degraded: bool,
    /// Whether questions are being answered, not just received. Always set by this agent; none
    /// when read back from an older agent's status that had none (or a state this version does
    /// not know), written as `""`.
    pub backend_state: Option<BackendState>,
    /// This run's birth number: larger for a later start of the same device, so a consumer can
    /// tell a stale retained status from the current one (the start time in milliseconds).
    pub birth: u64,
    /// The vendor runtime's version the serving worker loaded (librknnrt's, QAIRT's build id);
    /// empty when the backend has none (`cpu`, `null`) or no worker is ready yet.
    pub runtime: String,
    /// The model's name: the manifest's `name`, else the model directory's name.
    pub model_name: String,
    /// The sha256 of the bundle's `laya-bundle.json` (none: a plain checkpoint directory).
    pub bundle_sha256: Option<String>,
    /// The fleet the device serves (`mqtt.fleet`; empty: none).
    pub fleet: String,
    /// How often in this run another client connected with this device's client id and took its
    /// session (DISCONNECT 0x8E): above zero, two devices share one client id (a cloned image).
    pub takeovers: u64,
    /// The laya whose semantics the model is answered with (`[model] laya`); none when read
    /// back from an older agent's status, which served laya 0.3.20.
    pub laya: Option<LayaVersion>,
    /// The served model's version: its bundle manifest's `version`, else its directory's name (in
    /// a model store, the version's name). Empty from an older agent.
    pub model_version: String,
    /// Since when (seconds since the Unix epoch) this model serves: the start, or the reload that
    /// took it over. 0 from an older agent.
    pub serving_since: u64,
    /// The last reload request's outcome in this run (none: no reload yet).
    pub last_reload: Option<LastReload>,
}

/// The model that serves, as telemetry (`model`) and reload events (`serving`) name it:
/// `{"name", "version", "bundle_sha256", "since"}` (the status document has the same as
/// `model_name`, `model_version`, `bundle_sha256`, `serving_since`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServedModel {
    pub name: String,
    pub version: String,
    pub bundle_sha256: Option<String>,
    /// Seconds since the Unix epoch.
    pub since: u64,
}

impl ServedModel {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), self.name.as_str().into());
        m.insert("version".into(), self.version.as_str().into());
        m.insert("bundle_sha256".into(), self.bundle_sha256.as_deref().map_or(Value::Null, Value::from));
        m.insert("since".into(), Value::Int(self.since.into()));
        Value::Object(m)
    }

    pub fn from_value(v: &Value) -> Option<ServedModel> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        Some(ServedModel {
            name: s("name")?,
            version: s("version").unwrap_or_default(),
            bundle_sha256: s("bundle_sha256"),
            since: v.get("since").and_then(Value::as_i64).and_then(|x| u64::try_from(x).ok()).unwrap_or(0),
        })
    }
}

/// A reload request's outcome, as the status document carries the last one:
/// `{"event": "reloaded" | "reload_rejected" | "reload_superseded", "request", "model", "at"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReload {
    pub event: EventKind,
    pub request: ReloadRef,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

impl LastReload {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("event".into(), self.event.as_str().into());
        m.insert("request".into(), Value::Int(self.request.request.into()));
        m.insert("model".into(), self.request.model.as_deref().map_or(Value::Null, Value::from));
        m.insert("at".into(), Value::Int(self.at.into()));
        Value::Object(m)
    }

    pub fn from_value(v: &Value) -> Option<LastReload> {
        Some(LastReload {
            event: v.get("event")?.as_str()?.parse().ok()?,
            request: ReloadRef::from_value(v)?,
            at: v.get("at").and_then(Value::as_i64).and_then(|x| u64::try_from(x).ok()).unwrap_or(0),
        })
    }
}

impl Status {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("state".into(), if self.online { "online" } else { "offline" }.into());
        m.insert("version".into(), self.version.as_str().into());
        m.insert("backend".into(), self.backend.as_str().into());
        m.insert("model".into(), self.model.as_str().into());
        m.insert("started_at".into(), Value::Int(self.started_at.into()));
        m.insert("degraded".into(), Value::Bool(self.degraded));
        m.insert("backend_state".into(), self.backend_state.map_or("", BackendState::as_str).into());
        m.insert("birth".into(), Value::Int(self.birth.into()));
        m.insert("runtime".into(), self.runtime.as_str().into());
        m.insert("model_name".into(), self.model_name.as_str().into());
        m.insert("bundle_sha256".into(), self.bundle_sha256.as_deref().map_or(Value::Null, Value::from));
        m.insert("fleet".into(), self.fleet.as_str().into());
        m.insert("takeovers".into(), Value::Int(self.takeovers.into()));
        m.insert("laya".into(), self.laya.map_or("", LayaVersion::as_str).into());
        m.insert("model_version".into(), self.model_version.as_str().into());
        m.insert("serving_since".into(), Value::Int(self.serving_since.into()));
        m.insert("last_reload".into(), self.last_reload.as_ref().map_or(Value::Null, LastReload::to_value));
        Value::Object(m)
    }

    /// Reads a status document back (a consumer's side, `laya-edge fleet`): `None` unless it has
    /// a `state`; keys an older agent did not send read as empty or zero.
    pub fn from_value(v: &Value) -> Option<Status> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let u = |k: &str| v.get(k).and_then(Value::as_i64).and_then(|x| u64::try_from(x).ok()).unwrap_or(0);
        Some(Status {
            online: v.get("state")?.as_str()? == "online",
            version: s("version"),
            backend: s("backend"),
            model: s("model"),
            started_at: u("started_at"),
            degraded: v.get("degraded").is_some_and(Value::is_truthy),
            backend_state: v.get("backend_state").and_then(Value::as_str).and_then(|s| s.parse().ok()),
            birth: u("birth"),
            runtime: s("runtime"),
            model_name: s("model_name"),
            bundle_sha256: v.get("bundle_sha256").and_then(Value::as_str).map(str::to_owned),
            fleet: s("fleet"),
            takeovers: u("takeovers"),
            laya: v.get("laya").and_then(Value::as_str).and_then(|s| s.parse().ok()),
            model_version: s("model_version"),
            serving_since: u("serving_since"),
            last_reload: v.get("last_reload").and_then(LastReload::from_value),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;
    use crate::value::Map;
    #[test]
    fn a_status_reads_back_what_it_wrote_and_an_older_agents_status_still_reads() {
        let s = Status {
            online: true,
            version: "0.1.0".into(),
            backend: "rknn".into(),
            model: "/opt/laya/bundle".into(),
            started_at: 1_700_000_000,
            degraded: false,
            backend_state: Some(BackendState::Ready),
            birth: 1_700_000_000_123,
            runtime: "2.3.2 (429f97ae6b@2025-04-09T09:09:27)".into(),
            model_name: "tickets-v3".into(),
            bundle_sha256: Some("ab".repeat(32)),
            fleet: "line-3".into(),
            takeovers: 3,
            laya: Some(LayaVersion::V0_4_15),
            model_version: "v3".into(),
            serving_since: 1_700_000_100,
            last_reload: Some(LastReload {
                event: EventKind::ReloadRejected,
                request: ReloadRef { request: 2, model: Some("/var/lib/laya-edge/models/v4".into()) },
                at: 1_700_000_200,
            }),
        };
        assert_eq!(Status::from_value(&s.to_value()), Some(s));
        let old = json::parse_str(r#"{"state":"offline","backend":"cpu"}"#, Default::default()).unwrap();
        let read = Status::from_value(&old).unwrap();
        assert!(!read.online);
        assert_eq!((read.backend.as_str(), read.birth, read.bundle_sha256, read.laya), ("cpu", 0, None, None));
        assert_eq!((read.model_version.as_str(), read.serving_since, read.last_reload), ("", 0, None));
        assert_eq!(Status::from_value(&Value::Object(Map::new())), None);
    }

    #[test]
    fn a_status_with_a_backend_state_this_version_does_not_know_reads_as_none() {
        let v = json::parse_str(r#"{"state":"online","backend_state":"draining"}"#, Default::default()).unwrap();
        assert_eq!(Status::from_value(&v).map(|s| s.backend_state), Some(None));
    }
}
