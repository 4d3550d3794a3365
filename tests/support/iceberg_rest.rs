//! An Iceberg REST catalog test server (no REST catalog server can run
//! here): the endpoints of the REST catalog OpenAPI spec the iceberg sink
//! uses (`GET /v1/config`, namespaces, tables: list, create, load, and the
//! commit `POST /v1/namespaces/{ns}/tables/{table}` with its requirements
//! checked, a stale one answered 409 `CommitFailedException`), with the
//! spec's error shape `{"error": {"message", "type", "code"}}`. Tables are
//! plain metadata files in a temp warehouse directory, written with the
//! `iceberg` crate's metadata types; pyiceberg reads them back.
//!
//! Fault injection: [`IcebergRest::fail_commits`] answers the next commits
//! with a status (409 conflicts, 503 outages) without applying them.
#![cfg(feature = "iceberg-sink")]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use axum::Json;
use axum::Router;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use iceberg::io::{FileIO, FileIOBuilder, LocalFsStorageFactory};
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::{MetadataLocation, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateTableRequest, LoadTableResult,
};
use serde_json::{Value, json};
use tokio::sync::Mutex;

pub struct IcebergRest {
    url: String,
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    warehouse: PathBuf,
    file_io: FileIO,
    state: Mutex<Catalog>,
    /// While not 0, the status every request is answered with (503 an
    /// outage, 401 a refused client).
    down: AtomicU16,
}

#[derive(Default)]
struct Catalog {
    namespaces: BTreeSet<Vec<String>>,
    /// (namespace, name) -> the current metadata file.
    tables: BTreeMap<(Vec<String>, String), String>,
    /// Statuses the next commits are answered with.
    faults: VecDeque<StatusCode>,
    /// How long the next commits wait before they are applied.
    stalls: VecDeque<std::time::Duration>,
    commits: u64,
}

type Reply = Result<Response, Response>;

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"message": message.into(), "type": kind, "code": status.as_u16()}});
    (status, Json(body)).into_response()
}

/// A namespace in a URL: levels separated by the unit separator (0x1F).
fn levels(namespace: &str) -> Vec<String> {
    namespace.split('\u{1f}').map(str::to_owned).collect()
}

impl IcebergRest {
    /// Serves on a free loopback port until dropped.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared {
            warehouse: dir.path().to_owned(),
            file_io: FileIOBuilder::new(Arc::new(LocalFsStorageFactory)).build(),
            state: Mutex::new(Catalog::default()),
            down: AtomicU16::new(0),
        });
        let app = Router::new()
            .route("/v1/config", get(config))
            .route(
                "/v1/namespaces",
                get(list_namespaces).post(create_namespace),
            )
            .route("/v1/namespaces/{ns}", get(load_namespace))
            .route(
                "/v1/namespaces/{ns}/tables",
                get(list_tables).post(create_table),
            )
            .route(
                "/v1/namespaces/{ns}/tables/{table}",
                get(load_table).post(commit),
            )
            .layer(from_fn_with_state(shared.clone(), outage))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url,
            shared,
            _dir: dir,
            task,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn warehouse(&self) -> &Path {
        &self.shared.warehouse
    }

    /// Answers the next `count` commits with `status`, applying none.
    pub async fn fail_commits(&self, count: usize, status: u16) {
        let status = StatusCode::from_u16(status).unwrap();
        let mut state = self.shared.state.lock().await;
        state.faults.extend(std::iter::repeat_n(status, count));
    }

    /// While `down`, every request is answered 503 (an outage).
    pub fn set_down(&self, down: bool) {
        self.shared
            .down
            .store(if down { 503 } else { 0 }, Ordering::SeqCst);
    }

    /// From now on every request is answered 401 `NotAuthorizedException`.
    pub fn refuse_clients(&self) {
        self.shared.down.store(401, Ordering::SeqCst);
    }

    /// The next `count` commits wait `duration` before being applied (a
    /// slow catalog): a client that gives up meanwhile may find them applied.
    pub async fn stall_commits(&self, count: usize, duration: std::time::Duration) {
        let mut state = self.shared.state.lock().await;
        state.stalls.extend(std::iter::repeat_n(duration, count));
    }

    /// Injected commit stalls not met yet.
    pub async fn stalls_left(&self) -> usize {
        self.shared.state.lock().await.stalls.len()
    }

    /// Injected commit faults not met yet.
    pub async fn faults_left(&self) -> usize {
        self.shared.state.lock().await.faults.len()
    }

    /// Commits applied so far.
    pub async fn commits(&self) -> u64 {
        self.shared.state.lock().await.commits
    }

    /// The current metadata file of `namespace.table`, if there is one.
    pub async fn metadata_location(&self, namespace: &str, table: &str) -> Option<String> {
        let state = self.shared.state.lock().await;
        state
            .tables
            .get(&(levels(namespace), table.to_owned()))
            .cloned()
    }

    /// Creates `namespace.table` with `schema` (Iceberg schema JSON), as
    /// another writer would through the catalog.
    pub async fn create(&self, namespace: &str, table: &str, schema: Value) {
        self.create_at(namespace, table, schema, None).await;
    }

    /// [`create`](Self::create) with the table's files at `location`.
    pub async fn create_at(
        &self,
        namespace: &str,
        table: &str,
        schema: Value,
        location: Option<&str>,
    ) {
        self.create_with(
            namespace,
            table,
            json!({"schema": schema, "location": location}),
        )
        .await;
    }

    /// Creates `namespace.table` from a `CreateTableRequest` body (`name`
    /// added): `schema`, and `location`, `partition-spec`, ... as given.
    pub async fn create_with(&self, namespace: &str, table: &str, mut request: Value) {
        request["name"] = json!(table);
        let client = reqwest::Client::new();
        let response = client
            .post(format!("{}/v1/namespaces", self.url))
            .json(&json!({"namespace": [namespace]}))
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success() || response.status() == StatusCode::CONFLICT,
            "{}",
            response.status()
        );
        let response = client
            .post(format!("{}/v1/namespaces/{namespace}/tables", self.url))
            .json(&request)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
    }
}

