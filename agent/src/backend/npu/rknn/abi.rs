//! The part of librknnrt's C interface that laya-edge calls, restated in Rust.
//!
//! Rockchip's header is proprietary, so nothing here is copied from it: every type below is
//! written from the public documentation of the C API and checked at compile time against the
//! layout that documentation implies (the `const _: () = assert!(..)` blocks). Sources:
//!
//! - Rockchip, *RKNN SDK User Guide* (`Rockchip_RKNPU_User_Guide_RKNN_SDK_V2.3.2_EN.pdf`, in the
//!   `doc/` folder of the public rknn-toolkit2 repository), chapter "RKNN C API": the functions
//!   `rknn_init`, `rknn_dup_context`, `rknn_query`, `rknn_set_core_mask`, `rknn_inputs_set`, `rknn_run`,
//!   `rknn_outputs_get`, `rknn_outputs_release`, `rknn_destroy`, the structures
//!   `rknn_input_output_num`, `rknn_tensor_attr`, `rknn_input`, `rknn_output`,
//!   `rknn_sdk_version`, and the error-code table.
//! - The public API reference as rendered on docs.rs by the `rknpu2-sys` 0.0.2 crate
//!   (`rknpu2_sys::api`), used to cross-check the numeric values of the constants.
//!
//! **`rknn_context`** is an integer handle whose width depends on the target: the API reference
//! defines it as a 32-bit unsigned integer when compiled for 32-bit ARM (`__arm__`) and as a
//! 64-bit unsigned integer on every other target, so it is `u64` on the RK3588 (aarch64) and on
//! the x86-64 machines that run the fake runtime in tests. (`rknn-runtime`, a crate for the
//! 32-bit RV1106, uses `u32`, consistent with that rule.)
//!
//! C enums (`rknn_query_cmd`, `rknn_tensor_type`, ...) are passed as `u32` with named constants:
//! a Rust `enum` would be undefined behaviour for a value the runtime adds in a later version.
//!
//! This file is also compiled into `tests/fake-rknn` through `#[path]`, so the fake runtime and
//! the backend share one asserted layout: keep it free of `crate::`/`super::` paths.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

/// The runtime's handle of one loaded graph.
#[cfg(target_arch = "arm")]
pub type RknnContext = u32;
/// The runtime's handle of one loaded graph.
#[cfg(not(target_arch = "arm"))]
pub type RknnContext = u64;

#[cfg(target_arch = "arm")]
const _: () = assert!(size_of::<RknnContext>() == 4);
#[cfg(not(target_arch = "arm"))]
const _: () = assert!(size_of::<RknnContext>() == 8);

/// Longest shape a tensor attribute can describe.
pub const MAX_DIMS: usize = 16;
/// Size of a tensor name field, terminating NUL included.
pub const MAX_NAME_LEN: usize = 256;
/// Size of each version string field of [`SdkVersion`].
pub const VERSION_LEN: usize = 256;

// Return codes. 0 is success; failures are negative. The names are the runtime's own (the
// header spells two of them "INCOMPATILE"); `super::status::Status` gives them meanings.
pub const RKNN_SUCC: c_int = 0;
pub const RKNN_ERR_FAIL: c_int = -1;
pub const RKNN_ERR_TIMEOUT: c_int = -2;
pub const RKNN_ERR_DEVICE_UNAVAILABLE: c_int = -3;
pub const RKNN_ERR_MALLOC_FAIL: c_int = -4;
pub const RKNN_ERR_PARAM_INVALID: c_int = -5;
pub const RKNN_ERR_MODEL_INVALID: c_int = -6;
pub const RKNN_ERR_CTX_INVALID: c_int = -7;
pub const RKNN_ERR_INPUT_INVALID: c_int = -8;
pub const RKNN_ERR_OUTPUT_INVALID: c_int = -9;
pub const RKNN_ERR_DEVICE_UNMATCH: c_int = -10;
pub const RKNN_ERR_INCOMPATIBLE_PRE_COMPILE_MODEL: c_int = -11;
pub const RKNN_ERR_INCOMPATIBLE_OPTIMIZATION_LEVEL_VERSION: c_int = -12;
pub const RKNN_ERR_TARGET_PLATFORM_UNMATCH: c_int = -13;
/// Documented for the first-generation NPU API; kept so the code gets a name if it ever appears.
pub const RKNN_ERR_NON_PRE_COMPILED_MODEL_ON_MINI_DRIVER: c_int = -14;

