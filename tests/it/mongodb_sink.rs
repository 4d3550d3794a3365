//! The mongodb sink against a MongoDB server from `support::mongodb`: the
//! nx-27017 emulator (its own per test), or a real mongod when
//! `IGGY_CONNECT_TEST_MONGODB_URL` is set. Read back through the driver.
#![cfg(feature = "mongodb-sink")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::{ConnectorError, SinkError};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{Payload, SinkMessage};
use iggy_connect::state::MemoryStateStore;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::support;
use crate::support::mongodb::{MongoServer, unique_database};
use crate::support::proxy::Proxy;
use crate::support::sinks::{self, durable_and_rejected, topic};
use crate::support::wait::eventually;

fn message(offset: u64, payload: Payload) -> SinkMessage {
    SinkMessage {
        id: u128::from(offset) + 100,
        offset,
        partition_id: 1,
        timestamp: 1_700_000_000_000_000 + offset,
        origin_timestamp: 1_700_000_000_000_000,
        checksum: offset,
        headers: Vec::new(),
        payload,
    }
}

fn json_batch(range: std::ops::Range<u64>) -> Vec<SinkMessage> {
    range
        .map(|n| {
            message(
                n,
                Payload::Json(json!({"n": n, "email": format!("u{n}@x")})),
            )
        })
        .collect()
}

fn config(uri: &str, database: &str, extra: Value) -> Value {
    let mut config = json!({
        "connection_uri": uri,
        "database": database,
        "collection": "events",
        "payload_format": "json",
        "server_selection_timeout": "2s",
    });
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    config
}

/// An integer field: the emulator returns small 64-bit integers as 32-bit ones.
fn int(document: &Document, key: &str) -> i64 {
    match document.get(key) {
        Some(mongodb::bson::Bson::Int32(value)) => i64::from(*value),
        Some(mongodb::bson::Bson::Int64(value)) => *value,
        other => panic!("{key} is not an integer: {other:?} in {document:?}"),
    }
}

fn rejected_indexes(error: SinkError) -> Vec<usize> {
    match error {
        SinkError::Rejected(rejected) => {
            let mut indexes: Vec<usize> = rejected.iter().map(|r| r.index).collect();
            indexes.sort();
            indexes
        }
        other => panic!("expected a rejection, got {other}"),
    }
}

#[tokio::test]
async fn documents_have_upstreams_shape_and_a_replayed_batch_is_written_once() {
    let server = MongoServer::start();
    let database = unique_database("shape");
    let sink = sinks::open("mongodb", &config(server.uri(), &database, json!({}))).await;
    let batch = json_batch(0..5);
    sink.write(&topic(), &batch).await.unwrap();
    sink.write(&topic(), &batch).await.unwrap();
    let documents = server.documents(&database, "events").await;
    assert_eq!(documents.len(), 5, "{documents:?}");
    let first = &documents[0];
    assert_eq!(first.get_str("_id").unwrap(), "s:t:1:100");
    assert_eq!(int(first, "iggy_offset"), 0);
    assert_eq!(first.get_str("iggy_stream").unwrap(), "s");
    assert_eq!(first.get_str("iggy_topic").unwrap(), "t");
    assert_eq!(first.get_i32("iggy_partition_id").unwrap(), 1);
    assert_eq!(int(first, "iggy_checksum"), 0);
    assert_eq!(
        first
            .get_datetime("iggy_timestamp")
            .unwrap()
            .timestamp_millis(),
        1_700_000_000_000
    );
    assert!(first.get_datetime("iggy_origin_timestamp").is_ok());
    assert_eq!(
        first
            .get_document("payload")
            .unwrap()
            .get_str("email")
            .unwrap(),
        "u0@x"
    );
}

#[tokio::test]
async fn binary_and_string_formats_store_the_payload_bytes_and_text() {
    let server = MongoServer::start();
    let database = unique_database("formats");
    let binary = sinks::open(
        "mongodb",
        &config(
            server.uri(),
            &database,
            json!({"payload_format": "binary", "collection": "bin"}),
        ),
    )
    .await;
    binary
        .write(
            &topic(),
            &[message(0, Payload::Raw(Bytes::from_static(b"\x00\xffraw")))],
        )
        .await
        .unwrap();
    let text = sinks::open(
        "mongodb",
        &config(
            server.uri(),
            &database,
            json!({"payload_format": "text", "collection": "txt", "include_metadata": false}),
        ),
    )
    .await;
    text.write(&topic(), &[message(0, Payload::Text("héllo".into()))])
        .await
        .unwrap();
    let stored = server.documents(&database, "bin").await;
    assert_eq!(
        stored[0].get_binary_generic("payload").unwrap(),
        b"\x00\xffraw"
    );
    let stored = server.documents(&database, "txt").await;
    assert_eq!(stored[0].get_str("payload").unwrap(), "héllo");
    assert!(stored[0].get("iggy_offset").is_none());
}

