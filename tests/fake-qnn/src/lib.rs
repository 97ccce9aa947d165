//! A fake QNN runtime (see README.md): the core and system provider tables of
//! `laya_edge::backend::npu::qnn::abi`, backed by the CPU reference encoder.
//!
//! Every exported function is `extern "C"` and never unwinds: failures are returned as QNN
//! error codes, panics are caught at the boundary.

use std::ffi::{CStr, CString, c_char, c_void};
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{Device, Tensor};
use laya_edge::backend::cpu::CpuModel;
use laya_edge::backend::npu::qnn::abi::{self, ErrorHandle, Handle};
use laya_edge::bundle::AgentConfig;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};

const NOT_SUPPORTED: ErrorHandle = 1000;
const INVALID_ARGUMENT: ErrorHandle = 1004;
const CONTEXT_CREATE_FROM_BINARY: ErrorHandle = 5005;
const GRAPH_INVALID: ErrorHandle = 6000;

fn knob(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// A parsed fake context binary.
struct FakeBinary {
    checkpoint: PathBuf,
    seq_len: u32,
    graph_name: String,
    suffix: String,
}

fn parse_binary(bytes: &[u8]) -> Option<FakeBinary> {
    let v = json::parse(bytes, ParseOptions::default()).ok()?;
    v.get("fake_qnn_binary")?;
    Some(FakeBinary {
        checkpoint: PathBuf::from(v.get("checkpoint")?.as_str()?),
        seq_len: u32::try_from(v.get("seq_len")?.as_i64()?).ok()?,
        graph_name: v.get("graph_name").and_then(Value::as_str).unwrap_or("fake_graph").to_owned(),
        suffix: v.get("tensor_suffix").and_then(Value::as_str).unwrap_or("").to_owned(),
    })
}

fn hidden_size(checkpoint: &std::path::Path) -> Option<u32> {
    let bytes = std::fs::read(checkpoint.join("encoder").join("config.json")).ok()?;
    let v = json::parse(&bytes, ParseOptions::default()).ok()?;
    u32::try_from(v.get("hidden_size")?.as_i64()?).ok()
}

// ------------------------------------------------------------------------------------------
// Tensor descriptions shared by the system and core sides.
// ------------------------------------------------------------------------------------------

/// Owned names and dims behind `abi::Tensor` values.
struct Tensors {
    _names: Vec<CString>,
    _dims: Vec<Vec<u32>>,
    inputs: Vec<abi::Tensor>,
    outputs: Vec<abi::Tensor>,
}

/// The graph's tensors, or `None` if the binary's tensor suffix holds a NUL byte.
fn tensors(b: &FakeBinary, d: u32) -> Option<Tensors> {
    let l = b.seq_len;
    let specs: [(&str, Vec<u32>, u32); 4] = [
        ("inputs_embeds", vec![1, l, d], abi::tensor_type::APP_WRITE),
        ("gmask", vec![1, 1, l, l], abi::tensor_type::APP_WRITE),
        ("smask", vec![1, 1, l, l], abi::tensor_type::APP_WRITE),
        ("hidden", vec![1, l, d], abi::tensor_type::APP_READ),
    ];
    let mut names = Vec::new();
    let mut dims = Vec::new();
    let mut all = Vec::new();
    for (i, (name, mut shape, ty)) in specs.into_iter().enumerate() {
        let cname = CString::new(format!("{name}{}", b.suffix)).ok()?;
        let mut v = abi::TensorV2::zeroed();
        v.id = i as u32 + 1;
        v.name = cname.as_ptr();
        v.tensor_type = ty;
        v.data_type = abi::data_type::FLOAT_32;
        v.rank = shape.len() as u32;
        v.dimensions = shape.as_mut_ptr();
        all.push(abi::Tensor { version: abi::TENSOR_VERSION_2, v });
        names.push(cname);
        dims.push(shape);
    }
    let outputs = all.split_off(3);
    Some(Tensors { _names: names, _dims: dims, inputs: all, outputs })
}

// ------------------------------------------------------------------------------------------
// System interface.
// ------------------------------------------------------------------------------------------

struct SystemContext {
    _tensors: Option<Tensors>,
    _strings: Vec<CString>,
    _graphs: Vec<abi::GraphInfo>,
    info: Option<Box<abi::BinaryInfo>>,
}

unsafe extern "C" fn system_context_create(handle: *mut Handle) -> ErrorHandle {
    if handle.is_null() {
        return INVALID_ARGUMENT;
    }
    let ctx = Box::new(SystemContext { _tensors: None, _strings: Vec::new(), _graphs: Vec::new(), info: None });
    // SAFETY: `handle` is a valid out-pointer (checked non-null).
    unsafe { *handle = Box::into_raw(ctx).cast() };
    0
}

unsafe extern "C" fn system_context_get_binary_info(
    handle: Handle,
    buffer: *mut c_void,
    size: u64,
    info: *mut *const abi::BinaryInfo,
    info_size: *mut u64,
) -> ErrorHandle {
    if handle.is_null() || buffer.is_null() || info.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes a buffer of `size` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), size as usize) };
    let Some(b) = parse_binary(bytes) else { return CONTEXT_CREATE_FROM_BINARY };
    let Some(d) = hidden_size(&b.checkpoint) else { return CONTEXT_CREATE_FROM_BINARY };
    // SAFETY: `handle` came from `system_context_create`.
    let ctx = unsafe { &mut *handle.cast::<SystemContext>() };
    let Some(mut t) = tensors(&b, d) else { return CONTEXT_CREATE_FROM_BINARY };
    let Ok(name) = CString::new(b.graph_name.clone()) else { return CONTEXT_CREATE_FROM_BINARY };
    let build = c"v2.51.0.fake".to_owned();
    let graph = abi::GraphInfo {
        version: 3,
        info: abi::GraphInfoV3 {
            v1: abi::GraphInfoV1 {
                graph_name: name.as_ptr(),
                num_graph_inputs: 3,
                graph_inputs: t.inputs.as_mut_ptr(),
                num_graph_outputs: 1,
                graph_outputs: t.outputs.as_mut_ptr(),
            },
            num_updateable_tensors: 0,
            updateable_tensors: std::ptr::null_mut(),
            graph_blob_info_size: 0,
            graph_blob_info: std::ptr::null_mut(),
            start_op_index: 0,
            end_op_index: 0,
        },
    };
    ctx._graphs = vec![graph];
    let v3 = abi::BinaryInfoV3 {
        head: abi::BinaryInfoHead {
            backend_id: abi::BACKEND_ID_HTP,
            build_id: build.as_ptr(),
            core_api_version: abi::Version { major: 2, minor: 40, patch: 0 },
            backend_api_version: abi::Version { major: 5, minor: 51, patch: 0 },
            soc_version: std::ptr::null(),
        },
        context_blob_version: abi::Version::default(),
        context_blob_size: size,
        num_context_tensors: 0,
        context_tensors: std::ptr::null_mut(),
        num_graphs: 1,
        graphs: ctx._graphs.as_mut_ptr(),
        platform_info: std::ptr::null_mut(),
        context_metadata_size: 0,
        context_metadata: std::ptr::null_mut(),
        soc_model: 0,
    };
    ctx.info = Some(Box::new(abi::BinaryInfo { version: 3, info: abi::BinaryInfoUnion { v3 } }));
    ctx._strings = vec![name, build];
    ctx._tensors = Some(t);
    // SAFETY: out-pointers checked non-null (`info_size` may be NULL).
    unsafe {
        *info = &**ctx.info.as_ref().unwrap();
        if !info_size.is_null() {
            *info_size = std::mem::size_of::<abi::BinaryInfo>() as u64;
        }
    }
    0
}

