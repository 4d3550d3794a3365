//! The clickhouse sink against a real ClickHouse (Debian's 18.16, one server
//! per test from `support::clickhouse`), and against the protocol test server
//! of the current HTTP interface for what 18.16 lacks (deduplication tokens,
//! RowBinaryWithDefaults, 400 answers with an exception-code header).
#![cfg(feature = "clickhouse-sink")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::{ConnectorError, Sink, SinkError};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{Payload, SinkMessage};
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

use crate::support;
use crate::support::clickhouse::ClickHouse;
use crate::support::clickhouse_http::{ClickHouseHttp, Fault};
use crate::support::proxy::Proxy;
use crate::support::sinks::{self, durable_and_rejected, rest, topic};
use crate::support::wait::eventually;

fn build(config: Value) -> Box<dyn Sink> {
    sinks::build("clickhouse", &config)
}

async fn open(config: Value) -> Box<dyn Sink> {
    sinks::open("clickhouse", &config).await
}

fn message(offset: u64, payload: Payload) -> SinkMessage {
    SinkMessage {
        id: u128::from(offset) + 1,
        offset,
        partition_id: 1,
        timestamp: 1_700_000_000_000_000,
        origin_timestamp: 1_700_000_000_000_000,
        checksum: 0,
        headers: Vec::new(),
        payload,
    }
}

fn json_messages(values: Vec<Value>) -> Vec<SinkMessage> {
    values
        .into_iter()
        .enumerate()
        .map(|(offset, value)| message(offset as u64, Payload::Json(value)))
        .collect()
}

fn rejected_indexes(error: SinkError) -> Vec<usize> {
    match error {
        SinkError::Rejected(rejections) => {
            let mut indexes: Vec<usize> = rejections.iter().map(|r| r.index).collect();
            indexes.sort();
            indexes
        }
        other => panic!("expected Rejected, got {other}"),
    }
}

/// As the engine does after a rejection: writes the batch without the rejected ones.
fn without(batch: &[SinkMessage], rejected: &[usize]) -> Vec<SinkMessage> {
    batch
        .iter()
        .enumerate()
        .filter(|(index, _)| !rejected.contains(index))
        .map(|(_, message)| message.clone())
        .collect()
}

async fn server_with_events() -> ClickHouse {
    let server = ClickHouse::start();
    server
        .query(
            "CREATE TABLE events (id UInt64, name String, n UInt64) ENGINE = MergeTree ORDER BY id",
        )
        .await;
    server
}

fn config(url: &str, extra: Value) -> Value {
    let mut config = json!({"url": url, "table": "events", "retry_delay": 0, "max_retries": 0});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    config
}

#[tokio::test]
async fn json_each_row_inserts_every_object_before_write_returns() {
    let server = server_with_events().await;
    let sink = open(config(&server.url(), json!({}))).await;
    let batch = json_messages(vec![
        json!({"id": 1, "name": "a", "n": 10}),
        json!({"id": 2, "name": "b", "n": 20}),
        json!({"id": 3, "name": "c"}),
    ]);
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(
        server
            .rows("SELECT id, name, n FROM events ORDER BY id")
            .await,
        vec![
            json!({"id": "1", "name": "a", "n": "10"}),
            json!({"id": "2", "name": "b", "n": "20"}),
            json!({"id": "3", "name": "c", "n": "0"}),
        ]
    );
}

