//! A Meilisearch 1.x protocol test server (no real one runs here, see
//! docs/connectors/meilisearch.md): axum on 127.0.0.1:0, following Meilisearch's documented
//! REST API for what the sink uses.
//!
//! - `GET /health` (no key needed), `GET /version`;
//! - `GET /indexes/{uid}` (404 `index_not_found`), `POST /indexes` with
//!   `{uid, primaryKey}` (an `indexCreation` task; `index_already_exists`);
//! - `POST|PUT /indexes/{uid}/documents[?primaryKey=]`: add-or-replace and
//!   add-or-update of a JSON array (400 `malformed_payload` when it is not an
//!   array of objects, 413 `payload_too_large` past the payload limit),
//!   answered 202 with a summarized task; `GET /indexes/{uid}/documents/{id}`;
//! - `GET /tasks/{uid}`: tasks move enqueued -> processing -> succeeded or
//!   failed, one step per tick of a background processor, in enqueue order.
//!   A documents task is atomic: it fails whole, writing nothing, with
//!   `index_primary_key_no_candidate_found` / `..._multiple_candidates_found`
//!   (inference: the fields whose name ends in `id`),
//!   `index_primary_key_already_exists` (another primary key than the
//!   index's), `missing_document_id`, `invalid_document_id` (an integer, or 1
//!   to 511 bytes of `a-zA-Z0-9-_`), `invalid_document_geo_field` (`_geo`
//!   not an object with `lat`/`lng`), or `index_not_found` when indexes are
//!   not created on first write;
//! - auth: with a master key, requests need `Authorization: Bearer <key>`:
//!   401 `missing_authorization_header`, 403 `invalid_api_key`.
//!
//! Faults: whole-request answers for the next documents requests (429/503
//! with `Retry-After`, or a pass for one handled as usual), the next documents tasks failing with an internal
//! error, down (503 for everything), a paused task processor (tasks stay
//! enqueued), no index creation on first write.
#![cfg(feature = "meilisearch-sink")]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

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

#[derive(Debug, Clone, Default)]
struct Index {
    primary_key: Option<String>,
    docs: BTreeMap<String, Value>,
}

#[derive(Debug, Clone)]
enum Work {
    CreateIndex {
        primary_key: Option<String>,
    },
    Documents {
        replace: bool,
        primary_key: Option<String>,
        documents: Vec<Map<String, Value>>,
        /// Fails with an internal error when processed (an injected fault).
        internal_error: bool,
    },
}

#[derive(Debug, Clone)]
struct Task {
    uid: u64,
    index: String,
    status: &'static str,
    kind: &'static str,
    work: Work,
    error: Option<Value>,
    received: usize,
}

struct Shared {
    master_key: Option<String>,
    indexes: HashMap<String, Index>,
    tasks: Vec<Task>,
    /// Answers to the next documents requests: (status, Retry-After seconds).
    /// Answers to the next documents requests: (status, Retry-After
    /// seconds), or `None` for a request handled as usual.
    request_faults: VecDeque<Option<(u16, Option<u64>)>>,
    /// How many of the next documents tasks fail with an internal error.
    internal_task_faults: u32,
    down: bool,
    paused: bool,
    auto_create_index: bool,
    payload_limit: usize,
    seen: Vec<Seen>,
}

#[derive(Clone)]
pub struct MeiliServer {
    shared: Arc<Mutex<Shared>>,
    pub address: SocketAddr,
}

