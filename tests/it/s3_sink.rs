//! The s3 sink against moto's S3 server (`support::s3`, a real S3 API on a
//! loopback port), with the engine consuming from the in-process Iggy test
//! server over the real `iggy` client. Objects are read back with boto3, not
//! the sink's client.
#![cfg(feature = "s3-sink")]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::connectors::Flush;
use iggy_connect::engine::{Runtime, Status};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{Payload, SinkMessage};
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

use crate::support;
use crate::support::harness::{connector, iggy_client, produce_ns, runtime};
use crate::support::iggy_server::IggyTestServer;
use crate::support::s3::S3Server;
use crate::support::wait::{eventually, wait_for};

const LONG: Duration = Duration::from_secs(60);
const BUCKET: &str = "lake";

fn sink_config(key: &str, s3: &S3Server, extra: &str) -> String {
    format!(
        r#"
        type = "sink"
        key = "{key}"
        path = "s3"
        [[streams]]
        stream = "shop"
        topics = ["orders"]
        schema = "json"
        batch_length = 64
        poll_interval = "5ms"
        [plugin_config]
        bucket = "{BUCKET}"
        region = "us-east-1"
        endpoint = "{endpoint}"
        access_key_id = "test"
        secret_access_key = "test"
        prefix = "{key}"
        path_template = "{{stream}}/{{topic}}/{{date}}"
        {rotation}
        max_attempts = 1
        retry_delay = "10ms"
        request_timeout = "2s"
        {extra}
        "#,
        endpoint = s3.endpoint(),
        rotation = if extra.contains("file_rotation") {
            ""
        } else {
            "file_rotation = \"messages\"\nmax_messages_per_file = 300"
        },
    )
}

fn group(key: &str) -> String {
    format!("iggy-connect-sink-{key}")
}

/// The messages of one object, decompressed and parsed by its key's ending.
fn decode(key: &str, bytes: Vec<u8>) -> Vec<Value> {
    let bytes = if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    } else if key.ends_with(".zst") {
        zstd::decode_all(&bytes[..]).unwrap()
    } else {
        bytes
    };
    let name = key.trim_end_matches(".gz").trim_end_matches(".zst");
    if name.ends_with(".jsonl") {
        std::str::from_utf8(&bytes)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    } else if name.ends_with(".json") {
        serde_json::from_slice(&bytes).unwrap()
    } else {
        // raw: the payloads back to back.
        serde_json::Deserializer::from_slice(&bytes)
            .into_iter::<Value>()
            .map(|value| json!({ "payload": value.unwrap() }))
            .collect()
    }
}

/// (first, last) offsets an object's name gives.
fn offsets_in_name(key: &str) -> (u64, u64) {
    let name = key.rsplit('/').next().unwrap();
    let parts: Vec<&str> = name.split(['-', '.']).collect();
    (parts[1].parse().unwrap(), parts[2].parse().unwrap())
}

/// Every object under `prefix/`, in offset order, with its messages; checks
/// that each object holds the offsets its name says, in order.
async fn objects(s3: &S3Server, prefix: &str) -> Vec<(String, Vec<Value>)> {
    let mut objects = Vec::new();
    for (key, body) in s3.objects(BUCKET) {
        if !key.starts_with(&format!("{prefix}/")) {
            continue;
        }
        let messages = decode(&key, body);
        let (first, last) = offsets_in_name(&key);
        let ns: Vec<u64> = messages
            .iter()
            .map(|message| message["payload"]["n"].as_u64().unwrap())
            .collect();
        // produce_ns sends id n at offset n - 1.
        let expected: Vec<u64> = (first + 1..=last + 1).collect();
        assert_eq!(ns, expected, "{key} holds its offsets' messages, in order");
        objects.push((key, messages));
    }
    objects.sort_by_key(|(key, _)| offsets_in_name(key));
    objects
}

