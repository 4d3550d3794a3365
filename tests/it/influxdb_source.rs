//! The influxdb source against a real InfluxDB 1.6 (Debian's, one server per
//! test from `support::influxdb`) for `version = "v1"` (InfluxQL), and
//! against the protocol test server of `support::influxdb_http` for v2 (Flux,
//! annotated CSV) and v3 (SQL, JSON lines, ties in unstable order): through
//! the `Source` interface and through the runtime over the memory bus.
#![cfg(feature = "influxdb-source")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::{ConnectorError, Registry, Source};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::Payload;
use iggy_connect::state::{MemoryStateStore, StateStore};
use serde_json::{Value, json};

use crate::support;
use crate::support::influxdb::InfluxDb;
use crate::support::influxdb_http::{Fault, InfluxHttp};
use crate::support::wait::eventually;

const DEADLINE: Duration = Duration::from_secs(15);
/// 2024-03-01T00:00:00Z in ns.
const T0: i64 = 1_709_251_200_000_000_000;

fn build(config: &Value) -> Box<dyn Source> {
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "influxdb")
        .unwrap();
    (entry.build)(config).expect("a valid config")
}

async fn open(config: &Value, state: Option<&[u8]>) -> Box<dyn Source> {
    let mut source = build(config);
    source.open(state).await.expect("open");
    source
}

/// The JSON payloads of one poll, and its state.
async fn poll(source: &dyn Source) -> (Vec<Value>, Option<Vec<u8>>) {
    let batch = tokio::time::timeout(DEADLINE, source.poll())
        .await
        .expect("a batch")
        .expect("poll");
    let payloads = batch
        .records
        .iter()
        .map(|record| match &record.payload {
            Payload::Json(value) => value.clone(),
            other => panic!("not JSON: {other:?}"),
        })
        .collect();
    (payloads, batch.state)
}

/// Polls and commits until `count` payloads came.
async fn read(source: &dyn Source, count: usize) -> Vec<Value> {
    let mut all = Vec::new();
    while all.len() < count {
        let (payloads, _) = poll(source).await;
        all.extend(payloads);
        source.commit().await.unwrap();
    }
    all
}

fn numbers(payloads: &[Value]) -> Vec<i64> {
    let mut numbers: Vec<i64> = payloads.iter().map(|p| p["n"].as_i64().unwrap()).collect();
    numbers.sort();
    numbers
}

/// `count` points of measurement `cpu`, three hosts per timestamp (ties of
/// three), one timestamp per second from T0; `n` counts them.
async fn seed_v1(server: &InfluxDb, count: i64) {
    server.query("", "CREATE DATABASE db1").await;
    let lines: Vec<String> = (0..count)
        .map(|n| {
            let host = ["a", "b", "c"][(n % 3) as usize];
            format!(
                "cpu,host={host} n={n}i {}",
                (T0 + n / 3 * 1_000_000_000) / 1000
            )
        })
        .collect();
    server.write("db1", &lines.join("\n")).await;
}

fn v1(server: &InfluxDb, batch_size: u32) -> Value {
    json!({
        "version": "v1", "url": server.url(), "db": "db1",
        "query": "SELECT * FROM cpu WHERE time > '$cursor' ORDER BY time LIMIT $limit",
        "batch_size": batch_size, "poll_interval": "10ms",
        "retry_delay": "1ms", "max_retries": 0, "max_open_retries": 0,
    })
}

#[tokio::test]
async fn v1_every_row_is_read_once_in_time_order_across_ties() {
    let server = InfluxDb::start();
    seed_v1(&server, 30).await;
    let source = open(&v1(&server, 4), None).await;
    let all = read(source.as_ref(), 30).await;
    assert_eq!(numbers(&all), (0..30).collect::<Vec<_>>());
    let times: Vec<i64> = all.iter().map(|p| p["time"].as_i64().unwrap()).collect();
    assert!(
        times.windows(2).all(|pair| pair[0] <= pair[1]),
        "time order: {times:?}"
    );
    assert_eq!(all[0]["host"], json!("a"));
}