// `rknn_query` commands (the `cmd` argument).
pub const QUERY_IN_OUT_NUM: u32 = 0;
pub const QUERY_INPUT_ATTR: u32 = 1;
pub const QUERY_OUTPUT_ATTR: u32 = 2;
pub const QUERY_SDK_VERSION: u32 = 5;

// Tensor element types (`TensorAttr::type_`, `Input::type_`).
pub const TENSOR_FLOAT32: u32 = 0;
pub const TENSOR_FLOAT16: u32 = 1;
pub const TENSOR_INT8: u32 = 2;
pub const TENSOR_UINT8: u32 = 3;
pub const TENSOR_INT16: u32 = 4;
pub const TENSOR_UINT16: u32 = 5;
pub const TENSOR_INT32: u32 = 6;
pub const TENSOR_UINT32: u32 = 7;
pub const TENSOR_INT64: u32 = 8;
pub const TENSOR_BOOL: u32 = 9;
pub const TENSOR_INT4: u32 = 10;
pub const TENSOR_BFLOAT16: u32 = 11;

// Tensor layouts (`TensorAttr::fmt`, `Input::fmt`).
pub const FORMAT_NCHW: u32 = 0;
pub const FORMAT_NHWC: u32 = 1;
pub const FORMAT_NC1HWC2: u32 = 2;
pub const FORMAT_UNDEFINED: u32 = 3;

// Quantisation kinds (`TensorAttr::qnt_type`).
pub const QNT_NONE: u32 = 0;
pub const QNT_DFP: u32 = 1;
pub const QNT_AFFINE_ASYMMETRIC: u32 = 2;

// NPU core masks (`rknn_set_core_mask`): one bit per core of the RK3588's three, or 0xFFFF for
// "all cores the platform has".
pub const CORE_AUTO: u32 = 0;
pub const CORE_0: u32 = 1;
pub const CORE_1: u32 = 2;
pub const CORE_2: u32 = 4;
pub const CORE_0_1: u32 = 3;
pub const CORE_0_1_2: u32 = 7;
pub const CORE_ALL: u32 = 0xFFFF;

/// Answer to [`QUERY_IN_OUT_NUM`]: how many inputs and outputs the graph has.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputOutputNum {
    pub n_input: u32,
    pub n_output: u32,
}

const _: () = assert!(size_of::<InputOutputNum>() == 8);
const _: () = assert!(offset_of!(InputOutputNum, n_output) == 4);

/// Answer to [`QUERY_INPUT_ATTR`] / [`QUERY_OUTPUT_ATTR`]: one tensor's description. The caller
/// sets `index` before the query; the runtime fills in the rest.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TensorAttr {
    pub index: u32,
    pub n_dims: u32,
    pub dims: [u32; MAX_DIMS],
    /// NUL-terminated.
    pub name: [c_char; MAX_NAME_LEN],
    pub n_elems: u32,
    /// Bytes.
    pub size: u32,
    pub fmt: u32,
    pub type_: u32,
    pub qnt_type: u32,
    /// Fractional length of dynamic-fixed-point quantisation.
    pub fl: i8,
    /// Zero point of affine quantisation.
    pub zp: i32,
    /// Scale of affine quantisation.
    pub scale: f32,
    pub w_stride: u32,
    pub size_with_stride: u32,
    pub pass_through: u8,
    pub h_stride: u32,
}