#[tokio::test]
async fn rows_the_server_refuses_are_rejected_by_index_and_the_rest_is_reported_stored() {
    let server = server_with_events().await;
    let sink = open(config(&server.url(), json!({}))).await;
    let batch = json_messages(vec![
        json!({"id": 0, "name": "a", "n": 0}),
        json!({"id": 1, "name": "b", "n": "not a number"}),
        json!({"id": 2, "name": "c", "n": 2}),
        json!({"id": 3, "name": "d", "n": 3}),
        json!({"id": 4, "name": "e", "unknown": true}),
        json!({"id": 5, "name": "f", "n": 5}),
    ]);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 2, 3, 5], vec![1, 4]),
        "{error}"
    );
    let ids: Vec<Value> = server
        .rows("SELECT id FROM events ORDER BY id")
        .await
        .into_iter()
        .map(|row| row["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!("0"), json!("2"), json!("3"), json!("5")]);
}

#[tokio::test]
async fn payloads_that_are_not_json_objects_are_rejected_before_anything_is_sent() {
    let server = server_with_events().await;
    let sink = open(config(&server.url(), json!({}))).await;
    let batch = vec![
        message(0, Payload::Json(json!({"id": 1}))),
        message(1, Payload::Text("plain".into())),
        message(2, Payload::Json(json!([1, 2]))),
    ];
    let rejected = rejected_indexes(sink.write(&topic(), &batch).await.unwrap_err());
    assert_eq!(rejected, vec![1, 2]);
    assert_eq!(server.query("SELECT count() FROM events").await.trim(), "0");
}

#[tokio::test]
async fn row_binary_encodes_each_column_from_the_table_read_at_open() {
    let server = ClickHouse::start();
    server
        .query(
            "CREATE TABLE typed (u8 UInt8, i32 Int32, s String, f FixedString(4), x Float64, d Date, t DateTime, ns Nullable(String), a Array(UInt32), id UUID) ENGINE = MergeTree ORDER BY u8",
        )
        .await;
    let sink = open(config(
        &server.url(),
        json!({"table": "typed", "insert_format": "row_binary"}),
    ))
    .await;
    assert!(!sink.accepts_json_bytes(), "row_binary reads the fields");
    let batch = json_messages(vec![
        json!({"u8": 7, "i32": -5, "s": "hé", "f": "ab", "x": 1.5, "d": "2024-05-01",
               "t": "2024-05-01T12:30:00Z", "ns": null, "a": [1, 2],
               "id": "00112233-4455-6677-8899-aabbccddeeff"}),
        json!({"u8": 8, "i32": 1, "s": "", "f": "abcd", "x": 0, "d": 1, "t": 0, "ns": "set",
               "a": [], "id": "ffffffff-0000-0000-0000-000000000001"}),
    ]);
    sink.write(&topic(), &batch).await.unwrap();
    let rows = server
        .rows("SELECT u8, i32, s, hex(f) AS f, x, toString(d) AS d, toUnixTimestamp(t) AS t, ns, a, toString(id) AS id FROM typed ORDER BY u8")
        .await;
    assert_eq!(
        rows,
        vec![
            json!({"u8": 7, "i32": -5, "s": "hé", "f": "61620000", "x": 1.5, "d": "2024-05-01",
                   "t": 1_714_566_600, "ns": null, "a": [1, 2],
                   "id": "00112233-4455-6677-8899-aabbccddeeff"}),
            json!({"u8": 8, "i32": 1, "s": "", "f": "61626364", "x": 0, "d": "1970-01-02", "t": 0,
                   "ns": "set", "a": [], "id": "ffffffff-0000-0000-0000-000000000001"}),
        ]
    );
}

#[tokio::test]
async fn row_binary_rejects_a_value_that_does_not_fit_and_writes_the_rest() {
    let server = ClickHouse::start();
    server
        .query("CREATE TABLE small (k UInt8, s String) ENGINE = MergeTree ORDER BY k")
        .await;
    let sink = open(config(
        &server.url(),
        json!({"table": "small", "insert_format": "row_binary"}),
    ))
    .await;
    let batch = json_messages(vec![
        json!({"k": 1, "s": "a"}),
        json!({"k": 300, "s": "b"}),
        json!({"k": 3}),
    ]);
    let SinkError::Rejected(rejections) = sink.write(&topic(), &batch).await.unwrap_err() else {
        panic!("expected Rejected");
    };
    assert_eq!(rejections.len(), 1);
    assert_eq!(rejections[0].index, 1);
    assert!(
        rejections[0].reason.contains("`k`"),
        "{}",
        rejections[0].reason
    );
    sink.write(&topic(), &without(&batch, &[1])).await.unwrap();
    assert_eq!(
        server.rows("SELECT k, s FROM small ORDER BY k").await,
        vec![json!({"k": 1, "s": "a"}), json!({"k": 3, "s": ""})]
    );
}

#[tokio::test]
async fn row_binary_fails_at_open_on_a_column_type_it_cannot_encode() {
    let server = ClickHouse::start();
    server
        .query("CREATE TABLE money (id UInt64, price Decimal(9, 2)) ENGINE = MergeTree ORDER BY id")
        .await;
    let mut sink = build(config(
        &server.url(),
        json!({"table": "money", "insert_format": "row_binary"}),
    ));
    let error = sink.open().await.unwrap_err().to_string();
    assert!(
        error.contains("`price`") && error.contains("Decimal(9, 2)"),
        "{error}"
    );
}

#[tokio::test]
async fn string_format_sends_text_payloads_as_csv_and_tsv_lines() {
    let server = server_with_events().await;
    let csv = open(config(
        &server.url(),
        json!({"insert_format": "string", "string_format": "csv"}),
    ))
    .await;
    let batch = vec![
        message(0, Payload::Text("1,\"a,b\",10".into())),
        message(1, Payload::Text("2,c,x".into())),
        message(2, Payload::Text("3,d,30\n".into())),
    ];
    let error = csv.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 2], vec![1]),
        "the row CSV cannot parse is refused, the rest stored: {error}"
    );
    let tsv = open(config(
        &server.url(),
        json!({"insert_format": "string", "string_format": "tsv"}),
    ))
    .await;
    let batch = vec![message(10, Payload::Text("4\te\t40".into()))];
    tsv.write(&topic(), &batch).await.unwrap();
    assert_eq!(
        server
            .rows("SELECT id, name, n FROM events ORDER BY id")
            .await,
        vec![
            json!({"id": "1", "name": "a,b", "n": "10"}),
            json!({"id": "3", "name": "d", "n": "30"}),
            json!({"id": "4", "name": "e", "n": "40"}),
        ]
    );
}

