//! laya.serve 0.4.15's `/v1/systemone` contract as pure code, for laya-edge's HTTP door (#41).
//!
//! The door does the I/O (authentication, admission, reading the body within its size and
//! time limits) and asks the agent; everything between the body's bytes and the response body
//! that laya.serve decides without the model lives here, with no I/O:
//!
//! - [`contract`]: the limits and the refusal table (statuses and `detail` texts), read by the
//!   checks, the door and the tests alike;
//! - [`body`]: the body read as Python's `json.loads` reads bytes;
//! - [`refusal`]: laya.serve's checks in its order, body bytes -> request or [`Refusal`];
//! - [`render`]: laya's result -> laya.serve's response body, strict or not;
//! - [`repr`]: Python's `repr` for the `%r` in the texts.
//!
//! `docs/http-contract.md` is the prose of the same contract.

pub mod body;
pub mod contract;
pub mod refusal;
pub mod render;
pub mod repr;

pub use contract::{Kind, Refusal};
pub use refusal::{
    Batch, Controls, MinConfidence, ModelChoice, ModelNames, Settings, Single, check_batch, check_single,
};
pub use render::{Routing, body_text, question_refusal, render, render_batch, render_result};
