//! The quickwit sink against the Quickwit 0.8 protocol test server of
//! `support::quickwit`, through the `Sink` interface.
#![cfg(feature = "quickwit-sink")]

use std::collections::HashSet;
use std::time::Duration;

use iggy_connect::connectors::{ConnectorError, Partial, Registry, Sink, SinkError};
use iggy_connect::message::{Payload, SinkMessage};
use serde_json::{Value, json};

use crate::support::quickwit::QuickwitServer;
use crate::support::sinks::{self, topic};

const DYNAMIC: &str = "version: 0.8\nindex_id: events\ndoc_mapping:\n  mode: dynamic\nindexing_settings:\n  commit_timeout_secs: 5\n";

const STRICT: &str = r#"
version: 0.8
index_id: events
doc_mapping:
  mode: strict
  field_mappings:
    - name: n
      type: u64
    - name: name
      type: text
      tokenizer: raw
"#;

fn config(server: &QuickwitServer, index: &str, extra: Value) -> Value {
    let mut config = json!({
        "url": server.url(),
        "index": index,
        "retry_delay": "10ms",
        "max_retry_delay": "50ms",
    });
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    config
}

async fn open(config: &Value) -> Box<dyn Sink> {
    sinks::open("quickwit", config).await
}

fn build(config: &Value) -> Box<dyn Sink> {
    sinks::build("quickwit", config)
}

fn messages(payloads: Vec<Value>) -> Vec<SinkMessage> {
    payloads
        .into_iter()
        .enumerate()
        .map(|(n, payload)| SinkMessage {
            id: 1000 + n as u128,
            offset: n as u64,
            partition_id: 1,
            timestamp: 1_709_214_300_000_000 + n as u64,
            origin_timestamp: 0,
            checksum: 0,
            headers: Vec::new(),
            payload: Payload::Json(payload),
        })
        .collect()
}

fn numbered(count: usize) -> Vec<Value> {
    (0..count).map(|n| json!({"n": n, "name": "x"})).collect()
}

/// (durable, rejected) indexes of a per-message answer, sorted, and what
/// became of the rest.
fn partial(result: Result<(), SinkError>) -> (Vec<usize>, Vec<usize>, SinkError) {
    let Err(SinkError::Partial(partial)) = result else {
        panic!("expected a per-message answer, got {result:?}");
    };
    let Partial {
        mut durable,
        rejected,
        rest,
    } = *partial;
    durable.sort();
    let mut rejected: Vec<usize> = rejected.iter().map(|r| r.index).collect();
    rejected.sort();
    (durable, rejected, rest)
}

#[tokio::test]
async fn the_index_is_created_from_the_yaml_and_auto_acknowledges_before_searchable() {
    let server = QuickwitServer::start().await;
    let sink = open(&config(&server, DYNAMIC, json!({}))).await;
    assert_eq!(server.index_ids(), vec!["events"]);
    assert_eq!(
        server.index_config("events").unwrap()["indexing_settings"]["commit_timeout_secs"],
        5,
        "the YAML is sent as it is"
    );
    let create = server
        .seen()
        .into_iter()
        .find(|seen| seen.path == "/api/v1/indexes")
        .unwrap();
    assert_eq!(create.headers["content-type"], "application/yaml");
    sink.write(&topic(), &messages(numbered(3))).await.unwrap();
    assert_eq!(
        server.documents("events").len(),
        3,
        "acknowledged: queued durably"
    );
    assert!(
        server.committed("events").is_empty(),
        "not searchable before a commit"
    );
    assert_eq!(
        server.ingest_requests(),
        vec![("commit=auto".to_owned(), 3)]
    );
    let ingest = server
        .seen()
        .into_iter()
        .find(|seen| seen.path.ends_with("/ingest"))
        .unwrap();
    assert_eq!(ingest.headers["content-type"], "application/x-ndjson");
    server.commit("events");
    assert_eq!(server.committed("events")[1], json!({"n": 1, "name": "x"}));
}

