//! [`QnnBackend`]: the [`Backend`] over an NPU bundle's graphs. Per row: choose a graph, gather
//! embeddings and build masks on the host, encode each input in its encoding, execute, decode
//! `hidden`, and run the CPU reference head on the row's positions.
//!
//! A call of several rows is pipelined over two threads: this thread prepares the inputs and
//! runs `graphExecute` row after row, a second thread runs the head on each row's hidden states
//! as they arrive (a bounded queue of one row between them), so the head of row i runs while
//! the NPU encodes row i+1 and a call takes about max(NPU, head) per row, not their sum. The
//! contexts never leave this thread; only hidden-state tensors cross. A hung `graphExecute`
//! blocks the call as before, which the supervisor's deadline catches.

use std::sync::mpsc;

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use laya_topics::Value;

use crate::backend::cpu::{CpuModel, ModelError};
use crate::backend::{Backend, BackendError, RowResult};
use crate::bundle::HostBundle;
use crate::prompt::Row;

use super::binary::{self, Encoding};
use super::generator;
use super::host::{self, HostFault};
use super::runtime::{Runtime, RuntimeInfo};
use super::session::{INPUTS, OUTPUT, Session};
use super::{QnnConfig, QnnError};

/// The Laya encoder on the HTP, head on the host.
pub struct QnnBackend {
    // Field order is drop order: sessions (contexts) before the runtime (device, backend, log).
    /// One per graph of the manifest, in its order.
    sessions: Vec<Session>,
    /// Each graph's sequence length and whether the calibration guard lets it run rows (as
    /// `sessions`), for choosing one per row.
    shapes: Vec<(usize, bool)>,
    runtime: Runtime,
    model: CpuModel,
    pad_id: u32,
    fault: HostFault,
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// The manifest's I/O flavour of a graph: `float` or `ufixed16`.
fn io_matches(io: &str, e: Encoding) -> bool {
    match io {
        "float" => matches!(e, Encoding::Float32 | Encoding::Float16),
        "ufixed16" => matches!(e, Encoding::Ufixed16 { .. }),
        _ => false,
    }
}

impl QnnBackend {
    /// Loads the NPU bundle's checkpoint (embeddings, head, encoder config) on the CPU and every
    /// graph's context binary on the HTP, keeping one context per graph for the process's life.
    pub fn load(bundle: &HostBundle, config: &QnnConfig) -> Result<QnnBackend, QnnError> {
        let manifest = bundle.manifest.as_ref().ok_or(QnnError::NotAnNpuBundle(bundle.dir.clone()))?;
        if manifest.backend != "qnn" {
            return Err(QnnError::WrongBackend(manifest.backend.clone()));
        }
        let ckpt = bundle.checkpoint.as_ref().ok_or(QnnError::NoCheckpoint)?;
        let model = CpuModel::load(ckpt, &bundle.config).map_err(QnnError::Model)?;
        if manifest.graphs.is_empty() {
            return Err(QnnError::NoGraphs);
        }
        let raw = &manifest.raw;
        let runtime = Runtime::load(config)?;
        if !manifest.runtime_allowlist.is_empty()
            && !manifest.runtime_allowlist.iter().any(|v| runtime.info.build_id.contains(v.as_str()))
        {
            return Err(QnnError::RuntimeNotAllowed {
                build_id: runtime.info.build_id.clone(),
                allowed: manifest.runtime_allowlist.clone(),
            });
        }
        let mut sessions = Vec::new();
        let mut shapes = Vec::new();
        for spec in &manifest.graphs {
            let file = resolve_binary(&spec.file, &spec.raw, &bundle.dir, config, &runtime.info)?;
            let bytes = std::fs::read(&file).map_err(|source| QnnError::Read { path: file.clone(), source })?;
            let meta = binary::read(&runtime.system, &bytes).map_err(|e| e.in_file(&file))?;
            let names = spec.raw.get("tensor_names").or_else(|| raw.get("tensor_names")).cloned();
            let compiled = move |logical: &str| -> String {
                names.as_ref().and_then(|n| n.get(logical)).and_then(Value::as_str).unwrap_or(logical).to_owned()
            };
            let session = Session::create(&runtime, &bytes, meta, &compiled, config.execute_timeout)
                .map_err(|e| e.in_file(&file))?;
            check_shapes(&session, spec.seq_len, model.encoder.config.hidden_size, &file)?;
            if let Some(io) = str_field(&spec.raw, "io") {
                for k in 0..INPUTS.len() {
                    let t = session.input(k);
                    if !io_matches(io, t.encoding) {
                        return Err(QnnError::Manifest(format!(
                            "{}: the manifest says io \"{io}\" but input '{}' is {:?}",
                            file.display(),
                            t.name,
                            t.encoding
                        )));
                    }
                }
            }
            shapes.push((spec.seq_len, manifest.usable(spec)));
            sessions.push(session);
        }
        Ok(QnnBackend { sessions, shapes, runtime, model, pad_id: bundle.tokenizer.pad.id, fault: HostFault::None })
    }

