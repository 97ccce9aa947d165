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
//! - [`render`](mod@render): laya's result -> laya.serve's response body, strict or not;
//! - [`health`]: the `/health` document;
//! - Python's `repr` for the `%r` in the texts is the crate's [`crate::pyrepr`], the one laya's own
//!   messages use.
//!
//! `docs/http-contract.md` is the prose of the same contract.
//!
//! The door's sequence: authenticate, admit, read the body (401, 503, 413, 408 from
//! [`Kind`]); [`check_single`] or [`check_batch`]; when `model` auto-routes and `task` is set,
//! [`ModelNames::resolve_task`]; ask the agent ([`Single::request`], [`Batch::requests`]); a
//! refused question refuses the whole request ([`question_refusal`], laya's `ValueError` as
//! 422); otherwise [`render()`] / [`render_batch`] and [`body_text`].
//!
//! Where this differs from laya.serve, knowingly:
//! - nesting: Python stops at its recursion limit (1000 frames less the server's own stack,
//!   about 950 levels); this stops past [`contract::MAX_JSON_DEPTH`] (900). A body nested 901 to
//!   about 950 deep is refused here and accepted there;
//! - a lone surrogate becomes U+FFFD while the body is checked: the request is refused either way
//!   (row 14), but a `%r` of a question id holding one, in an earlier refusal, prints U+FFFD
//!   where Python prints `'\ud800'`; a lone surrogate in a value that a repeated key later
//!   replaces still refuses here (Python no longer sees it);
//! - `min_confidence` as an integer too large for a float is a 422 here; laya raises an
//!   unhandled `OverflowError` (a plain-text 500);
//! - `model` and `task` are trimmed and lower-cased with Rust's Unicode rules, not Python's
//!   (they differ on a few characters, none of them in a checkpoint name).

pub mod body;
pub mod contract;
pub mod health;
pub mod refusal;
pub mod render;

pub use contract::{Kind, Refusal};
pub use health::Health;
pub use refusal::{
    Batch, Controls, MinConfidence, ModelChoice, ModelNames, Settings, Single, check_batch, check_single,
};
pub use render::{Routing, body_text, question_refusal, render, render_batch, render_result};
