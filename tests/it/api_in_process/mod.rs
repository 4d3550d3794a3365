//! The control-plane API served in-process over real HTTP, on a runtime with
//! the in-memory bus: fast checks of every endpoint's codes and shapes, config
//! versions, auth, CORS, TLS and redaction.
// The tests here run the random source and the stdout sink (the default
// features): a build without them leaves them out rather than failing them.
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

mod configs;
mod connectors;
mod dlq;
mod prometheus_metrics;
mod redaction;
mod server;
mod tap;
mod ui;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iggy_connect::api::{ApiServer, ApiSetupError, ApiState, metrics};
use iggy_connect::codec::Schema;
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::runtime::HttpConfig;
use iggy_connect::config::{
    ConnectorConfig, KindConfig, OnError, SinkStream, SourceStream, load_connector_dir,
};
use iggy_connect::connectors::{ConnectorKind, Registry, encode_state};
use iggy_connect::engine::backoff::Backoff;
use iggy_connect::engine::runtime::{Runtime, RuntimeOptions};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::state::{MemoryStateStore, StateStore, StoredState};
use reqwest::StatusCode;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);
const CANARY: &str = "canary-5ecret-value";

const FAST: Backoff = Backoff {
    initial: Duration::from_millis(10),
    max: Duration::from_millis(50),
    multiplier: 2.0,
};

struct Harness {
    _dir: tempfile::TempDir,
    connectors: PathBuf,
    bus: MemoryBus,
    state: Arc<MemoryStateStore>,
    runtime: Arc<Runtime>,
    server: ApiServer,
    client: reqwest::Client,
    api_key: Option<String>,
}

async fn harness(files: &[(&str, String)]) -> Harness {
    harness_with(files, Vec::new(), HttpConfig::default()).await
}

async fn harness_with(
    files: &[(&str, String)],
    extra: Vec<ConnectorConfig>,
    mut http: HttpConfig,
) -> Harness {
    let prometheus = metrics::install().expect("the recorder installs");
    let dir = tempfile::tempdir().unwrap();
    let connectors = dir.path().join("connectors");
    std::fs::create_dir(&connectors).unwrap();
    for (name, text) in files {
        std::fs::write(connectors.join(name), text).unwrap();
    }
    let (configs, issues) = load_connector_dir(&connectors, &EnvVars::default());
    assert!(issues.iter().all(|issue| !issue.is_error()), "{issues:?}");
    let bus = MemoryBus::new();
    let state = Arc::new(MemoryStateStore::new());
    let runtime = Runtime::with_options(
        Arc::new(bus.clone()),
        state.clone(),
        RuntimeOptions {
            shutdown_timeout: Duration::from_secs(2),
            source_backoff: FAST,
            sink_backoff: FAST,
            ..RuntimeOptions::default()
        },
    );
    for config in configs.into_iter().chain(extra) {
        runtime.add(config).unwrap();
    }
    runtime.start_enabled().await;
    http.address = "127.0.0.1:0".into();
    http.metrics.enabled = true;
    let api_key = {
        use secrecy::ExposeSecret;
        let key = http.api_key.expose_secret().to_owned();
        (!key.is_empty()).then_some(key)
    };
    let api_state = ApiState::new(runtime.clone(), state.clone())
        .with_config_dir(&connectors, EnvVars::default())
        .with_prometheus(prometheus);
    let server = ApiServer::start(&http, api_state)
        .await
        .expect("the API starts");
    Harness {
        _dir: dir,
        connectors,
        bus,
        state,
        runtime,
        server,
        client: reqwest::Client::new(),
        api_key,
    }
}

impl Harness {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .client
            .request(method, format!("{}{path}", self.server.url()));
        match &self.api_key {
            Some(key) => request.header("api-key", key),
            None => request,
        }
    }

    async fn text(&self, method: reqwest::Method, path: &str) -> (StatusCode, String) {
        let response = self.request(method, path).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, text) = self.text(reqwest::Method::GET, path).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn post(&self, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self.request(reqwest::Method::POST, path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn status_of(&self, kind: &str, key: &str) -> String {
        let (_, details) = self.get(&format!("/{kind}/{key}")).await;
        details["status"].as_str().unwrap_or_default().to_owned()
    }

    async fn wait_for_status(&self, kind: &str, key: &str, wanted: &str) {
        let started = Instant::now();
        loop {
            let status = self.status_of(kind, key).await;
            if status == wanted {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "{kind} {key} is {status}, expected {wanted}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn random_source(key: &str, topic: &str, extra: &str) -> String {
    format!(
        "type = \"source\"\nkey = \"{key}\"\nenabled = true\nversion = 0\nname = \"Random {key}\"\npath = \"random\"\n{extra}\n\
         [[streams]]\nstream = \"api\"\ntopic = \"{topic}\"\nschema = \"json\"\n\
         [plugin_config]\ninterval = \"10ms\"\nmessages_range = [5, 5]\n"
    )
}

fn stdout_sink(key: &str, topic: &str) -> String {
    format!(
        "type = \"sink\"\nkey = \"{key}\"\nenabled = true\nversion = 0\nname = \"Stdout {key}\"\npath = \"libiggy_connector_stdout_sink\"\n\
         [[streams]]\nstream = \"api\"\ntopics = [\"{topic}\"]\nschema = \"json\"\n"
    )
}
