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
//!   for `/healthz`, `/livez` or `/readyz`, once, and must send its whole request head
//!   (at most [`MAX_HEALTH_HEAD`] bytes) within `header_read_timeout`; any other
//!   request line closes it as soon as it shows;
//! - a connection holds its health slot against newcomers only once its whole head has
//!   arrived (in its socket, read yet or not). Until then, a connection accepted while
//!   every slot is taken takes the slot of the oldest such connection, which is closed.
//!   Clients that say nothing, or trickle their request, thus only evict each other,
//!   and a newcomer is closed at once only when every health slot holds a complete
//!   health request. A probe sent in one write, as the kubelet sends it, is lost only
//!   if [`HEALTH_SLOTS`] more connections are accepted after it before its head
//!   arrives: a flood that reconnects as soon as it is closed can still do that to a
//!   prober that stalls between connecting and writing (a loaded node), not to one
//!   whose head arrives with its connection.
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, oneshot};
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
/// others. A connection in one gives it up to a newcomer until its whole request head
/// has come, so clients that send nothing cannot hold them either.
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

/// The longest request head a connection in a health slot may send: a probe's is a
/// few hundred bytes, with the headers a probe spec adds.
const MAX_HEALTH_HEAD: usize = 4 * 1024;

/// Whether `head` holds the blank line that ends a request head (hyper accepts bare
/// `\n` line ends too).
fn ends_head(head: &[u8]) -> bool {
    head.windows(2).any(|w| w == b"\n\n") || head.windows(3).any(|w| w == b"\n\r\n")
}

/// Whether `head` is the whole head of a health request.
fn is_health_head(head: &[u8]) -> bool {
    is_health_request(head) == Some(true) && ends_head(head)
}

/// A second handle on a connection's socket, to look at what has arrived on it
/// without taking it; `None` if the system has no file descriptor to spare.
fn peek_handle(stream: &impl AsFd) -> Option<std::net::TcpStream> {
    let socket = std::net::TcpStream::from(stream.as_fd().try_clone_to_owned().ok()?);
    // Already so (the runtime's sockets do not block), but a peek must not wait.
    socket.set_nonblocking(true).ok()?;
    Some(socket)
}

/// Whether the whole head of a health request has arrived on `socket`, read or not.
fn has_sent_health_head(socket: &std::net::TcpStream) -> bool {
    let mut buf = [0; MAX_HEALTH_HEAD];
    // An error is "nothing to read yet" or a failed connection: no probe to keep.
    socket
        .peek(&mut buf)
        .ok()
        .and_then(|n| buf.get(..n))
        .is_some_and(is_health_head)
}

/// Reads the whole request head of a connection in a health slot, so that its slot
/// can be kept from then on; `None` as soon as it shows to be no health request, if it
/// outgrows [`MAX_HEALTH_HEAD`] or the client closes first. What was read (the head,
/// and whatever came with it) is handed on to hyper.
async fn read_health_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut chunk = [0; 1024];
    // Where the blank line may start that the next read can complete: the bytes
    // before were searched already (a client may send a byte at a time).
    let mut unsearched = 0;
    loop {
        match is_health_request(&head) {
            Some(false) => return None,
            Some(true) if ends_head(head.get(unsearched..)?) => return Some(head),
            Some(true) | None => unsearched = head.len().saturating_sub(2),
        }
        let room = MAX_HEALTH_HEAD.saturating_sub(head.len()).min(chunk.len());
        let into = chunk.get_mut(..room).filter(|c| !c.is_empty())?;
        match stream.read(into).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(into.get(..n)?),
        }
    }
}

/// One connection in the health slots.
#[derive(Debug)]
struct Held {
    id: u64,
    /// Whether its whole request head has arrived: from then on it is never evicted.
    head_complete: bool,
    /// While the head is incomplete, a [`peek_handle`] on the socket: its task may
    /// not have run since the head arrived, so the socket itself is asked before the
    /// connection is evicted.
    socket: Option<std::net::TcpStream>,
    /// Dropped to evict it: its task sees its [`HealthSlot::evicted`] resolve.
    _evict: oneshot::Sender<()>,
}

impl Held {
    fn complete_head(&mut self) {
        self.head_complete = true;
        self.socket = None;
    }

    /// Whether a newcomer may evict it: only while its whole head has not arrived.
    fn evictable(&mut self) -> bool {
        if !self.head_complete && self.socket.as_ref().is_some_and(has_sent_health_head) {
            self.complete_head();
        }
        !self.head_complete
    }
}

/// The [`HEALTH_SLOTS`], and the connections in them, oldest first.
#[derive(Debug)]
struct HealthSlots {
    capacity: usize,
    held: Mutex<Vec<Held>>,
    next_id: AtomicU64,
}

