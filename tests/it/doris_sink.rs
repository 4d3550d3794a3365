//! The doris sink against the Stream Load protocol test server of
//! `support::doris` (a frontend redirecting to a backend, labels remembered):
//! labels and replays, the answers and how each is classified, redirect
//! checks, the format headers, unfit rows rejected by index, and upstream's
//! example file.
#![cfg(feature = "doris-sink")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::{Sink, SinkError};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{Payload, SinkMessage};
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

use crate::support;
use crate::support::doris::{Doris, Fault, Kind, column};
use crate::support::sinks::{self, topic};
use crate::support::wait::eventually;

async fn server() -> Doris {
    let server = Doris::start("root", "pw").await;
    server.create_table(
        "demo",
        "events",
        vec![
            column("id", Kind::Int, false),
            column("name", Kind::Text, true),
        ],
    );
    server
}

fn config(server: &Doris, extra: Value) -> Value {
    let mut config = json!({
        "fe_url": server.fe_url, "database": "demo", "table": "events",
        "username": "root", "password": "pw",
    });
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    config
}

async fn open(config: Value) -> Box<dyn Sink> {
    sinks::open("doris", &config).await
}

fn message(offset: u64, payload: Value) -> SinkMessage {
    SinkMessage {
        id: u128::from(offset) + 100,
        offset,
        partition_id: 1,
        timestamp: 1_700_000_000_000_000,
        origin_timestamp: 1_700_000_000_000_000,
        checksum: 0,
        headers: Vec::new(),
        payload: Payload::Json(payload),
    }
}

fn batch(offsets: std::ops::Range<u64>) -> Vec<SinkMessage> {
    offsets
        .map(|n| message(n, json!({"id": n, "name": format!("row {n}")})))
        .collect()
}

fn ids(server: &Doris) -> Vec<i64> {
    let mut ids: Vec<i64> = server
        .rows("demo", "events")
        .iter()
        .map(|row| row["id"].as_i64().unwrap())
        .collect();
    ids.sort();
    ids
}

fn labels(server: &Doris) -> Vec<String> {
    server
        .seen()
        .iter()
        .filter(|seen| seen.backend)
        .map(|seen| seen.headers["label"].clone())
        .collect()
}

#[tokio::test]
async fn a_load_follows_the_redirect_with_credentials_and_a_replay_is_deduplicated_by_label() {
    let server = server().await;
    let sink = open(config(&server, json!({"batch_size": 4}))).await;
    let rows = batch(0..10);
    sink.write(&topic(), &rows).await.unwrap();
    sink.write(&topic(), &rows).await.unwrap();
    assert_eq!(ids(&server), (0..10).collect::<Vec<_>>(), "loaded once");
    let seen = server.seen();
    assert!(seen.iter().any(|s| !s.backend) && seen.iter().any(|s| s.backend));
    for request in &seen {
        assert_eq!(request.headers["expect"], "100-continue");
        assert!(request.headers["authorization"].starts_with("Basic "));
    }
    let labels = labels(&server);
    assert_eq!(labels.len(), 6, "3 loads of 4 rows, twice: {labels:?}");
    assert_eq!(labels[..3], labels[3..], "a replay carries the same labels");
    assert!(
        labels[0].starts_with("iggy-s-t-") && labels[0].ends_with("-1-0-3"),
        "{}",
        labels[0]
    );
    assert!(labels[2].ends_with("-1-8-9"), "{}", labels[2]);
}

#[tokio::test]
async fn a_load_whose_answer_was_lost_is_transient_and_written_again_under_its_label_once() {
    let server = server().await;
    let sink = open(config(&server, json!({}))).await;
    server.fail_next(&[Fault::AnswerLost]);
    let error = sink.write(&topic(), &batch(0..3)).await.unwrap_err();
    assert!(matches!(error, SinkError::Transient { .. }), "{error}");
    // The engine writes the batch again: Doris knows the label.
    sink.write(&topic(), &batch(0..3)).await.unwrap();
    assert_eq!(ids(&server), vec![0, 1, 2]);
    let labels = labels(&server);
    assert_eq!(labels.len(), 2);
    assert_eq!(labels[0], labels[1]);
}

#[tokio::test]
async fn publish_timeout_is_written_and_unavailable_or_throttled_loads_are_transient() {
    let server = server().await;
    let sink = open(config(&server, json!({}))).await;
    server.fail_next(&[Fault::PublishTimeout]);
    sink.write(&topic(), &batch(0..2)).await.unwrap();
    server.fail_next(&[Fault::Unavailable]);
    let error = sink.write(&topic(), &batch(2..4)).await.unwrap_err();
    let SinkError::Transient { retry_after, .. } = &error else {
        panic!("expected Transient, got {error}");
    };
    assert_eq!(
        *retry_after,
        Some(Duration::ZERO),
        "the Retry-After: 0 asked for"
    );
    sink.write(&topic(), &batch(2..4)).await.unwrap();
    server.fail_next(&[Fault::TooManyRequests]);
    let error = sink.write(&topic(), &batch(4..6)).await.unwrap_err();
    assert!(matches!(error, SinkError::Transient { .. }), "{error}");
    sink.write(&topic(), &batch(4..6)).await.unwrap();
    assert_eq!(ids(&server), (0..6).collect::<Vec<_>>());
    assert_eq!(labels(&server).len(), 5, "each write sent each load once");
}

