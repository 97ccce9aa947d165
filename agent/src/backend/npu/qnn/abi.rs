//! `#[repr(C)]` mirrors of the part of the QNN C API this backend calls, restated from the public
//! API reference (no SDK header is copied or vendored).
//!
//! Sources (Qualcomm AI Engine Direct / QAIRT API reference):
//! - provider discovery, `QnnInterface_t`:
//!   <https://docs.qualcomm.com/doc/80-63442-50/topic/api_usage_guidelines.html>,
//!   <https://docs.qualcomm.com/doc/80-63442-50/topic/structQnnInterface__t.html>
//! - `QnnContext_createFromBinary` and its error codes:
//!   <https://docs.qualcomm.com/doc/80-63442-10/topic/api_error_codes.html>, the QNN 2.39 reference
//!   page `api-rst/function_QnnContext_8h_1aa261465dd9bdfe51532a9d33fe4a2fa9.html`
//! - `QnnSignal_Config_t` (option 2 = timeout in microseconds): `api-rst/file_include_QNN_QnnSignal.h.html`
//! - HTP performance infrastructure (`QnnDevice_getInfrastructure`, `QnnHtpDevice_Infrastructure_t`,
//!   `QnnHtpPerfInfrastructure_PowerConfig_t` with its DCVS v3 arm): the HTP backend page
//!   <https://docs.qualcomm.com/doc/80-63442-50/topic/htp_backend.html> ("QNN HTP Performance
//!   Infrastructure API") and the `HTP/QnnHtpPerfInfrastructure.h` reference page; the field order
//!   cross-checked against how ONNX Runtime's and ExecuTorch's QNN integrations fill it.
//! - `Qnn_Tensor_t`, `Qnn_QuantizeParams_t`, `QnnSystemContext_BinaryInfo_t` (V1/V2/V3) and
//!   `QnnSystemContext_GraphInfo_t`: the QNN type reference (`QnnTypes.h`, `System/QnnSystemContext.h`
//!   pages), cross-checked against Qualcomm's BSD-licensed ctypes mirror of the same structs.
//!
//! What was verified against the x86-64 runtime of QNN 2.51 (core API 2.40, HTP backend API
//! 5.51, system API 1.15): the function table slot of `backendGetBuildId` (returns
//! `v2.51.0.260929181845`) and of `errorGetMessage` (names code 1007), the system table's four
//! context functions, BinaryInfo **version 3** (its `contextBlobVersion` sits where V1 keeps
//! `hwInfoBlobVersion`, so `contextBlobSize` moves from offset 88 to 64), GraphInfo version and
//! `Qnn_Tensor_t` version 2 with the array stride below (names, ranks and dims of every input of
//! the fixture binaries read back correctly). Every size and offset the code relies on is asserted
//! at compile time at the bottom of this file; [`crate::backend::npu::qnn::binary`] checks what it reads
//! (versions, ranks, names) before trusting it.
//!
//! `Qnn_ErrorHandle_t` is a `uint64_t`; only its low 16 bits carry the error code.
//!
//! This module is public so that `tests/fake-qnn` exports the very same ABI.

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};

/// `Qnn_ErrorHandle_t`.
pub type ErrorHandle = u64;
/// `QNN_SUCCESS`.
pub const SUCCESS: ErrorHandle = 0;

/// The code in an error handle (the runtime may put extra bits above the low 16).
pub fn error_code(e: ErrorHandle) -> u64 {
    e & 0xFFFF
}

/// Opaque handles (`Qnn_LogHandle_t`, `Qnn_BackendHandle_t`, ...): pointers owned by the runtime.
pub type Handle = *mut c_void;

/// `QNN_BACKEND_ID_HTP`.
pub const BACKEND_ID_HTP: u32 = 6;
/// The core API major version this mirror describes.
pub const CORE_API_MAJOR: u32 = 2;
/// The system API major version this mirror describes.
pub const SYSTEM_API_MAJOR: u32 = 1;

/// `Qnn_Version_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `Qnn_ApiVersion_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApiVersion {
    pub core: Version,
    pub backend: Version,
}