/// A connection's place in the [`HealthSlots`], given up when dropped.
#[derive(Debug)]
struct HealthSlot {
    slots: Arc<HealthSlots>,
    id: u64,
    /// Resolves (with an error) once a newcomer has evicted the connection.
    evicted: oneshot::Receiver<()>,
}

impl HealthSlots {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            held: Mutex::new(Vec::with_capacity(capacity)),
            next_id: AtomicU64::new(0),
        })
    }

    /// The lock is only held for a few steps that do not panic, so a poisoned one
    /// still holds a consistent list.
    fn held(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a newcomer (`socket`: its [`peek_handle`]): a free one, else the
    /// one of the oldest connection that has not sent its whole request head yet,
    /// which is evicted; `None` when every slot holds a complete health request. A
    /// connection that says nothing (or trickles) thus cannot keep a slot from a
    /// probe, which is safe as soon as its head has arrived.
    fn take(self: &Arc<Self>, socket: Option<std::net::TcpStream>) -> Option<HealthSlot> {
        let mut held = self.held();
        if held.len() >= self.capacity {
            let oldest_incomplete = held.iter_mut().position(Held::evictable)?;
            // Dropping its sender tells its task.
            held.remove(oldest_incomplete);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (evict, evicted) = oneshot::channel();
        held.push(Held {
            id,
            head_complete: false,
            socket,
            _evict: evict,
        });
        Some(HealthSlot {
            slots: self.clone(),
            id,
            evicted,
        })
    }
}

impl HealthSlot {
    /// Marks the connection's request head complete, so that it keeps its slot
    /// until it ends; `false` if it was evicted first.
    fn complete_head(&self) -> bool {
        let mut held = self.slots.held();
        let Some(me) = held.iter_mut().find(|h| h.id == self.id) else {
            return false;
        };
        me.complete_head();
        true
    }
}

impl Drop for HealthSlot {
    fn drop(&mut self) {
        self.slots.held().retain(|h| h.id != self.id);
    }
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

/// Serves one accepted connection, holding its `_slot` until it ends; `max_requests`
/// of one makes it a one-shot.
async fn serve_connection<S>(
    conn: Conn,
    endpoints: Endpoints,
    limits: HttpLimits,
    max_requests: usize,
    peer: std::net::SocketAddr,
    _slot: S,
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

/// How the wait for the request head of a connection in a health slot ended.
enum HealthHead {
    /// What was read: the whole head of a health request, and whatever came with it.
    Complete(Vec<u8>),
    /// Another request, a head too long or too slow, or a client that went away.
    NoProbe,
    /// A newcomer took the slot first.
    Evicted,
}

/// Reads the request head of a connection in a health slot within `limit`, unless a
/// newcomer evicts it before.
async fn await_health_head(
    stream: &mut TcpStream,
    slot: &mut HealthSlot,
    limit: Duration,
) -> HealthHead {
    tokio::select! {
        _ = &mut slot.evicted => HealthHead::Evicted,
        head = tokio::time::timeout(limit, read_health_head(stream)) => match head {
            Ok(Some(head)) if slot.complete_head() => HealthHead::Complete(head),
            // Evicted since the read ended.
            Ok(Some(_)) => HealthHead::Evicted,
            Ok(None) | Err(_) => HealthHead::NoProbe,
        },
    }
}

/// Serves a connection in a health slot: one health request, once its whole head
/// has come.
async fn serve_health_probe(
    mut stream: TcpStream,
    mut slot: HealthSlot,
    endpoints: Endpoints,
    limits: HttpLimits,
    peer: std::net::SocketAddr,
) {
    match await_health_head(&mut stream, &mut slot, limits.header_read_timeout).await {
        HealthHead::Complete(head) => {
            let conn = Conn::new(stream, head, limits.write_timeout);
            serve_connection(conn, endpoints, limits, 1, peer, slot).await;
        }
        HealthHead::NoProbe => {
            (endpoints.rejected)();
            tracing::debug!(%peer, "metrics endpoint at its connection limit; closed a connection that is no health probe");
        }
        HealthHead::Evicted => {
            (endpoints.rejected)();
            tracing::debug!(%peer, "metrics endpoint at its connection limit; closed a connection that had not sent its request head, for a newcomer");
        }
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
    let health_slots = HealthSlots::new(HEALTH_SLOTS);
    let max_requests = limits.max_requests_per_connection.max(1);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
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
                let Some(slot) = health_slots.take(peek_handle(&stream)) else {
                    (endpoints.rejected)();
                    tracing::debug!(%peer, "metrics endpoint at its connection limit; closed a connection");
                    drop(stream);
                    continue;
                };
                tokio::spawn(serve_health_probe(stream, slot, endpoints, limits, peer));
            }
        }
    }
}

#[cfg(test)]
mod tests;