#[tokio::test]
async fn an_outage_after_a_load_names_its_rows_durable_and_the_rest_reloads_under_the_same_label() {
    let server = server().await;
    let sink = open(config(&server, json!({"batch_size": 2}))).await;
    server.fail_next(&[Fault::PublishTimeout, Fault::Unavailable]);
    let rows = batch(0..6);
    let error = sink.write(&topic(), &rows).await.unwrap_err();
    let SinkError::Partial(partial) = error else {
        panic!("expected Partial, got {error}");
    };
    assert_eq!(partial.durable, [0, 1], "the first load was written");
    assert!(partial.rest.is_transient(), "{}", partial.rest);
    // What the engine writes again: the rows not durable yet.
    sink.write(&topic(), &rows[2..]).await.unwrap();
    assert_eq!(ids(&server), (0..6).collect::<Vec<_>>());
    let labels = labels(&server);
    assert_eq!(labels.len(), 4, "{labels:?}");
    assert_eq!(
        labels[1], labels[2],
        "the failed load is sent again under its label"
    );
}

/// The durable and the rejected indexes of a write answered in part.
fn settled(error: SinkError) -> (Vec<usize>, Vec<iggy_connect::connectors::Rejection>) {
    let SinkError::Partial(partial) = error else {
        panic!("expected Partial, got {error}");
    };
    let mut durable = partial.durable;
    durable.sort();
    (durable, partial.rejected)
}

#[tokio::test]
async fn unfit_rows_named_by_the_error_log_are_rejected_by_index_and_the_others_loaded_at_once() {
    for format in ["json", "csv"] {
        let server = server().await;
        let sink = open(config(
            &server,
            json!({"output_format": format, "columns": "id, name"}),
        ))
        .await;
        let mut rows = batch(0..6);
        rows[1].payload = Payload::Json(json!({"id": "not a number", "name": "x"}));
        rows[4].payload = Payload::Json(json!({"name": "no id"}));
        let (durable, rejections) = settled(sink.write(&topic(), &rows).await.unwrap_err());
        let mut indexes: Vec<usize> = rejections.iter().map(|r| r.index).collect();
        indexes.sort();
        assert_eq!(indexes, vec![1, 4], "{format}");
        assert!(
            rejections[0].reason.contains("error log"),
            "{}",
            rejections[0].reason
        );
        assert_eq!(durable, vec![0, 2, 3, 5], "{format}");
        assert_eq!(ids(&server), vec![0, 2, 3, 5], "{format}");
        let loads: Vec<_> = server.seen().into_iter().filter(|s| s.backend).collect();
        assert_eq!(
            loads.len(),
            2,
            "{format}: the refused load, then the others alone"
        );
        assert_eq!(loads[1].headers["format"], format);
        assert_eq!(loads[1].headers["columns"], "id, name");
    }
}

#[tokio::test]
async fn unfit_rows_of_a_later_load_are_rejected_and_every_other_row_loaded() {
    let server = server().await;
    let sink = open(config(&server, json!({"batch_size": 3}))).await;
    let mut rows = batch(0..6);
    rows[4].payload = Payload::Json(json!({"id": "not a number", "name": "x"}));
    let (durable, rejections) = settled(sink.write(&topic(), &rows).await.unwrap_err());
    assert_eq!(durable, [0, 1, 2, 3, 5]);
    assert_eq!(rejections.len(), 1);
    assert_eq!(rejections[0].index, 4);
    assert_eq!(ids(&server), vec![0, 1, 2, 3, 5]);
}

#[tokio::test]
async fn max_filter_ratio_where_and_columns_are_sent_and_doris_filters_within_the_ratio() {
    let server = server().await;
    let sink = open(config(
        &server,
        json!({"max_filter_ratio": 0.5, "where": "id > 0", "columns": "id, name"}),
    ))
    .await;
    let mut rows = batch(0..4);
    rows[2].payload = Payload::Json(json!({"id": [1]}));
    sink.write(&topic(), &rows).await.unwrap();
    assert_eq!(ids(&server), vec![0, 1, 3], "filtered by Doris, as allowed");
    let load = server.seen().into_iter().rfind(|s| s.backend).unwrap();
    assert_eq!(load.headers["max_filter_ratio"], "0.5");
    assert_eq!(load.headers["where"], "id > 0");
    assert_eq!(load.headers["strip_outer_array"], "true");
}

