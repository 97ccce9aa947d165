//! Backends from a [`Config`], in one place.
//!
//! `serve`, `predict` and the worker all turn the effective configuration into a backend here:
//! the CPU backend loaded in process (`predict --backend cpu`) and any backend loaded in the
//! worker process (NPU runtimes are only ever loaded there). How the worker is started and
//! supervised (its command line, the policy) is the engine's (`engine::spec`,
//! `engine::EngineConfig::from_config`).

use std::path::{Path, PathBuf};

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, LoadError};
use crate::bundle::HostBundle;
use crate::config::{BackendKind, Config, ConfigError, Fallback};

/// Why the engine could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot find this program to start its worker: {0}")]
    Program(std::io::Error),
    #[error("cannot lay out the health call's rows: {0}")]
    Health(String),
    #[error("the bundle's probe: {0}")]
    Probe(String),
    #[error(transparent)]
    Model(#[from] crate::backend::cpu::ModelError),
    #[error("[cpu] weights: the {mode} mode is refused: {message}")]
    Fidelity { mode: &'static str, message: String },
}

/// Checks, in this process and without loading it, the checkpoint a worker of `config` will load
/// (`backend::cpu::CpuModel::check`: the encoder config and `model.safetensors`'s header against the
/// file and the architecture): the CPU backend's, the CPU fallback's, and the QNN backend's host
/// stages (embeddings, head). A model that cannot load is refused at start rather than by
/// every restarted worker. A bundle's checkpoint that no backend reads here is checked too when
/// its weights are there (`laya-edge check` checks the rest). (A CPU worker in a quantised mode
/// is judged by the probe too, by `engine::fidelity`, which loads the model.)
pub fn check_model(config: &Config, bundle: &HostBundle) -> Result<(), SetupError> {
    let kind = config.engine.backend;
    let reads_checkpoint =
        matches!(kind, BackendKind::Cpu | BackendKind::Qnn) || config.engine.fallback == Fallback::Cpu;
    match &bundle.checkpoint {
        Some(ckpt) if reads_checkpoint || ckpt.join("model.safetensors").exists() => {
            crate::backend::cpu::CpuModel::check(ckpt, &bundle.config)?
        }
        _ => {}
    }
    Ok(())
}

/// This program, which is also the worker's.
pub fn this_program() -> Result<PathBuf, SetupError> {
    std::env::current_exe().map_err(SetupError::Program)
}

/// Sets the tensor-math threads (`engine.threads`; 0: all cores), once per process.
pub fn set_threads(threads: usize) -> Result<(), String> {
    if threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .map_err(|e| format!("cannot set up {threads} threads: {e}"))?;
    }
    Ok(())
}

/// Loads `kind` in this process on `config`'s model directory: the CPU backend for `predict`,
/// any backend in the worker. A vendor runtime the bundle does not allow is a
/// [`LoadFailure::RuntimeRejected`](crate::backend::LoadFailure), any other failure `Other`.
pub fn load(kind: BackendKind, config: &Config) -> Result<Box<dyn Backend>, LoadError> {
    let model = Path::new(&config.model.dir);
    match kind {
        BackendKind::Cpu => {
            let bundle = HostBundle::load_as(model, config.model.laya).map_err(|e| e.to_string())?;
            let ckpt = bundle.checkpoint.clone().ok_or("this bundle has no checkpoint for the CPU backend")?;
            Ok(Box::new(CpuBackend::load_with(&ckpt, &bundle.config, config.cpu.weights).map_err(|e| e.to_string())?))
        }
        BackendKind::Null => {
            let faults = crate::backend::null::parse_faults(&config.engine.null_faults)?;
            Ok(Box::new(crate::backend::null::NullBackend::new(faults)?))
        }
        BackendKind::Rknn => load_rknn(model, config),
        BackendKind::Qnn => load_qnn(model, config),
    }
}

