//! The nats source and sink against a real `nats-server -js` (Debian's 2.9,
//! one per test on a free loopback port), with the engine producing to and
//! consuming from the in-process Iggy test server over the real `iggy`
//! client. Upstream has no NATS connector, so there is no upstream example
//! file to run here.
#![cfg(all(feature = "nats-source", feature = "nats-sink"))]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use iggy_binary_protocol::codes::SEND_MESSAGES_CODE;
use iggy_connect::message::{Payload, SinkMessage};
use serde_json::{Value, json};

use crate::support;
use crate::support::binary::Workspace;
use crate::support::harness::{connector, iggy_client, produce_ns, runtime};
use crate::support::iggy_server::{IggyTestServer, StoredMessage};
use crate::support::json::with;
use crate::support::nats_server::{NatsServer, create_stream, stream_messages};
use crate::support::wait::{eventually, wait_for};

const LONG: Duration = Duration::from_secs(60);
/// The source's `batch_size`: the most one uncommitted batch can repeat.
const BATCH: usize = 50;

/// Publishes `{"n": n}` to `subject` for each n of `range`, awaiting each PubAck.
async fn publish(
    jetstream: &async_nats::jetstream::Context,
    subject: &str,
    range: std::ops::Range<u64>,
) {
    let mut acks = Vec::new();
    for n in range {
        let ack = jetstream
            .publish(
                subject.to_owned(),
                Bytes::from(json!({ "n": n }).to_string()),
            )
            .await
            .unwrap();
        acks.push(ack);
        if acks.len() == 256 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

fn sink_config(key: &str, nats: &NatsServer, extra: &str) -> String {
    format!(
        r#"
        type = "sink"
        key = "{key}"
        path = "nats"
        [[streams]]
        stream = "shop"
        topics = ["orders"]
        schema = "json"
        batch_length = 100
        poll_interval = "5ms"
        [plugin_config]
        url = "{url}"
        subject = "iggy.{{stream}}.{{topic}}"
        stream = "SHOP"
        stream_subjects = ["iggy.>"]
        ack_timeout = "2s"
        {extra}
        "#,
        url = nats.url()
    )
}

fn source_config(key: &str, nats: &NatsServer, extra: &str) -> String {
    format!(
        r#"
        type = "source"
        key = "{key}"
        path = "nats"
        max_consecutive_nacks = 0
        [[streams]]
        stream = "orders"
        topic = "created"
        schema = "raw"
        [plugin_config]
        url = "{url}"
        stream = "ORDERS"
        subject = "orders.>"
        batch_size = {BATCH}
        max_wait = "200ms"
        ack_wait = "2s"
        {extra}
        "#,
        url = nats.url()
    )
}

/// The Nats-Msg-Id of every message stream `name` holds, in stream order.
async fn msg_ids(jetstream: &async_nats::jetstream::Context, name: &str) -> Vec<String> {
    let stream = jetstream.get_stream(name).await.unwrap();
    let count = stream_messages(jetstream, name).await;
    let mut ids = Vec::new();
    for sequence in 1..=count {
        let message = stream.get_raw_message(sequence).await.unwrap();
        ids.push(
            message
                .headers
                .get("Nats-Msg-Id")
                .map(|value| value.as_str().to_owned())
                .unwrap_or_default(),
        );
    }
    ids
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

async fn consumer_info(
    jetstream: &async_nats::jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Option<async_nats::jetstream::consumer::Info> {
    jetstream
        .get_stream(stream)
        .await
        .ok()?
        .consumer_info(consumer)
        .await
        .ok()
}

// ---------------------------------------------------------------- the sink

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_stores_each_iggy_message_once_with_its_id_as_nats_msg_id() {
    let (nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..501).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("to-nats", &nats, "")))
        .unwrap();
    runtime.start_enabled().await;
    let jetstream = nats.jetstream().await;
    eventually("every message in the stream", LONG, async || {
        stream_messages(&jetstream, "SHOP").await >= 500
    })
    .await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-nats", 0) == Some(499)
    })
    .await;
    runtime.shutdown().await;
    let ids = msg_ids(&jetstream, "SHOP").await;
    let expected: Vec<String> = (1..501).map(|id: u128| id.to_string()).collect();
    assert_eq!(
        ids, expected,
        "each message once, in order, with its Iggy id"
    );
    let stream = jetstream.get_stream("SHOP").await.unwrap();
    let first = stream.get_raw_message(1).await.unwrap();
    assert_eq!(first.subject.as_str(), "iggy.shop.orders");
    assert_eq!(
        serde_json::from_slice::<Value>(&first.payload).unwrap(),
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
async fn a_replayed_batch_is_dropped_by_the_duplicate_window_and_a_message_without_its_subject_is_rejected()
 {
    let nats = NatsServer::start();
    let config = json!({
        "url": nats.url(),
        "subject_field": "to",
        "stream": "ROUTED",
        "stream_subjects": ["routed.>"],
    });
    let mut sink = support::sinks::open("nats", &config).await;
    let batch: Vec<SinkMessage> = (1..=10)
        .map(|id| {
            sink_message(
                id,
                json!({"to": format!("routed.{}", id % 2), "id": id as u64}),
            )
        })
        .collect();
    sink.write(&support::sinks::topic(), &batch).await.unwrap();
    sink.write(&support::sinks::topic(), &batch).await.unwrap();
    let jetstream = nats.jetstream().await;
    assert_eq!(
        stream_messages(&jetstream, "ROUTED").await,
        10,
        "the replay is dropped"
    );
    let stream = jetstream.get_stream("ROUTED").await.unwrap();
    let first = stream.get_raw_message(1).await.unwrap();
    assert_eq!(first.subject.as_str(), "routed.1");
    assert_eq!(first.headers.get("trace").map(|v| v.as_str()), Some("t-1"));

    let mixed = vec![
        sink_message(11, json!({"to": "routed.x"})),
        sink_message(12, json!({"no": "subject"})),
    ];
    match sink.write(&support::sinks::topic(), &mixed).await {
        Err(iggy_connect::connectors::SinkError::Rejected(rejected)) => {
            assert_eq!(rejected.len(), 1);
            assert_eq!(rejected[0].index, 1);
            assert!(
                rejected[0].reason.contains("\"to\""),
                "{}",
                rejected[0].reason
            );
        }
        other => panic!("expected the second message rejected, got {other:?}"),
    }
    assert_eq!(stream_messages(&jetstream, "ROUTED").await, 11);
    sink.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_no_stream_captures_is_fatal_at_open_naming_the_field() {
    let nats = NatsServer::start();
    let mut sink = support::sinks::build("nats", &json!({"url": nats.url(), "subject": "nowhere"}));
    let error = sink.open().await.expect_err("open must fail");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("plugin_config.subject"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_both_ways_deliver_and_a_wrong_ca_fails_open_for_good_naming_the_field() {
    // Iggy -> sink -> a TLS-only nats-server -> source -> Iggy, both
    // connectors trusting the test CA that signed the server's certificate.
    let pki = support::pki::TestPki::generate();
    let (nats, iggy) = (NatsServer::start_tls(&pki), IggyTestServer::start());
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 0..100).await;
    let trust = |ca: &std::path::Path| format!("tls_ca_file = {ca:?}");
    // The sink first: it makes the stream the source reads.
    let state = tempfile::tempdir().unwrap();
    let sinking = runtime(&iggy, state.path());
    let sink = sink_config("to-nats", &nats, &trust(&pki.ca));
    sinking.add(connector(&sink)).unwrap();
    sinking.start_enabled().await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-nats", 0) == Some(99)
    })
    .await;
    sinking.shutdown().await;
    let sourcing = runtime(&iggy, state.path());
    let source = source_config("from-nats", &nats, &trust(&pki.ca))
        .replace(r#"stream = "ORDERS""#, r#"stream = "SHOP""#)
        .replace(r#"subject = "orders.>""#, r#"subject = "iggy.>""#);
    sourcing.add(connector(&source)).unwrap();
    sourcing.start_enabled().await;
    wait_for("every message back in Iggy", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..100)
    })
    .await;
    sourcing.shutdown().await;

    let wrong = json!({"url": nats.url(), "tls_ca_file": pki.other_ca});
    let sink = with(
        &wrong,
        json!({"subject": "iggy.shop.orders", "stream": "SHOP"}),
    );
    let sink_error = support::sinks::build("nats", &sink)
        .open()
        .await
        .expect_err("the sink opened");
    let source = with(&wrong, json!({"stream": "SHOP", "subject": "iggy.>"}));
    let source_error = support::drive::build("nats", source)
        .open(None)
        .await
        .expect_err("the source opened");
    for error in [sink_error, source_error] {
        support::pki::assert_refused(&error, "tls_ca_file");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_mid_stream_leaves_every_message_in_the_stream_exactly_once() {
    let (mut nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..3001).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_config("to-nats", &nats, "")))
        .unwrap();
    runtime.start_enabled().await;
    let jetstream = nats.jetstream().await;
    eventually("part of the stream written", LONG, async || {
        stream_messages(&jetstream, "SHOP").await >= 100
    })
    .await;
    nats.restart();
    let at_restart = stream_messages(&jetstream, "SHOP").await;
    eventually("everything written after the restart", LONG, async || {
        stream_messages(&jetstream, "SHOP").await >= 3000
    })
    .await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-nats", 0) == Some(2999)
    })
    .await;
    runtime.shutdown().await;
    assert!(
        at_restart < 3000,
        "the restart must land mid-stream ({at_restart} written)"
    );
    let ids = msg_ids(&jetstream, "SHOP").await;
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(
        ids.len(),
        3000,
        "batches retried across the restart are deduplicated"
    );
    assert_eq!(distinct.len(), 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_sink_loses_nothing_and_the_replay_is_deduplicated() {
    let (nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..5001).await;
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector("sink.toml", &sink_config("to-nats", &nats, ""));
    let jetstream = nats.jetstream().await;
    let running = workspace.run();
    eventually("part of the stream written", LONG, async || {
        stream_messages(&jetstream, "SHOP").await >= 200
    })
    .await;
    running.kill();
    let at_kill = stream_messages(&jetstream, "SHOP").await;
    let running = workspace.run();
    eventually("everything written after the restart", LONG, async || {
        stream_messages(&jetstream, "SHOP").await >= 5000
    })
    .await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-nats", 0) == Some(4999)
    })
    .await;
    running.terminate();
    running.wait_exit(LONG);
    assert!(
        at_kill < 5000,
        "the kill must land mid-stream ({at_kill} written)"
    );
    let ids = msg_ids(&jetstream, "SHOP").await;
    assert_eq!(ids.len(), 5000, "{}", workspace.stderr());
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 5000);
}

