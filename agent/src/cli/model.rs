//! `laya-edge model`: a model store's versions, for an OTA engine (Mender's update module,
//! thin-edge.io's plugin, a RAUC or SWUpdate hook) or an operator: `install` checks and stages a
//! version, switches `current` to it, asks the running agent to reload and waits for its
//! outcome; `rollback` puts `previous` back the same way; `commit` drops `previous`; `list` shows
//! the versions and which one serves. The store's layout is `crate::store`'s.
//!
//! An install succeeds only when the new model serves. If the agent rejects it (its engine failed
//! the health call or the probe), or says nothing within the bound, the links are put back as
//! they were and the agent is asked to reload them (and waited for): the reload transaction makes
//! the newest request win, so the agent ends serving what it served before, and no question is
//! lost on the way (each is answered by the engine it started on).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use laya_topics::Value;
use laya_topics::wire::{EventKind, ReloadRef};

use crate::config::Config;
use crate::store::{CURRENT, PREVIOUS, Store, check_version};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

/// Where the store is: `--store DIR`, else `[model] store` of `--config FILE`.
#[derive(clap::Args)]
struct StoreArgs {
    /// The model store directory.
    #[arg(long)]
    store: Option<PathBuf>,
    /// The agent's configuration file, for its `[model] store` (when --store is not given).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Checks a model directory as `laya-edge check` does, copies it into the store as a
    /// version, makes it `current` and, with an agent running on the store, waits until it serves.
    Install {
        #[command(flatten)]
        at: StoreArgs,
        /// The model: a directory (a laya checkpoint or an NPU bundle) or a tar of one (an OTA
        /// artifact's payload: `tar -C DIR -cf model.tar .`).
        source: PathBuf,
        /// The version's name (default: the bundle manifest's `version`, else the directory's name).
        #[arg(long)]
        version: Option<String>,
        /// How long to wait for the running agent's outcome, in seconds.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        timeout_s: u64,
    },
    /// Puts `previous` back as `current` after an install nobody committed, the same way.
    Rollback {
        #[command(flatten)]
        at: StoreArgs,
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        timeout_s: u64,
    },
    /// Keeps the installed version: drops `previous`.
    Commit {
        #[command(flatten)]
        at: StoreArgs,
    },
    /// One line per version: its name, its sha256, and what it is (`serving`, `current`,
    /// `previous`, `pending`).
    List {
        #[command(flatten)]
        at: StoreArgs,
    },
}

impl StoreArgs {
    fn dir(&self) -> Result<PathBuf, String> {
        if let Some(s) = &self.store {
            return Ok(s.clone());
        }
        let Some(path) = &self.config else {
            return Err("name the store: --store DIR, or --config FILE with [model] store".into());
        };
        // Read without resolving the store: it may have no current version yet.
        let config = Config::load(path).map_err(|e| e.to_string())?;
        config.model.store().map(Path::to_path_buf).ok_or_else(|| format!("{} has no [model] store", path.display()))
    }
}

pub fn run(args: Args) -> Result<(), String> {
    match args.command {
        Command::Install { at, source, version, timeout_s } => {
            install(&at.dir()?, &source, version, Duration::from_secs(timeout_s))
        }
        Command::Rollback { at, timeout_s } => rollback(&at.dir()?, Duration::from_secs(timeout_s)),
        Command::Commit { at } => commit(&at.dir()?),
        Command::List { at } => list(&at.dir()?),
    }
}

/// The links as they are, to put back.
struct Links {
    current: Option<String>,
    previous: Option<String>,
    pending: Option<String>,
}

impl Links {
    fn read(store: &Store) -> Result<Links, String> {
        Ok(Links {
            current: store.link(CURRENT).map_err(|e| e.to_string())?,
            previous: store.link(PREVIOUS).map_err(|e| e.to_string())?,
            pending: store.pending(),
        })
    }

    fn restore(&self, store: &Store) -> Result<(), String> {
        store.set_link(PREVIOUS, self.previous.as_deref()).map_err(|e| e.to_string())?;
        store.set_link(CURRENT, self.current.as_deref()).map_err(|e| e.to_string())?;
        store.set_pending(self.pending.as_deref()).map_err(|e| e.to_string())
    }
}

