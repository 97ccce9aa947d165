//! One loaded graph: an RKNN context, checked against the bundle, running one row per call.
//! Further contexts of the same graph come from `rknn_dup_context` (shared weights).
//!
//! Setup follows the documented call order: `rknn_init` from the graph file's bytes,
//! `rknn_query` for the versions and the input/output attributes, `rknn_set_core_mask`. A run is
//! `rknn_inputs_set` (five int64 tensors, pass-through off so the runtime converts them) ->
//! `rknn_run` -> `rknn_outputs_get` (float, into our preallocated buffer) ->
//! `rknn_outputs_release`. The context is destroyed when the session drops.

use core::ffi::c_void;
use std::path::Path;

use super::abi::{self, RknnContext};
use super::inputs::Padded;
use super::runtime::{Runtime, RuntimeVersions};
use super::status::Status;
use super::{RknnError, RknnGraph};
use crate::backend::BackendError;
use crate::prompt::Row;

/// The graph's inputs, in the order the bundle's spec lists them.
pub(crate) const INPUT_NAMES: [&str; 5] = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"];
/// The graph's one output.
pub(crate) const OUTPUT_NAME: &str = "logits";

/// Where the runtime has each input, and how it wants it described.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    index: u32,
    fmt: u32,
}

pub(crate) struct Session {
    rt: Runtime,
    ctx: RknnContext,
    pub graph: RknnGraph,
    /// Indexed like [`INPUT_NAMES`].
    inputs: [Slot; 5],
    output_index: u32,
    padded: Padded,
    /// The `logits` output, written by the runtime (`is_prealloc`).
    logits: Vec<f32>,
}

impl Session {
    /// `rknn_init` from the graph file's bytes.
    pub fn init(rt: Runtime, graph: &RknnGraph) -> Result<Session, RknnError> {
        let mut bytes =
            std::fs::read(&graph.file).map_err(|source| RknnError::ReadGraph { path: graph.file.clone(), source })?;
        let size = u32::try_from(bytes.len()).map_err(|_| RknnError::BadGraphSpec {
            file: graph.file.clone(),
            message: format!("{} bytes is more than the runtime can load (4 GiB)", bytes.len()),
        })?;
        if size == 0 {
            return Err(RknnError::BadGraphSpec { file: graph.file.clone(), message: "the file is empty".into() });
        }
        let mut ctx: RknnContext = 0;
        // SAFETY: `ctx` is a valid place for the handle; `bytes` is a live buffer of exactly
        // `size` bytes (non-zero size: the runtime reads it as model data, not as a path) that
        // outlives the call; the extension pointer may be null. The runtime copies what it keeps.
        let code = unsafe { (rt.init)(&mut ctx, bytes.as_mut_ptr().cast::<c_void>(), size, 0, std::ptr::null_mut()) };
        Status::check(code).map_err(|status| call_error(&graph.file, "rknn_init", status))?;
        Ok(Session {
            rt,
            ctx,
            graph: graph.clone(),
            inputs: [Slot::default(); 5],
            output_index: 0,
            padded: Padded::new(graph.seq_len, graph.marker_slots),
            logits: vec![0.0; graph.marker_slots],
        })
    }

    /// `rknn_dup_context`: another context of this graph sharing its weights in the runtime,
    /// with its own inputs, outputs and core mask (to be set with [`Session::configure`]).
    pub fn dup(&mut self) -> Result<Session, RknnError> {
        let dup = self.rt.dup_context.ok_or(RknnError::NoDupContext)?;
        let mut out: RknnContext = 0;
        // SAFETY: both pointers are valid places for a handle; `self.ctx` is a live context from
        // rknn_init; the runtime writes the new handle to `out`.
        let code = unsafe { dup(&mut self.ctx, &mut out) };
        Status::check(code).map_err(|status| call_error(&self.graph.file, "rknn_dup_context", status))?;
        Ok(Session {
            rt: self.rt,
            ctx: out,
            graph: self.graph.clone(),
            inputs: [Slot::default(); 5],
            output_index: 0,
            padded: Padded::new(self.graph.seq_len, self.graph.marker_slots),
            logits: vec![0.0; self.graph.marker_slots],
        })
    }