// -------------------------------------------------------------- the source

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_delivers_each_message_once_and_acks_only_what_iggy_has() {
    let (nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    let jetstream = nats.jetstream().await;
    create_stream(&jetstream, "ORDERS", &["orders.>"]).await;
    publish(&jetstream, "orders.eu", 0..300).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config("from-nats", &nats, "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("every message in Iggy", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..300)
    })
    .await;
    publish(&jetstream, "orders.us", 300..350).await;
    wait_for("the later messages too", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..350)
    })
    .await;
    eventually("every message acked", LONG, async || {
        consumer_info(&jetstream, "ORDERS", "iggy-connect-from-nats")
            .await
            .is_some_and(|info| info.ack_floor.stream_sequence == 350 && info.num_ack_pending == 0)
    })
    .await;
    runtime.shutdown().await;
    let stored = iggy.messages("orders", "created");
    assert_eq!(
        duplicates(&ns(&stored)),
        0,
        "nothing failed, so nothing repeats"
    );
    assert_eq!(stored.len(), 350);
    let subjects: HashSet<String> = stored
        .iter()
        .filter_map(|message| {
            message
                .user_headers_map()
                .into_iter()
                .find(|(key, _)| key.as_str().ok() == Some("nats_subject"))
                .and_then(|(_, value)| value.as_str().ok().map(str::to_owned))
        })
        .collect();
    assert_eq!(
        subjects,
        HashSet::from(["orders.eu".to_owned(), "orders.us".to_owned()]),
        "headers of the first: {:?}",
        stored[0].user_headers_map()
    );
    let ids: HashSet<u128> = stored.iter().map(|message| message.id).collect();
    assert_eq!(ids.len(), 350, "each stream sequence has its own id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_iggy_refuses_sends_nothing_is_acked_and_everything_arrives_after() {
    let (nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    let jetstream = nats.jetstream().await;
    create_stream(&jetstream, "ORDERS", &["orders.>"]).await;
    publish(&jetstream, "orders.eu", 0..20).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config("from-nats", &nats, "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the first messages in Iggy", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..20)
    })
    .await;
    eventually("their acks", LONG, async || {
        consumer_info(&jetstream, "ORDERS", "iggy-connect-from-nats")
            .await
            .is_some_and(|info| info.ack_floor.stream_sequence == 20)
    })
    .await;
    iggy.faults().refuse_sends_until_cleared();
    let sends_before = iggy.request_count(SEND_MESSAGES_CODE);
    publish(&jetstream, "orders.eu", 20..60).await;
    wait_for("several sends refused", LONG, || {
        iggy.request_count(SEND_MESSAGES_CODE) >= sends_before + 3
    })
    .await;
    let info = consumer_info(&jetstream, "ORDERS", "iggy-connect-from-nats")
        .await
        .unwrap();
    assert_eq!(
        info.ack_floor.stream_sequence, 20,
        "nothing is acked while Iggy refuses the messages"
    );
    iggy.faults().clear();
    wait_for("everything in Iggy once sends are accepted", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..60)
    })
    .await;
    eventually("every message acked", LONG, async || {
        consumer_info(&jetstream, "ORDERS", "iggy-connect-from-nats")
            .await
            .is_some_and(|info| info.ack_floor.stream_sequence == 60 && info.num_ack_pending == 0)
    })
    .await;
    runtime.shutdown().await;
    let seen = ns(&iggy.messages("orders", "created"));
    assert!(duplicates(&seen) <= BATCH, "{} repeated", duplicates(&seen));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_mid_stream_loses_nothing() {
    let (mut nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    let jetstream = nats.jetstream().await;
    create_stream(&jetstream, "ORDERS", &["orders.>"]).await;
    publish(&jetstream, "orders.eu", 0..2000).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config("from-nats", &nats, "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("part of the stream in Iggy", LONG, || {
        iggy.message_count("orders", "created") >= 100
    })
    .await;
    nats.restart();
    let at_restart = iggy.message_count("orders", "created");
    publish(&jetstream, "orders.eu", 2000..2100).await;
    wait_for("everything in Iggy after the restart", LONG, || {
        covers(&ns(&iggy.messages("orders", "created")), 0..2100)
    })
    .await;
    runtime.shutdown().await;
    assert!(
        at_restart < 2000,
        "the restart must land mid-stream ({at_restart} delivered)"
    );
    let seen = ns(&iggy.messages("orders", "created"));
    assert!(
        duplicates(&seen) <= 2 * BATCH,
        "{} repeated",
        duplicates(&seen)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_source_loses_nothing_the_unacked_batch_is_redelivered() {
    let (nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    let jetstream = nats.jetstream().await;
    create_stream(&jetstream, "ORDERS", &["orders.>"]).await;
    publish(&jetstream, "orders.eu", 0..5000).await;
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector("source.toml", &source_config("from-nats", &nats, ""));
    let running = workspace.run();
    wait_for("part of the stream in Iggy", LONG, || {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_mode_delivers_what_is_published_while_it_runs_at_most_once() {
    let (nats, iggy) = (NatsServer::start(), IggyTestServer::start());
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&format!(
            r#"
            type = "source"
            key = "core"
            path = "nats"
            [[streams]]
            stream = "orders"
            topic = "created"
            schema = "raw"
            [plugin_config]
            url = "{}"
            mode = "core"
            subject = "live.>"
            "#,
            nats.url()
        )))
        .unwrap();
    runtime.start_enabled().await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    // Core NATS keeps nothing: publish until the subscription is there.
    let mut n = 0u64;
    eventually("the subscription to receive", LONG, async || {
        client
            .publish("live.a", Bytes::from(json!({ "n": n }).to_string()))
            .await
            .unwrap();
        client.flush().await.unwrap();
        n += 1;
        iggy.message_count("orders", "created") > 0
    })
    .await;
    for n in 1000..1100u64 {
        client
            .publish("live.b", Bytes::from(json!({ "n": n }).to_string()))
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    wait_for("the later messages in Iggy", LONG, || {
        let seen = ns(&iggy.messages("orders", "created"));
        (1000..1100).all(|n| seen.contains_key(&n))
    })
    .await;
    runtime.shutdown().await;
}
