//! The mqtt source and sink against a real `mosquitto` (Debian's 2.0, one per
//! test on a free loopback port, see tests/support/mosquitto.rs), with the
//! engine producing to and consuming from the in-process Iggy test server
//! over the real `iggy` client. Upstream has no MQTT connector, so there is
//! no upstream example file to run here.
//!
//! The key cases run once per protocol version (`<case>::on_mqtt_3_1_1`,
//! `<case>::on_mqtt_5`); the tests' own clients (publisher, collector,
//! session helpers) speak 3.1.1, so the MQTT 5 cases also cross versions
//! through the broker.
#![cfg(all(feature = "mqtt-source", feature = "mqtt-sink"))]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::IggyClient;
use iggy_binary_protocol::codes::SEND_MESSAGES_CODE;
use iggy_connect::connectors::{Registry, SinkError};
use iggy_connect::message::{Payload, SinkMessage};
use serde_json::{Value, json};

use crate::support;
use crate::support::binary::Workspace;
use crate::support::harness::{connector, iggy_client, produce_ns, runtime};
use crate::support::iggy_server::{IggyTestServer, StoredMessage};
use crate::support::mosquitto::{Collector, Mosquitto, create_session, held_for, publish};
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(60);
/// The source's `batch_size`.
const BATCH: usize = 50;
/// The source's client id in these tests.
const SOURCE_ID: &str = "iggy-connect-source-from-mqtt";

/// `$case(version)` as two tests, one per protocol version.
macro_rules! on_both_versions {
    ($case:ident) => {
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_mqtt_3_1_1() {
                super::$case("3.1.1").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_mqtt_5() {
                super::$case("5").await;
            }
        }
    };
}

async fn produce_to_iggy(client: &IggyClient, ids: std::ops::Range<u128>) {
    produce_ns(client, "shop", "orders", ids).await;
}

/// Publishes `{"n": n}` to `topic` for each n of `range`, every PUBACK awaited.
async fn publish_ns(broker: &Mosquitto, topic: &str, range: std::ops::Range<u64>) {
    let payloads = range
        .map(|n| Bytes::from(json!({ "n": n }).to_string()))
        .collect();
    publish(broker.port, topic, payloads).await;
}

fn sink_config(key: &str, broker: &Mosquitto, version: &str) -> String {
    format!(
        r#"
        type = "sink"
        key = "{key}"
        path = "mqtt"
        [[streams]]
        stream = "shop"
        topics = ["orders"]
        schema = "json"
        batch_length = 100
        poll_interval = "5ms"
        [plugin_config]
        url = "{url}"
        topic = "iggy/{{stream}}/{{topic}}"
        ack_timeout = "2s"
        protocol_version = "{version}"
        "#,
        url = broker.url()
    )
}

fn source_config(broker: &Mosquitto, version: &str) -> String {
    format!(
        r#"
        type = "source"
        key = "from-mqtt"
        path = "mqtt"
        max_consecutive_nacks = 0
        [[streams]]
        stream = "sensors"
        topic = "readings"
        schema = "raw"
        [plugin_config]
        url = "{url}"
        topics = ["sensors/+"]
        batch_size = {BATCH}
        protocol_version = "{version}"
        "#,
        url = broker.url()
    )
}

/// The `n` of each payload, counted.
fn ns<'a>(payloads: impl IntoIterator<Item = &'a [u8]>) -> BTreeMap<u64, usize> {
    let mut seen = BTreeMap::new();
    for payload in payloads {
        let value: Value = serde_json::from_slice(payload).unwrap();
        *seen.entry(value["n"].as_u64().unwrap()).or_insert(0) += 1;
    }
    seen
}

fn in_iggy(iggy: &IggyTestServer) -> BTreeMap<u64, usize> {
    let stored = iggy.messages("sensors", "readings");
    ns(stored
        .iter()
        .map(|message: &StoredMessage| message.payload.as_ref()))
}