impl MeiliServer {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Started with a master key: every request but `/health` needs it.
    pub async fn start_with(master_key: Option<&str>) -> Self {
        let shared = Arc::new(Mutex::new(Shared {
            master_key: master_key.map(str::to_owned),
            indexes: HashMap::new(),
            tasks: Vec::new(),
            request_faults: VecDeque::new(),
            internal_task_faults: 0,
            down: false,
            paused: false,
            auto_create_index: true,
            payload_limit: 100 * 1024 * 1024,
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
                .expect("the meilisearch server runs");
        });
        let processor = Arc::downgrade(&shared);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let Some(shared) = processor.upgrade() else {
                    return;
                };
                step(&mut lock(&shared));
            }
        });
        Self { shared, address }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// The next documents request is answered `status` as a whole.
    pub fn fail_next_request(&self, status: u16, retry_after: Option<u64>) {
        self.lock()
            .request_faults
            .push_back(Some((status, retry_after)));
    }

    /// The next documents request is handled as usual, ahead of the faults
    /// queued after it (a fault for the second request of a write).
    pub fn pass_next_request(&self) {
        self.lock().request_faults.push_back(None);
    }

    /// The next `count` documents tasks fail with an `internal` error.
    pub fn fail_next_tasks(&self, count: u32) {
        self.lock().internal_task_faults += count;
    }

    pub fn clear_faults(&self) {
        let mut shared = self.lock();
        shared.request_faults.clear();
        shared.internal_task_faults = 0;
    }

    /// 503 for every request while down.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// While paused, tasks stay where they are.
    pub fn set_paused(&self, paused: bool) {
        self.lock().paused = paused;
    }

    /// Whether a documents task on a missing index creates it.
    pub fn set_auto_create_index(&self, on: bool) {
        self.lock().auto_create_index = on;
    }

    /// Largest documents request body accepted (413 past it).
    pub fn set_payload_limit(&self, bytes: usize) {
        self.lock().payload_limit = bytes;
    }

    /// Creates `uid` directly (not through a task).
    pub fn create_index(&self, uid: &str, primary_key: Option<&str>) {
        self.lock().indexes.insert(
            uid.to_owned(),
            Index {
                primary_key: primary_key.map(str::to_owned),
                docs: BTreeMap::new(),
            },
        );
    }

    pub fn index_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lock().indexes.keys().cloned().collect();
        names.sort();
        names
    }

    pub fn primary_key(&self, uid: &str) -> Option<String> {
        self.lock().indexes.get(uid)?.primary_key.clone()
    }

    /// The documents of `uid`, by id.
    pub fn documents(&self, uid: &str) -> BTreeMap<String, Value> {
        self.lock()
            .indexes
            .get(uid)
            .map(|index| index.docs.clone())
            .unwrap_or_default()
    }

    /// `(uid, status, type, error code)` of every task, in enqueue order.
    pub fn tasks(&self) -> Vec<(u64, String, String, Option<String>)> {
        self.lock()
            .tasks
            .iter()
            .map(|task| {
                (
                    task.uid,
                    task.status.to_owned(),
                    task.kind.to_owned(),
                    task.error
                        .as_ref()
                        .and_then(|error| error["code"].as_str())
                        .map(str::to_owned),
                )
            })
            .collect()
    }

    /// Whether every task reached an end.
    pub fn idle(&self) -> bool {
        self.lock()
            .tasks
            .iter()
            .all(|task| matches!(task.status, "succeeded" | "failed" | "canceled"))
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The documents requests, each as its array of documents.
    pub fn document_requests(&self) -> Vec<Vec<Value>> {
        self.seen()
            .iter()
            .filter(|seen| seen.path.ends_with("/documents"))
            .map(|seen| serde_json::from_slice::<Vec<Value>>(&seen.body).unwrap_or_default())
            .collect()
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One step of the task processor: the task processing finishes, else the
/// oldest enqueued one starts.
fn step(shared: &mut Shared) {
    if shared.paused {
        return;
    }
    if let Some(position) = shared
        .tasks
        .iter()
        .position(|task| task.status == "processing")
    {
        let task = shared.tasks[position].clone();
        let result = apply(shared, &task);
        let task = &mut shared.tasks[position];
        match result {
            Ok(()) => task.status = "succeeded",
            Err(error) => {
                task.status = "failed";
                task.error = Some(error);
            }
        }
        return;
    }
    if let Some(task) = shared
        .tasks
        .iter_mut()
        .find(|task| task.status == "enqueued")
    {
        task.status = "processing";
    }
}

fn task_error(code: &str, kind: &str, message: &str) -> Value {
    json!({
        "message": message,
        "code": code,
        "type": kind,
        "link": format!("https://docs.meilisearch.com/errors#{code}"),
    })
}

/// Applies a task all or nothing.
fn apply(shared: &mut Shared, task: &Task) -> Result<(), Value> {
    match &task.work {
        Work::CreateIndex { primary_key } => {
            if shared.indexes.contains_key(&task.index) {
                return Err(task_error(
                    "index_already_exists",
                    "invalid_request",
                    &format!("Index `{}` already exists.", task.index),
                ));
            }
            shared.indexes.insert(
                task.index.clone(),
                Index {
                    primary_key: primary_key.clone(),
                    docs: BTreeMap::new(),
                },
            );
            Ok(())
        }
        Work::Documents {
            replace,
            primary_key,
            documents,
            internal_error,
        } => {
            if *internal_error {
                return Err(task_error(
                    "internal",
                    "internal",
                    "An internal error has occurred. `Resource temporarily unavailable (os error 11)`.",
                ));
            }
            if !shared.indexes.contains_key(&task.index) && !shared.auto_create_index {
                return Err(task_error(
                    "index_not_found",
                    "invalid_request",
                    &format!("Index `{}` not found.", task.index),
                ));
            }
            let current = shared
                .indexes
                .get(&task.index)
                .and_then(|index| index.primary_key.clone());
            let key = match (current, primary_key) {
                (Some(current), Some(asked)) if &current != asked => {
                    return Err(task_error(
                        "index_primary_key_already_exists",
                        "invalid_request",
                        &format!(
                            "Index `{}`: Index already has a primary key: `{current}`.",
                            task.index
                        ),
                    ));
                }
                (Some(current), _) => current,
                (None, Some(asked)) => asked.clone(),
                (None, None) => infer_primary_key(documents.first())?,
            };
            let mut ids = Vec::with_capacity(documents.len());
            for document in documents {
                let Some(id) = document.get(&key) else {
                    return Err(task_error(
                        "missing_document_id",
                        "invalid_request",
                        &format!(
                            "Document doesn't have a `{key}` attribute: `{}`.",
                            Value::Object(document.clone())
                        ),
                    ));
                };
                let Some(id) = document_id(id) else {
                    return Err(task_error(
                        "invalid_document_id",
                        "invalid_request",
                        &format!(
                            "Document identifier `{id}` is invalid. A document identifier can be of type integer or string, only composed of alphanumeric characters (a-z A-Z 0-9), hyphens (-) and underscores (_), and can not be more than 511 bytes."
                        ),
                    ));
                };
                if let Some(geo) = document.get("_geo")
                    && !(geo.get("lat").is_some() && geo.get("lng").is_some())
                {
                    return Err(task_error(
                        "invalid_document_geo_field",
                        "invalid_request",
                        &format!(
                            "The `_geo` field in the document with the id: `{id}` is not an object. Was expecting an object with the `_geo.lat` and `_geo.lng` fields but instead got `{geo}`."
                        ),
                    ));
                }
                ids.push(id);
            }
            let index = shared.indexes.entry(task.index.clone()).or_default();
            index.primary_key = Some(key);
            for (id, document) in ids.into_iter().zip(documents) {
                match index.docs.get_mut(&id) {
                    Some(Value::Object(stored)) if !replace => {
                        stored.extend(document.clone());
                    }
                    _ => {
                        index.docs.insert(id, Value::Object(document.clone()));
                    }
                }
            }
            Ok(())
        }
    }
}

fn infer_primary_key(first: Option<&Map<String, Value>>) -> Result<String, Value> {
    let candidates: Vec<&String> = first
        .map(|document| {
            document
                .keys()
                .filter(|name| name.to_lowercase().ends_with("id"))
                .collect()
        })
        .unwrap_or_default();
    match candidates.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(task_error(
            "index_primary_key_no_candidate_found",
            "invalid_request",
            "The primary key inference failed as the engine did not find any field ending with `id` in its name. Please specify the primary key manually using the `primaryKey` query parameter.",
        )),
        many => Err(task_error(
            "index_primary_key_multiple_candidates_found",
            "invalid_request",
            &format!(
                "The primary key inference failed as the engine found {} fields ending with `id` in their names: {:?}. Please specify the primary key manually using the `primaryKey` query parameter.",
                many.len(),
                many
            ),
        )),
    }
}

/// The id of a valid document identifier.
fn document_id(value: &Value) -> Option<String> {
    match value {
        Value::Number(number) if number.is_i64() || number.is_u64() => Some(number.to_string()),
        Value::String(id)
            if !id.is_empty()
                && id.len() <= 511
                && id
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_') =>
        {
            Some(id.clone())
        }
        _ => None,
    }
}

fn error(status: u16, code: &str, kind: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(status).expect("a status"),
        axum::Json(task_error(code, kind, message)),
    )
        .into_response()
}