const _: () = assert!(size_of::<TensorAttr>() == 376);
const _: () = assert!(offset_of!(TensorAttr, index) == 0);
const _: () = assert!(offset_of!(TensorAttr, n_dims) == 4);
const _: () = assert!(offset_of!(TensorAttr, dims) == 8);
const _: () = assert!(offset_of!(TensorAttr, name) == 72);
const _: () = assert!(offset_of!(TensorAttr, n_elems) == 328);
const _: () = assert!(offset_of!(TensorAttr, size) == 332);
const _: () = assert!(offset_of!(TensorAttr, fmt) == 336);
const _: () = assert!(offset_of!(TensorAttr, type_) == 340);
const _: () = assert!(offset_of!(TensorAttr, qnt_type) == 344);
const _: () = assert!(offset_of!(TensorAttr, fl) == 348);
const _: () = assert!(offset_of!(TensorAttr, zp) == 352);
const _: () = assert!(offset_of!(TensorAttr, scale) == 356);
const _: () = assert!(offset_of!(TensorAttr, w_stride) == 360);
const _: () = assert!(offset_of!(TensorAttr, size_with_stride) == 364);
const _: () = assert!(offset_of!(TensorAttr, pass_through) == 368);
const _: () = assert!(offset_of!(TensorAttr, h_stride) == 372);

impl TensorAttr {
    /// An all-zero attribute asking about tensor `index`.
    pub fn for_index(index: u32) -> TensorAttr {
        TensorAttr {
            index,
            n_dims: 0,
            dims: [0; MAX_DIMS],
            name: [0; MAX_NAME_LEN],
            n_elems: 0,
            size: 0,
            fmt: 0,
            type_: 0,
            qnt_type: 0,
            fl: 0,
            zp: 0,
            scale: 0.0,
            w_stride: 0,
            size_with_stride: 0,
            pass_through: 0,
            h_stride: 0,
        }
    }

    /// The tensor's name (up to the first NUL; lossy UTF-8).
    pub fn name(&self) -> String {
        c_chars_to_string(&self.name)
    }

    /// Writes `name`, cut to fit, NUL-terminated.
    pub fn set_name(&mut self, name: &str) {
        string_to_c_chars(name, &mut self.name);
    }

    /// The shape, `n_dims` entries (clamped to [`MAX_DIMS`]).
    pub fn shape(&self) -> &[u32] {
        &self.dims[..(self.n_dims as usize).min(MAX_DIMS)]
    }
}

/// Answer to [`QUERY_SDK_VERSION`]: the runtime library's and the kernel driver's versions, as
/// NUL-terminated text (librknnrt 2.3.2 reports e.g. `2.3.2 (<commit>@<date>)` and `0.9.8`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SdkVersion {
    pub api_version: [c_char; VERSION_LEN],
    pub drv_version: [c_char; VERSION_LEN],
}

const _: () = assert!(size_of::<SdkVersion>() == 512);
const _: () = assert!(offset_of!(SdkVersion, drv_version) == 256);

impl SdkVersion {
    pub fn zeroed() -> SdkVersion {
        SdkVersion { api_version: [0; VERSION_LEN], drv_version: [0; VERSION_LEN] }
    }

    pub fn api(&self) -> String {
        c_chars_to_string(&self.api_version)
    }

    pub fn driver(&self) -> String {
        c_chars_to_string(&self.drv_version)
    }
}

/// One input for `rknn_inputs_set`: a host buffer and how the runtime should read it. With
/// `pass_through` 0 the runtime converts from `type_`/`fmt` to what the graph wants.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Input {
    pub index: u32,
    pub buf: *mut c_void,
    /// Bytes in `buf`.
    pub size: u32,
    pub pass_through: u8,
    pub type_: u32,
    pub fmt: u32,
}

const _: () = assert!(offset_of!(Input, index) == 0);
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<Input>() == 32);
    assert!(offset_of!(Input, buf) == 8);
    assert!(offset_of!(Input, size) == 16);
    assert!(offset_of!(Input, pass_through) == 20);
    assert!(offset_of!(Input, type_) == 24);
    assert!(offset_of!(Input, fmt) == 28);
};
#[cfg(target_pointer_width = "32")]
const _: () = {
    assert!(size_of::<Input>() == 24);
    assert!(offset_of!(Input, buf) == 4);
    assert!(offset_of!(Input, size) == 8);
    assert!(offset_of!(Input, pass_through) == 12);
    assert!(offset_of!(Input, type_) == 16);
    assert!(offset_of!(Input, fmt) == 20);
};