fn collected(collector: &Collector) -> BTreeMap<u64, usize> {
    let received = collector.received();
    ns(received.iter().map(|payload| payload.as_ref()))
}

fn covers(seen: &BTreeMap<u64, usize>, range: std::ops::Range<u64>) -> bool {
    range.clone().all(|n| seen.contains_key(&n)) && seen.len() as u64 == range.end - range.start
}

fn duplicates(seen: &BTreeMap<u64, usize>) -> usize {
    seen.values().map(|times| times - 1).sum()
}

fn sink_message(id: u128, payload: Value) -> SinkMessage {
    SinkMessage {
        id,
        offset: id as u64,
        partition_id: 0,
        timestamp: 0,
        origin_timestamp: 0,
        checksum: 0,
        headers: Vec::new(),
        payload: Payload::Json(payload),
    }
}

// ---------------------------------------------------------------- the sink

on_both_versions!(the_sink_publishes_each_iggy_message_once_to_its_templated_topic);
async fn the_sink_publishes_each_iggy_message_once_to_its_templated_topic(version: &str) {
    let (broker, iggy) = (Mosquitto::start(), IggyTestServer::start());
    let collector = Collector::start(broker.port, "iggy/shop/orders", "iggy/shop/orders").await;
    iggy.create_topic("shop", "orders", 1);
    produce_to_iggy(&iggy_client(&iggy).await, 1..501).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("to-mqtt", &broker, version)))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-mqtt", 0) == Some(499)
    })
    .await;
    runtime.shutdown().await;
    collector.settled().await.unwrap();
    let received = collector.received();
    let expected: Vec<Bytes> = (1..501u64)
        .map(|n| Bytes::from(json!({ "n": n }).to_string()))
        .collect();
    assert_eq!(received, expected, "each message once, in order");
}

on_both_versions!(
    a_message_without_a_valid_topic_is_rejected_before_its_batch_is_sent_and_retain_is_kept
);
async fn a_message_without_a_valid_topic_is_rejected_before_its_batch_is_sent_and_retain_is_kept(
    version: &str,
) {
    let broker = Mosquitto::start();
    let collector = Collector::start(broker.port, "routed/#", "routed/marker").await;
    let config = json!({"url": broker.url(), "topic_field": "to", "retain": true, "protocol_version": version});
    let mut sink = support::sinks::open("mqtt", &config).await;
    let mixed = vec![
        sink_message(1, json!({"to": "routed/a", "n": 1})),
        sink_message(2, json!({"no": "topic"})),
        sink_message(3, json!({"to": "routed/+", "n": 3})),
    ];
    match sink.write(&support::sinks::topic(), &mixed).await {
        Err(SinkError::Rejected(rejected)) => {
            let indexes: Vec<usize> = rejected.iter().map(|rejection| rejection.index).collect();
            assert_eq!(indexes, vec![1, 2], "{rejected:?}");
            assert!(
                rejected[0].reason.contains("\"to\""),
                "{}",
                rejected[0].reason
            );
        }
        other => panic!("expected two messages rejected, got {other:?}"),
    }
    collector.settled().await.unwrap();
    assert!(
        collector.received().is_empty(),
        "nothing of a batch with a rejection is sent (the engine writes the rest again)"
    );
    sink.write(&support::sinks::topic(), &mixed[..1])
        .await
        .unwrap();
    collector.settled().await.unwrap();
    assert_eq!(collected(&collector), BTreeMap::from([(1, 1)]));
    sink.close().await.unwrap();
    // A subscriber that comes later gets the retained message.
    let late = Collector::start(broker.port, "routed/a", "routed/a").await;
    late.settled().await.unwrap();
    assert_eq!(collected(&late), BTreeMap::from([(1, 1)]));
}