impl Drop for IcebergRest {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn outage(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    match shared.down.load(Ordering::SeqCst) {
        0 => {}
        401 => {
            return error(
                StatusCode::UNAUTHORIZED,
                "NotAuthorizedException",
                "Not authorized to make this request (injected)",
            );
        }
        _ => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableException",
                "the catalog is down (injected)",
            );
        }
    }
    next.run(request).await
}

async fn config() -> Json<Value> {
    Json(json!({"defaults": {}, "overrides": {}}))
}

async fn list_namespaces(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let state = shared.state.lock().await;
    Json(json!({"namespaces": state.namespaces.iter().collect::<Vec<_>>()}))
}

async fn create_namespace(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Reply {
    let namespace: Vec<String> =
        serde_json::from_value(body["namespace"].clone()).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                e.to_string(),
            )
        })?;
    let mut state = shared.state.lock().await;
    if !state.namespaces.insert(namespace.clone()) {
        return Err(error(
            StatusCode::CONFLICT,
            "AlreadyExistsException",
            format!("Namespace already exists: {}", namespace.join(".")),
        ));
    }
    Ok(Json(json!({"namespace": namespace, "properties": {}})).into_response())
}

async fn load_namespace(State(shared): State<Arc<Shared>>, UrlPath(ns): UrlPath<String>) -> Reply {
    let namespace = levels(&ns);
    if !shared.state.lock().await.namespaces.contains(&namespace) {
        return Err(no_namespace(&namespace));
    }
    Ok(Json(json!({"namespace": namespace, "properties": {}})).into_response())
}

fn no_namespace(namespace: &[String]) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NoSuchNamespaceException",
        format!("Namespace does not exist: {}", namespace.join(".")),
    )
}

fn no_table(namespace: &[String], table: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NoSuchTableException",
        format!("Table does not exist: {}.{table}", namespace.join(".")),
    )
}

fn internal(message: impl ToString) -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "ServerError",
        message.to_string(),
    )
}

async fn list_tables(State(shared): State<Arc<Shared>>, UrlPath(ns): UrlPath<String>) -> Reply {
    let namespace = levels(&ns);
    let state = shared.state.lock().await;
    if !state.namespaces.contains(&namespace) {
        return Err(no_namespace(&namespace));
    }
    let identifiers: Vec<Value> = state
        .tables
        .keys()
        .filter(|(ns, _)| *ns == namespace)
        .map(|(ns, name)| json!({"namespace": ns, "name": name}))
        .collect();
    Ok(Json(json!({"identifiers": identifiers})).into_response())
}

