//! The model store (`[model] store`): model versions side by side, the one to serve named by a
//! link, so an OTA engine (Mender, thin-edge.io, RAUC, SWUpdate) can put a new model on a board,
//! learn whether the board serves it, and go back.
//!
//! Layout of a store `DIR`:
//! - `DIR/<version>/`: one model directory (a laya checkpoint or an NPU bundle) per version;
//! - `DIR/current`, `DIR/previous`: symbolic links to a version's directory (relative, so the
//!   store can be moved); the agent serves `current` (resolved when its configuration is read, at
//!   start and at every reload), `previous` is what `model rollback` puts back until `model commit`;
//! - `DIR/pending`: a file naming the version an install switched to and nobody committed yet;
//! - `DIR/agent.pid`: the pid of the agent serving from this store (written at start, removed at
//!   a clean exit), and `DIR/serving`: the version directory it serves (at start, then at every
//!   reload that took over);
//! - `DIR/last-reload.json`: the running agent's last reload outcome, the very event it published
//!   (`reloaded`, `reload_rejected` or `reload_superseded`, with `reload.request` and
//!   `reload.model`): how `model install` hears the outcome of the reload it asked for, without a
//!   broker.
//!
//! Links are switched atomically (a new link renamed over the old one), and files are written to
//! a temporary name and renamed, so a reader never sees half of anything. Nothing here runs a
//! model or reads a bundle: checking a version is `laya-edge check`'s (the command line does both).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The link naming the version served.
pub const CURRENT: &str = "current";
/// The link naming the version served before the last switch.
pub const PREVIOUS: &str = "previous";
/// The file naming an installed version not committed yet.
pub const PENDING: &str = "pending";
/// The agent's pid.
pub const PID_FILE: &str = "agent.pid";
/// The running agent's last reload outcome.
pub const LAST_RELOAD: &str = "last-reload.json";
/// The model directory the running agent serves.
pub const SERVING: &str = "serving";

/// The longest version name: a path component, with room for a temporary suffix.
pub const VERSION_MAX: usize = 128;

/// What can go wrong with a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the model store {0} does not exist or is not a directory")]
    NoStore(PathBuf),
    #[error("the model store {0} has no current version: install one with `laya-edge model install --store {0} DIR`")]
    NoCurrent(PathBuf),
    #[error(
        "{0:?} is not a version name: 1 to {VERSION_MAX} characters of letters, digits, '.', '_', '+' and '-', not starting with '.' or '-', and not `current`, `previous` or `pending`"
    )]
    BadVersion(String),
    #[error("the store's {link} names {target}, which is not a version of the store {store}")]
    Foreign { store: PathBuf, link: &'static str, target: PathBuf },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + use<> {
    let path = path.to_owned();
    move |source| StoreError::Io { action, path, source }
}

/// Whether `name` can be a version: one plain path component that is none of the store's own
/// names.
pub fn check_version(name: &str) -> Result<(), StoreError> {
    let plain = !name.is_empty()
        && name.len() <= VERSION_MAX
        && !name.starts_with(['.', '-'])
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
    let reserved = [CURRENT, PREVIOUS, PENDING, PID_FILE, LAST_RELOAD, SERVING].contains(&name);
    if plain && !reserved { Ok(()) } else { Err(StoreError::BadVersion(name.to_owned())) }
}

/// A model store at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// One version in the store, as `model list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub name: String,
    pub dir: PathBuf,
    pub current: bool,
    pub previous: bool,
    pub pending: bool,
}