// ---------------------------------------------------------------------------------------------
// Function pointer types (the `...Fn_t` typedefs of QnnInterface.h, restated).
// ---------------------------------------------------------------------------------------------

/// `void (*QnnLog_Callback_t)(const char* fmt, QnnLog_Level_t level, uint64_t timestamp, va_list args)`.
/// We never format the message (stable Rust cannot take a `va_list`), so the callback only counts
/// and keeps the format string.
pub type LogCallback = unsafe extern "C" fn(fmt: *const c_char, level: u32, timestamp: u64, args: *mut c_void);
pub type LogCreateFn =
    unsafe extern "C" fn(callback: Option<LogCallback>, max_level: u32, logger: *mut Handle) -> ErrorHandle;
pub type LogFreeFn = unsafe extern "C" fn(logger: Handle) -> ErrorHandle;
pub type BackendCreateFn =
    unsafe extern "C" fn(logger: Handle, config: *const *const c_void, backend: *mut Handle) -> ErrorHandle;
pub type BackendGetApiVersionFn = unsafe extern "C" fn(version: *mut ApiVersion) -> ErrorHandle;
pub type BackendGetBuildIdFn = unsafe extern "C" fn(id: *mut *const c_char) -> ErrorHandle;
pub type BackendFreeFn = unsafe extern "C" fn(backend: Handle) -> ErrorHandle;
pub type DeviceCreateFn =
    unsafe extern "C" fn(logger: Handle, config: *const *const c_void, device: *mut Handle) -> ErrorHandle;
pub type DeviceFreeFn = unsafe extern "C" fn(device: Handle) -> ErrorHandle;
pub type ContextCreateFromBinaryFn = unsafe extern "C" fn(
    backend: Handle,
    device: Handle,
    config: *const *const c_void,
    binary: *const c_void,
    binary_size: u64,
    context: *mut Handle,
    profile: Handle,
) -> ErrorHandle;
pub type ContextFreeFn = unsafe extern "C" fn(context: Handle, profile: Handle) -> ErrorHandle;
pub type GraphRetrieveFn =
    unsafe extern "C" fn(context: Handle, name: *const c_char, graph: *mut Handle) -> ErrorHandle;
pub type GraphExecuteFn = unsafe extern "C" fn(
    graph: Handle,
    inputs: *const Tensor,
    num_inputs: u32,
    outputs: *mut Tensor,
    num_outputs: u32,
    profile: Handle,
    signal: Handle,
) -> ErrorHandle;
pub type SignalCreateFn =
    unsafe extern "C" fn(backend: Handle, config: *const *const SignalConfig, signal: *mut Handle) -> ErrorHandle;
pub type SignalFreeFn = unsafe extern "C" fn(signal: Handle) -> ErrorHandle;
pub type ErrorGetMessageFn = unsafe extern "C" fn(error: ErrorHandle, message: *mut *const c_char) -> ErrorHandle;
/// `QnnDevice_getInfrastructure(const QnnDevice_Infrastructure_t*)`: `QnnDevice_Infrastructure_t`
/// is a pointer to a backend-specific object; for HTP it is [`HtpDeviceInfrastructure`].
pub type DeviceGetInfrastructureFn = unsafe extern "C" fn(infra: *mut *const HtpDeviceInfrastructure) -> ErrorHandle;

// ---------------------------------------------------------------------------------------------
// HTP performance infrastructure (power votes).
// ---------------------------------------------------------------------------------------------

/// `QNN_HTP_DEVICE_INFRASTRUCTURE_TYPE_PERF`.
pub const HTP_INFRASTRUCTURE_TYPE_PERF: u32 = 0;
/// `QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_DCVS_V3`.
pub const POWER_CONFIG_DCVS_V3: u32 = 1;
/// `QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_PERFORMANCE_MODE`.
pub const POWER_MODE_PERFORMANCE: u32 = 0x10;
/// `DCVS_VOLTAGE_VCORNER_MAX_VOLTAGE_CORNER`.
pub const VOLTAGE_CORNER_MAX: u32 = 0xA0;

