//! The influxdb sink against a real InfluxDB 1.6 (Debian's, one server per
//! test from `support::influxdb`) for `version = "v1"`, and against the
//! protocol test server of `support::influxdb_http` for v2 and v3.
#![cfg(feature = "influxdb-sink")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::{ConnectorError, Sink, SinkError};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{Payload, SinkMessage, TopicRef};
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

use crate::support;
use crate::support::influxdb::InfluxDb;
use crate::support::influxdb_http::{Fault, InfluxHttp};
use crate::support::sinks::{self, durable_and_rejected, rest, topic};
use crate::support::wait::eventually;

fn build(config: Value) -> Box<dyn Sink> {
    sinks::build("influxdb", &config)
}

async fn open(config: Value) -> Box<dyn Sink> {
    sinks::open("influxdb", &config).await
}

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

fn json_batch(count: u64) -> Vec<SinkMessage> {
    (0..count)
        .map(|n| message(n, Payload::Json(json!({"n": n}))))
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

fn without(batch: &[SinkMessage], rejected: &[usize]) -> Vec<SinkMessage> {
    batch
        .iter()
        .enumerate()
        .filter(|(index, _)| !rejected.contains(index))
        .map(|(_, message)| message.clone())
        .collect()
}

fn merged(mut config: Value, extra: Value) -> Value {
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    config
}

async fn v1_server() -> InfluxDb {
    let server = InfluxDb::start();
    server.query("", "CREATE DATABASE db1").await;
    server
}

fn v1(server: &InfluxDb, extra: Value) -> Value {
    merged(
        json!({"version": "v1", "url": server.url(), "db": "db1", "retry_delay": "1ms", "max_retries": 0, "max_open_retries": 0}),
        extra,
    )
}

#[tokio::test]
async fn v1_points_carry_upstreams_tags_and_fields_and_the_escaping_round_trips() {
    let server = v1_server().await;
    let sink = open(v1(
        &server,
        json!({"measurement": "odd name,x=1", "payload_format": "text"}),
    ))
    .await;
    let awkward = TopicRef {
        stream: "a stream,with=signs".into(),
        topic: "t\\1".into(),
    };
    let text = "say \"hi\" \\ then, = a\nsecond line";
    sink.write(&awkward, &[message(5, Payload::Text(text.into()))])
        .await
        .unwrap();
    let rows = server.rows("db1", r#"SELECT * FROM "odd name,x=1""#).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["stream"], json!("a stream,with=signs"));
    assert_eq!(row["topic"], json!("t\\1"));
    assert_eq!(row["partition"], json!("1"));
    assert_eq!(row["offset"], json!("5"));
    assert_eq!(row["message_id"], json!("105"));
    assert_eq!(row["payload_text"], json!(text));
    assert_eq!(row["iggy_checksum"], json!(5));
    assert_eq!(row["time"], json!(1_700_000_000_000_005u64));
}

#[tokio::test]
async fn v1_a_replayed_batch_overwrites_its_points() {
    let server = v1_server().await;
    let sink = open(v1(&server, json!({"batch_size": 3}))).await;
    let batch = json_batch(7);
    sink.write(&topic(), &batch).await.unwrap();
    sink.write(&topic(), &batch).await.unwrap();
    let rows = server
        .rows("db1", "SELECT payload_json FROM iggy_messages")
        .await;
    let payloads: Vec<Value> = rows.iter().map(|row| row["payload_json"].clone()).collect();
    assert_eq!(payloads.len(), 7, "{payloads:?}");
    assert_eq!(payloads[3], json!("{\"n\":3}"));
}

/// `offset_placement = "timestamp"` with the nanosecond precision it needs.
fn in_time() -> Value {
    json!({"offset_placement": "timestamp", "precision": "ns"})
}

/// 1.6 with `max-values-per-tag` at 1000 (100,000 by default: the same
/// limit, reached sooner). 1.6 counts a tag's values before each request:
/// the one that passes the limit is written, those after it are refused.
async fn v1_server_with_1000_values_per_tag() -> InfluxDb {
    let server = InfluxDb::start_with("  max-values-per-tag = 1000");
    server.query("", "CREATE DATABASE db1").await;
    server
}

/// `count` messages of partition 1, in runs of `run` sharing one timestamp
/// (the Iggy server stamps an appended batch with one timestamp).
fn runs(count: u64, run: u64) -> Vec<SinkMessage> {
    (0..count)
        .map(|n| SinkMessage {
            timestamp: 1_700_000_000_000_000 + n / run,
            ..message(n, Payload::Json(json!({"n": n})))
        })
        .collect()
}

async fn stored(server: &InfluxDb) -> u64 {
    let answer = server
        .query("db1", "SELECT COUNT(payload_json) FROM iggy_messages")
        .await;
    answer["results"][0]["series"][0]["values"][0][1]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test]
async fn v1_offset_in_the_timestamp_writes_past_max_values_per_tag() {
    let server = v1_server_with_1000_values_per_tag().await;
    let sink = open(v1(&server, merged(in_time(), json!({"batch_size": 500})))).await;
    sink.write(&topic(), &runs(3000, 500)).await.unwrap();
    assert_eq!(stored(&server).await, 3000);
    let series = server.query("db1", "SHOW SERIES FROM iggy_messages").await;
    let series = series["results"][0]["series"][0]["values"]
        .as_array()
        .unwrap();
    assert_eq!(series.len(), 1, "one series per partition: {series:?}");
}

/// What `offset_placement = "timestamp"` fixes: with the offset as a tag,
/// the server refuses every offset past its `max-values-per-tag`.
#[tokio::test]
async fn v1_offset_as_a_tag_is_refused_past_max_values_per_tag() {
    let server = v1_server_with_1000_values_per_tag().await;
    let sink = open(v1(&server, json!({"batch_size": 500}))).await;
    let error = sink.write(&topic(), &runs(1200, 500)).await.unwrap_err();
    let SinkError::Partial(partial) = &error else {
        panic!("expected Partial, got {error}");
    };
    assert!(
        partial.rejected[0].reason.contains("max-values-per-tag"),
        "{}",
        partial.rejected[0].reason
    );
    assert_eq!(
        durable_and_rejected(&error),
        ((0..1000).collect(), (1000..1200).collect()),
        "the first two requests are stored, the third dropped whole"
    );
    assert_eq!(stored(&server).await, 1000);
}

#[tokio::test]
async fn v1_offset_in_the_timestamp_a_replayed_batch_overwrites_its_points() {
    let server = v1_server().await;
    let sink = open(v1(&server, merged(in_time(), json!({"batch_size": 300})))).await;
    let batch = runs(2000, 700);
    sink.write(&topic(), &batch).await.unwrap();
    sink.write(&topic(), &batch[500..1500]).await.unwrap();
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(stored(&server).await, 2000);
    let rows = server
        .rows_epoch(
            "db1",
            "SELECT * FROM iggy_messages WHERE iggy_offset = 1234",
            "ns",
        )
        .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["payload_json"], json!("{\"n\":1234}"));
    assert_eq!(row["partition"], json!("1"));
    assert!(!row.contains_key("offset"), "no offset tag: {row:?}");
    // The message's µs timestamp (1234 / 700 = 1 past the first) * 1000 + 234.
    assert_eq!(row["time"], json!(1_700_000_000_000_001_234u64));
}

#[tokio::test]
async fn v1_offset_in_the_timestamp_rejects_messages_past_1000_of_one_timestamp() {
    let server = v1_server().await;
    let sink = open(v1(&server, merged(in_time(), json!({"batch_size": 5000})))).await;
    let batch = runs(1200, 1200);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    let SinkError::Rejected(rejections) = error else {
        panic!("expected Rejected, got {error}");
    };
    assert!(
        rejections[0].reason.contains("offset_placement = \"tag\""),
        "{}",
        rejections[0].reason
    );
    let rejected: Vec<usize> = rejections.iter().map(|r| r.index).collect();
    assert_eq!(rejected, (1000..1200).collect::<Vec<_>>());
    assert!(
        server
            .rows("db1", "SELECT * FROM iggy_messages")
            .await
            .is_empty(),
        "nothing sent"
    );
    sink.write(&topic(), &without(&batch, &rejected))
        .await
        .unwrap();
    assert_eq!(stored(&server).await, 1000);
    // The next batch at the same timestamp is judged with what came before;
    // a new timestamp starts again.
    let next: Vec<SinkMessage> = (1200..1210)
        .map(|n| SinkMessage {
            timestamp: batch[0].timestamp + u64::from(n >= 1205),
            ..message(n, Payload::Json(json!({"n": n})))
        })
        .collect();
    let rejected = rejected_indexes(sink.write(&topic(), &next).await.unwrap_err());
    assert_eq!(rejected, vec![0, 1, 2, 3, 4]);
    sink.write(&topic(), &next[5..]).await.unwrap();
    assert_eq!(stored(&server).await, 1005);
}

#[tokio::test]
async fn v1_a_partial_write_rejects_the_refused_lines_by_index_and_reports_the_rest_stored() {
    let server = v1_server().await;
    let sink = open(v1(&server, json!({}))).await;
    let mut batch = json_batch(5);
    // Past 2262 in nanoseconds: InfluxDB refuses the point ("time outside range").
    batch[1].timestamp = 9_999_999_999_999_999;
    batch[3].timestamp = 9_999_999_999_999_998;
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 2, 4], vec![1, 3]),
        "{error}"
    );
    let offsets: Vec<Value> = server
        .rows("db1", "SELECT payload_json, \"offset\" FROM iggy_messages")
        .await
        .iter()
        .map(|row| row["offset"].clone())
        .collect();
    assert_eq!(offsets, vec![json!("0"), json!("2"), json!("4")]);
}

