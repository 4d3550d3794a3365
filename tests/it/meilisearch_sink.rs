//! The meilisearch sink against the Meilisearch protocol test server of
//! `support::meilisearch`, through the `Sink` interface (what one `write`
//! returns and what the index holds then).
#![cfg(feature = "meilisearch-sink")]

use std::time::Duration;

use iggy_connect::connectors::{ConnectorError, Partial, Sink, SinkError};
use iggy_connect::message::{HeaderValue, Payload, SinkMessage};
use serde_json::{Value, json};

use crate::support::meilisearch::MeiliServer;
use crate::support::sinks::{self, topic};
use crate::support::wait::eventually;

const DEADLINE: Duration = Duration::from_secs(30);

fn config(server: &MeiliServer, extra: Value) -> Value {
    let mut config = json!({
        "url": server.url(),
        "index": "iggy",
        "task_poll_interval": "2ms",
        "retry_delay": "10ms",
        "max_retry_delay": "50ms",
    });
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    config
}

async fn open(config: &Value) -> Box<dyn Sink> {
    sinks::open("meilisearch", config).await
}

fn build(config: &Value) -> Box<dyn Sink> {
    sinks::build("meilisearch", config)
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
            origin_timestamp: 1_709_214_299_000_000,
            checksum: 99,
            headers: Vec::new(),
            payload: Payload::Json(payload),
        })
        .collect()
}

fn numbered(count: usize) -> Vec<Value> {
    (0..count).map(|n| json!({"n": n})).collect()
}

/// Upstream's generated id of `message` from the tests' topic.
fn generated_id(message: &SinkMessage) -> String {
    use base64::Engine;
    let parts = json!([
        "s",
        "t",
        message.partition_id,
        message.offset,
        message.id.to_string()
    ]);
    format!(
        "iggy_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(parts.to_string())
    )
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

fn wait_of(error: &SinkError) -> Option<Duration> {
    match error {
        SinkError::Transient { retry_after, .. } => *retry_after,
        other => panic!("expected transient, got {other:?}"),
    }
}

#[tokio::test]
async fn ok_comes_once_the_task_succeeded_with_upstreams_ids_and_metadata() {
    let server = MeiliServer::start_with(Some("masterKey")).await;
    let sink = open(&config(&server, json!({"api_key": "masterKey"}))).await;
    assert_eq!(
        server.primary_key("iggy").as_deref(),
        Some("iggy_id"),
        "created at open"
    );
    let mut batch = messages(numbered(3));
    batch[1].headers = vec![("tenant".into(), HeaderValue::String("acme".into()))];
    sink.write(&topic(), &batch).await.unwrap();
    // Documents exist only once their task succeeded: read right after Ok.
    let documents = server.documents("iggy");
    assert_eq!(documents.len(), 3);
    let second = &documents[&generated_id(&batch[1])];
    assert_eq!(second["n"], 1);
    assert_eq!(second["iggy_offset"], 1);
    assert_eq!(second["iggy_stream"], "s");
    assert_eq!(second["iggy_topic"], "t");
    assert_eq!(second["iggy_partition"], 1);
    assert_eq!(second["iggy_message_id"], "1001");
    assert_eq!(second["iggy_checksum"], "99");
    assert_eq!(second["iggy_timestamp"], 1_709_214_300_000_001u64);
    assert_eq!(second["iggy_headers"], json!({"tenant": "acme"}));
    let requests = server.seen();
    let documents_request = requests
        .iter()
        .find(|seen| seen.path == "/indexes/iggy/documents")
        .unwrap();
    assert_eq!(documents_request.method, "POST");
    assert_eq!(documents_request.query, "primaryKey=iggy_id");
    assert_eq!(
        documents_request.headers["authorization"],
        "Bearer masterKey"
    );
    assert_eq!(
        server.document_requests().len(),
        1,
        "one task for the batch"
    );
}

#[tokio::test]
async fn a_replayed_batch_replaces_its_documents_instead_of_duplicating_them() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({}))).await;
    let batch = messages(numbered(5));
    sink.write(&topic(), &batch).await.unwrap();
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(server.documents("iggy").len(), 5);
    assert_eq!(server.document_requests().len(), 2);
}

