//! The worker side: `laya-edge worker` hosts one backend and answers frames on stdin/stdout.
//!
//! Vendor runtimes are loaded here and only here, so the agent can SIGKILL a hung or crashed
//! runtime and start a fresh one; stderr is left to the runtime's own logging.

use std::io::{Read, Write};
use std::time::Instant;

use super::protocol::{FromWorker, ToWorker, read_frame};
use crate::backend::{Backend, LoadError};
use crate::prompt::Row;

/// Loads the backend with `load`, announces it, then runs batches until stdin closes or a
/// shutdown frame arrives.
pub fn serve(
    load: impl FnOnce() -> Result<Box<dyn Backend>, LoadError>,
    mut input: impl Read,
    mut output: impl Write,
) -> std::io::Result<()> {
    let started = Instant::now();
    let mut backend = match load() {
        Ok(b) => b,
        Err(LoadError { kind, message }) => {
            output.write_all(&FromWorker::LoadFailed { kind, message }.encode())?;
            return output.flush();
        }
    };
    let ready = FromWorker::Ready {
        backend: backend.name().to_owned(),
        load_ms: started.elapsed().as_millis() as u64,
        runtime: backend.runtime_version(),
    };
    output.write_all(&ready.encode())?;
    output.flush()?;
    while let Some(payload) = read_frame(&mut input)? {
        let msg = ToWorker::decode(&payload).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        match msg {
            ToWorker::Shutdown => break,
            ToWorker::Run { call, rows } => {
                let refs: Vec<&Row> = rows.iter().collect();
                let t = Instant::now();
                // Each sign of progress goes out at once: the agent bounds the time between them.
                // A failed write means the agent is gone; the answer's write below reports it.
                let mut progress = |done: u32, of: u32| {
                    let _ = output.write_all(&FromWorker::Progress { call, done, of }.encode());
                    let _ = output.flush();
                };
                let result = backend.run_with_progress(&refs, &mut progress);
                let reply = match result {
                    Ok(rows) => FromWorker::Done { call, rows, backend_us: t.elapsed().as_micros() as u64 },
                    Err(error) => FromWorker::Failed { call, error },
                };
                output.write_all(&reply.encode())?;
                output.flush()?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LoadFailure;
    use crate::backend::null::NullBackend;
    use crate::prompt::QType;

    fn frames(mut bytes: &[u8]) -> Vec<FromWorker> {
        let mut out = Vec::new();
        while let Some(p) = read_frame(&mut bytes).unwrap() {
            out.push(FromWorker::decode(&p).unwrap());
        }
        out
    }

    #[test]
    fn a_worker_announces_itself_then_answers_each_batch() {
        let row = Row { input_ids: vec![5, 6], marker_pos: vec![0, 1], qtype: QType::Choice, layout: None };
        let mut input = ToWorker::Run { call: 9, rows: vec![row.clone()] }.encode();
        input.extend(ToWorker::Shutdown.encode());
        let mut out = Vec::new();
        serve(|| Ok(Box::new(NullBackend::default())), input.as_slice(), &mut out).unwrap();
        let got = frames(&out);
        assert!(matches!(&got[0], FromWorker::Ready { backend, .. } if backend == "null"));
        match &got[1] {
            FromWorker::Done { call: 9, rows, .. } => assert_eq!(rows[0], NullBackend::logits_for(&row)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_load_failure_is_reported_with_its_kind_before_exiting() {
        let mut out = Vec::new();
        serve(|| Err("no such library".into()), &[][..], &mut out).unwrap();
        assert_eq!(
            frames(&out),
            [FromWorker::LoadFailed { kind: LoadFailure::Other, message: "no such library".into() }]
        );
        let mut out = Vec::new();
        serve(|| Err(LoadError::runtime_rejected("refusing 2.4.2")), &[][..], &mut out).unwrap();
        let rejected = FromWorker::LoadFailed { kind: LoadFailure::RuntimeRejected, message: "refusing 2.4.2".into() };
        assert_eq!(frames(&out), [rejected]);
    }
}
