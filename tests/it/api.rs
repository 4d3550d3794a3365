//! The control plane of the real binary: `iggy-connect run` against the
//! in-process Iggy test server, driven over HTTP as an operator would.
// The tests here run the random source and the stdout sink (the default
// features): a build without them leaves them out rather than failing them.
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::Registry;
use iggy_connect::connectors::registry::ConnectorInfo;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support;
use crate::support::iggy_server::IggyTestServer;
use crate::support::prometheus::{parse_metrics, sample};

mod flood;

const DEADLINE: Duration = Duration::from_secs(60);
const CANARY: &str = "canary-5ecret-value";

/// A running `iggy-connect run` and what it logged.
struct Connect {
    child: Child,
    url: String,
    connectors: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    api_key: Option<String>,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

struct Options<'a> {
    iggy_address: String,
    http_extra: &'a str,
    iggy_extra: &'a str,
    /// Start the binary with this soft limit on open files.
    open_files: Option<u64>,
    env: Vec<(String, String)>,
}

impl Options<'_> {
    fn for_server(server: &IggyTestServer) -> Self {
        Self {
            iggy_address: server.address().to_string(),
            http_extra: "",
            iggy_extra: "",
            open_files: None,
            env: Vec::new(),
        }
    }
}

fn write_config(dir: &Path, options: &Options, files: &[(String, String)]) -> (PathBuf, PathBuf) {
    let connectors = dir.join("connectors");
    std::fs::create_dir_all(&connectors).unwrap();
    for (name, text) in files {
        std::fs::write(connectors.join(name), text).unwrap();
    }
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[http]\nenabled = true\naddress = \"127.0.0.1:0\"\n{}\n[http.metrics]\nenabled = true\nendpoint = \"/metrics\"\n\
             [iggy]\naddress = \"{}\"\nusername = \"iggy\"\npassword = \"iggy\"\n{}\n\
             [state]\npath = \"{}\"\n\
             [connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n\
             [engine]\nshutdown_timeout = \"2s\"\n",
            options.http_extra,
            options.iggy_address,
            options.iggy_extra,
            dir.join("state").display(),
            connectors.display()
        ),
    )
    .unwrap();
    (config, connectors)
}

fn command(config: &Path, options: &Options) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_iggy-connect"));
    command
        .args(["run", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .envs(options.env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(soft) = options.open_files {
        use std::os::unix::process::CommandExt;
        // SAFETY: only an async-signal-safe system call between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
                limit.rlim_cur = soft;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                Ok(())
            });
        }
    }
    command
}