    /// The runtime and driver versions (`RKNN_QUERY_SDK_VERSION`).
    pub fn versions(&self) -> Result<RuntimeVersions, RknnError> {
        let mut v = abi::SdkVersion::zeroed();
        self.query(abi::QUERY_SDK_VERSION, &mut v, "rknn_query(SDK_VERSION)")?;
        Ok(RuntimeVersions { api: v.api(), driver: v.driver() })
    }

    /// Checks the graph's inputs and output against the bundle's spec, then sets the core mask.
    pub fn configure(&mut self, core_mask: u32) -> Result<(), RknnError> {
        let mut num = abi::InputOutputNum::default();
        self.query(abi::QUERY_IN_OUT_NUM, &mut num, "rknn_query(IN_OUT_NUM)")?;
        if num.n_input as usize != INPUT_NAMES.len() || num.n_output != 1 {
            return Err(self.mismatch(format!(
                "it has {} inputs and {} outputs, the Laya graph has 5 inputs ({}) and 1 output ({OUTPUT_NAME})",
                num.n_input,
                num.n_output,
                INPUT_NAMES.join(", ")
            )));
        }
        let (l, s) = (self.graph.seq_len as u32, self.graph.marker_slots as u32);
        let shapes: [&[u32]; 5] = [&[1, l], &[1, l], &[1, s], &[1, s], &[1]];
        let mut seen = [false; 5];
        for index in 0..num.n_input {
            let mut attr = abi::TensorAttr::for_index(index);
            self.query(abi::QUERY_INPUT_ATTR, &mut attr, "rknn_query(INPUT_ATTR)")?;
            let name = attr.name();
            let Some(k) = INPUT_NAMES.iter().position(|n| *n == name) else {
                return Err(self.mismatch(format!("input {index} is {name:?}, not one of {INPUT_NAMES:?}")));
            };
            if seen[k] {
                return Err(self.mismatch(format!("input {name:?} appears twice")));
            }
            seen[k] = true;
            if attr.shape() != shapes[k] {
                return Err(self.mismatch(format!(
                    "input {name:?} has shape {:?}, the bundle says {:?}",
                    attr.shape(),
                    shapes[k]
                )));
            }
            if attr.type_ != abi::TENSOR_INT64 {
                return Err(self.mismatch(format!(
                    "input {name:?} has element type {}, not int64 ({})",
                    attr.type_,
                    abi::TENSOR_INT64
                )));
            }
            self.inputs[k] = Slot { index, fmt: attr.fmt };
        }
        let mut out = abi::TensorAttr::for_index(0);
        self.query(abi::QUERY_OUTPUT_ATTR, &mut out, "rknn_query(OUTPUT_ATTR)")?;
        if out.name() != OUTPUT_NAME || out.shape() != [1, s] {
            return Err(self.mismatch(format!(
                "the output is {:?} of shape {:?}, the bundle says {OUTPUT_NAME:?} of shape [1, {s}]",
                out.name(),
                out.shape()
            )));
        }
        // The runtime converts to float for us (want_float); anything but a float tensor would
        // mean a quantised graph, which this backend does not expect.
        if out.type_ != abi::TENSOR_FLOAT32 && out.type_ != abi::TENSOR_FLOAT16 {
            return Err(self.mismatch(format!("the output has element type {}, not float16/float32", out.type_)));
        }
        self.output_index = 0;
        // SAFETY: `self.ctx` is a live context from rknn_init; the mask is passed by value.
        let code = unsafe { (self.rt.set_core_mask)(self.ctx, core_mask) };
        Status::check(code).map_err(|status| call_error(&self.graph.file, "rknn_set_core_mask", status))
    }