/// A collection `events` in `database` with a unique index on
/// `payload.email`, holding a document of another app with `u2@x`.
async fn events_with_unique_email(server: &MongoServer, database: &str) {
    let collection = server
        .client()
        .await
        .database(database)
        .collection::<Document>("events");
    collection
        .create_index(
            mongodb::IndexModel::builder()
                .keys(doc! { "payload.email": 1 })
                .options(
                    mongodb::options::IndexOptions::builder()
                        .unique(true)
                        .build(),
                )
                .build(),
        )
        .await
        .unwrap();
    collection
        .insert_one(doc! { "_id": "other", "payload": { "email": "u2@x" } })
        .await
        .unwrap();
}

/// A duplicate on a unique index other than `_id` is not a replay: the
/// message is rejected by its index. The documents inserted are reported
/// stored, and so are the replays among them (a duplicate `_id`).
#[tokio::test]
async fn a_duplicate_on_another_unique_index_is_rejected_by_index_and_the_rest_is_stored() {
    let server = MongoServer::start();
    let database = unique_database("unique");
    events_with_unique_email(&server, &database).await;
    let sink = sinks::open("mongodb", &config(server.uri(), &database, json!({}))).await;
    let batch = json_batch(0..5);
    sink.write(&topic(), &batch[..2]).await.unwrap();
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 1, 3, 4], vec![2]),
        "{error}"
    );
    assert_eq!(server.documents(&database, "events").await.len(), 5);
}

/// An ordered upsert stops at the refused document: the ones before it are
/// stored, it is rejected, and the ones after it are sent on.
#[tokio::test]
async fn an_upsert_refused_mid_batch_rejects_that_message_and_stores_the_others() {
    let server = MongoServer::start();
    let database = unique_database("upsert_refused");
    events_with_unique_email(&server, &database).await;
    let sink = sinks::open(
        "mongodb",
        &config(
            server.uri(),
            &database,
            json!({"write_mode": "upsert", "key_field": "id"}),
        ),
    )
    .await;
    let batch: Vec<SinkMessage> = ["u1@x", "u2@x", "u3@x"]
        .into_iter()
        .enumerate()
        .map(|(n, email)| {
            message(
                n as u64,
                Payload::Json(json!({"id": format!("e{n}"), "email": email})),
            )
        })
        .collect();
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 2], vec![1]),
        "{error}"
    );
    let ids: Vec<String> = server
        .documents(&database, "events")
        .await
        .iter()
        .map(|document| document.get_str("_id").unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.contains(&"e0".to_owned()) && ids.contains(&"e2".to_owned()));
}

#[tokio::test]
async fn a_payload_that_is_not_json_or_lacks_the_key_is_rejected_before_anything_is_written() {
    let server = MongoServer::start();
    let database = unique_database("badjson");
    let sink = sinks::open("mongodb", &config(server.uri(), &database, json!({}))).await;
    let mut batch = json_batch(0..3);
    batch[1].payload = Payload::Raw(Bytes::from_static(b"not json"));
    assert_eq!(
        rejected_indexes(sink.write(&topic(), &batch).await.unwrap_err()),
        vec![1]
    );
    assert!(server.documents(&database, "events").await.is_empty());
    let keyed = sinks::open(
        "mongodb",
        &config(
            server.uri(),
            &database,
            json!({"write_mode": "upsert", "key_field": "user.id"}),
        ),
    )
    .await;
    let batch = vec![
        message(0, Payload::Json(json!({"user": {"id": "a"}}))),
        message(1, Payload::Json(json!({"user": {}}))),
    ];
    assert_eq!(
        rejected_indexes(keyed.write(&topic(), &batch).await.unwrap_err()),
        vec![1]
    );
}

/// `upsert` keeps one document per entity, the last message's fields set
/// over the document; `replace` replaces it whole. A replay changes nothing.
#[tokio::test]
async fn upsert_and_replace_keep_the_latest_state_of_each_entity() {
    let server = MongoServer::start();
    let database = unique_database("upsert");
    let client = server.client().await;
    let collection = client.database(&database).collection::<Document>("events");
    for (mode, keeps_foreign_field) in [("upsert", true), ("replace", false)] {
        collection.delete_many(doc! {}).await.unwrap();
        collection
            .insert_one(doc! { "_id": "a", "note": "set by another app" })
            .await
            .unwrap();
        let sink = sinks::open(
            "mongodb",
            &config(
                server.uri(),
                &database,
                json!({"write_mode": mode, "key_field": "id", "batch_size": 2}),
            ),
        )
        .await;
        let batch: Vec<SinkMessage> = [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2)]
            .into_iter()
            .enumerate()
            .map(|(n, (id, version))| {
                message(
                    n as u64,
                    Payload::Json(json!({"id": id, "version": version})),
                )
            })
            .collect();
        sink.write(&topic(), &batch).await.unwrap();
        sink.write(&topic(), &batch).await.unwrap();
        let documents = server.documents(&database, "events").await;
        assert_eq!(documents.len(), 2, "{mode}: {documents:?}");
        let a = &documents[0];
        assert_eq!(a.get_str("_id").unwrap(), "a");
        assert_eq!(
            int(a.get_document("payload").unwrap(), "version"),
            3,
            "{mode}"
        );
        assert_eq!(a.get_str("iggy_message_id").unwrap(), "s:t:1:103");
        assert_eq!(
            a.get("note").is_some(),
            keeps_foreign_field,
            "{mode}: {a:?}"
        );
        assert_eq!(
            int(documents[1].get_document("payload").unwrap(), "version"),
            2
        );
    }
}