#[tokio::test]
async fn v1_a_restart_from_the_saved_state_resumes_inside_a_tie_without_loss_or_repeat() {
    let server = InfluxDb::start();
    seed_v1(&server, 12).await;
    let mut source = open(&v1(&server, 4), None).await;
    let (first, state) = poll(source.as_ref()).await;
    assert_eq!(
        first.len(),
        4,
        "the 4th row shares its second with the 5th and 6th"
    );
    source.commit().await.unwrap();
    // A second batch polled but never committed: not in the saved state.
    let _ = poll(source.as_ref()).await;
    source.close().await.unwrap();
    let restarted = open(&v1(&server, 4), state.as_deref()).await;
    let rest = read(restarted.as_ref(), 8).await;
    let mut all = first;
    all.extend(rest);
    assert_eq!(numbers(&all), (0..12).collect::<Vec<_>>());
}

#[tokio::test]
async fn v1_rows_written_after_catching_up_are_read_by_a_later_poll() {
    let server = InfluxDb::start();
    seed_v1(&server, 2).await;
    let source = open(&v1(&server, 10), None).await;
    assert_eq!(read(source.as_ref(), 2).await.len(), 2);
    server
        .write(
            "db1",
            &format!("cpu,host=z n=99i {}", (T0 + 3_600_000_000_000) / 1000),
        )
        .await;
    let (later, _) = poll(source.as_ref()).await;
    assert_eq!(numbers(&later), vec![99]);
}

#[tokio::test]
async fn v1_a_missing_database_or_a_bad_query_is_fatal_naming_the_field() {
    let server = InfluxDb::start();
    seed_v1(&server, 1).await;
    let mut missing = v1(&server, 10);
    missing["db"] = json!("absent");
    let error = open(&missing, None).await.poll().await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains("plugin_config.db"), "{error}");
    let mut bad = v1(&server, 10);
    bad["query"] = json!("SELEKT * FROM cpu WHERE time > '$cursor'");
    let error = open(&bad, None).await.poll().await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains("plugin_config.query"), "{error}");
}

fn runtime_config(plugin_config: &Value, stream: &str) -> iggy_connect::config::ConnectorConfig {
    let table: toml::Table = serde_json::from_value(plugin_config.clone()).unwrap();
    let text = format!(
        "type = \"source\"\nkey = \"influx\"\nenabled = true\npath = \"libiggy_connector_influxdb_source\"\n\
         max_consecutive_nacks = 0\n\n[[streams]]\nstream = \"{stream}\"\ntopic = \"rows\"\nschema = \"json\"\n\n\
         [plugin_config]\n{}",
        toml::to_string(&table).unwrap()
    );
    parse_connector_file(Path::new("influx.toml"), &text, &EnvVars::from_pairs([]))
        .unwrap()
        .0
}

