//! Loading librknnrt from an explicit path and checking its version.
//!
//! The runtime is chosen by the bundle, not by the system: librknnrt 2.4.2 loads the Laya graph
//! and then returns a constant vector on NPU driver 0.9.8, so a board whose system library is
//! 2.4.2 must still run this graph on 2.3.2, loaded from its own file. The path therefore comes
//! from the configuration or `RKNN_LIB` and nowhere else: no default path, no search, and the path
//! handed to `dlopen` is absolute, so the dynamic loader cannot substitute another copy.

use std::path::{Path, PathBuf};

use libloading::Library;

use super::abi;
use super::{DEFAULT_RUNTIME_ALLOWLIST, RknnError};
use crate::backend::npu::library::{self, OpenError};

/// The function table of one loaded runtime library.
///
/// The library is opened once per process and never unloaded ([`crate::backend::npu::library`]):
/// librknnrt (and the fake runtime's CPU reference) start threads that may outlive any handle.
#[derive(Clone, Copy)]
pub(crate) struct Runtime {
    pub init: abi::InitFn,
    pub destroy: abi::DestroyFn,
    pub query: abi::QueryFn,
    pub set_core_mask: abi::SetCoreMaskFn,
    /// Absent from a library without it: only needed for more than one context per graph.
    pub dup_context: Option<abi::DupContextFn>,
    pub inputs_set: abi::InputsSetFn,
    pub run: abi::RunFn,
    pub outputs_get: abi::OutputsGetFn,
    pub outputs_release: abi::OutputsReleaseFn,
}

impl Runtime {
    /// Loads the library at `path` (which must be an existing file) and looks up every function.
    pub fn load(path: &Path) -> Result<Runtime, RknnError> {
        let (path, lib) = library::open_once(path).map_err(|e| match e {
            OpenError::NotFound(path) => RknnError::LibraryNotFound(path),
            OpenError::Load { path, source } => RknnError::Load { path, source },
        })?;
        let path = path.as_path();
        Ok(Runtime {
            init: symbol(lib, path, "rknn_init")?,
            destroy: symbol(lib, path, "rknn_destroy")?,
            query: symbol(lib, path, "rknn_query")?,
            set_core_mask: symbol(lib, path, "rknn_set_core_mask")?,
            dup_context: symbol(lib, path, "rknn_dup_context").ok(),
            inputs_set: symbol(lib, path, "rknn_inputs_set")?,
            run: symbol(lib, path, "rknn_run")?,
            outputs_get: symbol(lib, path, "rknn_outputs_get")?,
            outputs_release: symbol(lib, path, "rknn_outputs_release")?,
        })
    }
}

/// Looks up one function and copies its pointer out (valid forever: the library is leaked).
fn symbol<T: Copy>(lib: &'static Library, path: &Path, name: &'static str) -> Result<T, RknnError> {
    // SAFETY: every `T` used here is one of the `abi::*Fn` pointer types, each restating the
    // documented C signature of the symbol of that name (see abi.rs). The pointer stays valid
    // because `lib` is never unloaded.
    let sym = unsafe { lib.get::<T>(name.as_bytes()) }.map_err(|source| RknnError::Symbol {
        path: path.to_owned(),
        symbol: name,
        source,
    })?;
    Ok(*sym)
}

/// The runtime library and kernel driver versions, as `RKNN_QUERY_SDK_VERSION` reports them.
/// The caller logs them (this crate has no logger yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersions {
    /// librknnrt's version string, e.g. `2.3.2 (<commit>@<date>)`.
    pub api: String,
    /// The NPU kernel driver's version, e.g. `0.9.8`.
    pub driver: String,
}

impl RuntimeVersions {
    /// The release number: the version string's first word (`2.3.2`).
    pub fn release(&self) -> &str {
        self.api.split_whitespace().next().unwrap_or("")
    }

    /// Refuses a runtime whose release is not in `allowlist`. An empty allowlist means the
    /// default one ([`DEFAULT_RUNTIME_ALLOWLIST`]), never "any runtime": running the published
    /// graph on an unchecked runtime is the failure this check exists for.
    pub fn check(&self, allowlist: &[String]) -> Result<(), RknnError> {
        let allowed: Vec<String> = if allowlist.is_empty() {
            DEFAULT_RUNTIME_ALLOWLIST.iter().map(|s| (*s).to_owned()).collect()
        } else {
            allowlist.to_vec()
        };
        if allowed.iter().any(|a| a.trim() == self.release()) {
            Ok(())
        } else {
            Err(RknnError::RuntimeRefused { api: self.api.clone(), driver: self.driver.clone(), allowed })
        }
    }
}

/// The library path: the configured one, else `RKNN_LIB`, else an error (never a guess).
pub fn resolve_library(configured: Option<&Path>) -> Result<PathBuf, RknnError> {
    if let Some(p) = configured.filter(|p| !p.as_os_str().is_empty()) {
        return Ok(p.to_owned());
    }
    match std::env::var_os("RKNN_LIB") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(RknnError::NoLibrary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(api: &str) -> RuntimeVersions {
        RuntimeVersions { api: api.into(), driver: "0.9.8".into() }
    }

    #[test]
    fn the_release_is_the_first_word_of_the_api_version() {
        assert_eq!(versions("2.3.2 (429f97ae6b@2025-04-09T09:09:27)").release(), "2.3.2");
        assert_eq!(versions("").release(), "");
    }

    #[test]
    fn a_runtime_outside_the_allowlist_is_refused_naming_the_constant_vector_problem() {
        let allow = vec!["2.3.2".to_owned()];
        assert!(versions("2.3.2 (fake)").check(&allow).is_ok());
        let err = versions("2.4.2 (abc)").check(&allow).unwrap_err().to_string();
        assert!(err.contains("2.4.2 (abc)") && err.contains("constant vector") && err.contains("0.9.8"), "{err}");
        // A longer release that merely starts with an allowed one is not allowed.
        assert!(versions("2.3.20").check(&allow).is_err());
        // An empty allowlist is the default one, not "anything goes".
        assert!(versions("2.3.2 (fake)").check(&[]).is_ok());
        assert!(versions("2.4.2 (abc)").check(&[]).is_err());
    }

    #[test]
    fn a_configured_library_wins_and_an_empty_one_is_no_library() {
        assert_eq!(
            resolve_library(Some(Path::new("/opt/rknn/librknnrt.so"))).unwrap(),
            PathBuf::from("/opt/rknn/librknnrt.so")
        );
        // RKNN_LIB is not set in unit tests; an empty configured path falls through to it.
        if std::env::var_os("RKNN_LIB").is_none() {
            assert!(matches!(resolve_library(Some(Path::new(""))), Err(RknnError::NoLibrary)));
            assert!(matches!(resolve_library(None), Err(RknnError::NoLibrary)));
        }
    }
}
