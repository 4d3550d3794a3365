//! An Elasticsearch / OpenSearch protocol test server (no real one runs here,
//! see docs/connectors/elasticsearch.md): axum on 127.0.0.1:0, following the documented REST
//! API of Elasticsearch 8 and OpenSearch 2 for what the connectors use.
//!
//! - `GET /` answers the flavour's version body (ES 8.15 or OpenSearch 2.17);
//! - `HEAD|GET|PUT|DELETE /{index}`: exists (200/404), mapping, create with
//!   `{mappings, settings}` (400 `resource_already_exists_exception`, 400
//!   `mapper_parsing_exception` for a field type it does not know), delete;
//! - `POST [/{index}]/_bulk`: NDJSON `index`/`create`/`delete` actions with
//!   per-item results; dynamic mapping (a field's type is set by its first
//!   value, `dynamic: strict` refuses new fields) and type checks of mapped
//!   fields (400 `mapper_parsing_exception`); the `pipeline` parameter runs an
//!   ingest pipeline's `set` processors (a missing pipeline fails each item);
//!   indices are created on first write unless auto-creation is off;
//! - `POST /{index}/_refresh`, `GET|POST /{index}/_count`;
//! - `POST [/{index}]/_search` with `query` (`match_all`, `range`, `term`,
//!   `bool.filter`/`must`), `sort` (fields, `_shard_doc`, `_id` on OpenSearch
//!   only: ES 8 refuses fielddata on `_id`), `search_after`, `size`, and a
//!   point in time: ES `POST /{index}/_pit` + `DELETE /_pit`, OpenSearch
//!   `POST /{index}/_search/point_in_time` + `DELETE /_search/point_in_time`;
//!   a PIT sees the index as it was when opened and expires after `keep_alive`
//!   (404 `search_context_missing_exception`);
//! - `PUT /_ingest/pipeline/{id}`;
//! - auth: none, Basic or `ApiKey` (401 `security_exception` otherwise).
//!
//! Faults: per-item failures (429 `es_rejected_execution_exception`, 503, or a
//! 400 of the caller's choosing) for the next items or for one document id,
//! whole-request answers for the next `_bulk` requests (429/503 with
//! `Retry-After`, or a pass for one handled as usual), down (503 for everything), and near-real-time visibility
//! (writes are searchable only after a refresh).
#![cfg(any(feature = "elasticsearch-sink", feature = "elasticsearch-source"))]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Map, Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Elasticsearch8,
    OpenSearch2,
}

#[derive(Debug, Clone)]
pub enum ServerAuth {
    None,
    Basic {
        username: String,
        password: String,
    },
    /// The encoded key (`base64(id:key)`) clients send as `ApiKey <encoded>`.
    ApiKey(String),
}

/// One document as stored.
#[derive(Debug, Clone)]
pub struct Document {
    pub id: String,
    pub source: Value,
    /// Index order (what `_shard_doc` sorts by).
    pub seq: u64,
    pub version: u64,
}

#[derive(Debug, Clone, Default)]
struct Index {
    mappings: Value,
    settings: Value,
    /// Everything written (durable once the bulk answered).
    docs: BTreeMap<String, Document>,
    /// What searches see (a copy of `docs` at the last refresh).
    searchable: BTreeMap<String, Document>,
    next_seq: u64,
}

struct Pit {
    index: String,
    docs: Vec<Document>,
    expires: Instant,
}

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

struct Shared {
    flavor: Flavor,
    auth: ServerAuth,
    indices: HashMap<String, Index>,
    pipelines: HashMap<String, Value>,
    pits: HashMap<String, Pit>,
    next_pit: u64,
    /// Statuses of the next bulk items, one each, whatever their document.
    item_faults: VecDeque<u16>,
    /// Per document id: (status, how many more times).
    id_faults: HashMap<String, (u16, u32)>,
    /// Answers to the next `_bulk` requests: (status, Retry-After seconds),
    /// or `None` for a request handled as usual.
    bulk_faults: VecDeque<Option<(u16, Option<u64>)>>,
    down: bool,
    near_real_time: bool,
    auto_create_index: bool,
    seen: Vec<Seen>,
}