pub type CreatePowerConfigIdFn = unsafe extern "C" fn(device_id: u32, core_id: u32, id: *mut u32) -> ErrorHandle;
pub type DestroyPowerConfigIdFn = unsafe extern "C" fn(id: u32) -> ErrorHandle;
/// `setPowerConfig(id, const QnnHtpPerfInfrastructure_PowerConfig_t**)`: a NULL-terminated list.
pub type SetPowerConfigFn = unsafe extern "C" fn(id: u32, configs: *const *const PowerConfig) -> ErrorHandle;

/// `QnnHtpDevice_PerfInfrastructure_t`: the HTP's power-vote functions.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HtpPerfInfrastructure {
    pub create_power_config_id: Option<CreatePowerConfigIdFn>,
    pub destroy_power_config_id: Option<DestroyPowerConfigIdFn>,
    pub set_power_config: Option<SetPowerConfigFn>,
    pub set_memory_config: Unused,
}

/// `QnnHtpDevice_Infrastructure_t`: a type tag and (for the perf type) the function table.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HtpDeviceInfrastructure {
    pub infra_type: u32,
    pub perf: HtpPerfInfrastructure,
}

/// `QnnHtpPerfInfrastructure_DcvsV3_t`: every member a 32-bit value; each `set_*` flag says
/// whether the values after it are to be applied.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DcvsV3 {
    pub context_id: u32,
    pub set_dcvs_enable: u32,
    pub dcvs_enable: u32,
    pub power_mode: u32,
    pub set_sleep_latency: u32,
    /// Microseconds.
    pub sleep_latency: u32,
    pub set_sleep_disable: u32,
    pub sleep_disable: u32,
    pub set_bus_params: u32,
    pub bus_voltage_corner_min: u32,
    pub bus_voltage_corner_target: u32,
    pub bus_voltage_corner_max: u32,
    pub set_core_params: u32,
    pub core_voltage_corner_min: u32,
    pub core_voltage_corner_target: u32,
    pub core_voltage_corner_max: u32,
}

/// The value arms of `QnnHtpPerfInfrastructure_PowerConfig_t` this backend sets. The runtime
/// reads only the arm named by `option` through the pointer it is given, so the other (smaller)
/// arms need no mirror.
#[repr(C)]
#[derive(Clone, Copy)]
pub union PowerConfigValue {
    pub dcvs_v3: DcvsV3,
    pub raw: u32,
}

/// `QnnHtpPerfInfrastructure_PowerConfig_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PowerConfig {
    pub option: u32,
    pub value: PowerConfigValue,
}

/// A table slot we never call: only its size matters.
pub type Unused = Option<unsafe extern "C" fn()>;

/// The prefix of `QnnInterface_ImplementationV2_x_t` up to the last function this backend calls
/// (`errorGetMessage`, appended after the signal functions in later 2.x releases). Every slot is
/// nullable: a backend leaves what it does not support NULL.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CoreFunctions {
    pub property_has_capability: Unused,
    pub backend_create: Option<BackendCreateFn>,
    pub backend_set_config: Unused,
    pub backend_get_api_version: Option<BackendGetApiVersionFn>,
    pub backend_get_build_id: Option<BackendGetBuildIdFn>,
    pub backend_register_op_package: Unused,
    pub backend_get_supported_operations: Unused,
    pub backend_validate_op_config: Unused,
    pub backend_free: Option<BackendFreeFn>,
    pub context_create: Unused,
    pub context_set_config: Unused,
    pub context_get_binary_size: Unused,
    pub context_get_binary: Unused,
    pub context_create_from_binary: Option<ContextCreateFromBinaryFn>,
    pub context_free: Option<ContextFreeFn>,
    pub graph_create: Unused,
    pub graph_create_subgraph: Unused,
    pub graph_set_config: Unused,
    pub graph_add_node: Unused,
    pub graph_finalize: Unused,
    pub graph_retrieve: Option<GraphRetrieveFn>,
    pub graph_execute: Option<GraphExecuteFn>,
    pub graph_execute_async: Unused,
    pub tensor_create_context_tensor: Unused,
    pub tensor_create_graph_tensor: Unused,
    pub log_create: Option<LogCreateFn>,
    pub log_set_log_level: Unused,
    pub log_free: Option<LogFreeFn>,
    pub profile_create: Unused,
    pub profile_set_config: Unused,
    pub profile_get_events: Unused,
    pub profile_get_sub_events: Unused,
    pub profile_get_event_data: Unused,
    pub profile_get_extended_event_data: Unused,
    pub profile_free: Unused,
    pub mem_register: Unused,
    pub mem_de_register: Unused,
    pub device_get_platform_info: Unused,
    pub device_free_platform_info: Unused,
    pub device_get_infrastructure: Option<DeviceGetInfrastructureFn>,
    pub device_create: Option<DeviceCreateFn>,
    pub device_set_config: Unused,
    pub device_get_info: Unused,
    pub device_free: Option<DeviceFreeFn>,
    pub signal_create: Option<SignalCreateFn>,
    pub signal_set_config: Unused,
    pub signal_trigger: Unused,
    pub signal_free: Option<SignalFreeFn>,
    pub error_get_message: Option<ErrorGetMessageFn>,
}

