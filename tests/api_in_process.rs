//! The control-plane API served in-process over real HTTP, on a runtime with
//! the in-memory bus: fast checks of every endpoint's codes and shapes, config
//! versions, auth, CORS, TLS and redaction.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iggy_connect::api::{ApiServer, ApiSetupError, ApiState, metrics};
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::runtime::HttpConfig;
use iggy_connect::config::{
    ConnectorConfig, KindConfig, OnError, SinkStream, SourceStream, load_connector_dir,
};
use iggy_connect::connectors::{ConnectorKind, Registry, encode_state};
use iggy_connect::engine::backoff::Backoff;
use iggy_connect::engine::codec::Schema;
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

#[tokio::test]
async fn connectors_are_listed_with_status_details_streams_and_transforms() {
    let (source, off, sink, topic) = (unique("src"), unique("off"), unique("snk"), unique("t"));
    let harness = harness(&[
        ("a.toml", random_source(&source, &topic, "")),
        (
            "b.toml",
            random_source(&off, &topic, "").replace("enabled = true", "enabled = false"),
        ),
        ("c.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    harness.wait_for_status("sources", &source, "running").await;

    let (status, root) = harness.text(reqwest::Method::GET, "/").await;
    assert_eq!(
        (status, root.as_str()),
        (StatusCode::OK, "Connector Runtime API")
    );

    let (status, sources) = harness.get("/sources").await;
    assert_eq!(status, StatusCode::OK);
    let listed: BTreeMap<&str, &Value> = sources
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (entry["key"].as_str().unwrap(), entry))
        .collect();
    assert_eq!(listed.len(), 2, "{sources}");
    let running = listed[source.as_str()];
    for field in [
        "id",
        "key",
        "name",
        "path",
        "enabled",
        "status",
        "last_error",
        "plugin_config_format",
    ] {
        assert!(running.get(field).is_some(), "missing {field} in {running}");
    }
    assert_eq!(running["status"], "running");
    assert_eq!(running["enabled"], true);
    assert_eq!(running["path"], "random");
    let disabled = listed[off.as_str()];
    assert_eq!(
        (disabled["status"].as_str(), disabled["enabled"].as_bool()),
        (Some("stopped"), Some(false))
    );

    let (status, details) = harness.get(&format!("/sources/{source}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(details["streams"][0]["topic"], topic.as_str());
    assert_eq!(details["streams"][0]["schema"], "json");
    assert_eq!(details["streams"][0]["linger_time"], "5ms");

    let (status, sinks) = harness.get("/sinks").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sinks[0]["key"], sink.as_str());
    assert_eq!(sinks[0]["path"], "libiggy_connector_stdout_sink");
    let (_, sink_details) = harness.get(&format!("/sinks/{sink}")).await;
    assert_eq!(
        sink_details["streams"][0]["consumer_group"],
        format!("iggy-connect-sink-{sink}")
    );

    let (status, transforms) = harness.get(&format!("/sources/{source}/transforms")).await;
    assert_eq!((status, transforms), (StatusCode::OK, json!([])));

    let (status, missing) = harness.get("/sources/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["code"], "source_not_found");
    assert!(missing["reason"].as_str().unwrap().contains("nope"));
    let (status, missing) = harness.get("/sinks/nope/transforms").await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("sink_not_found"))
    );
    let (status, _) = harness.get(&format!("/sinks/{sink}/state")).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "sinks have no state endpoint"
    );
}

#[tokio::test]
async fn config_versions_are_listed_created_activated_deleted_and_restarted_into() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("first.toml", random_source(&key, &topic, ""))]).await;
    harness.wait_for_status("sources", &key, "running").await;

    let (status, configs) = harness.get(&format!("/sources/{key}/configs")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(configs.as_array().unwrap().len(), 1);
    assert_eq!(
        (
            configs[0]["version"].as_u64(),
            configs[0]["active"].as_bool()
        ),
        (Some(0), Some(true))
    );
    assert_eq!(configs[0]["plugin_config"]["interval"], "10ms");

    // A new version: upstream's body, validated by the file parser.
    let body = json!({
        "enabled": true,
        "name": "renamed",
        "path": "libiggy_connector_random_source",
        "streams": [{"stream": "api", "topic": topic, "schema": "json", "batch_length": 100}],
        "plugin_config_format": "json",
        "plugin_config": {"interval": "10ms", "messages_range": [2, 2]},
        "transforms": null,
    });
    let (status, created) = harness
        .post(&format!("/sources/{key}/configs"), Some(body))
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert_eq!(
        (created["version"].as_u64(), created["active"].as_bool()),
        (Some(1), Some(false))
    );
    assert!(
        harness
            .connectors
            .join(format!("source_{key}_1.toml"))
            .is_file()
    );

    let (status, one) = harness.get(&format!("/sources/{key}/configs/1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            one["name"].as_str(),
            one["active"].as_bool(),
            one["running"].as_bool()
        ),
        (Some("renamed"), Some(true), Some(false))
    );
    let (status, missing) = harness.get(&format!("/sources/{key}/configs/7")).await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("source_config_not_found"))
    );
    let (status, _) = harness.get(&format!("/sources/{key}/configs/seven")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Restart runs the active version: the highest while nothing is pinned.
    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, details) = harness.get(&format!("/sources/{key}")).await;
    assert_eq!(
        (details["version"].as_u64(), details["name"].as_str()),
        (Some(1), Some("renamed"))
    );
    assert_eq!(details["path"], "libiggy_connector_random_source");

    // Roll back: pin version 0, then restart.
    let response = harness
        .request(
            reqwest::Method::PUT,
            &format!("/sources/{key}/configs/active"),
        )
        .json(&json!({"version": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let pointers =
        std::fs::read_to_string(harness.connectors.join(".active_versions.toml")).unwrap();
    let pointers: toml::Table = toml::from_str(&pointers).unwrap();
    assert_eq!(pointers["sources"][key.as_str()].as_integer(), Some(0));
    let (_, active) = harness.get(&format!("/sources/{key}/configs/active")).await;
    assert_eq!(
        (
            active["version"].as_u64(),
            active["active"].as_bool(),
            active["running"].as_bool()
        ),
        (Some(0), Some(true), Some(false))
    );
    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, details) = harness.get(&format!("/sources/{key}")).await;
    assert_eq!(details["version"].as_u64(), Some(0));
    harness.wait_for_status("sources", &key, "running").await;

    let response = harness
        .request(
            reqwest::Method::PUT,
            &format!("/sources/{key}/configs/active"),
        )
        .json(&json!({"version": 9}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // An invalid config is refused with every issue, and nothing is written.
    let (status, refused) = harness
        .post(
            &format!("/sources/{key}/configs"),
            Some(json!({"enabled": true, "path": "random", "plugin_config": {"interval": "soon"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["code"], "invalid_configuration");
    let fields: Vec<&str> = refused["issues"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|issue| issue["field"].as_str())
        .collect();
    assert!(fields.contains(&"streams"), "{refused}");
    assert!(
        fields
            .iter()
            .any(|field| field.starts_with("plugin_config")),
        "{refused}"
    );
    assert!(
        !harness
            .connectors
            .join(format!("source_{key}_2.toml"))
            .exists()
    );

    // Deleting the pinned version moves the pointer to the highest left.
    let response = harness
        .request(
            reqwest::Method::DELETE,
            &format!("/sources/{key}/configs?version=0"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let (_, configs) = harness.get(&format!("/sources/{key}/configs")).await;
    let versions: Vec<(u64, bool)> = configs
        .as_array()
        .unwrap()
        .iter()
        .map(|config| {
            (
                config["version"].as_u64().unwrap(),
                config["active"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(versions, vec![(1, true)]);
    let response = harness
        .request(
            reqwest::Method::DELETE,
            &format!("/sources/{key}/configs?version=0"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn restart_honours_a_disabled_active_version_and_start_runs_it_anyway() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("first.toml", random_source(&key, &topic, ""))]).await;
    harness.wait_for_status("sources", &key, "running").await;
    let disabled = random_source(&key, &topic, "")
        .replace("enabled = true", "enabled = false")
        .replace("version = 0", "version = 1");
    std::fs::write(harness.connectors.join("second.toml"), disabled).unwrap();

    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, details) = harness.get(&format!("/sources/{key}")).await;
    assert_eq!(
        (
            details["status"].as_str(),
            details["enabled"].as_bool(),
            details["version"].as_u64()
        ),
        (Some("stopped"), Some(false), Some(1))
    );
    let (status, health) = harness.get("/health").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a disabled connector is not a failure: {health}"
    );

    let (status, _) = harness.post(&format!("/sources/{key}/start"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    harness.wait_for_status("sources", &key, "running").await;
}

#[tokio::test]
async fn stop_and_start_move_a_connector_through_stopped_and_running() {
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let harness = harness(&[
        ("a.toml", random_source(&source, &topic, "")),
        ("b.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    harness.wait_for_status("sinks", &sink, "running").await;

    let (status, _) = harness.post(&format!("/sinks/{sink}/stop"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(harness.status_of("sinks", &sink).await, "stopped");
    let (status, _) = harness.get("/health").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an operator's stop is not a failure"
    );

    let (status, _) = harness.post(&format!("/sinks/{sink}/start"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    harness.wait_for_status("sinks", &sink, "running").await;
    let (status, _) = harness.post(&format!("/sinks/{sink}/start"), None).await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "starting a running connector is a no-op"
    );

    let (status, missing) = harness.post("/sinks/nope/stop", None).await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("sink_not_found"))
    );
}

#[tokio::test]
async fn health_reports_a_source_stopped_at_its_nack_limit_and_recovers_after_restart() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[(
        "a.toml",
        random_source(&key, &topic, "max_consecutive_nacks = 2"),
    )])
    .await;
    harness.wait_for_status("sources", &key, "running").await;
    let (status, health) = harness.get("/health").await;
    assert_eq!(
        (status, health),
        (StatusCode::OK, json!({"status": "healthy"}))
    );

    harness.bus.refuse_sends(2);
    harness.wait_for_status("sources", &key, "error").await;
    let (status, health) = harness.get("/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health["status"], "unhealthy");
    let failing = &health["connectors"][0];
    assert_eq!(
        (
            failing["key"].as_str(),
            failing["stop_reason"].as_str(),
            failing["status"].as_str()
        ),
        (Some(key.as_str()), Some("nack_limit"), Some("error"))
    );
    assert!(
        failing["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("NACKed"),
        "{failing}"
    );
    let (status, live) = harness.get("/health/live").await;
    assert_eq!(
        (status, live["status"].as_str()),
        (StatusCode::OK, Some("alive"))
    );

    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let started = Instant::now();
    while harness.get("/health").await.0 != StatusCode::OK {
        assert!(
            started.elapsed() < DEADLINE,
            "still unhealthy after restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_api_key_is_required_everywhere_but_root_and_health() {
    let mut http = HttpConfig::default();
    http.api_key = "letmein".to_owned().into();
    let key = unique("src");
    let mut harness = harness_with(
        &[("a.toml", random_source(&key, &unique("t"), ""))],
        Vec::new(),
        http,
    )
    .await;
    harness.wait_for_status("sources", &key, "running").await;
    harness.api_key = None;
    for public in ["/", "/health", "/health/live"] {
        let (status, _) = harness.text(reqwest::Method::GET, public).await;
        assert_eq!(status, StatusCode::OK, "{public}");
    }
    let protected = [
        "/stats",
        "/metrics",
        "/sources",
        "/sinks",
        &format!("/sources/{key}"),
        &format!("/sources/{key}/configs"),
        &format!("/sources/{key}/state"),
    ];
    for path in protected {
        let (status, body) = harness.text(reqwest::Method::GET, path).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::UNAUTHORIZED, ""),
            "{path}"
        );
        let response = harness
            .client
            .get(format!("{}{path}", harness.server.url()))
            .header("api-key", "letmeout")
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{path} with a wrong key"
        );
        let response = harness
            .client
            .get(format!("{}{path}", harness.server.url()))
            .header("api-key", "letmein")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path} with the key");
    }
    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// A plugin config with secrets for a connector: a known sample where there is
/// one, the connector's declared secret fields, and secrets it did not declare.
fn secret_plugin_config(name: &str, declared: &[&str]) -> Value {
    let mut config = match name {
        "postgres" => {
            json!({"connection_string": format!("postgres://app:{CANARY}@db:5432/x"), "password": CANARY})
        }
        "http" => {
            json!({"url": format!("https://user:{CANARY}@example.com/hook"), "headers": {"Authorization": format!("Bearer {CANARY}"), "X-Api-Key": CANARY}, "auth_token": CANARY})
        }
        _ => json!({}),
    };
    for path in declared {
        let segments: Vec<&str> = path.split('.').collect();
        set_canary(&mut config, &segments);
    }
    let fields = config.as_object_mut().unwrap();
    fields.insert("password".into(), json!(CANARY));
    fields.insert(
        "nested".into(),
        json!({"headers": {"authorization": CANARY}, "list": [{"client_secret": CANARY}]}),
    );
    fields.insert("dsn".into(), json!(format!("host=db password={CANARY}")));
    config
}

fn set_canary(value: &mut Value, segments: &[&str]) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    let fields = value
        .as_object_mut()
        .expect("declared paths go through tables");
    if rest.is_empty() {
        fields.insert((*first).to_owned(), json!(CANARY));
    } else {
        set_canary(fields.entry(*first).or_insert_with(|| json!({})), rest);
    }
}

fn config_for(kind: ConnectorKind, name: &str, key: &str, plugin_config: Value) -> ConnectorConfig {
    let kind_config = match kind {
        ConnectorKind::Source => KindConfig::Source {
            streams: vec![SourceStream {
                stream: "api".into(),
                topic: "t".into(),
                schema: Schema::Json,
                batch_length: 10,
                linger_time: Duration::from_millis(5),
                partitions: 1,
            }],
            max_consecutive_nacks: None,
        },
        ConnectorKind::Sink => KindConfig::Sink {
            streams: vec![SinkStream {
                stream: "api".into(),
                topics: vec!["t".into()],
                schema: Schema::Json,
                batch_length: 10,
                poll_interval: Duration::from_millis(5),
                consumer_group: "g".into(),
            }],
            on_error: OnError::Stop,
        },
    };
    ConnectorConfig {
        kind,
        key: key.to_owned(),
        enabled: false,
        version: 0,
        name: name.to_owned(),
        path: name.to_owned(),
        connector: name.to_owned(),
        plugin_config_format: Some("yaml".into()),
        plugin_config,
        verbose: false,
        benchmark: false,
        transforms: vec![(
            "add_fields".into(),
            json!({"enabled": false, "api_token": CANARY}),
        )],
        dead_letter: None,
        kind_config,
        file: None,
    }
}

#[tokio::test]
async fn secrets_are_redacted_by_every_endpoint_in_every_format_for_every_compiled_in_connector() {
    let mut configs = Vec::new();
    for entry in Registry::sources() {
        let key = unique(&format!("secret-{}", entry.name));
        configs.push(config_for(
            ConnectorKind::Source,
            entry.name,
            &key,
            secret_plugin_config(entry.name, entry.secret_fields),
        ));
    }
    for entry in Registry::sinks() {
        let key = unique(&format!("secret-{}", entry.name));
        configs.push(config_for(
            ConnectorKind::Sink,
            entry.name,
            &key,
            secret_plugin_config(entry.name, entry.secret_fields),
        ));
    }
    assert!(!configs.is_empty());
    let harness = harness_with(&[], configs.clone(), HttpConfig::default()).await;
    let mut checked = 0;
    for config in &configs {
        let kind = match config.kind {
            ConnectorKind::Source => "sources",
            ConnectorKind::Sink => "sinks",
        };
        let key = &config.key;
        if config.kind == ConnectorKind::Source {
            let state = encode_state(&json!({"messages_produced": 3, "password": CANARY, "cursor": format!("postgres://u:{CANARY}@h/db")})).unwrap();
            harness
                .state
                .save(
                    key,
                    &StoredState {
                        connector: config.connector.clone(),
                        data: state,
                    },
                )
                .await
                .unwrap();
        }
        let mut paths = vec![
            format!("/{kind}"),
            format!("/{kind}/{key}"),
            format!("/{kind}/{key}/transforms"),
            format!("/{kind}/{key}/configs"),
            format!("/{kind}/{key}/configs/active"),
            format!("/{kind}/{key}/configs/plugin"),
            "/stats".to_owned(),
            "/health".to_owned(),
        ];
        for format in ["json", "yaml", "toml", "text"] {
            paths.push(format!("/{kind}/{key}/configs/plugin?format={format}"));
        }
        if config.kind == ConnectorKind::Source {
            paths.push(format!("/{kind}/{key}/state"));
        }
        for path in &paths {
            let (status, body) = harness.text(reqwest::Method::GET, path).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            assert!(!body.contains(CANARY), "{path} leaks a secret: {body}");
            checked += 1;
        }
        let (_, plugin) = harness
            .get(&format!("/{kind}/{key}/configs/plugin?format=json"))
            .await;
        assert_eq!(plugin["password"], "[REDACTED]", "{plugin}");
        assert_eq!(
            plugin["nested"]["headers"]["authorization"], "[REDACTED]",
            "{plugin}"
        );
        if config.kind == ConnectorKind::Source {
            let (_, state) = harness.get(&format!("/{kind}/{key}/state")).await;
            assert_eq!(state["state"]["messages_produced"], 3, "{state}");
            assert_eq!(state["state"]["password"], "[REDACTED]", "{state}");
        }
    }
    assert!(checked > 0);
}

#[tokio::test]
async fn a_source_state_is_decoded_from_messagepack() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("a.toml", random_source(&key, &topic, ""))]).await;
    let started = Instant::now();
    loop {
        let (status, state) = harness.get(&format!("/sources/{key}/state")).await;
        assert_eq!(status, StatusCode::OK);
        if state["state"]["messages_produced"].as_u64().unwrap_or(0) > 0 {
            assert_eq!(state["connector"], "random");
            assert!(state["size"].as_u64().unwrap() > 0);
            break;
        }
        assert!(started.elapsed() < DEADLINE, "no state committed: {state}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Parses Prometheus text into `(name, labels) -> value`.
fn parse_metrics(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.trim_end_matches('}');
                let labels = labels
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (label, value) = pair.split_once('=').unwrap();
                        (label.to_owned(), value.trim_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels)
            }
            None => (series.to_owned(), BTreeMap::new()),
        };
        samples.push((name, labels, value.parse().unwrap()));
    }
    samples
}

fn sample(
    samples: &[(String, BTreeMap<String, String>, f64)],
    name: &str,
    key: &str,
    extra: &[(&str, &str)],
) -> Option<f64> {
    samples
        .iter()
        .find(|(sample_name, labels, _)| {
            sample_name == name
                && labels.get("connector_key").map(String::as_str) == Some(key)
                && extra
                    .iter()
                    .all(|(label, value)| labels.get(*label).map(String::as_str) == Some(*value))
        })
        .map(|(_, _, value)| *value)
}

#[tokio::test]
async fn metrics_and_stats_count_the_messages_actually_moved() {
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let source_file = random_source(&source, &topic, "").replace(
        "messages_range = [5, 5]",
        "messages_range = [5, 5]\nmax_count = 40",
    );
    let harness = harness(&[
        ("a.toml", source_file),
        ("b.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    harness.wait_for_status("sources", &source, "stopped").await;
    let started = Instant::now();
    loop {
        let (_, details) = harness.get(&format!("/sources/{source}")).await;
        assert_eq!(details["stop_reason"], "completed");
        let (_, stats) = harness.get("/stats").await;
        let processed = stats["connectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["key"] == sink.as_str())
            .unwrap()["messages_processed"]
            .as_u64()
            .unwrap();
        if processed == 40 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the sink processed {processed} of 40"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(harness.bus.messages("api", &topic).len(), 40);

    let (status, stats) = harness.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    for field in [
        "connectors_runtime_version",
        "connectors_runtime_version_semver",
        "process_id",
        "cpu_usage",
        "total_cpu_usage",
        "memory_usage",
        "total_memory",
        "available_memory",
        "run_time",
        "start_time",
        "sources_total",
        "sources_running",
        "sinks_total",
        "sinks_running",
    ] {
        assert!(stats.get(field).is_some(), "missing {field}");
    }
    assert_eq!(
        stats["process_id"].as_u64(),
        Some(u64::from(std::process::id()))
    );
    assert!(stats["memory_usage"].as_u64().unwrap() > 0);
    let entry = stats["connectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["key"] == source.as_str())
        .unwrap();
    assert_eq!(
        (
            entry["messages_produced"].as_u64(),
            entry["messages_sent"].as_u64(),
            entry["status"].as_str()
        ),
        (Some(40), Some(40), Some("stopped"))
    );
    assert!(entry["messages_consumed"].is_null());

    let (status, text) = harness.text(reqwest::Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let samples = parse_metrics(&text);
    let source_labels = [("connector_type", "source")];
    let sink_labels = [("connector_type", "sink")];
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_produced_total",
            &source,
            &source_labels
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_sent_total",
            &source,
            &source_labels
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_consumed_total",
            &sink,
            &sink_labels
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_processed_total",
            &sink,
            &sink_labels
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_stage_duration_seconds_bucket",
            &source,
            &[("stage", "total"), ("le", "0.00005")]
        )
        .is_some(),
        true
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_stage_duration_seconds_count",
            &sink,
            &[("stage", "commit")]
        )
        .map(|count| count > 0.0),
        Some(true)
    );
    let (status, _) = harness.get("/health").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a completed finite source is healthy"
    );
}

#[tokio::test]
async fn cors_preflight_is_answered_for_allowed_origins() {
    let mut http = HttpConfig::default();
    http.cors.enabled = true;
    http.cors.allowed_origins = vec!["https://console.example".into()];
    http.api_key = "k".to_owned().into();
    let harness = harness_with(&[], Vec::new(), http).await;
    let response = harness
        .client
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/sources", harness.server.url()),
        )
        .header("origin", "https://console.example")
        .header("access-control-request-method", "GET")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "a preflight needs no API key"
    );
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://console.example"
    );
}

#[tokio::test]
async fn bad_cors_settings_are_refused_at_startup_with_the_field_named() {
    let mut http = HttpConfig::default();
    http.address = "127.0.0.1:0".into();
    http.cors.enabled = true;
    http.cors.allowed_methods = vec!["FETCH".into()];
    let runtime = Runtime::new(
        Arc::new(MemoryBus::new()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(1),
    );
    let error = ApiServer::start(
        &http,
        ApiState::new(runtime, Arc::new(MemoryStateStore::new())),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(
            error,
            ApiSetupError::Cors {
                field: "allowed_methods",
                ..
            }
        ),
        "{error}"
    );
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[tokio::test]
async fn tls_serves_https_with_the_configured_certificate() {
    let mut http = HttpConfig::default();
    http.tls.enabled = true;
    http.tls.cert_file = fixture("api_tls_cert.pem");
    http.tls.key_file = fixture("api_tls_key.pem");
    let harness = harness_with(&[], Vec::new(), http).await;
    assert!(harness.server.url().starts_with("https://"));
    let certificate =
        reqwest::Certificate::from_pem(&std::fs::read(fixture("api_tls_cert.pem")).unwrap())
            .unwrap();
    let client = reqwest::Client::builder()
        .tls_certs_only([certificate])
        .build()
        .unwrap();
    let url = format!(
        "https://localhost:{}/health",
        harness.server.address().port()
    );
    let response = client.get(url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let mut http = HttpConfig::default();
    http.address = "127.0.0.1:0".into();
    http.tls.enabled = true;
    http.tls.cert_file = fixture("missing.pem");
    let error = ApiServer::start(
        &http,
        ApiState::new(harness.runtime.clone(), harness.state.clone()),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(
            error,
            ApiSetupError::Tls {
                field: "cert_file",
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_taken_address_is_a_bind_error_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut http = HttpConfig::default();
    http.address = taken.local_addr().unwrap().to_string();
    let runtime = Runtime::new(
        Arc::new(MemoryBus::new()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(1),
    );
    let error = ApiServer::start(
        &http,
        ApiState::new(runtime, Arc::new(MemoryStateStore::new())),
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(error, ApiSetupError::Bind { .. }), "{error}");
    assert!(error.to_string().contains(&http.address), "{error}");
}
