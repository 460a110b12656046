//! The accepted connection as the gRPC server sees it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::OwnedSemaphorePermit;
use tonic::transport::server::{Connected, UdsConnectInfo};
use tracing::warn;

use super::authority::AuthorityRewriter;

/// Bytes read from the socket per call; one default-size HTTP/2 frame plus header.
const READ_CHUNK: usize = 16_384 + 9;

/// A unix-socket connection whose client-to-server bytes go through
/// the `:authority` shim; writes go straight to the socket.
///
/// Rewriting happens inline in `poll_read` rather than in a relay task: no extra
/// task or copy per connection, backpressure is the socket's own, and peer
/// credentials come from the real socket.
#[derive(Debug)]
pub(crate) struct ShimmedStream {
    inner: UnixStream,
    rewriter: AuthorityRewriter,
    chunk: Box<[u8]>,
    /// Rewritten bytes not yet handed to the reader, from `ready_pos` on.
    ready: Vec<u8>,
    ready_pos: usize,
    read_state: ReadState,
    /// The connection's place under the socket's connection limit, given back when
    /// the server drops the connection.
    _slot: Option<OwnedSemaphorePermit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadState {
    Open,
    Eof,
    /// The rewriter refused the client's bytes; the connection is unusable.
    Failed,
}

impl ShimmedStream {
    pub(crate) fn new(inner: UnixStream) -> Self {
        Self {
            inner,
            rewriter: AuthorityRewriter::new(),
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            ready: Vec::new(),
            ready_pos: 0,
            read_state: ReadState::Open,
            _slot: None,
        }
    }

    pub(crate) fn holding(mut self, slot: OwnedSemaphorePermit) -> Self {
        self._slot = Some(slot);
        self
    }

    /// The underlying socket, e.g. for peer credentials.
    #[cfg(test)]
    pub(crate) fn get_ref(&self) -> &UnixStream {
        &self.inner
    }
}

impl AsyncRead for ShimmedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.ready_pos < this.ready.len() {
                let available = &this.ready[this.ready_pos..];
                let n = available.len().min(buf.remaining());
                buf.put_slice(&available[..n]);
                this.ready_pos += n;
                if this.ready_pos == this.ready.len() {
                    this.ready.clear();
                    this.ready_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            match this.read_state {
                ReadState::Open => {}
                ReadState::Eof => return Poll::Ready(Ok(())),
                ReadState::Failed => return Poll::Ready(Err(rewrite_failed())),
            }

            let mut chunk = ReadBuf::new(&mut this.chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
            let input = chunk.filled();
            if input.is_empty() {
                // A header block cut short by EOF is dropped: the server sees the
                // connection end mid-frame either way.
                this.read_state = ReadState::Eof;
                continue;
            }
            // A partial header block yields no output yet; the loop then reads more
            // rather than return an empty read, which the server would take for EOF.
            if let Err(error) = this.rewriter.push(input, &mut this.ready) {
                warn!(%error, "closing a plugin socket connection");
                this.read_state = ReadState::Failed;
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
            }
        }
    }
}

fn rewrite_failed() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "connection closed after an HTTP/2 header rewrite error",
    )
}

impl AsyncWrite for ShimmedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
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

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Same connect info as a plain `UnixStream`, so handlers can read the peer's
/// credentials from request extensions.
impl Connected for ShimmedStream {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