fn delivered(bus: &MemoryBus, stream: &str) -> Vec<i64> {
    let mut numbers: Vec<i64> = bus
        .messages(stream, "rows")
        .iter()
        .map(|message| {
            serde_json::from_slice::<Value>(&message.payload).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    numbers.sort();
    numbers
}

/// Through the runtime: refused sends are polled again from the committed
/// cursor (nothing lost, nothing twice), and a restart on the same state
/// store reads only the rows written since.
#[tokio::test]
async fn v1_through_the_runtime_each_row_arrives_once_and_a_restart_reads_only_new_rows() {
    let server = InfluxDb::start();
    seed_v1(&server, 20).await;
    let bus = MemoryBus::new();
    let state: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new());
    bus.refuse_sends(2);
    let config = v1(&server, 4);
    let runtime = Runtime::new(Arc::new(bus.clone()), state.clone(), Duration::from_secs(5));
    runtime.add(runtime_config(&config, "influx")).unwrap();
    runtime.start_enabled().await;
    eventually(
        "20 rows in the topic",
        Duration::from_secs(30),
        async || bus.messages("influx", "rows").len() >= 20,
    )
    .await;
    runtime.shutdown().await;
    assert_eq!(delivered(&bus, "influx"), (0..20).collect::<Vec<_>>());

    let lines: Vec<String> = (20..26)
        .map(|n| format!("cpu,host=x{n} n={n}i {}", (T0 + 60_000_000_000) / 1000))
        .collect();
    server.write("db1", &lines.join("\n")).await;
    let runtime = Runtime::new(Arc::new(bus.clone()), state, Duration::from_secs(5));
    runtime.add(runtime_config(&config, "influx")).unwrap();
    runtime.start_enabled().await;
    eventually(
        "26 rows in the topic",
        Duration::from_secs(30),
        async || bus.messages("influx", "rows").len() >= 26,
    )
    .await;
    // Another round of polls finds nothing new.
    tokio::time::sleep(Duration::from_millis(100)).await;
    runtime.shutdown().await;
    assert_eq!(delivered(&bus, "influx"), (0..26).collect::<Vec<_>>());
}

fn v2(server: &InfluxHttp, extra: Value) -> Value {
    let mut config = json!({
        "url": server.url, "org": "iggy", "token": "t0ken",
        "query": "from(bucket: \"events\")\n |> range(start: -1h)\n |> filter(fn: (r) => r._measurement == \"cpu\")\n |> filter(fn: (r) => r._time > time(v: \"$cursor\"))\n |> sort(columns: [\"_time\"])\n |> limit(n: $limit)",
        "batch_size": 3, "poll_interval": "10ms",
        "retry_delay": "1ms", "max_retries": 1, "max_open_retries": 0,
    });
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    config
}

/// Points with two fields (`n`, `ok`) of two hosts, two per timestamp.
fn seed_http(server: &InfluxHttp, bucket: &str, count: i64) {
    for n in 0..count {
        let host = if n % 2 == 0 { "a" } else { "b" };
        server.seed(
            bucket,
            "cpu",
            &[("host", host)],
            &[("n", json!(n)), ("ok", json!(n % 3 == 0))],
            T0 + n / 2 * 1_000_000_000,
        );
    }
}

#[tokio::test]
async fn v2_flux_tables_of_annotated_csv_arrive_once_in_upstreams_envelope() {
    let server = InfluxHttp::start("t0ken").await;
    seed_http(&server, "events", 10);
    let source = open(&v2(&server, json!({})), None).await;
    // One row per point and field: 20.
    let all = read(source.as_ref(), 20).await;
    assert_eq!(all.len(), 20);
    let mut keys: Vec<String> = all
        .iter()
        .map(|p| format!("{} {} {}", p["timestamp"], p["row"]["host"], p["field"]))
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 20, "each point and field once");
    let first = all
        .iter()
        .find(|p| p["field"] == "ok" && p["row"]["host"] == "a")
        .unwrap();
    assert_eq!(first["measurement"], json!("cpu"));
    assert_eq!(first["value"], json!(true), "typed by #datatype boolean");
    assert_eq!(first["timestamp"], json!("2024-03-01T00:00:00.000000000Z"));
    let queries = server.queries();
    assert!(
        queries[0].contains("time(v: \"1970-01-01T00:00:00.000000000Z\")"),
        "{}",
        queries[0]
    );
    assert!(queries[0].contains("limit(n: 3)"), "{}", queries[0]);
}

#[tokio::test]
async fn v3_ties_answered_in_a_different_order_each_query_are_read_once() {
    let server = InfluxHttp::start("t0ken").await;
    // Seven points at one time, then three more.
    for n in 0..10 {
        let time = if n < 7 { T0 } else { T0 + n };
        server.seed(
            "metrics",
            "cpu",
            &[("host", &format!("h{n}"))],
            &[("n", json!(n))],
            time,
        );
    }
    let config = json!({
        "version": "v3", "url": server.url, "db": "metrics", "token": "t0ken",
        "query": "SELECT * FROM cpu WHERE time > '$cursor' ORDER BY time LIMIT $limit OFFSET $offset",
        "batch_size": 2, "poll_interval": "10ms", "initial_offset": "2024-01-01T00:00:00Z",
        "retry_delay": "1ms", "max_retries": 0, "max_open_retries": 0,
    });
    let source = open(&config, None).await;
    let all = read(source.as_ref(), 10).await;
    assert_eq!(numbers(&all), (0..10).collect::<Vec<_>>());
    assert_eq!(all[0]["time"], json!("2024-03-01T00:00:00.000000000"));
    assert!(server.queries().iter().all(|q| q.contains("OFFSET 0")));
}

