//! The frames between the agent and its worker process.
//!
//! Small and binary on purpose: token ids and markers (and a parallel row's position and option
//! ids) go in, logits come out, nothing else. Every frame is a little-endian `u32` payload length
//! followed by the payload, whose first byte says what it is. Decoding is defensive: a truncated
//! or oversized frame is an error, never a panic (a crashing worker may leave half a frame
//! behind). The worker reads with [`read_frame`] (blocking), the agent with [`read_from_worker`]
//! (async).

use crate::prompt::parallel::ParallelLayout;
use crate::prompt::{QType, Row};

use crate::backend::{BackendError, LoadFailure, RowResult};

/// Frames larger than this are refused (a 512-token batch of 64 rows is ~130 KiB).
pub const MAX_FRAME: usize = 64 << 20;

/// Agent -> worker.
#[derive(Debug, Clone, PartialEq)]
pub enum ToWorker {
    /// Run these rows as one batch.
    Run { call: u64, rows: Vec<Row> },
    /// Finish and exit.
    Shutdown,
}

/// Worker -> agent.
#[derive(Debug, Clone, PartialEq)]
pub enum FromWorker {
    /// The backend is loaded and ready; `runtime`: its vendor runtime's version (empty: none).
    Ready { backend: String, load_ms: u64, runtime: String },
    /// A batch's outputs, one per row, and the backend's own time for it.
    Done { call: u64, rows: Vec<RowResult>, backend_us: u64 },
    /// A batch failed.
    Failed { call: u64, error: BackendError },
    /// The backend could not be loaded (what kind of failure, and the loader's message); the
    /// worker exits after sending this.
    LoadFailed { kind: LoadFailure, message: String },
    /// A sign of progress on a batch: `done` of `of` steps of its work are finished (a step is
    /// a row, or a layer of the CPU model over the batch). The supervisor measures the call's
    /// rate from these and bounds the time *between* them, so a slow worker that is making
    /// progress is not taken for a hung one.
    Progress { call: u64, done: u32, of: u32 },
}

/// Why a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("truncated frame")]
    Truncated,
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("invalid frame: {0}")]
    Invalid(&'static str),
}

struct Writer(Vec<u8>);

impl Writer {
    fn new(kind: u8) -> Writer {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&[0; 4]);
        v.push(kind);
        Writer(v)
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        for x in v {
            self.u32(*x);
        }
    }
    fn f32s(&mut self, v: &[f32]) {
        self.len(v.len());
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
    fn finish(mut self) -> Vec<u8> {
        let n = u32::try_from(self.0.len() - 4).unwrap_or(u32::MAX);
        self.0[..4].copy_from_slice(&n.to_le_bytes());
        self.0
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn i64(&mut self) -> Result<i64, FrameError> {
        Ok(self.u64()? as i64)
    }
    /// A count, checked against the bytes left so a bogus count cannot allocate.
    fn count(&mut self, item_size: usize) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_size) > self.0.len() {
            return Err(FrameError::Truncated);
        }
        Ok(n)
    }
    fn str(&mut self) -> Result<String, FrameError> {
        let n = self.count(1)?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn u32s(&mut self) -> Result<Vec<u32>, FrameError> {
        let n = self.count(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn f32s(&mut self) -> Result<Vec<f32>, FrameError> {
        let n = self.count(4)?;
        (0..n).map(|_| self.u32().map(f32::from_bits)).collect()
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.0.is_empty() { Ok(()) } else { Err(FrameError::Invalid("trailing bytes")) }
    }
}

const RUN: u8 = 1;
const SHUTDOWN: u8 = 2;
const READY: u8 = 10;
const DONE: u8 = 11;
const FAILED: u8 = 12;
const LOAD_FAILED: u8 = 13;
const PROGRESS: u8 = 14;
const NO_CODE: i64 = i64::MIN;
/// Set in a row's question-type byte when its parallel layout (position ids, then option ids)
/// follows its markers. A row without one is encoded as before the layout existed.
const PARALLEL: u8 = 0x80;

impl ToWorker {
    /// The frame, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ToWorker::Run { call, rows } => {
                let mut w = Writer::new(RUN);
                w.u64(*call);
                w.len(rows.len());
                for r in rows {
                    let flag = if r.layout.is_some() { PARALLEL } else { 0 };
                    w.u8(r.qtype.index() as u8 | flag);
                    w.u32s(&r.input_ids);
                    w.u32s(&r.marker_pos);
                    if let Some(layout) = &r.layout {
                        w.u32s(&layout.position_ids);
                        w.u32s(&layout.option_ids);
                    }
                }
                w.finish()
            }
            ToWorker::Shutdown => Writer::new(SHUTDOWN).finish(),
        }
    }

    /// Decodes a payload (without the length prefix).
    pub fn decode(payload: &[u8]) -> Result<ToWorker, FrameError> {
        let mut r = Reader(payload);
        let msg = match r.u8()? {
            RUN => {
                let call = r.u64()?;
                let n = r.count(9)?;
                let mut rows = Vec::with_capacity(n);
                for _ in 0..n {
                    let kind = r.u8()?;
                    let qtype = match kind & !PARALLEL {
                        0 => QType::Choice,
                        1 => QType::Score,
                        2 => QType::Noul,
                        _ => return Err(FrameError::Invalid("question type")),
                    };
                    let (input_ids, marker_pos) = (r.u32s()?, r.u32s()?);
                    let layout = if kind & PARALLEL != 0 {
                        Some(ParallelLayout { position_ids: r.u32s()?, option_ids: r.u32s()? })
                    } else {
                        None
                    };
                    rows.push(Row { input_ids, marker_pos, qtype, layout });
                }
                ToWorker::Run { call, rows }
            }
            SHUTDOWN => ToWorker::Shutdown,
            k => return Err(FrameError::UnknownKind(k)),
        };
        r.end()?;
        Ok(msg)
    }
}

