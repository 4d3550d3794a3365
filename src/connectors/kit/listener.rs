//! An HTTP server's connections: a limit per listener and two timeouts, so
//! clients that open connections and send nothing (or trickle bytes) cannot
//! use up the process's file descriptors. Used by the push sources'
//! listeners and by the control API.
//!
//! - `header_read_timeout`: a request's headers must arrive within it, and an
//!   idle keep-alive connection waits no longer for its next request (hyper's
//!   header-read timer, plus axum-server's first-request timeout, which also
//!   bounds protocol detection).
//! - `idle_timeout`: nothing read or written for this long closes the
//!   connection (a stalled body). At least `request_timeout` plus a second, so
//!   a durable request waiting for its commit is never cut.
//! - `max_connections`: a connection past the limit is answered 503 with
//!   `Retry-After` and the listener's own JSON body, and closed at once.
//!   With [`LimitedAcceptor::evicting`] (the control API) it first makes
//!   room: the oldest connection on which no request has come yet (an idle
//!   connect, a slowloris trickling its headers) is closed and the newcomer
//!   takes its place, as nginx reuses its waiting connections. A flood of
//!   idle connections then holds `max_connections` descriptors, never more,
//!   and a client that sends its request at once is served; only when every
//!   connection carries a request is the newcomer answered 503.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::Server;
use axum_server::accept::Accept;
use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long a refused client gets to read its 503.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// One listener's connection limits.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub retry_after_secs: u64,
}

impl ConnectionLimits {
    /// The acceptor counting connections against `max_connections`:
    /// `refusal_body` is the JSON a connection past the limit is answered
    /// with, `refused` counts those. Wrap it in a TLS acceptor for HTTPS (the
    /// limit applies before the handshake).
    pub fn acceptor(&self, refusal_body: String, refused: metrics::Counter) -> LimitedAcceptor {
        LimitedAcceptor {
            permits: Arc::new(Semaphore::new(self.max_connections)),
            idle_timeout: self.idle_timeout,
            retry_after_secs: self.retry_after_secs,
            refusal_body: refusal_body.into(),
            refused,
            waiting: None,
        }
    }

    /// Sets the header-read timeouts of `server` (its acceptor is set apart).
    pub fn configure<A>(&self, server: Server<SocketAddr, A>) -> Server<SocketAddr, A> {
        let mut server = server.first_request_timeout(self.header_read_timeout);
        server
            .http_builder()
            .http1()
            .header_read_timeout(self.header_read_timeout);
        server
    }
}

/// Hands each accepted connection a permit, or refuses it.
#[derive(Clone)]
pub struct LimitedAcceptor {
    permits: Arc<Semaphore>,
    idle_timeout: Duration,
    retry_after_secs: u64,
    refusal_body: Arc<str>,
    refused: metrics::Counter,
    /// With [`evicting`](Self::evicting): the connections without a request
    /// yet, oldest first.
    waiting: Option<Arc<Mutex<Waiting>>>,
}

/// The connections holding a permit on which no request has come yet, by
/// accept order.
#[derive(Default)]
struct Waiting {
    next: u64,
    connections: BTreeMap<u64, Arc<Eviction>>,
}

/// Tells a connection it was closed to make room.
#[derive(Default)]
struct Eviction {
    evicted: AtomicBool,
    waker: AtomicWaker,
}

impl Waiting {
    fn add(&mut self) -> (u64, Arc<Eviction>) {
        let id = self.next;
        self.next += 1;
        let eviction = Arc::new(Eviction::default());
        self.connections.insert(id, Arc::clone(&eviction));
        (id, eviction)
    }

    /// Closes the oldest connection without a request; `false` when every
    /// connection carries one.
    fn evict_oldest(&mut self) -> bool {
        match self.connections.pop_first() {
            Some((_, eviction)) => {
                eviction.evicted.store(true, Ordering::Release);
                eviction.waker.wake();
                true
            }
            None => false,
        }
    }
}

fn lock(waiting: &Mutex<Waiting>) -> std::sync::MutexGuard<'_, Waiting> {
    waiting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LimitedAcceptor {
    /// At the limit, closes the oldest connection on which no request has
    /// come yet to make room for a new one, rather than refusing the new one.
    pub fn evicting(mut self) -> Self {
        self.waiting = Some(Arc::default());
        self
    }

    /// A permit: a free one, else (evicting) the one a closed waiting
    /// connection gives back.
    async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Some(permit);
        }
        let waiting = self.waiting.as_ref()?;
        if !lock(waiting).evict_oldest() {
            return None;
        }
        tokio::time::timeout(REFUSAL_TIMEOUT, Arc::clone(&self.permits).acquire_owned())
            .await
            .ok()?
            .ok()
    }
}

impl<S: Send + 'static> Accept<TcpStream, S> for LimitedAcceptor {
    type Stream = Guarded;
    type Service = Dispatched<S>;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Guarded, Dispatched<S>)>> + Send>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let acceptor = self.clone();
        Box::pin(async move {
            let _ = stream.set_nodelay(true);
            match acceptor.permit().await {
                Some(permit) => {
                    let mut guarded = Guarded::new(stream, permit, acceptor.idle_timeout);
                    let mut dispatched = Dispatched {
                        inner: service,
                        waiting: None,
                    };
                    if let Some(waiting) = &acceptor.waiting {
                        let (id, eviction) = lock(waiting).add();
                        guarded.waiting = Some(Registered {
                            waiting: Arc::clone(waiting),
                            id,
                            eviction,
                        });
                        dispatched.waiting = Some((Arc::clone(waiting), id));
                    }
                    Ok((guarded, dispatched))
                }
                None => {
                    acceptor.refused.increment(1);
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
        let body = &self.refusal_body;
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

/// A connection's service: the first request dispatched on it takes the
/// connection out of those an evicting acceptor may close.
#[derive(Clone)]
pub struct Dispatched<S> {
    inner: S,
    waiting: Option<(Arc<Mutex<Waiting>>, u64)>,
}

impl<S, R> tower_service::Service<R> for Dispatched<S>
where
    S: tower_service::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        if let Some((waiting, id)) = self.waiting.take() {
            lock(&waiting).connections.remove(&id);
        }
        self.inner.call(request)
    }
}

/// A connection of an evicting acceptor, in its waiting list until a
/// request comes.
struct Registered {
    waiting: Arc<Mutex<Waiting>>,
    id: u64,
    eviction: Arc<Eviction>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.waiting).connections.remove(&self.id);
    }
}

/// A connection holding its permit, closed after `idle_timeout` without
/// progress in either direction, or (evicting) to make room.
pub struct Guarded {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
    waiting: Option<Registered>,
}

impl Guarded {
    fn new(stream: TcpStream, permit: OwnedSemaphorePermit, idle_timeout: Duration) -> Self {
        Self {
            stream,
            _permit: permit,
            idle_timeout,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            waiting: None,
        }
    }

    /// An error once an evicting acceptor closed this connection to make
    /// room; registers to be woken when it does.
    fn check_evicted(&self, cx: &mut Context<'_>) -> Option<io::Error> {
        let registered = self.waiting.as_ref()?;
        registered.eviction.waker.register(cx.waker());
        registered
            .eviction
            .evicted
            .load(Ordering::Acquire)
            .then(|| {
                io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "closed to make room: no request came before the connection limit was reached",
                )
            })
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
        if let Some(error) = self.check_evicted(cx) {
            return Poll::Ready(Err(error));
        }
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
        if let Some(error) = self.check_evicted(cx) {
            return Poll::Ready(Err(error));
        }
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