#[tokio::test]
async fn wait_for_and_force_answer_once_the_documents_are_searchable() {
    for mode in ["wait_for", "force"] {
        let server = QuickwitServer::start().await;
        let sink = open(&config(&server, DYNAMIC, json!({"commit": mode}))).await;
        sink.write(&topic(), &messages(numbered(2))).await.unwrap();
        assert_eq!(server.committed("events").len(), 2, "{mode}");
        assert_eq!(server.ingest_requests()[0].0, format!("commit={mode}"));
    }
}

#[tokio::test]
async fn a_replay_after_a_restart_stores_every_document_twice_and_id_field_finds_them() {
    let server = QuickwitServer::start().await;
    let config = config(&server, DYNAMIC, json!({"id_field": "_iggy_id"}));
    let batch = messages(numbered(10));
    open(&config).await.write(&topic(), &batch).await.unwrap();
    // A crash before the offsets were committed: a new sink gets the batch again.
    open(&config).await.write(&topic(), &batch).await.unwrap();
    let documents = server.documents("events");
    assert_eq!(
        documents.len(),
        20,
        "Quickwit has no ids: a replay duplicates"
    );
    let ids: HashSet<&str> = documents
        .iter()
        .map(|doc| doc["_iggy_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 10);
    assert!(ids.contains(format!("{:032x}", 1000).as_str()));
}

#[tokio::test]
async fn a_request_answered_503_ends_the_write_and_only_the_unacknowledged_rest_is_written_again() {
    let server = QuickwitServer::start().await;
    let sink = open(&config(&server, DYNAMIC, json!({"batch_size": 2}))).await;
    // The first request is acknowledged, the second answered 503.
    server.pass_next_ingest();
    server.fail_next_ingest(503, None);
    let batch = messages(numbered(6));
    let (durable, rejected, rest) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 1]);
    assert!(rejected.is_empty());
    assert!(matches!(rest, SinkError::Transient { .. }), "{rest:?}");
    assert_eq!(
        server.ingest_requests().len(),
        2,
        "nothing more is sent to a server answering 503"
    );
    assert_eq!(server.documents("events").len(), 2);
    // What the engine does next: write the rest again, only the rest.
    sink.write(&topic(), &batch[2..]).await.unwrap();
    let lines: Vec<usize> = server
        .ingest_requests()
        .iter()
        .map(|(_, lines)| *lines)
        .collect();
    assert_eq!(lines, vec![2, 2, 2, 2]);
    assert_eq!(
        server.documents("events").len(),
        6,
        "nothing acknowledged is sent twice"
    );
}

#[tokio::test]
async fn a_429_is_transient_with_its_retry_after_and_nothing_waits_inside_the_sink() {
    let server = QuickwitServer::start().await;
    server.fail_next_ingest(429, Some(7));
    let sink = open(&config(&server, DYNAMIC, json!({}))).await;
    let error = sink
        .write(&topic(), &messages(numbered(2)))
        .await
        .unwrap_err();
    assert!(
        matches!(error, SinkError::Transient { retry_after: Some(wait), .. } if wait == Duration::from_secs(7)),
        "{error:?}"
    );
    assert_eq!(server.ingest_requests().len(), 1);
    assert!(server.documents("events").is_empty());
}

#[tokio::test]
async fn documents_quickwit_would_drop_silently_are_rejected_by_index_instead() {
    let server = QuickwitServer::start().await;
    let sink = open(&config(&server, STRICT, json!({}))).await;
    let mut batch = messages(vec![
        json!({"n": 0, "name": "ok"}),
        json!({"n": 1, "extra": true}),
        json!({"n": "two"}),
        json!([3]),
        json!({"n": 4}),
    ]);
    batch.push(SinkMessage {
        offset: 5,
        payload: Payload::Text("plain".into()),
        ..batch[0].clone()
    });
    let (durable, rejected, _) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 4]);
    assert_eq!(rejected, vec![1, 2, 3, 5]);
    assert_eq!(server.documents("events").len(), 2);
    assert_eq!(
        server.dropped("events"),
        0,
        "nothing was sent to be dropped"
    );
}