#[tokio::test]
async fn auto_create_collection_creates_it_in_open() {
    let server = MongoServer::start();
    let database = unique_database("create");
    let _sink = sinks::open(
        "mongodb",
        &config(
            server.uri(),
            &database,
            json!({"auto_create_collection": true, "collection": "made"}),
        ),
    )
    .await;
    let names = server
        .client()
        .await
        .database(&database)
        .list_collection_names()
        .await
        .unwrap();
    assert!(names.contains(&"made".to_string()), "{names:?}");
}

/// An unreachable server at open is transient: the engine opens a fresh
/// sink again, with backoff.
#[tokio::test]
async fn open_against_a_server_that_cannot_be_reached_is_transient() {
    let server = MongoServer::start();
    let proxy = Proxy::start(server.addr()).await;
    proxy.set_down(true);
    let database = unique_database("unreachable");
    let uri = format!("mongodb://{}/?directConnection=true", proxy.addr);
    let mut sink = sinks::build(
        "mongodb",
        &config(
            &uri,
            &database,
            json!({"server_selection_timeout": "500ms"}),
        ),
    );
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error}");
    proxy.set_down(false);
    let mut sink = sinks::build("mongodb", &config(&uri, &database, json!({})));
    sink.open().await.unwrap();
}

/// While the server cannot be reached a write is transient (the engine
/// retries it, offsets untouched); once it is back the batch is stored.
#[tokio::test]
async fn an_unreachable_server_is_transient_and_the_retry_stores_the_batch() {
    let server = MongoServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let database = unique_database("outage");
    let uri = format!("mongodb://{}/?directConnection=true", proxy.addr);
    let sink = sinks::open("mongodb", &config(&uri, &database, json!({}))).await;
    sink.write(&topic(), &json_batch(0..2)).await.unwrap();
    proxy.set_down(true);
    let batch = json_batch(2..6);
    match sink.write(&topic(), &batch).await {
        Err(SinkError::Transient { error, .. }) => {
            assert!(error.to_string().contains("events"), "{error}")
        }
        other => panic!("expected a transient error, got {other:?}"),
    }
    proxy.set_down(false);
    eventually(
        "the retried write succeeds",
        Duration::from_secs(20),
        async || sink.write(&topic(), &batch).await.is_ok(),
    )
    .await;
    assert_eq!(server.documents(&database, "events").await.len(), 6);
}

#[test]
fn a_config_without_key_field_for_upsert_is_refused_naming_the_field() {
    let entry = iggy_connect::connectors::Registry::sinks()
        .iter()
        .find(|entry| entry.name == "mongodb")
        .unwrap();
    let error = (entry.build)(&config(
        "mongodb://localhost",
        "db",
        json!({"write_mode": "upsert"}),
    ))
    .err()
    .unwrap();
    assert!(error.to_string().contains("key_field"), "{error}");
}

/// Upstream's example file, unchanged but for its URI, run by the runtime.
#[tokio::test]
async fn upstreams_example_file_runs_against_the_server() {
    let server = MongoServer::start();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/mongodb_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's mongodb_sink.toml");
    let database = unique_database("upstream");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("mongodb://localhost:27017", server.uri())
        .replace("\"iggy_messages\"", &format!("\"{database}\""));
    let (config, _) = parse_connector_file(&path, &text, &EnvVars::from_pairs([])).unwrap();
    let bus = MemoryBus::new();
    for topic in ["users", "orders"] {
        support::sinks::send(
            &bus,
            "user_events",
            topic,
            1,
            (1..=3u64).map(|id| serde_json::to_vec(&json!({"id": id})).unwrap()),
        )
        .await;
    }
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(2),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually(
        "both topics are committed",
        Duration::from_secs(30),
        async || {
            bus.is_drained("user_events", "users", "mongodb_sink")
                && bus.is_drained("user_events", "orders", "mongodb_sink")
        },
    )
    .await;
    let documents = server.documents(&database, "messages").await;
    assert_eq!(documents.len(), 6, "{documents:?}");
    assert!(documents[0].get_binary_generic("payload").is_ok());
    runtime.shutdown().await;
}
