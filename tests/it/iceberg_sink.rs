//! The iceberg sink against real Iceberg tables (the `iceberg` crate's memory
//! catalog over temp warehouse directories, and the REST catalog test server
//! `support::iceberg_rest`), with the engine consuming from the in-process
//! Iggy test server over the real `iggy` client. Tables are read back with
//! PyPI `pyiceberg` (`support::iceberg`), not the sink's library.
#![cfg(feature = "iceberg-sink")]

use std::time::Duration;

use iggy_connect::connectors::{ConnectorKind, Flush, Registry, Sink, SinkError};
use iggy_connect::engine::Status;
use iggy_connect::message::TopicRef;
use serde_json::{Value, json};

use crate::support;
use crate::support::binary::Workspace;
use crate::support::harness::{connector, iggy_client, produce, produce_ns, runtime};
use crate::support::iceberg::Table;
use crate::support::iceberg_rest::IcebergRest;
use crate::support::iggy_server::IggyTestServer;
use crate::support::s3::S3Server;
use crate::support::sinks::{message, ns_messages, ns_once};
use crate::support::wait::{eventually, wait_for};

const LONG: Duration = Duration::from_secs(60);

/// A table of `{"n": ...}` messages the sink creates: `n long not null`, and
/// the optional `name` and `at` columns.
const CREATE: &str = r#"
        create_table = true
        columns = [
          { name = "n", type = "long", nullable = false },
          { name = "name", type = "string" },
          { name = "at", type = "timestamptz" },
        ]"#;

fn sink_config(key: &str, catalog: &str, extra: &str) -> String {
    format!(
        r#"
        type = "sink"
        key = "{key}"
        path = "libiggy_connector_iceberg_sink"
        [[streams]]
        stream = "shop"
        topics = ["orders"]
        schema = "json"
        batch_length = 100
        poll_interval = "5ms"
        [plugin_config]
        tables = ["shop.orders"]
        {catalog}
        max_messages_per_file = 300
        {extra}
        "#
    )
}

fn memory(warehouse: &std::path::Path) -> String {
    format!(
        "catalog_type = \"memory\"\nwarehouse = \"{}\"",
        warehouse.display()
    )
}

fn rest(server: &IcebergRest) -> String {
    format!("catalog_type = \"rest\"\nuri = \"{}\"", server.url())
}

fn group(key: &str) -> String {
    format!("iggy-connect-sink-{key}")
}

fn build(plugin_config: &Value) -> Result<Box<dyn Sink>, String> {
    let entry = Registry::sinks()
        .iter()
        .find(|entry| entry.name == "iceberg")
        .expect("the iceberg sink in this build");
    (entry.build)(plugin_config).map_err(|error| error.to_string())
}

/// The iceberg sink built from `plugin_config`, attached as `key` and opened.
async fn open_sink(key: &str, plugin_config: Value) -> Box<dyn Sink> {
    let mut sink = build(&plugin_config).unwrap();
    sink.attach(iggy_connect::connectors::ConnectorContext {
        key: key.to_owned(),
        ..Default::default()
    });
    sink.open().await.unwrap();
    sink
}

fn orders() -> TopicRef {
    TopicRef {
        stream: "shop".into(),
        topic: "orders".into(),
    }
}

