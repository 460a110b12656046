//! The HTTP endpoint of a topodra binary: `/metrics`, `/healthz` (also `/livez`) and
//! `/readyz`.
//!
//! The endpoint is reachable from the pod network, so it must not be something a
//! client can exhaust, and above all the kubelet's probes must get through whatever
//! other clients do (a failed liveness probe restarts the container):
//!
//! - every connection gets `header_read_timeout` to send its request headers (idle
//!   keep-alive connections too), and `write_timeout` to take a response once it no
//!   longer fits into the socket: a client that sends requests but never reads the
//!   answers is closed then, instead of holding its slot for good;
//! - a keep-alive connection serves at most `max_requests_per_connection` requests,
//!   then closes, so pipelining cannot make one connection an endless queue of work;
//! - at most `max_connections` are served at once. [`HEALTH_SLOTS`] more are kept for
//!   health probes: a connection accepted while the others are all taken may only ask
//!   for `/healthz`, `/livez` or `/readyz`, once; any other request line closes it as
//!   soon as it shows. Connections beyond both are closed as soon as they are accepted.
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

/// A liveness or readiness check: `Err` carries the reason the probe prints.
pub type Check =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// A check that always passes.
pub fn always_ok() -> Check {
    Arc::new(|| Box::pin(async { Ok(()) }))
}

/// What the endpoint serves.
#[derive(Clone)]
pub struct Endpoints {
    /// The metrics in the OpenMetrics text format, encoded at each scrape.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    pub live: Check,
    pub ready: Check,
    /// Called for each connection closed at the connection limit, to count them.
    pub rejected: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints").finish_non_exhaustive()
    }
}

async fn handle(
    endpoints: Endpoints,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    Ok(match req.uri().path() {
        "/metrics" => {
            let mut r = reply(StatusCode::OK, (endpoints.metrics)());
            if let Ok(v) = "application/openmetrics-text; version=1.0.0; charset=utf-8".parse() {
                r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
            }
            r
        }
        "/healthz" | "/livez" => match (endpoints.live)().await {
            Ok(()) => reply(StatusCode::OK, "ok\n".into()),
            Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        "/readyz" => match (endpoints.ready)().await {
            Ok(()) => reply(StatusCode::OK, "ok\n".into()),
            Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        _ => reply(StatusCode::NOT_FOUND, "not found\n".into()),
    })
}

/// What one client may hold of the endpoint.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Time to send a request's headers, counted from the connection's start or the
    /// end of its previous response.
    pub header_read_timeout: Duration,
    /// Time a client has to take a response that no longer fits into the socket,
    /// counted from the first write that had to wait until the whole response is
    /// written.
    pub write_timeout: Duration,
    /// Connections served at once, besides the [`HEALTH_SLOTS`].
    pub max_connections: usize,
    /// Requests one keep-alive connection serves before it is closed.
    pub max_requests_per_connection: usize,
}

/// Connections beyond `max_connections` that only a health probe may use: the
/// kubelet sends one liveness and one readiness probe at a time, so a few are enough,
/// and they stay free however many scrapers (or clients posing as scrapers) hold the
/// others.
pub const HEALTH_SLOTS: usize = 4;

/// Probe and scrape requests have a few hundred bytes of headers; hyper's default
/// buffer (about 400 KiB) would let each open connection hold that much memory.
const MAX_REQUEST_BUFFER: usize = 16 * 1024;

/// Request lines a connection in a health slot may start with: the path, then the
/// space before the version or a query.
const HEALTH_REQUEST_LINES: [&[u8]; 6] = [
    b"GET /healthz ",
    b"GET /healthz?",
    b"GET /livez ",
    b"GET /livez?",
    b"GET /readyz ",
    b"GET /readyz?",
];

/// Whether a connection that starts with `head` asks for a health path: `None`
/// while it may still turn out either way.
fn is_health_request(head: &[u8]) -> Option<bool> {
    if HEALTH_REQUEST_LINES.iter().any(|l| head.starts_with(l)) {
        Some(true)
    } else if HEALTH_REQUEST_LINES.iter().any(|l| l.starts_with(head)) {
        None
    } else {
        Some(false)
    }
}

/// Reads the start of the request line of a connection in a health slot, until it
/// shows whether it asks for a health path; what was read is handed on with it.
async fn read_health_request_line(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let longest = HEALTH_REQUEST_LINES
        .iter()
        .map(|l| l.len())
        .max()
        .unwrap_or(0);
    let mut head = vec![0; longest];
    let mut got = 0;
    let read = async {
        loop {
            match is_health_request(&head[..got]) {
                Some(true) => return true,
                Some(false) => return false,
                None => {}
            }
            // Undecided means `head[..got]` is a proper prefix of a line, so there is
            // room for at least one more byte.
            match stream.read(&mut head[got..]).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got += n,
            }
        }
    };
    let health = tokio::time::timeout(limit, read).await.unwrap_or(false);
    head.truncate(got);
    health.then_some(head)
}