/// `QnnInterface_t`: one provider published by a backend library. We read it through the
/// pointer the library hands out, so only the prefix we use has to match.
#[repr(C)]
pub struct Interface {
    pub backend_id: u32,
    pub provider_name: *const c_char,
    pub api_version: ApiVersion,
    pub functions: CoreFunctions,
}

/// `QnnInterface_getProviders(const QnnInterface_t*** providerList, uint32_t* numProviders)`.
pub type GetProvidersFn = unsafe extern "C" fn(providers: *mut *const *const Interface, count: *mut u32) -> ErrorHandle;
/// The exported symbol of a core backend library.
pub const GET_PROVIDERS: &[u8] = b"QnnInterface_getProviders\0";

// ---------------------------------------------------------------------------------------------
// System library (libQnnSystem.so).
// ---------------------------------------------------------------------------------------------

pub type SystemContextCreateFn = unsafe extern "C" fn(handle: *mut Handle) -> ErrorHandle;
/// `QnnSystemContext_getBinaryInfo(handle, void* buffer, uint64_t size, const BinaryInfo** info, Qnn_ContextBinarySize_t* infoSize)`.
pub type SystemContextGetBinaryInfoFn = unsafe extern "C" fn(
    handle: Handle,
    buffer: *mut c_void,
    size: u64,
    info: *mut *const BinaryInfo,
    info_size: *mut u64,
) -> ErrorHandle;
pub type SystemContextFreeFn = unsafe extern "C" fn(handle: Handle) -> ErrorHandle;

/// The prefix of `QnnSystemInterface_ImplementationV1_x_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SystemFunctions {
    pub system_context_create: Option<SystemContextCreateFn>,
    pub system_context_get_binary_info: Option<SystemContextGetBinaryInfoFn>,
    pub system_context_get_metadata: Unused,
    pub system_context_free: Option<SystemContextFreeFn>,
}

/// `QnnSystemInterface_t`.
#[repr(C)]
pub struct SystemInterface {
    pub backend_id: u32,
    pub provider_name: *const c_char,
    pub system_api_version: Version,
    pub functions: SystemFunctions,
}

pub type GetSystemProvidersFn =
    unsafe extern "C" fn(providers: *mut *const *const SystemInterface, count: *mut u32) -> ErrorHandle;
pub const GET_SYSTEM_PROVIDERS: &[u8] = b"QnnSystemInterface_getProviders\0";

// ---------------------------------------------------------------------------------------------
// Tensors.
// ---------------------------------------------------------------------------------------------

/// `Qnn_DataType_t` values we handle (the low byte is the bit width in hex).
pub mod data_type {
    pub const FLOAT_16: u32 = 0x0216;
    pub const FLOAT_32: u32 = 0x0232;
    pub const UFIXED_POINT_8: u32 = 0x0408;
    pub const UFIXED_POINT_16: u32 = 0x0416;
    pub const SFIXED_POINT_16: u32 = 0x0316;
}

