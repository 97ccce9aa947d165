//! NPU backends: sessions on vendor runtimes that run the Laya graph on an accelerator.
//!
//! Each backend lives behind its cargo feature and loads its vendor library at run time from an
//! explicit path (never linked, never searched for), so a build without the feature carries no
//! vendor code and a board without the runtime still runs the CPU backend. The supervised worker
//! process (issue #5) is where these backends run: a hung or broken runtime takes down the worker,
//! not the agent.
//!
//! - [`rknn`] (feature `rknn`): Rockchip RK3588 through librknnrt (issue #6).
//! - `qnn` (feature `qnn`): Qualcomm QCS6490 through QNN (issue #7).

#[cfg(any(feature = "qnn", feature = "rknn"))]
mod library;
#[cfg(feature = "qnn")]
pub mod qnn;
#[cfg(feature = "rknn")]
pub mod rknn;