#[cfg(feature = "rknn")]
fn load_rknn(model: &Path, config: &Config) -> Result<Box<dyn Backend>, LoadError> {
    use crate::backend::npu::rknn::{RknnBackend, RknnConfig, RknnGraph};
    let bundle = HostBundle::load_as(model, config.model.laya).map_err(|e| e.to_string())?;
    let manifest =
        bundle.manifest.as_ref().ok_or("the rknn backend needs an NPU bundle (a directory with laya-bundle.json)")?;
    let graphs: Vec<RknnGraph> = manifest
        .graphs
        .iter()
        .map(|g| RknnGraph { file: g.file.clone(), seq_len: g.seq_len, marker_slots: g.marker_slots })
        .collect();
    // rknn.library, else RKNN_LIB; never searched for.
    let configured = config.rknn.library.as_deref();
    let mut rknn = RknnConfig::from_config_or_env(configured).map_err(|e| e.to_string())?;
    if !manifest.runtime_allowlist.is_empty() {
        rknn.runtime_allowlist = manifest.runtime_allowlist.clone();
    }
    rknn.core_mask = config.rknn.core_mask;
    rknn.contexts = config.rknn.contexts;
    let backend = RknnBackend::load(&graphs, &rknn, bundle.tokenizer.pad.id).map_err(|e| match e {
        crate::backend::npu::rknn::RknnError::RuntimeRefused { .. } => LoadError::runtime_rejected(e.to_string()),
        e => LoadError::other(e.to_string()),
    })?;
    let v = backend.versions();
    tracing::info!(versions = ?v, "rknn runtime loaded");
    Ok(Box::new(backend))
}

#[cfg(not(feature = "rknn"))]
fn load_rknn(_: &Path, _: &Config) -> Result<Box<dyn Backend>, LoadError> {
    Err("this laya-edge was built without the rknn feature".into())
}

#[cfg(not(feature = "qnn"))]
fn load_qnn(_: &Path, _: &Config) -> Result<Box<dyn Backend>, LoadError> {
    Err("this laya-edge was built without the qnn feature".into())
}

#[cfg(feature = "qnn")]
fn load_qnn(model: &Path, config: &Config) -> Result<Box<dyn Backend>, LoadError> {
    use crate::backend::npu::qnn::{GeneratorConfig, Performance, PowerState, QnnBackend, QnnConfig};
    let bundle = HostBundle::load_as(model, config.model.laya).map_err(|e| e.to_string())?;
    let q = &config.qnn;
    let (Some(backend_lib), Some(system_lib)) = (&q.backend_lib, &q.system_lib) else {
        return Err("the qnn backend needs qnn.backend_lib (libQnnHtp.so) and qnn.system_lib (libQnnSystem.so)".into());
    };
    let mut qnn = QnnConfig::new(backend_lib, system_lib);
    // The agent also puts it into the worker's environment (worker_spec), so this sets nothing.
    qnn.adsp_library_path = Some(q.adsp_library_path.clone()).filter(|p| !p.is_empty());
    qnn.performance = match q.performance {
        crate::config::Performance::Burst => Performance::Burst,
        crate::config::Performance::Default => Performance::Default,
    };
    if let Some(generator) = &q.generator {
        let Some(model_lib) = &q.model_lib else {
            return Err("qnn.generator needs qnn.model_lib (libQnnModelDlc.so)".into());
        };
        qnn.generator = Some(GeneratorConfig {
            program: generator.clone(),
            backend_lib: qnn.backend_lib.clone(),
            model_lib: model_lib.clone(),
        });
    }
    // systemd's StateDirectory= (the unit's /var/lib/laya-edge) unless configured.
    let systemd_state = std::env::var("STATE_DIRECTORY")
        .ok()
        .and_then(|v| v.split(':').next().filter(|v| !v.is_empty()).map(PathBuf::from));
    qnn.state_dir = q.state_dir.clone().or(systemd_state);
    if !q.soc.is_empty() {
        qnn.soc = q.soc.clone();
    }
    let backend = QnnBackend::load(&bundle, &qnn).map_err(|e| match e {
        crate::backend::npu::qnn::QnnError::RuntimeNotAllowed { .. } => LoadError::runtime_rejected(e.to_string()),
        e => LoadError::other(e.to_string()),
    })?;
    let info = backend.runtime_info();
    tracing::info!(
        build_id = %info.build_id,
        provider = %info.provider,
        device_object = if info.device { "yes" } else { "no (default device)" },
        execute_timeout = if backend.has_execute_timeout() { "yes" } else { "not supported (the watchdog's deadline)" },
        power = ?info.power,
        "QNN runtime loaded"
    );
    if let PowerState::Unsupported(why) = &info.power {
        tracing::warn!(%why, "the burst vote was not applied; running at default clocks");
    }
    Ok(Box::new(backend))
}
