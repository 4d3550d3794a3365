//! The rabbitmq source and sink against a real RabbitMQ broker (Debian's
//! `rabbitmq-server` 3.10, one per test process on free loopback ports, see
//! `tests/support/rabbitmq.rs`), with the engine producing to and consuming
//! from the in-process Iggy test server over the real `iggy` client. Each
//! test has its own queues and exchanges. Upstream has no RabbitMQ
//! connector, so there is no upstream example file to run here.
#![cfg(all(feature = "rabbitmq-source", feature = "rabbitmq-sink"))]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use amqprs::channel::ExchangeDeclareArguments;
use amqprs::{BasicProperties, FieldTable, FieldValue};
use iggy_binary_protocol::codes::SEND_MESSAGES_CODE;
use iggy_connect::connectors::{Registry, SinkError};
use iggy_connect::message::{Payload, SinkMessage};
use serde_json::{Value, json};

use crate::support;
use crate::support::binary::Workspace;
use crate::support::harness::{connector, iggy_client, produce_ns, runtime};
use crate::support::iggy_server::{IggyTestServer, StoredMessage};
use crate::support::rabbitmq::{client, port, publish, publish_messages, shared, unique};
use crate::support::wait::{eventually, wait_for};

const LONG: Duration = Duration::from_secs(90);
/// The source's `batch_size`: the prefetch is twice this, the most a lost
/// connection can deliver again.
const BATCH: usize = 50;

fn bodies(range: std::ops::Range<u64>) -> impl Iterator<Item = Vec<u8>> {
    range.map(|n| json!({ "n": n }).to_string().into_bytes())
}

/// A topic exchange `exchange` (durable) with durable queue `queue` bound by `iggy.#`.
async fn topology(port: u16, exchange: &str, queue: &str) {
    let client = client(port).await;
    client
        .channel
        .exchange_declare(
            ExchangeDeclareArguments::new(exchange, "topic")
                .durable(true)
                .finish(),
        )
        .await
        .unwrap();
    client.queue(queue, Some((exchange, "iggy.#"))).await;
}

fn sink_config(key: &str, port: u16, exchange: &str, extra: &str) -> String {
    format!(
        r#"
        type = "sink"
        key = "{key}"
        path = "rabbitmq"
        [[streams]]
        stream = "shop"
        topics = ["orders"]
        schema = "json"
        batch_length = 100
        poll_interval = "5ms"
        [plugin_config]
        port = {port}
        exchange = "{exchange}"
        exchange_type = "topic"
        routing_key = "iggy.{{stream}}.{{topic}}"
        confirm_timeout = "3s"
        connect_timeout = "2s"
        {extra}
        "#
    )
}

fn source_config(key: &str, port: u16, queue: &str, extra: &str) -> String {
    format!(
        r#"
        type = "source"
        key = "{key}"
        path = "rabbitmq"
        max_consecutive_nacks = 0
        [[streams]]
        stream = "orders"
        topic = "created"
        schema = "raw"
        [plugin_config]
        port = {port}
        queue = "{queue}"
        batch_size = {BATCH}
        connect_timeout = "2s"
        {extra}
        "#
    )
}

/// The `n` of each record in Iggy, counted.
fn ns(messages: &[StoredMessage]) -> BTreeMap<u64, usize> {
    let mut seen = BTreeMap::new();
    for message in messages {
        let value: Value = serde_json::from_slice(&message.payload).unwrap();
        *seen.entry(value["n"].as_u64().unwrap()).or_insert(0) += 1;
    }
    seen
}

fn covers(seen: &BTreeMap<u64, usize>, range: std::ops::Range<u64>) -> bool {
    range.clone().all(|n| seen.contains_key(&n)) && seen.len() as u64 == range.end - range.start
}

fn duplicates(seen: &BTreeMap<u64, usize>) -> usize {
    seen.values().map(|times| times - 1).sum()
}

/// The message ids of what `queue` holds, taken off it.
async fn drained_ids(port: u16, queue: &str) -> Vec<String> {
    client(port)
        .await
        .drain(queue)
        .await
        .into_iter()
        .map(|(properties, _)| properties.message_id().cloned().unwrap_or_default())
        .collect()
}

fn header(message: &StoredMessage, name: &str) -> Option<String> {
    message
        .user_headers_map()
        .into_iter()
        .find(|(key, _)| key.as_str().ok() == Some(name))
        .and_then(|(_, value)| value.as_str().ok().map(str::to_owned))
}