#[tokio::test]
async fn v1_a_refusal_naming_no_line_that_dropped_every_point_rejects_them_all() {
    let server = v1_server().await;
    // payload_json as an integer: every string payload_json conflicts, and
    // 1.6 answers a bare "field type conflict" (field types are per shard:
    // the point shares the shard of the batch).
    server
        .write(
            "db1",
            "iggy_messages,offset=999 payload_json=1i 1700000000000000",
        )
        .await;
    let sink = open(v1(&server, json!({}))).await;
    let batch = json_batch(4);
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(durable_and_rejected(&error), (vec![], vec![0, 1, 2, 3]));
}

/// 1.6 drops points older than the retention policy and names none of them
/// (`points beyond retention policy dropped=2`): the request is split until
/// each dropped point stands alone, and the points written on the way are
/// reported stored.
#[tokio::test]
async fn v1_a_refusal_naming_no_line_is_split_until_each_refused_point_stands_alone() {
    let server = InfluxDb::start();
    server
        .query("", "CREATE DATABASE db1 WITH DURATION 1h")
        .await;
    let sink = open(v1(&server, json!({}))).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let mut batch = json_batch(4);
    for message in &mut batch[1..] {
        message.timestamp = now + message.offset;
    }
    batch[2].timestamp = 1_700_000_000_000_000;
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    let (durable, rejected) = durable_and_rejected(&error);
    assert_eq!((durable, rejected), (vec![1, 3], vec![0, 2]), "{error}");
    let SinkError::Partial(partial) = &error else {
        panic!("expected Partial, got {error}");
    };
    let reason = &partial.rejected[0].reason;
    assert!(reason.contains("retention policy"), "{reason}");
    assert_eq!(stored(&server).await, 2);
}

