//! The `laya-edge` command line.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use laya_edge::bundle::HostBundle;
use laya_edge::bus;
use laya_edge::config::Config;
use laya_edge::engine::Backend;
use laya_edge::engine::cpu::CpuBackend;
use laya_edge::engine::process::{Engine, EngineConfig, WorkerSpec};
use laya_edge::engine::supervisor::Policy;
use laya_edge::lines;
use laya_topics::topic::Schema;
use laya_topics::wire::Encoding;

#[derive(Parser)]
#[command(name = "laya-edge", version, about = "Laya typed decisions on edge NPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print each question's token layout for JSON-lines requests read from stdin.
    Layout {
        /// A laya checkpoint directory (rl_agent_config.json, tokenizer/, ...).
        #[arg(long)]
        model: PathBuf,
    },
    /// Answer JSON-lines requests read from stdin, one result line per request.
    Predict {
        /// A laya checkpoint directory.
        #[arg(long)]
        model: PathBuf,
        /// Which backend runs the model.
        #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
        backend: BackendKind,
        /// Threads for the tensor math (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Serve questions over MQTT (the board's service).
    Serve {
        /// The configuration file (TOML); without it every key has its default.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Overrides mqtt.broker.
        #[arg(long)]
        broker: Option<String>,
        /// Overrides mqtt.device.
        #[arg(long)]
        device: Option<String>,
        /// Overrides model.dir.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Overrides engine.backend.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
        /// Start an in-process broker and the bundled demo model, ask the example questions,
        /// print the answers, keep serving.
        #[arg(long)]
        demo: bool,
    },
    /// Check a configuration file and print the effective configuration.
    CheckConfig {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Ask one question request over MQTT and print the reply.
    Ask {
        #[arg(long, default_value = "mqtt://localhost:1883")]
        broker: String,
        /// The device to ask.
        #[arg(long, required_unless_present = "fleet")]
        device: Option<String>,
        /// Ask a fleet (any of its devices) instead.
        #[arg(long)]
        fleet: Option<String>,
        #[arg(long, default_value = laya_topics::topic::DEFAULT_PREFIX)]
        prefix: String,
        /// Send CBOR instead of JSON.
        #[arg(long)]
        cbor: bool,
        #[arg(long, default_value_t = 30)]
        timeout_s: u64,
        /// The request, as JSON.
        request: String,
    },
    /// Host one backend for a supervising agent, speaking frames on stdin/stdout (not for humans).
    #[command(hide = true)]
    Worker {
        #[arg(long, value_enum)]
        backend: BackendKind,
        #[arg(long)]
        model: PathBuf,
        /// Faults to inject (null backend), e.g. `hang@3`.
        #[arg(long)]
        faults: Option<String>,
        #[arg(long)]
        threads: Option<usize>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendKind {
    /// The CPU reference model.
    Cpu,
    /// Deterministic logits from the input, no model (tests and benchmarks).
    Null,
    /// Rockchip RK3588 NPU through librknnrt (needs an NPU bundle and the `rknn` feature).
    Rknn,
    /// Qualcomm HTP through QNN (needs an NPU bundle and the `qnn` feature).
    Qnn,
}

impl BackendKind {
    fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Null => "null",
            BackendKind::Rknn => "rknn",
            BackendKind::Qnn => "qnn",
        }
    }

    fn parse(name: &str) -> Result<BackendKind, String> {
        match name {
            "cpu" => Ok(BackendKind::Cpu),
            "null" => Ok(BackendKind::Null),
            "rknn" => Ok(BackendKind::Rknn),
            "qnn" => Ok(BackendKind::Qnn),
            other => Err(format!("unknown backend {other:?}")),
        }
    }
}

/// Loads the backend a worker (or `predict`) runs.
fn load_backend(kind: BackendKind, model: &Path, faults: Option<&str>) -> Result<Box<dyn Backend>, String> {
    match kind {
        BackendKind::Cpu => {
            let bundle = HostBundle::load(model).map_err(|e| e.to_string())?;
            let ckpt = bundle.checkpoint.clone().ok_or("this bundle has no checkpoint for the CPU backend")?;
            Ok(Box::new(CpuBackend::load(&ckpt, &bundle.config, bundle.tokenizer.pad.id).map_err(|e| e.to_string())?))
        }
        BackendKind::Null => {
            let faults = laya_edge::engine::null::parse_faults(faults.unwrap_or(""))?;
            Ok(Box::new(laya_edge::engine::null::NullBackend::new(faults)?))
        }
        BackendKind::Rknn => load_rknn(model),
        BackendKind::Qnn => load_qnn(model),
    }
}

#[cfg(feature = "rknn")]
fn load_rknn(model: &Path) -> Result<Box<dyn Backend>, String> {
    use laya_edge::npu::rknn::{RknnBackend, RknnConfig, RknnGraph};
    let bundle = HostBundle::load(model).map_err(|e| e.to_string())?;
    let manifest =
        bundle.manifest.as_ref().ok_or("the rknn backend needs an NPU bundle (a directory with laya-bundle.json)")?;
    let graphs: Vec<RknnGraph> = manifest
        .graphs
        .iter()
        .map(|g| RknnGraph { file: g.file.clone(), seq_len: g.seq_len, marker_slots: g.marker_slots })
        .collect();
    // The library comes from the agent's config through RKNN_LIB; never searched for.
    let mut config = RknnConfig::from_config_or_env(None).map_err(|e| e.to_string())?;
    if !manifest.runtime_allowlist.is_empty() {
        config.runtime_allowlist = manifest.runtime_allowlist.clone();
    }
    if let Some(mask) = std::env::var("LAYA_RKNN_CORE_MASK").ok().and_then(|m| m.parse().ok()) {
        config.core_mask = mask;
    }
    let backend = RknnBackend::load(&graphs, &config, bundle.tokenizer.pad.id).map_err(|e| e.to_string())?;
    let v = backend.versions();
    tracing::info!(versions = ?v, "rknn runtime loaded");
    Ok(Box::new(backend))
}

#[cfg(not(feature = "rknn"))]
fn load_rknn(_: &Path) -> Result<Box<dyn Backend>, String> {
    Err("this laya-edge was built without the rknn feature".into())
}

#[cfg(not(feature = "qnn"))]
fn load_qnn(_: &Path) -> Result<Box<dyn Backend>, String> {
    Err("this laya-edge was built without the qnn feature".into())
}

#[cfg(feature = "qnn")]
fn load_qnn(model: &Path) -> Result<Box<dyn Backend>, String> {
    use laya_edge::npu::qnn::{GeneratorConfig, Performance, PowerState, QnnBackend, QnnConfig};
    let bundle = HostBundle::load(model).map_err(|e| e.to_string())?;
    // The [qnn] settings come from the agent's config through the worker's environment.
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let lib = |name: &str| {
        var(name).ok_or_else(|| format!("the qnn backend needs {name} (qnn.backend_lib / qnn.system_lib)"))
    };
    let mut config = QnnConfig::new(lib("LAYA_QNN_BACKEND_LIB")?, lib("LAYA_QNN_SYSTEM_LIB")?);
    // ADSP_LIBRARY_PATH, if configured, is already in this process's environment (worker_spec).
    config.performance = match std::env::var("LAYA_QNN_PERFORMANCE").as_deref() {
        Ok("burst") => Performance::Burst,
        Ok("" | "default") | Err(_) => Performance::Default,
        Ok(other) => return Err(format!("qnn.performance {other:?}: use default or burst")),
    };
    if let Some(program) = var("LAYA_QNN_GENERATOR") {
        let model_lib = var("LAYA_QNN_MODEL_LIB").ok_or("qnn.generator needs qnn.model_lib (libQnnModelDlc.so)")?;
        config.generator = Some(GeneratorConfig {
            program: program.into(),
            backend_lib: config.backend_lib.clone(),
            model_lib: model_lib.into(),
        });
    }
    // systemd's StateDirectory= (the unit's /var/lib/laya-edge) unless configured.
    let systemd_state = var("STATE_DIRECTORY")
        .and_then(|v| v.to_str().and_then(|v| v.split(':').next()).filter(|v| !v.is_empty()).map(PathBuf::from));
    config.state_dir = var("LAYA_QNN_STATE_DIR").map(PathBuf::from).or(systemd_state);
    if let Some(soc) = var("LAYA_QNN_SOC") {
        config.soc = soc.to_string_lossy().into_owned();
    }
    let backend = QnnBackend::load(&bundle, &config).map_err(|e| e.to_string())?;
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

fn set_threads(threads: Option<usize>) -> Result<(), String> {
    if let Some(n) = threads.filter(|n| *n > 0) {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .map_err(|e| format!("cannot set up {n} threads: {e}"))?;
    }
    Ok(())
}

/// Runs `handle` on every non-blank stdin line and prints its answer line.
fn for_each_line(mut handle: impl FnMut(&str) -> String) -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                writeln!(out, "{}", lines::error_line(None, "bad_request", "the line is not valid UTF-8"))?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if line.trim().is_empty() {
            continue;
        }
        writeln!(out, "{}", handle(&line))?;
        out.flush()?;
    }
    Ok(())
}