#[tokio::test]
async fn a_failed_task_is_split_down_to_the_document_meilisearch_refuses() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({}))).await;
    let mut payloads = numbered(8);
    payloads[5] = json!({"n": 5, "_geo": "nowhere"});
    let batch = messages(payloads);
    let Err(SinkError::Partial(answer)) = sink.write(&topic(), &batch).await else {
        panic!("expected a per-message answer");
    };
    let mut durable = answer.durable.clone();
    durable.sort();
    assert_eq!(durable, vec![0, 1, 2, 3, 4, 6, 7]);
    assert_eq!(answer.rejected.len(), 1);
    assert_eq!(answer.rejected[0].index, 5);
    assert!(
        answer.rejected[0]
            .reason
            .contains("invalid_document_geo_field"),
        "{}",
        answer.rejected[0].reason
    );
    assert_eq!(server.documents("iggy").len(), 7);
    // Each half in its place: the chunk's documents stay in order.
    let sizes: Vec<usize> = server.document_requests().iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![8, 4, 4, 2, 1, 1, 2]);
}

#[tokio::test]
async fn ids_meilisearch_would_refuse_are_rejected_before_sending() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({"primary_key": "sku"}))).await;
    let batch = messages(vec![
        json!({"sku": "ab-1"}),
        json!({"sku": "a b"}),
        json!({"sku": 7}),
        json!({"sku": 1.5}),
        json!({"other": true}),
    ]);
    let (durable, rejected, _) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 2, 4]);
    assert_eq!(rejected, vec![1, 3]);
    let documents = server.documents("iggy");
    assert_eq!(documents.len(), 3);
    assert_eq!(documents["ab-1"]["iggy_id"], generated_id(&batch[0]));
    assert_eq!(documents["7"]["sku"], 7);
    assert!(
        documents.contains_key(&generated_id(&batch[4])),
        "a missing key gets upstream's id"
    );
    let sent: usize = server.document_requests().iter().map(Vec::len).sum();
    assert_eq!(sent, 3);
}

#[tokio::test]
async fn a_429_is_transient_with_its_retry_after_and_a_task_failed_internally_is_transient() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({}))).await;
    let batch = messages(numbered(2));
    server.fail_next_request(429, Some(7));
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(wait_of(&error), Some(Duration::from_secs(7)), "{error:?}");
    assert_eq!(server.document_requests().len(), 1, "nothing waits inside");
    server.fail_next_tasks(1);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(wait_of(&error), None);
    assert!(error.to_string().contains("internal"), "{error}");
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(server.document_requests().len(), 3);
    assert_eq!(server.documents("iggy").len(), 2);
    let failed: Vec<_> = server
        .tasks()
        .into_iter()
        .filter(|task| task.1 == "failed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].3.as_deref(), Some("internal"));
}

#[tokio::test]
async fn a_chunk_answered_503_ends_the_write_and_only_the_rest_is_written_again() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({"batch_size": 2}))).await;
    let batch = messages(numbered(6));
    server.pass_next_request();
    server.fail_next_request(503, Some(7));
    let (durable, rejected, rest) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 1]);
    assert!(rejected.is_empty());
    assert_eq!(wait_of(&rest), Some(Duration::from_secs(7)));
    assert_eq!(
        server.document_requests().len(),
        2,
        "nothing more is sent to a server answering 503"
    );
    // What the engine does next: write the rest again, only the rest.
    sink.write(&topic(), &batch[2..]).await.unwrap();
    let sizes: Vec<usize> = server.document_requests().iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![2, 2, 2, 2]);
    assert_eq!(server.documents("iggy").len(), 6);
}

#[tokio::test]
async fn a_task_not_finished_within_task_timeout_is_transient_never_ok() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({"task_timeout": "200ms"}))).await;
    server.set_paused(true);
    let batch = messages(numbered(3));
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    let SinkError::Transient { error: reason, .. } = error else {
        panic!("expected transient, got {error:?}");
    };
    assert!(reason.to_string().contains("task_timeout"), "{reason}");
    assert!(server.documents("iggy").is_empty());
    server.set_paused(false);
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(server.documents("iggy").len(), 3);
}

#[tokio::test]
async fn without_wait_for_tasks_ok_comes_at_enqueue_and_a_failed_task_is_lost_unseen() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({"wait_for_tasks": false}))).await;
    server.set_paused(true);
    let mut payloads = numbered(4);
    payloads[2] = json!({"n": 2, "_geo": "nowhere"});
    sink.write(&topic(), &messages(payloads)).await.unwrap();
    assert!(
        server.documents("iggy").is_empty(),
        "Ok before anything is written"
    );
    server.set_paused(false);
    eventually("the task ends", DEADLINE, async || server.idle()).await;
    // The weaker mode, measured: the whole task failed, all 4 documents are
    // lost and the sink never knew.
    assert!(server.documents("iggy").is_empty());
    assert_eq!(
        server.tasks().last().unwrap().3.as_deref(),
        Some("invalid_document_geo_field")
    );
}