#[tokio::test]
async fn v1_open_is_fatal_naming_db_when_the_database_is_missing() {
    let server = v1_server().await;
    let mut sink = build(v1(&server, json!({"db": "absent"})));
    let error = sink.open().await.unwrap_err();
    assert!(!error.is_transient());
    assert!(error.to_string().contains("plugin_config.db"), "{error}");
}

#[tokio::test]
async fn v1_a_payload_that_is_not_json_is_rejected_before_anything_is_sent() {
    let server = v1_server().await;
    let sink = open(v1(&server, json!({}))).await;
    let batch = vec![
        message(0, Payload::Json(json!({"ok": true}))),
        message(1, Payload::Text("{not json".into())),
    ];
    assert_eq!(
        rejected_indexes(sink.write(&topic(), &batch).await.unwrap_err()),
        vec![1]
    );
    assert!(
        server
            .rows("db1", "SELECT * FROM iggy_messages")
            .await
            .is_empty()
    );
}

fn v2(server: &InfluxHttp, extra: Value) -> Value {
    merged(
        json!({"url": server.url, "org": "iggy", "bucket": "events", "token": "t0ken",
               "retry_delay": "1ms", "max_retries": 1, "max_open_retries": 0}),
        extra,
    )
}

/// 2.x refuses the whole request naming the bad line: that message is
/// rejected and the others sent again in the same write.
#[tokio::test]
async fn v2_writes_with_token_auth_and_a_refused_line_is_rejected_by_index() {
    let server = InfluxHttp::start("t0ken").await;
    let sink = open(v2(&server, json!({"precision": "ns"}))).await;
    let mut batch = json_batch(4);
    batch[2].payload = Payload::Json(json!({"poison": true}));
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![0, 1, 3], vec![2]),
        "{error}"
    );
    assert_eq!(
        server.requests().len(),
        2,
        "the refused request, then the rest"
    );
    let points = server.points();
    assert_eq!(points.len(), 3, "{points:?}");
    assert!(points[0].ends_with(" 1700000000000000000"), "{}", points[0]);
    let request = &server.requests()[0];
    assert_eq!(
        (
            request["org"].as_str(),
            request["bucket"].as_str(),
            request["precision"].as_str()
        ),
        ("iggy", "events", "ns")
    );
}

