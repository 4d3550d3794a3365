//! A Quickwit 0.8 protocol test server (no real one runs here, see
//! docs/connectors/quickwit.md): axum on 127.0.0.1:0, following Quickwit's documented
//! REST API for what the sink uses.
//!
//! - `GET /api/v1/version`;
//! - `GET /api/v1/indexes/{index_id}` (404 `{"message": "index `x` not
//!   found"}`), `POST /api/v1/indexes` with a YAML (or JSON) index config:
//!   `version`, `index_id` (3-255 of `a-zA-Z0-9-_.`, starting with a
//!   letter), `doc_mapping` with `mode` and `field_mappings` (400 on a bad
//!   config or an index that already exists);
//! - `POST /api/v1/{index_id}/ingest?commit=auto|wait_for|force`: NDJSON
//!   documents, answered `{"num_docs_for_processing": N}`. As 0.8 does, a line
//!   that is not a JSON object, or does not fit the doc mapping (an undeclared
//!   field under `mode: strict`, a value of the wrong type), is counted and
//!   dropped after the request was acknowledged. `auto` leaves documents
//!   queued (durable, not searchable) until a commit; `wait_for` and `force`
//!   commit before answering; 413 past the content length limit;
//! - `GET /api/v1/{index_id}/search?query=...&max_hits=N`: the committed
//!   documents (`*` or `field:value`), `num_hits` and `hits`.
//!
//! Faults: whole-request answers for the next ingest requests (429/503 with
//! `Retry-After`, or a pass for one handled as usual), down (503 for everything), a deleted index.
#![cfg(feature = "quickwit-sink")]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

#[derive(Debug, Clone, Default)]
struct Index {
    config: Value,
    /// Acknowledged, in the ingest queue, not yet searchable.
    queued: Vec<Value>,
    /// Searchable.
    committed: Vec<Value>,
    /// Dropped at indexing (parse failures).
    dropped: usize,
}

struct Shared {
    indexes: HashMap<String, Index>,
    /// Answers to the next ingest requests: (status, Retry-After seconds),
    /// or `None` for a request handled as usual.
    ingest_faults: VecDeque<Option<(u16, Option<u64>)>>,
    down: bool,
    content_limit: usize,
    seen: Vec<Seen>,
}

#[derive(Clone)]
pub struct QuickwitServer {
    shared: Arc<Mutex<Shared>>,
    pub address: SocketAddr,
}

