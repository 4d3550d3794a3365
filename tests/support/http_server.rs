//! A scripted HTTP server for protocol tests (beside the Iggy test server):
//! axum on 127.0.0.1:0, answering from a script of replies, then with a
//! default one, recording every request. Faults: refuse connections (the port
//! closes), stall (never answer), drop the connection before answering,
//! 429/503 with a `Retry-After` in seconds or as a date. `start_tls` serves
//! HTTPS with a given certificate (rcgen in the tests).

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// This status, with a `Retry-After` when set, and a short body.
    Status {
        status: u16,
        retry_after: Option<RetryAfter>,
    },
    /// Never answer; the request hangs until the client gives up.
    Stall,
    /// Close the connection without an answer.
    Drop,
}

#[derive(Debug, Clone, Copy)]
pub enum RetryAfter {
    Seconds(u64),
    Date(SystemTime),
}

impl Reply {
    pub const OK: Reply = Reply::status(200);

    pub const fn status(status: u16) -> Self {
        Reply::Status {
            status,
            retry_after: None,
        }
    }

    /// `status` asking the client to wait `seconds` (a 429 or 503).
    pub const fn retry_after(status: u16, seconds: u64) -> Self {
        Reply::Status {
            status,
            retry_after: Some(RetryAfter::Seconds(seconds)),
        }
    }

    /// `status` asking the client to wait until `date` (an HTTP date).
    pub const fn retry_at(status: u16, date: SystemTime) -> Self {
        Reply::Status {
            status,
            retry_after: Some(RetryAfter::Date(date)),
        }
    }
}

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub peer: SocketAddr,
    pub method: Method,
    /// As sent: absolute (`http://host/path`) when it came through as a proxy.
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    /// The body with its `Content-Encoding: gzip` undone (by the system's gzip,
    /// a decoder independent of ours).
    pub fn decoded_body(&self) -> Vec<u8> {
        let gzipped = self
            .headers
            .get("content-encoding")
            .is_some_and(|encoding| encoding == "gzip");
        if !gzipped {
            return self.body.to_vec();
        }
        super::gunzip::gunzip(&self.body)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.decoded_body()).expect("a JSON body")
    }
}

#[derive(Default)]
struct Shared {
    script: VecDeque<Reply>,
    default: Option<Reply>,
    received: Vec<Received>,
    /// A duplicate of each open connection's socket, to cut it from outside.
    connections: HashMap<SocketAddr, std::net::TcpStream>,
}

/// The server; clones share it. It runs until the test's runtime ends.
#[derive(Clone)]
pub struct ScriptedServer {
    shared: Arc<Mutex<Shared>>,
    refusing: Arc<watch::Sender<bool>>,
    pub address: SocketAddr,
}

impl ScriptedServer {
    /// Starts a plain-HTTP server answering `script`, then 200.
    pub async fn start(script: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local address");
        let server = Self::new(script, address);
        let listener = FaultyListener {
            listener: Some(listener),
            address,
            shared: server.shared.clone(),
            refusing: server.refusing.subscribe(),
        };
        let app = server.router();
        tokio::spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
                .await
                .expect("the scripted server runs");
        });
        server
    }

    /// Starts an HTTPS server presenting `cert_pem` (refusing connections is
    /// not supported here; the other faults are).
    pub async fn start_tls(script: Vec<Reply>, cert_pem: &str, key_pem: &str) -> Self {
        let config = axum_server::tls_rustls::RustlsConfig::from_pem(
            cert_pem.as_bytes().to_vec(),
            key_pem.as_bytes().to_vec(),
        )
        .await
        .expect("a usable certificate");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("local address");
        let server = Self::new(script, address);
        let app = server.router();
        tokio::spawn(async move {
            axum_server::from_tcp_rustls(listener, config)
                .expect("a listening socket")
                .serve(app.into_make_service_with_connect_info::<Peer>())
                .await
                .expect("the scripted server runs");
        });
        server
    }

    fn new(script: Vec<Reply>, address: SocketAddr) -> Self {
        Self {
            shared: Arc::new(Mutex::new(Shared {
                script: script.into(),
                ..Shared::default()
            })),
            refusing: Arc::new(watch::channel(false).0),
            address,
        }
    }

    fn router(&self) -> axum::Router {
        axum::Router::new()
            .fallback(answer)
            .with_state(self.clone())
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    pub fn https_url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.address.port())
    }

    /// What to answer once the script is used up (200 unless set).
    pub fn set_default(&self, reply: Reply) {
        self.lock().default = Some(reply);
    }

    /// Appends replies to the script.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.lock().script.extend(replies);
    }

    /// Closes the port and every open connection (new ones are refused),
    /// until [`ScriptedServer::accept`].
    pub fn refuse(&self) {
        self.refusing.send_replace(true);
        for (_, socket) in self.lock().connections.drain() {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    /// Listens again on the same port.
    pub fn accept(&self) {
        self.refusing.send_replace(false);
    }

    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    pub fn count(&self) -> usize {
        self.lock().received.len()
    }

    pub fn bodies(&self) -> Vec<serde_json::Value> {
        self.received().iter().map(Received::json).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The client's address, as the faulty listener accepted it.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

impl Connected<IncomingStream<'_, FaultyListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, FaultyListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// The TLS server (axum-server) hands over the address itself.
impl Connected<SocketAddr> for Peer {
    fn connect_info(address: SocketAddr) -> Self {
        Peer(address)
    }
}

/// A TCP listener that keeps a handle on each connection (to drop it) and
/// closes its port while the server refuses.
struct FaultyListener {
    listener: Option<TcpListener>,
    address: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    refusing: watch::Receiver<bool>,
}

impl Listener for FaultyListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if *self.refusing.borrow_and_update() {
                self.listener = None;
                let _ = self.refusing.wait_for(|refusing| !refusing).await;
                continue;
            }
            let listener = match &self.listener {
                Some(listener) => listener,
                None => self.listener.insert(
                    TcpListener::bind(self.address)
                        .await
                        .expect("the port is free again"),
                ),
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = self.refusing.changed() => continue,
            };
            let Ok((stream, peer)) = accepted else {
                continue;
            };
            let Ok(stream) = stream.into_std() else {
                continue;
            };
            if let Ok(duplicate) = stream.try_clone() {
                lock(&self.shared).connections.insert(peer, duplicate);
            }
            if let Ok(stream) = TcpStream::from_std(stream) {
                return (stream, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.address)
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn answer(
    State(server): State<ScriptedServer>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let reply = {
        let mut shared = server.lock();
        shared.received.push(Received {
            at: Instant::now(),
            peer,
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body,
        });
        let scripted = shared.script.pop_front();
        scripted.or(shared.default.clone()).unwrap_or(Reply::OK)
    };
    match reply {
        Reply::Status {
            status,
            retry_after,
        } => {
            let status = StatusCode::from_u16(status).expect("a valid status");
            let body = format!("answer {}", status.as_u16());
            match retry_after {
                Some(RetryAfter::Seconds(seconds)) => {
                    (status, [("retry-after", seconds.to_string())], body).into_response()
                }
                Some(RetryAfter::Date(date)) => (
                    status,
                    [("retry-after", httpdate::fmt_http_date(date))],
                    body,
                )
                    .into_response(),
                None => (status, body).into_response(),
            }
        }
        Reply::Stall => std::future::pending::<Response>().await,
        Reply::Drop => {
            if let Some(socket) = server.lock().connections.remove(&peer) {
                let _ = socket.shutdown(Shutdown::Both);
            }
            std::future::pending::<Response>().await
        }
    }
}
