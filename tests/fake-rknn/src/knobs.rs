//! The fake runtime's environment knobs, read once per `rknn_init`.
//!
//! | variable | effect |
//! |---|---|
//! | `FAKE_RKNN_SDK_VERSION` | the runtime version `RKNN_QUERY_SDK_VERSION` reports (default `2.3.2 (fake)`) |
//! | `FAKE_RKNN_DRV_VERSION` | the driver version it reports (default `0.9.8`) |
//! | `FAKE_RKNN_LATENCY_MS` | milliseconds every `rknn_run` sleeps, holding the NPU cores of its context's core mask (runs pinned to different cores overlap; runs sharing a core, or masks of several cores, wait for each other) |
//! | `FAKE_RKNN_HANG_ON_RUN=N` | the process's Nth `rknn_run` (1-based) blocks forever |
//! | `FAKE_RKNN_FAIL_CODE=C` | `rknn_run` returns C (negative) instead of running... |
//! | `FAKE_RKNN_FAIL_ON_RUN=N` | ...only on the process's Nth run (default: every run) |
//! | `FAKE_RKNN_FAIL_INIT=C` | `rknn_init` returns C |
//! | `FAKE_RKNN_CONSTANT_OUTPUT=1` | every run, from the first, in every process, returns the same fixed logits whatever the input (`context::constant_logit`; -10000 past the row's options, as in a real run): the 2.4.2 bug |
//! | `FAKE_RKNN_TRACE=FILE` | appends a line per `rknn_set_core_mask` and per run (graph, tokens, options) |
//! | `FAKE_RKNN_SPANS=FILE` | appends `mask=0x1 start_us=S end_us=E` per run: when it held its cores (its latency, from after it got them), in microseconds since the process's first run, so a test sees which runs overlapped |
//! | `FAKE_RKNN_DUMP=FILE` | appends a JSON line per successful run: the five input tensors as received and the `marker_slots` logits returned |

use std::path::PathBuf;

pub const DEFAULT_SDK_VERSION: &str = "2.3.2 (fake)";
pub const DEFAULT_DRV_VERSION: &str = "0.9.8";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knobs {
    pub sdk_version: String,
    pub drv_version: String,
    pub latency_ms: u64,
    pub hang_on_run: Option<u64>,
    pub fail_code: Option<i32>,
    pub fail_on_run: Option<u64>,
    pub fail_init: Option<i32>,
    pub constant_output: bool,
    pub trace: Option<PathBuf>,
    pub spans: Option<PathBuf>,
    pub dump: Option<PathBuf>,
}

impl Knobs {
    pub fn from_env() -> Knobs {
        Knobs::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Knobs {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
        let code = |k: &str| get(k).and_then(|v| v.trim().parse::<i32>().ok()).filter(|&c| c != 0);
        Knobs {
            sdk_version: get("FAKE_RKNN_SDK_VERSION").unwrap_or_else(|| DEFAULT_SDK_VERSION.into()),
            drv_version: get("FAKE_RKNN_DRV_VERSION").unwrap_or_else(|| DEFAULT_DRV_VERSION.into()),
            latency_ms: num("FAKE_RKNN_LATENCY_MS").unwrap_or(0),
            hang_on_run: num("FAKE_RKNN_HANG_ON_RUN"),
            fail_code: code("FAKE_RKNN_FAIL_CODE"),
            fail_on_run: num("FAKE_RKNN_FAIL_ON_RUN"),
            fail_init: code("FAKE_RKNN_FAIL_INIT"),
            constant_output: get("FAKE_RKNN_CONSTANT_OUTPUT").is_some_and(|v| !v.is_empty() && v != "0"),
            trace: get("FAKE_RKNN_TRACE").filter(|v| !v.is_empty()).map(PathBuf::from),
            spans: get("FAKE_RKNN_SPANS").filter(|v| !v.is_empty()).map(PathBuf::from),
            dump: get("FAKE_RKNN_DUMP").filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }

    /// The code the `run`th run (1-based, process-wide) fails with, if any.
    pub fn failure_for(&self, run: u64) -> Option<i32> {
        self.fail_code.filter(|_| self.fail_on_run.is_none_or(|n| n == run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_knobs_give_a_healthy_2_3_2_runtime() {
        let k = Knobs::from_lookup(|_| None);
        assert_eq!(k.sdk_version, DEFAULT_SDK_VERSION);
        assert_eq!((k.hang_on_run, k.fail_code, k.constant_output), (None, None, false));
    }

    #[test]
    fn a_failure_code_applies_to_every_run_or_to_the_named_one() {
        let k = Knobs::from_lookup(|k| (k == "FAKE_RKNN_FAIL_CODE").then(|| "-2".into()));
        assert_eq!((k.failure_for(1), k.failure_for(7)), (Some(-2), Some(-2)));
        let k = Knobs::from_lookup(|k| match k {
            "FAKE_RKNN_FAIL_CODE" => Some("-1".into()),
            "FAKE_RKNN_FAIL_ON_RUN" => Some("3".into()),
            _ => None,
        });
        assert_eq!((k.failure_for(2), k.failure_for(3)), (None, Some(-1)));
    }
}
