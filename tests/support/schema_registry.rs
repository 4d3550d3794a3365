//! A protocol test server of the Confluent schema registry's REST API (the
//! part a client of the wire format uses), on a free loopback port: schemas by
//! id, subjects and their versions, registration, optional basic auth. It
//! records every request so tests can count the client's calls.
#![cfg(feature = "schema-registry")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

#[derive(Default)]
struct Registry {
    /// Schema text by id (ids from 1).
    schemas: Vec<String>,
    /// Each subject's versions, as schema ids (version n at index n - 1).
    subjects: BTreeMap<String, Vec<u32>>,
    requests: Vec<String>,
}

#[derive(Clone)]
struct Shared {
    registry: Arc<Mutex<Registry>>,
    credentials: Option<(String, String)>,
}

pub struct SchemaRegistryServer {
    pub url: String,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl SchemaRegistryServer {
    /// Starts the server; with `credentials`, every request needs them as basic auth.
    pub async fn start(credentials: Option<(&str, &str)>) -> Self {
        let (shared, app) = Self::app(credentials);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: SocketAddr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url: format!("http://{address}"),
            shared,
            task,
        }
    }

    /// The same over HTTPS, presenting `cert_pem` for `localhost`.
    pub async fn start_tls(
        credentials: Option<(&str, &str)>,
        cert_pem: &str,
        key_pem: &str,
    ) -> Self {
        let (shared, app) = Self::app(credentials);
        let config = axum_server::tls_rustls::RustlsConfig::from_pem(
            cert_pem.as_bytes().to_vec(),
            key_pem.as_bytes().to_vec(),
        )
        .await
        .expect("a usable certificate");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            axum_server::from_tcp_rustls(listener, config)
                .expect("a listening socket")
                .serve(app.into_make_service())
                .await
                .unwrap();
        });
        Self {
            url: format!("https://localhost:{port}"),
            shared,
            task,
        }
    }

    fn app(credentials: Option<(&str, &str)>) -> (Shared, Router) {
        let shared = Shared {
            registry: Arc::default(),
            credentials: credentials.map(|(user, password)| (user.to_owned(), password.to_owned())),
        };
        let app = Router::new()
            .route("/schemas/ids/{id}", get(schema_by_id))
            .route("/subjects", get(subjects))
            .route("/subjects/{subject}/versions", get(versions).post(register))
            .route("/subjects/{subject}/versions/{version}", get(version))
            .with_state(shared.clone());
        (shared, app)
    }

    /// Registers `schema` under `subject` as a client would; returns its id.
    pub fn register(&self, subject: &str, schema: &str) -> u32 {
        add(&mut self.shared.registry.lock().unwrap(), subject, schema)
    }

    /// Every request so far, as "METHOD path".
    pub fn requests(&self) -> Vec<String> {
        self.shared.registry.lock().unwrap().requests.clone()
    }

    pub fn schema(&self, id: u32) -> Option<String> {
        let registry = self.shared.registry.lock().unwrap();
        registry.schemas.get(id as usize - 1).cloned()
    }
}

impl Drop for SchemaRegistryServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn add(registry: &mut Registry, subject: &str, schema: &str) -> u32 {
    let id = match registry.schemas.iter().position(|known| known == schema) {
        Some(index) => index as u32 + 1,
        None => {
            registry.schemas.push(schema.to_owned());
            registry.schemas.len() as u32
        }
    };
    let versions = registry.subjects.entry(subject.to_owned()).or_default();
    if !versions.contains(&id) {
        versions.push(id);
    }
    id
}

/// RFC 4648 base64 with padding, for the expected basic auth header.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in bytes.chunks(3) {
        let word = chunk.iter().enumerate().fold(0u32, |word, (at, byte)| {
            word | u32::from(*byte) << (16 - 8 * at)
        });
        for at in 0..4 {
            if at <= chunk.len() {
                text.push(ALPHABET[(word >> (18 - 6 * at)) as usize & 63] as char);
            } else {
                text.push('=');
            }
        }
    }
    text
}

fn error(status: StatusCode, code: u32, message: &str) -> Response {
    (
        status,
        Json(json!({"error_code": code, "message": message})),
    )
        .into_response()
}

/// Records the request and checks its credentials: the answer refusing it, if any.
fn refusal(shared: &Shared, headers: &HeaderMap, request: String) -> Option<Response> {
    shared.registry.lock().unwrap().requests.push(request);
    let (user, password) = shared.credentials.as_ref()?;
    let expected = format!("Basic {}", base64(format!("{user}:{password}").as_bytes()));
    let given = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok());
    (given != Some(expected.as_str()))
        .then(|| error(StatusCode::UNAUTHORIZED, 40101, "Unauthorized"))
}

async fn schema_by_id(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<u32>,
) -> Response {
    if let Some(response) = refusal(&shared, &headers, format!("GET /schemas/ids/{id}")) {
        return response;
    }
    let registry = shared.registry.lock().unwrap();
    match (id as usize)
        .checked_sub(1)
        .and_then(|index| registry.schemas.get(index))
    {
        Some(schema) => Json(json!({"schema": schema})).into_response(),
        None => error(StatusCode::NOT_FOUND, 40403, "Schema not found"),
    }
}

async fn subjects(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(response) = refusal(&shared, &headers, "GET /subjects".into()) {
        return response;
    }
    let registry = shared.registry.lock().unwrap();
    Json(json!(registry.subjects.keys().collect::<Vec<_>>())).into_response()
}

async fn versions(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path(subject): Path<String>,
) -> Response {
    if let Some(response) = refusal(
        &shared,
        &headers,
        format!("GET /subjects/{subject}/versions"),
    ) {
        return response;
    }
    let registry = shared.registry.lock().unwrap();
    match registry.subjects.get(&subject) {
        Some(versions) => Json(json!((1..=versions.len()).collect::<Vec<_>>())).into_response(),
        None => error(StatusCode::NOT_FOUND, 40401, "Subject not found"),
    }
}

async fn version(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path((subject, version)): Path<(String, String)>,
) -> Response {
    if let Some(response) = refusal(
        &shared,
        &headers,
        format!("GET /subjects/{subject}/versions/{version}"),
    ) {
        return response;
    }
    let registry = shared.registry.lock().unwrap();
    let Some(versions) = registry.subjects.get(&subject) else {
        return error(StatusCode::NOT_FOUND, 40401, "Subject not found");
    };
    let number = match version.as_str() {
        "latest" => versions.len(),
        number => number.parse().unwrap_or(0),
    };
    match number.checked_sub(1).and_then(|index| versions.get(index)) {
        Some(&id) => Json(json!({
            "subject": subject,
            "version": number,
            "id": id,
            "schema": registry.schemas[id as usize - 1],
        }))
        .into_response(),
        None => error(StatusCode::NOT_FOUND, 40402, "Version not found"),
    }
}

async fn register(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path(subject): Path<String>,
    body: String,
) -> Response {
    if let Some(response) = refusal(
        &shared,
        &headers,
        format!("POST /subjects/{subject}/versions"),
    ) {
        return response;
    }
    let schema = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|body| body["schema"].as_str().map(str::to_owned));
    let Some(schema) = schema else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, 42201, "Invalid schema");
    };
    let id = add(&mut shared.registry.lock().unwrap(), &subject, &schema);
    Json(json!({"id": id})).into_response()
}