#[tokio::test]
async fn v3_a_partial_write_rejects_the_listed_lines_and_uses_bearer_auth() {
    let server = InfluxHttp::start("t0ken").await;
    let sink = open(merged(
        v2(&server, json!({})),
        json!({"version": "v3", "db": "events", "org": null, "bucket": null}),
    ))
    .await;
    let mut batch = json_batch(3);
    batch[0].payload = Payload::Json(json!({"poison": 1}));
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert_eq!(
        durable_and_rejected(&error),
        (vec![1, 2], vec![0]),
        "v3 writes the rest: {error}"
    );
    assert_eq!(server.points().len(), 2);
    assert_eq!(server.requests().len(), 1, "nothing is sent again");
    assert_eq!(server.requests()[0]["precision"], "microsecond");
}

#[tokio::test]
async fn v2_a_503_with_retry_after_is_one_request_and_transient_with_the_wait() {
    let server = InfluxHttp::start("t0ken").await;
    server.fail_next(&[Fault::UnavailableFor(7)]);
    let sink = open(v2(&server, json!({"max_retries": 5}))).await;
    let error = sink.write(&topic(), &json_batch(2)).await.unwrap_err();
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
    assert_eq!(server.requests().len(), 1, "no retry inside write");
    server.fail_next(&[Fault::TooManyRequests]);
    let error = sink.write(&topic(), &json_batch(2)).await.unwrap_err();
    assert!(matches!(error, SinkError::Transient { .. }), "{error}");
    sink.write(&topic(), &json_batch(2)).await.unwrap();
    assert_eq!(server.points().len(), 2);
}

