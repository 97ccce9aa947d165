//! Connections: accepting within `max_connections`, cutting off slow or idle clients, and the
//! graceful stop.
//!
//! Why its own file: a hostile client attacks the door below HTTP's requests, where no route
//! sees it: by opening connections without end, by sending a request head a byte at a time
//! (slowloris), by sending a huge head, or by holding a keep-alive connection open doing
//! nothing. Each is bounded here:
//!
//! - `max_connections` open at once; one more is answered `503` with `Retry-After: 1` and
//!   closed, never left waiting in the backlog;
//! - a request head must arrive within `header_read_timeout` of its first byte, and be at most
//!   `max_header_bytes` (hyper answers 431 past it);
//! - a connection with no request in progress and nothing received for `idle_timeout` is closed
//!   (this includes one that never sends a byte, and a client that does not read its response);
//! - the body has its own size and time limits ([`super::body`]).
//!
//! The timers are the door's own rather than hyper's `header_read_timeout`, which runs from the
//! end of the previous response and so would also be the idle timeout. On stop, the listener
//! closes, every connection finishes the request it is in (hyper's graceful shutdown), and
//! [`serve`] returns when the last one has closed (mini-redis: the last sender dropping).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, mpsc, watch};

use super::routes::{self, Shared};

/// The answer to a connection past `max_connections`, written without reading its request.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
content-length: 40\r\nconnection: close\r\n\r\n{\"detail\":\"server busy, try again later\"}";

/// Refused connections answered at once; past this, a refused connection is just closed.
const MAX_REFUSING: usize = 64;
/// How long a refused connection may take to receive its 503.
const REFUSE_WRITE: Duration = Duration::from_secs(1);

/// Accepts on `listener` until `shutdown`, then stops gracefully (see the module docs).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: impl Future) {
    let slots = Arc::new(Semaphore::new(shared.settings.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let (stop_tx, stop_rx) = watch::channel(false);
    // Each connection holds a sender; `recv` returns `None` once the last one is gone.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "HTTP door: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            shared.metrics.connection_refused();
            if let Ok(permit) = refusing.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(permit);
                });
            }
            continue;
        };
        let shared = shared.clone();
        let stop = stop_rx.clone();
        let open = open_tx.clone();
        tokio::spawn(async move {
            shared.metrics.connection(true);
            connection(stream, peer, &shared, stop).await;
            shared.metrics.connection(false);
            drop(slot);
            drop(open);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_tx);
    let _ = open_rx.recv().await;
}

/// The 503 for a connection past the bound, then close. Whatever the client sent is read and
/// dropped for a moment, so that closing does not reset the connection before it read the
/// answer.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(REFUSE_WRITE, async {
        stream.write_all(REFUSED).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await? > 0 {}
        io::Result::Ok(())
    })
    .await;
}

/// What the connection's timers look at, shared with its I/O and its requests.
#[derive(Debug)]
struct Activity {
    origin: Instant,
    /// Requests in progress (from the head's end to the handler's response).
    in_flight: AtomicUsize,
    /// Milliseconds since `origin` when the connection last became idle (accepted, or a
    /// response handed to hyper).
    idle_since_ms: AtomicU64,
    /// Milliseconds since `origin` (plus one; 0: none) of the first byte received since then.
    first_byte_ms: AtomicU64,
    /// Woken when the deadline may have changed (a first byte, a request's end).
    changed: Notify,
}

impl Activity {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms)
    }

    fn became_idle(&self) {
        self.first_byte_ms.store(0, Ordering::Relaxed);
        self.idle_since_ms.store(self.now_ms(), Ordering::Relaxed);
        self.changed.notify_one();
    }

    fn received(&self) {
        if self.first_byte_ms.load(Ordering::Relaxed) == 0 {
            self.first_byte_ms.store(self.now_ms() + 1, Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    /// When the connection is to be cut if nothing changes: `None` while a request is in
    /// progress (the body and the engine have their own limits).
    fn deadline(&self, header: Duration, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        match self.first_byte_ms.load(Ordering::Relaxed) {
            0 => Some(self.at(self.idle_since_ms.load(Ordering::Relaxed)) + idle),
            first => Some(self.at(first - 1) + header),
        }
    }
}

/// The socket, noting every byte received.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.received();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Marks a request in progress until dropped (the handler returned or was cancelled).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.became_idle();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// hyper's HTTP/1 settings: keep-alive on, the head's size bounded, no timer of hyper's (the
/// door's own are in [`connection`]).
fn builder(max_header_bytes: usize) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.keep_alive(true).header_read_timeout(None).max_header_size(max_header_bytes);
    b
}

async fn connection(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let activity = Arc::new(Activity {
        origin: Instant::now(),
        in_flight: AtomicUsize::new(0),
        idle_since_ms: AtomicU64::new(0),
        first_byte_ms: AtomicU64::new(0),
        changed: Notify::new(),
    });
    let io = TokioIo::new(Watched { inner: stream, activity: activity.clone() });
    let service = {
        let shared = shared.clone();
        let activity = activity.clone();
        service_fn(move |req| {
            let shared = shared.clone();
            let guard = InFlight::start(&activity);
            async move {
                let r = routes::handle(req, shared, peer).await;
                drop(guard);
                r
            }
        })
    };
    let settings = &shared.settings;
    let conn = builder(settings.max_header_bytes).serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let deadline = activity.deadline(settings.header_read_timeout, settings.idle_timeout);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "HTTP connection ended");
                }
                return;
            }
            // Idle, or a head that did not arrive in time: close. Nothing is in progress (the
            // deadline is `None` while a request is), so nobody loses an answer.
            _ = sleep_until(deadline) => {
                if activity.deadline(settings.header_read_timeout, settings.idle_timeout).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!(%peer, "HTTP connection closed: idle, or its request head too slow");
                    return;
                }
            }
            // A first byte or a request's end: the deadline moved.
            _ = activity.changed.notified() => {}
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        // A request is in progress: its end wakes the loop through `changed`.
        None => std::future::pending().await,
    }
}
