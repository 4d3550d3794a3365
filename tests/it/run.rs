//! `iggy-connect run` as users run it: the real binary, upstream's config format,
//! the Iggy bus by default, against the in-process Iggy protocol test server.
// The tests here run the random source and the stdout sink (the default
// features): a build without them leaves them out rather than failing them.
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::time::Duration;

use crate::support;
use crate::support::binary::Workspace;
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::wait_until;

const LONG: Duration = Duration::from_secs(30);

const RANDOM_SOURCE: &str = r#"
type = "source"
key = "random"
enabled = true
version = 0
name = "Random source"
path = "target/release/libiggy_connector_random_source"

[[streams]]
stream = "example_stream"
topic = "example_topic"
schema = "json"
batch_length = 1000
linger_time = "5ms"

[plugin_config]
interval = "5ms"
max_count = 300
messages_range = [10, 50]
payload_size = 40
"#;

const STDOUT_SINK: &str = r#"
type = "sink"
key = "stdout"
enabled = true
version = 0
name = "Stdout sink"
path = "target/release/libiggy_connector_stdout_sink"

[[streams]]
stream = "example_stream"
topics = ["example_topic"]
schema = "json"
batch_length = 1000
poll_interval = "5ms"
consumer_group = "stdout_sink_connector"

[plugin_config]
print_payload = true
"#;

#[test]
fn run_moves_records_from_an_upstream_source_file_through_iggy_to_an_upstream_sink_file_and_stops_on_sigterm()
 {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector("random_source.toml", RANDOM_SOURCE);
    workspace.add_connector("stdout_sink.toml", STDOUT_SINK);
    let running = workspace.run();

    wait_until("300 records in the topic", LONG, || {
        server.message_count("example_stream", "example_topic") == 300
    });
    wait_until("300 lines on stdout", LONG, || {
        workspace.stdout().matches('\n').count() == 300
    });
    wait_until("the group offset to cover them", LONG, || {
        server.stored_offset(
            "example_stream",
            "example_topic",
            "stdout_sink_connector",
            0,
        ) == Some(299)
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let mut seqs: Vec<u64> = workspace
        .stdout()
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..300).collect::<Vec<_>>());
    assert!(workspace.path("state/source_random.state").exists());
}