/// A backend in a supervised worker process, driven synchronously (for `predict`): NPU runtimes
/// are loaded only in workers, never in this process.
struct WorkerBackend {
    runtime: tokio::runtime::Runtime,
    engine: Engine,
    name: &'static str,
}

impl Backend for WorkerBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(
        &mut self,
        rows: &[&laya_edge::prompt::Row],
    ) -> Result<Vec<laya_edge::engine::RowResult>, laya_edge::engine::BackendError> {
        use laya_edge::engine::BackendError;
        use laya_edge::engine::process::EngineError;
        let rows = rows.iter().map(|r| (*r).clone()).collect();
        self.runtime.block_on(self.engine.run(rows, None)).map(|out| out.rows).map_err(|e| match e {
            EngineError::Input(m) => BackendError::Input(m),
            other => BackendError::Fatal { code: None, message: other.to_string() },
        })
    }
}

fn predict(model: &Path, backend: BackendKind, threads: Option<usize>) -> Result<(), String> {
    set_threads(threads)?;
    let bundle = HostBundle::load(model).map_err(|e| e.to_string())?;
    let mut backend: Box<dyn Backend> = if backend == BackendKind::Cpu {
        load_backend(backend, model, None)?
    } else {
        let mut config = Config::default();
        config.engine.threads = threads.unwrap_or(0);
        let runtime = runtime()?;
        let engine = {
            let _guard = runtime.enter();
            Engine::start(EngineConfig {
                policy: policy(&config, false),
                primary: worker_spec(backend.name(), model, &config)?,
                fallback: None,
                health: laya_edge::engine::health::rows(&bundle.tokenizer, bundle.config.limits)?,
                queue: config.limits.queue,
            })
        };
        Box::new(WorkerBackend { runtime, engine, name: backend.name() })
    };
    for_each_line(|line| lines::predict_line(&bundle, backend.as_mut(), line)).map_err(|e| e.to_string())
}