impl QuickwitServer {
    pub async fn start() -> Self {
        let shared = Arc::new(Mutex::new(Shared {
            indexes: HashMap::new(),
            ingest_faults: VecDeque::new(),
            down: false,
            content_limit: 10 * 1024 * 1024,
            seen: Vec::new(),
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("local address");
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the quickwit server runs");
        });
        Self { shared, address }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// The next ingest request is answered `status` as a whole.
    pub fn fail_next_ingest(&self, status: u16, retry_after: Option<u64>) {
        self.lock()
            .ingest_faults
            .push_back(Some((status, retry_after)));
    }

    /// The next ingest request is handled as usual, ahead of the faults
    /// queued after it (a fault for the second request of a write).
    pub fn pass_next_ingest(&self) {
        self.lock().ingest_faults.push_back(None);
    }

    pub fn clear_faults(&self) {
        self.lock().ingest_faults.clear();
    }

    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    pub fn set_content_limit(&self, bytes: usize) {
        self.lock().content_limit = bytes;
    }

    pub fn delete_index(&self, id: &str) {
        self.lock().indexes.remove(id);
    }

    pub fn index_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().indexes.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The index config as the server stored it (parsed from its YAML).
    pub fn index_config(&self, id: &str) -> Option<Value> {
        Some(self.lock().indexes.get(id)?.config.clone())
    }

    /// Every acknowledged document kept (queued or committed), in order.
    pub fn documents(&self, id: &str) -> Vec<Value> {
        self.lock()
            .indexes
            .get(id)
            .map(|index| {
                index
                    .committed
                    .iter()
                    .chain(&index.queued)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The searchable documents.
    pub fn committed(&self, id: &str) -> Vec<Value> {
        self.lock()
            .indexes
            .get(id)
            .map(|index| index.committed.clone())
            .unwrap_or_default()
    }

    /// Documents acknowledged and then dropped as parse failures.
    pub fn dropped(&self, id: &str) -> usize {
        self.lock().indexes.get(id).map_or(0, |index| index.dropped)
    }

    /// Commits what is queued (the index's commit timeout passing).
    pub fn commit(&self, id: &str) {
        if let Some(index) = self.lock().indexes.get_mut(id) {
            let queued = std::mem::take(&mut index.queued);
            index.committed.extend(queued);
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The ingest requests: (query, lines).
    pub fn ingest_requests(&self) -> Vec<(String, usize)> {
        self.seen()
            .iter()
            .filter(|seen| seen.path.ends_with("/ingest"))
            .map(|seen| {
                let lines = seen
                    .body
                    .split(|byte| *byte == b'\n')
                    .filter(|line| !line.is_empty())
                    .count();
                (seen.query.clone(), lines)
            })
            .collect()
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn message(status: u16, text: &str) -> Response {
    (
        StatusCode::from_u16(status).expect("a status"),
        axum::Json(json!({"message": text})),
    )
        .into_response()
}

fn ok(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn metadata(id: &str, index: &Index) -> Value {
    json!({
        "version": "0.8",
        "index_uid": format!("{id}:01HQ0000000000000000000000"),
        "index_config": index.config,
        "checkpoint": {},
        "create_timestamp": 1_709_214_300,
        "sources": [],
    })
}

fn valid_index_id(id: &str) -> bool {
    (3..=255).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_alphabetic())
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
}

/// Whether `document` fits the doc mapping of `config`.
fn fits_mapping(config: &Value, document: &Map<String, Value>) -> bool {
    let mapping = &config["doc_mapping"];
    let strict = mapping["mode"].as_str() == Some("strict");
    let fields = mapping["field_mappings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    document.iter().all(|(name, value)| {
        match fields.iter().find(|field| field["name"] == name.as_str()) {
            None => !strict,
            Some(field) => fits(field["type"].as_str().unwrap_or("text"), value),
        }
    })
}

fn fits(kind: &str, value: &Value) -> bool {
    if let Some(inner) = kind
        .strip_prefix("array<")
        .and_then(|rest| rest.strip_suffix('>'))
    {
        return match value {
            Value::Array(items) => items.iter().all(|item| fits(inner, item)),
            other => fits(inner, other),
        };
    }
    match kind {
        "text" | "ip" | "bytes" => value.is_string(),
        "i64" => value.is_i64(),
        "u64" => value.is_u64(),
        "f64" => value.is_number(),
        "bool" => value.is_boolean(),
        "datetime" => value.is_string() || value.is_number(),
        "object" | "json" => value.is_object(),
        _ => true,
    }
}

fn matches_query(document: &Value, query: &str) -> bool {
    let query = query.trim();
    if query.is_empty() || query == "*" {
        return true;
    }
    match query.split_once(':') {
        Some((field, wanted)) => match &document[field] {
            Value::String(text) => text == wanted,
            other => serde_json::from_str::<Value>(wanted).is_ok_and(|parsed| &parsed == other),
        },
        None => false,
    }
}

fn param(query: &str, name: &str) -> Option<String> {
    let url = reqwest::Url::parse(&format!("http://server/?{query}")).ok()?;
    url.query_pairs()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

async fn handle(State(shared): State<Arc<Mutex<Shared>>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let mut shared = lock(&shared);
    shared.seen.push(Seen {
        at: Instant::now(),
        method: parts.method.clone(),
        path: path.clone(),
        query: query.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    if shared.down {
        return message(503, "service unavailable");
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (parts.method.as_str(), segments.as_slice()) {
        ("GET", ["api", "v1", "version"]) => ok(json!({"build": {"version": "0.8.2"}})),
        ("GET", ["api", "v1", "indexes", id]) => match shared.indexes.get(*id) {
            Some(index) => ok(metadata(id, index)),
            None => message(404, &format!("index `{id}` not found")),
        },
        ("POST", ["api", "v1", "indexes"]) => {
            let config: Value = match serde_yaml_ng::from_slice(&body) {
                Ok(config) => config,
                Err(error) => {
                    return message(400, &format!("failed to parse index config: {error}"));
                }
            };
            let Some(id) = config["index_id"].as_str().map(str::to_owned) else {
                return message(
                    400,
                    "failed to parse index config: missing field `index_id`",
                );
            };
            if !valid_index_id(&id) {
                return message(400, &format!("index identifier `{id}` is invalid"));
            }
            if config["version"].is_null() {
                return message(400, "failed to parse index config: missing field `version`");
            }
            if shared.indexes.contains_key(&id) {
                return message(400, &format!("index(es) `{id}` already exist(s)"));
            }
            let index = Index {
                config,
                ..Index::default()
            };
            let answer = metadata(&id, &index);
            shared.indexes.insert(id, index);
            ok(answer)
        }
        ("POST", ["api", "v1", id, "ingest"]) => {
            if let Some(Some((status, retry_after))) = shared.ingest_faults.pop_front() {
                let mut response = message(
                    status,
                    if status == 429 {
                        "too many requests"
                    } else {
                        "service unavailable"
                    },
                );
                if let Some(seconds) = retry_after {
                    response.headers_mut().insert(
                        "retry-after",
                        seconds.to_string().parse().expect("a header"),
                    );
                }
                return response;
            }
            if body.len() > shared.content_limit {
                return message(
                    413,
                    &format!(
                        "the request payload is too large: content length limit is {} bytes",
                        shared.content_limit
                    ),
                );
            }
            let commit = param(&query, "commit").unwrap_or_else(|| "auto".into());
            if !matches!(commit.as_str(), "auto" | "wait_for" | "force") {
                return message(
                    400,
                    &format!(
                        "unknown variant `{commit}`, expected one of `auto`, `wait_for`, `force`"
                    ),
                );
            }
            let Some(index) = shared.indexes.get_mut(*id) else {
                return message(404, &format!("index `{id}` not found"));
            };
            let mut count = 0;
            for line in body.split(|byte| *byte == b'\n') {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                count += 1;
                match serde_json::from_slice::<Value>(line) {
                    Ok(Value::Object(document)) if fits_mapping(&index.config, &document) => {
                        index.queued.push(Value::Object(document));
                    }
                    _ => index.dropped += 1,
                }
            }
            if commit != "auto" {
                let queued = std::mem::take(&mut index.queued);
                index.committed.extend(queued);
            }
            ok(json!({"num_docs_for_processing": count}))
        }
        ("GET", ["api", "v1", id, "search"]) => {
            let Some(index) = shared.indexes.get(*id) else {
                return message(404, &format!("index `{id}` not found"));
            };
            let wanted = param(&query, "query").unwrap_or_default();
            let max_hits = param(&query, "max_hits")
                .and_then(|value| value.parse().ok())
                .unwrap_or(20);
            let hits: Vec<&Value> = index
                .committed
                .iter()
                .filter(|document| matches_query(document, &wanted))
                .collect();
            ok(json!({
                "num_hits": hits.len(),
                "hits": hits.into_iter().take(max_hits).collect::<Vec<_>>(),
                "elapsed_time_micros": 10,
                "errors": [],
            }))
        }
        _ => message(404, &format!("route `{path}` not found")),
    }
}
