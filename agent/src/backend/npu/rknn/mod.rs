//! The Rockchip RK3588 backend: the Laya graph compiled by RKNN-Toolkit2, run through librknnrt.
//!
//! The graph (see the model card `laya-multilingual-rknn`) takes one question per run, padded to
//! its compiled shape: `input_ids` and `attention_mask` `1 x L`, `marker_pos` and `marker_mask`
//! `1 x 64`, `qtype` `1`, all int64; it returns `logits` `1 x 64` float with -10000 in the slots
//! past the real options. Temperatures are applied later by `decide`, as for every backend.
//!
//! **The graph has no act head output**, so [`RknnBackend`] returns `act_logits = [0.0, 0.0]`
//! for every row: the answers' `action.act_probability` is 0.5, where the CPU backend computes
//! it. Option probabilities, choices and scores are the graph's.
//!
//! Files, one concern each:
//! - `abi.rs`: `#[repr(C)]` mirrors of the C API, with layout assertions (shared with the fake
//!   runtime in `tests/fake-rknn`);
//! - `status.rs`: names and meanings of the runtime's error codes;
//! - `runtime.rs`: loading the library from an explicit path, the version allowlist;
//! - `inputs.rs`: choosing the shape bucket and padding a row to it;
//! - `guard.rs`: the constant-output guard;
//! - `session.rs`: one loaded graph (context): attribute checks, core mask, one row per run,
//!   duplicates through `rknn_dup_context`;
//! - `backend.rs`: [`RknnBackend`], the [`crate::backend::Backend`] over all loaded graphs, with
//!   up to three contexts per graph (one per NPU core) running a call's rows side by side.
//!
//! The decisions behind the loading rules are in `docs/decisions/0003-rknn-runtime-loading.md`.

pub mod abi;
mod backend;
mod guard;
mod inputs;
mod runtime;
mod session;
pub mod status;

use std::path::{Path, PathBuf};

pub use backend::RknnBackend;
pub use inputs::choose_graph;
pub use runtime::{RuntimeVersions, resolve_library};
pub use status::Status;

/// The runtime releases this graph is known to work with (model card: built and checked with
/// RKNN-Toolkit2 2.3.2; runtime 2.4.2 returns a constant vector on NPU driver 0.9.8).
pub const DEFAULT_RUNTIME_ALLOWLIST: &[&str] = &["2.3.2"];

/// Contexts per graph by default: the RK3588 has three NPU cores, and one 512-token run of the
/// Laya graph takes about as long on three cores as on one (the model card: attention stays on
/// core 0), so three single-core contexts run three questions in about the time of one.
pub const DEFAULT_CONTEXTS: usize = 3;

/// The core mask of each context when there are several: core 0, core 1, core 2.
pub const CONTEXT_CORE_MASKS: [u32; 3] = [abi::CORE_0, abi::CORE_1, abi::CORE_2];

/// How to reach the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RknnConfig {
    /// The librknnrt.so to load: from the bundle/config or `RKNN_LIB` (see [`resolve_library`]).
    /// There is no default: a board may carry several runtimes and only the operator knows which
    /// one this graph needs.
    pub library: PathBuf,
    /// NPU cores for `rknn_set_core_mask` with one context (`contexts` 1); default `0xFFFF`,
    /// all cores (the runtime's default would pick one idle core).
    pub core_mask: u32,
    /// Contexts per graph (1 to 3, default [`DEFAULT_CONTEXTS`]): the first from `rknn_init`,
    /// the others from `rknn_dup_context` (shared weights); with more than one, context `i` is
    /// pinned to core `i` alone ([`CONTEXT_CORE_MASKS`]) and a call's rows are spread over them.
    pub contexts: usize,
    /// Runtime releases (`2.3.2`) this bundle's graphs may run on; any other is refused. Empty
    /// means [`DEFAULT_RUNTIME_ALLOWLIST`] (not "any"): a bundle manifest without an allowlist
    /// still gets the model card's constraint.
    pub runtime_allowlist: Vec<String>,
}

impl RknnConfig {
    /// The given library with the default core mask and allowlist.
    pub fn new(library: impl Into<PathBuf>) -> RknnConfig {
        RknnConfig {
            library: library.into(),
            core_mask: abi::CORE_ALL,
            contexts: DEFAULT_CONTEXTS,
            runtime_allowlist: DEFAULT_RUNTIME_ALLOWLIST.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// The configured library, else `RKNN_LIB`, with the defaults; an error if neither is set.
    pub fn from_config_or_env(configured: Option<&Path>) -> Result<RknnConfig, RknnError> {
        Ok(RknnConfig::new(resolve_library(configured)?))
    }
}

/// One compiled graph of the bundle and the shape it was compiled for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RknnGraph {
    /// The `.rknn` file.
    pub file: PathBuf,
    /// Compiled sequence length `L` of `input_ids`/`attention_mask`.
    pub seq_len: usize,
    /// Compiled marker slots of `marker_pos`/`marker_mask` and `logits` (64 for Laya).
    pub marker_slots: usize,
}

/// Why the RKNN backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RknnError {
    #[error(
        "no RKNN runtime library given: set the bundle's rknn library path or RKNN_LIB to the librknnrt.so this graph needs (laya-edge never searches for one)"
    )]
    NoLibrary,
    #[error("the RKNN runtime library {0} does not exist")]
    LibraryNotFound(PathBuf),
    #[error("cannot load the RKNN runtime library {path}: {source}")]
    Load { path: PathBuf, source: libloading::Error },
    #[error("{path} is not an RKNN runtime: it has no {symbol} ({source})")]
    Symbol { path: PathBuf, symbol: &'static str, source: libloading::Error },
    #[error("the bundle lists no RKNN graph")]
    NoGraphs,
    #[error("RKNN graph {file}: {message}")]
    BadGraphSpec { file: PathBuf, message: String },
    #[error("cannot read the RKNN graph {path}: {source}")]
    ReadGraph { path: PathBuf, source: std::io::Error },
    #[error("RKNN graph {graph}: {call} failed with {status}")]
    Call { graph: PathBuf, call: &'static str, status: Status },
    #[error(
        "refusing RKNN runtime {api:?} (NPU driver {driver:?}): this bundle's graphs are only allowed on runtime {allowed:?}. librknnrt 2.4.2 loads the Laya RK3588 graph and then returns a constant vector on NPU driver 0.9.8; point the bundle's rknn library or RKNN_LIB at the librknnrt.so of an allowed release, loaded from its own file (do not replace the system library)"
    )]
    RuntimeRefused { api: String, driver: String, allowed: Vec<String> },
    #[error(
        "the RKNN runtime has no rknn_dup_context, which rknn.contexts > 1 needs: set rknn.contexts = 1 (one context per graph)"
    )]
    NoDupContext,
    #[error("rknn.contexts is {0}: use 1, 2 or 3 (one context per NPU core of the RK3588)")]
    BadContexts(usize),
    #[error("RKNN graph {path} does not match the bundle: {message}")]
    Graph { path: PathBuf, message: String },
}

impl RknnError {
    /// The runtime's error code, where a runtime call failed.
    pub fn status(&self) -> Option<Status> {
        match self {
            RknnError::Call { status, .. } => Some(*status),
            _ => None,
        }
    }
}
