//! One worker process: starting it, and the tasks that own its pipes and its `Child`.
//!
//! Each worker has a reader task (frames in), a writer task (frames out, through a channel, so a
//! worker that stops reading never freezes the driver's timers) and a reaper task that owns its
//! `Child` and either reaps it when it exits or SIGKILLs and reaps it on request, so no zombie is
//! ever left behind. Its stderr is forwarded into the agent's log, line by line. Apart from the
//! driver so the driver only executes the supervisor's actions.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot};

use super::protocol::{FromWorker, read_from_worker};
use super::spec::WorkerSpec;
use super::supervisor::{Role, WorkerId};
use crate::backend::LoadFailure;

/// What a worker's tasks tell the driver.
pub(super) enum WorkerMsg {
    Frame(FromWorker),
    Exited(String),
}

/// Held by an engine's driver and by each of its workers' reaper tasks; the engine has stopped
/// once every holder is gone (`Engine::stopped`): nothing is ever sent on it.
pub(super) type Lifetime = std::sync::Arc<tokio::sync::watch::Sender<()>>;

/// A running worker process, as the driver holds it.
pub(super) struct Worker {
    pub(super) role: Role,
    /// Frames to write to its stdin (the writer task's queue).
    frames: mpsc::UnboundedSender<Vec<u8>>,
    /// Tells the reaper task to SIGKILL and reap it.
    kill: Option<oneshot::Sender<()>>,
    /// The backend name it announced.
    pub(super) backend: Option<String>,
    pub(super) pid: Option<u32>,
    /// The vendor runtime version it announced (empty: none).
    pub(super) runtime: String,
}

impl Worker {
    /// Queues a frame for its stdin; a closed channel means it is gone (its exit event follows).
    pub(super) fn send(&self, frame: Vec<u8>) {
        let _ = self.frames.send(frame);
    }

    /// SIGKILLs it; the reaper task reaps it.
    pub(super) fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
    }
}

/// How long an exited worker's stdout may take to drain before its exit is reported.
const LAST_WORDS: Duration = Duration::from_secs(2);

/// The longest line of a worker's stderr logged whole; a longer one is logged in pieces of this size.
const STDERR_LINE: usize = 8 * 1024;

/// Starts worker `id` for `role` from `spec`, its messages going to `to_driver`; why it could
/// not be started otherwise.
pub(super) fn spawn(
    id: WorkerId,
    role: Role,
    spec: &WorkerSpec,
    to_driver: &mpsc::Sender<(WorkerId, WorkerMsg)>,
    lifetime: Lifetime,
) -> Result<Worker, String> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().cloned())
        .env_remove("NOTIFY_SOCKET") // only the agent talks to systemd (NotifyAccess=main)
        .env(crate::platform::logging::PRIORITY_VAR, "1") // its stderr comes back through forward_stderr
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", spec.program.display()))?;
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the worker has no pipes".into());
    };
    let pid = child.id();
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(forward_stderr(stderr, pid.unwrap_or(0), role));
    }
    let frames = to_driver.clone();
    let reader = tokio::spawn(async move {
        while let Some(frame) = read_from_worker(&mut stdout).await {
            let (msg, garbled) = match frame {
                Ok(f) => (WorkerMsg::Frame(f), false),
                Err(e) => {
                    let message = format!("garbled frame: {e}");
                    (WorkerMsg::Frame(FromWorker::LoadFailed { kind: LoadFailure::Other, message }), true)
                }
            };
            // After a garbled frame the stream is out of step: nothing more can be read.
            if frames.send((id, msg)).await.is_err() || garbled {
                break;
            }
        }
    });
    // The writer: the driver never waits on a worker's stdin.
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if stdin.write_all(&frame).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    let (kill_tx, kill_rx) = oneshot::channel::<()>();
    let exits = to_driver.clone();
    tokio::spawn(async move {
        // Until this task ends (the worker reaped), its engine has not stopped.
        let _lifetime = lifetime;
        tokio::select! {
            status = child.wait() => {
                let how = match status {
                    Ok(s) => s.to_string(),
                    Err(e) => e.to_string(),
                };
                // The worker's last frames (a LoadFailed, a Failed) are queued before its
                // exit: the reader sends them before it sees EOF. Without this wait a worker
                // that reports a load failure and exits could be taken for a crash. A
                // grandchild holding the pipe open must not stall us, hence the bound.
                let _ = tokio::time::timeout(LAST_WORDS, reader).await;
                let _ = exits.send((id, WorkerMsg::Exited(how))).await;
            }
            _ = kill_rx => {
                let _ = child.start_kill();
                let _ = child.wait().await; // reap: no zombie
            }
        }
    });
    Ok(Worker { role, frames: out_tx, kill: Some(kill_tx), backend: None, pid, runtime: String::new() })
}

/// Logs each line of a worker's stderr in the agent's log, at the line's level, with the
/// worker's pid and role (see `crate::platform::logging::worker_line`), until the worker closes it.
async fn forward_stderr(mut stderr: tokio::process::ChildStderr, pid: u32, role: Role) {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let emit = |line: &[u8]| {
        let line = String::from_utf8_lossy(line);
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            return;
        }
        let role = role.as_str();
        let (level, text) = crate::platform::logging::worker_line(line);
        match level {
            tracing::Level::ERROR => tracing::error!(target: "laya_worker", worker_pid = pid, role, "{text}"),
            tracing::Level::WARN => tracing::warn!(target: "laya_worker", worker_pid = pid, role, "{text}"),
            tracing::Level::INFO => tracing::info!(target: "laya_worker", worker_pid = pid, role, "{text}"),
            _ => tracing::debug!(target: "laya_worker", worker_pid = pid, role, "{text}"),
        }
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            emit(&buf[..at.min(STDERR_LINE)]);
            buf.drain(..=at);
        }
        if buf.len() > STDERR_LINE {
            emit(&buf[..STDERR_LINE]);
            buf.clear();
        }
    }
    emit(&buf);
}