#[tokio::test]
async fn open_is_fatal_naming_the_field_on_a_missing_table_or_a_wrong_password() {
    let server = server_with_events().await;
    let mut sink = build(config(&server.url(), json!({"table": "nowhere"})));
    let error = sink.open().await.unwrap_err();
    assert!(!error.is_transient());
    assert!(error.to_string().contains("plugin_config.table"), "{error}");
    let mut sink = build(config(
        &server.url(),
        json!({"username": "iggy", "password": "wrong"}),
    ));
    let error = sink.open().await.unwrap_err();
    assert!(!error.is_transient());
    assert!(
        error.to_string().contains("plugin_config.password"),
        "{error}"
    );
    let mut sink = build(config(
        &server.url(),
        json!({"username": "iggy", "password": "secret"}),
    ));
    sink.open().await.unwrap();
}

#[tokio::test]
async fn open_against_a_server_that_cannot_be_reached_is_transient() {
    let server = server_with_events().await;
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port).parse().unwrap()).await;
    proxy.set_down(true);
    let mut sink = build(config(&proxy.url(), json!({})));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error}");
    proxy.set_down(false);
    // The engine opens a fresh instance.
    build(config(&proxy.url(), json!({}))).open().await.unwrap();
}

#[tokio::test]
async fn a_server_that_cannot_be_reached_is_transient_and_the_retried_batch_lands() {
    let server = server_with_events().await;
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port).parse().unwrap()).await;
    let sink = open(config(&proxy.url(), json!({}))).await;
    let batch = json_messages(vec![json!({"id": 1}), json!({"id": 2})]);
    proxy.set_down(true);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert!(matches!(error, SinkError::Transient { .. }), "{error}");
    proxy.set_down(false);
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(server.query("SELECT count() FROM events").await.trim(), "2");
}

/// Upstream's example connector file, unchanged but for its URL, run by the
/// runtime against the real server.
#[tokio::test]
async fn upstreams_example_file_runs_against_the_server() {
    let server = server_with_events().await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/clickhouse_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's clickhouse_sink.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replace("http://localhost:8123", &server.url());
    let (config, _) = parse_connector_file(&path, &text, &EnvVars::from_pairs([])).unwrap();
    let bus = MemoryBus::new();
    support::sinks::send(
        &bus,
        "example_stream",
        "example_topic",
        1,
        (1..=5u64).map(|id| serde_json::to_vec(&json!({"id": id, "name": "x", "n": 1})).unwrap()),
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
        "the example's batch is committed",
        Duration::from_secs(30),
        async || {
            bus.is_drained(
                "example_stream",
                "example_topic",
                "clickhouse_sink_connector",
            )
        },
    )
    .await;
    assert_eq!(server.query("SELECT count() FROM events").await.trim(), "5");
    runtime.shutdown().await;
}

const EVENTS_COLUMNS: &str = "id\tUInt64\t\nname\tString\t\nn\tUInt64\tDEFAULT\n";

#[tokio::test]
async fn a_current_server_gets_a_deduplication_token_so_a_replayed_batch_is_stored_once() {
    let server = ClickHouseHttp::start(EVENTS_COLUMNS).await;
    let sink = open(config(&server.url, json!({}))).await;
    let batch = json_messages(vec![json!({"id": 1}), json!({"id": 2})]);
    sink.write(&topic(), &batch).await.unwrap();
    sink.write(&topic(), &batch).await.unwrap();
    let requests = server.insert_requests();
    assert_eq!(requests.len(), 2);
    let token = requests[0]["insert_deduplication_token"].clone();
    assert_eq!(requests[1]["insert_deduplication_token"], token);
    assert_eq!(requests[0]["input_format_parallel_parsing"], "0");
    assert_eq!(server.lines(), vec![json!({"id": 1}), json!({"id": 2})]);
}

