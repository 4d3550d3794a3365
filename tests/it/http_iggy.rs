//! Webhooks in, webhooks out, through Iggy: HTTP clients post to the http
//! source, the real `iggy` client produces to the in-process Iggy protocol test
//! server, and the http sink delivers to a local HTTP server.
#![cfg(all(feature = "http-source", feature = "http-sink"))]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::{ConnectionSettings, IggyBus};
use iggy_connect::state::FileStateStore;
use serde_json::{Value, json};

use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::{Check, try_eventually, wait_for};

const LONG: Duration = Duration::from_secs(30);

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("test.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad test config: {issues}"))
        .0
}

async fn receiver() -> (Arc<Mutex<Vec<Bytes>>>, String) {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let recorded = bodies.clone();
    let app = axum::Router::new().fallback(move |body: Bytes| {
        let recorded = recorded.clone();
        async move {
            recorded.lock().unwrap().push(body);
            "ok"
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (bodies, format!("http://{address}/out"))
}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_from_the_source_means_iggy_has_the_message_and_the_sink_delivers_it() {
    let server = IggyTestServer::start();
    let state = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(
        Arc::new(IggyBus::new(ConnectionSettings::password(
            server.address().to_string(),
            "iggy",
            "iggy",
        ))),
        Arc::new(FileStateStore::new(state.path()).unwrap()),
        Duration::from_secs(5),
    );
    let source_address = free_address();
    let (delivered, sink_url) = receiver().await;
    runtime
        .add(connector(&format!(
            r#"
            type = "source"
            key = "hooks-in"
            path = "http"
            [[streams]]
            stream = "hooks"
            topic = "events"
            schema = "json"
            [plugin_config]
            address = "{source_address}"
            request_timeout = "1s"
            "#
        )))
        .unwrap();
    runtime
        .add(connector(&format!(
            r#"
            type = "sink"
            key = "hooks-out"
            path = "http"
            [[streams]]
            stream = "hooks"
            topics = ["events"]
            schema = "json"
            poll_interval = "5ms"
            [plugin_config]
            url = "{sink_url}"
            batch_mode = "ndjson"
            include_metadata = false
            "#
        )))
        .unwrap();
    runtime.start_enabled().await;
    let client = reqwest::Client::new();
    let url = format!("http://{source_address}/messages");
    // Refused until the source's `open` has bound the port.
    let first = try_eventually("the source to listen", LONG, || async {
        match client.post(&url).json(&json!({"n": 0})).send().await {
            Ok(response) => Check::Ready(response),
            Err(error) => Check::Pending(error.to_string()),
        }
    })
    .await
    .unwrap_or_else(|message| panic!("{message}"));
    assert_eq!(first.status(), 200);
    assert_eq!(
        server.message_count("hooks", "events"),
        1,
        "acknowledged by Iggy before the 200"
    );

    server.faults().refuse_sends_until_cleared();
    let refused = client
        .post(&url)
        .json(&json!({"n": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused.json::<Value>().await.unwrap()["maybe_delivered"],
        true
    );
    server.faults().clear();

    let second = client
        .post(&url)
        .json(&json!({"n": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    wait_for("the sink to deliver every message", LONG, || {
        let lines: Vec<Value> = delivered
            .lock()
            .unwrap()
            .iter()
            .flat_map(|body| {
                body.split(|byte| *byte == b'\n')
                    .filter(|line| !line.is_empty())
                    .map(|line| serde_json::from_slice(line).unwrap())
                    .collect::<Vec<Value>>()
            })
            .collect();
        lines == vec![json!({"n": 0}), json!({"n": 1}), json!({"n": 2})]
    })
    .await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        server.stored_offset("hooks", "events", "iggy-connect-sink-hooks-out", 0) == Some(2)
    })
    .await;
    runtime.shutdown().await;
}