#[derive(Clone)]
pub struct SearchServer {
    shared: Arc<Mutex<Shared>>,
    pub address: SocketAddr,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl SearchServer {
    pub async fn start(flavor: Flavor) -> Self {
        Self::start_with(flavor, ServerAuth::None).await
    }

    pub async fn start_with(flavor: Flavor, auth: ServerAuth) -> Self {
        Self::start_on(flavor, auth, reserve()).await
    }

    /// Starts listening on `socket`, a port [`reserve`]d earlier: a server
    /// that comes up after its clients.
    pub async fn start_on(flavor: Flavor, auth: ServerAuth, socket: tokio::net::TcpSocket) -> Self {
        let shared = Arc::new(Mutex::new(Shared {
            flavor,
            auth,
            indices: HashMap::new(),
            pipelines: HashMap::new(),
            pits: HashMap::new(),
            next_pit: 1,
            item_faults: VecDeque::new(),
            id_faults: HashMap::new(),
            bulk_faults: VecDeque::new(),
            down: false,
            near_real_time: false,
            auto_create_index: true,
            seen: Vec::new(),
        }));
        let listener = socket.listen(1024).expect("listen");
        let address = listener.local_addr().expect("local address");
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the search server runs");
        });
        Self {
            shared,
            address,
            task: Arc::new(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// The next `statuses.len()` bulk items answer these statuses.
    pub fn fail_next_items(&self, statuses: impl IntoIterator<Item = u16>) {
        self.lock().item_faults.extend(statuses);
    }

    /// The document `id` fails with `status` the next `times` times it is written.
    pub fn fail_id(&self, id: &str, status: u16, times: u32) {
        self.lock().id_faults.insert(id.to_owned(), (status, times));
    }

    /// The next `_bulk` request is answered `status` as a whole.
    pub fn fail_next_bulk(&self, status: u16, retry_after: Option<u64>) {
        self.lock()
            .bulk_faults
            .push_back(Some((status, retry_after)));
    }

    /// The next `_bulk` request is handled as usual, ahead of the faults
    /// queued after it (a fault for the second request of a write).
    pub fn pass_next_bulk(&self) {
        self.lock().bulk_faults.push_back(None);
    }

    /// Forgets every injected fault not used yet.
    pub fn clear_faults(&self) {
        let mut shared = self.lock();
        shared.item_faults.clear();
        shared.id_faults.clear();
        shared.bulk_faults.clear();
    }

    /// 503 for every request while down.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Writes become searchable only at a refresh (`_refresh`, `refresh=`).
    pub fn set_near_real_time(&self, on: bool) {
        self.lock().near_real_time = on;
    }

    /// `action.auto_create_index: false`: writing to a missing index fails.
    pub fn set_auto_create_index(&self, on: bool) {
        self.lock().auto_create_index = on;
    }

    /// Creates `index` directly (test setup), with `mappings`.
    pub fn create_index(&self, index: &str, mappings: Value) {
        self.lock().indices.insert(
            index.to_owned(),
            Index {
                mappings,
                ..Index::default()
            },
        );
    }

    pub fn put_pipeline(&self, id: &str, pipeline: Value) {
        self.lock().pipelines.insert(id.to_owned(), pipeline);
    }

    /// Indexes `source` as `id` (test setup), searchable at once.
    pub fn put_document(&self, index: &str, id: &str, source: Value) {
        self.put_documents(index, [(id.to_owned(), source)]);
    }

    /// Indexes each (id, source) (test setup), all searchable at once after
    /// one refresh.
    pub fn put_documents(&self, index: &str, documents: impl IntoIterator<Item = (String, Value)>) {
        let mut shared = self.lock();
        let index = shared.indices.entry(index.to_owned()).or_default();
        for (id, source) in documents {
            write_document(index, &id, source);
        }
        index.searchable = index.docs.clone();
    }

    pub fn has_index(&self, index: &str) -> bool {
        self.lock().indices.contains_key(index)
    }

    pub fn index_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lock().indices.keys().cloned().collect();
        names.sort();
        names
    }

    pub fn mappings(&self, index: &str) -> Option<Value> {
        self.lock()
            .indices
            .get(index)
            .map(|index| index.mappings.clone())
    }

    /// Every document written to `index` (refreshed or not), by id.
    pub fn documents(&self, index: &str) -> Vec<Document> {
        self.lock()
            .indices
            .get(index)
            .map(|index| index.docs.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn document(&self, index: &str, id: &str) -> Option<Document> {
        self.lock().indices.get(index)?.docs.get(id).cloned()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The bulk requests, each as its (action, source) lines.
    pub fn bulk_requests(&self) -> Vec<Vec<(Value, Option<Value>)>> {
        self.seen()
            .into_iter()
            .filter(|seen| seen.path.ends_with("/_bulk"))
            .map(|seen| parse_bulk(&seen.body).unwrap_or_default())
            .collect()
    }

    /// Every open point in time expires now.
    pub fn expire_pits(&self) {
        self.lock().pits.clear();
    }

    pub fn open_pits(&self) -> usize {
        self.lock().pits.len()
    }
}

/// A port on 127.0.0.1 bound and not listening: connecting to it is
/// refused (nothing listens, as before a cluster is up) until a server
/// [`start_on`](SearchServer::start_on) it. Being bound, it is never handed
/// to a client as its own port meanwhile.
pub fn reserve() -> tokio::net::TcpSocket {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    socket
}

impl Drop for SearchServer {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn error(status: u16, kind: &str, reason: &str) -> Response {
    let body = json!({
        "error": {
            "root_cause": [{"type": kind, "reason": reason}],
            "type": kind,
            "reason": reason,
        },
        "status": status,
    });
    (
        StatusCode::from_u16(status).expect("a valid status"),
        axum::Json(body),
    )
        .into_response()
}

fn ok(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

fn authorized(auth: &ServerAuth, headers: &HeaderMap) -> bool {
    let given = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    match auth {
        ServerAuth::None => true,
        ServerAuth::Basic { username, password } => {
            let expected =
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
            given == format!("Basic {expected}")
        }
        ServerAuth::ApiKey(encoded) => given == format!("ApiKey {encoded}"),
    }
}

#[allow(clippy::result_large_err)]
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
        return error(
            503,
            "cluster_block_exception",
            "blocked by: [SERVICE_UNAVAILABLE/1/state not recovered / initialized];",
        );
    }
    if !authorized(&shared.auth, &parts.headers) {
        let mut response = error(
            401,
            "security_exception",
            &format!("missing authentication credentials for REST request [{path}]"),
        );
        response.headers_mut().insert(
            "www-authenticate",
            "Basic realm=\"security\" charset=\"UTF-8\", ApiKey"
                .parse()
                .expect("a header value"),
        );
        return response;
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let json_body = || -> Result<Value, Response> {
        if body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).map_err(|error_| {
            error(
                400,
                "parsing_exception",
                &format!("request body is not JSON: {error_}"),
            )
        })
    };
    let method = parts.method;
    let flavor = shared.flavor;
    match (method.as_str(), segments.as_slice()) {
        ("GET", [""]) => ok(version_body(flavor)),
        ("PUT", ["_ingest", "pipeline", id]) => match json_body() {
            Ok(pipeline) => {
                shared.pipelines.insert((*id).to_owned(), pipeline);
                ok(json!({"acknowledged": true}))
            }
            Err(response) => response,
        },
        ("POST" | "PUT", ["_bulk"]) => bulk(&mut shared, None, &query, &body),
        ("POST" | "PUT", [index, "_bulk"]) => bulk(&mut shared, Some(index), &query, &body),
        ("POST" | "GET", [index, "_refresh"]) => match shared.indices.get_mut(*index) {
            Some(found) => {
                found.searchable = found.docs.clone();
                ok(json!({"_shards": {"total": 1, "successful": 1, "failed": 0}}))
            }
            None => index_missing(index),
        },
        ("POST" | "GET", [index, "_count"]) => match json_body() {
            Ok(request) => match shared.indices.get(*index) {
                Some(found) => {
                    let query = request.get("query").cloned().unwrap_or(Value::Null);
                    match found
                        .searchable
                        .values()
                        .map(|doc| matches(&query, doc))
                        .collect::<Result<Vec<bool>, String>>()
                    {
                        Ok(hits) => ok(json!({
                            "count": hits.into_iter().filter(|hit| *hit).count(),
                            "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0}
                        })),
                        Err(reason) => error(400, "parsing_exception", &reason),
                    }
                }
                None => index_missing(index),
            },
            Err(response) => response,
        },
        ("POST", [index, "_pit"]) if flavor == Flavor::Elasticsearch8 => {
            open_pit(&mut shared, index, &query, "id")
        }
        ("POST", [index, "_search", "point_in_time"]) if flavor == Flavor::OpenSearch2 => {
            open_pit(&mut shared, index, &query, "pit_id")
        }
        ("DELETE", ["_pit"]) if flavor == Flavor::Elasticsearch8 => match json_body() {
            Ok(request) => {
                let id = request["id"].as_str().unwrap_or_default();
                let found = shared.pits.remove(id).is_some();
                let status = if found { 200 } else { 404 };
                (
                    StatusCode::from_u16(status).expect("a status"),
                    axum::Json(json!({"succeeded": found, "num_freed": u32::from(found)})),
                )
                    .into_response()
            }
            Err(response) => response,
        },
        ("DELETE", ["_search", "point_in_time"]) if flavor == Flavor::OpenSearch2 => {
            match json_body() {
                Ok(request) => {
                    let ids: Vec<String> = request["pit_id"]
                        .as_array()
                        .map(|ids| {
                            ids.iter()
                                .filter_map(|id| id.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    let pits: Vec<Value> = ids
                        .iter()
                        .map(|id| json!({"successful": shared.pits.remove(id).is_some(), "pit_id": id}))
                        .collect();
                    ok(json!({"pits": pits}))
                }
                Err(response) => response,
            }
        }
        ("POST" | "GET", ["_search"]) => match json_body() {
            Ok(request) => search(&mut shared, None, &request),
            Err(response) => response,
        },
        ("POST" | "GET", [index, "_search"]) => match json_body() {
            Ok(request) => search(&mut shared, Some(index), &request),
            Err(response) => response,
        },
        ("HEAD", [index]) => {
            let status = if shared.indices.contains_key(*index) {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            status.into_response()
        }
        ("GET", [index]) if !index.starts_with('_') => match shared.indices.get(*index) {
            Some(found) => ok(json!({*index: {
                "aliases": {}, "mappings": found.mappings, "settings": found.settings
            }})),
            None => index_missing(index),
        },
        ("PUT", [index]) if !index.starts_with('_') => {
            if let Some(reason) = bad_index_name(index) {
                return error(400, "invalid_index_name_exception", &reason);
            }
            if shared.indices.contains_key(*index) {
                return error(
                    400,
                    "resource_already_exists_exception",
                    &format!("index [{index}/abc123] already exists"),
                );
            }
            match json_body() {
                Ok(request) => {
                    if let Some(reason) = unknown_field_type(&request["mappings"]) {
                        return error(400, "mapper_parsing_exception", &reason);
                    }
                    shared.indices.insert(
                        (*index).to_owned(),
                        Index {
                            mappings: request.get("mappings").cloned().unwrap_or(json!({})),
                            settings: request.get("settings").cloned().unwrap_or(json!({})),
                            ..Index::default()
                        },
                    );
                    ok(json!({"acknowledged": true, "shards_acknowledged": true, "index": index}))
                }
                Err(response) => response,
            }
        }
        ("DELETE", [index]) if !index.starts_with('_') => match shared.indices.remove(*index) {
            Some(_) => ok(json!({"acknowledged": true})),
            None => index_missing(index),
        },
        _ => error(
            400,
            "illegal_argument_exception",
            &format!("request [{method} {path}] is not supported by the test server"),
        ),
    }
}

fn version_body(flavor: Flavor) -> Value {
    match flavor {
        Flavor::Elasticsearch8 => json!({
            "name": "es-test-node",
            "cluster_name": "docker-cluster",
            "cluster_uuid": "8rNs6yVxQyGz5cDq2uVh6g",
            "version": {
                "number": "8.15.0",
                "build_flavor": "default",
                "build_type": "docker",
                "build_hash": "1a77947f34deddb41af25e6f0ddb8e830159c179",
                "build_date": "2024-08-05T10:05:34.233336849Z",
                "build_snapshot": false,
                "lucene_version": "9.11.1",
                "minimum_wire_compatibility_version": "7.17.0",
                "minimum_index_compatibility_version": "7.0.0"
            },
            "tagline": "You Know, for Search"
        }),
        Flavor::OpenSearch2 => json!({
            "name": "opensearch-test-node",
            "cluster_name": "opensearch-cluster",
            "cluster_uuid": "Q0wSRvHfT1yHGlY0vbgO4w",
            "version": {
                "distribution": "opensearch",
                "number": "2.17.0",
                "build_type": "tar",
                "build_hash": "8586481dc99b1740ca3c7c966aee15ad0fc7b412",
                "build_date": "2024-09-13T01:04:10.962926093Z",
                "build_snapshot": false,
                "lucene_version": "9.11.1",
                "minimum_wire_compatibility_version": "7.10.0",
                "minimum_index_compatibility_version": "7.0.0"
            },
            "tagline": "The OpenSearch Project: https://opensearch.org/"
        }),
    }
}

fn index_missing(index: &str) -> Response {
    error(
        404,
        "index_not_found_exception",
        &format!("no such index [{index}]"),
    )
}

/// The field types a mapping may name (the ones the tests use and their
/// kin); index creation refuses any other, as Elasticsearch does.
const FIELD_TYPES: [&str; 20] = [
    "text",
    "keyword",
    "wildcard",
    "long",
    "integer",
    "short",
    "byte",
    "double",
    "float",
    "half_float",
    "scaled_float",
    "boolean",
    "date",
    "object",
    "nested",
    "flattened",
    "ip",
    "geo_point",
    "binary",
    "match_only_text",
];

/// Why index creation refuses `mappings`: a field of a type it does not know.
fn unknown_field_type(mappings: &Value) -> Option<String> {
    let properties = mappings["properties"].as_object()?;
    properties.iter().find_map(|(name, field)| {
        let kind = field["type"].as_str()?;
        (!FIELD_TYPES.contains(&kind))
            .then(|| format!("No handler for type [{kind}] declared on field [{name}]"))
    })
}

/// Elasticsearch's index name rules, the ones a template can break.
fn bad_index_name(name: &str) -> Option<String> {
    if name.is_empty() || name.starts_with(['-', '_', '+']) || name == "." || name == ".." {
        return Some(format!(
            "Invalid index name [{name}], must not start with '_', '-', or '+'"
        ));
    }
    if name.chars().any(|c| c.is_uppercase()) {
        return Some(format!("Invalid index name [{name}], must be lowercase"));
    }
    if name.chars().any(|c| {
        matches!(
            c,
            '\\' | '/' | '*' | '?' | '"' | '<' | '>' | '|' | ' ' | ',' | '#' | ':'
        )
    }) {
        return Some(format!(
            "Invalid index name [{name}], must not contain the following characters [ , \", *, \\, <, |, ,, >, /, ?]"
        ));
    }
    if name.len() > 255 {
        return Some(format!(
            "Invalid index name [{name}], index name is too long"
        ));
    }
    None
}

/// The (action, source) pairs of an NDJSON bulk body.
fn parse_bulk(body: &[u8]) -> Result<Vec<(Value, Option<Value>)>, String> {
    let text = std::str::from_utf8(body).map_err(|error_| error_.to_string())?;
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("The bulk request must be terminated by a newline [\\n]".into());
    }
    let mut lines = text.lines().filter(|line| !line.trim().is_empty());
    let mut pairs = Vec::new();
    while let Some(line) = lines.next() {
        let action: Value = serde_json::from_str(line)
            .map_err(|error_| format!("Malformed action/metadata line: {error_}"))?;
        let kind = action
            .as_object()
            .and_then(|object| object.keys().next().cloned())
            .ok_or("Malformed action/metadata line, expected START_OBJECT")?;
        let source = if kind == "delete" {
            None
        } else {
            let line = lines
                .next()
                .ok_or("Validation Failed: 1: no requests added;")?;
            // Kept as parsed, or as the raw text when it does not parse: the
            // item fails with a parse error, like Elasticsearch's.
            Some(
                serde_json::from_str(line)
                    .unwrap_or_else(|_| Value::String(format!("\u{0}{line}"))),
            )
        };
        pairs.push((action, source));
    }
    Ok(pairs)
}

fn bulk(shared: &mut Shared, path_index: Option<&str>, query: &str, body: &[u8]) -> Response {
    if let Some(Some((status, retry_after))) = shared.bulk_faults.pop_front() {
        let mut response = if status == 429 {
            error(
                429,
                "es_rejected_execution_exception",
                "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, coordinating_operation_bytes=1000, max_coordinating_and_primary_bytes=1000]",
            )
        } else {
            error(
                status,
                "unavailable_shards_exception",
                "primary shard is not active Timeout: [1m]",
            )
        };
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(
                "retry-after",
                seconds.to_string().parse().expect("a header value"),
            );
        }
        return response;
    }
    let pairs = match parse_bulk(body) {
        Ok(pairs) if pairs.is_empty() => {
            return error(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: no requests added;",
            );
        }
        Ok(pairs) => pairs,
        Err(reason) => return error(400, "illegal_argument_exception", &reason),
    };
    let pipeline = query_param(query, "pipeline").map(str::to_owned);
    let refresh = query_param(query, "refresh").is_some_and(|value| value != "false");
    let started = Instant::now();
    let mut errors = false;
    let mut items = Vec::with_capacity(pairs.len());
    for (action, source) in pairs {
        let (kind, meta) = action
            .as_object()
            .and_then(|object| object.iter().next())
            .map(|(kind, meta)| (kind.clone(), meta.clone()))
            .unwrap_or_default();
        let index = meta["_index"]
            .as_str()
            .or(path_index)
            .unwrap_or_default()
            .to_owned();
        let item = one_item(shared, &kind, &index, &meta, source, pipeline.as_deref());
        if item["status"].as_u64().unwrap_or(500) >= 300 {
            errors = true;
        }
        items.push(json!({ kind: item }));
    }
    if refresh || !shared.near_real_time {
        for index in shared.indices.values_mut() {
            index.searchable = index.docs.clone();
        }
    }
    ok(json!({
        "errors": errors,
        "took": started.elapsed().as_millis() as u64,
        "items": items,
    }))
}

fn item_error(index: &str, id: &str, status: u16, kind: &str, reason: &str) -> Value {
    json!({
        "_index": index,
        "_id": id,
        "status": status,
        "error": {"type": kind, "reason": reason},
    })
}

fn fault_item(index: &str, id: &str, status: u16) -> Value {
    match status {
        429 => item_error(
            index,
            id,
            429,
            "es_rejected_execution_exception",
            "rejected execution of primary operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, primary_operation_bytes=1000, max_coordinating_and_primary_bytes=1000]",
        ),
        400 => item_error(
            index,
            id,
            400,
            "mapper_parsing_exception",
            "failed to parse field [injected] of type [long] in document",
        ),
        status if status >= 500 => item_error(
            index,
            id,
            status,
            "unavailable_shards_exception",
            &format!("[{index}][0] primary shard is not active Timeout: [1m]"),
        ),
        status => item_error(
            index,
            id,
            status,
            "illegal_argument_exception",
            "injected failure",
        ),
    }
}

fn one_item(
    shared: &mut Shared,
    kind: &str,
    index: &str,
    meta: &Value,
    source: Option<Value>,
    pipeline: Option<&str>,
) -> Value {
    let id = match meta["_id"].as_str() {
        Some(id) => id.to_owned(),
        None if kind == "index" || kind == "create" => {
            // Auto ids, as Elasticsearch mints them (20 characters).
            format!("auto{:016x}", rand::random::<u64>())
        }
        None => {
            return item_error(
                index,
                "",
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: id is missing;",
            );
        }
    };
    if index.is_empty() {
        return item_error(
            index,
            &id,
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: index is missing;",
        );
    }
    if let Some(status) = shared.item_faults.pop_front() {
        return fault_item(index, &id, status);
    }
    if let Some((status, times)) = shared.id_faults.get_mut(&id) {
        let status = *status;
        *times -= 1;
        if *times == 0 {
            shared.id_faults.remove(&id);
        }
        return fault_item(index, &id, status);
    }
    if id.len() > 512 {
        return item_error(
            index,
            &id,
            400,
            "illegal_argument_exception",
            "id is too long, must be no longer than 512 bytes",
        );
    }
    if let Some(reason) = bad_index_name(index) {
        return item_error(index, &id, 400, "invalid_index_name_exception", &reason);
    }
    if !shared.indices.contains_key(index) {
        if !shared.auto_create_index {
            return item_error(
                index,
                &id,
                404,
                "index_not_found_exception",
                &format!("no such index [{index}] and [action.auto_create_index] is [false]"),
            );
        }
        shared.indices.insert(index.to_owned(), Index::default());
    }
    let mut source = match source {
        None => Value::Null,
        Some(Value::String(text)) if text.starts_with('\u{0}') => {
            return item_error(
                index,
                &id,
                400,
                "document_parsing_exception",
                "[1:1] failed to parse: Unexpected character",
            );
        }
        Some(Value::Object(object)) => Value::Object(object),
        Some(_) => {
            return item_error(
                index,
                &id,
                400,
                "document_parsing_exception",
                "[1:1] failed to parse: Root element must be an object, found a non-object value",
            );
        }
    };
    if kind != "delete"
        && let Some(pipeline_id) = pipeline.filter(|id| *id != "_none")
    {
        let Some(definition) = shared.pipelines.get(pipeline_id) else {
            return item_error(
                index,
                &id,
                400,
                "illegal_argument_exception",
                &format!("pipeline with id [{pipeline_id}] does not exist"),
            );
        };
        apply_pipeline(definition, &mut source);
    }
    let found = shared.indices.get_mut(index).expect("created above");
    match kind {
        "delete" => match found.docs.remove(&id) {
            Some(doc) => {
                json!({"_index": index, "_id": id, "_version": doc.version + 1, "result": "deleted", "status": 200})
            }
            None => {
                json!({"_index": index, "_id": id, "_version": 1, "result": "not_found", "status": 404})
            }
        },
        "index" | "create" => {
            if kind == "create" && found.docs.contains_key(&id) {
                return item_error(
                    index,
                    &id,
                    409,
                    "version_conflict_engine_exception",
                    &format!(
                        "[{id}]: version conflict, document already exists (current version [1])"
                    ),
                );
            }
            let mut mappings = found.mappings.clone();
            if let Err((kind, reason)) = map_document(&mut mappings, &source, &id) {
                return item_error(index, &id, 400, kind, &reason);
            }
            found.mappings = mappings;
            let (version, result, status) = write_document(found, &id, source);
            json!({
                "_index": index, "_id": id, "_version": version, "result": result,
                "_shards": {"total": 2, "successful": 1, "failed": 0},
                "_seq_no": found.next_seq - 1, "_primary_term": 1, "status": status,
            })
        }
        other => item_error(
            index,
            &id,
            400,
            "illegal_argument_exception",
            &format!(
                "Malformed action/metadata line, expected one of [create, delete, index, update] but found [{other}]"
            ),
        ),
    }
}

/// Stores `source` as `id`; (version, result, status).
fn write_document(index: &mut Index, id: &str, source: Value) -> (u64, &'static str, u16) {
    let seq = index.next_seq;
    index.next_seq += 1;
    match index.docs.get_mut(id) {
        Some(doc) => {
            doc.version += 1;
            doc.source = source;
            doc.seq = seq;
            (doc.version, "updated", 200)
        }
        None => {
            index.docs.insert(
                id.to_owned(),
                Document {
                    id: id.to_owned(),
                    source,
                    seq,
                    version: 1,
                },
            );
            (1, "created", 201)
        }
    }
}

/// Runs the `set` processors of an ingest pipeline (enough for the tests).
fn apply_pipeline(pipeline: &Value, source: &mut Value) {
    for processor in pipeline["processors"].as_array().into_iter().flatten() {
        if let (Some(field), Some(value)) = (
            processor["set"]["field"].as_str(),
            processor["set"].get("value"),
        ) {
            source[field] = value.clone();
        }
    }
}

/// The type dynamic mapping gives a first value.
fn dynamic_type(value: &Value) -> Option<&'static str> {
    match value {
        Value::Null => None,
        Value::Bool(_) => Some("boolean"),
        Value::Number(number) if number.is_f64() => Some("float"),
        Value::Number(_) => Some("long"),
        Value::String(_) => Some("text"),
        Value::Array(items) => items.iter().find_map(dynamic_type),
        Value::Object(_) => Some("object"),
    }
}

fn fits(kind: &str, value: &Value) -> bool {
    match (kind, value) {
        (_, Value::Null) => true,
        (_, Value::Array(items)) => items.iter().all(|item| fits(kind, item)),
        ("long" | "integer" | "short" | "byte", Value::Number(number)) => {
            number.is_i64() || number.is_u64() || number.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        ("long" | "integer" | "short" | "byte", Value::String(text)) => {
            text.trim().parse::<i64>().is_ok()
        }
        ("float" | "double" | "half_float" | "scaled_float", Value::Number(_)) => true,
        ("float" | "double" | "half_float" | "scaled_float", Value::String(text)) => {
            text.trim().parse::<f64>().is_ok()
        }
        ("boolean", Value::Bool(_)) => true,
        ("boolean", Value::String(text)) => text == "true" || text == "false" || text.is_empty(),
        ("keyword" | "text" | "wildcard", Value::Object(_)) => false,
        ("keyword" | "text" | "wildcard", _) => true,
        ("date", Value::String(_) | Value::Number(_)) => true,
        ("object" | "nested" | "flattened", Value::Object(_)) => true,
        ("object" | "nested", _) => false,
        // Numbers, booleans and dates take nothing else.
        (
            "long" | "integer" | "short" | "byte" | "float" | "double" | "half_float"
            | "scaled_float" | "boolean" | "date",
            _,
        ) => false,
        _ => true,
    }
}

/// Checks `source` against the mapping, adding dynamically mapped fields.
fn map_document(
    mappings: &mut Value,
    source: &Value,
    id: &str,
) -> Result<(), (&'static str, String)> {
    let Value::Object(fields) = source else {
        return Ok(());
    };
    if !mappings.is_object() {
        *mappings = json!({});
    }
    let strict = mappings["dynamic"].as_str() == Some("strict");
    if !mappings["properties"].is_object() {
        mappings["properties"] = Value::Object(Map::new());
    }
    for (name, value) in fields {
        let properties = &mut mappings["properties"];
        match properties
            .get(name)
            .and_then(|field| field["type"].as_str())
        {
            Some(kind) => {
                if !fits(kind, value) {
                    return Err((
                        "document_parsing_exception",
                        format!(
                            "[1:2] failed to parse field [{name}] of type [{kind}] in document with id '{id}'. Preview of field's value: '{value}'"
                        ),
                    ));
                }
                if kind == "object" {
                    map_document(&mut properties[name], value, id)?;
                }
            }
            None if properties
                .get(name)
                .is_some_and(|field| field["properties"].is_object()) =>
            {
                if !value.is_object() && !value.is_null() {
                    return Err((
                        "document_parsing_exception",
                        format!(
                            "[1:2] object mapping for [{name}] tried to parse field [{name}] as object, but found a concrete value"
                        ),
                    ));
                }
                map_document(&mut properties[name], value, id)?;
            }
            None => {
                if strict {
                    return Err((
                        "strict_dynamic_mapping_exception",
                        format!(
                            "[1:2] mapping set to strict, dynamic introduction of [{name}] within [_doc] is not allowed"
                        ),
                    ));
                }
                if let Some(kind) = dynamic_type(value) {
                    properties[name] = json!({"type": kind});
                    if kind == "object" {
                        map_document(&mut properties[name], value, id)?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn open_pit(shared: &mut Shared, index: &str, query: &str, id_field: &str) -> Response {
    let Some(keep_alive) = query_param(query, "keep_alive").and_then(parse_keep_alive) else {
        return error(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: [keep_alive] is not specified;",
        );
    };
    let Some(found) = shared.indices.get(index) else {
        return index_missing(index);
    };
    let mut docs: Vec<Document> = found.searchable.values().cloned().collect();
    docs.sort_by_key(|doc| doc.seq);
    let id = base64::engine::general_purpose::STANDARD
        .encode(format!("pit-{}-{index}", shared.next_pit));
    shared.next_pit += 1;
    shared.pits.insert(
        id.clone(),
        Pit {
            index: index.to_owned(),
            docs,
            expires: Instant::now() + keep_alive,
        },
    );
    let mut body = json!({ id_field: id });
    if id_field == "pit_id" {
        body["_shards"] = json!({"total": 1, "successful": 1, "skipped": 0, "failed": 0});
        body["creation_time"] = json!(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|elapsed| elapsed.as_millis() as u64)
                .unwrap_or_default()
        );
    }
    ok(body)
}

fn parse_keep_alive(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    Some(match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number * 60),
        "h" => Duration::from_secs(number * 3600),
        "d" => Duration::from_secs(number * 86_400),
        _ => return None,
    })
}

/// A field's value in a document (dotted paths), `_id` included.
fn field<'a>(doc: &'a Document, name: &str) -> Option<Value> {
    if name == "_id" {
        return Some(Value::String(doc.id.clone()));
    }
    let mut value: &'a Value = &doc.source;
    for part in name.split('.') {
        value = value.get(part)?;
    }
    (!value.is_null()).then(|| value.clone())
}

/// Dates compare as instants when both parse, numbers as numbers, the rest as text.
fn compare(left: &Value, right: &Value) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (as_number(left), as_number(right)) {
        (Some(a), Some(b)) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        _ => text_of(left).cmp(&text_of(right)),
    }
}

fn as_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => epoch_millis(text),
        _ => None,
    }
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fff][Z]` as milliseconds since the epoch.
fn epoch_millis(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    if bytes.len() < 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let year: i64 = text.get(0..4)?.parse().ok()?;
    let month: i64 = text.get(5..7)?.parse().ok()?;
    let day: i64 = text.get(8..10)?.parse().ok()?;
    let (mut seconds, mut fraction) = (0i64, 0f64);
    if bytes.len() >= 19 {
        let hour: i64 = text.get(11..13)?.parse().ok()?;
        let minute: i64 = text.get(14..16)?.parse().ok()?;
        let second: i64 = text.get(17..19)?.parse().ok()?;
        seconds = hour * 3600 + minute * 60 + second;
        if let Some(rest) = text.get(19..).and_then(|rest| rest.strip_prefix('.')) {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            fraction = format!("0.{digits}").parse().unwrap_or(0.0);
        }
    }
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some(((days * 86_400 + seconds) as f64 + fraction) * 1000.0)
}

fn matches(query: &Value, doc: &Document) -> Result<bool, String> {
    let Some((kind, body)) = query.as_object().and_then(|object| object.iter().next()) else {
        return Ok(true);
    };
    match kind.as_str() {
        "match_all" => Ok(true),
        "range" => {
            let (name, bounds) = body
                .as_object()
                .and_then(|object| object.iter().next())
                .ok_or("[range] query malformed, no field")?;
            let Some(value) = field(doc, name) else {
                return Ok(false);
            };
            for (op, bound) in bounds.as_object().into_iter().flatten() {
                let order = compare(&value, bound);
                let holds = match op.as_str() {
                    "gt" => order.is_gt(),
                    "gte" => order.is_ge(),
                    "lt" => order.is_lt(),
                    "lte" => order.is_le(),
                    "format" | "time_zone" | "boost" => true,
                    other => return Err(format!("[range] query does not support [{other}]")),
                };
                if !holds {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        "term" => {
            let (name, wanted) = body
                .as_object()
                .and_then(|object| object.iter().next())
                .ok_or("[term] query malformed, no field")?;
            let wanted = wanted.get("value").unwrap_or(wanted);
            Ok(field(doc, name).is_some_and(|value| compare(&value, wanted).is_eq()))
        }
        "bool" => {
            for clause in ["must", "filter"] {
                let clauses = match &body[clause] {
                    Value::Array(items) => items.clone(),
                    Value::Null => Vec::new(),
                    single => vec![single.clone()],
                };
                for item in clauses {
                    if !matches(&item, doc)? {
                        return Ok(false);
                    }
                }
            }
            let must_not = match &body["must_not"] {
                Value::Array(items) => items.clone(),
                Value::Null => Vec::new(),
                single => vec![single.clone()],
            };
            for item in must_not {
                if matches(&item, doc)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        other => Err(format!("unknown query [{other}]")),
    }
}

/// (field, descending) pairs of a `sort`.
fn sort_keys(sort: &Value) -> Result<Vec<(String, bool)>, String> {
    let items = match sort {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items.clone(),
        single => vec![single.clone()],
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(name) => Ok((name.clone(), false)),
            Value::Object(object) => {
                let (name, order) = object.iter().next().ok_or("empty sort")?;
                let order = order.get("order").unwrap_or(order);
                Ok((name.clone(), order.as_str() == Some("desc")))
            }
            other => Err(format!("malformed sort {other}")),
        })
        .collect()
}

fn search(shared: &mut Shared, path_index: Option<&str>, request: &Value) -> Response {
    let flavor = shared.flavor;
    let pit_id = request["pit"]["id"].as_str().map(str::to_owned);
    let mut hit_index = path_index.unwrap_or_default().to_owned();
    let docs: Vec<Document> = match (&pit_id, path_index) {
        (Some(_), Some(_)) => {
            return error(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: [indices] cannot be used with point in time. Do not specify any index with point in time.;",
            );
        }
        (Some(id), None) => {
            let now = Instant::now();
            shared.pits.retain(|_, pit| pit.expires > now);
            let Some(pit) = shared.pits.get_mut(id) else {
                return error(
                    404,
                    "search_context_missing_exception",
                    "No search context found for id [1]",
                );
            };
            if let Some(keep_alive) = request["pit"]["keep_alive"]
                .as_str()
                .and_then(parse_keep_alive)
            {
                pit.expires = now + keep_alive;
            }
            hit_index = pit.index.clone();
            pit.docs.clone()
        }
        (None, Some(index)) => match shared.indices.get(index) {
            Some(found) => {
                let mut docs: Vec<Document> = found.searchable.values().cloned().collect();
                docs.sort_by_key(|doc| doc.seq);
                docs
            }
            None => return index_missing(index),
        },
        (None, None) => {
            let mut docs: Vec<Document> = shared
                .indices
                .values()
                .flat_map(|index| index.searchable.values().cloned())
                .collect();
            docs.sort_by_key(|doc| doc.seq);
            docs
        }
    };
    let mut keys = match sort_keys(&request["sort"]) {
        Ok(keys) => keys,
        Err(reason) => return error(400, "parsing_exception", &reason),
    };
    if keys.iter().any(|(name, _)| name == "_id") && flavor == Flavor::Elasticsearch8 {
        return error(
            400,
            "illegal_argument_exception",
            "Fielddata access on the _id field is disallowed, you can re-enable it by updating the dynamic cluster setting: indices.id_field_data.enabled",
        );
    }
    if keys.iter().any(|(name, _)| name == "_shard_doc") && pit_id.is_none() {
        return error(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: [_shard_doc] sort field cannot be used without [point in time];",
        );
    }
    // Elasticsearch adds the `_shard_doc` tie-breaker to a PIT search itself.
    if pit_id.is_some()
        && flavor == Flavor::Elasticsearch8
        && !keys.iter().any(|(name, _)| name == "_shard_doc")
        && !keys.is_empty()
    {
        keys.push(("_shard_doc".into(), false));
    }
    let query = request.get("query").cloned().unwrap_or(Value::Null);
    let mut hits: Vec<(Document, Vec<Value>)> = Vec::new();
    for doc in docs {
        match matches(&query, &doc) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(reason) => return error(400, "parsing_exception", &reason),
        }
        let values = keys
            .iter()
            .map(|(name, descending)| match name.as_str() {
                "_shard_doc" => json!(doc.seq),
                _ => field(&doc, name).unwrap_or_else(|| {
                    // Missing values sort last.
                    if *descending {
                        json!(i64::MIN)
                    } else {
                        json!(i64::MAX)
                    }
                }),
            })
            .map(|value| match &value {
                // Dates come back as epoch milliseconds, as Elasticsearch's do.
                Value::String(text) => epoch_millis(text)
                    .map(|ms| json!(ms as i64))
                    .unwrap_or(value),
                _ => value,
            })
            .collect();
        hits.push((doc, values));
    }
    let ordering = |left: &[Value], right: &[Value]| {
        for ((_, descending), (a, b)) in keys.iter().zip(left.iter().zip(right)) {
            let order = compare(a, b);
            let order = if *descending { order.reverse() } else { order };
            if order.is_ne() {
                return order;
            }
        }
        std::cmp::Ordering::Equal
    };
    hits.sort_by(|(_, a), (_, b)| ordering(a, b));
    let total = hits.len();
    if let Some(after) = request["search_after"].as_array() {
        if after.len() != keys.len() {
            return error(
                400,
                "illegal_argument_exception",
                &format!(
                    "search_after has {} value(s) but sort has {}.",
                    after.len(),
                    keys.len()
                ),
            );
        }
        hits.retain(|(_, values)| ordering(values, after).is_gt());
    }
    let size = request["size"].as_u64().unwrap_or(10) as usize;
    let from = request["from"].as_u64().unwrap_or(0) as usize;
    let page: Vec<Value> = hits
        .into_iter()
        .skip(from)
        .take(size)
        .map(|(doc, values)| {
            let mut hit = json!({
                "_index": hit_index,
                "_id": doc.id,
                "_score": null,
                "_source": doc.source,
            });
            if !keys.is_empty() {
                hit["sort"] = Value::Array(values);
            }
            hit
        })
        .collect();
    let mut body = json!({
        "took": 1,
        "timed_out": false,
        "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
        "hits": {"total": {"value": total, "relation": "eq"}, "max_score": null, "hits": page},
    });
    if let Some(id) = pit_id {
        body["pit_id"] = json!(id);
    }
    ok(body)
}