/// Iggy -> sink -> a collector through a broker that `crash`es (kill -9) or
/// restarts cleanly (SIGTERM) mid-stream; returns the messages the collector
/// never got and how many it had at the crash or stop.
async fn sink_across_a_broker_restart(crash: bool, version: &str) -> (Vec<u64>, usize) {
    let mut broker = if crash {
        // No window towards subscribers: each message goes on to the
        // collector as the broker takes it.
        Mosquitto::start_with("max_inflight_messages 0")
    } else {
        Mosquitto::start()
    };
    let iggy = IggyTestServer::start();
    let collector = Collector::start(broker.port, "iggy/#", "iggy/shop/orders").await;
    // The collector's session must outlive a crash, or what the sink
    // publishes before the collector is back goes to no one.
    broker.snapshot();
    iggy.create_topic("shop", "orders", 1);
    produce_to_iggy(&iggy_client(&iggy).await, 1..3001).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("to-mqtt", &broker, version)))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("part of the topic written", LONG, || {
        collector.received().len() >= 100
    })
    .await;
    if crash {
        broker.kill_9();
    } else {
        // SIGTERM: mosquitto saves its store (the collector's queue too).
        broker.stop();
    }
    let at_restart = collector.received().len();
    broker.resume();
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-mqtt", 0) == Some(2999)
    })
    .await;
    runtime.shutdown().await;
    collector.settled().await.unwrap();
    assert!(
        at_restart < 3000,
        "the restart must land mid-stream ({at_restart} written)"
    );
    let seen = collected(&collector);
    let missing = (1..3001).filter(|n| !seen.contains_key(n)).collect();
    (missing, at_restart)
}

on_both_versions!(a_broker_restart_mid_stream_loses_nothing);
async fn a_broker_restart_mid_stream_loses_nothing(version: &str) {
    let (missing, _) = sink_across_a_broker_restart(false, version).await;
    assert!(missing.is_empty(), "{} missing: {missing:?}", missing.len());
}

/// A PUBACK of mosquitto is not durable: what it acknowledged and held only
/// in memory at a kill -9 (its messages to the collector in flight, whose TCP
/// data a reset can discard) is gone, which no sink can prevent. That loss is
/// bounded by the batch in flight at the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_broker_kill_9_the_sink_goes_on_and_only_what_the_broker_held_is_lost() {
    let (missing, at_kill) = sink_across_a_broker_restart(true, "3.1.1").await;
    assert!(
        missing.len() <= 100 && missing.iter().all(|n| *n > at_kill as u64),
        "{} missing, {:?} .. {:?}; {at_kill} received at the kill",
        missing.len(),
        missing.first(),
        missing.last()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_sink_loses_nothing() {
    let (broker, iggy) = (Mosquitto::start(), IggyTestServer::start());
    let collector = Collector::start(broker.port, "iggy/#", "iggy/shop/orders").await;
    iggy.create_topic("shop", "orders", 1);
    produce_to_iggy(&iggy_client(&iggy).await, 1..5001).await;
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector("sink.toml", &sink_config("to-mqtt", &broker, "3.1.1"));
    let running = workspace.run();
    wait_for("part of the topic written", LONG, || {
        collector.received().len() >= 200
    })
    .await;
    running.kill();
    let at_kill = collector.received().len();
    let running = workspace.run();
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-mqtt", 0) == Some(4999)
    })
    .await;
    running.terminate();
    running.wait_exit(LONG);
    collector.settled().await.unwrap();
    assert!(
        at_kill < 5000,
        "the kill must land mid-stream ({at_kill} written)"
    );
    let seen = collected(&collector);
    assert!(covers(&seen, 1..5001), "{}", workspace.stderr());
}