/// `Qnn_TensorType_t`.
pub mod tensor_type {
    pub const APP_WRITE: u32 = 0;
    pub const APP_READ: u32 = 1;
}

/// `Qnn_TensorMemType_t`: `QNN_TENSORMEMTYPE_RAW`, a client buffer.
pub const TENSORMEMTYPE_RAW: u32 = 0;
/// `QNN_TENSOR_VERSION_1` / `_2`.
pub const TENSOR_VERSION_1: u32 = 1;
pub const TENSOR_VERSION_2: u32 = 2;
/// `Qnn_Definition_t::QNN_DEFINITION_DEFINED`.
pub const DEFINITION_DEFINED: u32 = 1;
/// `Qnn_QuantizationEncoding_t`: `QNN_QUANTIZATION_ENCODING_SCALE_OFFSET`, `..._BW_SCALE_OFFSET`.
pub const ENCODING_SCALE_OFFSET: u32 = 0;
pub const ENCODING_BW_SCALE_OFFSET: u32 = 2;

/// `Qnn_ScaleOffset_t`: `float = (q + offset) * scale`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScaleOffset {
    pub scale: f32,
    pub offset: i32,
}

/// `Qnn_BwScaleOffset_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwScaleOffset {
    pub bitwidth: u32,
    pub scale: f32,
    pub offset: i32,
}

/// The union inside `Qnn_QuantizeParams_t`. Its largest member is `Qnn_BwAxisScaleOffset_t`
/// (bitwidth, axis, count, two pointers: 32 bytes); the others (axis scale/offset, block
/// encodings, pointers to expansion/vector encodings) fit in it.
#[repr(C)]
#[derive(Clone, Copy)]
pub union QuantizeEncoding {
    pub scale_offset: ScaleOffset,
    pub bw_scale_offset: BwScaleOffset,
    pub raw: [u64; 4],
}

/// `Qnn_QuantizeParams_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QuantizeParams {
    pub encoding_definition: u32,
    pub quantization_encoding: u32,
    pub encoding: QuantizeEncoding,
}

/// `Qnn_ClientBuffer_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ClientBuffer {
    pub data: *mut c_void,
    pub data_size: u32,
}

/// `Qnn_TensorV1_t` followed by the V2 additions (`isDynamicDimensions`, `sparseParams`,
/// `isProduced`). A V1 tensor only uses the prefix; the union of both is as large as V2.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TensorV2 {
    pub id: u32,
    pub name: *const c_char,
    pub tensor_type: u32,
    pub data_format: u32,
    pub data_type: u32,
    pub quantize_params: QuantizeParams,
    pub rank: u32,
    pub dimensions: *mut u32,
    pub mem_type: u32,
    /// `clientBuf` (or, for other memory types, a handle in its first word).
    pub client_buf: ClientBuffer,
    pub is_dynamic_dimensions: *mut u8,
    /// `Qnn_SparseParams_t`: a type and the hybrid-COO pair.
    pub sparse_params: [u32; 3],
    pub is_produced: u8,
}

/// `Qnn_Tensor_t`: a version tag and the V1/V2 union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Tensor {
    pub version: u32,
    pub v: TensorV2,
}

// ---------------------------------------------------------------------------------------------
// Binary info (QnnSystemContext.h).
// ---------------------------------------------------------------------------------------------

/// `QnnSystemContext_GraphInfoV1_t` (V2 and V3 extend it; we read only this prefix).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphInfoV1 {
    pub graph_name: *const c_char,
    pub num_graph_inputs: u32,
    pub graph_inputs: *mut Tensor,
    pub num_graph_outputs: u32,
    pub graph_outputs: *mut Tensor,
}

/// `QnnSystemContext_GraphInfoV3_t`, the largest version: it fixes the array stride.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphInfoV3 {
    pub v1: GraphInfoV1,
    pub num_updateable_tensors: u32,
    pub updateable_tensors: *mut Tensor,
    pub graph_blob_info_size: u32,
    pub graph_blob_info: *mut c_void,
    pub start_op_index: u32,
    pub end_op_index: u32,
}

/// `QnnSystemContext_GraphInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphInfo {
    pub version: u32,
    pub info: GraphInfoV3,
}

