//! The delta sink against real Delta tables (`deltalake-core` on temp
//! directories, and on moto's S3 API), with the engine consuming from the
//! in-process Iggy test server over the real `iggy` client. Tables are read
//! back with PyPI `deltalake` (`support::delta`), not the sink's library.
#![cfg(feature = "delta-sink")]

use std::time::Duration;

use iggy_connect::connectors::{ConnectorKind, Flush, Registry, Sink};
use iggy_connect::engine::Status;
use iggy_connect::message::TopicRef;
use serde_json::{Value, json};

use crate::support;
use crate::support::binary::Workspace;
use crate::support::delta::Table;
use crate::support::harness::{connector, iggy_client, produce, produce_ns, runtime};
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
          { name = "at", type = "timestamp" },
        ]"#;

fn sink_config(key: &str, table_uri: &str, extra: &str) -> String {
    format!(
        r#"
        type = "sink"
        key = "{key}"
        path = "libiggy_connector_delta_sink"
        [[streams]]
        stream = "shop"
        topics = ["orders"]
        schema = "json"
        batch_length = 100
        poll_interval = "5ms"
        [plugin_config]
        table_uri = "{table_uri}"
        max_messages_per_file = 300
        {extra}
        "#
    )
}

fn group(key: &str) -> String {
    format!("iggy-connect-sink-{key}")
}