on_both_versions!(a_refused_login_is_fatal_at_open_naming_the_fields);
async fn a_refused_login_is_fatal_at_open_naming_the_fields(version: &str) {
    let broker = Mosquitto::with_login("iggy", "right");
    let mut sink = support::sinks::build(
        "mqtt",
        &json!({"url": broker.url(), "topic": "t", "username": "iggy", "password": "wrong",
            "protocol_version": version}),
    );
    let error = sink.open().await.expect_err("open must fail");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("plugin_config.password"),
        "{error}"
    );

    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "mqtt")
        .unwrap();
    let mut source = (entry.build)(
        &json!({"url": broker.url(), "topics": ["t"], "username": "nobody",
            "protocol_version": version}),
    )
    .unwrap();
    let error = source.open(None).await.expect_err("open must fail");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("plugin_config.username"),
        "{error}"
    );

    let mut good = support::sinks::build(
        "mqtt",
        &json!({"url": broker.url(), "topic": "t", "username": "iggy", "password": "right",
            "protocol_version": version}),
    );
    good.open().await.expect("the right login connects");
    good.close().await.unwrap();
}

/// mosquitto answers a QoS 1 publish its ACL denies with PUBACK 0x87 on
/// MQTT 5: that message is rejected by index, the rest of the batch is
/// written. On 3.1.1 a PUBACK has no reason code: the broker acknowledges
/// and drops it, and the sink cannot tell. (With `max_queued_messages 0`,
/// mosquitto 2.0.11 drops the connection after a denied QoS 1 publish
/// instead: this broker keeps a limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_puback_not_authorized_on_mqtt_5_rejects_that_message_by_index() {
    let broker = Mosquitto::with_acl("topic readwrite allowed/#\n");
    let collector = Collector::start(broker.port, "allowed/#", "allowed/marker").await;
    let batch = vec![
        sink_message(1, json!({"to": "allowed/a", "n": 1})),
        sink_message(2, json!({"to": "denied/b", "n": 2})),
        sink_message(3, json!({"to": "allowed/c", "n": 3})),
    ];
    let config = json!({"url": broker.url(), "topic_field": "to", "protocol_version": "5"});
    let mut sink = support::sinks::open("mqtt", &config).await;
    match sink.write(&support::sinks::topic(), &batch).await {
        Err(SinkError::Rejected(rejected)) => {
            assert_eq!(rejected.len(), 1, "{rejected:?}");
            assert_eq!(rejected[0].index, 1);
            assert!(
                rejected[0].reason.contains("0x87"),
                "{}",
                rejected[0].reason
            );
        }
        other => panic!(
            "expected the denied message rejected, got {other:?}; broker log:\n{}",
            broker.log()
        ),
    }
    sink.close().await.unwrap();
    collector.settled().await.unwrap();
    assert_eq!(collected(&collector), BTreeMap::from([(1, 1), (3, 1)]));

    let config = json!({"url": broker.url(), "topic_field": "to", "protocol_version": "3.1.1"});
    let mut sink = support::sinks::open("mqtt", &config).await;
    sink.write(&support::sinks::topic(), &batch)
        .await
        .expect("MQTT 3.1.1 cannot tell a denied publish from a written one");
    sink.close().await.unwrap();
}

/// Iggy headers go out as MQTT 5 user properties and come back in as
/// headers of the same name, next to the source's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mqtt_5_headers_travel_as_user_properties() {
    use iggy_connect::message::HeaderValue;
    let broker = Mosquitto::start();
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "mqtt")
        .unwrap();
    let mut source = (entry.build)(&json!({
        "url": broker.url(), "topics": ["props/#"], "protocol_version": "5",
        "client_id": support::mosquitto::unique("props-source"), "linger": "50ms"
    }))
    .unwrap();
    source.open(None).await.unwrap();
    let mut message = sink_message(1, json!({"n": 1}));
    message.headers = vec![
        ("trace_id".into(), HeaderValue::String("abc-123".into())),
        ("attempt".into(), HeaderValue::UInt(2)),
    ];
    let config = json!({"url": broker.url(), "topic": "props/x", "protocol_version": "5"});
    let mut sink = support::sinks::open("mqtt", &config).await;
    sink.write(&support::sinks::topic(), &[message])
        .await
        .unwrap();
    sink.close().await.unwrap();
    let batch = tokio::time::timeout(LONG, source.poll())
        .await
        .expect("the message within a minute")
        .unwrap();
    assert_eq!(batch.records.len(), 1);
    let headers = &batch.records[0].headers;
    for expected in [
        ("trace_id", HeaderValue::String("abc-123".into())),
        ("attempt", HeaderValue::String("2".into())),
        ("mqtt_topic", HeaderValue::String("props/x".into())),
    ] {
        assert!(
            headers
                .iter()
                .any(|(key, value)| key == expected.0 && *value == expected.1),
            "{expected:?} in {headers:?}"
        );
    }
    source.commit().await.unwrap();
    source.close().await.unwrap();
}

