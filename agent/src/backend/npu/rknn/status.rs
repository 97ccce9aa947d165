//! Names for librknnrt's return codes, and which of them the watchdog must act on.
//!
//! The runtime reports every failure as a bare negative integer. A log line that says
//! `RKNN_ERR_TIMEOUT (-2): the NPU did not finish the job in time` is actionable where `-2` is not,
//! so every code the public error table documents (see `abi.rs` for the sources) gets a name and a
//! meaning here, and unknown codes keep their number.

use std::fmt;

use super::abi;

/// A failed call's return code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Fail,
    Timeout,
    DeviceUnavailable,
    MallocFail,
    ParamInvalid,
    ModelInvalid,
    ContextInvalid,
    InputInvalid,
    OutputInvalid,
    DeviceUnmatch,
    IncompatiblePreCompileModel,
    IncompatibleOptimizationLevelVersion,
    TargetPlatformUnmatch,
    NonPreCompiledModelOnMiniDriver,
    /// A code the documentation does not list.
    Unknown(i32),
}

impl Status {
    /// `Ok(())` for `RKNN_SUCC`, the named failure otherwise.
    pub fn check(code: i32) -> Result<(), Status> {
        if code == abi::RKNN_SUCC { Ok(()) } else { Err(Status::from_code(code)) }
    }

    /// The failure a non-zero code stands for.
    pub fn from_code(code: i32) -> Status {
        match code {
            abi::RKNN_ERR_FAIL => Status::Fail,
            abi::RKNN_ERR_TIMEOUT => Status::Timeout,
            abi::RKNN_ERR_DEVICE_UNAVAILABLE => Status::DeviceUnavailable,
            abi::RKNN_ERR_MALLOC_FAIL => Status::MallocFail,
            abi::RKNN_ERR_PARAM_INVALID => Status::ParamInvalid,
            abi::RKNN_ERR_MODEL_INVALID => Status::ModelInvalid,
            abi::RKNN_ERR_CTX_INVALID => Status::ContextInvalid,
            abi::RKNN_ERR_INPUT_INVALID => Status::InputInvalid,
            abi::RKNN_ERR_OUTPUT_INVALID => Status::OutputInvalid,
            abi::RKNN_ERR_DEVICE_UNMATCH => Status::DeviceUnmatch,
            abi::RKNN_ERR_INCOMPATIBLE_PRE_COMPILE_MODEL => Status::IncompatiblePreCompileModel,
            abi::RKNN_ERR_INCOMPATIBLE_OPTIMIZATION_LEVEL_VERSION => Status::IncompatibleOptimizationLevelVersion,
            abi::RKNN_ERR_TARGET_PLATFORM_UNMATCH => Status::TargetPlatformUnmatch,
            abi::RKNN_ERR_NON_PRE_COMPILED_MODEL_ON_MINI_DRIVER => Status::NonPreCompiledModelOnMiniDriver,
            other => Status::Unknown(other),
        }
    }

    /// The numeric code.
    pub fn code(self) -> i32 {
        match self {
            Status::Fail => abi::RKNN_ERR_FAIL,
            Status::Timeout => abi::RKNN_ERR_TIMEOUT,
            Status::DeviceUnavailable => abi::RKNN_ERR_DEVICE_UNAVAILABLE,
            Status::MallocFail => abi::RKNN_ERR_MALLOC_FAIL,
            Status::ParamInvalid => abi::RKNN_ERR_PARAM_INVALID,
            Status::ModelInvalid => abi::RKNN_ERR_MODEL_INVALID,
            Status::ContextInvalid => abi::RKNN_ERR_CTX_INVALID,
            Status::InputInvalid => abi::RKNN_ERR_INPUT_INVALID,
            Status::OutputInvalid => abi::RKNN_ERR_OUTPUT_INVALID,
            Status::DeviceUnmatch => abi::RKNN_ERR_DEVICE_UNMATCH,
            Status::IncompatiblePreCompileModel => abi::RKNN_ERR_INCOMPATIBLE_PRE_COMPILE_MODEL,
            Status::IncompatibleOptimizationLevelVersion => abi::RKNN_ERR_INCOMPATIBLE_OPTIMIZATION_LEVEL_VERSION,
            Status::TargetPlatformUnmatch => abi::RKNN_ERR_TARGET_PLATFORM_UNMATCH,
            Status::NonPreCompiledModelOnMiniDriver => abi::RKNN_ERR_NON_PRE_COMPILED_MODEL_ON_MINI_DRIVER,
            Status::Unknown(code) => code,
        }
    }

