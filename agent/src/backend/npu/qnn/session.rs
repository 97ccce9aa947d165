//! One context created from one context binary, its graph, and execution with tensors bound by
//! name.
//!
//! A context is created once, at load, and kept for the life of the process: creating and freeing
//! an HTP context per inference exhausts the DSP's resources on a QCS6490.

use std::ffi::CString;
use std::time::Duration;

use super::QnnError;
use super::abi::{self, CoreFunctions, Handle};
use super::binary::{BinaryMeta, TensorMeta};
use super::runtime::Runtime;
use super::status::Status;

/// The logical tensors of the Laya encoder graph.
pub const INPUTS: [&str; 3] = ["inputs_embeds", "gmask", "smask"];
pub const OUTPUT: &str = "hidden";

/// A tensor of the graph with what execution needs: its description and owned copies of the
/// name and dims the `Qnn_Tensor_t` points at.
struct Bound {
    meta: TensorMeta,
    name: CString,
    dims: Vec<u32>,
}

impl Bound {
    fn new(meta: &TensorMeta) -> Bound {
        Bound {
            name: CString::new(meta.name.as_str()).unwrap_or_default(),
            dims: meta.dims.clone(),
            meta: meta.clone(),
        }
    }

    /// The `Qnn_Tensor_t` for one execution with `data` as its client buffer.
    fn tensor(&mut self, data: *mut u8, size: usize) -> abi::Tensor {
        let m = &self.meta;
        let mut v = abi::TensorV2::zeroed();
        v.id = m.id;
        v.name = self.name.as_ptr();
        v.tensor_type = m.tensor_type;
        v.data_format = m.data_format;
        v.data_type = m.data_type;
        v.quantize_params = m.quantize_params;
        v.rank = self.dims.len() as u32;
        v.dimensions = self.dims.as_mut_ptr();
        v.mem_type = abi::TENSORMEMTYPE_RAW;
        v.client_buf = abi::ClientBuffer { data: data.cast(), data_size: size as u32 };
        abi::Tensor { version: m.version, v }
    }
}

/// One loaded graph.
pub struct Session {
    core: CoreFunctions,
    context: Handle,
    graph: Handle,
    signal: Handle,
    pub meta: BinaryMeta,
    /// Graph inputs in the binary's order; `order[k]` is the index into [`INPUTS`] it is bound to.
    inputs: Vec<Bound>,
    order: Vec<usize>,
    output: Bound,
}

// SAFETY: the handles are owned by this session and used only through `&mut self`.
unsafe impl Send for Session {}

/// Maps the logical names to compiled names: `names(logical)` gives the compiled name to look for.
fn find<'a>(tensors: &'a [TensorMeta], compiled: &str) -> Option<(usize, &'a TensorMeta)> {
    tensors.iter().enumerate().find(|(_, t)| t.name == compiled)
}

