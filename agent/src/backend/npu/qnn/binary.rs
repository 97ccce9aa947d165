//! Reading a context binary's graphs and I/O tensors (names, dims, data types, scale/offset)
//! through libQnnSystem, before the binary is handed to the backend.
//!
//! `QnnSystemContext_getBinaryInfo` returns memory owned by the system context, so everything is
//! copied into owned [`GraphMeta`]/[`TensorMeta`] values and the system context is freed at once.
//! The walk checks what it reads (struct versions, one graph, ranks 1..=8, non-empty names)
//! before trusting a pointer: a mismatched layout shows up as an error, not as garbage.

use std::ffi::{CStr, c_char};

use super::QnnError;
use super::abi::{self, SystemFunctions};
use super::status::Status;

/// How a tensor's values are stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Encoding {
    /// IEEE float32, passed as is.
    Float32,
    /// IEEE float16.
    Float16,
    /// `UFIXED_POINT_16` with `float = (q + offset) * scale`.
    Ufixed16 { scale: f32, offset: i32 },
}

impl Encoding {
    pub fn bytes_per_element(self) -> usize {
        match self {
            Encoding::Float32 => 4,
            Encoding::Float16 | Encoding::Ufixed16 { .. } => 2,
        }
    }
}

/// One graph input or output as the binary describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorMeta {
    pub id: u32,
    pub name: String,
    pub tensor_type: u32,
    pub data_type: u32,
    pub dims: Vec<u32>,
    pub encoding: Encoding,
    /// The tensor struct version the binary used (1 or 2), kept for execution.
    pub version: u32,
    /// `dataFormat` as read (flat buffer, 0, for every tensor we run).
    pub data_format: u32,
    /// The raw quantization parameters, passed back unchanged at execution.
    pub quantize_params: abi::QuantizeParams,
}

impl TensorMeta {
    pub fn elements(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
}

/// A graph of the binary.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphMeta {
    pub name: String,
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<TensorMeta>,
}

/// What the binary says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryMeta {
    pub binary_info_version: u32,
    pub backend_id: u32,
    pub build_id: String,
    pub core_api: abi::Version,
    pub backend_api: abi::Version,
    pub soc_version: Option<String>,
    pub graph: GraphMeta,
}

impl std::fmt::Debug for abi::QuantizeParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantizeParams({}, {})", self.encoding_definition, self.quantization_encoding)
    }
}

impl PartialEq for abi::QuantizeParams {
    fn eq(&self, other: &Self) -> bool {
        // SAFETY: every member of the union is plain data; `raw` covers all of it.
        self.encoding_definition == other.encoding_definition
            && self.quantization_encoding == other.quantization_encoding
            && unsafe { self.encoding.raw == other.encoding.raw }
    }
}

fn bad(message: impl Into<String>) -> QnnError {
    QnnError::BinaryLayout(message.into())
}