    /// Runs one row (which must fit this graph) and returns the graph's raw `marker_slots` logits.
    pub fn run(&mut self, row: &Row, pad_id: u32) -> Result<&[f32], BackendError> {
        self.padded.fill(row, pad_id);
        let p = &mut self.padded;
        let buffers: [&mut Vec<i64>; 5] =
            [&mut p.input_ids, &mut p.attention_mask, &mut p.marker_pos, &mut p.marker_mask, &mut p.qtype];
        let mut inputs = [abi::Input {
            index: 0,
            buf: std::ptr::null_mut(),
            size: 0,
            pass_through: 0,
            type_: abi::TENSOR_INT64,
            fmt: abi::FORMAT_UNDEFINED,
        }; 5];
        for ((input, slot), buf) in inputs.iter_mut().zip(&self.inputs).zip(buffers) {
            input.index = slot.index;
            input.fmt = slot.fmt;
            input.size = (buf.len() * size_of::<i64>()) as u32;
            input.buf = buf.as_mut_ptr().cast::<c_void>();
        }
        // SAFETY: `inputs` is an array of 5 initialised descriptors, each pointing at a live
        // `Vec<i64>` of exactly `size` bytes owned by `self.padded`, which is not touched until
        // the call returns; the runtime copies the data during the call.
        let code = unsafe { (self.rt.inputs_set)(self.ctx, inputs.len() as u32, inputs.as_mut_ptr()) };
        Status::check(code).map_err(|s| run_error("rknn_inputs_set", s, false))?;
        // SAFETY: a live context with its inputs set; a null extension means a blocking run.
        let code = unsafe { (self.rt.run)(self.ctx, std::ptr::null_mut()) };
        Status::check(code).map_err(|s| run_error("rknn_run", s, true))?;
        let mut outputs = [abi::Output {
            want_float: 1,
            is_prealloc: 1,
            index: self.output_index,
            buf: self.logits.as_mut_ptr().cast::<c_void>(),
            size: (self.logits.len() * size_of::<f32>()) as u32,
        }];
        // SAFETY: one output descriptor pointing at `self.logits`, a live buffer of exactly
        // `size` bytes that the runtime fills as f32 (want_float) since it is preallocated; the
        // extension may be null.
        let code = unsafe { (self.rt.outputs_get)(self.ctx, 1, outputs.as_mut_ptr(), std::ptr::null_mut()) };
        Status::check(code).map_err(|s| run_error("rknn_outputs_get", s, true))?;
        // SAFETY: releases the descriptor outputs_get just filled (nothing to free for a
        // preallocated buffer, but the runtime expects the call).
        let code = unsafe { (self.rt.outputs_release)(self.ctx, 1, outputs.as_mut_ptr()) };
        Status::check(code).map_err(|s| run_error("rknn_outputs_release", s, true))?;
        Ok(&self.logits)
    }

    /// `rknn_query` into a `#[repr(C)]` answer structure.
    fn query<T>(&self, cmd: u32, info: &mut T, what: &'static str) -> Result<(), RknnError> {
        // SAFETY: `info` is a valid, writable `T` whose size we pass; every `T` used here is the
        // mirror of the structure the documentation pairs with `cmd` (abi.rs).
        let code = unsafe { (self.rt.query)(self.ctx, cmd, (info as *mut T).cast::<c_void>(), size_of::<T>() as u32) };
        Status::check(code).map_err(|status| call_error(&self.graph.file, what, status))
    }

    fn mismatch(&self, message: String) -> RknnError {
        RknnError::Graph { path: self.graph.file.clone(), message }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: `self.ctx` came from a successful rknn_init and is destroyed exactly once.
        // A failure here leaves nothing to do: the process keeps going without the context.
        let _ = unsafe { (self.rt.destroy)(self.ctx) };
    }
}

fn call_error(graph: &Path, call: &'static str, status: Status) -> RknnError {
    RknnError::Call { graph: graph.to_owned(), call, status }
}

/// Every runtime failure during a run is fatal for the worker: a timeout (or `RKNN_ERR_FAIL`
/// after a run, the RK3588 driver's job timeout) means the NPU is hung; anything else means the
/// runtime is in a state we cannot reason about. The code travels with the error.
fn run_error(call: &'static str, status: Status, after_run: bool) -> BackendError {
    let what = if status.is_hang(after_run) { "the NPU job hung" } else { "the runtime failed" };
    BackendError::Fatal { code: Some(i64::from(status.code())), message: format!("{call}: {what}: {status}") }
}
