//! `[iggy.tls]` end to end: the real `iggy` 0.11.0 client, configured from the
//! runtime file's `enabled`, `ca_file` and `domain`, against the in-process
//! Iggy protocol test server serving TLS with `tests/fixtures/api_tls_cert.pem`
//! (self-signed, `localhost` and 127.0.0.1, so it is its own CA file).
#![cfg(all(feature = "random-source", feature = "faulty-sink"))]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use iggy_binary_protocol::codes::LOGIN_REGISTER_CODE;
use iggy_connect::config::RuntimeConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::{Runtime, StopReason};
use iggy_connect::iggy::{ConnectionSettings, IggyBus};
use iggy_connect::state::FileStateStore;

use crate::support::accounting::{Seen, seqs_in_file, seqs_in_topic};
use crate::support::binary::Workspace;
use crate::support::iggy_server::{IggyTestServer, ServerConfig};
use crate::support::wait::{Check, try_eventually, wait_for, wait_until};

const LONG: Duration = Duration::from_secs(30);
const STREAM: &str = "tls_stream";
const TOPIC: &str = "tls_topic";
const GROUP: &str = "tls_sink";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn tls_server() -> IggyTestServer {
    IggyTestServer::start_with(
        ServerConfig::default().tls(fixture("api_tls_cert.pem"), fixture("api_tls_key.pem")),
    )
}

/// The `[iggy.tls]` table of a runtime file.
fn iggy_tls(ca_file: &Path, domain: &str) -> String {
    format!(
        "[iggy.tls]\nenabled = true\nca_file = \"{}\"\ndomain = \"{domain}\"\n",
        ca_file.display()
    )
}

/// The runtime file's `[iggy]` with `tls`, resolved as `run` resolves it.
fn settings_from_runtime_file(dir: &Path, address: &str, tls: &str) -> ConnectionSettings {
    let path = dir.join("config.toml");
    std::fs::create_dir_all(dir.join("connectors")).unwrap();
    let text = format!(
        "[iggy]\naddress = \"{address}\"\nusername = \"iggy\"\npassword = \"iggy\"\n{tls}\
         [connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n",
        dir.join("connectors").display()
    );
    std::fs::write(&path, text).unwrap();
    let (config, _) = RuntimeConfig::load(&path, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad runtime file: {issues}"));
    ConnectionSettings::from_config(&config.iggy).unwrap()
}

fn runtime(settings: ConnectionSettings, dir: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(settings)),
        Arc::new(FileStateStore::new(dir.join("state")).unwrap()),
        Duration::from_secs(5),
    )
}

/// Upstream-format connector files: the random source and the file-writing
/// `faulty` sink, joined by one topic.
fn random_source(max_count: u64) -> String {
    format!(
        r#"
        type = "source"
        key = "rnd"
        enabled = true
        path = "random"
        [[streams]]
        stream = "{STREAM}"
        topic = "{TOPIC}"
        schema = "json"
        [plugin_config]
        interval = "1ms"
        max_count = {max_count}
        messages_range = [20, 50]
        payload_size = 50
        "#
    )
}

fn file_sink(output: &Path) -> String {
    format!(
        r#"
        type = "sink"
        key = "out"
        enabled = true
        path = "faulty"
        [[streams]]
        stream = "{STREAM}"
        topics = ["{TOPIC}"]
        schema = "json"
        batch_length = 100
        poll_interval = "1ms"
        consumer_group = "{GROUP}"
        [plugin_config]
        output = "{}"
        "#,
        output.display()
    )
}

fn add(runtime: &Runtime, text: &str) {
    let config = parse_connector_file(Path::new("test.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad test config: {issues}"))
        .0;
    runtime.add(config).unwrap();
}

/// Waits for the random source to stop, failing the test after [`LONG`].
async fn source_finished(runtime: &Runtime) {
    tokio::time::timeout(
        LONG,
        runtime.wait_until_stopped(ConnectorKind::Source, "rnd"),
    )
    .await
    .expect("the source finishes in time")
    .unwrap();
}

