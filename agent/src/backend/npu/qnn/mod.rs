//! The Qualcomm QCS6490 backend: the Laya encoder as a QNN HTP context binary (Hexagon V68,
//! w8a16), run through libQnnHtp.so; tokenization, the embedding lookup, the decision head and
//! the temperatures stay on the host in float (see `docs/decisions/0004-qnn-host-npu-split.md`).
//!
//! The graph takes `inputs_embeds [1, L, d]`, `gmask` and `smask [1, 1, L, L]` (additive
//! attention biases) and returns the final-LayerNorm `hidden [1, L, d]`. Its I/O is float32, or
//! `UFIXED_POINT_16` that the host quantizes and dequantizes with the scale/offset read from the
//! binary itself.
//!
//! Files, one concern each:
//! - `abi.rs`: `#[repr(C)]` mirrors of the QNN C API subset, with layout assertions (shared with
//!   the fake runtime in `tests/fake-qnn`);
//! - `status.rs`: error codes, their names and the supervisor's reading of them;
//! - `runtime.rs`: loading the libraries, the HTP provider, log/backend/device;
//! - `power.rs`: the burst performance vote;
//! - `binary.rs`: graph and tensor metadata read from a context binary through libQnnSystem;
//! - `session.rs`: one context and its graph, execution with tensors bound by name;
//! - `host.rs`: graph choice, masks, quantization;
//! - `generator.rs`: a context binary generated from a DLC once and cached;
//! - `backend.rs`: [`QnnBackend`], the [`crate::backend::Backend`].

pub mod abi;
mod backend;
pub mod binary;
pub mod generator;
pub mod host;
pub mod power;
mod runtime;
mod session;
pub mod status;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use backend::QnnBackend;
pub use generator::GeneratorConfig;
pub use host::HostFault;
pub use power::PowerState;
pub use runtime::{RuntimeInfo, load_system};
pub use status::Status;

/// The HTP's power mode while the backend is loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Performance {
    /// The runtime's default voting.
    #[default]
    Default,
    /// Vote for burst: DCVS off, bus and core at the top voltage corner, 40 us sleep latency
    /// (see [`power`]); best effort, [`RuntimeInfo::power`] tells whether it took.
    Burst,
}

/// How to reach the QNN runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QnnConfig {
    /// `libQnnHtp.so` (core API provider, backend id 6).
    pub backend_lib: PathBuf,
    /// `libQnnSystem.so` (context binary reflection).
    pub system_lib: PathBuf,
    /// Set as `ADSP_LIBRARY_PATH` before the libraries load: where the V68 skel libraries are
    /// (`/usr/share/qcom/...` on current meta-qcom images, `/usr/lib/rfsa/adsp` on older ones).
    pub adsp_library_path: Option<String>,
    pub performance: Performance,
    /// A QnnSignal timeout on each execution, where the backend supports signals.
    pub execute_timeout: Option<Duration>,
    /// The SoC the binaries are for (cache key of generated binaries).
    pub soc: String,
    /// Where generated context binaries are cached.
    pub state_dir: Option<PathBuf>,
    /// `qnn-context-binary-generator`, for bundles that ship only a DLC.
    pub generator: Option<GeneratorConfig>,
}

impl QnnConfig {
    /// The two libraries with the defaults: no ADSP path, default power, a 10 s execution
    /// timeout, SoC `qcs6490`, no generator.
    pub fn new(backend_lib: impl Into<PathBuf>, system_lib: impl Into<PathBuf>) -> QnnConfig {
        QnnConfig {
            backend_lib: backend_lib.into(),
            system_lib: system_lib.into(),
            adsp_library_path: None,
            performance: Performance::Default,
            execute_timeout: Some(Duration::from_secs(10)),
            soc: "qcs6490".into(),
            state_dir: None,
            generator: None,
        }
    }

    /// `libQnnHtp.so` and `libQnnSystem.so` in one directory (a QAIRT `lib/` or the
    /// `tools/qnn/fetch-runtime.sh` output).
    pub fn from_lib_dir(dir: &Path) -> QnnConfig {
        QnnConfig::new(dir.join("libQnnHtp.so"), dir.join("libQnnSystem.so"))
    }
}

/// Why the QNN backend could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum QnnError {
    #[error("QNN library {0} does not exist")]
    LibraryNotFound(PathBuf),
    #[error("cannot load QNN library {path}: {source}")]
    Load { path: PathBuf, source: libloading::Error },
    #[error("{path} does not export {symbol}: not a QNN library")]
    MissingSymbol { path: PathBuf, symbol: &'static str },
    #[error("{path} has no HTP provider with core API 2.x (backend id 6); it offers {seen:?}")]
    NoProvider { path: PathBuf, seen: Vec<String> },
    #[error("the QNN runtime does not provide {0}")]
    MissingFunction(&'static str),
    #[error("{call} failed: {status}")]
    Call { call: &'static str, status: Status },
    #[error(
        "the context binary does not fit this runtime ({status}; built with {build_id}, runtime {runtime}): {}",
        status::REGENERATE
    )]
    IncompatibleBinary { status: Status, build_id: String, runtime: String },
    #[error("QNN runtime {build_id} is not in the bundle's runtime_allowlist {allowed:?}")]
    RuntimeNotAllowed { build_id: String, allowed: Vec<String> },
    #[error("unexpected context binary metadata layout: {0}")]
    BinaryLayout(String),
    #[error("the context binary has {0} graphs; a Laya QNN bundle has one graph per binary")]
    GraphCount(u32),
    #[error("tensor '{name}' is not supported: {reason}")]
    UnsupportedTensor { name: String, reason: String },
    #[error("cannot bind the encoder's tensors: {0}")]
    TensorBinding(String),
    #[error("{0} is not an NPU bundle (no laya-bundle.json)")]
    NotAnNpuBundle(PathBuf),
    #[error("the bundle is for backend '{0}', not qnn")]
    WrongBackend(String),
    #[error("the QNN bundle names no checkpoint: the host needs its embeddings, head and encoder config")]
    NoCheckpoint,
    #[error("the bundle lists no graphs")]
    NoGraphs,
    #[error("incompatible bundle: {0}")]
    Manifest(String),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("context binary generation: {0}")]
    Generator(String),
    #[error("{}: {source}", file.display())]
    InFile { file: PathBuf, source: Box<QnnError> },
    #[error(transparent)]
    Model(crate::backend::cpu::ModelError),
}

impl QnnError {
    fn in_file(self, file: &Path) -> QnnError {
        QnnError::InFile { file: file.to_owned(), source: Box::new(self) }
    }

    /// The error the supervisor acts on when loading fails in the worker: an incompatible
    /// binary or a failed runtime call is fatal; the code is kept.
    pub fn status(&self) -> Option<Status> {
        match self {
            QnnError::Call { status, .. } | QnnError::IncompatibleBinary { status, .. } => Some(*status),
            QnnError::InFile { source, .. } => source.status(),
            _ => None,
        }
    }
}

impl From<QnnError> for crate::backend::BackendError {
    /// A backend that cannot load is broken for the supervisor: fatal, with the QNN code when
    /// there is one (an incompatible binary's message says to regenerate it).
    fn from(e: QnnError) -> Self {
        crate::backend::BackendError::Fatal { code: e.status().map(|s| s.0 as i64), message: e.to_string() }
    }
}