/// A memory-catalog sink that creates `shop.orders` (`n long not null`).
fn created(warehouse: &std::path::Path) -> Value {
    json!({
        "tables": ["shop.orders"],
        "catalog_type": "memory",
        "warehouse": warehouse.display().to_string(),
        "create_table": true,
        "columns": [{"name": "n", "type": "long", "nullable": false}],
        "flush_interval": "0s",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_in_the_table_once_and_offsets_are_committed_only_with_the_snapshot_commit()
 {
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..1001).await;
    let warehouse = tempfile::tempdir().unwrap();
    let table = Table::at(warehouse.path(), "shop", "orders");
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = format!("{CREATE}\nflush_interval = \"0s\"");
    runtime
        .add(connector(&sink_config(
            "lake",
            &memory(warehouse.path()),
            &extra,
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("three full commits", LONG, || {
        iggy.stored_offset("shop", "orders", &group("lake"), 0) == Some(899)
    })
    .await;
    eventually("every message accepted", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "lake")
            .is_ok_and(|view| view.metrics.processed.get() >= 1000)
    })
    .await;
    // The last 100 are buffered, not in the table: not committed.
    assert_eq!(ns_once(&table.rows()), (1..=900).collect::<Vec<_>>());
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("lake"), 0),
        Some(899)
    );
    runtime.shutdown().await;

    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("lake"), 0),
        Some(999),
        "the stop committed the rest"
    );
    assert_eq!(ns_once(&table.rows()), (1..=1000).collect::<Vec<_>>());
    let snapshots = table.snapshots();
    // 3 full commits and the stop's, each a fast append with its offsets.
    assert_eq!(snapshots.len(), 4, "{snapshots:?}");
    let marks: Vec<&str> = snapshots
        .iter()
        .map(|snapshot| {
            assert_eq!(snapshot["operation"], "append");
            snapshot["properties"]["iggy-connect.lake.shop/orders/0"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(marks, ["299", "599", "899", "999"]);
    assert_eq!(
        table.columns(),
        [
            ("n".to_owned(), "long".to_owned()),
            ("name".to_owned(), "string".to_owned()),
            ("at".to_owned(), "timestamptz".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_read_again_after_a_crash_are_not_appended_twice() {
    let warehouse = tempfile::tempdir().unwrap();
    let table = Table::at(warehouse.path(), "shop", "orders");
    // A run that committed offsets 0..500 to the table, then died before
    // the consumer offset was committed.
    let first = open_sink("replay", created(warehouse.path())).await;
    first.write(&orders(), &ns_messages(0..500)).await.unwrap();
    first.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(first.durable(&orders()), [(0, 499)]);
    drop(first);

    // The next run (a new catalog, finding the table on disk) reads from an
    // older offset (300) again, and on.
    let second = open_sink("replay", created(warehouse.path())).await;
    second
        .write(&orders(), &ns_messages(300..700))
        .await
        .unwrap();
    second.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(second.durable(&orders()), [(0, 699)]);
    assert_eq!(ns_once(&table.rows()), (1..=700).collect::<Vec<_>>());

    // A replay of nothing new commits nothing and still reports it durable.
    let snapshots = table.snapshots().len();
    second
        .write(&orders(), &ns_messages(600..700))
        .await
        .unwrap();
    second.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(table.snapshots().len(), snapshots);
    assert_eq!(second.durable(&orders()), [(0, 699)]);

    // Another connector key is another writer: its rows are its own, and
    // its commit carries its marker next to the first key's.
    let other = open_sink("other", created(warehouse.path())).await;
    other.write(&orders(), &ns_messages(0..10)).await.unwrap();
    other.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(table.rows().len(), 710);
    assert_eq!(
        table
            .property("iggy-connect.other.shop/orders/0")
            .as_deref(),
        Some("9")
    );
    // The first key's marker is found further back in the ancestry.
    let third = open_sink("replay", created(warehouse.path())).await;
    third
        .write(&orders(), &ns_messages(650..700))
        .await
        .unwrap();
    third.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(table.rows().len(), 710);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connectors_writing_one_memory_warehouse_table_lose_none_of_each_others_commits() {
    let warehouse = tempfile::tempdir().unwrap();
    let table = Table::at(warehouse.path(), "shop", "orders");
    let one = open_sink("one", created(warehouse.path())).await;
    let two = open_sink("two", created(warehouse.path())).await;
    // Each catalog loaded the table before the other committed.
    one.write(&orders(), &ns_messages(0..10)).await.unwrap();
    one.flush(&orders(), Flush::All).await.unwrap();
    two.write(&orders(), &ns_messages(100..110)).await.unwrap();
    two.flush(&orders(), Flush::All).await.unwrap();
    one.write(&orders(), &ns_messages(10..20)).await.unwrap();
    one.flush(&orders(), Flush::All).await.unwrap();
    let expected: Vec<u64> = (1..=20).chain(101..=110).collect();
    assert_eq!(ns_once(&table.rows()), expected);
    assert_eq!(table.snapshots().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_that_do_not_fit_the_table_are_rejected_by_index_and_nothing_of_the_batch_is_taken()
 {
    let warehouse = tempfile::tempdir().unwrap();
    let mut config = created(warehouse.path());
    config["columns"] = json!([
        {"name": "n", "type": "long", "nullable": false},
        {"name": "at", "type": "timestamptz"},
        {"name": "label", "type": "string"},
    ]);
    let sink = open_sink("bad", config).await;
    let batch = [
        message(0, r#"{"n": 1, "at": "2026-12-02T10:00:00Z", "label": 7}"#),
        message(1, "not json"),
        message(2, r#"{"n": "three"}"#),
        message(3, r#"{"at": "2026-12-02T10:00:00Z"}"#),
        message(4, "[1, 2]"),
        message(5, r#"{"n": 6, "extra": "ignored"}"#),
        message(6, r#"{"n": 7}{"n": 8}"#),
    ];
    let error = sink.write(&orders(), &batch).await.unwrap_err();
    let SinkError::Rejected(rejections) = error else {
        panic!("expected rejections, got {error}");
    };
    let indexes: Vec<usize> = rejections.iter().map(|rejection| rejection.index).collect();
    assert_eq!(indexes, [1, 2, 3, 4, 6], "{rejections:?}");
    assert!(
        rejections[0].reason.contains("shop.orders"),
        "{rejections:?}"
    );
    sink.flush(&orders(), Flush::All).await.unwrap();
    assert!(sink.durable(&orders()).is_empty(), "nothing was taken");

    // The rest again, as the engine writes it after skipping the rejected.
    let rest = [batch[0].clone(), batch[5].clone()];
    sink.write(&orders(), &rest).await.unwrap();
    sink.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(sink.durable(&orders()), [(0, 5)]);
    let rows = Table::at(warehouse.path(), "shop", "orders").rows();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0]["label"], "7",
        "a number coerced to the string column"
    );
    assert!(
        rows[0]["at"]
            .as_str()
            .unwrap()
            .starts_with("2026-12-02 10:00:00"),
        "{}",
        rows[0]["at"]
    );
    assert_eq!(rows[1]["n"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_routing_writes_every_table_and_dynamic_routing_the_named_one_rejecting_the_rest() {
    let warehouse = tempfile::tempdir().unwrap();
    let mut config = created(warehouse.path());
    config["tables"] = json!(["shop.orders", "shop.audit"]);
    let sink = open_sink("static", config.clone()).await;
    sink.write(&orders(), &ns_messages(0..5)).await.unwrap();
    sink.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(sink.durable(&orders()), [(0, 4)]);
    for name in ["orders", "audit"] {
        let rows = Table::at(warehouse.path(), "shop", name).rows();
        assert_eq!(ns_once(&rows), [1, 2, 3, 4, 5], "{name}");
    }

    config["dynamic_routing"] = json!(true);
    config["dynamic_route_field"] = json!("to");
    let sink = open_sink("dynamic", config).await;
    let batch = [
        message(0, r#"{"n": 10, "to": "shop.orders"}"#),
        message(1, r#"{"n": 11, "to": "shop.audit"}"#),
        message(2, r#"{"n": 12}"#),
        message(3, r#"{"n": 13, "to": "shop.nowhere"}"#),
        message(4, r#"{"n": 14, "to": 5}"#),
        message(5, "not json"),
    ];
    let Err(SinkError::Rejected(rejections)) = sink.write(&orders(), &batch).await else {
        panic!("expected rejections");
    };
    let indexes: Vec<usize> = rejections.iter().map(|rejection| rejection.index).collect();
    assert_eq!(indexes, [2, 3, 4, 5], "{rejections:?}");
    assert!(
        rejections[1].reason.contains("shop.nowhere"),
        "{rejections:?}"
    );
    sink.write(&orders(), &batch[..2]).await.unwrap();
    sink.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(sink.durable(&orders()), [(0, 1)]);
    let orders_rows = Table::at(warehouse.path(), "shop", "orders").rows();
    let audit_rows = Table::at(warehouse.path(), "shop", "audit").rows();
    assert_eq!(ns_once(&orders_rows), [1, 2, 3, 4, 5, 10]);
    assert_eq!(ns_once(&audit_rows), [1, 2, 3, 4, 5, 11]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_skipped_by_the_pipeline_and_counted_and_the_rest_lands() {
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    let client = iggy_client(&iggy).await;
    // Every 50th `n` is not a number: it does not fit the `long` column.
    produce(&client, "shop", "orders", 1..201, |n| {
        if n % 50 == 0 {
            "{\"n\": \"not a number\"}".to_owned()
        } else {
            json!({ "n": n as u64 }).to_string()
        }
    })
    .await;
    let warehouse = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let text = sink_config(
        "skip",
        &memory(warehouse.path()),
        &format!("{CREATE}\nflush_interval = \"50ms\""),
    )
    .replace("[[streams]]", "on_error = \"skip\"\n[[streams]]");
    runtime.add(connector(&text)).unwrap();
    runtime.start_enabled().await;
    wait_for("everything committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("skip"), 0) == Some(199)
    })
    .await;
    let view = runtime.view(ConnectorKind::Sink, "skip").unwrap();
    assert_eq!(view.status.status, Status::Running);
    assert_eq!(view.metrics.skipped.get(), 4, "the 4 bad messages counted");
    runtime.shutdown().await;
    let expected: Vec<u64> = (1..=200).filter(|n| n % 50 != 0).collect();
    let rows = Table::at(warehouse.path(), "shop", "orders").rows();
    assert_eq!(ns_once(&rows), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_different_columns_or_a_partitioned_table_stop_the_sink_naming_the_field() {
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    let catalog = IcebergRest::start().await;
    catalog
        .create(
            "shop",
            "orders",
            // CREATE's columns, but `n` a string.
            json!({"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "n", "required": false, "type": "string"},
                {"id": 2, "name": "name", "required": false, "type": "string"},
                {"id": 3, "name": "at", "required": false, "type": "timestamptz"},
            ]}),
        )
        .await;
    catalog
        .create_with(
            "shop",
            "parted",
            json!({
                "schema": {"type": "struct", "schema-id": 0, "fields": [
                    {"id": 1, "name": "n", "required": false, "type": "long"}
                ]},
                "partition-spec": {"fields": [
                    {"source-id": 1, "field-id": 1000, "name": "n", "transform": "identity"}
                ]},
            }),
        )
        .await;
    let warehouse = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config(
            "missing",
            &memory(warehouse.path()),
            "",
        )))
        .unwrap();
    runtime
        .add(connector(&sink_config("columns", &rest(&catalog), CREATE)))
        .unwrap();
    let parted = sink_config("parted", &rest(&catalog), "")
        .replace(r#"tables = ["shop.orders"]"#, r#"tables = ["shop.parted"]"#);
    runtime.add(connector(&parted)).unwrap();
    runtime.start_enabled().await;
    for (key, field) in [
        ("missing", "tables:"),
        ("columns", "columns: \"n\" is string"),
        ("parted", "tables: shop.parted is partitioned"),
    ] {
        eventually("the sink to fail", LONG, async || {
            runtime
                .view(ConnectorKind::Sink, key)
                .is_ok_and(|view| view.status.last_error.is_some())
        })
        .await;
        let view = runtime.view(ConnectorKind::Sink, key).unwrap();
        let error = view.status.last_error.clone().unwrap().message;
        assert!(error.contains(field), "{key}: {error}");
        assert_ne!(view.status.status, Status::Running, "{key}");
    }
    runtime.shutdown().await;
    assert!(
        !warehouse.path().join("shop/orders").exists(),
        "no table was made"
    );
    assert_eq!(catalog.commits().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_refusing_the_client_stops_the_sink_naming_uri() {
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    let catalog = IcebergRest::start().await;
    catalog.refuse_clients();
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("refused", &rest(&catalog), CREATE)))
        .unwrap();
    runtime.start_enabled().await;
    eventually("the sink to fail", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "refused")
            .is_ok_and(|view| view.status.last_error.is_some())
    })
    .await;
    let view = runtime.view(ConnectorKind::Sink, "refused").unwrap();
    let error = view.status.last_error.clone().unwrap().message;
    assert!(error.contains("uri: the catalog refused"), "{error}");
    eventually("the sink stopped, not retrying", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "refused")
            .is_ok_and(|view| view.status.status == Status::Error)
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_rest_catalog_conflicts_and_outages_are_retried_and_nothing_is_lost_or_repeated()
{
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    let catalog = IcebergRest::start().await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = format!("{CREATE}\nflush_interval = \"0s\"");
    runtime
        .add(connector(&sink_config("restlake", &rest(&catalog), &extra)))
        .unwrap();
    runtime.start_enabled().await;
    eventually("the sink running", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "restlake")
            .is_ok_and(|view| view.status.status == Status::Running)
    })
    .await;
    // An outage: nothing is committed meanwhile, the engine retries.
    catalog.set_down(true);
    // Then stale-requirement conflicts, returned to the engine, whose
    // retries read the table again.
    catalog.fail_commits(2, 409).await;
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..601).await;
    eventually("the flush retried by the engine", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "restlake")
            .is_ok_and(|view| view.metrics.retries.get() >= 2)
    })
    .await;
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("restlake"), 0),
        None,
        "nothing committed while the catalog is down"
    );
    catalog.set_down(false);
    wait_for("everything committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("restlake"), 0) == Some(599)
    })
    .await;
    runtime.shutdown().await;
    let table = Table::at(catalog.warehouse(), "shop", "orders");
    assert_eq!(ns_once(&table.rows()), (1..=600).collect::<Vec<_>>());
    assert_eq!(
        table
            .property("iggy-connect.restlake.shop/orders/0")
            .as_deref(),
        Some("599")
    );
    assert_eq!(catalog.commits().await, 2, "two full commits, none twice");
    assert_eq!(catalog.faults_left().await, 0, "the conflicts were met");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_slower_than_commit_timeout_is_retried_and_appends_nothing_twice() {
    let catalog = IcebergRest::start().await;
    let config = json!({
        "tables": ["shop.orders"],
        "catalog_type": "rest",
        "uri": catalog.url(),
        "create_table": true,
        "columns": [{"name": "n", "type": "long", "nullable": false}],
        "commit_timeout": "1s",
    });
    let sink = open_sink("slow", config).await;
    // The first commit is held longer than the sink waits: the sink gives
    // up, the catalog applies it later. The retry's commit is held so that
    // the first one lands after the retry read the table and before the
    // catalog checks the retry's requirements: a conflict.
    catalog.stall_commits(1, Duration::from_millis(1500)).await;
    catalog.stall_commits(1, Duration::from_millis(800)).await;
    sink.write(&orders(), &ns_messages(0..100)).await.unwrap();
    let error = sink.flush(&orders(), Flush::All).await.unwrap_err();
    assert!(
        matches!(&error, SinkError::Transient { .. })
            && error.to_string().contains("commit_timeout"),
        "{error}"
    );
    assert!(sink.durable(&orders()).is_empty());
    // The engine's retries, until one succeeds.
    let deadline = std::time::Instant::now() + LONG;
    while let Err(error) = sink.flush(&orders(), Flush::All).await {
        assert!(matches!(error, SinkError::Transient { .. }), "{error}");
        assert!(
            std::time::Instant::now() < deadline,
            "still failing: {error}"
        );
    }
    assert_eq!(sink.durable(&orders()), [(0, 99)]);
    eventually("the held commits answered", LONG, async || {
        catalog.stalls_left().await == 0
    })
    .await;
    assert_eq!(
        catalog.commits().await,
        1,
        "one commit landed, the rest saw it"
    );
    let table = Table::at(catalog.warehouse(), "shop", "orders");
    assert_eq!(ns_once(&table.rows()), (1..=100).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_example_file_runs_against_the_rest_catalog_test_server() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/iceberg_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's iceberg_sink.toml");
    let catalog = IcebergRest::start().await;
    // Upstream's sink needs the table to exist.
    catalog
        .create(
            "test",
            "messages",
            json!({"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "n", "required": false, "type": "long"}
            ]}),
        )
        .await;
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("http://localhost:8181", catalog.url());
    let (config, _) = iggy_connect::config::connector::parse_connector_file(
        &path,
        &text,
        &iggy_connect::config::env::EnvVars::from_pairs([]),
    )
    .unwrap();
    let bus = iggy_connect::iggy::MemoryBus::new();
    support::sinks::send(
        &bus,
        "test_stream",
        "test_topic",
        1,
        (1..=5u64).map(|n| json!({ "n": n }).to_string()),
    )
    .await;
    let runtime = iggy_connect::engine::Runtime::new(
        std::sync::Arc::new(bus.clone()),
        std::sync::Arc::new(iggy_connect::state::MemoryStateStore::new()),
        Duration::from_secs(5),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually("the five accepted", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "iceberg")
            .is_ok_and(|view| view.metrics.processed.get() >= 5)
    })
    .await;
    // Upstream's file sets no flush trigger: the default flush_interval (10s)
    // or, here, the stop commits them.
    runtime.shutdown().await;
    assert_eq!(
        bus.committed_offset("test_stream", "test_topic", "iceberg_sink_connector", 0),
        Some(4)
    );
    let table = Table::at(catalog.warehouse(), "test", "messages");
    assert_eq!(ns_once(&table.rows()), [1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_example_file_writes_a_table_on_s3_through_its_store_settings() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/iceberg_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's iceberg_sink.toml");
    let (s3, catalog) = (S3Server::start().await, IcebergRest::start().await);
    s3.create_bucket("lake").await;
    // The table's files on S3 (its metadata files stay with the catalog).
    catalog
        .create_at(
            "test",
            "messages",
            json!({"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "n", "required": false, "type": "long"}
            ]}),
            Some("s3://lake/warehouse/test/messages"),
        )
        .await;
    // Upstream's endpoints, pointed at the test servers; its keys as they are.
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("http://localhost:8181", catalog.url())
        .replace("http://localhost:9000", s3.endpoint());
    let (config, _) = iggy_connect::config::connector::parse_connector_file(
        &path,
        &text,
        &iggy_connect::config::env::EnvVars::from_pairs([]),
    )
    .unwrap();
    let bus = iggy_connect::iggy::MemoryBus::new();
    support::sinks::send(
        &bus,
        "test_stream",
        "test_topic",
        1,
        (1..=5u64).map(|n| json!({ "n": n }).to_string()),
    )
    .await;
    let runtime = iggy_connect::engine::Runtime::new(
        std::sync::Arc::new(bus.clone()),
        std::sync::Arc::new(iggy_connect::state::MemoryStateStore::new()),
        Duration::from_secs(5),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually("the five accepted", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "iceberg")
            .is_ok_and(|view| view.metrics.processed.get() >= 5)
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(
        bus.committed_offset("test_stream", "test_topic", "iceberg_sink_connector", 0),
        Some(4)
    );
    let keys: Vec<String> = s3.objects("lake").into_iter().map(|(key, _)| key).collect();
    assert!(
        keys.iter().any(
            |key| key.starts_with("warehouse/test/messages/data/") && key.ends_with(".parquet")
        ),
        "{keys:?}"
    );
    assert!(
        keys.iter()
            .any(|key| key.starts_with("warehouse/test/messages/metadata/snap-")),
        "the manifest list on S3: {keys:?}"
    );
    let table = Table::at(catalog.warehouse(), "test", "messages").on_s3(s3.endpoint());
    assert_eq!(ns_once(&table.rows()), [1, 2, 3, 4, 5]);
}

/// The number of metadata files of the memory-catalog table at `dir`: one
/// more per commit.
fn metadata_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("metadata"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| {
                    entry
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".metadata.json")
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_killed_repeatedly_mid_stream_leaves_every_message_in_the_table_exactly_once() {
    const MESSAGES: u64 = 3000;
    const KILLS: usize = 5;
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    produce_ns(
        &iggy_client(&iggy).await,
        "shop",
        "orders",
        1..u128::from(MESSAGES) + 1,
    )
    .await;
    let warehouse = tempfile::tempdir().unwrap();
    let table = Table::at(warehouse.path(), "shop", "orders");
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    // Small batches and files: many commits, so kills land between a
    // snapshot commit and its offset commit.
    let text = sink_config(
        "killed",
        &memory(warehouse.path()),
        &format!("{CREATE}\nflush_interval = \"0s\""),
    )
    .replace("type = \"sink\"", "type = \"sink\"\nenabled = true")
    .replace("batch_length = 100", "batch_length = 10")
    .replace("max_messages_per_file = 300", "max_messages_per_file = 40");
    workspace.add_connector("iceberg.toml", &text);
    // First a certain crash between the snapshot commits and their offsets:
    // Iggy refuses every offset store, the binary dies after a commit (the
    // table's creation is the first metadata file, the commit the second).
    iggy.faults().refuse_offset_stores_until_cleared();
    let mut running = workspace.run();
    wait_for("a commit", LONG, || metadata_files(&table.dir) >= 2).await;
    running.kill();
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("killed"), 0),
        None
    );
    iggy.faults().clear();
    running = workspace.run();
    // Then kills at random points.
    for _ in 0..KILLS {
        let before = metadata_files(&table.dir);
        wait_for("a commit since the last start", LONG, || {
            metadata_files(&table.dir) > before
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..60))).await;
        running.kill();
        running = workspace.run();
    }
    wait_for("every offset committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("killed"), 0) == Some(MESSAGES - 1)
    })
    .await;
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    assert_eq!(
        ns_once(&table.rows()),
        (1..=MESSAGES).collect::<Vec<_>>(),
        "every message, none twice"
    );
    let replays = workspace.stderr().matches("(a replay) left out").count();
    println!("scenario: iceberg kills={KILLS} messages={MESSAGES} replays_left_out={replays}");
    assert!(replays >= 1, "the first restart left rows out");
}