// ---------------------------------------------------------------- the sink

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_publishes_each_iggy_message_once_persistent_with_its_id_as_message_id() {
    let (port, iggy) = (port(), IggyTestServer::start());
    let (exchange, queue) = (unique("x"), unique("q"));
    topology(port, &exchange, &queue).await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..501).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("to-rabbit", port, &exchange, "")))
        .unwrap();
    runtime.start_enabled().await;
    let probe = client(port).await;
    eventually("every message in the queue", LONG, async || {
        probe.ready(&queue).await >= 500
    })
    .await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-rabbit", 0) == Some(499)
    })
    .await;
    runtime.shutdown().await;
    let messages = probe.drain(&queue).await;
    let ids: Vec<String> = messages
        .iter()
        .map(|(properties, _)| properties.message_id().cloned().unwrap_or_default())
        .collect();
    let expected: Vec<String> = (1..501).map(|id: u128| id.to_string()).collect();
    assert_eq!(
        ids, expected,
        "each message once, in order, with its Iggy id"
    );
    let (properties, body) = &messages[0];
    assert_eq!(properties.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        properties.content_type().map(String::as_str),
        Some("application/json")
    );
    assert_eq!(
        serde_json::from_slice::<Value>(body).unwrap(),
        json!({"n": 1})
    );
}

fn sink_message(id: u128, payload: Value) -> SinkMessage {
    SinkMessage {
        id,
        offset: id as u64,
        partition_id: 0,
        timestamp: 0,
        origin_timestamp: 0,
        checksum: 0,
        headers: vec![("trace".into(), "t-1".into())],
        payload: Payload::Json(payload),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_message_and_one_without_its_routing_key_are_rejected_by_index() {
    let port = port();
    let (exchange, queue) = (unique("x"), unique("q"));
    let probe = client(port).await;
    probe
        .channel
        .exchange_declare(
            ExchangeDeclareArguments::new(&exchange, "direct")
                .durable(true)
                .finish(),
        )
        .await
        .unwrap();
    probe.queue(&queue, Some((&exchange, "eu"))).await;
    let config = json!({"port": port, "exchange": exchange, "routing_key_field": "to"});
    let mut sink = support::sinks::open("rabbitmq", &config).await;
    let batch = vec![
        sink_message(1, json!({"to": "eu", "n": 1})),
        sink_message(2, json!({"to": "nowhere", "n": 2})),
        sink_message(3, json!({"no": "key"})),
        sink_message(4, json!({"to": "eu", "n": 4})),
    ];
    match sink.write(&support::sinks::topic(), &batch).await {
        Err(SinkError::Rejected(rejected)) => {
            let indexes: Vec<usize> = rejected.iter().map(|rejection| rejection.index).collect();
            assert_eq!(indexes, vec![1, 2], "{rejected:?}");
            assert!(
                rejected[0].reason.contains("NO_ROUTE"),
                "{}",
                rejected[0].reason
            );
            assert!(
                rejected[1].reason.contains("\"to\""),
                "{}",
                rejected[1].reason
            );
        }
        other => panic!("expected messages 1 and 2 rejected, got {other:?}"),
    }
    let stored = probe.drain(&queue).await;
    let ids: Vec<&str> = stored
        .iter()
        .filter_map(|(properties, _)| properties.message_id().map(String::as_str))
        .collect();
    assert_eq!(ids, vec!["1", "4"]);
    let headers = stored[0].0.headers().unwrap();
    assert!(matches!(
        headers.get(&"trace".try_into().unwrap()),
        Some(FieldValue::S(value)) if value.as_ref() == "t-1"
    ));
    // The channel goes on: the next batch is confirmed.
    sink.write(&support::sinks::topic(), &batch[..1])
        .await
        .unwrap();
    assert_eq!(probe.ready(&queue).await, 1);
    sink.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_and_bad_credentials_are_fatal_at_open_naming_the_field() {
    let port = port();
    let mut sink = support::sinks::build(
        "rabbitmq",
        &json!({"port": port, "exchange": unique("missing"), "routing_key": "k"}),
    );
    let error = sink.open().await.expect_err("open must fail");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("plugin_config.exchange"),
        "{error}"
    );

    let mut sink = support::sinks::build(
        "rabbitmq",
        &json!({"port": port, "routing_key": "k", "password": "wrong"}),
    );
    let error = sink.open().await.expect_err("open must fail");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains("plugin_config.username/password"),
        "{error}"
    );

    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "rabbitmq")
        .unwrap();
    let mut source =
        (entry.build)(&json!({"port": port, "queue": "q", "password": "wrong"})).unwrap();
    let error = source.open(None).await.expect_err("open must fail");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains("plugin_config.username/password"),
        "{error}"
    );

    let mut source = (entry.build)(&json!({"port": port, "queue": unique("missing")})).unwrap();
    let error = source.open(None).await.expect_err("open must fail");
    assert!(!error.is_transient(), "{error}");
    assert!(error.to_string().contains("plugin_config.queue"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_stream_leaves_every_message_in_the_queue() {
    let (port, iggy) = (port(), IggyTestServer::start());
    let (exchange, queue) = (unique("x"), unique("q"));
    topology(port, &exchange, &queue).await;
    // Else the kill below can roll the exchange, queue or binding back.
    shared().sync_definitions();
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..3001).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("to-rabbit", port, &exchange, "")))
        .unwrap();
    runtime.start_enabled().await;
    eventually("part of the topic published", LONG, async || {
        client(port).await.ready(&queue).await >= 100
    })
    .await;
    shared().restart();
    let at_restart = client(port).await.ready(&queue).await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-rabbit", 0) == Some(2999)
    })
    .await;
    runtime.shutdown().await;
    assert!(
        at_restart < 3000,
        "the restart must land mid-stream ({at_restart} published)"
    );
    let ids = drained_ids(port, &queue).await;
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 3000, "every message is in the queue");
    // Not idempotent: what was published and not yet confirmed when the
    // broker went down is published again.
    assert!(
        ids.len() - 3000 <= 200,
        "{} published twice",
        ids.len() - 3000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_sink_loses_nothing() {
    let (port, iggy) = (port(), IggyTestServer::start());
    let (exchange, queue) = (unique("x"), unique("q"));
    topology(port, &exchange, &queue).await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..5001).await;
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector("sink.toml", &sink_config("to-rabbit", port, &exchange, ""));
    let probe = client(port).await;
    let running = workspace.run();
    eventually("part of the topic published", LONG, async || {
        probe.ready(&queue).await >= 200
    })
    .await;
    running.kill();
    let at_kill = probe.ready(&queue).await;
    let running = workspace.run();
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-rabbit", 0) == Some(4999)
    })
    .await;
    running.terminate();
    running.wait_exit(LONG);
    assert!(
        at_kill < 5000,
        "the kill must land mid-stream ({at_kill} published)"
    );
    let ids = drained_ids(port, &queue).await;
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 5000, "{}", workspace.stderr());
}

