//! How a worker process is started: its command line and environment.
//!
//! Worker plumbing, kept apart from the driver that starts the process (`child.rs`) so the
//! command line can be built and checked without starting anything.

use std::ffi::OsString;
use std::path::PathBuf;

/// How to start a worker process.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}