fn install(dir: &Path, source: &Path, version: Option<String>, within: Duration) -> Result<(), String> {
    let store = Store::create(dir).map_err(|e| e.to_string())?;
    // A bundle as a tar (an OTA artifact's payload) is unpacked inside the store first.
    let unpacked = if source.is_file() { Some(Unpacked::tar(&store, source)?) } else { None };
    let model = unpacked.as_ref().map_or(source, |u| u.0.as_path());
    let report =
        crate::cli::check::check(model, None).map_err(|e| format!("{} cannot be installed: {e}", source.display()))?;
    println!("{report}");
    let version = match version {
        Some(v) => v,
        None => default_version(model, source)?,
    };
    check_version(&version).map_err(|e| e.to_string())?;
    let before = Links::read(&store)?;
    if before.current.as_deref() == Some(version.as_str()) {
        println!("{version} is already the current version of {}", store.dir().display());
        return Ok(());
    }
    let target = store.version_dir(&version);
    let staged = if target.exists() {
        // Installed before (a retried install): checked again above through its source.
        false
    } else {
        stage(model, &store, &version)?;
        true
    };
    store.set_link(PREVIOUS, before.current.as_deref()).map_err(|e| e.to_string())?;
    store.set_link(CURRENT, Some(&version)).map_err(|e| e.to_string())?;
    // Pending (for `rollback`) only when there is something to go back to.
    store.set_pending(before.current.is_some().then_some(version.as_str())).map_err(|e| e.to_string())?;
    let Some(pid) = store.agent_pid() else {
        println!(
            "installed {version} as the current version of {}; no agent runs on this store: it serves {version} when it starts",
            store.dir().display()
        );
        return Ok(());
    };
    match reload_and_wait(&store, pid, &target, within) {
        Ok(how) => {
            println!("{version} serves: {how}");
            Ok(())
        }
        Err(why) => {
            // Back as it was, and the agent asked to read it: the newest reload wins.
            before.restore(&store)?;
            if staged {
                let _ = std::fs::remove_dir_all(&target);
            }
            // Returns once the agent settled on the old version again, so whoever acts on the
            // failure (Mender's rollback) finds the board as it was.
            let back = match &before.current {
                Some(old) => match reload_and_wait(&store, pid, &store.version_dir(old), within) {
                    Ok(_) => format!(", {old} serves"),
                    Err(e) => format!(", but the agent did not confirm serving {old} again: {e}"),
                },
                None => String::new(),
            };
            Err(format!("{version} was not installed: {why}; the store is back as it was{back}"))
        }
    }
}

fn rollback(dir: &Path, within: Duration) -> Result<(), String> {
    let store = Store::open(dir).map_err(|e| e.to_string())?;
    let links = Links::read(&store)?;
    let (Some(pending), Some(previous)) = (links.pending.clone(), links.previous.clone()) else {
        println!("nothing to roll back in {}: no install waits to be committed", store.dir().display());
        return store.set_pending(None).map_err(|e| e.to_string());
    };
    store.set_link(CURRENT, Some(&previous)).map_err(|e| e.to_string())?;
    store.set_link(PREVIOUS, None).map_err(|e| e.to_string())?;
    store.set_pending(None).map_err(|e| e.to_string())?;
    let Some(pid) = store.agent_pid() else {
        println!("rolled back from {pending} to {previous}; no agent runs on this store");
        return Ok(());
    };
    let how = reload_and_wait(&store, pid, &store.version_dir(&previous), within)
        .map_err(|why| format!("rolled back the links from {pending} to {previous}, but {why}"))?;
    println!("rolled back from {pending} to {previous}: {how}");
    Ok(())
}

fn commit(dir: &Path) -> Result<(), String> {
    let store = Store::open(dir).map_err(|e| e.to_string())?;
    let current = store.link(CURRENT).map_err(|e| e.to_string())?;
    store.set_link(PREVIOUS, None).map_err(|e| e.to_string())?;
    store.set_pending(None).map_err(|e| e.to_string())?;
    println!("committed {}", current.as_deref().unwrap_or("nothing (no current version)"));
    Ok(())
}

fn list(dir: &Path) -> Result<(), String> {
    let store = Store::open(dir).map_err(|e| e.to_string())?;
    let serving = store.serving();
    for v in store.versions().map_err(|e| e.to_string())? {
        let marks: Vec<&str> = [
            (serving.as_deref() == Some(v.name.as_str()), "serving"),
            (v.current, "current"),
            (v.previous, "previous"),
            (v.pending, "pending"),
        ]
        .into_iter()
        .filter_map(|(on, word)| on.then_some(word))
        .collect();
        println!("{}\t{}\t{}", v.name, digest_of(&v.dir), marks.join(","));
    }
    Ok(())
}

/// A version's sha256: its bundle manifest's (what the status document's `bundle_sha256` says),
/// else its weights'.
fn digest_of(dir: &Path) -> String {
    [crate::bundle::MANIFEST, "model.safetensors"]
        .iter()
        .map(|f| dir.join(f))
        .find(|f| f.is_file())
        .and_then(|f| crate::bundle::digest::sha256_file(&f).ok())
        .unwrap_or_else(|| "-".into())
}