// -------------------------------------------------------------- the source

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_delivers_each_message_once_with_its_id_and_headers_and_acks_all() {
    let (port, iggy) = (port(), IggyTestServer::start());
    let queue = unique("q");
    let exchange = unique("x");
    topology(port, &exchange, &queue).await;
    // The first 300 with a message_id and a header, as the rabbitmq sink
    // publishes them; the rest without.
    let mut headers = FieldTable::new();
    headers.insert(
        "trace".try_into().unwrap(),
        FieldValue::S("t-1".try_into().unwrap()),
    );
    let with_ids = (0..300u64).map(|n| {
        let properties = BasicProperties::default()
            .with_persistence(true)
            .with_message_id(&(1000 + n).to_string())
            .with_headers(headers.clone())
            .finish();
        (properties, json!({ "n": n }).to_string().into_bytes())
    });
    publish_messages(port, &exchange, "iggy.eu", with_ids).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config("from-rabbit", port, &queue, "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("every message in Iggy", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..300)
    })
    .await;
    publish(port, &queue, bodies(300..350)).await;
    wait_for("the later messages too", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..350)
    })
    .await;
    runtime.shutdown().await;
    // What the source had not acknowledged would be back in the queue now.
    assert_eq!(
        client(port).await.ready(&queue).await,
        0,
        "every message acked"
    );
    let stored = iggy.messages("orders", "created");
    assert_eq!(
        duplicates(&ns(&stored)),
        0,
        "nothing failed, so nothing repeats"
    );
    assert_eq!(stored.len(), 350);
    let first = stored
        .iter()
        .find(|message| serde_json::from_slice::<Value>(&message.payload).unwrap()["n"] == 0)
        .unwrap();
    assert_eq!(first.id, 1000, "the AMQP message_id is the Iggy id");
    assert_eq!(header(first, "trace").as_deref(), Some("t-1"));
    assert_eq!(
        header(first, "amqp_routing_key").as_deref(),
        Some("iggy.eu")
    );
    assert_eq!(header(first, "amqp_exchange"), Some(exchange));
    let later = stored
        .iter()
        .find(|message| serde_json::from_slice::<Value>(&message.payload).unwrap()["n"] == 300)
        .unwrap();
    assert_eq!(header(later, "amqp_routing_key"), Some(queue.clone()));
    assert_eq!(
        header(later, "amqp_exchange"),
        None,
        "the default exchange has no name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_iggy_refuses_sends_nothing_is_acked_and_everything_arrives_after() {
    let (port, iggy) = (port(), IggyTestServer::start());
    let queue = unique("q");
    client(port).await.queue(&queue, None).await;
    publish(port, &queue, bodies(0..20)).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config("from-rabbit", port, &queue, "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the first messages in Iggy", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..20)
    })
    .await;
    wait_for("their acks", LONG, || shared().counts(&queue) == (0, 0)).await;
    iggy.faults().refuse_sends_until_cleared();
    let sends_before = iggy.request_count(SEND_MESSAGES_CODE);
    publish(port, &queue, bodies(20..60)).await;
    wait_for("several sends refused", LONG, || {
        iggy.request_count(SEND_MESSAGES_CODE) >= sends_before + 3
    })
    .await;
    let (ready, unacked) = shared().counts(&queue);
    assert_eq!(
        ready + unacked,
        40,
        "nothing is acked while Iggy refuses the messages ({ready} ready, {unacked} unacked)"
    );
    assert!(unacked > 0, "the source holds a batch");
    iggy.faults().clear();
    wait_for("everything in Iggy once sends are accepted", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..60)
    })
    .await;
    wait_for("every message acked", LONG, || {
        shared().counts(&queue) == (0, 0)
    })
    .await;
    runtime.shutdown().await;
    let seen = ns(&iggy.messages("orders", "created"));
    assert!(duplicates(&seen) <= BATCH, "{} repeated", duplicates(&seen));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_stream_loses_nothing() {
    let (port, iggy) = (port(), IggyTestServer::start());
    let queue = unique("q");
    client(port).await.queue(&queue, None).await;
    // Else the kill below can roll the queue back, with what it holds.
    shared().sync_definitions();
    publish(port, &queue, bodies(0..2000)).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config("from-rabbit", port, &queue, "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("part of the queue in Iggy", LONG, || {
        iggy.message_count("orders", "created") >= 100
    })
    .await;
    shared().restart();
    let at_restart = iggy.message_count("orders", "created");
    publish(port, &queue, bodies(2000..2100)).await;
    wait_for("everything in Iggy after the restart", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..2100)
    })
    .await;
    runtime.shutdown().await;
    assert!(
        at_restart < 2000,
        "the restart must land mid-stream ({at_restart} delivered)"
    );
    // RabbitMQ does not fsync acknowledgements: a killed broker delivers
    // again what it had delivered unacknowledged (the prefetch) and what was
    // acknowledged shortly before, never what it had not delivered yet.
    let seen = ns(&iggy.messages("orders", "created"));
    assert!(
        duplicates(&seen) as u64 <= at_restart + 2 * BATCH as u64,
        "{} repeated, {at_restart} delivered before the restart",
        duplicates(&seen)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_source_loses_nothing_the_unacked_messages_are_redelivered() {
    let (port, iggy) = (port(), IggyTestServer::start());
    let queue = unique("q");
    client(port).await.queue(&queue, None).await;
    publish(port, &queue, bodies(0..5000)).await;
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector(
        "source.toml",
        &source_config("from-rabbit", port, &queue, ""),
    );
    let running = workspace.run();
    wait_for("part of the queue in Iggy", LONG, || {
        iggy.message_count("orders", "created") >= 200
    })
    .await;
    running.kill();
    let at_kill = iggy.message_count("orders", "created");
    let running = workspace.run();
    wait_for("everything in Iggy after the restart", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..5000)
    })
    .await;
    running.terminate();
    running.wait_exit(LONG);
    assert!(
        at_kill < 5000,
        "the kill must land mid-stream ({at_kill} delivered)"
    );
    let seen = ns(&iggy.messages("orders", "created"));
    assert!(
        duplicates(&seen) <= 2 * BATCH,
        "{} repeated",
        duplicates(&seen)
    );
}