unsafe extern "C" fn system_context_free(handle: Handle) -> ErrorHandle {
    if !handle.is_null() {
        // SAFETY: created by `system_context_create`, freed once by the caller.
        drop(unsafe { Box::from_raw(handle.cast::<SystemContext>()) });
    }
    0
}

struct SyncPtr<T>(*const T);
// SAFETY: points to a leaked, immutable table.
unsafe impl<T> Sync for SyncPtr<T> {}
// SAFETY: as above: the table is never freed nor written, so any thread may hold the pointer.
unsafe impl<T> Send for SyncPtr<T> {}

/// The body of a `*_getProviders` export: on the first call leaks the provider table `make()`
/// and a one-element list of it into `list`, then writes the list and its length to the
/// out-pointers.
///
/// # Safety
/// `providers` and `count` are NULL or valid out-pointers.
unsafe fn publish_providers<T: 'static>(
    list: &OnceLock<SyncPtr<*const T>>,
    make: impl FnOnce() -> T,
    providers: *mut *const *const T,
    count: *mut u32,
) -> ErrorHandle {
    if providers.is_null() || count.is_null() {
        return INVALID_ARGUMENT;
    }
    let list = list.get_or_init(|| {
        let iface: &'static T = Box::leak(Box::new(make()));
        let arr: &'static [*const T; 1] = Box::leak(Box::new([iface as *const T]));
        SyncPtr(arr.as_ptr())
    });
    // SAFETY: checked non-null.
    unsafe {
        *providers = list.0;
        *count = 1;
    }
    0
}