/// The worker command line for a backend.
fn worker_spec(backend: &str, model: &Path, config: &Config) -> Result<WorkerSpec, String> {
    let program = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut args: Vec<OsString> =
        vec!["worker".into(), "--backend".into(), backend.into(), "--model".into(), model.as_os_str().to_owned()];
    if backend == "null" && !config.engine.null_faults.is_empty() {
        args.push("--faults".into());
        args.push(config.engine.null_faults.clone().into());
    }
    if config.engine.threads > 0 {
        args.push("--threads".into());
        args.push(config.engine.threads.to_string().into());
    }
    let mut env = Vec::new();
    if !config.rknn.library.is_empty() {
        env.push(("RKNN_LIB".into(), config.rknn.library.clone().into()));
    }
    env.push(("LAYA_RKNN_CORE_MASK".into(), config.rknn.core_mask.to_string().into()));
    if !config.qnn.backend_lib.is_empty() {
        env.push(("LAYA_QNN_BACKEND_LIB".into(), config.qnn.backend_lib.clone().into()));
    }
    if !config.qnn.system_lib.is_empty() {
        env.push(("LAYA_QNN_SYSTEM_LIB".into(), config.qnn.system_lib.clone().into()));
    }
    if !config.qnn.adsp_library_path.is_empty() {
        env.push(("ADSP_LIBRARY_PATH".into(), config.qnn.adsp_library_path.clone().into()));
    }
    let qnn = [
        ("LAYA_QNN_PERFORMANCE", &config.qnn.performance),
        ("LAYA_QNN_GENERATOR", &config.qnn.generator),
        ("LAYA_QNN_MODEL_LIB", &config.qnn.model_lib),
        ("LAYA_QNN_STATE_DIR", &config.qnn.state_dir),
        ("LAYA_QNN_SOC", &config.qnn.soc),
    ];
    for (var, value) in qnn.into_iter().filter(|(_, v)| !v.is_empty()) {
        env.push((var.into(), value.clone().into()));
    }
    Ok(WorkerSpec { program, args, env })
}