/// The requests answered before the server failed are reported stored; the
/// engine writes only the rest again.
#[tokio::test]
async fn v2_requests_stored_before_a_failure_are_reported_durable() {
    let server = InfluxHttp::start("t0ken").await;
    server.fail_next(&[Fault::Pass, Fault::Unavailable]);
    let sink = open(v2(&server, json!({"batch_size": 2}))).await;
    let batch = json_batch(4);
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
    sink.write(&topic(), &batch[2..]).await.unwrap();
    assert_eq!(server.points().len(), 4);
}

#[tokio::test]
async fn open_against_a_server_that_cannot_be_reached_is_transient() {
    let url = format!("http://127.0.0.1:{}", support::ports::free_port());
    let mut sink = build(json!({"url": url, "org": "iggy", "bucket": "events", "token": "t"}));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error}");
}

#[tokio::test]
async fn v2_a_wrong_token_is_fatal_naming_the_field() {
    let server = InfluxHttp::start("t0ken").await;
    let sink = open(v2(&server, json!({"token": "wrong"}))).await;
    let error = sink.write(&topic(), &json_batch(1)).await.unwrap_err();
    let SinkError::Fatal(error) = error else {
        panic!("expected fatal, got {error}");
    };
    assert!(error.to_string().contains("plugin_config.token"), "{error}");
}

/// Upstream's example file (v2), unchanged but for its URL, run by the
/// runtime against the v2 protocol test server holding its token.
#[tokio::test]
async fn upstreams_example_file_runs_against_the_v2_test_server() {
    let points = run_upstreams_example("").await;
    assert_eq!(points.len(), 6);
    assert!(
        points.iter().all(|point| point.contains(",offset=")),
        "upstream's layout (offset_placement = \"tag\" by default): {points:?}"
    );
}

/// The same file with `offset_placement = "timestamp"` added (its precision
/// is already `ns`): three messages of one batch, one timestamp, three points.
#[tokio::test]
async fn upstreams_example_file_with_the_offset_in_the_timestamp_runs() {
    let points = run_upstreams_example("offset_placement = \"timestamp\"\n").await;
    assert_eq!(points.len(), 6, "{points:?}");
    for point in &points {
        assert!(!point.contains(",offset="), "{point}");
        let offset: u64 = point
            .split(",iggy_offset=")
            .nth(1)
            .and_then(|rest| rest.split('u').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(point.ends_with(&format!("{offset:03}")), "{point}");
    }
}

/// Points the test server holds once the runtime committed both topics of
/// upstream's file, with `extra` appended to its `[plugin_config]`.
async fn run_upstreams_example(extra: &str) -> Vec<String> {
    let server = InfluxHttp::start("replace-with-token").await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/influxdb_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's influxdb_sink.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("http://localhost:8086", &server.url)
        + extra;
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
            bus.is_drained("user_events", "users", "influxdb_sink")
                && bus.is_drained("user_events", "orders", "influxdb_sink")
        },
    )
    .await;
    runtime.shutdown().await;
    server.points()
}

#[tokio::test]
async fn after_threshold_failures_the_breaker_fails_writes_without_calling_the_server() {
    let server = InfluxHttp::start("t0ken").await;
    let sink = open(v2(
        &server,
        json!({"max_retries": 0, "circuit_breaker_threshold": 2, "circuit_breaker_cool_down": "1h"}),
    ))
    .await;
    server.fail_next(&[Fault::Unavailable, Fault::Unavailable]);
    for _ in 0..2 {
        assert!(matches!(
            sink.write(&topic(), &json_batch(1)).await,
            Err(SinkError::Transient { .. })
        ));
    }
    let sent = server.requests().len();
    let error = sink.write(&topic(), &json_batch(1)).await.unwrap_err();
    assert!(
        error.to_string().contains("circuit breaker open"),
        "{error}"
    );
    assert_eq!(server.requests().len(), sent, "no request while open");
}