/// Each n of 1..=count in exactly one object.
fn assert_each_once(objects: &[(String, Vec<Value>)], count: u64) {
    let mut seen = BTreeMap::new();
    for (key, messages) in objects {
        for message in messages {
            let n = message["payload"]["n"].as_u64().unwrap();
            if let Some(other) = seen.insert(n, key.clone()) {
                panic!("message {n} in {other} and {key}");
            }
        }
    }
    let expected: Vec<u64> = (1..=count).collect();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_in_exactly_one_object_in_offset_order_in_each_format_and_compression() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    s3.create_bucket(BUCKET).await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..1001).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let sinks = [
        (
            "lines",
            "output_format = \"json_lines\"\ninclude_headers = true",
        ),
        (
            "gzip",
            "output_format = \"json_lines\"\ncompression = \"gzip\"",
        ),
        (
            "array",
            "output_format = \"json_array\"\ncompression = \"zstd\"",
        ),
        ("raw", "output_format = \"raw\"\ncompression = \"gzip\""),
        (
            "size",
            "file_rotation = \"size\"\nmax_file_size = \"5KB\"\ninclude_metadata = false",
        ),
    ];
    for (key, extra) in sinks {
        runtime
            .add(connector(&sink_config(key, &s3, extra)))
            .unwrap();
    }
    runtime.start_enabled().await;
    for (key, _) in sinks {
        eventually("every message accepted", LONG, async || {
            runtime
                .view(ConnectorKind::Sink, key)
                .is_ok_and(|view| view.metrics.processed.get() >= 1000)
        })
        .await;
        wait_for("the full files committed", LONG, || {
            iggy.stored_offset("shop", "orders", &group(key), 0)
                .is_some_and(|offset| offset >= 599)
        })
        .await;
    }
    // The last, partial file of the count-rotated sinks is only buffered.
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("lines"), 0),
        Some(899)
    );
    runtime.shutdown().await;
    for (key, _) in sinks {
        assert_eq!(
            iggy.stored_offset("shop", "orders", &group(key), 0),
            Some(999),
            "{key}: the stop flushed and committed the rest"
        );
        let objects = objects(&s3, key).await;
        assert_each_once(&objects, 1000);
        if key != "size" {
            let sizes: Vec<usize> = objects.iter().map(|(_, m)| m.len()).collect();
            assert_eq!(sizes, [300, 300, 300, 100], "{key}");
        } else {
            assert!(objects.len() >= 3, "{key}: {} objects", objects.len());
            assert!(objects[0].1[0].get("offset").is_none());
        }
        let first = &objects[0];
        if key == "lines" || key == "gzip" || key == "array" {
            assert_eq!(first.1[0]["offset"], 0);
            assert_eq!(first.1[0]["stream"], "shop");
            assert_eq!(first.1[0]["topic"], "orders");
            assert_eq!(first.1[0]["partition_id"], 0);
        }
        assert!(
            first.0.starts_with(&format!("{key}/shop/orders/20")),
            "{}",
            first.0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_read_again_overwrites_the_same_objects_instead_of_adding_duplicates() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    s3.create_bucket(BUCKET).await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..901).await;
    let state = tempfile::tempdir().unwrap();
    let config = |key: &str| {
        // Both write under the prefix "replay".
        sink_config(key, &s3, "flush_interval = \"0s\"")
            .replace(&format!("prefix = \"{key}\""), "prefix = \"replay\"")
    };
    let first = runtime(&iggy, state.path());
    first.add(connector(&config("first"))).unwrap();
    first.start_enabled().await;
    wait_for("the first run committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("first"), 0) == Some(899)
    })
    .await;
    first.shutdown().await;
    let before = objects(&s3, "replay").await;
    assert_eq!(before.len(), 3);

    // A second consumer group reads everything again from offset 0.
    let second = runtime(&iggy, state.path());
    second.add(connector(&config("second"))).unwrap();
    second.start_enabled().await;
    wait_for("the second run committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("second"), 0) == Some(899)
    })
    .await;
    second.shutdown().await;
    let after = objects(&s3, "replay").await;
    let keys = |objects: &[(String, Vec<Value>)]| -> Vec<String> {
        objects.iter().map(|(key, _)| key.clone()).collect()
    };
    assert_eq!(keys(&after), keys(&before), "the same keys, no new object");
    assert_each_once(&after, 900);
    assert_eq!(after, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_of_the_endpoint_is_retried_commits_nothing_meanwhile_and_loses_nothing() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    s3.create_bucket(BUCKET).await;
    iggy.create_topic("shop", "orders", 1);
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config(
            "out",
            &s3,
            "flush_interval = \"0s\"",
        )))
        .unwrap();
    runtime.start_enabled().await;
    eventually("the sink running", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "out")
            .is_ok_and(|view| view.status.status == Status::Running)
    })
    .await;
    s3.set_down(true);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..601).await;
    eventually("the upload retried", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "out")
            .is_ok_and(|view| view.metrics.retries.get() >= 3)
    })
    .await;
    assert_eq!(iggy.stored_offset("shop", "orders", &group("out"), 0), None);
    let view = runtime.view(ConnectorKind::Sink, "out").unwrap();
    assert_eq!(view.status.status, Status::Running);

    s3.set_down(false);
    wait_for("everything committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("out"), 0) == Some(599)
    })
    .await;
    runtime.shutdown().await;
    assert_each_once(&objects(&s3, "out").await, 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_stops_the_sink_with_a_message_naming_the_field() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    iggy.create_topic("shop", "orders", 1);
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("out", &s3, "")))
        .unwrap();
    runtime.start_enabled().await;
    eventually("the sink to fail", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "out")
            .is_ok_and(|view| view.status.last_error.is_some())
    })
    .await;
    let view = runtime.view(ConnectorKind::Sink, "out").unwrap();
    let error = view.status.last_error.clone().unwrap().message;
    assert!(
        error.contains("bucket") && error.contains("\"lake\" does not exist"),
        "{error}"
    );
    assert_ne!(view.status.status, Status::Running);
    runtime.shutdown().await;
}

