//! The service's side of a front door other than MQTT (the HTTP door, which sits above the
//! service and reaches it through `Doorway`): a request
//! that door admitted (laya.serve's checks passed there) joins MQTT's questions on the one path,
//! from the queue's places, the waiting room and the memory budget on: one queue and one worker
//! for both doors, served by client in turn, so a flood at one door does not starve the other.
//! What comes back is the reply, or why there is none as the door needs to say it.

use std::time::Instant;

use tokio::sync::oneshot;

use laya_topics::Request;
use laya_topics::wire::{ErrorCode, ErrorReply, Reply};

use super::flow::ClientKey;

/// A request a door admitted, until it is answered.
pub struct Asked {
    pub request: Request,
    /// Who asked, as flow control tells clients apart (the door names its callers).
    pub client: ClientKey,
    /// The size of the request as it came (the body): what the waiting room and the memory
    /// budget reckon it by.
    pub bytes: usize,
    pub received: Instant,
    pub reply: oneshot::Sender<Result<Reply, Refused>>,
}

/// Why a door's request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No place and no room to wait (`overloaded`), or the agent is stopping: retry later.
    #[error("busy")]
    Busy,
    /// The engine's deadline passed.
    #[error("the deadline passed")]
    Deadline,
    /// The request breaks a rule of the laya it is answered as (laya's message).
    #[error("{0}")]
    Invalid(String),
    /// Beyond the agent's own limits (`limits.max_request_tokens`).
    #[error("{0}")]
    TooLarge(String),
    /// The engine or the host steps failed (the cause, for the log).
    #[error("{0}")]
    Failed(String),
}

impl From<ErrorReply> for Refused {
    fn from(e: ErrorReply) -> Refused {
        match e.code {
            ErrorCode::BadRequest => Refused::Invalid(e.message),
            ErrorCode::TooLarge => Refused::TooLarge(e.message),
            ErrorCode::Overloaded => Refused::Busy,
            ErrorCode::DeadlineExceeded => Refused::Deadline,
            ErrorCode::BackendUnavailable | ErrorCode::Internal => Refused::Failed(e.message),
        }
    }
}