fn policy(config: &Config, has_fallback: bool) -> Policy {
    Policy::from_config(&config.engine, has_fallback)
}

fn load_config(path: Option<&Path>) -> Result<Config, String> {
    match path {
        Some(p) => Config::load(p).map_err(|e| e.to_string()),
        None => Ok(Config::default()),
    }
}

/// The demo model bundled in the repository (a tiny random checkpoint from the fixtures).
fn demo_model() -> PathBuf {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models/bpe-t5");
    if built_in.is_dir() { built_in } else { PathBuf::from("tests/fixtures/laya-0.3.20/models/bpe-t5") }
}

const DEMO_REQUESTS: &str = include_str!("../../config/demo-requests.jsonl");

#[allow(clippy::too_many_arguments)]
async fn serve(
    config_path: Option<PathBuf>,
    broker: Option<String>,
    device: Option<String>,
    model: Option<PathBuf>,
    backend: Option<BackendKind>,
    demo: bool,
) -> Result<(), String> {
    let mut config = load_config(config_path.as_deref())?;
    if demo {
        // It waits (up to 2 s) for the broker to listen: not on the runtime's only thread.
        let port = tokio::task::spawn_blocking(bus::demo::start_broker).await.map_err(|e| e.to_string())??;
        config.mqtt.broker = format!("mqtt://127.0.0.1:{port}");
        config.mqtt.device = "demo".into();
        config.model.dir = demo_model().display().to_string();
        config.engine.backend = "cpu".into();
        println!("demo broker on mqtt://127.0.0.1:{port}, device \"demo\", model {}", config.model.dir);
    }
    if let Some(b) = broker {
        config.mqtt.broker = b;
    }
    if let Some(d) = device {
        config.mqtt.device = d;
    }
    if let Some(m) = model {
        config.model.dir = m.display().to_string();
    }
    if let Some(b) = backend {
        config.engine.backend = b.name().into();
    }
    config.check().map_err(|e| e.to_string())?;
    BackendKind::parse(&config.engine.backend)?;
    let model_dir = PathBuf::from(&config.model.dir);
    let bundle = Arc::new(HostBundle::load(&model_dir).map_err(|e| e.to_string())?);
    let fallback = (config.engine.fallback == "cpu" && config.engine.backend != "cpu" && bundle.checkpoint.is_some())
        .then(|| worker_spec("cpu", &model_dir, &config))
        .transpose()?;
    let engine = Engine::start(EngineConfig {
        policy: policy(&config, fallback.is_some()),
        primary: worker_spec(&config.engine.backend, &model_dir, &config)?,
        fallback,
        health: laya_edge::engine::health::rows(&bundle.tokenizer, bundle.config.limits)?,
        queue: config.limits.queue,
    });
    if demo {
        let target = bus::ask::Target {
            schema: Schema::new(&config.mqtt.prefix).map_err(|e| e.to_string())?,
            device: Some("demo".into()),
            fleet: None,
        };
        let broker = config.mqtt.broker.clone();
        tokio::spawn(async move {
            // Ask only once the agent is subscribed: on a fresh broker an early question has no
            // listener yet.
            if let Ok((host, port, _)) = bus::connection::parse_broker(&broker) {
                let options = rumqttc::v5::MqttOptions::new("demo-watch", host, port);
                if let Err(e) = bus::ask::wait_online(options, &target.schema, "demo", Duration::from_secs(120)).await {
                    tracing::error!(error = %e, "demo: the agent did not come online");
                    return;
                }
            }
            for (i, line) in DEMO_REQUESTS.lines().filter(|l| !l.trim().is_empty()).enumerate() {
                let Ok(request) = laya_topics::json::parse_str(line, Default::default()) else { continue };
                let Ok((host, port, _)) = bus::connection::parse_broker(&broker) else { return };
                let options = rumqttc::v5::MqttOptions::new(format!("demo-asker-{i}"), host, port);
                match bus::ask::ask(options, &target, &request, Encoding::Json, Duration::from_secs(120)).await {
                    Ok(reply) => println!("{}", laya_topics::json::to_string(&reply, laya_topics::json::Style::PYTHON)),
                    Err(e) => tracing::error!(question = i, error = %e, "demo question failed"),
                }
            }
            println!("demo: answered the example questions; still serving (Ctrl-C to stop)");
        });
    }
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    bus::server::run(config, engine, bundle, shutdown).await.map_err(|e| e.to_string())
}