/// Each write sends the insert once; the engine's retries of a lost answer
/// and of a busy server carry the same token, so the row is stored once.
#[tokio::test]
async fn an_insert_whose_answer_was_lost_is_retried_with_the_same_token() {
    let server = ClickHouseHttp::start(EVENTS_COLUMNS).await;
    server.fail_next(&[Fault::LostAnswer, Fault::TooManyParts]);
    let sink = open(config(&server.url, json!({}))).await;
    let batch = json_messages(vec![json!({"id": 1})]);
    for attempt in 1..=2 {
        let error = sink.write(&topic(), &batch).await.unwrap_err();
        assert!(matches!(error, SinkError::Transient { .. }), "{error}");
        assert_eq!(
            server.insert_requests().len(),
            attempt,
            "one request per write"
        );
    }
    sink.write(&topic(), &batch).await.unwrap();
    let tokens: Vec<String> = server
        .insert_requests()
        .iter()
        .map(|request| request["insert_deduplication_token"].clone())
        .collect();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|token| *token == tokens[0]), "{tokens:?}");
    assert_eq!(server.lines(), vec![json!({"id": 1})]);
}

#[tokio::test]
async fn refusals_that_name_no_row_are_isolated_by_bisection() {
    let server = ClickHouseHttp::start(EVENTS_COLUMNS).await;
    server.hide_rows();
    let sink = open(config(&server.url, json!({}))).await;
    let mut values: Vec<Value> = (0..8).map(|id| json!({"id": id})).collect();
    values[2]["poison"] = json!(true);
    values[5]["poison"] = json!(true);
    let batch = json_messages(values);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 1, 3, 4, 6, 7], vec![2, 5]),
        "the rest was stored while isolating: {error}"
    );
    let mut ids: Vec<u64> = server
        .lines()
        .iter()
        .map(|line| line["id"].as_u64().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec![0, 1, 3, 4, 6, 7]);
}

#[tokio::test]
async fn row_binary_with_defaults_marks_missing_fields_for_the_server_default() {
    let server = ClickHouseHttp::start(EVENTS_COLUMNS).await;
    let sink = open(config(&server.url, json!({"insert_format": "row_binary"}))).await;
    let batch = json_messages(vec![json!({"id": 1, "name": "a"})]);
    sink.write(&topic(), &batch).await.unwrap();
    let stored = server.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].format, "RowBinaryWithDefaults");
    let mut wanted = vec![0u8];
    wanted.extend(1u64.to_le_bytes());
    wanted.extend([0, 1, b'a']);
    wanted.push(1);
    assert_eq!(stored[0].body.as_ref(), wanted.as_slice());
}

#[tokio::test]
async fn a_503_with_retry_after_is_one_request_and_transient_with_the_wait() {
    let server = ClickHouseHttp::start(EVENTS_COLUMNS).await;
    server.fail_next(&[Fault::UnavailableFor(7)]);
    let sink = open(config(&server.url, json!({"max_retries": 5}))).await;
    let batch = json_messages(vec![json!({"id": 1})]);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert!(
        matches!(
            error,
            SinkError::Transient {
                retry_after: Some(wait),
                ..
            } if wait == Duration::from_secs(7)
        ),
        "{error:?}"
    );
    assert_eq!(server.insert_requests().len(), 1, "no retry inside write");
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(server.lines(), vec![json!({"id": 1})]);
}

/// Isolating a refusal that names no row: the half stored before the
/// server failed is durable, the rest transient; the engine's write of the
/// rest finishes the batch.
#[tokio::test]
async fn inserts_stored_before_a_failure_are_reported_durable() {
    let server = ClickHouseHttp::start(EVENTS_COLUMNS).await;
    server.hide_rows();
    server.fail_next(&[Fault::Pass, Fault::Pass, Fault::Unavailable]);
    let sink = open(config(&server.url, json!({}))).await;
    let mut values: Vec<Value> = (0..4).map(|id| json!({"id": id})).collect();
    values[3]["poison"] = json!(true);
    let batch = json_messages(values);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 1], vec![]),
        "{error}"
    );
    assert!(
        matches!(rest(&error), SinkError::Transient { .. }),
        "{error}"
    );
    let error = sink
        .write(&topic(), &without(&batch, &[0, 1]))
        .await
        .unwrap_err();
    assert_eq!(durable_and_rejected(&error), (vec![0], vec![1]), "{error}");
    let ids: Vec<u64> = server
        .lines()
        .iter()
        .map(|line| line["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![0, 1, 2]);
}