/// # Safety
/// Out-pointers as documented for `QnnSystemInterface_getProviders`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QnnSystemInterface_getProviders(
    providers: *mut *const *const abi::SystemInterface,
    count: *mut u32,
) -> ErrorHandle {
    static LIST: OnceLock<SyncPtr<*const abi::SystemInterface>> = OnceLock::new();
    let make = || abi::SystemInterface {
        backend_id: 0,
        provider_name: c"FAKE_SYSTEM".as_ptr(),
        system_api_version: abi::Version { major: 1, minor: 15, patch: 0 },
        functions: abi::SystemFunctions {
            system_context_create: Some(system_context_create),
            system_context_get_binary_info: Some(system_context_get_binary_info),
            system_context_get_metadata: None,
            system_context_free: Some(system_context_free),
        },
    };
    // SAFETY: the caller's out-pointers, per this function's contract.
    unsafe { publish_providers(&LIST, make, providers, count) }
}

// ------------------------------------------------------------------------------------------
// Core interface.
// ------------------------------------------------------------------------------------------

struct Context {
    model: CpuModel,
    binary: FakeBinary,
    d: usize,
}

static EXECUTES: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn log_create(_cb: Option<abi::LogCallback>, _level: u32, logger: *mut Handle) -> ErrorHandle {
    if !logger.is_null() {
        // SAFETY: non-null out-pointer; any non-null value serves as a handle.
        unsafe { *logger = 1 as Handle };
    }
    0
}
unsafe extern "C" fn log_free(_logger: Handle) -> ErrorHandle {
    0
}
unsafe extern "C" fn backend_create(
    _logger: Handle,
    _config: *const *const c_void,
    backend: *mut Handle,
) -> ErrorHandle {
    if backend.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null out-pointer.
    unsafe { *backend = 2 as Handle };
    0
}
unsafe extern "C" fn backend_get_build_id(id: *mut *const c_char) -> ErrorHandle {
    static ID: OnceLock<CString> = OnceLock::new();
    let s = ID.get_or_init(|| {
        std::env::var("FAKE_QNN_BUILD_ID")
            .ok()
            .and_then(|id| CString::new(id).ok())
            .unwrap_or_else(|| c"v2.51.0.fake".to_owned())
    });
    if !id.is_null() {
        // SAFETY: non-null out-pointer; the string is static.
        unsafe { *id = s.as_ptr() };
    }
    0
}
unsafe extern "C" fn backend_free(_backend: Handle) -> ErrorHandle {
    0
}
unsafe extern "C" fn device_create(
    _logger: Handle,
    _config: *const *const c_void,
    _device: *mut Handle,
) -> ErrorHandle {
    NOT_SUPPORTED
}
/// Appends a line to `FAKE_QNN_TRACE`, if set.
fn trace(line: std::fmt::Arguments) {
    if let Ok(path) = std::env::var("FAKE_QNN_TRACE")
        && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        writeln!(f, "{line}").ok();
    }
}

/// The id `createPowerConfigId` hands out.
const POWER_ID: u32 = 7;