/// Each poll sends its query once: throttling and a 503 are transient (the
/// engine polls again), and the next poll reads the rows.
#[tokio::test]
async fn v3_throttling_and_a_503_are_transient_after_one_request() {
    let server = InfluxHttp::start("t0ken").await;
    seed_http(&server, "metrics", 2);
    let config = json!({
        "version": "v3", "url": server.url, "db": "metrics", "token": "t0ken",
        "query": "SELECT * FROM cpu WHERE time >= '$cursor' ORDER BY time LIMIT $limit",
        "poll_interval": "10ms", "retry_delay": "1ms", "max_retries": 3, "max_open_retries": 0,
    });
    let source = open(&config, None).await;
    server.fail_next(&[Fault::TooManyRequests, Fault::UnavailableFor(7)]);
    for asked in 1..=2 {
        let error = source.poll().await.unwrap_err();
        assert!(matches!(error, ConnectorError::Transient(_)), "{error}");
        assert_eq!(server.requests().len(), asked, "one query per poll");
    }
    let (rows, _) = poll(source.as_ref()).await;
    assert_eq!(rows.len(), 2);
}

#[tokio::test]
async fn open_against_a_server_that_cannot_be_reached_is_transient() {
    let url = format!("http://127.0.0.1:{}", support::ports::free_port());
    let mut source = build(&json!({"url": url, "org": "iggy", "token": "t", "query": "$cursor"}));
    let error = source.open(None).await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error}");
}

#[tokio::test]
async fn v2_a_wrong_token_an_unknown_org_or_a_bad_query_is_fatal_naming_the_field() {
    let server = InfluxHttp::start("t0ken").await;
    seed_http(&server, "events", 2);
    for (extra, field) in [
        (json!({"token": "wrong"}), "plugin_config.token"),
        (json!({"org": "other"}), "plugin_config.org"),
        (
            json!({"query": "from(bucket: \"events\") |> filter(fn: (r) => r.x == \"$cursor\")"}),
            "plugin_config.query",
        ),
    ] {
        let error = open(&v2(&server, extra.clone()), None)
            .await
            .poll()
            .await
            .unwrap_err();
        assert!(!error.is_transient(), "{extra}: {error}");
        assert!(error.to_string().contains(field), "{extra}: {error}");
    }
}

/// Upstream's example file (v2), unchanged but for its URL, run by the
/// runtime against the v2 protocol test server holding its token.
#[tokio::test]
async fn upstreams_example_file_runs_against_the_v2_test_server() {
    let server = InfluxHttp::start("replace-with-token").await;
    for n in 0..5 {
        server.seed("events", "iggy_messages", &[], &[("n", json!(n))], T0 + n);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/influxdb_source.toml"))
        .find(|path| path.exists())
        .expect("upstream's influxdb_source.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("http://localhost:8086", &server.url);
    let (config, _) = parse_connector_file(&path, &text, &EnvVars::from_pairs([])).unwrap();
    let bus = MemoryBus::new();
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(2),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually(
        "5 rows in user_events/users",
        Duration::from_secs(30),
        async || bus.messages("user_events", "users").len() >= 5,
    )
    .await;
    runtime.shutdown().await;
    let values: Vec<i64> = bus
        .messages("user_events", "users")
        .iter()
        .map(|m| {
            serde_json::from_slice::<Value>(&m.payload).unwrap()["value"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(values, vec![0, 1, 2, 3, 4]);
}