/// Starts the binary and waits until its API listens.
fn start(options: Options, files: &[(String, String)]) -> Connect {
    let dir = tempfile::tempdir().unwrap();
    let (config, connectors) = write_config(dir.path(), &options, files);
    let mut child = command(&config, &options)
        .spawn()
        .expect("the binary starts");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (found, url) = mpsc::channel();
    let lines = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("HTTP API listening on ") {
                let rest = &line[at + "HTTP API listening on ".len()..];
                let end = rest.find(['"', ' ']).unwrap_or(rest.len());
                let _ = found.send(rest[..end].to_owned());
            }
            lines.lock().unwrap().push(line);
        }
    });
    let url = match url.recv_timeout(DEADLINE) {
        Ok(url) => url,
        Err(_) => {
            let _ = child.kill();
            panic!(
                "the API never listened:\n{}",
                log.lock().unwrap().join("\n")
            );
        }
    };
    let api_key = options
        .http_extra
        .strip_prefix("api_key = \"")
        .and_then(|rest| rest.strip_suffix('"'))
        .map(str::to_owned);
    Connect {
        child,
        url,
        connectors,
        log,
        api_key,
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Connect {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.url));
        match &self.api_key {
            Some(key) => request.header("api-key", key),
            None => request,
        }
    }

    async fn text(&self, path: &str) -> (StatusCode, String) {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, text) = self.text(path).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn post(&self, path: &str) -> StatusCode {
        self.request(reqwest::Method::POST, path)
            .send()
            .await
            .unwrap()
            .status()
    }

    async fn wait_for(&self, what: &str, mut check: impl AsyncFnMut(&Self) -> bool) {
        support::wait::eventually_or(
            what,
            DEADLINE,
            async || check(self).await,
            || format!("; log:\n{}", self.log.lock().unwrap().join("\n")),
        )
        .await;
    }

    async fn wait_for_status(&self, kind: &str, key: &str, wanted: &str) {
        let path = format!("/{kind}/{key}");
        self.wait_for(&format!("{kind} {key} to be {wanted}"), async |connect| {
            connect.get(&path).await.1["status"] == wanted
        })
        .await;
    }

    async fn stat(&self, key: &str, field: &str) -> u64 {
        let (_, stats) = self.get("/stats").await;
        stats["connectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["key"] == key)
            .and_then(|entry| entry[field].as_u64())
            .unwrap_or(0)
    }

    fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn random_source(key: &str, topic: &str, extra: &str, plugin: &str) -> (String, String) {
    (
        format!("{key}.toml"),
        format!(
            "type = \"source\"\nkey = \"{key}\"\nenabled = true\nversion = 0\nname = \"Random\"\npath = \"libiggy_connector_random_source\"\n{extra}\n\
             [[streams]]\nstream = \"api\"\ntopic = \"{topic}\"\nschema = \"json\"\n\
             [plugin_config]\ninterval = \"10ms\"\nmessages_range = [10, 10]\n{plugin}\n"
        ),
    )
}

fn stdout_sink(key: &str, topic: &str, extra: &str) -> (String, String) {
    (
        format!("{key}.toml"),
        format!(
            "type = \"sink\"\nkey = \"{key}\"\nenabled = true\nversion = 0\nname = \"Stdout\"\npath = \"libiggy_connector_stdout_sink\"\n{extra}\n\
             [[streams]]\nstream = \"api\"\ntopics = [\"{topic}\"]\nschema = \"json\"\n"
        ),
    )
}

#[tokio::test]
async fn run_serves_every_endpoint_with_counters_that_match_the_messages_moved() {
    let server = IggyTestServer::start();
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let mut options = Options::for_server(&server);
    options
        .env
        .push(("IGGY_CONNECTORS_LOGGING_FORMAT".into(), "json".into()));
    let connect = start(
        options,
        &[
            random_source(&source, &topic, "benchmark = true", "max_count = 60"),
            stdout_sink(&sink, &topic, "benchmark = true"),
        ],
    );
    connect
        .wait_for("the sink to process 60 messages", async |connect| {
            connect.stat(&sink, "messages_processed").await == 60
        })
        .await;
    assert_eq!(server.message_count("api", &topic), 60);
    let group = format!("iggy-connect-sink-{sink}");
    connect
        .wait_for("the sink's offset commit", async |_| {
            server.stored_offset("api", &topic, &group, 0) == Some(59)
        })
        .await;
    // The source delivers its last batch, then reports itself completed.
    connect.wait_for_status("sources", &source, "stopped").await;

    let (status, root) = connect.text("/").await;
    assert_eq!(
        (status, root.as_str()),
        (StatusCode::OK, "Connector Runtime API")
    );
    let (status, health) = connect.get("/health").await;
    assert_eq!(
        (status, health),
        (StatusCode::OK, json!({"status": "healthy"})),
        "a completed source counts as healthy"
    );

    let (status, sources) = connect.get("/sources").await;
    assert_eq!(status, StatusCode::OK);
    let listed = &sources[0];
    assert_eq!(
        (listed["key"].as_str(), listed["status"].as_str()),
        (Some(source.as_str()), Some("stopped"))
    );
    let (_, details) = connect.get(&format!("/sources/{source}")).await;
    assert_eq!(details["stop_reason"], "completed");
    assert_eq!(details["streams"][0]["topic"], topic.as_str());
    let (_, sinks) = connect.get("/sinks").await;
    assert_eq!(
        (sinks[0]["key"].as_str(), sinks[0]["status"].as_str()),
        (Some(sink.as_str()), Some("running"))
    );
    let (status, transforms) = connect.get(&format!("/sinks/{sink}/transforms")).await;
    assert_eq!((status, transforms), (StatusCode::OK, json!([])));
    let (status, configs) = connect.get(&format!("/sources/{source}/configs")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            configs[0]["active"].as_bool(),
            configs[0]["running"].as_bool()
        ),
        (Some(true), Some(true))
    );
    let (status, active) = connect
        .get(&format!("/sources/{source}/configs/active"))
        .await;
    assert_eq!(
        (status, active["plugin_config"]["max_count"].as_u64()),
        (StatusCode::OK, Some(60))
    );
    for (format, content_type) in [
        ("json", "application/json"),
        ("yaml", "application/yaml"),
        ("toml", "application/toml"),
        ("text", "text/plain"),
    ] {
        let response = connect
            .request(
                reqwest::Method::GET,
                &format!("/sources/{source}/configs/plugin?format={format}"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], content_type);
        assert!(response.text().await.unwrap().contains("max_count"));
    }
    let (status, state) = connect.get(&format!("/sources/{source}/state")).await;
    assert_eq!(
        (status, state["state"]["messages_produced"].as_u64()),
        (StatusCode::OK, Some(60))
    );

    let (status, stats) = connect.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            stats["sources_total"].as_u64(),
            stats["sources_running"].as_u64(),
            stats["sinks_total"].as_u64(),
            stats["sinks_running"].as_u64()
        ),
        (Some(1), Some(0), Some(1), Some(1))
    );
    assert_eq!(
        stats["process_id"].as_u64(),
        Some(u64::from(connect.child.id()))
    );
    assert_eq!(connect.stat(&source, "messages_sent").await, 60);

    let (status, text) = connect.text("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let samples = parse_metrics(&text);
    let moved = server.message_count("api", &topic) as f64;
    for (name, key) in [
        ("iggy_connector_messages_produced_total", &source),
        ("iggy_connector_messages_sent_total", &source),
        ("iggy_connector_messages_consumed_total", &sink),
        ("iggy_connector_messages_processed_total", &sink),
    ] {
        assert_eq!(sample(&samples, name, key, &[]), Some(moved), "{name}");
    }
    assert_eq!(global(&samples, "iggy_connectors_sources_total"), Some(1.0));
    assert_eq!(global(&samples, "iggy_connectors_sinks_running"), Some(1.0));
    assert!(
        sample(
            &samples,
            "iggy_connector_stage_duration_seconds_bucket",
            &source,
            &[("stage", "iggy_send"), ("le", "5")]
        )
        .is_some_and(|count| count > 0.0)
    );

    // JSON logs; benchmark events with upstream's fields; connector key on the span.
    let lines = connect.log_lines();
    let events: Vec<Value> = lines
        .iter()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert!(!events.is_empty(), "logs are JSON: {lines:?}");
    let benchmark = |kind: &str| {
        events
            .iter()
            .find(|event| {
                event["target"] == "iggy_connectors::benchmark"
                    && event["message"] == "benchmark"
                    && event["connector_type"] == kind
            })
            .unwrap_or_else(|| panic!("no {kind} benchmark event in {lines:?}"))
    };
    let source_event = benchmark("source");
    for field in [
        "connector_key",
        "stream",
        "topic",
        "batch_size",
        "sent_count",
        "decode_us",
        "prepare_us",
        "iggy_send_us",
        "state_saved",
        "state_save_us",
        "total_us",
    ] {
        assert!(
            source_event.get(field).is_some(),
            "source benchmark event lacks {field}: {source_event}"
        );
    }
    assert_eq!(
        (
            source_event["stream"].as_str(),
            source_event["batch_size"].as_u64()
        ),
        (Some("api"), Some(10))
    );
    let sink_event = benchmark("sink");
    for field in [
        "connector_key",
        "stream",
        "topic",
        "partition_id",
        "current_offset",
        "batch_size",
        "processed_count",
        "decode_us",
        "prepare_us",
        "ffi_us",
        "total_us",
    ] {
        assert!(
            sink_event.get(field).is_some(),
            "sink benchmark event lacks {field}: {sink_event}"
        );
    }
    assert_eq!(sink_event["connector_key"], sink.as_str());

    // Stop and start through the API.
    assert_eq!(
        connect.post(&format!("/sinks/{sink}/stop")).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        connect.get(&format!("/sinks/{sink}")).await.1["status"],
        "stopped"
    );
    assert_eq!(
        connect.post(&format!("/sinks/{sink}/start")).await,
        StatusCode::NO_CONTENT
    );
    connect.wait_for_status("sinks", &sink, "running").await;
}