/// Upstream's example connector file, with its commented endpoint and
/// credentials pointed at moto, run by the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_example_file_runs_against_the_s3_server() {
    let s3 = S3Server::start().await;
    s3.create_bucket("my-data-lake").await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/s3_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's s3_sink.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text
        .replace(
            "# endpoint = \"http://localhost:9000\"",
            &format!("endpoint = \"{}\"", s3.endpoint()),
        )
        .replace("# access_key_id", "access_key_id")
        .replace("# secret_access_key", "secret_access_key");
    let (config, _) = parse_connector_file(&path, &text, &EnvVars::from_pairs([])).unwrap();
    let bus = MemoryBus::new();
    for topic in ["api_requests", "errors"] {
        support::sinks::send(
            &bus,
            "application_logs",
            topic,
            1,
            (1..=5u64).map(|n| json!({ "n": n }).to_string()),
        )
        .await;
    }
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually("both topics accepted", LONG, async || {
        runtime
            .view(ConnectorKind::Sink, "s3")
            .is_ok_and(|view| view.metrics.processed.get() >= 10)
    })
    .await;
    // Files of 8 MiB: the five messages of each topic wait for the stop.
    assert_eq!(
        bus.committed_offset("application_logs", "api_requests", "s3_sink", 0),
        None
    );
    runtime.shutdown().await;
    for topic in ["api_requests", "errors"] {
        assert_eq!(
            bus.committed_offset("application_logs", topic, "s3_sink", 0),
            Some(4)
        );
        let prefix = format!("iggy/raw/application_logs/{topic}/");
        let objects: Vec<(String, Vec<u8>)> = s3
            .objects("my-data-lake")
            .into_iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .collect();
        assert_eq!(objects.len(), 1);
        let (key, body) = objects.into_iter().next().unwrap();
        assert!(key.ends_with("/00000-00000000000000000000-00000000000000000004.jsonl"));
        let messages = decode(&key, body);
        let ns: Vec<u64> = messages
            .iter()
            .map(|message| message["payload"]["n"].as_u64().unwrap())
            .collect();
        assert_eq!(ns, [1, 2, 3, 4, 5]);
    }
}