unsafe extern "C" fn create_power_config_id(device_id: u32, core_id: u32, id: *mut u32) -> ErrorHandle {
    if id.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null out-pointer.
    unsafe { *id = POWER_ID };
    trace(format_args!("power create device={device_id} core={core_id} -> {POWER_ID}"));
    0
}
unsafe extern "C" fn destroy_power_config_id(id: u32) -> ErrorHandle {
    trace(format_args!("power destroy {id}"));
    if id == POWER_ID { 0 } else { INVALID_ARGUMENT }
}
unsafe extern "C" fn set_power_config(id: u32, configs: *const *const abi::PowerConfig) -> ErrorHandle {
    if id != POWER_ID || configs.is_null() {
        return INVALID_ARGUMENT;
    }
    if knob("FAKE_QNN_SET_POWER_ERROR").is_some() {
        return INVALID_ARGUMENT;
    }
    let mut i = 0;
    // SAFETY: a NULL-terminated list of config pointers, as documented for setPowerConfig.
    while let Some(c) = unsafe { (*configs.add(i)).as_ref() } {
        if c.option == abi::POWER_CONFIG_DCVS_V3 {
            // SAFETY: option DCVS_V3 names the dcvs_v3 arm.
            let d = unsafe { c.value.dcvs_v3 };
            trace(format_args!(
                "power set {id} dcvs_v3 context={} dcvs={}/{} mode={:#x} sleep_latency={}/{} sleep_disable={}/{} bus={}/{:#x}/{:#x}/{:#x} core={}/{:#x}/{:#x}/{:#x}",
                d.context_id,
                d.set_dcvs_enable,
                d.dcvs_enable,
                d.power_mode,
                d.set_sleep_latency,
                d.sleep_latency,
                d.set_sleep_disable,
                d.sleep_disable,
                d.set_bus_params,
                d.bus_voltage_corner_min,
                d.bus_voltage_corner_target,
                d.bus_voltage_corner_max,
                d.set_core_params,
                d.core_voltage_corner_min,
                d.core_voltage_corner_target,
                d.core_voltage_corner_max
            ));
        } else {
            trace(format_args!("power set {id} option {}", c.option));
        }
        i += 1;
    }
    0
}

unsafe extern "C" fn device_get_infrastructure(infra: *mut *const abi::HtpDeviceInfrastructure) -> ErrorHandle {
    static INFRA: abi::HtpDeviceInfrastructure = abi::HtpDeviceInfrastructure {
        infra_type: abi::HTP_INFRASTRUCTURE_TYPE_PERF,
        perf: abi::HtpPerfInfrastructure {
            create_power_config_id: Some(create_power_config_id),
            destroy_power_config_id: Some(destroy_power_config_id),
            set_power_config: Some(set_power_config),
            set_memory_config: None,
        },
    };
    if infra.is_null() {
        return INVALID_ARGUMENT;
    }
    if knob("FAKE_QNN_PERF_INFRA") == Some(0) {
        return NOT_SUPPORTED;
    }
    // SAFETY: non-null out-pointer; INFRA is static.
    unsafe { *infra = &INFRA };
    0
}

unsafe extern "C" fn signal_create(_b: Handle, _c: *const *const abi::SignalConfig, _s: *mut Handle) -> ErrorHandle {
    NOT_SUPPORTED
}
unsafe extern "C" fn error_get_message(error: ErrorHandle, message: *mut *const c_char) -> ErrorHandle {
    if message.is_null() {
        return INVALID_ARGUMENT;
    }
    let m: &'static CStr = match abi::error_code(error) {
        1007 => c"fake: subsystem restart, recovered",
        1011 => c"fake: subsystem restart, not recovered",
        5004 => c"fake: binary version",
        _ => c"fake: error",
    };
    // SAFETY: non-null out-pointer; static string.
    unsafe { *message = m.as_ptr() };
    0
}