impl FromWorker {
    /// The frame, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            FromWorker::Ready { backend, load_ms, runtime } => {
                let mut w = Writer::new(READY);
                w.str(backend);
                w.u64(*load_ms);
                w.str(runtime);
                w.finish()
            }
            FromWorker::Done { call, rows, backend_us } => {
                let mut w = Writer::new(DONE);
                w.u64(*call);
                w.len(rows.len());
                for r in rows {
                    w.f32s(&r.logits);
                    w.f32s(&r.act_logits);
                }
                w.u64(*backend_us);
                w.finish()
            }
            FromWorker::Failed { call, error } => {
                let mut w = Writer::new(FAILED);
                w.u64(*call);
                let (class, code, message) = match error {
                    BackendError::Input(m) => (0, NO_CODE, m.as_str()),
                    BackendError::Transient(m) => (1, NO_CODE, m.as_str()),
                    BackendError::Fatal { code, message } => (2, code.unwrap_or(NO_CODE), message.as_str()),
                };
                w.u8(class);
                w.i64(code);
                w.str(message);
                w.finish()
            }
            FromWorker::LoadFailed { kind, message } => {
                let mut w = Writer::new(LOAD_FAILED);
                w.u8(match kind {
                    LoadFailure::Other => 0,
                    LoadFailure::RuntimeRejected => 1,
                });
                w.str(message);
                w.finish()
            }
            FromWorker::Progress { call, done, of } => {
                let mut w = Writer::new(PROGRESS);
                w.u64(*call);
                w.u32(*done);
                w.u32(*of);
                w.finish()
            }
        }
    }

    /// Decodes a payload (without the length prefix).
    pub fn decode(payload: &[u8]) -> Result<FromWorker, FrameError> {
        let mut r = Reader(payload);
        let msg = match r.u8()? {
            READY => FromWorker::Ready { backend: r.str()?, load_ms: r.u64()?, runtime: r.str()? },
            DONE => {
                let call = r.u64()?;
                let n = r.count(8)?;
                let mut rows = Vec::with_capacity(n);
                for _ in 0..n {
                    rows.push(RowResult { logits: r.f32s()?, act_logits: r.f32s()? });
                }
                FromWorker::Done { call, rows, backend_us: r.u64()? }
            }
            FAILED => {
                let call = r.u64()?;
                let class = r.u8()?;
                let code = r.i64()?;
                let message = r.str()?;
                let error = match class {
                    0 => BackendError::Input(message),
                    1 => BackendError::Transient(message),
                    2 => BackendError::Fatal { code: (code != NO_CODE).then_some(code), message },
                    _ => return Err(FrameError::Invalid("error class")),
                };
                FromWorker::Failed { call, error }
            }
            LOAD_FAILED => {
                let kind = match r.u8()? {
                    0 => LoadFailure::Other,
                    1 => LoadFailure::RuntimeRejected,
                    _ => return Err(FrameError::Invalid("load failure kind")),
                };
                FromWorker::LoadFailed { kind, message: r.str()? }
            }
            PROGRESS => FromWorker::Progress { call: r.u64()?, done: r.u32()?, of: r.u32()? },
            k => return Err(FrameError::UnknownKind(k)),
        };
        r.end()?;
        Ok(msg)
    }
}

/// The payload length a frame's 4-byte prefix announces, refused above [`MAX_FRAME`].
pub fn frame_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n > MAX_FRAME { Err(FrameError::TooLarge(n)) } else { Ok(n) }
}

/// Reads the length prefix; `Ok(None)` on a clean end of stream.
pub fn read_frame(input: &mut impl std::io::Read) -> Result<Option<Vec<u8>>, std::io::Error> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = frame_len(len).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut payload = vec![0u8; n];
    input.read_exact(&mut payload)?;
    Ok(Some(payload))
}