fn exactly_once(seen: &Seen, count: u64) -> bool {
    seen.len() as u64 == count
        && seen.keys().copied().eq(0..count)
        && seen.values().all(|times| *times == 1)
}

/// Moves `count` records through `server` and checks each arrived once, in
/// the topic and at the sink, with the group offset covering them.
async fn moves_exactly_once(server: &IggyTestServer, settings: ConnectionSettings, count: u64) {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.jsonl");
    let runtime = runtime(settings, dir.path());
    add(&runtime, &random_source(count));
    add(&runtime, &file_sink(&output));
    runtime.start_enabled().await;
    source_finished(&runtime).await;
    let status = runtime.view(ConnectorKind::Source, "rnd").unwrap().status;
    assert_eq!(
        status.stop_reason,
        Some(StopReason::Completed),
        "{status:?}"
    );
    assert!(exactly_once(&seqs_in_topic(server, STREAM, TOPIC), count));
    wait_for("the sink to write everything", LONG, || {
        exactly_once(&seqs_in_file(&output), count)
    })
    .await;
    wait_for("the group offset to cover the topic", LONG, || {
        server.stored_offset(STREAM, TOPIC, GROUP, 0) == Some(count - 1)
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_move_exactly_once_through_a_tls_server_with_the_runtime_files_iggy_tls() {
    let server = tls_server();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_from_runtime_file(
        dir.path(),
        &server.address().to_string(),
        &iggy_tls(&fixture("api_tls_cert.pem"), "localhost"),
    );
    moves_exactly_once(&server, settings, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_tls_domain_verifies_the_certificate_against_the_host_of_the_address() {
    let server = tls_server();
    let dir = tempfile::tempdir().unwrap();
    // The certificate names `localhost` and 127.0.0.1: reaching the server by
    // name and by IP both verify without a domain.
    for address in [
        format!("localhost:{}", server.address().port()),
        server.address().to_string(),
    ] {
        let settings = settings_from_runtime_file(
            dir.path(),
            &address,
            &iggy_tls(&fixture("api_tls_cert.pem"), ""),
        );
        let client = settings.connect().await.unwrap();
        drop(client);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_tls_connections_and_a_server_restart_are_survived_and_nothing_is_lost() {
    let mut server = tls_server();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.jsonl");
    // The restart leaves the sink's old member behind holding the partition;
    // the sink rebuilds its group once it counts as stalled.
    let settings = settings_from_runtime_file(
        dir.path(),
        &server.address().to_string(),
        &format!(
            "sink_stall_timeout = \"1s\"\n{}",
            iggy_tls(&fixture("api_tls_cert.pem"), "localhost")
        ),
    );
    let runtime = runtime(settings, dir.path());
    add(&runtime, &random_source(1500));
    add(&runtime, &file_sink(&output));
    runtime.start_enabled().await;
    for threshold in [300, 700] {
        wait_for("progress", LONG, || {
            server.message_count(STREAM, TOPIC) >= threshold
        })
        .await;
        // The producer and the consumer log in again once they notice. (The
        // open connection count right after the drop is racy: a client may
        // already be back. So is the source: on a loaded machine it may have
        // sent its last record before the drop, and its producer is gone.)
        let logins = server.request_count(LOGIN_REGISTER_CODE);
        server.faults().drop_connections();
        wait_for("the connections still in use to log in again", LONG, || {
            let again = server.request_count(LOGIN_REGISTER_CODE) - logins;
            let source_done = runtime
                .view(ConnectorKind::Source, "rnd")
                .is_ok_and(|view| view.status.stop_reason == Some(StopReason::Completed));
            again >= 2 || (again >= 1 && source_done)
        })
        .await;
    }
    wait_for("progress after the drops", LONG, || {
        server.message_count(STREAM, TOPIC) >= 1000
    })
    .await;
    server.restart();
    source_finished(&runtime).await;
    let in_topic = seqs_in_topic(&server, STREAM, TOPIC);
    assert_eq!(
        in_topic.keys().copied().collect::<Vec<_>>(),
        (0..1500).collect::<Vec<_>>(),
        "a record is missing from the topic"
    );
    wait_for("the sink to get every record", LONG, || {
        seqs_in_file(&output).len() == 1500
    })
    .await;
    runtime.shutdown().await;
}

/// A CA that did not issue the server's certificate.
fn unrelated_ca(dir: &Path) -> PathBuf {
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let path = dir.join("other_ca.pem");
    std::fs::write(&path, ca.cert.pem()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_that_did_not_issue_the_servers_certificate_shows_as_the_last_error_and_nothing_is_sent()
 {
    let server = tls_server();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_from_runtime_file(
        dir.path(),
        &server.address().to_string(),
        &iggy_tls(&unrelated_ca(dir.path()), "localhost"),
    );
    let runtime = runtime(settings, dir.path());
    add(&runtime, &random_source(10));
    runtime.start_enabled().await;
    let last_error = || {
        runtime
            .view(ConnectorKind::Source, "rnd")
            .unwrap()
            .status
            .last_error
    };
    wait_for("the connect error", LONG, || last_error().is_some()).await;
    let message = last_error().unwrap().message;
    let ca_file = dir.path().join("other_ca.pem");
    assert!(
        message.contains("TLS handshake failed: invalid peer certificate: UnknownIssuer")
            && message.contains(&format!("iggy.tls.ca_file {}", ca_file.display())),
        "{message}"
    );
    runtime.shutdown().await;
    assert_eq!(server.message_count(STREAM, TOPIC), 0);
}

#[test]
fn run_moves_records_through_a_tls_server_with_iggy_tls_in_its_config() {
    let server = tls_server();
    let workspace = Workspace::new(
        &server.address().to_string(),
        &iggy_tls(&fixture("api_tls_cert.pem"), "localhost"),
    );
    let output = workspace.path("out.jsonl");
    workspace.add_connector("random.toml", &random_source(300));
    workspace.add_connector("sink.toml", &file_sink(&output));
    let running = workspace.run();

    wait_until("300 records in the topic", LONG, || {
        server.message_count(STREAM, TOPIC) == 300
    });
    wait_until("the sink to write and commit them", LONG, || {
        seqs_in_file(&output).len() == 300
            && server.stored_offset(STREAM, TOPIC, GROUP, 0) == Some(299)
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    assert!(exactly_once(&seqs_in_topic(&server, STREAM, TOPIC), 300));
    assert!(exactly_once(&seqs_in_file(&output), 300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_tls_against_a_plain_server_reports_it_as_last_error_keeps_serving_and_stops_on_sigterm()
 {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(
        &server.address().to_string(),
        &iggy_tls(&fixture("api_tls_cert.pem"), "localhost"),
    );
    workspace.add_connector("random.toml", &random_source(10));
    let running = workspace.run();
    wait_for("the API to listen", LONG, || {
        !workspace.api_urls().is_empty()
    })
    .await;
    let url = format!("{}/sources/rnd", workspace.api_urls()[0]);
    let client = reqwest::Client::new();
    let message = try_eventually("a last_error", LONG, || async {
        let details: serde_json::Value =
            client.get(&url).send().await.unwrap().json().await.unwrap();
        match details["last_error"]["message"].as_str() {
            Some(message) => Check::Ready(message.to_owned()),
            None => Check::Pending(details.to_string()),
        }
    })
    .await
    .unwrap_or_else(|message| panic!("{message}"));
    assert!(
        message.contains("closed the connection during the TLS handshake"),
        "{message}"
    );
    assert_eq!(server.message_count(STREAM, TOPIC), 0);

    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
}

#[test]
fn run_refuses_iggy_tls_enabled_without_a_ca_file_naming_the_field() {
    let workspace = Workspace::new("127.0.0.1:1", "[iggy.tls]\nenabled = true\n");
    workspace.add_connector("random.toml", &random_source(10));
    let status = workspace.run().wait_exit(LONG);
    assert_eq!(status.code(), Some(2), "{}", workspace.stderr());
    let stderr = workspace.stderr();
    assert!(
        stderr.contains("iggy.tls.ca_file is required when iggy.tls.enabled is true"),
        "{stderr}"
    );
}