    /// The runtime's name for the code (with its spelling: two names say "INCOMPATILE").
    pub fn name(self) -> &'static str {
        match self {
            Status::Fail => "RKNN_ERR_FAIL",
            Status::Timeout => "RKNN_ERR_TIMEOUT",
            Status::DeviceUnavailable => "RKNN_ERR_DEVICE_UNAVAILABLE",
            Status::MallocFail => "RKNN_ERR_MALLOC_FAIL",
            Status::ParamInvalid => "RKNN_ERR_PARAM_INVALID",
            Status::ModelInvalid => "RKNN_ERR_MODEL_INVALID",
            Status::ContextInvalid => "RKNN_ERR_CTX_INVALID",
            Status::InputInvalid => "RKNN_ERR_INPUT_INVALID",
            Status::OutputInvalid => "RKNN_ERR_OUTPUT_INVALID",
            Status::DeviceUnmatch => "RKNN_ERR_DEVICE_UNMATCH",
            Status::IncompatiblePreCompileModel => "RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL",
            Status::IncompatibleOptimizationLevelVersion => "RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION",
            Status::TargetPlatformUnmatch => "RKNN_ERR_TARGET_PLATFORM_UNMATCH",
            Status::NonPreCompiledModelOnMiniDriver => "RKNN_ERR_NON_PRE_COMPILED_MODEL_ON_MINI_DRIVER",
            Status::Unknown(_) => "an undocumented RKNN error",
        }
    }

    /// What the code means, in our words.
    pub fn meaning(self) -> &'static str {
        match self {
            Status::Fail => "the call failed (after rknn_run on the RK3588: the NPU driver's job timed out)",
            Status::Timeout => "the NPU did not finish the job in time",
            Status::DeviceUnavailable => "the NPU device is unavailable",
            Status::MallocFail => "the runtime could not allocate memory",
            Status::ParamInvalid => "a parameter was invalid",
            Status::ModelInvalid => "the graph file is not a valid RKNN model",
            Status::ContextInvalid => "the context is invalid",
            Status::InputInvalid => "an input was invalid",
            Status::OutputInvalid => "an output was invalid",
            Status::DeviceUnmatch => "the runtime and the NPU driver/firmware do not match",
            Status::IncompatiblePreCompileModel => "the pre-compiled graph does not fit this driver",
            Status::IncompatibleOptimizationLevelVersion => "the graph's optimization level does not fit this driver",
            Status::TargetPlatformUnmatch => "the graph was built for another platform",
            Status::NonPreCompiledModelOnMiniDriver => "a graph that is not pre-compiled on a mini driver",
            Status::Unknown(_) => "the runtime returned a code the documentation does not list",
        }
    }

    /// Whether the runtime is stuck or lost the job, so that only restarting the worker process
    /// (the watchdog's path) can recover: `RKNN_ERR_TIMEOUT`, and `RKNN_ERR_FAIL` after a run,
    /// which is how librknnrt reports a driver job timeout on the RK3588.
    pub fn is_hang(self, after_run: bool) -> bool {
        matches!(self, Status::Timeout) || (after_run && matches!(self, Status::Fail))
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.name(), self.code(), self.meaning())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_code_round_trips_through_its_name() {
        for code in -14..=-1 {
            let s = Status::from_code(code);
            assert!(!matches!(s, Status::Unknown(_)), "{code}");
            assert_eq!(s.code(), code);
            assert!(s.to_string().starts_with(&format!("{} ({code})", s.name())));
        }
        assert_eq!(Status::from_code(-99), Status::Unknown(-99));
        assert_eq!(Status::check(0), Ok(()));
        assert_eq!(Status::check(-2), Err(Status::Timeout));
    }

    #[test]
    fn timeouts_and_a_failed_run_are_hangs_but_a_failed_init_is_not() {
        assert!(Status::Timeout.is_hang(false));
        assert!(Status::Fail.is_hang(true));
        assert!(!Status::Fail.is_hang(false));
        assert!(!Status::InputInvalid.is_hang(true));
    }
}