async fn ask_command(
    broker: &str,
    device: Option<String>,
    fleet: Option<String>,
    prefix: &str,
    cbor: bool,
    timeout_s: u64,
    request: &str,
) -> Result<(), String> {
    let request = laya_topics::json::parse_str(request, Default::default())
        .map_err(|e| format!("the request is not JSON: {e}"))?;
    let (host, port, tls) = bus::connection::parse_broker(broker).map_err(|e| e.to_string())?;
    if tls {
        return Err("ask supports mqtt:// only".into());
    }
    let options = rumqttc::v5::MqttOptions::new(format!("laya-ask-{}", std::process::id()), host, port);
    let target = bus::ask::Target { schema: Schema::new(prefix).map_err(|e| e.to_string())?, device, fleet };
    let encoding = if cbor { Encoding::Cbor } else { Encoding::Json };
    let reply = bus::ask::ask(options, &target, &request, encoding, Duration::from_secs(timeout_s))
        .await
        .map_err(|e| e.to_string())?;
    println!("{}", laya_topics::json::to_string(&reply, laya_topics::json::Style::COMPACT));
    Ok(())
}

/// The service's runtime: one thread. Its work is I/O and short host steps (the model runs in the
/// worker process, large requests are tokenized in the blocking pool), and on two cores every
/// hand-over between runtime threads cost ~20 µs of a question's ~0.2 ms (BENCHMARKS.md).
fn serve_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    laya_edge::logging::init(None);
    let result = match cli.command {
        Command::Layout { model } => match HostBundle::load(&model) {
            Ok(bundle) => for_each_line(|line| lines::layout_line(&bundle, line)).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        Command::Predict { model, backend, threads } => predict(&model, backend, threads),
        Command::Serve { config, broker, device, model, backend, demo } => {
            serve_runtime().and_then(|rt| rt.block_on(serve(config, broker, device, model, backend, demo)))
        }
        Command::CheckConfig { config } => load_config(config.as_deref()).map(|c| {
            println!("{c:#?}");
            println!("device: {}\nclient id: {}", c.device(), c.client_id());
        }),
        Command::Ask { broker, device, fleet, prefix, cbor, timeout_s, request } => runtime()
            .and_then(|rt| rt.block_on(ask_command(&broker, device, fleet, &prefix, cbor, timeout_s, &request))),
        Command::Worker { backend, model, faults, threads } => set_threads(threads).and_then(|()| {
            laya_edge::engine::worker::serve(
                || load_backend(backend, &model, faults.as_deref()),
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )
            .map_err(|e| e.to_string())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