#[test]
fn a_second_sigterm_stops_a_run_at_once_instead_of_waiting_for_its_grace_period() {
    let server = IggyTestServer::start();
    // Every send refused: the source's batch stays in flight, so the graceful
    // shutdown would wait out its minute.
    server.faults().refuse_sends_until_cleared();
    let workspace = Workspace::new(
        &server.address().to_string(),
        "[engine]\nshutdown_timeout = \"60s\"\n",
    );
    workspace.add_connector("random_source.toml", RANDOM_SOURCE);
    let running = workspace.run();
    wait_until("a send refused", LONG, || {
        workspace.stderr().contains("retrying")
    });
    running.terminate();
    wait_until("the graceful shutdown", LONG, || {
        workspace.stderr().contains("shutting down")
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    let log = workspace.stderr();
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(
        log.contains("second stop signal: stopping at once"),
        "{log}"
    );
    assert_eq!(server.message_count("example_stream", "example_topic"), 0);
}

#[test]
fn run_refuses_a_config_with_errors_naming_file_and_field() {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector(
        "broken.toml",
        &RANDOM_SOURCE.replace("linger_time = \"5ms\"", "linger_time = \"soon\""),
    );
    let status = workspace.run().wait_exit(LONG);
    assert_eq!(status.code(), Some(2));
    let stderr = workspace.stderr();
    assert!(
        stderr.contains("broken.toml") && stderr.contains("streams[0].linger_time"),
        "{stderr}"
    );
    assert_eq!(
        server.connection_count(),
        0,
        "nothing may start on a bad config"
    );
}

/// `iggy-connect ARGS --config <workspace>/config.toml`, finished.
fn admin(workspace: &Workspace, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(args)
        .arg("--config")
        .arg(workspace.path("config.toml"))
        .output()
        .expect("iggy-connect runs")
}

fn text(output: &std::process::Output) -> (Option<i32>, String, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn state_and_offsets_commands_refuse_a_running_runtime_and_change_a_stopped_ones() {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector("random_source.toml", RANDOM_SOURCE);
    workspace.add_connector("stdout_sink.toml", STDOUT_SINK);
    let running = workspace.run();
    let stored = || {
        server.stored_offset(
            "example_stream",
            "example_topic",
            "stdout_sink_connector",
            0,
        )
    };
    wait_until("the group offset to cover 300", LONG, || {
        stored() == Some(299)
    });
    let second = workspace.run();
    let status = second.wait_exit(LONG);
    assert_eq!(status.code(), Some(1), "a second runtime on one state dir");
    assert!(
        workspace
            .stderr()
            .contains("another iggy-connect runtime runs on state directory"),
        "{}",
        workspace.stderr()
    );
    for args in [
        &["state", "clear", "random"][..],
        &["offsets", "stdout", "--to", "earliest"],
    ] {
        let (code, _, stderr) = text(&admin(&workspace, args));
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("stop it first"), "{args:?}: {stderr}");
    }
    running.terminate();
    assert!(running.wait_exit(LONG).success());

    let (code, shown, stderr) = text(&admin(&workspace, &["state", "show", "random"]));
    assert_eq!(code, Some(0), "{stderr}");
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["state"]["messages_produced"], 300, "{shown}");
    assert_eq!(shown["connector"], "random");

    // `show`'s answer, edited, goes back as it is.
    let mut edited = shown.clone();
    edited["state"]["messages_produced"] = serde_json::json!(250);
    let file = workspace.path("state.json");
    std::fs::write(&file, edited.to_string()).unwrap();
    let (code, _, stderr) = text(&admin(
        &workspace,
        &["state", "set", "random", file.to_str().unwrap()],
    ));
    assert_eq!(code, Some(0), "{stderr}");
    let (_, shown, _) = text(&admin(&workspace, &["state", "show", "random"]));
    assert!(shown.contains("\"messages_produced\": 250"), "{shown}");
    let (code, _, stderr) = text(&admin(&workspace, &["state", "show", "nope"]));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no source \"nope\""), "{stderr}");

    let (code, moved, stderr) = text(&admin(&workspace, &["offsets", "stdout", "--to", "0=100"]));
    assert_eq!(code, Some(0), "{stderr}");
    let moved: serde_json::Value = serde_json::from_str(&moved).unwrap();
    assert_eq!(moved[0]["partitions"][0]["before"], 300, "{moved}");
    assert_eq!(moved[0]["partitions"][0]["after"], 100, "{moved}");
    assert_eq!(stored(), Some(99));
    let (code, _, stderr) = text(&admin(&workspace, &["offsets", "stdout", "--to", "soon"]));
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("--to: \"soon\" is not earliest"),
        "{stderr}"
    );

    // The runtime resumes from both: 50 more records (250 -> 300), and the
    // sink prints the 200 after offset 100 again plus the 50 new ones.
    let before = workspace.stdout().matches('\n').count();
    let running = workspace.run();
    wait_until("the 50 new records in the topic", LONG, || {
        server.message_count("example_stream", "example_topic") == 350
    });
    wait_until("250 more lines on stdout", LONG, || {
        workspace.stdout().matches('\n').count() == before + 250
    });
    wait_until("the group offset to cover 350", LONG, || {
        stored() == Some(349)
    });
    running.terminate();
    assert!(running.wait_exit(LONG).success());

    let (code, _, stderr) = text(&admin(&workspace, &["state", "clear", "random"]));
    assert_eq!(code, Some(0), "{stderr}");
    let (_, shown, _) = text(&admin(&workspace, &["state", "show", "random"]));
    assert!(shown.contains("\"state\": null"), "{shown}");
}

fn counting_source(key: &str, topic: &str, interval: &str) -> String {
    format!(
        r#"
type = "source"
key = "{key}"
enabled = true
version = 0
name = "Random {key}"
path = "random"

[[streams]]
stream = "hot"
topic = "{topic}"
schema = "json"

[plugin_config]
interval = "{interval}"
messages_range = [1, 1]
"#
    )
}