/// The common prefix of every `QnnSystemContext_BinaryInfoV*_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BinaryInfoHead {
    pub backend_id: u32,
    pub build_id: *const c_char,
    pub core_api_version: Version,
    pub backend_api_version: Version,
    pub soc_version: *const c_char,
}

/// `QnnSystemContext_BinaryInfoV1_t` (V2 appends `platformInfo`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BinaryInfoV1 {
    pub head: BinaryInfoHead,
    pub hw_info_blob_version: Version,
    pub context_blob_version: Version,
    pub hw_info_blob_size: u32,
    pub hw_info_blob: *mut c_void,
    pub context_blob_size: u64,
    pub num_context_tensors: u32,
    pub context_tensors: *mut Tensor,
    pub num_graphs: u32,
    pub graphs: *mut GraphInfo,
}

/// `QnnSystemContext_BinaryInfoV3_t` (what QNN 2.51 returns): no hardware-info blob.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BinaryInfoV3 {
    pub head: BinaryInfoHead,
    pub context_blob_version: Version,
    pub context_blob_size: u64,
    pub num_context_tensors: u32,
    pub context_tensors: *mut Tensor,
    pub num_graphs: u32,
    pub graphs: *mut GraphInfo,
    pub platform_info: *mut c_void,
    pub context_metadata_size: u32,
    pub context_metadata: *mut c_void,
    pub soc_model: u32,
}

/// The version-tagged union `QnnSystemContext_BinaryInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union BinaryInfoUnion {
    pub v1: BinaryInfoV1,
    pub v3: BinaryInfoV3,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BinaryInfo {
    pub version: u32,
    pub info: BinaryInfoUnion,
}

// ---------------------------------------------------------------------------------------------
// Signals.
// ---------------------------------------------------------------------------------------------

/// `QnnSignal_ConfigOption_t::QNN_SIGNAL_CONFIG_OPTION_TIMEOUT`.
pub const SIGNAL_CONFIG_OPTION_TIMEOUT: u32 = 2;

/// `QnnSignal_Config_t` with the timeout member of its union.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SignalConfig {
    pub option: u32,
    pub timeout_us: u64,
}

/// `QnnLog_Level_t::QNN_LOG_LEVEL_WARN`.
pub const LOG_LEVEL_WARN: u32 = 2;

// ---------------------------------------------------------------------------------------------
// Layout assertions (x86-64 and aarch64 LP64: 8-byte pointers).
// ---------------------------------------------------------------------------------------------

