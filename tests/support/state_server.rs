//! An HTTP state server keeping upstream's state protocol (apache/iggy#3940),
//! for `[state] storage = "http"`: axum on 127.0.0.1:0. `GET /{name}`
//! answers the state with its `ETag` (404 when none); a write (`PUT`,
//! `POST`, `PATCH`) must be conditional: `If-None-Match: *` creates,
//! `If-Match: <tag>` replaces that version, anything else is 412 (428 with no
//! condition). A write whose `Idempotency-Key` was seen before gets the first
//! answer again, without being applied twice. `DELETE` removes. Faults:
//! answer 503 to the next writes after storing them (the answer is "lost"),
//! and require an `authorization` header.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::net::TcpListener;

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub if_match: Option<String>,
    pub if_none_match: Option<String>,
    pub idempotency_key: Option<String>,
    pub status: u16,
}

#[derive(Default)]
struct Inner {
    /// Resource name -> (version, body).
    resources: HashMap<String, (u64, Bytes)>,
    /// Idempotency key -> the status and tag first answered.
    answered: HashMap<String, (u16, Option<String>)>,
    seen: Vec<Seen>,
    /// Writes still to be stored and then answered 503.
    lose_answers: usize,
    /// The `authorization` header every request must carry.
    token: Option<String>,
}

pub struct StateServer {
    address: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl StateServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let inner = Arc::new(Mutex::new(Inner::default()));
        let router = axum::Router::new()
            .fallback(answer)
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            address,
            inner,
            task,
        }
    }

    /// The base URL (`[state.http] url`), under a path of its own.
    pub fn url(&self) -> String {
        format!("http://{}/connectors/state", self.address)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The writes seen, for one resource.
    pub fn writes(&self, name: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|seen| seen.method != Method::GET && seen.path.ends_with(name))
            .collect()
    }

    /// The version and body stored under `name` (`source_{key}`).
    pub fn stored(&self, name: &str) -> Option<(u64, Bytes)> {
        self.lock().resources.get(name).cloned()
    }

    /// Stores `body` under `name` as a new version, as another writer would.
    pub fn put_directly(&self, name: &str, body: &[u8]) {
        let mut inner = self.lock();
        let version = inner
            .resources
            .get(name)
            .map_or(1, |(version, _)| version + 1);
        inner
            .resources
            .insert(name.to_owned(), (version, Bytes::copy_from_slice(body)));
    }

    /// The next `count` writes are stored, then answered 503.
    pub fn lose_answers(&self, count: usize) {
        self.lock().lose_answers = count;
    }

    pub fn require_token(&self, token: &str) {
        self.lock().token = Some(token.to_owned());
    }
}

impl Drop for StateServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tag(version: u64) -> String {
    format!("\"v{version}\"")
}

async fn answer(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let name = uri.path().rsplit('/').next().unwrap_or_default().to_owned();
    let mut inner = inner.lock().unwrap();
    let (status, etag, body) = match &inner.token {
        Some(token) if header("authorization").as_deref() != Some(token.as_str()) => {
            (401, None, Bytes::from_static(b"who are you?"))
        }
        _ => handle(&mut inner, &method, &name, &header, body),
    };
    inner.seen.push(Seen {
        method,
        path: uri.path().to_owned(),
        if_match: header("if-match"),
        if_none_match: header("if-none-match"),
        idempotency_key: header("idempotency-key"),
        status,
    });
    let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
    if let Some(etag) = etag {
        response.headers_mut().insert("etag", etag.parse().unwrap());
    }
    response
}

fn handle(
    inner: &mut Inner,
    method: &Method,
    name: &str,
    header: &dyn Fn(&str) -> Option<String>,
    body: Bytes,
) -> (u16, Option<String>, Bytes) {
    match *method {
        Method::GET => match inner.resources.get(name) {
            Some((version, stored)) => (200, Some(tag(*version)), stored.clone()),
            None => (404, None, Bytes::new()),
        },
        Method::DELETE => {
            inner.resources.remove(name);
            (204, None, Bytes::new())
        }
        _ => {
            let key = header("idempotency-key");
            if let Some((status, etag)) = key.as_ref().and_then(|key| inner.answered.get(key)) {
                return (*status, etag.clone(), Bytes::new());
            }
            let current = inner.resources.get(name).map(|(version, _)| *version);
            let allowed = match (header("if-match"), header("if-none-match"), current) {
                (None, None, _) => return (428, None, Bytes::from_static(b"a condition, please")),
                (None, Some(any), None) if any == "*" => true,
                (Some(wanted), None, Some(version)) => wanted == tag(version),
                _ => false,
            };
            if !allowed {
                return (412, None, Bytes::from_static(b"version mismatch"));
            }
            let version = current.unwrap_or(0) + 1;
            inner.resources.insert(name.to_owned(), (version, body));
            let status = if current.is_some() { 200 } else { 201 };
            if let Some(key) = key {
                inner.answered.insert(key, (status, Some(tag(version))));
            }
            if inner.lose_answers > 0 {
                inner.lose_answers -= 1;
                return (503, None, Bytes::from_static(b"lost the answer"));
            }
            (status, Some(tag(version)), Bytes::new())
        }
    }
}