/// The accepted socket as hyper sees it: `prefix` (bytes already read to choose the
/// slot) comes first, and a write that cannot proceed for `write_timeout` fails the
/// connection.
struct Conn {
    stream: TcpStream,
    prefix: Vec<u8>,
    prefix_pos: usize,
    write_timeout: Duration,
    /// Armed at the first write that had to wait, disarmed once hyper has flushed
    /// everything: it bounds how long one response may take to leave, however
    /// slowly the client reads, not only how long one write may wait.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    fn new(stream: TcpStream, prefix: Vec<u8>, write_timeout: Duration) -> Self {
        Self {
            stream,
            prefix,
            prefix_pos: 0,
            write_timeout,
            stalled: None,
        }
    }

    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if write.is_ready() {
            return write;
        }
        let timeout = self.write_timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no response for {timeout:?}"),
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix_pos < this.prefix.len() {
            let rest = &this.prefix[this.prefix_pos..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.prefix_pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let write = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.bounded(cx, write)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let write = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.bounded(cx, write)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flush = Pin::new(&mut this.stream).poll_flush(cx);
        if flush.is_ready() {
            // hyper flushes once its buffer is written out: the response has left.
            this.stalled = None;
        }
        this.bounded(cx, flush)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let shutdown = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.bounded(cx, shutdown)
    }
}

/// Serves one accepted connection; `max_requests` of one makes it a one-shot.
async fn serve_connection(
    conn: Conn,
    endpoints: Endpoints,
    limits: HttpLimits,
    max_requests: usize,
    peer: std::net::SocketAddr,
    _slot: OwnedSemaphorePermit,
) {
    let served = Arc::new(AtomicUsize::new(0));
    let service = hyper::service::service_fn(move |req| {
        let endpoints = endpoints.clone();
        let served = served.clone();
        async move {
            let mut response = handle(endpoints, req).await?;
            // `Connection: close` on the last answer makes hyper close the connection
            // once it is written; requests pipelined behind it get no answer.
            if served.fetch_add(1, Ordering::Relaxed) + 1 >= max_requests {
                response.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, Infallible>(response)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_REQUEST_BUFFER)
        .keep_alive(max_requests > 1)
        .serve_connection(TokioIo::new(conn), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "metrics connection ended");
    }
}

/// Serves the endpoints on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    endpoints: Endpoints,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, header_read_timeout = ?limits.header_read_timeout, write_timeout = ?limits.write_timeout, max_connections = limits.max_connections, max_requests_per_connection = limits.max_requests_per_connection, health_slots = HEALTH_SLOTS, "serving /metrics, /healthz and /readyz");
    }
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let health_slots = Arc::new(Semaphore::new(HEALTH_SLOTS));
    let max_requests = limits.max_requests_per_connection.max(1);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => {
                let (mut stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let endpoints = endpoints.clone();
                if let Ok(slot) = slots.clone().try_acquire_owned() {
                    let conn = Conn::new(stream, Vec::new(), limits.write_timeout);
                    tokio::spawn(serve_connection(conn, endpoints, limits, max_requests, peer, slot));
                    continue;
                }
                // Closing at once rather than queueing: a waiting connection would
                // still hold a socket, and the client learns immediately.
                let Ok(slot) = health_slots.clone().try_acquire_owned() else {
                    (endpoints.rejected)();
                    tracing::debug!(%peer, "metrics endpoint at its connection limit; closed a connection");
                    drop(stream);
                    continue;
                };
                tokio::spawn(async move {
                    let Some(head) = read_health_request_line(&mut stream, limits.header_read_timeout).await else {
                        (endpoints.rejected)();
                        tracing::debug!(%peer, "metrics endpoint at its connection limit; closed a connection that is no health probe");
                        return;
                    };
                    let conn = Conn::new(stream, head, limits.write_timeout);
                    serve_connection(conn, endpoints, limits, 1, peer, slot).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
