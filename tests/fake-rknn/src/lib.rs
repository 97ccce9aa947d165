//! fake-rknn: a stand-in for librknnrt, so the RKNN backend can be tested without an RK3588.
//!
//! It exports the C functions laya-edge's RKNN backend calls, with the same ABI (the `#[repr(C)]`
//! mirrors are laya-edge's own `abi.rs`, compiled in here through `#[path]`, so both sides share
//! one asserted layout). Its "graph file" is a JSON document naming a laya checkpoint
//! (`graph.rs`); a run computes the logits with laya-edge's CPU reference exactly as the real
//! graph would (`context.rs`). Environment knobs read at `rknn_init` make it misbehave the ways
//! real runtimes do: wrong version, latency, a hung job, error codes, constant output
//! (`knobs.rs`). See README.md.
//!
//! Contexts from `rknn_dup_context` share their original's checkpoint. The NPU's three cores are
//! modelled as locks: a run holds the cores of its context's mask for its `FAKE_RKNN_LATENCY_MS`
//! (see `context.rs`), so runs on contexts pinned to different cores overlap and runs that share
//! a core wait for each other.
//!
//! Every export catches panics (unwinding into C is not allowed) and reports them as
//! `RKNN_ERR_FAIL`.

#[path = "../../../agent/src/backend/npu/rknn/abi.rs"]
#[allow(dead_code)]
mod abi;
mod context;
mod graph;
mod knobs;

use core::ffi::{c_char, c_int, c_void};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use abi::RknnContext;
use context::{Context, INPUTS};
use graph::FakeGraph;
use knobs::Knobs;

/// Live contexts by handle. Each context has its own lock so that a hung run does not block
/// the others (or `rknn_destroy` of another context).
static CONTEXTS: Mutex<Option<HashMap<RknnContext, Arc<Mutex<Context>>>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

// The exports have exactly the signatures laya-edge looks them up with.
const _: abi::InitFn = rknn_init;
const _: abi::DestroyFn = rknn_destroy;
const _: abi::QueryFn = rknn_query;
const _: abi::SetCoreMaskFn = rknn_set_core_mask;
const _: abi::DupContextFn = rknn_dup_context;
const _: abi::InputsSetFn = rknn_inputs_set;
const _: abi::RunFn = rknn_run;
const _: abi::OutputsGetFn = rknn_outputs_get;
const _: abi::OutputsReleaseFn = rknn_outputs_release;

/// Runs `f`, turning a panic into `RKNN_ERR_FAIL`.
fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(abi::RKNN_ERR_FAIL)
}

fn context(ctx: RknnContext) -> Option<Arc<Mutex<Context>>> {
    let map = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    map.as_ref()?.get(&ctx).cloned()
}

/// Runs `f` on the context `ctx` (locked), or returns `RKNN_ERR_CTX_INVALID`.
fn with_context(ctx: RknnContext, f: impl FnOnce(&mut Context) -> c_int) -> c_int {
    guarded(|| match context(ctx) {
        Some(c) => f(&mut c.lock().unwrap_or_else(|e| e.into_inner())),
        None => abi::RKNN_ERR_CTX_INVALID,
    })
}

/// Loads a fake graph: `model` points at `size` bytes of a graph file (or, with `size` 0, at a
/// NUL-terminated path of one, as the real API allows).
///
/// # Safety
/// `context` must be writable; `model` must point at `size` readable bytes (or a C string if
/// `size` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_init(
    context: *mut RknnContext,
    model: *mut c_void,
    size: u32,
    _flag: u32,
    _extend: *mut c_void,
) -> c_int {
    guarded(|| {
        if context.is_null() || model.is_null() {
            return abi::RKNN_ERR_PARAM_INVALID;
        }
        let knobs = Knobs::from_env();
        if let Some(code) = knobs.fail_init {
            return code;
        }
        let bytes = if size == 0 {
            // SAFETY: the caller passes a NUL-terminated path when size is 0.
            let path = unsafe { std::ffi::CStr::from_ptr(model.cast::<c_char>()) };
            match std::fs::read(path.to_string_lossy().as_ref()) {
                Ok(b) => b,
                Err(_) => return abi::RKNN_ERR_MODEL_INVALID,
            }
        } else {
            // SAFETY: the caller guarantees `size` readable bytes at `model`.
            unsafe { std::slice::from_raw_parts(model.cast::<u8>(), size as usize) }.to_vec()
        };
        let Ok(graph) = FakeGraph::parse(&bytes) else {
            return abi::RKNN_ERR_MODEL_INVALID;
        };
        let Ok(ctx) = Context::load(graph, knobs) else {
            return abi::RKNN_ERR_MODEL_INVALID;
        };
        let handle = NEXT_HANDLE.fetch_add(1, Ordering::SeqCst) as RknnContext;
        let mut map = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        map.get_or_insert_with(HashMap::new).insert(handle, Arc::new(Mutex::new(ctx)));
        // SAFETY: checked non-null above; the caller provides a writable handle.
        unsafe { context.write(handle) };
        abi::RKNN_SUCC
    })
}