    /// The runtime's provider, versions and build id.
    pub fn runtime_info(&self) -> &RuntimeInfo {
        &self.runtime.info
    }

    /// What each graph's context binary says about itself (read through libQnnSystem).
    pub fn binary_meta(&self) -> Vec<&binary::BinaryMeta> {
        self.sessions.iter().map(|s| &s.meta).collect()
    }

    /// Whether executions are guarded by a QnnSignal timeout (not on the x86-64 simulator).
    pub fn has_execute_timeout(&self) -> bool {
        self.sessions.iter().all(Session::has_timeout)
    }

    /// Test-only: break a host step on purpose, to prove the comparisons against the CPU
    /// backend would catch it.
    #[doc(hidden)]
    pub fn set_host_fault(&mut self, fault: HostFault) {
        self.fault = fault;
    }

    /// The graph a row of `len` tokens runs on.
    pub fn graph_for(&self, len: usize) -> Option<usize> {
        self.choose(len).map(|i| self.shapes[i].0)
    }

    /// The index of the graph a row of `len` tokens runs on.
    fn choose(&self, len: usize) -> Option<usize> {
        host::choose_graph(&self.shapes, len)
    }

    /// [`QnnBackend::encode`] as a flat `len * d` vector (row-major), for diagnostics and tests.
    pub fn hidden_states(&mut self, ids: &[u32]) -> Result<Vec<f32>, BackendError> {
        let h = self.encode(ids)?;
        h.flatten_all()
            .and_then(|t| t.to_vec1())
            .map_err(|e| BackendError::Fatal { code: None, message: format!("host step: {e}") })
    }

    /// Runs the encoder graph on `ids` (already checked) and returns `[1, len, d]` hidden states.
    pub fn encode(&mut self, ids: &[u32]) -> Result<Tensor, BackendError> {
        self.stages().0.encode(ids)
    }

    /// The NPU side of the backend and the host head, borrowed apart (the pipeline runs them
    /// on two threads).
    fn stages(&mut self) -> (EncoderStage<'_>, &crate::backend::cpu::head::Head) {
        let stage = EncoderStage {
            sessions: &mut self.sessions,
            shapes: &self.shapes,
            runtime: &self.runtime,
            encoder: &self.model.encoder,
            pad_id: self.pad_id,
            fault: self.fault,
        };
        (stage, &self.model.head)
    }
}

/// What encoding a row needs: the contexts (this thread only), the runtime, the embeddings.
struct EncoderStage<'a> {
    sessions: &'a mut [Session],
    shapes: &'a [(usize, bool)],
    runtime: &'a Runtime,
    encoder: &'a crate::backend::cpu::Encoder,
    pad_id: u32,
    fault: HostFault,
}

impl EncoderStage<'_> {
    fn encode(&mut self, ids: &[u32]) -> Result<Tensor, BackendError> {
        let len = ids.len();
        let gi = host::choose_graph(self.shapes, len).ok_or_else(|| {
            BackendError::Input(format!(
                "a row of {len} tokens fits no graph of this bundle (lengths {:?}; min-max graphs without a mask clip stop at {})",
                self.shapes.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
                host::MINMAX_MAX_TOKENS
            ))
        })?;
        let d = self.encoder.config.hidden_size;
        let l = self.shapes[gi].0;
        let s = &mut self.sessions[gi];
        let encodings = [s.input(0).encoding, s.input(1).encoding, s.input(2).encoding];
        let mut inputs =
            host::prepare_inputs(self.encoder, ids, self.pad_id, l, encodings, self.fault).map_err(model_fatal)?;
        let out_meta = s.output().clone();
        let mut out = vec![0u8; out_meta.elements() * out_meta.encoding.bytes_per_element()];
        if let Err(st) = s.execute(&mut inputs, &mut out) {
            let detail = self.runtime.error_message(st.0).map(|m| format!(" [{m}]")).unwrap_or_default();
            return Err(st.backend_error(&format!("graphExecute (L={l}){detail}")));
        }
        host::read_output(&out, out_meta.encoding, l, d, len).map_err(model_fatal)
    }
}