impl Session {
    /// Creates the context from `binary`, retrieves its graph and binds the encoder's tensors by
    /// (mapped) name. `timeout` arms a QnnSignal timeout on every execution where the backend
    /// supports signals.
    pub fn create(
        runtime: &Runtime,
        binary: &[u8],
        meta: BinaryMeta,
        compiled_name: &dyn Fn(&str) -> String,
        timeout: Option<Duration>,
    ) -> Result<Session, QnnError> {
        let mut order = Vec::new();
        for t in &meta.graph.inputs {
            let k = INPUTS
                .iter()
                .position(|l| compiled_name(l) == t.name)
                .ok_or_else(|| QnnError::TensorBinding(format!(
                    "the graph has an input '{}' that is none of {INPUTS:?}: map the names in laya-bundle.json \"tensor_names\"",
                    t.name
                )))?;
            order.push(k);
        }
        for (k, l) in INPUTS.iter().enumerate() {
            if !order.contains(&k) {
                let want = compiled_name(l);
                let have: Vec<&str> = meta.graph.inputs.iter().map(|t| t.name.as_str()).collect();
                return Err(QnnError::TensorBinding(format!(
                    "the graph has no input '{want}' (for {l}); it has {have:?}: map the names in laya-bundle.json \"tensor_names\""
                )));
            }
        }
        let out_name = compiled_name(OUTPUT);
        let (_, out) = find(&meta.graph.outputs, &out_name).ok_or_else(|| {
            let have: Vec<&str> = meta.graph.outputs.iter().map(|t| t.name.as_str()).collect();
            QnnError::TensorBinding(format!("the graph has no output '{out_name}'; it has {have:?}"))
        })?;
        let core = runtime.core;
        let create = core.context_create_from_binary.ok_or(QnnError::MissingFunction("contextCreateFromBinary"))?;
        let retrieve = core.graph_retrieve.ok_or(QnnError::MissingFunction("graphRetrieve"))?;
        core.graph_execute.ok_or(QnnError::MissingFunction("graphExecute"))?;
        let mut context: Handle = std::ptr::null_mut();
        // SAFETY: `binary` is valid for its length during the call (the runtime copies what it
        // keeps); NULL config and profile are documented defaults; `context` is an out-parameter.
        let rc = unsafe {
            create(
                runtime.backend,
                runtime.device,
                std::ptr::null(),
                binary.as_ptr().cast(),
                binary.len() as u64,
                &mut context,
                std::ptr::null_mut(),
            )
        };
        if rc != abi::SUCCESS || context.is_null() {
            let status = Status::from_handle(rc);
            return Err(if status.is_incompatible_binary() {
                QnnError::IncompatibleBinary {
                    status,
                    build_id: meta.build_id.clone(),
                    runtime: runtime.info.build_id.clone(),
                }
            } else {
                QnnError::Call { call: "contextCreateFromBinary", status }
            });
        }
        let mut session = Session {
            core,
            context,
            graph: std::ptr::null_mut(),
            signal: std::ptr::null_mut(),
            inputs: meta.graph.inputs.iter().map(Bound::new).collect(),
            order,
            output: Bound::new(out),
            meta,
        };
        let graph_name = CString::new(session.meta.graph.name.as_str())
            .map_err(|_| QnnError::BinaryLayout("graph name has a NUL".into()))?;
        // SAFETY: `context` is live; `graph_name` is NUL-terminated; `graph` is an out-parameter.
        let rc = unsafe { retrieve(context, graph_name.as_ptr(), &mut session.graph) };
        if rc != abi::SUCCESS || session.graph.is_null() {
            // `session` frees the context on drop.
            return Err(QnnError::Call { call: "graphRetrieve", status: Status::from_handle(rc) });
        }
        if let (Some(t), Some(signal_create)) = (timeout, core.signal_create) {
            let config =
                abi::SignalConfig { option: abi::SIGNAL_CONFIG_OPTION_TIMEOUT, timeout_us: t.as_micros() as u64 };
            let list: [*const abi::SignalConfig; 2] = [&config, std::ptr::null()];
            let mut signal: Handle = std::ptr::null_mut();
            // SAFETY: `list` is a NULL-terminated array of config pointers valid for the call;
            // `signal` is an out-parameter. Unsupported (the simulator): run without a timeout;
            // the worker watchdog still covers hangs.
            let rc = unsafe { signal_create(runtime.backend, list.as_ptr(), &mut signal) };
            if rc == abi::SUCCESS {
                session.signal = signal;
            }
        }
        Ok(session)
    }

    /// The graph's sequence length: `inputs_embeds` is `[1, L, d]`.
    pub fn input(&self, logical: usize) -> &TensorMeta {
        let i = self.order.iter().position(|&k| k == logical).expect("every input is bound");
        &self.inputs[i].meta
    }

    pub fn output(&self) -> &TensorMeta {
        &self.output.meta
    }

    /// Whether a QnnSignal timeout guards each execution.
    pub fn has_timeout(&self) -> bool {
        !self.signal.is_null()
    }

    /// Runs the graph once. `inputs[k]` holds the bytes of logical input `k` ([`INPUTS`] order)
    /// in its encoding; the output's bytes are written to `output`.
    pub fn execute(&mut self, inputs: &mut [Vec<u8>; 3], output: &mut [u8]) -> Result<(), Status> {
        let mut tensors = Vec::with_capacity(self.inputs.len());
        for (b, &k) in self.inputs.iter_mut().zip(&self.order) {
            let buf = &mut inputs[k];
            tensors.push(b.tensor(buf.as_mut_ptr(), buf.len()));
        }
        let mut out = [self.output.tensor(output.as_mut_ptr(), output.len())];
        let execute = self.core.graph_execute.expect("checked at create");
        // SAFETY: every tensor's name, dims and client buffer point into `self` or the caller's
        // buffers, which outlive the call; the buffers have the sizes the graph expects (checked
        // by the caller against the tensor metadata); the graph and signal handles are live.
        let rc = unsafe {
            execute(
                self.graph,
                tensors.as_ptr(),
                tensors.len() as u32,
                out.as_mut_ptr(),
                1,
                std::ptr::null_mut(),
                self.signal,
            )
        };
        if rc == abi::SUCCESS { Ok(()) } else { Err(Status::from_handle(rc)) }
    }
}

impl Drop for Session {
    /// Signal, then context (which owns the graph).
    fn drop(&mut self) {
        if let (Some(free), false) = (self.core.signal_free, self.signal.is_null()) {
            // SAFETY: created by `signalCreate`, not in use (no execution is running), freed once.
            unsafe { free(self.signal) };
        }
        if let Some(free) = self.core.context_free {
            // SAFETY: created by `contextCreateFromBinary`, freed once, before its backend.
            unsafe { free(self.context, std::ptr::null_mut()) };
        }
    }
}