/// One output for `rknn_outputs_get`. With `is_prealloc` 1 the runtime writes into the caller's
/// `buf` of `size` bytes; with `want_float` 1 it converts the tensor to `f32` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub want_float: u8,
    pub is_prealloc: u8,
    pub index: u32,
    pub buf: *mut c_void,
    /// Bytes in `buf`.
    pub size: u32,
}

const _: () = assert!(offset_of!(Output, want_float) == 0);
const _: () = assert!(offset_of!(Output, is_prealloc) == 1);
const _: () = assert!(offset_of!(Output, index) == 4);
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<Output>() == 24);
    assert!(offset_of!(Output, buf) == 8);
    assert!(offset_of!(Output, size) == 16);
};
#[cfg(target_pointer_width = "32")]
const _: () = {
    assert!(size_of::<Output>() == 16);
    assert!(offset_of!(Output, buf) == 8);
    assert!(offset_of!(Output, size) == 12);
};

// The functions, as pointer types for the symbols looked up in the loaded library. Every one
// returns a status code (`RKNN_SUCC` or a negative error). The `extend` arguments of init, run
// and outputs_get point to optional structures laya-edge never uses: it passes null, which the
// API documents as "no extension".

/// `rknn_init(context_out, model, size, flags, extend)`: loads a graph from `size` bytes at
/// `model` (a `size` of 0 would make `model` a file path instead; laya-edge always passes bytes).
pub type InitFn = unsafe extern "C" fn(*mut RknnContext, *mut c_void, u32, u32, *mut c_void) -> c_int;
/// `rknn_destroy(context)`.
pub type DestroyFn = unsafe extern "C" fn(RknnContext) -> c_int;
/// `rknn_query(context, cmd, info, info_size)`: fills the structure at `info`.
pub type QueryFn = unsafe extern "C" fn(RknnContext, u32, *mut c_void, u32) -> c_int;
/// `rknn_set_core_mask(context, mask)`.
pub type SetCoreMaskFn = unsafe extern "C" fn(RknnContext, u32) -> c_int;
/// `rknn_dup_context(context_in, context_out)`: a second context of the graph loaded in
/// `*context_in`, sharing its weights (the SDK guide, "rknn_dup_context": for running the same
/// model from several threads without loading it twice), written to `*context_out`. Both
/// arguments are pointers to handles. Each context has its own inputs, outputs and core mask
/// and is destroyed on its own with `rknn_destroy`. The signature is cross-checked with the
/// `rknpu2-sys` 0.0.2 reference (`rknn_dup_context: fn(*mut rknn_context, *mut rknn_context)
/// -> c_int`).
pub type DupContextFn = unsafe extern "C" fn(*mut RknnContext, *mut RknnContext) -> c_int;
/// `rknn_inputs_set(context, n_inputs, inputs)`: copies (and converts) the input buffers.
pub type InputsSetFn = unsafe extern "C" fn(RknnContext, u32, *mut Input) -> c_int;
/// `rknn_run(context, extend)`: runs the graph (blocking without an extension).
pub type RunFn = unsafe extern "C" fn(RknnContext, *mut c_void) -> c_int;
/// `rknn_outputs_get(context, n_outputs, outputs, extend)`.
pub type OutputsGetFn = unsafe extern "C" fn(RknnContext, u32, *mut Output, *mut c_void) -> c_int;
/// `rknn_outputs_release(context, n_outputs, outputs)`: gives back what outputs_get handed out.
pub type OutputsReleaseFn = unsafe extern "C" fn(RknnContext, u32, *mut Output) -> c_int;

/// Text up to the first NUL of a fixed C char array (the whole array if it has none).
pub fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Writes `s` into a fixed C char array, cut to leave room for the terminating NUL.
pub fn string_to_c_chars(s: &str, out: &mut [c_char]) {
    out.fill(0);
    let n = s.len().min(out.len().saturating_sub(1));
    for (o, &b) in out.iter_mut().zip(&s.as_bytes()[..n]) {
        *o = b as c_char;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_fixed_arrays_and_are_cut_to_fit() {
        let mut a = TensorAttr::for_index(3);
        a.set_name("input_ids");
        assert_eq!(a.name(), "input_ids");
        a.set_name(&"x".repeat(400));
        assert_eq!(a.name().len(), MAX_NAME_LEN - 1);
    }
}