#[tokio::test]
async fn a_payload_that_is_not_a_json_object_is_rejected_before_anything_is_sent() {
    let server = server().await;
    let sink = open(config(&server, json!({}))).await;
    let mut rows = batch(0..3);
    rows[0].payload = Payload::Text("plain".into());
    rows[2].payload = Payload::Json(json!([1, 2]));
    let SinkError::Rejected(rejections) = sink.write(&topic(), &rows).await.unwrap_err() else {
        panic!("expected Rejected");
    };
    let indexes: Vec<usize> = rejections.iter().map(|r| r.index).collect();
    assert_eq!(indexes, vec![0, 2]);
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn wrong_credentials_and_an_unknown_table_are_fatal_naming_the_fields() {
    let server = server().await;
    for (extra, field) in [
        (json!({"password": "wrong"}), "username/password"),
        (json!({"table": "absent"}), "database and table"),
    ] {
        let sink = open(config(&server, extra.clone())).await;
        let error = sink.write(&topic(), &batch(0..1)).await.unwrap_err();
        let SinkError::Fatal(error) = error else {
            panic!("{extra}: expected fatal, got {error}");
        };
        assert!(error.to_string().contains(field), "{extra}: {error}");
    }
}

#[tokio::test]
async fn a_redirect_to_a_host_off_the_allow_list_is_refused_before_credentials_are_sent() {
    let server = server().await;
    let sink = open(config(
        &server,
        json!({"allowed_redirect_hosts": ["be.internal"]}),
    ))
    .await;
    let error = sink.write(&topic(), &batch(0..1)).await.unwrap_err();
    let SinkError::Fatal(error) = error else {
        panic!("expected fatal, got {error}");
    };
    assert!(
        error.to_string().contains("allowed_redirect_hosts"),
        "{error}"
    );
    assert!(
        server.seen().iter().all(|s| !s.backend),
        "the BE was never called"
    );
    // Listed by host:port, the same redirect is followed.
    let listed = open(config(
        &server,
        json!({"allowed_redirect_hosts": [format!("127.0.0.1:{}", server.be_port)]}),
    ))
    .await;
    listed.write(&topic(), &batch(0..1)).await.unwrap();
    assert_eq!(ids(&server), vec![0]);
    // A host the redirect names by another name is not on the list.
    server.redirect_to_host("localhost");
    let error = listed.write(&topic(), &batch(1..2)).await.unwrap_err();
    assert!(
        error.to_string().contains("allowed_redirect_hosts"),
        "{error}"
    );
}

/// Upstream's example file: as it is, it is refused naming its empty
/// template fields; filled in (database, table, stream, topics) and pointed
/// at the test server, the runtime runs it.
#[tokio::test]
async fn upstreams_example_file_is_refused_as_a_template_and_runs_once_filled_in() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/doris_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's doris_sink.toml");
    let original = std::fs::read_to_string(&path).unwrap();
    let issues = parse_connector_file(&path, &original, &EnvVars::from_pairs([]))
        .err()
        .map(|issues| format!("{issues:?}"))
        .unwrap_or_default();
    let registry_error = iggy_connect::connectors::Registry::sinks()
        .iter()
        .find(|entry| entry.name == "doris")
        .map(|entry| {
            let table: toml::Table = toml::from_str(&original).unwrap();
            let plugin = serde_json::to_value(&table["plugin_config"]).unwrap();
            (entry.build)(&plugin)
                .err()
                .map(|error| error.to_string())
                .unwrap_or_default()
        })
        .unwrap();
    assert!(
        issues.contains("stream") || registry_error.contains("database"),
        "the template is refused naming its empty fields: {issues} / {registry_error}"
    );
    assert!(registry_error.contains("database"), "{registry_error}");

    let server = Doris::start("root", "").await;
    server.create_table("demo", "events", vec![column("id", Kind::Int, false)]);
    let text = original
        .replace("http://localhost:8030", &server.fe_url)
        .replace("database = \"\"", "database = \"demo\"")
        .replace("table = \"\"", "table = \"events\"")
        .replace("stream = \"\"", "stream = \"events\"")
        .replace("topics = []", "topics = [\"doris_events\"]");
    let (config, _) = parse_connector_file(&path, &text, &EnvVars::from_pairs([])).unwrap();
    let bus = MemoryBus::new();
    support::sinks::send(
        &bus,
        "events",
        "doris_events",
        1,
        (1..=5u64).map(|id| serde_json::to_vec(&json!({"id": id})).unwrap()),
    )
    .await;
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(2),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually(
        "the topic is committed",
        Duration::from_secs(30),
        async || bus.is_drained("events", "doris_events", "doris_sink"),
    )
    .await;
    runtime.shutdown().await;
    assert_eq!(server.rows("demo", "events").len(), 5);
}