fn answer(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).expect("a status"),
        axum::Json(body),
    )
        .into_response()
}

fn task_json(task: &Task) -> Value {
    let details = match &task.work {
        Work::CreateIndex { primary_key } => json!({"primaryKey": primary_key}),
        Work::Documents { .. } => json!({
            "receivedDocuments": task.received,
            "indexedDocuments": if task.status == "succeeded" { json!(task.received) } else { json!(null) },
        }),
    };
    json!({
        "uid": task.uid,
        "indexUid": task.index,
        "status": task.status,
        "type": task.kind,
        "canceledBy": null,
        "details": details,
        "error": task.error,
        "duration": null,
        "enqueuedAt": "2024-02-29T13:45:00.000000Z",
        "startedAt": null,
        "finishedAt": null,
    })
}

fn enqueue(
    shared: &mut Shared,
    index: &str,
    kind: &'static str,
    work: Work,
    received: usize,
) -> Response {
    let uid = shared.tasks.len() as u64;
    shared.tasks.push(Task {
        uid,
        index: index.to_owned(),
        status: "enqueued",
        kind,
        work,
        error: None,
        received,
    });
    answer(
        202,
        json!({
            "taskUid": uid,
            "indexUid": index,
            "status": "enqueued",
            "type": kind,
            "enqueuedAt": "2024-02-29T13:45:00.000000Z",
        }),
    )
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
        return error(503, "internal", "internal", "Service unavailable.");
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if segments != ["health"]
        && let Some(key) = &shared.master_key
    {
        match parts
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
        {
            None => {
                return error(
                    401,
                    "missing_authorization_header",
                    "auth",
                    "The Authorization header is missing. It must use the bearer authorization method.",
                );
            }
            Some(value) if value != format!("Bearer {key}") => {
                return error(
                    403,
                    "invalid_api_key",
                    "auth",
                    "The provided API key is invalid.",
                );
            }
            Some(_) => {}
        }
    }
    let method = parts.method.as_str();
    match (method, segments.as_slice()) {
        ("GET", ["health"]) => answer(200, json!({"status": "available"})),
        ("GET", ["version"]) => answer(
            200,
            json!({"commitSha": "0000000", "commitDate": "2024-02-29T00:00:00Z", "pkgVersion": "1.13.0"}),
        ),
        ("GET", ["indexes", uid]) => match shared.indexes.get(*uid) {
            Some(index) => answer(
                200,
                json!({
                    "uid": uid,
                    "primaryKey": index.primary_key,
                    "createdAt": "2024-02-29T13:45:00.000000Z",
                    "updatedAt": "2024-02-29T13:45:00.000000Z",
                }),
            ),
            None => error(
                404,
                "index_not_found",
                "invalid_request",
                &format!("Index `{uid}` not found."),
            ),
        },
        ("POST", ["indexes"]) => {
            let Ok(request) = serde_json::from_slice::<Value>(&body) else {
                return error(
                    400,
                    "bad_request",
                    "invalid_request",
                    "The body is not JSON.",
                );
            };
            let Some(uid) = request["uid"].as_str() else {
                return error(
                    400,
                    "missing_index_uid",
                    "invalid_request",
                    "Missing field `uid`",
                );
            };
            let primary_key = request["primaryKey"].as_str().map(str::to_owned);
            let uid = uid.to_owned();
            enqueue(
                &mut shared,
                &uid,
                "indexCreation",
                Work::CreateIndex { primary_key },
                0,
            )
        }
        ("POST" | "PUT", ["indexes", uid, "documents"]) => {
            if let Some(Some((status, retry_after))) = shared.request_faults.pop_front() {
                let mut response = if status == 429 {
                    error(429, "too_many_requests", "system", "Too many requests.")
                } else {
                    error(status, "internal", "internal", "Service unavailable.")
                };
                if let Some(seconds) = retry_after {
                    response.headers_mut().insert(
                        "retry-after",
                        seconds.to_string().parse().expect("a header"),
                    );
                }
                return response;
            }
            if body.len() > shared.payload_limit {
                return error(
                    413,
                    "payload_too_large",
                    "invalid_request",
                    &format!(
                        "The provided payload reached the size limit. The maximum accepted payload size is {} B.",
                        shared.payload_limit
                    ),
                );
            }
            let documents = match serde_json::from_slice::<Vec<Value>>(&body) {
                Ok(values) => values
                    .into_iter()
                    .map(|value| match value {
                        Value::Object(object) => Ok(object),
                        other => Err(other),
                    })
                    .collect::<Result<Vec<_>, _>>(),
                Err(_) => Err(Value::Null),
            };
            let Ok(documents) = documents else {
                return error(
                    400,
                    "malformed_payload",
                    "invalid_request",
                    "The `json` payload provided is malformed. `Couldn't serialize document value: expected an array of objects`.",
                );
            };
            let primary_key = url_param(&query, "primaryKey");
            let internal_error = shared.internal_task_faults > 0;
            if internal_error {
                shared.internal_task_faults -= 1;
            }
            let received = documents.len();
            let uid = (*uid).to_owned();
            enqueue(
                &mut shared,
                &uid,
                "documentAdditionOrUpdate",
                Work::Documents {
                    replace: method == "POST",
                    primary_key,
                    documents,
                    internal_error,
                },
                received,
            )
        }
        ("GET", ["indexes", uid, "documents", id]) => {
            match shared
                .indexes
                .get(*uid)
                .and_then(|index| index.docs.get(*id))
            {
                Some(document) => answer(200, document.clone()),
                None => error(
                    404,
                    "document_not_found",
                    "invalid_request",
                    &format!("Document `{id}` not found."),
                ),
            }
        }
        ("GET", ["tasks", uid]) => {
            match uid
                .parse::<u64>()
                .ok()
                .and_then(|uid| shared.tasks.get(uid as usize))
            {
                Some(task) => answer(200, task_json(task)),
                None => error(
                    404,
                    "task_not_found",
                    "invalid_request",
                    &format!("Task `{uid}` not found."),
                ),
            }
        }
        _ => error(404, "not_found", "invalid_request", "Not found."),
    }
}

fn url_param(query: &str, name: &str) -> Option<String> {
    let url = reqwest::Url::parse(&format!("http://server/?{query}")).ok()?;
    url.query_pairs()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}