#[tokio::test]
async fn max_request_bytes_splits_a_batch_and_refuses_a_document_over_it() {
    let server = QuickwitServer::start().await;
    let sink = open(&config(&server, DYNAMIC, json!({"max_request_bytes": 100}))).await;
    let mut payloads: Vec<Value> = (0..4)
        .map(|n| json!({"n": n, "pad": "x".repeat(30)}))
        .collect();
    payloads.push(json!({"n": 4, "pad": "x".repeat(200)}));
    let (durable, rejected, _) = partial(sink.write(&topic(), &messages(payloads)).await);
    assert_eq!(durable, vec![0, 1, 2, 3]);
    assert_eq!(rejected, vec![4]);
    let lines: Vec<usize> = server
        .ingest_requests()
        .iter()
        .map(|(_, lines)| *lines)
        .collect();
    assert_eq!(lines, vec![2, 2]);
}

#[tokio::test]
async fn bad_yaml_is_a_config_error_naming_index_not_a_panic() {
    let entry = Registry::sinks()
        .iter()
        .find(|entry| entry.name == "quickwit")
        .unwrap();
    for index in ["index_id: [", "doc_mapping: {}"] {
        let error = (entry.build)(&json!({"url": "http://127.0.0.1:1", "index": index}))
            .err()
            .expect("a config error");
        assert!(error.field.starts_with("index"), "{index}: {error}");
    }
}

#[tokio::test]
async fn a_missing_index_that_may_not_be_created_or_a_deleted_one_is_fatal() {
    let server = QuickwitServer::start().await;
    let mut sink = build(&config(
        &server,
        DYNAMIC,
        json!({"create_index_if_not_exists": false}),
    ));
    let error = sink.open().await.unwrap_err();
    assert!(!error.is_transient());
    assert!(
        error.to_string().contains("create_index_if_not_exists"),
        "{error}"
    );

    let sink = open(&config(&server, DYNAMIC, json!({}))).await;
    server.delete_index("events");
    let error = sink
        .write(&topic(), &messages(numbered(1)))
        .await
        .unwrap_err();
    assert!(matches!(error, SinkError::Fatal(_)), "{error:?}");
}

#[tokio::test]
async fn a_server_answering_503_or_nothing_listening_at_open_is_transient() {
    let server = QuickwitServer::start().await;
    server.set_down(true);
    let mut sink = build(&config(&server, DYNAMIC, json!({})));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error:?}");
    // Bound, not listening: connecting is refused.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let url = format!("http://{}", socket.local_addr().unwrap());
    let mut sink = build(&json!({"url": url, "index": DYNAMIC}));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error:?}");
}

#[tokio::test]
async fn upstreams_template_is_refused_naming_its_empty_fields_and_runs_once_filled_in() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = repo
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/reference/upstream-configs/quickwit_sink.toml"))
        .find(|path| path.is_file())
        .expect("upstream's quickwit_sink.toml");
    let table: toml::Table = toml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let mut plugin_config = serde_json::to_value(&table["plugin_config"]).unwrap();
    let entry = Registry::sinks()
        .iter()
        .find(|entry| entry.name == "quickwit")
        .unwrap();
    let error = (entry.build)(&plugin_config)
        .err()
        .expect("empty url refused");
    assert_eq!(error.field, "url");
    let server = QuickwitServer::start().await;
    plugin_config["url"] = json!(server.url());
    let error = (entry.build)(&plugin_config)
        .err()
        .expect("empty index refused");
    assert_eq!(error.field, "index");
    plugin_config["index"] = json!(DYNAMIC);
    let sink = open(&plugin_config).await;
    sink.write(&topic(), &messages(numbered(3))).await.unwrap();
    assert_eq!(server.documents("events").len(), 3);
}