/// The delta sink built from `plugin_config`, attached as `key` and opened.
async fn open_sink(key: &str, plugin_config: Value) -> Box<dyn Sink> {
    let entry = Registry::sinks()
        .iter()
        .find(|entry| entry.name == "delta")
        .expect("the delta sink in this build");
    let mut sink = (entry.build)(&plugin_config).unwrap();
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

fn created(dir: &std::path::Path) -> Value {
    json!({
        "table_uri": format!("file://{}", dir.display()),
        "create_table": true,
        "columns": [{"name": "n", "type": "long", "nullable": false}],
        "flush_interval": "0s",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_in_the_table_once_and_offsets_are_committed_only_with_the_delta_commit() {
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..1001).await;
    let dir = tempfile::tempdir().unwrap();
    let table = Table::local(&dir.path().join("orders"));
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = format!("{CREATE}\nflush_interval = \"0s\"");
    runtime
        .add(connector(&sink_config("lake", &table.uri, &extra)))
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
    assert_eq!(
        table.transaction_version("iggy-connect/lake/shop/orders/0"),
        Some(999)
    );
    let (version, columns) = table.version_and_columns();
    // Version 0 created the table; then 3 full commits and the stop's.
    assert_eq!(version, 4);
    assert_eq!(
        columns,
        [
            ("n".to_owned(), "long".to_owned()),
            ("name".to_owned(), "string".to_owned()),
            ("at".to_owned(), "timestamp".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_read_again_after_a_crash_are_not_appended_twice() {
    let dir = tempfile::tempdir().unwrap();
    let table = Table::local(dir.path());
    // A run that committed offsets 0..500 to the table, then died before
    // the consumer offset was committed.
    let first = open_sink("replay", created(dir.path())).await;
    first.write(&orders(), &ns_messages(0..500)).await.unwrap();
    first.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(first.durable(&orders()), [(0, 499)]);
    drop(first);

    // The next run reads from an older offset (300) again, and on.
    let second = open_sink("replay", created(dir.path())).await;
    second
        .write(&orders(), &ns_messages(300..700))
        .await
        .unwrap();
    second.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(second.durable(&orders()), [(0, 699)]);
    assert_eq!(ns_once(&table.rows()), (1..=700).collect::<Vec<_>>());

    // A replay of nothing new commits nothing and still reports it durable.
    let (version, _) = table.version_and_columns();
    second
        .write(&orders(), &ns_messages(600..700))
        .await
        .unwrap();
    second.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(table.version_and_columns().0, version);
    assert_eq!(second.durable(&orders()), [(0, 699)]);

    // Another connector key is another application: its rows are its own.
    let other = open_sink("other", created(dir.path())).await;
    other.write(&orders(), &ns_messages(0..10)).await.unwrap();
    other.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(table.rows().len(), 710);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_that_do_not_fit_the_table_are_rejected_by_index_and_nothing_of_the_batch_is_taken()
 {
    let dir = tempfile::tempdir().unwrap();
    let mut config = created(dir.path());
    config["columns"] = json!([
        {"name": "n", "type": "long", "nullable": false},
        {"name": "at", "type": "timestamp"},
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
    let iggy_connect::connectors::SinkError::Rejected(rejections) = error else {
        panic!("expected rejections, got {error}");
    };
    let indexes: Vec<usize> = rejections.iter().map(|rejection| rejection.index).collect();
    assert_eq!(indexes, [1, 2, 3, 4, 6], "{rejections:?}");
    sink.flush(&orders(), Flush::All).await.unwrap();
    assert!(sink.durable(&orders()).is_empty(), "nothing was taken");

    // The rest again, as the engine writes it after skipping the rejected.
    let rest = [batch[0].clone(), batch[5].clone()];
    sink.write(&orders(), &rest).await.unwrap();
    sink.flush(&orders(), Flush::All).await.unwrap();
    assert_eq!(sink.durable(&orders()), [(0, 5)]);
    let rows = Table::local(dir.path()).rows();
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
    let dir = tempfile::tempdir().unwrap();
    let table = Table::local(dir.path());
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let text = sink_config(
        "skip",
        &table.uri,
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
    assert_eq!(ns_once(&table.rows()), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_or_different_columns_stop_the_sink_naming_the_field() {
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    let dir = tempfile::tempdir().unwrap();
    let other = Table::local(&dir.path().join("other"));
    other.create(&[("n", "string")]);
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let missing = format!("file://{}", dir.path().join("missing").display());
    runtime
        .add(connector(&sink_config("missing", &missing, "")))
        .unwrap();
    runtime
        .add(connector(&sink_config("columns", &other.uri, CREATE)))
        .unwrap();
    runtime.start_enabled().await;
    for (key, field) in [("missing", "table_uri"), ("columns", "columns")] {
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
    assert!(!dir.path().join("missing").exists(), "no table was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_another_writer_created_is_appended_to() {
    let iggy = IggyTestServer::start();
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..251).await;
    let dir = tempfile::tempdir().unwrap();
    let table = Table::local(dir.path());
    table.create(&[("n", "int64"), ("note", "string")]);
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config(
            "append",
            &table.uri,
            "flush_interval = \"50ms\"",
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("everything committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("append"), 0) == Some(249)
    })
    .await;
    runtime.shutdown().await;
    let rows = table.rows();
    assert_eq!(ns_once(&rows), (1..=250).collect::<Vec<_>>());
    assert!(rows.iter().all(|row| row["note"].is_null()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_table_is_created_written_and_read_back_through_the_s3_api() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    s3.create_bucket("lake").await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..701).await;
    let table = Table::s3(s3.endpoint(), "lake/tables/orders");
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = format!(
        "{CREATE}\nflush_interval = \"0s\"\nstorage_backend_type = \"s3\"\n\
         aws_s3_access_key = \"test\"\naws_s3_secret_key = \"test\"\n\
         aws_s3_region = \"us-east-1\"\naws_s3_endpoint_url = \"{}\"\naws_s3_allow_http = true",
        s3.endpoint()
    );
    runtime
        .add(connector(&sink_config("s3lake", &table.uri, &extra)))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("two full commits", LONG, || {
        iggy.stored_offset("shop", "orders", &group("s3lake"), 0) == Some(599)
    })
    .await;
    // The last 100 are written by the shutdown's flush, once consumed.
    wait_for("the last messages consumed", LONG, || {
        runtime
            .view(ConnectorKind::Sink, "s3lake")
            .is_ok_and(|view| view.metrics.consumed.get() >= 700)
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("s3lake"), 0),
        Some(699)
    );
    assert_eq!(ns_once(&table.rows()), (1..=700).collect::<Vec<_>>());
    assert_eq!(
        table.transaction_version("iggy-connect/s3lake/shop/orders/0"),
        Some(699)
    );
    let keys: Vec<String> = s3.objects("lake").into_iter().map(|(key, _)| key).collect();
    assert!(
        keys.iter()
            .any(|key| key == "tables/orders/_delta_log/00000000000000000003.json"),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_outage_is_retried_commits_nothing_meanwhile_and_loses_nothing() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    s3.create_bucket("lake").await;
    iggy.create_topic("shop", "orders", 1);
    let table = Table::s3(s3.endpoint(), "lake/outage");
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = format!(
        "{CREATE}\nflush_interval = \"0s\"\n\
         aws_s3_access_key = \"test\"\naws_s3_secret_key = \"test\"\n\
         aws_s3_endpoint_url = \"{}\"\naws_s3_allow_http = true",
        s3.endpoint()
    );
    runtime
        .add(connector(&sink_config("outage", &table.uri, &extra)))
        .unwrap();
    runtime.start_enabled().await;
    eventually("the sink running", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "outage")
            .is_ok_and(|view| view.status.status == Status::Running)
    })
    .await;
    s3.set_down(true);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..601).await;
    eventually("the commit retried", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "outage")
            .is_ok_and(|view| view.metrics.retries.get() >= 2)
    })
    .await;
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("outage"), 0),
        None
    );
    s3.set_down(false);
    wait_for("everything committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("outage"), 0) == Some(599)
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(ns_once(&table.rows()), (1..=600).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_example_file_runs_against_a_table_made_by_another_writer() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/delta_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's delta_sink.toml");
    let dir = tempfile::tempdir().unwrap();
    let table = Table::local(dir.path());
    // Upstream's sink needs the table to exist.
    table.create(&[("n", "int64")]);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("file:///tmp/iggy_delta_table", &table.uri);
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
    wait_for("the five committed", LONG, || {
        bus.committed_offset("test_stream", "test_topic", "delta_sink_connector", 0) == Some(4)
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(ns_once(&table.rows()), [1, 2, 3, 4, 5]);
}

/// The number of commits in the table at `dir` (its creation included).
fn commits(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("_delta_log"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders");
    let table = Table::local(&path);
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    // Small batches and commits: many of them, so kills land between a
    // Delta commit and its offset commit.
    let text = sink_config(
        "killed",
        &table.uri,
        &format!("{CREATE}\nflush_interval = \"0s\""),
    )
    .replace("type = \"sink\"", "type = \"sink\"\nenabled = true")
    .replace("batch_length = 100", "batch_length = 10")
    .replace("max_messages_per_file = 300", "max_messages_per_file = 40");
    workspace.add_connector("delta.toml", &text);
    // First a certain crash between a Delta commit and its offsets: Iggy
    // refuses every offset store, the binary dies after a commit (version 0
    // is the table's creation, version 1 the first rows).
    iggy.faults().refuse_offset_stores_until_cleared();
    let mut running = workspace.run();
    wait_for("a commit", LONG, || commits(&path) >= 2).await;
    running.kill();
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("killed"), 0),
        None
    );
    iggy.faults().clear();
    running = workspace.run();
    // Then kills at random points.
    for _ in 0..KILLS {
        let before = commits(&path);
        wait_for("a commit since the last start", LONG, || {
            commits(&path) > before
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
    println!("scenario: delta kills={KILLS} messages={MESSAGES} replays_left_out={replays}");
    assert!(replays >= 1, "the first restart left rows out");
}