impl Store {
    /// The store at `dir`, which must exist.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        if !dir.is_dir() {
            return Err(StoreError::NoStore(dir.to_owned()));
        }
        let dir = std::fs::canonicalize(dir).map_err(io("cannot resolve", dir))?;
        Ok(Store { dir })
    }

    /// The store at `dir`, made if it does not exist.
    pub fn create(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(io("cannot create", dir))?;
        Store::open(dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A version's directory (whether or not it exists).
    pub fn version_dir(&self, version: &str) -> PathBuf {
        self.dir.join(version)
    }

    /// The version a link names, if the link exists; an error if it names anything but a
    /// directory of this store.
    pub fn link(&self, link: &'static str) -> Result<Option<String>, StoreError> {
        let path = self.dir.join(link);
        let target = match std::fs::read_link(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("cannot read the link", &path)(e)),
        };
        let name = target.file_name().and_then(|n| n.to_str()).map(str::to_owned);
        let inside = target.parent().is_none_or(|p| p.as_os_str().is_empty() || p == self.dir);
        match name {
            Some(n) if inside && check_version(&n).is_ok() && self.dir.join(&n).is_dir() => Ok(Some(n)),
            _ => Err(StoreError::Foreign { store: self.dir.clone(), link, target }),
        }
    }

    /// The directory the agent serves: `current`, resolved to its version's directory.
    pub fn current_dir(&self) -> Result<PathBuf, StoreError> {
        match self.link(CURRENT)? {
            Some(v) => Ok(self.version_dir(&v)),
            None => Err(StoreError::NoCurrent(self.dir.clone())),
        }
    }

    /// Points `link` at `version` (or removes it), atomically.
    pub fn set_link(&self, link: &'static str, version: Option<&str>) -> Result<(), StoreError> {
        let path = self.dir.join(link);
        match version {
            Some(v) => {
                check_version(v)?;
                let tmp = self.dir.join(format!(".{link}.new"));
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(v, &tmp).map_err(io("cannot make the link", &tmp))?;
                std::fs::rename(&tmp, &path).map_err(io("cannot switch the link", &path))
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("cannot remove", &path)(e)),
                _ => Ok(()),
            },
        }
    }

    /// The version an install switched to and nobody committed, if any.
    pub fn pending(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.join(PENDING)).ok()?;
        let name = text.trim().to_owned();
        check_version(&name).is_ok().then_some(name)
    }

    /// Marks `version` as installed and not committed (or clears the mark).
    pub fn set_pending(&self, version: Option<&str>) -> Result<(), StoreError> {
        match version {
            Some(v) => self.write_file(PENDING, format!("{v}\n").as_bytes()),
            None => match std::fs::remove_file(self.dir.join(PENDING)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(io("cannot remove", &self.dir.join(PENDING))(e))
                }
                _ => Ok(()),
            },
        }
    }

    /// Every version, sorted by name, with what the links say of it.
    pub fn versions(&self) -> Result<Vec<Version>, StoreError> {
        let current = self.link(CURRENT).ok().flatten();
        let previous = self.link(PREVIOUS).ok().flatten();
        let pending = self.pending();
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io("cannot read", &self.dir))? {
            let entry = entry.map_err(io("cannot read", &self.dir))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
            // Links and files are the store's own; a version is a real directory.
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if !is_dir || check_version(&name).is_err() {
                continue;
            }
            out.push(Version {
                current: current.as_deref() == Some(&name),
                previous: previous.as_deref() == Some(&name),
                pending: pending.as_deref() == Some(&name),
                dir: entry.path(),
                name,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Writes `bytes` to the store's file `name` through a temporary file and a rename.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!(".{name}.new"));
        let mut f = std::fs::File::create(&tmp).map_err(io("cannot write", &tmp))?;
        f.write_all(bytes).map_err(io("cannot write", &tmp))?;
        f.sync_all().map_err(io("cannot write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("cannot write", &path))
    }

    /// The pid in `agent.pid`, if the file names a live process.
    pub fn agent_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join(PID_FILE)).ok()?;
        let pid: u32 = text.trim().parse().ok()?;
        // A pid file left by a killed agent may name a reused pid: only a laya-edge counts.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let named = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(argv0)).file_name();
        (pid > 0 && named.is_some_and(|n| n.to_string_lossy().starts_with("laya-edge"))).then_some(pid)
    }

    /// The version the running agent serves, if an agent runs on this store and serves one of
    /// its versions.
    pub fn serving(&self) -> Option<String> {
        self.agent_pid()?;
        let text = std::fs::read_to_string(self.dir.join(SERVING)).ok()?;
        let dir = PathBuf::from(text.trim_end_matches('\n'));
        let name = dir.file_name()?.to_str()?.to_owned();
        (dir.parent() == Some(self.dir.as_path()) && check_version(&name).is_ok()).then_some(name)
    }

    /// The running agent's last reload outcome, as it published it (see the module docs).
    pub fn last_reload(&self) -> Option<laya_topics::Value> {
        let text = std::fs::read_to_string(self.dir.join(LAST_RELOAD)).ok()?;
        laya_topics::json::parse_str(&text, Default::default()).ok()
    }
}

/// The agent's side of a store: its pid file while it runs, and each reload outcome it
/// publishes. Best effort: a store the agent cannot write to (a read-only image) costs only
/// `model install`'s wait, which then says no agent answered.
#[derive(Debug)]
pub struct AgentMark {
    store: Store,
}

impl AgentMark {
    /// Writes this process's pid into the store.
    pub fn claim(store: Store) -> AgentMark {
        if let Err(e) = store.write_file(PID_FILE, format!("{}\n", std::process::id()).as_bytes()) {
            tracing::warn!(error = %e, "cannot write the agent's pid into the model store: `model install` will not find this agent");
        }
        AgentMark { store }
    }

    /// Records the model directory served (at start, and when a reload took over).
    pub fn serving(&self, dir: &Path) {
        let text = format!("{}\n", dir.display());
        if let Err(e) = self.store.write_file(SERVING, text.as_bytes()) {
            tracing::warn!(error = %e, "cannot record the served model in the model store");
        }
    }

    /// Records a reload outcome (the event as published).
    pub fn reload_outcome(&self, event: &laya_topics::Value) {
        let text = laya_topics::json::to_string(event, laya_topics::json::Style::COMPACT);
        if let Err(e) = self.store.write_file(LAST_RELOAD, text.as_bytes()) {
            tracing::warn!(error = %e, "cannot record the reload outcome in the model store");
        }
    }
}

impl Drop for AgentMark {
    fn drop(&mut self) {
        // Only our own pid file: another agent may have claimed the store since.
        let path = self.store.dir.join(PID_FILE);
        if std::fs::read_to_string(&path).is_ok_and(|t| t.trim() == std::process::id().to_string()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("laya-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn a_version_name_is_one_plain_component_and_none_of_the_stores_own_names() {
        for ok in ["1", "v1.2.3", "2026-12-04_a+b", "A"] {
            assert!(check_version(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(VERSION_MAX + 1);
        for bad in ["", ".", "..", ".hidden", "-rf", "a/b", "../x", "current", "previous", "pending", "a b", "é", &long]
        {
            assert!(check_version(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn links_switch_to_versions_and_the_current_one_resolves_to_its_directory() {
        let dir = temp("links");
        let store = Store::open(&dir).expect("store");
        assert!(matches!(store.current_dir(), Err(StoreError::NoCurrent(_))));
        std::fs::create_dir(dir.join("v1")).expect("v1");
        std::fs::create_dir(dir.join("v2")).expect("v2");
        store.set_link(CURRENT, Some("v1")).expect("current");
        assert_eq!(store.current_dir().expect("current"), store.dir().join("v1"));
        store.set_link(PREVIOUS, Some("v1")).expect("previous");
        store.set_link(CURRENT, Some("v2")).expect("switch");
        store.set_pending(Some("v2")).expect("pending");
        let listed: Vec<(String, bool, bool, bool)> = store
            .versions()
            .expect("versions")
            .into_iter()
            .map(|v| (v.name, v.current, v.previous, v.pending))
            .collect();
        assert_eq!(listed, [("v1".into(), false, true, false), ("v2".into(), true, false, true)]);
        store.set_link(PREVIOUS, None).expect("drop previous");
        store.set_pending(None).expect("drop pending");
        assert_eq!(store.link(PREVIOUS).expect("read"), None);
        assert_eq!(store.pending(), None);
    }

    #[test]
    fn a_link_that_leaves_the_store_is_refused_by_name() {
        let dir = temp("foreign");
        let store = Store::open(&dir).expect("store");
        std::os::unix::fs::symlink("/etc", dir.join(CURRENT)).expect("link");
        let e = store.current_dir().expect_err("refused");
        assert!(matches!(e, StoreError::Foreign { link: CURRENT, .. }), "{e}");
        std::fs::remove_file(dir.join(CURRENT)).expect("rm");
        std::os::unix::fs::symlink("../x", dir.join(CURRENT)).expect("link");
        assert!(store.current_dir().is_err());
    }

    #[test]
    fn a_pid_file_naming_a_process_that_is_not_an_agent_names_no_agent() {
        let dir = temp("pid");
        let store = Store::open(&dir).expect("store");
        assert_eq!(store.agent_pid(), None);
        // This test binary is not a laya-edge.
        store.write_file(PID_FILE, format!("{}\n", std::process::id()).as_bytes()).expect("pid");
        assert_eq!(store.agent_pid(), None);
        store.write_file(PID_FILE, b"not a pid").expect("pid");
        assert_eq!(store.agent_pid(), None);
    }
}
