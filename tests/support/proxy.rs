//! Loopback relays in front of a server: a TCP one to make the server
//! unreachable and reachable again on demand (a backend down at start, a
//! connection lost, cut mid-request), and an HTTP one that answers for the
//! server `429 Too Many Requests` with a `Retry-After` when told to.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// A loopback TCP relay to `target`; while down, it drops the connections
/// it relays and every new one (the client sees its request fail).
pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    down: watch::Sender<bool>,
    /// While true, no byte is passed either way.
    stalled: watch::Sender<bool>,
    /// Client-to-server bytes relayed so far, and the count at which the
    /// relay cuts every connection (`u64::MAX`: never).
    sent: Mutex<(u64, u64)>,
}

impl Shared {
    /// How many of `len` further client bytes may pass; when that is fewer,
    /// the caller forwards them and then [`cut`](Self::cut)s.
    fn allow(&self, len: usize) -> usize {
        let mut sent = self.sent.lock().unwrap();
        let (count, cut_at) = *sent;
        let allowed = (len as u64).min(cut_at.saturating_sub(count));
        sent.0 += allowed;
        usize::try_from(allowed).unwrap()
    }

    fn cut(&self) {
        self.sent.lock().unwrap().1 = u64::MAX;
        self.down.send_replace(true);
    }
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            down: watch::channel(false).0,
            stalled: watch::channel(false).0,
            sent: Mutex::new((0, u64::MAX)),
        });
        let relays = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *relays.down.borrow() {
                    drop(inbound);
                    continue;
                }
                let shared = relays.clone();
                tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        relay(inbound, outbound, shared).await;
                    }
                });
            }
        });
        Self { addr, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_down(&self, down: bool) {
        self.shared.down.send_replace(down);
    }

    /// While stalled, the relay passes no byte either way: connections stay
    /// open and what arrives waits in the relay, so nothing a client asks
    /// is answered until it is released.
    pub fn set_stalled(&self, stalled: bool) {
        self.shared.stalled.send_replace(stalled);
    }

    /// Client-to-server bytes relayed so far, over every connection.
    pub fn sent(&self) -> u64 {
        self.shared.sent.lock().unwrap().0
    }

    /// Relays `bytes` more client-to-server bytes, then goes down: every
    /// connection is cut there, in the middle of whatever was being sent.
    pub fn cut_after(&self, bytes: u64) {
        let mut sent = self.shared.sent.lock().unwrap();
        sent.1 = sent.0 + bytes;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relays one connection until either side closes or the relay goes down.
async fn relay(inbound: TcpStream, outbound: TcpStream, shared: Arc<Shared>) {
    let mut down = shared.down.subscribe();
    let (mut client_reader, mut client_writer) = inbound.into_split();
    let (mut server_reader, mut server_writer) = outbound.into_split();
    let upstream = async {
        let mut buffer = vec![0; 16 * 1024];
        loop {
            let read = client_reader.read(&mut buffer).await?;
            unstalled(&shared).await;
            if read == 0 {
                return server_writer.shutdown().await;
            }
            let allowed = shared.allow(read);
            server_writer.write_all(&buffer[..allowed]).await?;
            if allowed < read {
                shared.cut();
                return Ok(());
            }
        }
    };
    let downstream = async {
        let mut buffer = vec![0; 16 * 1024];
        loop {
            let read = server_reader.read(&mut buffer).await?;
            unstalled(&shared).await;
            if read == 0 {
                return Ok::<_, std::io::Error>(());
            }
            client_writer.write_all(&buffer[..read]).await?;
        }
    };
    tokio::select! {
        _ = async { tokio::join!(upstream, downstream) } => {}
        _ = down.wait_for(|down| *down) => {}
    }
}

/// Returns once the relay is not stalled.
async fn unstalled(shared: &Shared) {
    let mut stalled = shared.stalled.subscribe();
    // The sender lives in `shared`: the wait ends only when released.
    let _ = stalled.wait_for(|stalled| !*stalled).await;
}

/// A loopback HTTP/1 relay to `target` that, while throttling, answers every
/// request itself with `429 Too Many Requests` and `Retry-After`.
pub struct HttpProxy {
    pub addr: SocketAddr,
    throttle: Arc<Mutex<Option<Duration>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Relay {
    target: SocketAddr,
    client: reqwest::Client,
    throttle: Arc<Mutex<Option<Duration>>>,
}

impl HttpProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let throttle = Arc::new(Mutex::new(None));
        let relay = Relay {
            target,
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            throttle: throttle.clone(),
        };
        let app = axum::Router::new()
            .fallback(forward)
            .layer(DefaultBodyLimit::disable())
            .with_state(relay);
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Self {
            addr,
            throttle,
            task,
        }
    }

    /// From now on every request is answered `429` with `Retry-After` of
    /// `retry_after` (whole seconds), until `None`.
    pub fn throttle(&self, retry_after: Option<Duration>) {
        *self.throttle.lock().unwrap() = retry_after;
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State(relay): State<Relay>, request: Request) -> Response {
    if let Some(retry_after) = *relay.throttle.lock().unwrap() {
        let seconds = HeaderValue::from(retry_after.as_secs());
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, seconds)],
            "too many requests",
        )
            .into_response();
    }
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let sent = relay
        .client
        .request(parts.method, format!("http://{}{path}", relay.target))
        .headers(end_to_end(&parts.headers))
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(error) => return (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    };
    let status = answer.status();
    let headers = end_to_end(answer.headers());
    let body: Bytes = answer.bytes().await.unwrap_or_default();
    (status, headers, body).into_response()
}

/// `headers` without the hop-by-hop ones and those the relay sets itself.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    const HOP: [HeaderName; 5] = [
        header::HOST,
        header::CONNECTION,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ];
    headers
        .iter()
        .filter(|(name, _)| !HOP.contains(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}