unsafe extern "C" fn context_create_from_binary(
    _backend: Handle,
    _device: Handle,
    _config: *const *const c_void,
    binary: *const c_void,
    size: u64,
    context: *mut Handle,
    _profile: Handle,
) -> ErrorHandle {
    if let Some(code) = knob("FAKE_QNN_CREATE_ERROR") {
        return code;
    }
    if binary.is_null() || context.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: `size` bytes at `binary`, per the API.
    let bytes = unsafe { std::slice::from_raw_parts(binary.cast::<u8>(), size as usize) };
    let Some(b) = parse_binary(bytes) else { return CONTEXT_CREATE_FROM_BINARY };
    let loaded = std::panic::catch_unwind(|| {
        let cfg = AgentConfig::load(&b.checkpoint).ok()?;
        CpuModel::load(&b.checkpoint, &cfg).ok()
    });
    let Ok(Some(model)) = loaded else { return CONTEXT_CREATE_FROM_BINARY };
    let d = model.encoder.config.hidden_size;
    // SAFETY: non-null out-pointer.
    unsafe { *context = Box::into_raw(Box::new(Context { model, binary: b, d })).cast() };
    0
}

unsafe extern "C" fn context_free(context: Handle, _profile: Handle) -> ErrorHandle {
    if !context.is_null() {
        // SAFETY: created by `context_create_from_binary`, freed once.
        drop(unsafe { Box::from_raw(context.cast::<Context>()) });
    }
    0
}

unsafe extern "C" fn graph_retrieve(context: Handle, name: *const c_char, graph: *mut Handle) -> ErrorHandle {
    if context.is_null() || name.is_null() || graph.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: a live context and a NUL-terminated name.
    let (ctx, name) = unsafe { (&*context.cast::<Context>(), CStr::from_ptr(name)) };
    if name.to_bytes() != ctx.binary.graph_name.as_bytes() {
        return GRAPH_INVALID;
    }
    // SAFETY: non-null out-pointer; the graph handle is the context.
    unsafe { *graph = context };
    0
}

/// Reads a float input tensor by (suffixed) name.
///
/// # Safety
/// `inputs` must hold `n` tensors with valid names and client buffers.
unsafe fn input(inputs: *const abi::Tensor, n: u32, name: &str) -> Option<Vec<f32>> {
    (0..n as usize).find_map(|i| {
        // SAFETY: per the function's contract.
        let t = unsafe { &*inputs.add(i) };
        // SAFETY: valid NUL-terminated name.
        let tn = unsafe { CStr::from_ptr(t.v.name) };
        if tn.to_bytes() != name.as_bytes() || t.v.data_type != abi::data_type::FLOAT_32 {
            return None;
        }
        let buf = t.v.client_buf;
        // SAFETY: the client buffer holds `data_size` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(buf.data.cast::<u8>(), buf.data_size as usize) };
        Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    })
}