/// A second context of the graph loaded in `*context_in`, sharing its weights (the checkpoint
/// on the CPU reference), written to `*context_out`, as the SDK guide documents
/// `rknn_dup_context`: its own inputs, outputs and core mask (the runtime's default, auto), the
/// same knobs, destroyed on its own.
///
/// # Safety
/// `context_in` must point at a handle from `rknn_init` (or a duplicate); `context_out` must be
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_dup_context(context_in: *mut RknnContext, context_out: *mut RknnContext) -> c_int {
    guarded(|| {
        if context_in.is_null() || context_out.is_null() {
            return abi::RKNN_ERR_PARAM_INVALID;
        }
        // SAFETY: checked non-null; the caller passes a readable handle.
        let Some(source) = context(unsafe { context_in.read() }) else {
            return abi::RKNN_ERR_CTX_INVALID;
        };
        let dup = source.lock().unwrap_or_else(|e| e.into_inner()).dup();
        let handle = NEXT_HANDLE.fetch_add(1, Ordering::SeqCst) as RknnContext;
        let mut map = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        map.get_or_insert_with(HashMap::new).insert(handle, Arc::new(Mutex::new(dup)));
        // SAFETY: checked non-null; the caller provides a writable handle.
        unsafe { context_out.write(handle) };
        abi::RKNN_SUCC
    })
}

/// Forgets a context.
///
/// # Safety
/// None beyond passing a handle from `rknn_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_destroy(context: RknnContext) -> c_int {
    guarded(|| {
        let mut map = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        match map.as_mut().and_then(|m| m.remove(&context)) {
            Some(_) => abi::RKNN_SUCC,
            None => abi::RKNN_ERR_CTX_INVALID,
        }
    })
}

/// Answers `IN_OUT_NUM`, `INPUT_ATTR`, `OUTPUT_ATTR` and `SDK_VERSION`.
///
/// # Safety
/// `info` must point at `size` writable bytes holding the structure `cmd` asks for (with its
/// `index` set for the attribute queries).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_query(context: RknnContext, cmd: u32, info: *mut c_void, size: u32) -> c_int {
    with_context(context, |c| {
        if info.is_null() {
            return abi::RKNN_ERR_PARAM_INVALID;
        }
        let fits = |n: usize| size as usize >= n;
        match cmd {
            abi::QUERY_IN_OUT_NUM if fits(size_of::<abi::InputOutputNum>()) => {
                let num = abi::InputOutputNum { n_input: INPUTS.len() as u32, n_output: 1 };
                // SAFETY: `info` has room for an InputOutputNum (checked); unaligned write is fine.
                unsafe { info.cast::<abi::InputOutputNum>().write_unaligned(num) };
                abi::RKNN_SUCC
            }
            abi::QUERY_INPUT_ATTR | abi::QUERY_OUTPUT_ATTR if fits(size_of::<abi::TensorAttr>()) => {
                // SAFETY: `info` holds a TensorAttr (checked size) whose first field is the index.
                let index = unsafe { info.cast::<u32>().read_unaligned() } as usize;
                let attr = match cmd {
                    abi::QUERY_INPUT_ATTR if index < INPUTS.len() => c.input_attr(index),
                    abi::QUERY_OUTPUT_ATTR if index == 0 => c.output_attr(),
                    _ => return abi::RKNN_ERR_PARAM_INVALID,
                };
                // SAFETY: as above, room for a TensorAttr.
                unsafe { info.cast::<abi::TensorAttr>().write_unaligned(attr) };
                abi::RKNN_SUCC
            }
            abi::QUERY_SDK_VERSION if fits(size_of::<abi::SdkVersion>()) => {
                let mut v = abi::SdkVersion::zeroed();
                abi::string_to_c_chars(&c.knobs.sdk_version, &mut v.api_version);
                abi::string_to_c_chars(&c.knobs.drv_version, &mut v.drv_version);
                // SAFETY: room for an SdkVersion (checked).
                unsafe { info.cast::<abi::SdkVersion>().write_unaligned(v) };
                abi::RKNN_SUCC
            }
            _ => abi::RKNN_ERR_PARAM_INVALID,
        }
    })
}

/// Accepts the documented masks (auto, single cores, 0+1, 0+1+2, all) and traces the choice.
///
/// # Safety
/// None beyond passing a handle from `rknn_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_set_core_mask(context: RknnContext, mask: u32) -> c_int {
    with_context(context, |c| {
        let documented =
            [abi::CORE_AUTO, abi::CORE_0, abi::CORE_1, abi::CORE_2, abi::CORE_0_1, abi::CORE_0_1_2, abi::CORE_ALL];
        if !documented.contains(&mask) {
            return abi::RKNN_ERR_PARAM_INVALID;
        }
        c.trace(&format!("core_mask={mask:#x} seq_len={}", c.graph.seq_len));
        c.core_mask = mask;
        abi::RKNN_SUCC
    })
}

