//! `laya-topics`: the wire contract of laya-edge.
//!
//! Everything a fleet-side client needs to talk to an agent lives here and nowhere else: the
//! document model ([`Value`]) with Python's JSON semantics, the JSON codec, and the request and
//! answer types. The agent depends on this crate; nothing here depends on the agent.

pub mod answer;
pub mod cbor;
pub mod jev;
pub mod json;
pub mod load;
pub mod pyfloat;
pub mod pyrepr;
pub mod request;
pub mod thin_edge;
pub mod topic;
pub mod value;
pub mod wire;

/// The `model` laya reports in every [`PredictResult`].
pub const MODEL_NAME: &str = "laya-rl-agent";

pub use answer::{Abstention, Action, Answer, AnswerError, Collapsed, Fit, Gate, PredictResult, Usage};
pub use request::{Request, RequestError};
pub use value::{Integer, Map, Value};
