//! Supervision of the worker process that runs a backend: the handle, the supervisor (a pure
//! state machine), the frames between agent and worker, the worker side, health rows and the
//! bundle probe. The engine sees tokens and tensors only, never JSON.

pub mod health;
pub mod probe;
pub mod process;
pub mod protocol;
pub mod supervisor;
pub mod worker;