/// A file above `part_size` goes up as a multipart upload, and its offsets
/// are durable only once the upload completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_above_the_part_size_is_uploaded_in_parts_and_durable_once_complete() {
    let s3 = S3Server::start().await;
    s3.create_bucket(BUCKET).await;
    let config = json!({
        "bucket": BUCKET,
        "region": "us-east-1",
        "endpoint": s3.endpoint(),
        "access_key_id": "test",
        "secret_access_key": "test",
        "prefix": "big",
        "output_format": "raw",
        "max_file_size": "6MiB",
        "part_size": "5MiB",
    });
    let sink = support::sinks::open("s3", &config).await;
    let topic = support::sinks::topic();
    let chunk = 64 * 1024;
    let messages: Vec<SinkMessage> = (0..100u64)
        .map(|offset| SinkMessage {
            id: u128::from(offset),
            offset,
            partition_id: 3,
            timestamp: 1_709_214_300_000_000,
            origin_timestamp: 0,
            checksum: 0,
            headers: Vec::new(),
            payload: Payload::Raw(Bytes::from(vec![b'a' + (offset % 26) as u8; chunk])),
        })
        .collect();
    sink.write(&topic, &messages).await.unwrap();
    assert!(
        sink.durable(&topic).is_empty(),
        "nothing durable before a flush"
    );
    sink.flush(&topic, Flush::Due).await.unwrap();
    // 96 messages of 64 KiB fill 6 MiB: that file is up, the other 4 wait.
    assert_eq!(sink.durable(&topic), [(3, 95)]);
    let objects = s3.objects(BUCKET);
    assert_eq!(objects.len(), 1);
    let (key, body) = &objects[0];
    assert!(
        key.ends_with("/00003-00000000000000000000-00000000000000000095.bin"),
        "{key}"
    );
    let expected: Vec<u8> = messages[..96]
        .iter()
        .flat_map(|message| message.payload.to_bytes().to_vec())
        .collect();
    assert!(
        body == &expected,
        "the object holds the 96 payloads in order"
    );
    let etag = s3.etag(BUCKET, key);
    assert!(etag.trim_matches('"').ends_with("-2"), "two parts: {etag}");
    sink.flush(&topic, Flush::All).await.unwrap();
    assert_eq!(sink.durable(&topic), [(3, 99)]);
    assert_eq!(s3.objects(BUCKET).len(), 2);
}

/// Rule K6 through the real binary: killed (SIGKILL) with a partial file in
/// memory, a restart reads that data again from Iggy; every message ends in
/// exactly one object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_killed_with_a_file_buffered_loses_nothing_after_a_restart() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    s3.create_bucket(BUCKET).await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..1001).await;
    let workspace = support::binary::Workspace::new(&iggy.address().to_string(), "");
    let file = |extra: &str| {
        format!("enabled = true\n{}", sink_config("out", &s3, extra))
            .replace("path = \"s3\"", "path = \"s3\"\nname = \"s3\"")
    };
    workspace.add_connector("out.toml", &file("flush_interval = \"0s\""));
    let running = workspace.run();
    wait_for("three files committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("out"), 0) == Some(899)
    })
    .await;
    running.kill();
    assert_eq!(objects(&s3, "out").await.len(), 3, "{}", workspace.stderr());
    assert_eq!(
        iggy.stored_offset("shop", "orders", &group("out"), 0),
        Some(899)
    );

    workspace.add_connector("out.toml", &file("flush_interval = \"100ms\""));
    let running = workspace.run();
    wait_for("the rest read again and committed", LONG, || {
        iggy.stored_offset("shop", "orders", &group("out"), 0) == Some(999)
    })
    .await;
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    assert_each_once(&objects(&s3, "out").await, 1000);
}