// -------------------------------------------------------------- the source

on_both_versions!(the_source_delivers_each_message_once_with_its_topic_and_acks_what_iggy_has);
async fn the_source_delivers_each_message_once_with_its_topic_and_acks_what_iggy_has(
    version: &str,
) {
    let (broker, iggy) = (Mosquitto::start(), IggyTestServer::start());
    create_session(broker.port, SOURCE_ID, "sensors/+").await;
    publish_ns(&broker, "sensors/eu", 0..300).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config(&broker, version)))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("every message in Iggy", LONG, || {
        covers(&in_iggy(&iggy), 0..300)
    })
    .await;
    publish_ns(&broker, "sensors/us", 300..350).await;
    wait_for("the later messages too", LONG, || {
        covers(&in_iggy(&iggy), 0..350)
    })
    .await;
    runtime.shutdown().await;
    let stored = iggy.messages("sensors", "readings");
    assert_eq!(
        duplicates(&in_iggy(&iggy)),
        0,
        "nothing failed, so nothing repeats"
    );
    assert_eq!(stored.len(), 350);
    let topics: HashSet<String> = stored
        .iter()
        .filter_map(|message| {
            message
                .user_headers_map()
                .into_iter()
                .find(|(key, _)| key.as_str().ok() == Some("mqtt_topic"))
                .and_then(|(_, value)| value.as_str().ok().map(str::to_owned))
        })
        .collect();
    assert_eq!(
        topics,
        HashSet::from(["sensors/eu".to_owned(), "sensors/us".to_owned()]),
        "headers of the first: {:?}",
        stored[0].user_headers_map()
    );
    // Everything was acknowledged: the session holds nothing more.
    let held = held_for(broker.port, SOURCE_ID, Duration::from_secs(1), |_| false).await;
    assert!(held.is_empty(), "{} still held", held.len());
}

on_both_versions!(while_iggy_refuses_sends_nothing_is_acked_and_everything_arrives_after);
async fn while_iggy_refuses_sends_nothing_is_acked_and_everything_arrives_after(version: &str) {
    // No window of unacknowledged messages, so the check below is handed
    // every message the session holds, not just the first 20.
    let broker = Mosquitto::start_with("max_inflight_messages 0");
    let iggy = IggyTestServer::start();
    create_session(broker.port, SOURCE_ID, "sensors/+").await;
    publish_ns(&broker, "sensors/eu", 0..20).await;
    let state = tempfile::tempdir().unwrap();
    let first = runtime(&iggy, state.path());
    first
        .add(connector(&source_config(&broker, version)))
        .unwrap();
    first.start_enabled().await;
    wait_for("the first messages in Iggy", LONG, || {
        covers(&in_iggy(&iggy), 0..20)
    })
    .await;
    iggy.faults().refuse_sends_until_cleared();
    let sends_before = iggy.request_count(SEND_MESSAGES_CODE);
    publish_ns(&broker, "sensors/eu", 20..60).await;
    wait_for("several sends refused", LONG, || {
        iggy.request_count(SEND_MESSAGES_CODE) >= sends_before + 3
    })
    .await;
    first.shutdown().await;
    // Stopped while Iggy refused: the session still holds all 40.
    let held = held_for(broker.port, SOURCE_ID, LONG, |held| {
        ns(held.iter().map(|payload| payload.as_ref())).len() >= 40
    })
    .await;
    assert!(
        covers(&ns(held.iter().map(|payload| payload.as_ref())), 20..60),
        "nothing is acked while Iggy refuses the messages: the session holds {} of 40",
        held.len()
    );
    iggy.faults().clear();
    let second = runtime(&iggy, state.path());
    second
        .add(connector(&source_config(&broker, version)))
        .unwrap();
    second.start_enabled().await;
    wait_for("everything in Iggy once sends are accepted", LONG, || {
        covers(&in_iggy(&iggy), 0..60)
    })
    .await;
    second.shutdown().await;
    let seen = in_iggy(&iggy);
    assert!(duplicates(&seen) <= BATCH, "{} repeated", duplicates(&seen));
}