/// A tar unpacked into a hidden directory of the store, removed when dropped.
struct Unpacked(PathBuf);

impl Unpacked {
    fn tar(store: &Store, file: &Path) -> Result<Unpacked, String> {
        let dir = store.dir().join(format!(".unpack-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot unpack into {}: {e}", dir.display()))?;
        let unpacked = Unpacked(dir);
        // The system's tar (GNU tar and busybox refuse members outside the directory); no owners
        // or permissions from the archive.
        let out = std::process::Command::new("tar")
            .arg("-C")
            .arg(&unpacked.0)
            .args(["--no-same-owner", "--no-same-permissions", "-xf"])
            .arg(file)
            .output()
            .map_err(|e| format!("cannot run tar to unpack {}: {e}", file.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} is neither a model directory nor a tar of one: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(unpacked)
    }
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The manifest's `version`, else the source's name (a tar's without its extension).
fn default_version(model: &Path, source: &Path) -> Result<String, String> {
    let manifest = model.join(crate::bundle::MANIFEST);
    let from_manifest = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|t| laya_topics::json::parse_str(&t, Default::default()).ok())
        .and_then(|v| v.get("version").and_then(Value::as_str).map(str::to_owned));
    from_manifest
        .or_else(|| {
            let source = std::fs::canonicalize(source).ok()?;
            let name = if source.is_file() { source.file_stem()? } else { source.file_name()? };
            name.to_str().map(str::to_owned)
        })
        .ok_or_else(|| format!("name the version of {} with --version", source.display()))
}

/// Copies `source` into the store as `version`: into a hidden directory first, renamed into
/// place once whole.
fn stage(source: &Path, store: &Store, version: &str) -> Result<(), String> {
    let tmp = store.dir().join(format!(".{version}.staging"));
    let _ = std::fs::remove_dir_all(&tmp);
    copy_tree(source, &tmp).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp);
        format!("cannot copy {} into the store: {e}", source.display())
    })?;
    std::fs::rename(&tmp, store.version_dir(version)).map_err(|e| format!("cannot stage {version}: {e}"))
}

/// Copies a directory tree: directories and regular files (a link is copied as what it names).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if std::fs::metadata(&src)?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

fn signal_reload(pid: u32) -> Result<(), String> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    // SAFETY: kill(2) with a pid read from the store's pid file (checked to be a live laya-edge
    // process) and a valid signal number; it touches no memory of ours.
    let rc = unsafe { libc::kill(pid, libc::SIGHUP) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("cannot signal the agent (pid {pid}): {}", std::io::Error::last_os_error()))
    }
}

/// Asks the agent `pid` to reload and waits, up to `within`, for the outcome of a reload of
/// `model` (the event it records in the store).
fn reload_and_wait(store: &Store, pid: u32, model: &Path, within: Duration) -> Result<String, String> {
    let before = store.last_reload();
    signal_reload(pid)?;
    let model = model.display().to_string();
    let until = Instant::now() + within;
    loop {
        let now = store.last_reload();
        if now != before
            && let Some((kind, message)) = now.as_ref().and_then(|v| outcome_for(v, &model))
        {
            return match kind {
                EventKind::Reloaded => Ok(message),
                EventKind::ReloadSuperseded => Err(format!("a newer reload superseded it ({message})")),
                _ => Err(format!("the agent rejected it: {message}")),
            };
        }
        if store.agent_pid().is_none() {
            return Err("the agent stopped before it answered".into());
        }
        if Instant::now() >= until {
            return Err(format!("the agent (pid {pid}) gave no outcome within {} s", within.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A recorded reload event's kind and message, if it settles a reload of `model`.
fn outcome_for(event: &Value, model: &str) -> Option<(EventKind, String)> {
    let reload = event.get("reload").and_then(ReloadRef::from_value)?;
    if reload.model.as_deref() != Some(model) {
        return None;
    }
    let kind: EventKind = event.get("event").and_then(Value::as_str)?.parse().ok()?;
    let message = event.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
    Some((kind, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::events::reload_event;

    #[test]
    fn only_an_outcome_naming_the_model_settles_the_wait() {
        let ours = ReloadRef { request: 3, model: Some("/s/v2".into()) };
        let e = reload_event(EventKind::ReloadRejected, ours, "probe failed".into()).to_value();
        assert_eq!(outcome_for(&e, "/s/v2"), Some((EventKind::ReloadRejected, "probe failed".into())));
        assert_eq!(outcome_for(&e, "/s/v1"), None);
        let unread = reload_event(EventKind::ReloadRejected, ReloadRef { request: 4, model: None }, "x".into());
        assert_eq!(outcome_for(&unread.to_value(), "/s/v2"), None);
    }
}
