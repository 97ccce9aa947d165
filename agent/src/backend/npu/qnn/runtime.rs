//! Loading libQnnHtp.so and libQnnSystem.so from explicit paths, choosing the HTP provider, and
//! the process-wide runtime objects: log, backend, device, and the device's power vote.
//!
//! Libraries are opened once per process and never unloaded ([`crate::backend::npu::library`]): the HTP
//! backend starts threads (and, on a board, a FastRPC session) that can outlive any handle, and
//! QNN refuses to load a backend library twice in one process (`QNN_COMMON_ERROR_LOADING_BINARIES`,
//! 1009).

use std::ffi::{CStr, c_char, c_void};
use std::path::Path;

use libloading::Library;

use crate::backend::npu::library::{self, OpenError};

use super::abi::{self, CoreFunctions, Handle, SystemFunctions};
use super::power::{self, PowerState, PowerVote};
use super::status::Status;
use super::{QnnConfig, QnnError};

/// Opens `path` once per process ([`library::open_once`]).
fn open_once(path: &Path) -> Result<&'static Library, QnnError> {
    library::open_once(path).map(|(_, lib)| lib).map_err(|e| match e {
        OpenError::NotFound(path) => QnnError::LibraryNotFound(path),
        OpenError::Load { path, source } => QnnError::Load { path, source },
    })
}

fn c_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: QNN returns NUL-terminated strings that live as long as the library (provider names,
    // build ids) or the object they describe; we copy them out immediately.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// What the chosen provider says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub provider: String,
    pub core_api: abi::Version,
    pub backend_api: abi::Version,
    /// `backendGetBuildId`, e.g. `v2.51.0.260929181845` (the QAIRT release).
    pub build_id: String,
    /// Whether a device object was created (the x86-64 simulator may not support one).
    pub device: bool,
    /// Whether the configured performance vote is in force.
    pub power: PowerState,
}

/// QNN's log callback. It receives a printf format and a `va_list`, which stable Rust cannot
/// format, so it drops the runtime's warnings and errors; registering it keeps the runtime from
/// printing to the worker's stderr on its own.
unsafe extern "C" fn log_callback(_fmt: *const c_char, _level: u32, _timestamp: u64, _args: *mut c_void) {}

/// The loaded core and system libraries and the process-wide runtime objects.
pub struct Runtime {
    pub core: CoreFunctions,
    pub system: SystemFunctions,
    pub info: RuntimeInfo,
    pub log: Handle,
    pub backend: Handle,
    pub device: Handle,
    /// Withdrawn before the device is freed.
    power: Option<PowerVote>,
}

// SAFETY: the handles are opaque pointers owned by the QNN runtime, which documents its API as
// callable from any thread as long as calls on one object are not concurrent; `Runtime` is only
// used through `&mut` (one backend, one worker thread).
unsafe impl Send for Runtime {}

fn required<T>(f: Option<T>, name: &'static str) -> Result<T, QnnError> {
    f.ok_or(QnnError::MissingFunction(name))
}

/// libQnnSystem alone, for reading context binaries' metadata without a backend (`laya-edge
/// bundle` and `check`, which never execute a graph).
pub fn load_system(path: &Path) -> Result<SystemFunctions, QnnError> {
    let lib = open_once(path)?;
    Ok(system_provider(lib, path)?.functions)
}

impl Runtime {
    /// Loads both libraries, picks the provider with core API major 2 and backend id 6 (HTP),
    /// and creates log, backend and (where supported) device.
    pub fn load(config: &QnnConfig) -> Result<Runtime, QnnError> {
        if let Some(adsp) = &config.adsp_library_path
            && std::env::var_os("ADSP_LIBRARY_PATH").as_deref() != Some(std::ffi::OsStr::new(adsp))
        {
            // SAFETY: set before the backend library is loaded, which is the point: the FastRPC
            // loader reads ADSP_LIBRARY_PATH when the DSP session opens. Only a library user that
            // configures the path itself gets here, before it starts threads; the agent's worker
            // receives the variable in its environment from the agent and never sets it.
            unsafe { std::env::set_var("ADSP_LIBRARY_PATH", adsp) };
        }
        let core_lib = open_once(&config.backend_lib)?;
        let system_lib = open_once(&config.system_lib)?;
        let core = core_provider(core_lib, &config.backend_lib)?;
        let system = system_provider(system_lib, &config.system_lib)?;

        let get_build_id = required(core.functions.backend_get_build_id, "backendGetBuildId")?;
        let mut id: *const c_char = std::ptr::null();
        // SAFETY: `backendGetBuildId(const char**)` writes a pointer to a static string.
        let rc = unsafe { get_build_id(&mut id) };
        let build_id = if rc == abi::SUCCESS { c_str(id).unwrap_or_default() } else { String::new() };

        let mut log: Handle = std::ptr::null_mut();
        if let Some(log_create) = core.functions.log_create {
            // SAFETY: the callback is a plain function with the documented signature; `log` is
            // an out-parameter. A failure only means no log object: logging is optional.
            let rc = unsafe { log_create(Some(log_callback), abi::LOG_LEVEL_WARN, &mut log) };
            if rc != abi::SUCCESS {
                log = std::ptr::null_mut();
            }
        }
        let functions = core.functions;
        let backend_create = required(functions.backend_create, "backendCreate")?;
        let mut backend: Handle = std::ptr::null_mut();
        // SAFETY: NULL config is documented as "defaults"; `backend` is an out-parameter.
        let rc = unsafe { backend_create(log, std::ptr::null(), &mut backend) };
        if rc != abi::SUCCESS || backend.is_null() {
            free_log(&functions, log);
            return Err(QnnError::Call { call: "backendCreate", status: Status::from_handle(rc) });
        }
        let mut device: Handle = std::ptr::null_mut();
        if let Some(device_create) = functions.device_create {
            // SAFETY: NULL config asks for the default device; `device` is an out-parameter.
            let rc = unsafe { device_create(log, std::ptr::null(), &mut device) };
            if rc != abi::SUCCESS {
                // The simulator (and some boards) do not support device objects: a NULL device is
                // documented as equivalent to the default device for context creation.
                device = std::ptr::null_mut();
            }
        }
        let (power, power_state) = match power::vote(&functions, config.performance) {
            Ok(Some(vote)) => (Some(vote), PowerState::Burst),
            Ok(None) => (None, PowerState::Default),
            Err(why) => (None, PowerState::Unsupported(why)),
        };
        let info = RuntimeInfo {
            provider: c_str(core.provider_name).unwrap_or_default(),
            core_api: core.api_version.core,
            backend_api: core.api_version.backend,
            build_id,
            device: !device.is_null(),
            power: power_state,
        };
        Ok(Runtime { core: functions, system: system.functions, info, log, backend, device, power })
    }