fn global(
    samples: &[(String, std::collections::BTreeMap<String, String>, f64)],
    name: &str,
) -> Option<f64> {
    samples
        .iter()
        .find(|(sample_name, _, _)| sample_name == name)
        .map(|(_, _, value)| *value)
}

#[tokio::test]
async fn health_turns_503_when_a_source_hits_its_nack_limit_and_back_to_200_after_restart() {
    let server = IggyTestServer::start();
    let (source, topic) = (unique("src"), unique("t"));
    let connect = start(
        Options::for_server(&server),
        &[random_source(
            &source,
            &topic,
            "max_consecutive_nacks = 3",
            "",
        )],
    );
    connect.wait_for_status("sources", &source, "running").await;
    connect
        .wait_for("the first messages", async |_| {
            server.message_count("api", &topic) > 0
        })
        .await;
    connect
        .wait_for("a healthy runtime", async |connect| {
            connect.get("/health").await.0 == StatusCode::OK
        })
        .await;

    server.faults().refuse_sends_until_cleared();
    connect.wait_for_status("sources", &source, "error").await;
    let (status, health) = connect.get("/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health["status"], "unhealthy");
    let failing = &health["connectors"][0];
    assert_eq!(
        (
            failing["key"].as_str(),
            failing["status"].as_str(),
            failing["stop_reason"].as_str()
        ),
        (Some(source.as_str()), Some("error"), Some("nack_limit"))
    );
    assert!(failing["last_error"]["timestamp"].as_u64().unwrap() > 0);
    let (_, details) = connect.get(&format!("/sources/{source}")).await;
    assert!(
        details["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("NACKed 3 times"),
        "{details}"
    );
    let (status, _) = connect.get("/health/live").await;
    assert_eq!(status, StatusCode::OK, "the process still serves");
    let (_, text) = connect.text("/metrics").await;
    let stops = sample(
        &parse_metrics(&text),
        "iggy_connector_stops_total",
        &source,
        &[("reason", "nack_limit")],
    );
    assert_eq!(stops, Some(1.0));

    server.faults().clear();
    let stored = server.message_count("api", &topic);
    assert_eq!(
        connect.post(&format!("/sources/{source}/restart")).await,
        StatusCode::NO_CONTENT
    );
    connect
        .wait_for("/health back to 200", async |connect| {
            connect.get("/health").await.0 == StatusCode::OK
        })
        .await;
    connect
        .wait_for("messages after the restart", async |_| {
            server.message_count("api", &topic) > stored
        })
        .await;
}

/// Each connector's sample `plugin_config` as a TOML body, with `CANARY` in
/// each of its secret fields; `None` for a connector without secrets.
fn secret_sample(info: &ConnectorInfo) -> Option<String> {
    if info.secret_fields.is_empty() {
        return None;
    }
    let (config, missing) = info.sample_with_secret(CANARY);
    assert!(
        missing.is_empty(),
        "{} {}: its sample shows no secret at {missing:?}",
        info.kind,
        info.name
    );
    let mut wrapper = toml::Table::new();
    wrapper.insert(
        "plugin_config".into(),
        toml::Value::try_from(&config).expect("a TOML table"),
    );
    Some(toml::to_string(&wrapper).expect("TOML"))
}

#[tokio::test]
async fn secrets_stay_redacted_and_the_api_key_is_required() {
    let server = IggyTestServer::start();
    let (source, topic) = (unique("src"), unique("t"));
    // A disabled transform is not checked beyond its flag, so it can carry any
    // field: a secret nobody declared.
    let transform = format!("[transforms.add_fields]\nenabled = false\napi_token = \"{CANARY}\"\n");
    let (name, mut text) = random_source(&source, &topic, "", "");
    text.push_str(&transform);
    let mut files = vec![(name, text)];
    let mut secret_keys = vec![("sources", source.clone())];
    let vars = EnvVars::default();
    for info in Registry::all() {
        let Some(plugin) = secret_sample(&info) else {
            continue;
        };
        let (kind, name) = (info.kind.to_string(), info.name);
        let kind = kind.as_str();
        let key = unique(&format!("secret-{name}"));
        let streams = match kind {
            "source" => "[[streams]]\nstream = \"api\"\ntopic = \"t\"\nschema = \"json\"\n",
            _ => "[[streams]]\nstream = \"api\"\ntopics = [\"t\"]\nschema = \"json\"\n",
        };
        let text = format!(
            "type = \"{kind}\"\nkey = \"{key}\"\nenabled = false\nversion = 0\nname = \"{name}\"\npath = \"{name}\"\n{streams}{plugin}"
        );
        if let Err(issues) = parse_connector_file(Path::new("sample.toml"), &text, &vars) {
            panic!("the {kind} {name} secret sample is not a valid config: {issues}");
        }
        files.push((format!("{key}.toml"), text));
        secret_keys.push((if kind == "source" { "sources" } else { "sinks" }, key));
    }
    let mut options = Options::for_server(&server);
    options.http_extra = "api_key = \"opensesame\"";
    let mut connect = start(options, &files);
    connect.wait_for_status("sources", &source, "running").await;

    for (kind, key) in &secret_keys {
        let mut paths = vec![
            format!("/{kind}"),
            format!("/{kind}/{key}"),
            format!("/{kind}/{key}/transforms"),
            format!("/{kind}/{key}/configs"),
            format!("/{kind}/{key}/configs/0"),
            format!("/{kind}/{key}/configs/active"),
        ];
        for format in ["json", "yaml", "toml", "text"] {
            paths.push(format!("/{kind}/{key}/configs/plugin?format={format}"));
        }
        for path in &paths {
            let (status, body) = connect.text(path).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            assert!(!body.contains(CANARY), "{path} leaks a secret: {body}");
        }
    }
    let (_, transforms) = connect.get(&format!("/sources/{source}/transforms")).await;
    assert_eq!(transforms[0]["config"]["api_token"], "[REDACTED]");

    connect.api_key = None;
    for public in ["/", "/health", "/health/live"] {
        assert_eq!(connect.text(public).await.0, StatusCode::OK, "{public}");
    }
    for path in [
        "/stats",
        "/metrics",
        "/sources",
        &format!("/sources/{source}/configs"),
    ] {
        let (status, body) = connect.text(path).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::UNAUTHORIZED, ""),
            "{path}"
        );
        let wrong = connect
            .client
            .get(format!("{}{path}", connect.url))
            .header("api-key", "opensesamE")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    assert_eq!(
        connect.post(&format!("/sources/{source}/stop")).await,
        StatusCode::UNAUTHORIZED
    );
    assert!(connect.connectors.is_dir());
}

#[test]
fn run_exits_non_zero_naming_the_address_when_the_http_port_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        iggy_address: "127.0.0.1:1".into(),
        http_extra: "",
        iggy_extra: "",
        open_files: None,
        env: vec![("IGGY_CONNECTORS_HTTP_ADDRESS".into(), address.clone())],
    };
    let (config, _) = write_config(dir.path(), &options, &[]);
    let output = command(&config, &options).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot listen on [http] address") && stderr.contains(&address),
        "{stderr}"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "faulty-sink"),
    ignore = "needs the faulty sink: --features faulty-sink"
)]
async fn health_names_a_sink_that_stores_no_offsets_while_messages_wait_and_metrics_show_its_lag() {
    let server = IggyTestServer::start();
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let dir = tempfile::tempdir().unwrap();
    let fail = dir.path().join("fail");
    std::fs::write(&fail, "").unwrap();
    let faulty_sink = (
        format!("{sink}.toml"),
        format!(
            "type = \"sink\"\nkey = \"{sink}\"\nenabled = true\nversion = 0\nname = \"Faulty\"\npath = \"faulty\"\n\
             [[streams]]\nstream = \"api\"\ntopics = [\"{topic}\"]\nschema = \"json\"\npoll_interval = \"5ms\"\n\
             [plugin_config]\noutput = \"{}\"\nfail_while_exists = \"{}\"\n",
            dir.path().join("out.jsonl").display(),
            fail.display()
        ),
    );
    let mut options = Options::for_server(&server);
    options.iggy_extra = "sink_stall_timeout = \"1s\"";
    let connect = start(
        options,
        &[
            random_source(&source, &topic, "", "max_count = 50"),
            faulty_sink,
        ],
    );
    connect.wait_for_status("sinks", &sink, "running").await;
    connect
        .wait_for("the sink to be reported degraded", async |connect| {
            connect.get("/health").await.1["status"] == "degraded"
        })
        .await;
    let (status, health) = connect.get("/health").await;
    assert_eq!(status, StatusCode::OK);
    let entry = &health["connectors"][0];
    assert_eq!(entry["key"].as_str(), Some(sink.as_str()), "{health}");
    let reason = entry["degraded"].as_str().unwrap();
    assert!(reason.contains("50 messages wait"), "{reason}");
    let (_, details) = connect.get(&format!("/sinks/{sink}")).await;
    assert_eq!(details["degraded"].as_str(), Some(reason), "{details}");
    let (_, text) = connect.text("/metrics").await;
    let lag = sample(
        &parse_metrics(&text),
        "iggy_connector_lag",
        &sink,
        &[("partition", "0"), ("topic", topic.as_str())],
    );
    assert_eq!(lag, Some(50.0), "{text}");
    let age = sample(
        &parse_metrics(&text),
        "iggy_connector_lag_oldest_age_seconds",
        &sink,
        &[("partition", "0"), ("topic", topic.as_str())],
    );
    assert!(age.is_some_and(|age| age > 0.0), "{text}");
    // The status answer carries the same measurement.
    let status_lag = &details["lag"];
    assert_eq!(status_lag["messages"], 50, "{details}");
    assert!(
        status_lag["oldest_age_ms"].as_u64().unwrap() > 0,
        "{details}"
    );
    assert_eq!(
        status_lag["partitions"],
        json!([{
            "stream": "api", "topic": topic, "partition": 0, "messages": 50,
            "oldest_age_ms": status_lag["partitions"][0]["oldest_age_ms"],
        }]),
        "{details}"
    );
    let (_, list) = connect.get("/sinks").await;
    assert_eq!(list[0]["lag"]["messages"], 50, "{list}");

    std::fs::remove_file(&fail).unwrap();
    connect
        .wait_for(
            "a healthy runtime once the sink catches up",
            async |connect| connect.get("/health").await.1["status"] == "healthy",
        )
        .await;
    connect
        .wait_for("the lag to drop to 0", async |connect| {
            let (_, text) = connect.text("/metrics").await;
            sample(
                &parse_metrics(&text),
                "iggy_connector_lag",
                &sink,
                &[("partition", "0")],
            ) == Some(0.0)
        })
        .await;
    connect
        .wait_for("the oldest message's age to drop to 0", async |connect| {
            let (_, text) = connect.text("/metrics").await;
            sample(
                &parse_metrics(&text),
                "iggy_connector_lag_oldest_age_seconds",
                &sink,
                &[("partition", "0")],
            ) == Some(0.0)
        })
        .await;
    connect
        .wait_for("the status answer's lag to drop to 0", async |connect| {
            let lag = connect.get(&format!("/sinks/{sink}")).await.1["lag"].clone();
            lag["messages"] == 0 && lag["oldest_age_ms"].is_null()
        })
        .await;
}

