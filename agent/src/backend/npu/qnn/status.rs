//! QNN error codes: their names, and what each one means for the supervisor.
//!
//! Codes come from the public error-code reference
//! (<https://docs.qualcomm.com/doc/80-63442-10/topic/api_error_codes.html>) and the component
//! headers' `Qnn*_Error_t` enums: common codes from 1000, graph codes from 6000, context codes from
//! 5000, signal codes from 9000.
//!
//! | class | codes | supervisor |
//! |---|---|---|
//! | subsystem restart, recovered | 1007 | [`BackendError::Transient`]: retry once |
//! | subsystem restart, not recovered | 1011 | fatal: restart the worker |
//! | binary does not fit this runtime/board | 5004, 5005, 5008 | fatal, "regenerate the context binary" |
//! | call timed out (QnnSignal) | 5013, 9004 | fatal (hung DSP) |
//! | anything else | | fatal with the code's name |

use crate::backend::BackendError;

use super::abi::{self, ErrorHandle};

/// What to tell the operator when a context binary does not fit the runtime or board.
pub const REGENERATE: &str = "regenerate the context binary for this QAIRT/board \
     (qnn-context-binary-generator from the bundle's DLC, see tools/qnn/README.md)";

/// A QNN error code with its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u64);

impl Status {
    pub fn from_handle(e: ErrorHandle) -> Status {
        Status(abi::error_code(e))
    }

    /// The symbolic name from the API headers, where we know it.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "QNN_SUCCESS",
            1000 => "QNN_COMMON_ERROR_NOT_SUPPORTED",
            1002 => "QNN_COMMON_ERROR_MEM_ALLOC",
            1003 => "QNN_COMMON_ERROR_SYSTEM",
            1004 => "QNN_COMMON_ERROR_INVALID_ARGUMENT",
            1005 => "QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED",
            1006 => "QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED",
            1007 => "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION",
            1008 => "QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES",
            1009 => "QNN_COMMON_ERROR_LOADING_BINARIES",
            1010 => "QNN_COMMON_ERROR_RESOURCE_UNAVAILABLE",
            1011 => "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL",
            1100 => "QNN_COMMON_ERROR_GENERAL",
            4000 => "QNN_BACKEND_ERROR_CANNOT_INITIALIZE",
            5000 => "QNN_CONTEXT_ERROR_INVALID_ARGUMENT",
            5001 => "QNN_CONTEXT_ERROR_CTX_DOES_NOT_EXIST",
            5002 => "QNN_CONTEXT_ERROR_INVALID_HANDLE",
            5003 => "QNN_CONTEXT_ERROR_NOT_FINALIZED",
            5004 => "QNN_CONTEXT_ERROR_BINARY_VERSION",
            5005 => "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY",
            5006 => "QNN_CONTEXT_ERROR_GET_BINARY_SIZE_FAILED",
            5007 => "QNN_CONTEXT_ERROR_GET_BINARY_FAILED",
            5008 => "QNN_CONTEXT_ERROR_BINARY_CONFIGURATION",
            5009 => "QNN_CONTEXT_ERROR_SET_PROFILE",
            5010 => "QNN_CONTEXT_ERROR_INVALID_CONFIG",
            5011 => "QNN_CONTEXT_ERROR_BINARY_SUBOPTIMAL",
            5012 => "QNN_CONTEXT_ERROR_ABORTED",
            5013 => "QNN_CONTEXT_ERROR_TIMED_OUT",
            9000 => "QNN_SIGNAL_ERROR_SIGNAL_IN_USE",
            9001 => "QNN_SIGNAL_ERROR_SIGNAL_IDLE",
            9002 => "QNN_SIGNAL_ERROR_INVALID_ARGUMENT",
            9003 => "QNN_SIGNAL_ERROR_INVALID_HANDLE",
            9004 => "QNN_SIGNAL_ERROR_TIMEOUT",
            30010 => "QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY",
            30000..=30999 => "QNN_SYSTEM_CONTEXT_ERROR",
            6000..=6999 => "QNN_GRAPH_ERROR",
            3000..=3999 => "QNN_PROPERTY_ERROR",
            _ => "unknown QNN error",
        }
    }

    /// What the code usually means on a board, where the name alone misleads.
    pub fn hint(self) -> Option<&'static str> {
        match self.0 {
            1008 => Some(
                "the QNN libraries do not match each other (the stub on the host and the skel on the DSP must come from the same QAIRT release)",
            ),
            5005 => Some(
                "the binary was built for another QAIRT release or SoC, or FastRPC refused the process (check the DSP device permissions and ADSP_LIBRARY_PATH)",
            ),
            30010 => Some("the file is not a whole context binary (truncated or another format)"),
            _ => None,
        }
    }

    /// 1007: the DSP subsystem restarted and the runtime recovered; the call may be repeated.
    pub fn is_recovered_restart(self) -> bool {
        self.0 == 1007
    }

    /// 5004/5005/5008: the context binary was built for another QAIRT release or SoC.
    pub fn is_incompatible_binary(self) -> bool {
        matches!(self.0, 5004 | 5005 | 5008)
    }

    /// The supervisor's reading of a failed call named `what`.
    pub fn backend_error(self, what: &str) -> BackendError {
        let code = Some(self.0 as i64);
        if self.is_recovered_restart() {
            return BackendError::Transient(format!("{what}: {self} (DSP subsystem restart, recovered)"));
        }
        let message = if self.0 == 1011 {
            format!("{what}: {self} (DSP subsystem restart, not recovered)")
        } else if self.is_incompatible_binary() {
            format!("{what}: {self}: {REGENERATE}")
        } else {
            format!("{what}: {self}")
        };
        BackendError::Fatal { code, message }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)?;
        match self.hint() {
            Some(h) => write!(f, ": {h}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovered_subsystem_restart_is_transient_and_a_fatal_one_is_not() {
        assert!(matches!(Status(1007).backend_error("execute"), BackendError::Transient(_)));
        let BackendError::Fatal { code, message } = Status(1011).backend_error("execute") else { panic!() };
        assert_eq!(code, Some(1011));
        assert!(message.contains("QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL"), "{message}");
    }

    #[test]
    fn incompatible_binaries_tell_the_operator_to_regenerate_them() {
        for c in [5004, 5005, 5008] {
            let BackendError::Fatal { message, .. } = Status(c).backend_error("create") else { panic!() };
            assert!(message.contains("regenerate the context binary for this QAIRT/board"), "{message}");
        }
    }

    #[test]
    fn codes_whose_name_misleads_carry_what_they_mean_on_a_board() {
        assert_eq!(Status(1100).name(), "QNN_COMMON_ERROR_GENERAL");
        assert!(Status(30010).to_string().starts_with("QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY (30010): "));
        assert!(Status(1008).to_string().contains("stub"), "{}", Status(1008));
        assert!(Status(5005).to_string().contains("FastRPC"), "{}", Status(5005));
    }

    #[test]
    fn only_the_low_sixteen_bits_are_the_code() {
        assert_eq!(Status::from_handle(0xABCD_0000_0000_03EF), Status(1007));
    }
}