/// `/health` and a source's `/sources/{key}` of the workspace's binary.
async fn api_json(workspace: &Workspace, path: &str) -> serde_json::Value {
    let url = workspace.api_urls().pop().expect("the API listened");
    let text = reqwest::get(format!("{url}{path}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_watch_restarts_a_changed_connector_starts_a_new_one_stops_a_removed_one_and_keeps_one_whose_file_breaks()
 {
    use support::wait::wait_for;
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    workspace.add_connector("a.toml", &counting_source("a", "t1", "10ms"));
    let running = workspace.run_with(&["--watch"]);
    let count = |topic: &str| server.message_count("hot", topic);
    wait_for("a writing to t1", LONG, || count("t1") > 0).await;
    wait_for("the API", LONG, || !workspace.api_urls().is_empty()).await;

    // Changed: a restarts alone, now writing to t2.
    workspace.add_connector("a.toml", &counting_source("a", "t2", "10ms"));
    wait_for("a writing to t2", LONG, || count("t2") > 0).await;
    let t1 = count("t1");
    // New: b starts.
    workspace.add_connector("b.toml", &counting_source("b", "t3", "10ms"));
    wait_for("b writing to t3", LONG, || count("t3") > 0).await;

    // Broken: a keeps running its version and shows why; /health degraded.
    workspace.add_connector(
        "a.toml",
        &counting_source("a", "t2", "10ms").replace("interval = \"10ms\"", "interval = \"soon\""),
    );
    let mut health = serde_json::Value::Null;
    for _ in 0..300 {
        health = api_json(&workspace, "/health").await;
        if health["status"] == "degraded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(health["status"], "degraded", "{health}");
    let reason = health["connectors"][0]["degraded"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("config reload refused")
            && reason.contains("a.toml")
            && reason.contains("plugin_config.interval"),
        "{health}"
    );
    let t2 = count("t2");
    wait_for("a still writing to t2", LONG, || count("t2") > t2 + 5).await;
    assert_eq!(
        count("t1"),
        t1,
        "the broken file did not bring the old version back"
    );

    // Fixed: accepted again, no longer degraded; removed: b stops.
    workspace.add_connector("a.toml", &counting_source("a", "t2", "10ms"));
    std::fs::remove_file(workspace.path("connectors").join("b.toml")).unwrap();
    let mut b = serde_json::Value::Null;
    for _ in 0..300 {
        health = api_json(&workspace, "/health").await;
        b = api_json(&workspace, "/sources/b").await;
        if health["status"] == "healthy" && b["status"] == "stopped" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        (health["status"].as_str(), b["status"].as_str()),
        (Some("healthy"), Some("stopped")),
        "{health} {b}"
    );
    let t3 = count("t3");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count("t3"), t3, "b stopped writing");
    running.terminate();
    assert!(running.wait_exit(LONG).success(), "{}", workspace.stderr());
    assert!(workspace.stderr().contains("the running version stays"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_watch_a_changed_file_waits_for_sighup() {
    use support::wait::wait_for;
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector("a.toml", &counting_source("a", "t1", "10ms"));
    let running = workspace.run();
    let count = |topic: &str| server.message_count("hot", topic);
    wait_for("a writing to t1", LONG, || count("t1") > 0).await;
    workspace.add_connector("a.toml", &counting_source("a", "t2", "10ms"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(count("t2"), 0, "no reload without --watch or SIGHUP");
    running.hangup();
    wait_for("a writing to t2 after SIGHUP", LONG, || count("t2") > 0).await;
    running.terminate();
    assert!(running.wait_exit(LONG).success());
}

/// A config provider serving upstream's `GET /configs/active` shape inside
/// an envelope: `{"data": {"sources": ..., "sinks": ...}, "error": ...}`;
/// the first request of each run answers 503, requests without the
/// `x-token` header 401.
struct Provider {
    url: String,
    answer: std::sync::Arc<std::sync::Mutex<serde_json::Value>>,
    requests: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Provider {
    async fn start(answer: serde_json::Value) -> Self {
        use axum::http::{HeaderMap, StatusCode};
        use std::sync::atomic::Ordering;
        let answer = std::sync::Arc::new(std::sync::Mutex::new(answer));
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (shared, counted) = (answer.clone(), requests.clone());
        let app = axum::Router::new().route(
            "/api/configs/active",
            axum::routing::get(move |headers: HeaderMap| {
                let (shared, counted) = (shared.clone(), counted.clone());
                async move {
                    if headers.get("x-token").map(|value| value.as_bytes()) != Some(b"secret") {
                        return (StatusCode::UNAUTHORIZED, String::new());
                    }
                    if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                        return (StatusCode::SERVICE_UNAVAILABLE, "warming up".into());
                    }
                    (StatusCode::OK, shared.lock().unwrap().to_string())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            url,
            answer,
            requests,
        }
    }

    /// Points the workspace's runtime config at this provider.
    fn configure(&self, workspace: &Workspace) {
        let path = workspace.path("config.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let start = text.find("[connectors]").unwrap();
        let rest = &text[start + 1..];
        let end = rest.find("\n[").map_or(text.len(), |at| start + 1 + at + 1);
        let connectors = format!(
            "[connectors]\nconfig_type = \"http\"\nbase_url = \"{}\"\n\
             [connectors.request_headers]\nx-token = \"secret\"\n\
             [connectors.response]\ndata_path = \"data\"\nerror_path = \"error\"\n\
             [connectors.retry]\ninitial_backoff = \"50ms\"\n",
            self.url
        );
        std::fs::write(
            &path,
            format!("{}{connectors}{}", &text[..start], &text[end..]),
        )
        .unwrap();
    }
}

/// Upstream's JSON of a random source config.
fn source_json(key: &str, topic: &str) -> serde_json::Value {
    serde_json::json!({
        "key": key, "enabled": true, "version": 1, "name": "Random", "path": "random",
        "plugin_config_format": null,
        "streams": [{"stream": "hot", "topic": topic, "schema": "json"}],
        "plugin_config": {"interval": "10ms", "messages_range": [1, 1]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_config_provider_supplies_the_connectors_at_start_and_on_sighup() {
    use support::wait::wait_for;
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    let provider = Provider::start(serde_json::json!({
        "data": {"sources": {"a": source_json("a", "t1")}, "sinks": {}},
        "error": null
    }))
    .await;
    provider.configure(&workspace);
    let running = workspace.run();
    let count = |topic: &str| server.message_count("hot", topic);
    wait_for("a from the provider writing to t1", LONG, || {
        count("t1") > 0
    })
    .await;
    assert!(
        provider.requests.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "the 503 was retried"
    );

    *provider.answer.lock().unwrap() = serde_json::json!({
        "data": {"sources": {"a": source_json("a", "t2"), "b": source_json("b", "t3")}},
        "error": null
    });
    running.hangup();
    wait_for("a moved to t2 and b started", LONG, || {
        count("t2") > 0 && count("t3") > 0
    })
    .await;

    // An answer the provider marks as an error keeps what runs.
    *provider.answer.lock().unwrap() = serde_json::json!({"data": null, "error": "maintenance"});
    running.hangup();
    wait_for("the refusal logged", LONG, || {
        workspace.stderr().contains("answered an error at `error`")
    })
    .await;
    let t2 = count("t2");
    wait_for("a still running", LONG, || count("t2") > t2).await;
    running.terminate();
    assert!(running.wait_exit(LONG).success(), "{}", workspace.stderr());

    // At start, an error answer is fatal, naming the provider.
    let (code, _, stderr) = text(
        &std::process::Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
            .args(["run", "--config"])
            .arg(workspace.path("config.toml"))
            .output()
            .unwrap(),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "config provider {}/configs/active answered an error",
            provider.url
        )) && stderr.contains("maintenance"),
        "{stderr}"
    );
}
