//! Opening a vendor runtime library from an explicit path: once per process, never unloaded.
//!
//! Vendor runtimes start threads (and, on a board, DSP or NPU sessions) that can outlive any
//! handle we hold, and unloading code those threads still run would crash the process; QNN also
//! refuses to load one backend library twice. So each path is opened once and its handle leaked;
//! the worker process that owns a backend exits instead of unloading.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use libloading::Library;

/// Why a library could not be opened.
#[derive(Debug)]
pub enum OpenError {
    NotFound(PathBuf),
    Load { path: PathBuf, source: libloading::Error },
}

/// Opens `path` (which must be an existing file) once per process; returns the absolute path
/// handed to `dlopen` and the leaked handle.
pub fn open_once(path: &Path) -> Result<(PathBuf, &'static Library), OpenError> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, &'static Library>>> = OnceLock::new();
    if !path.is_file() {
        return Err(OpenError::NotFound(path.to_owned()));
    }
    // An absolute path: dlopen only searches the system when the name has no slash, so the
    // loader cannot substitute another copy.
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut open = OPEN.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(lib) = open.get(&path) {
        return Ok((path, lib));
    }
    // SAFETY: loading a shared library runs its initialisers. The path was configured explicitly
    // as the vendor runtime to use (or is a test's fake of it); their initialisers only set up
    // their own state, and nothing else in this process depends on their symbols.
    let lib = unsafe { Library::new(&path) }.map_err(|source| OpenError::Load { path: path.clone(), source })?;
    let lib: &'static Library = Box::leak(Box::new(lib));
    open.insert(path.clone(), lib);
    Ok((path, lib))
}
