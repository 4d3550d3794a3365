//! The HTTP source's connections: a limit per listener and two timeouts, so
//! clients that open connections and send nothing (or trickle bytes) cannot
//! use up the process's file descriptors.
//!
//! - `header_read_timeout`: a request's headers must arrive within it, and an
//!   idle keep-alive connection waits no longer for its next request (hyper's
//!   header-read timer, plus axum-server's first-request timeout, which also
//!   bounds protocol detection).
//! - `idle_timeout`: nothing read or written for this long closes the
//!   connection (a stalled body). At least `request_timeout` plus a second, so
//!   a durable request waiting for its commit is never cut.
//! - `max_connections`: a connection past the limit is answered
//!   `503 too_many_connections` with `Retry-After` and closed at once.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::accept::Accept;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long a refused client gets to read its 503.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Hands each accepted connection a permit, or refuses it.
#[derive(Clone)]
pub struct LimitedAcceptor {
    permits: Arc<Semaphore>,
    limit: usize,
    idle_timeout: Duration,
    retry_after_secs: u64,
    key: String,
}

impl LimitedAcceptor {
    pub fn new(key: String, limit: usize, idle_timeout: Duration, retry_after_secs: u64) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            idle_timeout,
            retry_after_secs,
            key,
        }
    }
}

impl<S: Send + 'static> Accept<TcpStream, S> for LimitedAcceptor {
    type Stream = Guarded;
    type Service = S;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Guarded, S)>> + Send>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let permit = Arc::clone(&self.permits).try_acquire_owned();
        let acceptor = self.clone();
        Box::pin(async move {
            let _ = stream.set_nodelay(true);
            match permit {
                Ok(permit) => Ok((Guarded::new(stream, permit, acceptor.idle_timeout), service)),
                Err(_) => {
                    metrics::counter!(
                        "iggy_connector_http_connections_refused_total",
                        "connector_key" => acceptor.key.clone()
                    )
                    .increment(1);
                    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, acceptor.refuse(stream)).await;
                    Err(io::Error::other("connection limit reached"))
                }
            }
        })
    }
}

impl LimitedAcceptor {
    /// Reads the request head, answers 503, then drains what else the client
    /// sent (closing with unread bytes would reset the connection before the
    /// client read the answer). The caller bounds the whole exchange.
    async fn refuse(&self, mut stream: TcpStream) {
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|window| window == b"\r\n\r\n") && head.len() < 16 * 1024 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(read) => head.extend_from_slice(&chunk[..read]),
            }
        }
        let body = format!(
            "{{\"error\":\"too_many_connections\",\"message\":\"this listener already has its {} \
             connections (max_connections) open; retry later\"}}",
            self.limit
        );
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            self.retry_after_secs,
            body.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
        let _ = stream.shutdown().await;
        while matches!(stream.read(&mut chunk).await, Ok(read) if read > 0) {}
    }
}

/// A connection holding its permit, closed after `idle_timeout` without
/// progress in either direction.
pub struct Guarded {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
}

impl Guarded {
    fn new(stream: TcpStream, permit: OwnedSemaphorePermit, idle_timeout: Duration) -> Self {
        Self {
            stream,
            _permit: permit,
            idle_timeout,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
        }
    }

    fn progressed(&mut self) {
        let deadline = Instant::now() + self.idle_timeout;
        self.idle.as_mut().reset(deadline);
    }

    /// After a pending operation: an error once the idle deadline passed.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection was idle for idle_timeout",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Ready(result) => {
                if matches!(result, Ok(written) if written > 0) {
                    self.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                if matches!(result, Ok(written) if written > 0) {
                    self.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