/// Copies the five inputs. Each must be given once, as int64 with pass-through off, with
/// exactly the compiled shape's bytes.
///
/// # Safety
/// `inputs` must point at `n_inputs` descriptors, each `buf` at `size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_inputs_set(context: RknnContext, n_inputs: u32, inputs: *mut abi::Input) -> c_int {
    with_context(context, |c| {
        if inputs.is_null() || n_inputs as usize != INPUTS.len() {
            return abi::RKNN_ERR_PARAM_INVALID;
        }
        // SAFETY: the caller passes `n_inputs` descriptors.
        let descs = unsafe { std::slice::from_raw_parts(inputs, n_inputs as usize) };
        let mut got: [Option<Vec<i64>>; 5] = Default::default();
        for d in descs {
            let i = d.index as usize;
            let want = c.input_len(i.min(4)) * 8;
            if i >= INPUTS.len() || got[i].is_some() || d.buf.is_null() {
                return abi::RKNN_ERR_PARAM_INVALID;
            }
            if d.pass_through != 0 || d.type_ != abi::TENSOR_INT64 || d.size as usize != want {
                return abi::RKNN_ERR_INPUT_INVALID;
            }
            // SAFETY: the caller guarantees `size` readable bytes at `buf` (any alignment).
            let bytes = unsafe { std::slice::from_raw_parts(d.buf.cast::<u8>(), want) };
            got[i] = Some(bytes.chunks_exact(8).map(|b| i64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))).collect());
        }
        let [Some(a), Some(b), Some(p), Some(m), Some(q)] = got else {
            return abi::RKNN_ERR_PARAM_INVALID;
        };
        c.set_inputs([a, b, p, m, q]);
        abi::RKNN_SUCC
    })
}

/// Computes the logits of the inputs last set (see `context.rs` and the knobs).
///
/// # Safety
/// None beyond passing a handle from `rknn_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_run(context: RknnContext, _extend: *mut c_void) -> c_int {
    with_context(context, Context::run)
}

/// Hands out the last run's logits as float (`want_float` must be 1: the graph's output is
/// float16 and the fake does not produce float16 bits), into the caller's buffer with
/// `is_prealloc`, else into a buffer the fake owns until `rknn_outputs_release`.
///
/// # Safety
/// `outputs` must point at `n_outputs` descriptors; a preallocated `buf` at `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_outputs_get(
    context: RknnContext,
    n_outputs: u32,
    outputs: *mut abi::Output,
    _extend: *mut c_void,
) -> c_int {
    with_context(context, |c| {
        if outputs.is_null() || n_outputs != 1 {
            return abi::RKNN_ERR_PARAM_INVALID;
        }
        // SAFETY: the caller passes one writable descriptor.
        let out = unsafe { &mut *outputs };
        if out.index != 0 || out.want_float != 1 {
            return abi::RKNN_ERR_OUTPUT_INVALID;
        }
        let Some(logits) = c.output().map(<[f32]>::to_vec) else {
            return abi::RKNN_ERR_OUTPUT_INVALID;
        };
        let bytes = logits.len() * size_of::<f32>();
        if out.is_prealloc != 0 {
            if out.buf.is_null() || (out.size as usize) < bytes {
                return abi::RKNN_ERR_OUTPUT_INVALID;
            }
            // SAFETY: the caller's buffer has at least `bytes` writable bytes (checked); byte
            // copy, so its alignment does not matter.
            unsafe { std::ptr::copy_nonoverlapping(logits.as_ptr().cast::<u8>(), out.buf.cast::<u8>(), bytes) };
        } else {
            let mut owned = logits.into_boxed_slice();
            out.buf = owned.as_mut_ptr().cast::<c_void>();
            out.size = bytes as u32;
            c.handed_out.push(owned);
        }
        abi::RKNN_SUCC
    })
}

/// Frees what `rknn_outputs_get` handed out (nothing for preallocated buffers).
///
/// # Safety
/// `outputs` must point at `n_outputs` descriptors filled by `rknn_outputs_get`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rknn_outputs_release(
    context: RknnContext,
    n_outputs: u32,
    outputs: *mut abi::Output,
) -> c_int {
    with_context(context, |c| {
        if outputs.is_null() {
            return abi::RKNN_ERR_PARAM_INVALID;
        }
        // SAFETY: the caller passes `n_outputs` descriptors.
        let descs = unsafe { std::slice::from_raw_parts_mut(outputs, n_outputs as usize) };
        for d in descs.iter_mut().filter(|d| d.is_prealloc == 0) {
            let ptr = d.buf.cast::<f32>();
            c.handed_out.retain(|b| b.as_ptr() != ptr.cast_const());
            d.buf = std::ptr::null_mut();
        }
        abi::RKNN_SUCC
    })
}