/// The head on one row's hidden states.
fn head_row(head: &crate::backend::cpu::Head, hidden: &Tensor, row: &Row) -> Result<RowResult, BackendError> {
    let len = row.input_ids.len();
    let out =
        head.forward(hidden, &[len], &[row.qtype.index() as u32], &[row.marker_pos.as_slice()]).map_err(model_fatal)?;
    let h = out
        .into_iter()
        .next()
        .ok_or_else(|| BackendError::Fatal { code: None, message: "the head returned no row".into() })?;
    Ok(RowResult { logits: h.logits, act_logits: h.act_logits })
}

fn model_fatal(e: ModelError) -> BackendError {
    BackendError::Fatal { code: None, message: format!("host step: {e}") }
}

/// The graph's tensors must be the encoder's: `inputs_embeds [1, L, d]`, masks `[1, 1, L, L]`,
/// `hidden [1, L, d]`.
fn check_shapes(s: &Session, l: usize, d: usize, file: &Path) -> Result<(), QnnError> {
    let (l, d) = (l as u32, d as u32);
    let want: [(&str, &[u32], Vec<u32>); 4] = [
        (INPUTS[0], &s.input(0).dims, vec![1, l, d]),
        (INPUTS[1], &s.input(1).dims, vec![1, 1, l, l]),
        (INPUTS[2], &s.input(2).dims, vec![1, 1, l, l]),
        (OUTPUT, &s.output().dims, vec![1, l, d]),
    ];
    for (name, have, want) in want {
        if have != want.as_slice() {
            return Err(QnnError::Manifest(format!(
                "{}: tensor {name} has dims {have:?}, expected {want:?} (seq_len {l} in the manifest, hidden size {d} in the checkpoint)",
                file.display()
            )));
        }
    }
    Ok(())
}

/// The context binary of a manifest graph: its `file` if present, else a binary generated from
/// its `dlc` (once, cached in the state directory).
fn resolve_binary(
    file: &Path,
    raw: &Value,
    dir: &Path,
    config: &QnnConfig,
    info: &RuntimeInfo,
) -> Result<PathBuf, QnnError> {
    if file.is_file() {
        return Ok(file.to_owned());
    }
    let Some(dlc) = str_field(raw, "dlc") else {
        return Err(QnnError::Read {
            path: file.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    };
    let (Some(gen_cfg), Some(state)) = (&config.generator, &config.state_dir) else {
        return Err(QnnError::Generator(format!(
            "{} is missing and only the DLC {dlc} is present: configure qnn-context-binary-generator and a state directory",
            file.display()
        )));
    };
    generator::ensure_context_binary(gen_cfg, state, &info.build_id, &config.soc, &dir.join(dlc))
}

impl Backend for QnnBackend {
    fn name(&self) -> &'static str {
        "qnn"
    }

    fn runtime_version(&self) -> String {
        self.runtime_info().build_id.clone()
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        let vocab = self.model.encoder.config.vocab_size;
        for (r, row) in rows.iter().enumerate() {
            crate::backend::cpu::check_row(r, row, Some(vocab))
                .and_then(|()| crate::backend::cpu::refuse_layout(r, row, "qnn"))
                .map_err(|e| BackendError::Input(e.to_string()))?;
        }
        if rows.len() == 1 {
            let hidden = self.encode(&rows[0].input_ids)?;
            return Ok(vec![head_row(&self.model.head, &hidden, rows[0])?]);
        }
        // Two stages: encode here, the head on a second thread, one row queued between them.
        let (mut stage, head) = self.stages();
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::sync_channel::<(usize, Tensor)>(1);
            let heads = scope.spawn(move || -> Result<Vec<RowResult>, BackendError> {
                let mut out = Vec::with_capacity(rows.len());
                for (r, hidden) in rx {
                    out.push(head_row(head, &hidden, rows[r])?);
                }
                Ok(out)
            });
            let mut failed = None;
            for (r, row) in rows.iter().enumerate() {
                match stage.encode(&row.input_ids) {
                    // A closed queue means the head failed: its error is the call's.
                    Ok(hidden) => {
                        if tx.send((r, hidden)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            drop(tx);
            let heads = heads.join().unwrap_or_else(|_| {
                Err(BackendError::Fatal { code: None, message: "the head thread panicked".into() })
            });
            // The NPU's error first: it is what the supervisor acts on.
            match failed {
                Some(e) => Err(e),
                None => heads,
            }
        })
    }
}