async fn create_table(
    State(shared): State<Arc<Shared>>,
    UrlPath(ns): UrlPath<String>,
    Json(request): Json<CreateTableRequest>,
) -> Reply {
    let namespace = levels(&ns);
    let mut state = shared.state.lock().await;
    if !state.namespaces.contains(&namespace) {
        return Err(no_namespace(&namespace));
    }
    let key = (namespace.clone(), request.name.clone());
    if state.tables.contains_key(&key) {
        return Err(error(
            StatusCode::CONFLICT,
            "AlreadyExistsException",
            format!(
                "Table already exists: {}.{}",
                namespace.join("."),
                request.name
            ),
        ));
    }
    // Metadata files stay in the server's warehouse directory; the table's
    // own location (its data and manifests) is what the request asks for
    // (an s3:// one, say), or that directory.
    let mut dir = shared.warehouse.clone();
    dir.extend(&namespace);
    dir.push(&request.name);
    let dir = format!("file://{}", dir.display());
    let creation = TableCreation::builder()
        .name(request.name.clone())
        .location(request.location.clone().unwrap_or_else(|| dir.clone()))
        .schema(request.schema)
        .partition_spec_opt(request.partition_spec)
        .properties(request.properties)
        .build();
    let metadata = TableMetadataBuilder::from_table_creation(creation)
        .and_then(|builder| builder.build())
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                e.to_string(),
            )
        })?
        .metadata;
    let file = MetadataLocation::new_with_metadata(dir, &metadata);
    metadata
        .write_to(&shared.file_io, &file)
        .await
        .map_err(internal)?;
    state.tables.insert(key, file.to_string());
    Ok(Json(loaded(file.to_string(), metadata)).into_response())
}

fn loaded(location: String, metadata: TableMetadata) -> LoadTableResult {
    LoadTableResult {
        metadata_location: Some(location),
        metadata,
        config: Default::default(),
        storage_credentials: None,
    }
}

async fn load_table(
    State(shared): State<Arc<Shared>>,
    UrlPath((ns, table)): UrlPath<(String, String)>,
) -> Reply {
    let namespace = levels(&ns);
    let state = shared.state.lock().await;
    let Some(location) = state.tables.get(&(namespace.clone(), table.clone())) else {
        return Err(no_table(&namespace, &table));
    };
    let metadata = TableMetadata::read_from(&shared.file_io, location)
        .await
        .map_err(internal)?;
    Ok(Json(loaded(location.clone(), metadata)).into_response())
}

/// A commit runs to its end in its own task, as on a real server, even when
/// the client gives up on it.
async fn commit(
    State(shared): State<Arc<Shared>>,
    UrlPath((ns, table)): UrlPath<(String, String)>,
    Json(request): Json<CommitTableRequest>,
) -> Reply {
    let task = {
        let shared = shared.clone();
        tokio::spawn(async move { apply_commit(&shared, ns, table, request).await })
    };
    task.await.map_err(internal)?
}

async fn apply_commit(
    shared: &Shared,
    ns: String,
    table: String,
    request: CommitTableRequest,
) -> Reply {
    let namespace = levels(&ns);
    let stall = shared.state.lock().await.stalls.pop_front();
    if let Some(stall) = stall {
        tokio::time::sleep(stall).await;
    }
    let mut state = shared.state.lock().await;
    if let Some(status) = state.faults.pop_front() {
        let kind = if status == StatusCode::CONFLICT {
            "CommitFailedException"
        } else {
            "ServiceUnavailableException"
        };
        return Err(error(status, kind, "injected fault"));
    }
    let key = (namespace.clone(), table.clone());
    let Some(current) = state.tables.get(&key).cloned() else {
        return Err(no_table(&namespace, &table));
    };
    if let Some(identifier) = &request.identifier
        && *identifier
            != TableIdent::new(
                NamespaceIdent::from_vec(namespace.clone()).unwrap(),
                table.clone(),
            )
    {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "BadRequestException",
            "the identifier does not match the URL",
        ));
    }
    let metadata = TableMetadata::read_from(&shared.file_io, &current)
        .await
        .map_err(internal)?;
    for requirement in &request.requirements {
        if let Err(failed) = requirement.check(Some(&metadata)) {
            return Err(error(
                StatusCode::CONFLICT,
                "CommitFailedException",
                format!("Requirement failed: {failed}"),
            ));
        }
    }
    let mut builder = metadata.into_builder(Some(current.clone()));
    for update in request.updates {
        builder = update.apply(builder).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                e.to_string(),
            )
        })?;
    }
    let updated = builder
        .build()
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                e.to_string(),
            )
        })?
        .metadata;
    let file = MetadataLocation::from_str(&current)
        .map_err(internal)?
        .with_next_version()
        .with_new_metadata(&updated);
    updated
        .write_to(&shared.file_io, &file)
        .await
        .map_err(internal)?;
    state.tables.insert(key, file.to_string());
    state.commits += 1;
    Ok(Json(CommitTableResponse {
        metadata_location: file.to_string(),
        metadata: updated,
    })
    .into_response())
}
