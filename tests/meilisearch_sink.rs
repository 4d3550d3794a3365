//! The meilisearch sink against the Meilisearch protocol test server of
//! `support::meilisearch`, through the `Sink` interface (what one `write`
//! returns and what the index holds then).

mod support;

use std::time::Duration;

use iggy_connect::connectors::{Sink, SinkError};
use iggy_connect::message::{HeaderValue, Payload, SinkMessage};
use serde_json::{Value, json};
use support::meilisearch::MeiliServer;
use support::sinks::{self, topic};
use support::wait::eventually;

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

fn rejected_indexes(result: Result<(), SinkError>) -> Vec<usize> {
    match result {
        Err(SinkError::Rejected(rejections)) => {
            let mut indexes: Vec<usize> = rejections.iter().map(|r| r.index).collect();
            indexes.sort();
            indexes
        }
        other => panic!("expected rejections, got {other:?}"),
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
    let result = sink.write(&topic(), &batch).await;
    let Err(SinkError::Rejected(rejections)) = result else {
        panic!("expected a rejection, got {result:?}");
    };
    assert_eq!(rejections.len(), 1);
    assert_eq!(rejections[0].index, 5);
    assert!(
        rejections[0].reason.contains("invalid_document_geo_field"),
        "{}",
        rejections[0].reason
    );
    assert_eq!(server.documents("iggy").len(), 7);
    let sizes: Vec<usize> = server.document_requests().iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![8, 4, 4, 2, 2, 1, 1]);
    // What the engine does next: drop the rejected one, write the rest again.
    let rest: Vec<SinkMessage> = batch
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != 5)
        .map(|(_, message)| message.clone())
        .collect();
    sink.write(&topic(), &rest).await.unwrap();
    assert_eq!(server.document_requests().len(), 7, "nothing is sent again");
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
    assert_eq!(
        rejected_indexes(sink.write(&topic(), &batch).await),
        vec![1, 3]
    );
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
async fn a_429_waits_for_its_retry_after_and_a_task_failed_internally_is_sent_again() {
    let server = MeiliServer::start().await;
    server.fail_next_request(429, Some(1));
    server.fail_next_tasks(1);
    let sink = open(&config(&server, json!({}))).await;
    sink.write(&topic(), &messages(numbered(2))).await.unwrap();
    let requests: Vec<_> = server
        .seen()
        .into_iter()
        .filter(|seen| seen.path == "/indexes/iggy/documents")
        .collect();
    assert_eq!(
        requests.len(),
        3,
        "429, the task failing internally, success"
    );
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_secs(1), "retried after {waited:?}");
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
async fn chunks_still_failing_after_the_retries_are_transient_and_only_they_are_sent_again() {
    let server = MeiliServer::start().await;
    let sink = open(&config(&server, json!({"max_retries": 1, "batch_size": 2}))).await;
    let batch = messages(numbered(4));
    // Both chunks' tasks fail, then the first one's fails again on the retry.
    server.fail_next_tasks(3);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert!(
        matches!(&error, SinkError::Transient { error: reason, .. } if reason.to_string().contains("internal")),
        "{error:?}"
    );
    assert_eq!(server.documents("iggy").len(), 2);
    assert_eq!(server.document_requests().len(), 4);
    // The engine's retry of the same batch writes only what is missing.
    sink.write(&topic(), &batch).await.unwrap();
    let requests = server.document_requests();
    assert_eq!(requests.len(), 5);
    assert_eq!(requests[4].len(), 2, "only the chunk not written");
    assert_eq!(server.documents("iggy").len(), 4);
}

#[tokio::test]
async fn a_task_not_finished_within_task_timeout_is_transient_never_ok() {
    let server = MeiliServer::start().await;
    let sink = open(&config(
        &server,
        json!({"task_timeout": "200ms", "max_retries": 0}),
    ))
    .await;
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
async fn a_server_down_at_open_is_transient_after_max_open_retries() {
    let server = MeiliServer::start().await;
    server.set_down(true);
    let mut sink = build(&config(&server, json!({"max_open_retries": 2})));
    let error = sink.open().await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    let health_checks = server
        .seen()
        .iter()
        .filter(|seen| seen.path == "/health")
        .count();
    assert_eq!(health_checks, 3, "the first attempt and 2 retries");
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