/// Reads one frame from a worker's stdout and decodes it: the agent's side of [`read_frame`].
/// `None` at the end of the stream, or when it cannot be read any more.
pub async fn read_from_worker(out: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<Result<FromWorker, FrameError>> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    out.read_exact(&mut len).await.ok()?;
    let n = match frame_len(len) {
        Ok(n) => n,
        Err(e) => return Some(Err(e)),
    };
    let mut payload = vec![0u8; n];
    out.read_exact(&mut payload).await.ok()?;
    Some(FromWorker::decode(&payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(frame: &[u8]) -> &[u8] {
        &frame[4..]
    }

    #[test]
    fn frames_round_trip() {
        let run = ToWorker::Run {
            call: 7,
            rows: vec![Row { input_ids: vec![1, 2, 3], marker_pos: vec![1], qtype: QType::Noul, layout: None }],
        };
        assert_eq!(ToWorker::decode(payload(&run.encode())).unwrap(), run);
        let done = FromWorker::Done {
            call: 7,
            rows: vec![RowResult { logits: vec![0.5, -1e4], act_logits: vec![0.1, 0.2] }],
            backend_us: 42,
        };
        assert_eq!(FromWorker::decode(payload(&done.encode())).unwrap(), done);
        let ready = FromWorker::Ready { backend: "rknn".into(), load_ms: 9, runtime: "2.3.2 (abc@2025)".into() };
        assert_eq!(FromWorker::decode(payload(&ready.encode())).unwrap(), ready);
        let progress = FromWorker::Progress { call: 7, done: 3, of: 22 };
        assert_eq!(FromWorker::decode(payload(&progress.encode())).unwrap(), progress);
        for kind in [LoadFailure::Other, LoadFailure::RuntimeRejected] {
            let f = FromWorker::LoadFailed { kind, message: "refusing RKNN runtime \"2.4.2\"".into() };
            assert_eq!(FromWorker::decode(payload(&f.encode())).unwrap(), f);
        }
        for error in [
            BackendError::Input("x".into()),
            BackendError::Transient("y".into()),
            BackendError::Fatal { code: Some(1011), message: "z".into() },
            BackendError::Fatal { code: None, message: "w".into() },
        ] {
            let f = FromWorker::Failed { call: 1, error };
            assert_eq!(FromWorker::decode(payload(&f.encode())).unwrap(), f);
        }
    }

    fn parallel_row() -> Row {
        Row {
            input_ids: vec![1, 7, 2, 4, 8, 4, 9, 9, 2, 30, 2],
            marker_pos: vec![3, 5],
            qtype: QType::Score,
            layout: Some(ParallelLayout {
                position_ids: vec![0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8],
                option_ids: vec![0, 0, 0, 1, 1, 2, 2, 2, 0, 0, 0],
            }),
        }
    }

    #[test]
    fn a_row_with_a_parallel_layout_round_trips_beside_one_without() {
        let sequential = Row { input_ids: vec![1, 2, 3], marker_pos: vec![1], qtype: QType::Noul, layout: None };
        let run = ToWorker::Run { call: 9, rows: vec![parallel_row(), sequential.clone(), parallel_row()] };
        assert_eq!(ToWorker::decode(payload(&run.encode())).unwrap(), run);
        // Every cut of the layout's bytes is an error, not a row without its layout.
        let frame = ToWorker::Run { call: 9, rows: vec![parallel_row()] }.encode();
        for cut in 5..frame.len() {
            assert!(ToWorker::decode(&frame[4..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_row_without_a_layout_encodes_to_the_same_bytes_as_before_layouts_existed() {
        let run = ToWorker::Run {
            call: 0x0102_0304_0506_0708,
            rows: vec![Row { input_ids: vec![1, 300, 2], marker_pos: vec![1], qtype: QType::Noul, layout: None }],
        };
        // The frame as the encoder wrote it before rows had a layout (commit 973e1f3).
        let mut want: Vec<u8> = vec![];
        want.extend_from_slice(&(1u32 + 8 + 4 + 1 + 4 + 12 + 4 + 4).to_le_bytes());
        want.push(RUN);
        want.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.push(2);
        for v in [3u32, 1, 300, 2, 1, 1] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(run.encode(), want);
        // The same row with a layout differs in its question-type byte only, then carries it.
        let mut with = run.clone();
        let ToWorker::Run { rows, .. } = &mut with else { unreachable!() };
        rows[0].layout = Some(ParallelLayout::sequential(3));
        let bytes = with.encode();
        assert_eq!(bytes[4 + 1 + 8 + 4], 2 | PARALLEL);
        assert_eq!(&bytes[4 + 1 + 8 + 4 + 1..want.len()], &want[4 + 1 + 8 + 4 + 1..]);
    }

    #[test]
    fn truncated_and_bogus_frames_are_errors_not_panics() {
        let run = ToWorker::Run {
            call: 1,
            rows: vec![Row { input_ids: vec![1; 10], marker_pos: vec![0], qtype: QType::Choice, layout: None }],
        };
        let frame = run.encode();
        for cut in 5..frame.len() {
            assert!(ToWorker::decode(&frame[4..cut]).is_err());
        }
        // A huge count with no bytes behind it must not allocate.
        let mut bogus = vec![RUN];
        bogus.extend_from_slice(&1u64.to_le_bytes());
        bogus.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(ToWorker::decode(&bogus), Err(FrameError::Truncated));
        assert_eq!(FromWorker::decode(&[99]), Err(FrameError::UnknownKind(99)));
        assert_eq!(FromWorker::decode(&[LOAD_FAILED, 7, 0, 0, 0, 0]), Err(FrameError::Invalid("load failure kind")));
    }
}