#[tokio::test]
async fn update_merges_fields_and_replace_overwrites_the_document() {
    for (action, expected) in [
        ("update", json!({"sku": "x", "a": 1, "b": 2})),
        ("replace", json!({"sku": "x", "b": 2})),
    ] {
        let server = MeiliServer::start().await;
        let sink = open(&config(
            &server,
            json!({"primary_key": "sku", "document_action": action, "include_metadata": false}),
        ))
        .await;
        sink.write(&topic(), &messages(vec![json!({"sku": "x", "a": 1})]))
            .await
            .unwrap();
        let mut second = messages(vec![json!({"sku": "x", "b": 2})]);
        second[0].offset = 1;
        sink.write(&topic(), &second).await.unwrap();
        assert_eq!(server.documents("iggy")["x"], expected, "{action}");
        let method = if action == "update" { "PUT" } else { "POST" };
        assert!(
            server
                .seen()
                .iter()
                .filter(|seen| seen.path.ends_with("/documents"))
                .all(|seen| seen.method == method)
        );
    }
}

#[tokio::test]
async fn bad_or_missing_keys_are_fatal_and_name_api_key() {
    let server = MeiliServer::start_with(Some("masterKey")).await;
    for (extra, status) in [(json!({"api_key": "wrong"}), "403"), (json!({}), "401")] {
        let mut sink = build(&config(&server, extra));
        let error = sink.open().await.unwrap_err();
        assert!(!error.is_transient(), "{error}");
        let message = error.to_string();
        assert!(
            message.contains(status) && message.contains("api_key"),
            "{message}"
        );
        assert!(!message.contains("wrong"), "the key leaked: {message}");
    }
}

#[tokio::test]
async fn an_index_with_another_primary_key_is_fatal_and_names_primary_key() {
    let server = MeiliServer::start().await;
    server.create_index("iggy", Some("uuid"));
    let mut sink = build(&config(&server, json!({})));
    let error = sink.open().await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("primary_key = \"uuid\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_missing_index_meilisearch_will_not_create_is_fatal_and_names_the_fix() {
    let server = MeiliServer::start().await;
    server.set_auto_create_index(false);
    let sink = open(&config(
        &server,
        json!({"create_index_if_not_exists": false}),
    ))
    .await;
    assert!(server.index_names().is_empty());
    let error = sink
        .write(&topic(), &messages(numbered(2)))
        .await
        .unwrap_err();
    let SinkError::Fatal(reason) = error else {
        panic!("expected fatal, got {error:?}");
    };
    let reason = reason.to_string();
    assert!(
        reason.contains("index_not_found") && reason.contains("create_index_if_not_exists"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_server_down_at_open_is_transient_at_once_and_max_open_retries_is_left_to_the_engine() {
    let server = MeiliServer::start().await;
    server.set_down(true);
    let mut sink = build(&config(&server, json!({"max_open_retries": 2})));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error:?}");
    let health_checks = server
        .seen()
        .iter()
        .filter(|seen| seen.path == "/health")
        .count();
    assert_eq!(health_checks, 1, "the engine opens a fresh sink again");
    // Bound, not listening: connecting is refused.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let url = format!("http://{}", socket.local_addr().unwrap());
    let mut sink = build(&json!({"url": url, "index": "iggy"}));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error:?}");
}

#[tokio::test]
async fn a_request_over_the_payload_limit_is_split() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({"include_metadata": false}))).await;
    server.set_payload_limit(300);
    let batch = messages(
        (0..6)
            .map(|n| json!({"n": n, "text": "x".repeat(60)}))
            .collect(),
    );
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(server.documents("iggy").len(), 6);
    let sizes: Vec<usize> = server.document_requests().iter().map(Vec::len).collect();
    assert_eq!(sizes[0], 6, "{sizes:?}");
    assert!(sizes.len() > 2, "{sizes:?}");
}

#[tokio::test]
async fn upstreams_example_file_runs_against_the_test_server() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = repo
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/reference/upstream-configs/meilisearch_sink.toml"))
        .find(|path| path.is_file())
        .expect("upstream's meilisearch_sink.toml");
    let table: toml::Table = toml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let mut plugin_config = serde_json::to_value(&table["plugin_config"]).unwrap();
    let server = MeiliServer::start().await;
    plugin_config["url"] = json!(server.url());
    let sink = open(&plugin_config).await;
    sink.write(&topic(), &messages(numbered(3))).await.unwrap();
    assert_eq!(server.documents("iggy_messages").len(), 3);
}