const _: () = {
    assert!(size_of::<*const c_void>() == 8, "the mirror describes LP64 targets");
    assert!(size_of::<Version>() == 12);
    assert!(size_of::<ApiVersion>() == 24);
    assert!(offset_of!(Interface, provider_name) == 8);
    assert!(offset_of!(Interface, api_version) == 16);
    assert!(offset_of!(Interface, functions) == 40);
    assert!(offset_of!(CoreFunctions, backend_create) == 8);
    assert!(offset_of!(CoreFunctions, backend_get_build_id) == 4 * 8);
    assert!(offset_of!(CoreFunctions, backend_free) == 8 * 8);
    assert!(offset_of!(CoreFunctions, context_create_from_binary) == 13 * 8);
    assert!(offset_of!(CoreFunctions, context_free) == 14 * 8);
    assert!(offset_of!(CoreFunctions, graph_retrieve) == 20 * 8);
    assert!(offset_of!(CoreFunctions, graph_execute) == 21 * 8);
    assert!(offset_of!(CoreFunctions, log_create) == 25 * 8);
    assert!(offset_of!(CoreFunctions, log_free) == 27 * 8);
    assert!(offset_of!(CoreFunctions, device_create) == 40 * 8);
    assert!(offset_of!(CoreFunctions, device_free) == 43 * 8);
    assert!(offset_of!(CoreFunctions, signal_create) == 44 * 8);
    assert!(offset_of!(CoreFunctions, signal_free) == 47 * 8);
    assert!(offset_of!(CoreFunctions, error_get_message) == 48 * 8);
    assert!(offset_of!(SystemInterface, system_api_version) == 16);
    assert!(offset_of!(SystemInterface, functions) == 32);
    assert!(offset_of!(SystemFunctions, system_context_free) == 24);
    assert!(size_of::<ScaleOffset>() == 8);
    assert!(size_of::<QuantizeEncoding>() == 32);
    assert!(size_of::<QuantizeParams>() == 40);
    assert!(offset_of!(QuantizeParams, encoding) == 8);
    assert!(size_of::<ClientBuffer>() == 16);
    assert!(offset_of!(TensorV2, name) == 8);
    assert!(offset_of!(TensorV2, tensor_type) == 16);
    assert!(offset_of!(TensorV2, data_type) == 24);
    assert!(offset_of!(TensorV2, quantize_params) == 32);
    assert!(offset_of!(TensorV2, rank) == 72);
    assert!(offset_of!(TensorV2, dimensions) == 80);
    assert!(offset_of!(TensorV2, mem_type) == 88);
    assert!(offset_of!(TensorV2, client_buf) == 96);
    assert!(offset_of!(TensorV2, is_dynamic_dimensions) == 112);
    assert!(offset_of!(TensorV2, sparse_params) == 120);
    assert!(offset_of!(TensorV2, is_produced) == 132);
    assert!(size_of::<TensorV2>() == 136);
    assert!(offset_of!(Tensor, v) == 8);
    assert!(size_of::<Tensor>() == 144);
    assert!(size_of::<GraphInfoV1>() == 40);
    assert!(size_of::<GraphInfoV3>() == 80);
    assert!(size_of::<GraphInfo>() == 88);
    assert!(size_of::<BinaryInfoHead>() == 48);
    assert!(offset_of!(BinaryInfoV1, context_blob_size) == 88);
    assert!(offset_of!(BinaryInfoV1, num_graphs) == 112);
    assert!(offset_of!(BinaryInfoV1, graphs) == 120);
    assert!(offset_of!(BinaryInfoV3, context_blob_version) == 48);
    assert!(offset_of!(BinaryInfoV3, context_blob_size) == 64);
    assert!(offset_of!(BinaryInfoV3, num_context_tensors) == 72);
    assert!(offset_of!(BinaryInfoV3, num_graphs) == 88);
    assert!(offset_of!(BinaryInfoV3, graphs) == 96);
    assert!(size_of::<BinaryInfoV3>() == 136);
    assert!(offset_of!(BinaryInfo, info) == 8);
    assert!(size_of::<SignalConfig>() == 16);
    assert!(offset_of!(CoreFunctions, device_get_infrastructure) == 39 * 8);
    assert!(size_of::<HtpPerfInfrastructure>() == 32);
    assert!(offset_of!(HtpDeviceInfrastructure, perf) == 8);
    assert!(size_of::<HtpDeviceInfrastructure>() == 40);
    assert!(size_of::<DcvsV3>() == 64);
    assert!(offset_of!(DcvsV3, sleep_latency) == 20);
    assert!(offset_of!(DcvsV3, bus_voltage_corner_min) == 36);
    assert!(offset_of!(DcvsV3, core_voltage_corner_max) == 60);
    assert!(offset_of!(PowerConfig, value) == 4);
    assert!(size_of::<PowerConfig>() == 68);
};

impl TensorV2 {
    /// An all-zero tensor body (null pointers, V1 defaults).
    pub fn zeroed() -> TensorV2 {
        TensorV2 {
            id: 0,
            name: std::ptr::null(),
            tensor_type: 0,
            data_format: 0,
            data_type: 0,
            quantize_params: QuantizeParams {
                encoding_definition: 0,
                quantization_encoding: 0,
                encoding: QuantizeEncoding { raw: [0; 4] },
            },
            rank: 0,
            dimensions: std::ptr::null_mut(),
            mem_type: TENSORMEMTYPE_RAW,
            client_buf: ClientBuffer { data: std::ptr::null_mut(), data_size: 0 },
            is_dynamic_dimensions: std::ptr::null_mut(),
            sparse_params: [0; 3],
            is_produced: 0,
        }
    }
}
