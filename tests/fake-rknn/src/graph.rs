//! The fake runtime's "graph file": a small JSON document pointing at a laya checkpoint.
//!
//! ```json
//! {"fake_rknn_graph": 1, "checkpoint": "/abs/path/to/checkpoint", "seq_len": 512, "marker_slots": 64}
//! ```
//!
//! `rknn_init` receives the file's bytes, not its path, so a relative `checkpoint` is resolved
//! against the process's working directory (write absolute paths to be safe). `marker_slots`
//! defaults to 64.

use std::path::PathBuf;

use laya_topics::Value;
use laya_topics::json::{ParseOptions, parse};

/// A parsed fake graph file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGraph {
    pub checkpoint: PathBuf,
    pub seq_len: usize,
    pub marker_slots: usize,
}

impl FakeGraph {
    /// Parses the file's bytes; a message saying what is wrong otherwise.
    pub fn parse(bytes: &[u8]) -> Result<FakeGraph, String> {
        let v = parse(bytes, ParseOptions::default()).map_err(|e| format!("not a fake graph file: {e}"))?;
        if v.get("fake_rknn_graph").and_then(Value::as_i64) != Some(1) {
            return Err("not a fake graph file: no \"fake_rknn_graph\": 1".into());
        }
        let checkpoint = v.get("checkpoint").and_then(Value::as_str).ok_or("\"checkpoint\" must be a string")?;
        let size = |key: &str, default: Option<i64>| -> Result<usize, String> {
            let n = v.get(key).map_or(default, Value::as_i64).ok_or(format!("{key:?} must be an integer"))?;
            usize::try_from(n)
                .ok()
                .filter(|&n| n > 0 && n <= u32::MAX as usize)
                .ok_or(format!("{key:?} must be positive"))
        };
        Ok(FakeGraph {
            checkpoint: PathBuf::from(checkpoint),
            seq_len: size("seq_len", None)?,
            marker_slots: size("marker_slots", Some(64))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_file_names_a_checkpoint_and_a_shape() {
        let g = FakeGraph::parse(br#"{"fake_rknn_graph": 1, "checkpoint": "/m", "seq_len": 128}"#).unwrap();
        assert_eq!(g, FakeGraph { checkpoint: "/m".into(), seq_len: 128, marker_slots: 64 });
        assert!(FakeGraph::parse(b"RKNN\0\0").is_err());
        assert!(FakeGraph::parse(br#"{"fake_rknn_graph": 1, "checkpoint": "/m", "seq_len": 0}"#).is_err());
    }
}