fn http_source(key: &str, topic: &str) -> (String, String) {
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    (
        format!("{key}.toml"),
        format!(
            "type = \"source\"\nkey = \"{key}\"\nenabled = true\nversion = 0\nname = \"Http\"\npath = \"http\"\n\
             [[streams]]\nstream = \"api\"\ntopic = \"{topic}\"\nschema = \"json\"\n\
             [plugin_config]\naddress = \"{address}\"\nack = \"durable\"\n"
        ),
    )
}

#[tokio::test]
#[cfg_attr(
    not(feature = "http-source"),
    ignore = "needs the http source: --features http-source"
)]
async fn a_destructive_source_creating_a_topic_without_persisted_durability_is_warned_about() {
    let server = IggyTestServer::start();
    let (source, topic) = (unique("src"), unique("t"));
    let connect = start(
        Options::for_server(&server),
        &[http_source(&source, &topic)],
    );
    connect.wait_for_status("sources", &source, "running").await;
    assert_eq!(
        server.topic_option("api", &topic, "durability").as_deref(),
        Some("replicated")
    );
    let warned = |connect: &Connect| {
        connect
            .log_lines()
            .iter()
            .any(|line| line.contains("topic_durability = \"persisted\"") && line.contains(&topic))
    };
    assert!(warned(&connect), "{}", connect.log_lines().join("\n"));
    drop(connect);

    let (source, topic) = (unique("src"), unique("t"));
    let mut options = Options::for_server(&server);
    options.iggy_extra = "topic_durability = \"persisted\"";
    let connect = start(options, &[http_source(&source, &topic)]);
    connect.wait_for_status("sources", &source, "running").await;
    assert_eq!(
        server.topic_option("api", &topic, "durability").as_deref(),
        Some("persisted")
    );
    assert!(!warned(&connect), "{}", connect.log_lines().join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_degraded_while_iggy_is_down_and_healthy_again_after_while_live_stays_ok() {
    let mut server = IggyTestServer::start();
    let (source, topic) = (unique("src"), unique("t"));
    let connect = start(
        Options::for_server(&server),
        &[random_source(&source, &topic, "", "")],
    );
    connect.wait_for_status("sources", &source, "running").await;
    connect
        .wait_for("a healthy runtime", async |connect| {
            connect.get("/health").await.1["status"] == "healthy"
        })
        .await;

    server.begin_outage();
    connect
        .wait_for(
            "/health to say degraded during the outage",
            async |connect| {
                let (status, health) = connect.get("/health").await;
                status == StatusCode::OK
                    && health["status"] == "degraded"
                    && health["broker"]["reachable"] == false
            },
        )
        .await;
    let (status, live) = connect.get("/health/live").await;
    assert_eq!(
        (status, live["status"].as_str()),
        (StatusCode::OK, Some("alive"))
    );

    server.end_outage();
    connect
        .wait_for(
            "/health to say healthy once Iggy answers",
            async |connect| connect.get("/health").await.1["status"] == "healthy",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "http-source"),
    ignore = "needs the http source: --features http-source"
)]
async fn the_api_answers_while_an_http_source_listener_is_flooded() {
    const FLOOD: usize = 120;
    let server = IggyTestServer::start();
    let (source, topic) = (unique("src"), unique("t"));
    let (name, mut text) = http_source(&source, &topic);
    text.push_str("max_connections = 40\nheader_read_timeout = \"60s\"\n");
    let address = text
        .split("address = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let mut options = Options::for_server(&server);
    // A soft limit the flood alone would exhaust; the runtime raises it.
    options.open_files = Some(64);
    let connect = start(options, &[(name, text)]);
    connect.wait_for_status("sources", &source, "running").await;
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let response = client
        .post(format!("http://{address}/messages"))
        .json(&serde_json::json!({"n": 1}))
        .send()
        .await
        .expect("a clear answer, not a hang");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "too_many_connections", "{body}");
    let health = client
        .get(format!("{}/health", connect.url))
        .send()
        .await
        .expect("the API answers during the flood");
    assert_eq!(health.status(), StatusCode::OK);
    drop(flood);
}