    /// The runtime's message for an error handle, where it provides one.
    pub fn error_message(&self, e: abi::ErrorHandle) -> Option<String> {
        let f = self.core.error_get_message?;
        let mut msg: *const c_char = std::ptr::null();
        // SAFETY: `errorGetMessage(handle, const char**)` points `msg` at a static string.
        let rc = unsafe { f(e, &mut msg) };
        if rc == abi::SUCCESS { c_str(msg) } else { None }
    }
}

fn free_log(functions: &CoreFunctions, log: Handle) {
    if let (Some(free), false) = (functions.log_free, log.is_null()) {
        // SAFETY: `log` came from `logCreate` and is freed once.
        unsafe { free(log) };
    }
}

impl Drop for Runtime {
    /// Frees in reverse order of creation: power vote, device, backend, log.
    fn drop(&mut self) {
        drop(self.power.take());
        if let (Some(free), false) = (self.core.device_free, self.device.is_null()) {
            // SAFETY: created by `deviceCreate`, freed once, after every context using it.
            unsafe { free(self.device) };
        }
        if let Some(free) = self.core.backend_free {
            // SAFETY: created by `backendCreate`, freed once, after its contexts.
            unsafe { free(self.backend) };
        }
        free_log(&self.core, self.log);
    }
}

/// `QnnInterface_getProviders`, then the provider with core API major 2 and backend id HTP.
fn core_provider(lib: &'static Library, path: &Path) -> Result<&'static abi::Interface, QnnError> {
    // SAFETY: the symbol has the documented `QnnInterface_getProviders` signature.
    let get: libloading::Symbol<abi::GetProvidersFn> = unsafe { lib.get(abi::GET_PROVIDERS) }
        .map_err(|_| QnnError::MissingSymbol { path: path.to_owned(), symbol: "QnnInterface_getProviders" })?;
    let mut list: *const *const abi::Interface = std::ptr::null();
    let mut n = 0u32;
    // SAFETY: both are out-parameters; the returned array lives as long as the library.
    let rc = unsafe { get(&mut list, &mut n) };
    if rc != abi::SUCCESS || list.is_null() {
        return Err(QnnError::Call { call: "QnnInterface_getProviders", status: Status::from_handle(rc) });
    }
    let mut seen = Vec::new();
    for i in 0..n as usize {
        // SAFETY: `list` holds `n` provider pointers that live as long as the (leaked) library.
        let p: &'static abi::Interface = match unsafe { (*list.add(i)).as_ref() } {
            Some(p) => p,
            None => continue,
        };
        seen.push(format!("backend {} core API {}", p.backend_id, p.api_version.core));
        if p.backend_id == abi::BACKEND_ID_HTP && p.api_version.core.major == abi::CORE_API_MAJOR {
            return Ok(p);
        }
    }
    Err(QnnError::NoProvider { path: path.to_owned(), seen })
}

fn system_provider(lib: &'static Library, path: &Path) -> Result<&'static abi::SystemInterface, QnnError> {
    // SAFETY: the symbol has the documented `QnnSystemInterface_getProviders` signature.
    let get: libloading::Symbol<abi::GetSystemProvidersFn> = unsafe { lib.get(abi::GET_SYSTEM_PROVIDERS) }
        .map_err(|_| QnnError::MissingSymbol { path: path.to_owned(), symbol: "QnnSystemInterface_getProviders" })?;
    let mut list: *const *const abi::SystemInterface = std::ptr::null();
    let mut n = 0u32;
    // SAFETY: out-parameters; the array lives as long as the (leaked) library.
    let rc = unsafe { get(&mut list, &mut n) };
    if rc != abi::SUCCESS || list.is_null() {
        return Err(QnnError::Call { call: "QnnSystemInterface_getProviders", status: Status::from_handle(rc) });
    }
    let mut seen = Vec::new();
    for i in 0..n as usize {
        // SAFETY: `n` valid provider pointers, as above.
        let p: &'static abi::SystemInterface = match unsafe { (*list.add(i)).as_ref() } {
            Some(p) => p,
            None => continue,
        };
        seen.push(format!("system API {}", p.system_api_version));
        if p.system_api_version.major == abi::SYSTEM_API_MAJOR {
            return Ok(p);
        }
    }
    Err(QnnError::NoProvider { path: path.to_owned(), seen })
}