/// Copies a C string that the runtime guarantees NUL-terminated, refusing NULL and empty names.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string valid for the call.
unsafe fn name(p: *const c_char, what: &str) -> Result<String, QnnError> {
    if p.is_null() {
        return Err(bad(format!("{what}: NULL name")));
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    if s.is_empty() || s.len() > 4096 {
        return Err(bad(format!("{what}: implausible name of {} bytes", s.len())));
    }
    Ok(s)
}

/// Copies one tensor description.
///
/// # Safety
/// `t` must point to a `Qnn_Tensor_t` owned by a live system context.
unsafe fn tensor(t: *const abi::Tensor, what: &str) -> Result<TensorMeta, QnnError> {
    // SAFETY: per the caller's contract.
    let t = unsafe { &*t };
    if t.version != abi::TENSOR_VERSION_1 && t.version != abi::TENSOR_VERSION_2 {
        return Err(bad(format!("{what}: Qnn_Tensor_t version {} (expected 1 or 2)", t.version)));
    }
    let v = &t.v;
    // SAFETY: the name pointer belongs to the same system context.
    let name = unsafe { name(v.name, what)? };
    if !(1..=8).contains(&v.rank) || v.dimensions.is_null() {
        return Err(bad(format!("{what} '{name}': rank {} is implausible", v.rank)));
    }
    // SAFETY: `dimensions` holds `rank` values (checked non-null and 1..=8 above).
    let dims = unsafe { std::slice::from_raw_parts(v.dimensions, v.rank as usize) }.to_vec();
    if dims.iter().any(|&d| d == 0 || d > 1 << 24) {
        return Err(bad(format!("{what} '{name}': dims {dims:?} are implausible")));
    }
    let q = v.quantize_params;
    let encoding = match v.data_type {
        abi::data_type::FLOAT_32 => Encoding::Float32,
        abi::data_type::FLOAT_16 => Encoding::Float16,
        abi::data_type::UFIXED_POINT_16 => {
            if q.encoding_definition != abi::DEFINITION_DEFINED {
                return Err(QnnError::UnsupportedTensor {
                    name,
                    reason: "UFIXED_POINT_16 without defined quantization".into(),
                });
            }
            let (scale, offset) = match q.quantization_encoding {
                // SAFETY: the encoding tag selects the union member; both members are plain data.
                abi::ENCODING_SCALE_OFFSET => unsafe {
                    (q.encoding.scale_offset.scale, q.encoding.scale_offset.offset)
                },
                // SAFETY: as above, the tag says this member is the one written.
                abi::ENCODING_BW_SCALE_OFFSET => unsafe {
                    (q.encoding.bw_scale_offset.scale, q.encoding.bw_scale_offset.offset)
                },
                other => {
                    return Err(QnnError::UnsupportedTensor {
                        name,
                        reason: format!("quantization encoding {other} (per-axis I/O)"),
                    });
                }
            };
            if !(scale.is_finite() && scale > 0.0) {
                return Err(bad(format!("{what} '{name}': scale {scale} is implausible")));
            }
            Encoding::Ufixed16 { scale, offset }
        }
        other => return Err(QnnError::UnsupportedTensor { name, reason: format!("data type {other:#x}") }),
    };
    Ok(TensorMeta {
        id: v.id,
        name,
        tensor_type: v.tensor_type,
        data_type: v.data_type,
        dims,
        encoding,
        version: t.version,
        data_format: v.data_format,
        quantize_params: q,
    })
}

/// Reads `binary` through the system library.
pub fn read(system: &SystemFunctions, binary: &[u8]) -> Result<BinaryMeta, QnnError> {
    let create = system.system_context_create.ok_or(QnnError::MissingFunction("systemContextCreate"))?;
    let get_info =
        system.system_context_get_binary_info.ok_or(QnnError::MissingFunction("systemContextGetBinaryInfo"))?;
    let mut handle: abi::Handle = std::ptr::null_mut();
    // SAFETY: out-parameter.
    let rc = unsafe { create(&mut handle) };
    if rc != abi::SUCCESS {
        return Err(QnnError::Call { call: "systemContextCreate", status: Status::from_handle(rc) });
    }
    // The API takes a mutable buffer; give it a private copy rather than the caller's bytes.
    let mut buffer = binary.to_vec();
    let mut info: *const abi::BinaryInfo = std::ptr::null();
    let mut info_size = 0u64;
    // SAFETY: `buffer` is valid for its length for the call; `info` and `info_size` are
    // out-parameters; the returned memory lives until `systemContextFree`.
    let rc = unsafe { get_info(handle, buffer.as_mut_ptr().cast(), buffer.len() as u64, &mut info, &mut info_size) };
    let result = if rc != abi::SUCCESS {
        Err(QnnError::Call { call: "systemContextGetBinaryInfo", status: Status::from_handle(rc) })
    } else if info.is_null() {
        Err(bad("systemContextGetBinaryInfo returned NULL"))
    } else {
        // SAFETY: non-null, owned by the live system context.
        unsafe { walk(&*info) }
    };
    if let Some(free) = system.system_context_free {
        // SAFETY: created above, freed once; nothing borrowed from it survives (`walk` copies).
        unsafe { free(handle) };
    }
    drop(buffer);
    result
}

/// # Safety
/// `info` and everything it points to must belong to a live system context.
unsafe fn walk(info: &abi::BinaryInfo) -> Result<BinaryMeta, QnnError> {
    let (head, num_graphs, graphs) = match info.version {
        // SAFETY: the version tag selects the union member; V1 and V2 share the V1 prefix.
        1 | 2 => unsafe { (info.info.v1.head, info.info.v1.num_graphs, info.info.v1.graphs) },
        // SAFETY: version 3 says the V3 member is the one written.
        3 => unsafe { (info.info.v3.head, info.info.v3.num_graphs, info.info.v3.graphs) },
        v => return Err(bad(format!("QnnSystemContext_BinaryInfo_t version {v} is not one of 1, 2, 3"))),
    };
    if num_graphs != 1 || graphs.is_null() {
        return Err(QnnError::GraphCount(num_graphs));
    }
    // SAFETY: one graph, non-null.
    let g = unsafe { &*graphs };
    if !(1..=3).contains(&g.version) {
        return Err(bad(format!("QnnSystemContext_GraphInfo_t version {} is not one of 1, 2, 3", g.version)));
    }
    let v1 = g.info.v1;
    // SAFETY: strings and arrays below belong to the same system context.
    let graph_name = unsafe { name(v1.graph_name, "graph")? };
    let count_ok = |n: u32| (1..=64).contains(&n);
    if !count_ok(v1.num_graph_inputs)
        || !count_ok(v1.num_graph_outputs)
        || v1.graph_inputs.is_null()
        || v1.graph_outputs.is_null()
    {
        return Err(bad(format!(
            "graph '{graph_name}': {} inputs, {} outputs",
            v1.num_graph_inputs, v1.num_graph_outputs
        )));
    }
    let inputs = (0..v1.num_graph_inputs as usize)
        // SAFETY: `graphInputs` holds `numGraphInputs` tensors (stride: the union's size).
        .map(|i| unsafe { tensor(v1.graph_inputs.add(i), "input") })
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = (0..v1.num_graph_outputs as usize)
        // SAFETY: as above, for the outputs.
        .map(|i| unsafe { tensor(v1.graph_outputs.add(i), "output") })
        .collect::<Result<Vec<_>, _>>()?;
    let opt = |p: *const c_char| -> Option<String> {
        // SAFETY: NULL or a NUL-terminated string of the system context.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    Ok(BinaryMeta {
        binary_info_version: info.version,
        backend_id: head.backend_id,
        build_id: opt(head.build_id).unwrap_or_default(),
        core_api: head.core_api_version,
        backend_api: head.backend_api_version,
        soc_version: opt(head.soc_version),
        graph: GraphMeta { name: graph_name, inputs, outputs },
    })
}