unsafe extern "C" fn graph_execute(
    graph: Handle,
    inputs: *const abi::Tensor,
    num_inputs: u32,
    outputs: *mut abi::Tensor,
    num_outputs: u32,
    _profile: Handle,
    _signal: Handle,
) -> ErrorHandle {
    let n = EXECUTES.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(ms) = knob("FAKE_QNN_LATENCY_MS") {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if knob("FAKE_QNN_HANG_ON_EXECUTE") == Some(n) {
        loop {
            std::thread::park();
        }
    }
    if let Some(code) = knob("FAKE_QNN_EXECUTE_ERROR")
        && knob("FAKE_QNN_EXECUTE_ERROR_ON").is_none_or(|on| on == n)
    {
        return code;
    }
    if graph.is_null() || inputs.is_null() || outputs.is_null() || num_outputs != 1 {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the graph handle is a live context.
    let ctx = unsafe { &*graph.cast::<Context>() };
    let (l, d, sfx) = (ctx.binary.seq_len as usize, ctx.d, ctx.binary.suffix.as_str());
    trace(format_args!("execute {} L={l}", ctx.binary.graph_name));
    // SAFETY: the caller's tensors, as documented for graphExecute.
    let read = |name: &str| unsafe { input(inputs, num_inputs, &format!("{name}{sfx}")) };
    let (Some(x), Some(g), Some(s)) = (read("inputs_embeds"), read("gmask"), read("smask")) else {
        return INVALID_ARGUMENT;
    };
    if x.len() != l * d || g.len() != l * l || s.len() != l * l {
        return INVALID_ARGUMENT;
    }
    // Wrong answers on purpose, on every graph or on the graphs of one length (the probe's
    // per-graph verdicts): the input scaled, or every position's hidden state the same.
    let faulty = knob("FAKE_QNN_FAULT_L").is_none_or(|at| at == l as u64);
    let scale = std::env::var("FAKE_QNN_SCALE_INPUT").ok().and_then(|v| v.trim().parse::<f32>().ok());
    let x = match scale.filter(|_| faulty) {
        Some(f) => x.into_iter().map(|v| v * f).collect(),
        None => x,
    };
    let collapse = faulty && knob("FAKE_QNN_COLLAPSE") == Some(1);
    let run = || -> candle_core::Result<Vec<f32>> {
        let dev = Device::Cpu;
        let x = Tensor::from_vec(x, (1, l, d), &dev)?;
        let g = Tensor::from_vec(g, (1, 1, l, l), &dev)?;
        let s = Tensor::from_vec(s, (1, 1, l, l), &dev)?;
        let h = ctx.model.encoder.encode(&x, &g, &s).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        h.flatten_all()?.to_vec1()
    };
    // Benchmarks of the host side (agent/benches/npu_overlap.rs) stand in for an NPU that costs
    // the host nothing: zeros instead of the encoder on the CPU.
    let hidden = if knob("FAKE_QNN_NO_COMPUTE") == Some(1) {
        vec![0.0f32; l * d]
    } else {
        let Ok(Ok(hidden)) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) else { return GRAPH_INVALID };
        hidden
    };
    // A collapsed graph: every position gets the mean hidden state, so every option reads the
    // same and every decision comes out uniform (what min-max calibration on the raw masks does).
    let hidden = if collapse {
        let mut mean = vec![0.0f32; d];
        for pos in hidden.chunks_exact(d) {
            for (m, v) in mean.iter_mut().zip(pos) {
                *m += v / l as f32;
            }
        }
        mean.iter().copied().cycle().take(l * d).collect()
    } else {
        hidden
    };
    // SAFETY: one output tensor with a client buffer of `data_size` bytes.
    let out = unsafe { &mut *outputs };
    let buf = out.v.client_buf;
    if buf.data_size as usize != hidden.len() * 4 {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the buffer holds `data_size` bytes (checked).
    let dst = unsafe { std::slice::from_raw_parts_mut(buf.data.cast::<u8>(), buf.data_size as usize) };
    for (c, v) in dst.chunks_exact_mut(4).zip(&hidden) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    0
}

fn core_functions() -> abi::CoreFunctions {
    // SAFETY: an all-NULL table is valid: every slot is an `Option` of a function pointer.
    let mut f: abi::CoreFunctions = unsafe { std::mem::zeroed() };
    f.backend_create = Some(backend_create);
    f.backend_get_build_id = Some(backend_get_build_id);
    f.backend_free = Some(backend_free);
    f.context_create_from_binary = Some(context_create_from_binary);
    f.context_free = Some(context_free);
    f.graph_retrieve = Some(graph_retrieve);
    f.graph_execute = Some(graph_execute);
    f.log_create = Some(log_create);
    f.log_free = Some(log_free);
    f.device_create = Some(device_create);
    f.device_get_infrastructure = Some(device_get_infrastructure);
    f.signal_create = Some(signal_create);
    f.error_get_message = Some(error_get_message);
    f
}

/// # Safety
/// Out-pointers as documented for `QnnInterface_getProviders`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QnnInterface_getProviders(
    providers: *mut *const *const abi::Interface,
    count: *mut u32,
) -> ErrorHandle {
    static LIST: OnceLock<SyncPtr<*const abi::Interface>> = OnceLock::new();
    let make = || abi::Interface {
        backend_id: abi::BACKEND_ID_HTP,
        provider_name: c"FAKE_HTP".as_ptr(),
        api_version: abi::ApiVersion {
            core: abi::Version { major: knob("FAKE_QNN_API_MAJOR").unwrap_or(2) as u32, minor: 40, patch: 0 },
            backend: abi::Version { major: 5, minor: 51, patch: 0 },
        },
        functions: core_functions(),
    };
    // SAFETY: the caller's out-pointers, per this function's contract.
    unsafe { publish_providers(&LIST, make, providers, count) }
}