on_both_versions!(a_broker_kill_9_mid_stream_loses_nothing);
async fn a_broker_kill_9_mid_stream_loses_nothing(version: &str) {
    let (mut broker, iggy) = (Mosquitto::start(), IggyTestServer::start());
    create_session(broker.port, SOURCE_ID, "sensors/+").await;
    publish_ns(&broker, "sensors/eu", 0..2000).await;
    // What mosquitto holds survives its crash only once written to its store.
    broker.snapshot();
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config(&broker, version)))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("part of the messages in Iggy", LONG, || {
        iggy.message_count("sensors", "readings") >= 100
    })
    .await;
    broker.kill_9();
    let at_kill = iggy.message_count("sensors", "readings");
    broker.resume();
    publish_ns(&broker, "sensors/eu", 2000..2100).await;
    wait_for("everything in Iggy after the restart", LONG, || {
        covers(&in_iggy(&iggy), 0..2100)
    })
    .await;
    runtime.shutdown().await;
    assert!(
        at_kill < 2000,
        "the kill must land mid-stream ({at_kill} delivered)"
    );
}

on_both_versions!(kill_9_of_the_source_loses_nothing_the_unacked_messages_come_again);
async fn kill_9_of_the_source_loses_nothing_the_unacked_messages_come_again(version: &str) {
    let (broker, iggy) = (Mosquitto::start(), IggyTestServer::start());
    create_session(broker.port, SOURCE_ID, "sensors/+").await;
    publish_ns(&broker, "sensors/eu", 0..5000).await;
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector("source.toml", &source_config(&broker, version));
    let running = workspace.run();
    wait_for("part of the messages in Iggy", LONG, || {
        iggy.message_count("sensors", "readings") >= 200
    })
    .await;
    running.kill();
    let at_kill = iggy.message_count("sensors", "readings");
    let running = workspace.run();
    wait_for("everything in Iggy after the restart", LONG, || {
        covers(&in_iggy(&iggy), 0..5000)
    })
    .await;
    running.terminate();
    running.wait_exit(LONG);
    assert!(
        at_kill < 5000,
        "the kill must land mid-stream ({at_kill} delivered)"
    );
    // What comes again is what the killed process had sent to Iggy without
    // the broker holding its PUBACK: the tail before the kill (and a batch
    // the server may still have been storing when it was counted), nothing
    // after it. PUBACKs go out in the order the messages came, so that tail
    // is contiguous; its length depends on how far the process had written
    // its PUBACKs out when it died (one or two batches on a quiet machine,
    // more on a loaded one), so it is printed, not bounded.
    let seen = in_iggy(&iggy);
    let repeated: Vec<u64> = seen
        .iter()
        .filter(|(_, times)| **times > 1)
        .map(|(n, _)| *n)
        .collect();
    assert!(
        repeated.iter().all(|&n| n < (at_kill + BATCH as u64)),
        "only what was in Iggy before the kill comes again: {repeated:?}"
    );
    if let (Some(first), Some(last)) = (repeated.first(), repeated.last()) {
        assert_eq!(
            repeated.len() as u64,
            last - first + 1,
            "what comes again is one contiguous tail: {repeated:?}"
        );
    }
    println!(
        "scenario: mqtt {version} kill -9 at {at_kill} delivered, {} repeated",
        repeated.len()
    );
}
