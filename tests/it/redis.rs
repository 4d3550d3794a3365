//! The redis source and sink against a real Redis 7.0 server (one per test,
//! `tests/support/redis.rs`) and the in-process Iggy test server through the
//! real `iggy` client: exact counts with nothing failing, a Redis restart
//! mid-stream, Iggy refusing sends, a dead consumer's pending entries and a
//! kill -9 of the binary. Redis has no upstream connector, so there is no
//! upstream example file to check field names against.
#![cfg(all(feature = "redis-source", feature = "redis-sink"))]

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::{
    Client as _, Identifier, IggyClient, IggyMessage, MessageClient, Partitioning,
};
use iggy_binary_protocol::codes::SEND_MESSAGES_CODE;
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::{ConnectorError, Registry, Source};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::{ConnectionSettings, IggyBus};
use iggy_connect::state::FileStateStore;
use redis::aio::MultiplexedConnection;
use serde_json::json;

use crate::support;
use crate::support::binary::Workspace;
use crate::support::iggy_server::{IggyTestServer, StoredMessage};
use crate::support::json::with;
use crate::support::redis::{RedisServer, entries, field};
use crate::support::wait::{eventually, wait_for};

const LONG: Duration = Duration::from_secs(60);
/// The source's `batch_size`: the most one unacknowledged batch can repeat.
const BATCH: usize = 20;

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("test.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad test config: {issues}"))
        .0
}

fn runtime(iggy: &IggyTestServer, state: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(ConnectionSettings::password(
            iggy.address().to_string(),
            "iggy",
            "iggy",
        ))),
        Arc::new(FileStateStore::new(state).unwrap()),
        Duration::from_secs(5),
    )
}

fn source_file(redis: &RedisServer, stream: &str, extra: &str) -> String {
    format!(
        r#"
type = "source"
key = "redis-in"
path = "redis"
max_consecutive_nacks = 0
[[streams]]
stream = "from_redis"
topic = "{stream}"
schema = "json"
linger_time = "1ms"
[plugin_config]
url = "{url}"
streams = ["{stream}"]
group = "bridge"
batch_size = {BATCH}
block = "50ms"
connect_timeout = "1s"
timeout = "2s"
{extra}
"#,
        url = redis.url()
    )
}

fn sink_file(redis: &RedisServer, topic: &str, stream: &str) -> String {
    format!(
        r#"
type = "sink"
key = "redis-out"
path = "redis"
[[streams]]
stream = "to_redis"
topics = ["{topic}"]
schema = "json"
batch_length = 50
poll_interval = "5ms"
[plugin_config]
url = "{url}"
stream = "{stream}"
connect_timeout = "1s"
timeout = "2s"
"#,
        url = redis.url()
    )
}

/// Appends entries `range` (payload `{"n": N}`) to `stream`.
async fn append(client: &mut MultiplexedConnection, stream: &str, range: std::ops::Range<u64>) {
    for n in range {
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(format!("{{\"n\":{n}}}"))
            .query_async(client)
            .await
            .unwrap();
    }
}

fn numbers(messages: &[StoredMessage]) -> Vec<u64> {
    messages
        .iter()
        .filter_map(|message| {
            serde_json::from_slice::<serde_json::Value>(&message.payload)
                .ok()?
                .get("n")?
                .as_u64()
        })
        .collect()
}

fn distinct(messages: &[StoredMessage]) -> HashSet<u64> {
    numbers(messages).into_iter().collect()
}

/// Entries of the group not yet acknowledged.
async fn pending(client: &mut MultiplexedConnection, stream: &str) -> i64 {
    let summary: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(stream)
        .arg("bridge")
        .query_async(client)
        .await
        .unwrap();
    redis::from_redis_value(summary[0].clone()).unwrap()
}

fn expected(range: std::ops::Range<u64>) -> HashSet<u64> {
    range.collect()
}

/// The redis source built from `plugin_config`, driven without the engine.
fn source(plugin_config: serde_json::Value) -> Box<dyn Source> {
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "redis")
        .unwrap();
    (entry.build)(&plugin_config).expect("a valid config")
}

/// A streams source reading `events` as group `bridge`.
fn streams_config(redis: &RedisServer) -> serde_json::Value {
    serde_json::json!({
        "url": redis.url(), "streams": ["events"], "group": "bridge",
        "block": "50ms", "connect_timeout": "1s", "timeout": "2s",
    })
}

/// `poll`, bounded: a poll that never returns fails the test.
async fn poll(
    source: &dyn Source,
) -> Result<iggy_connect::connectors::SourceBatch, ConnectorError> {
    tokio::time::timeout(LONG, source.poll())
        .await
        .expect("poll returned in time")
}

/// The source's connection is dropped after a transport error and opened
/// again by the next command: a lost connection is transient, and the
/// engine's next poll reads on.
#[tokio::test]
async fn streams_a_lost_connection_is_transient_and_the_next_poll_reconnects() {
    let mut redis = RedisServer::start();
    append(&mut redis.client().await, "events", 0..3).await;
    let mut source = source(streams_config(&redis));
    source.open(None).await.unwrap();
    assert_eq!(poll(source.as_ref()).await.unwrap().records.len(), 3);
    source.commit().await.unwrap();
    redis.kill();
    let error = poll(source.as_ref()).await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error}");
    redis.restart();
    append(&mut redis.client().await, "events", 3..5).await;
    assert_eq!(poll(source.as_ref()).await.unwrap().records.len(), 2);
}

/// A group deleted under the source is a lost session: `Disconnected`, and
/// the fresh source the engine opens creates it again and reads.
#[tokio::test]
async fn a_consumer_group_that_went_away_is_disconnected_and_a_fresh_source_makes_it_again() {
    let redis = RedisServer::start();
    let mut client = redis.client().await;
    let mut first = source(streams_config(&redis));
    first.open(None).await.unwrap();
    let _: i64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg("events")
        .arg("bridge")
        .query_async(&mut client)
        .await
        .unwrap();
    append(&mut client, "events", 0..2).await;
    let error = poll(first.as_ref()).await.unwrap_err();
    assert!(matches!(error, ConnectorError::Disconnected(_)), "{error}");
    first.close().await.unwrap();
    let mut fresh = source(streams_config(&redis));
    fresh.open(None).await.unwrap();
    assert_eq!(poll(fresh.as_ref()).await.unwrap().records.len(), 2);
}

/// Nothing reopens a subscription's connection: once it closes, `poll`
/// hands out what arrived before it, then fails as `Disconnected`.
#[tokio::test]
async fn pubsub_a_closed_connection_is_disconnected_after_what_arrived_before() {
    let redis = RedisServer::start();
    let mut client = redis.client().await;
    let mut source = source(serde_json::json!({
        "url": redis.url(), "mode": "pubsub", "channels": ["news"], "linger": "1ms",
    }));
    source.open(None).await.unwrap();
    let _: i64 = redis::cmd("PUBLISH")
        .arg("news")
        .arg("{\"n\":1}")
        .query_async(&mut client)
        .await
        .unwrap();
    kill_subscribers(&mut client).await;
    assert_eq!(poll(source.as_ref()).await.unwrap().records.len(), 1);
    let error = poll(source.as_ref()).await.unwrap_err();
    assert!(matches!(error, ConnectorError::Disconnected(_)), "{error}");
}

/// Closes every pub/sub connection of the server.
async fn kill_subscribers(client: &mut MultiplexedConnection) {
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(client)
        .await
        .unwrap();
}

/// How many connections subscribe to `channel`.
async fn subscribers(client: &mut MultiplexedConnection, channel: &str) -> i64 {
    let answer: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(client)
        .await
        .unwrap();
    redis::from_redis_value(answer[1].clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_delivers_each_entry_once_and_acknowledges_all_of_them() {
    let (redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    let mut client = redis.client().await;
    append(&mut client, "orders", 0..150).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_file(&redis, "orders", "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the first entries in Iggy", LONG, || {
        distinct(&iggy.messages("from_redis", "orders")) == expected(0..150)
    })
    .await;
    // Entries added while it runs follow.
    append(&mut client, "orders", 150..200).await;
    wait_for("every entry in Iggy", LONG, || {
        distinct(&iggy.messages("from_redis", "orders")) == expected(0..200)
    })
    .await;
    eventually("every entry acknowledged", LONG, async || {
        pending(&mut client, "orders").await == 0
    })
    .await;
    runtime.shutdown().await;
    let messages = iggy.messages("from_redis", "orders");
    assert_eq!(
        numbers(&messages),
        (0..200).collect::<Vec<_>>(),
        "nothing failed: each entry once, in stream order"
    );
    let ids: HashSet<u128> = messages.iter().map(|message| message.id).collect();
    assert_eq!(ids.len(), 200, "each entry has an id of its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_survives_a_redis_restart_mid_stream_and_loses_nothing() {
    let (mut redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    let mut client = redis.client().await;
    append(&mut client, "events", 0..100).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_file(&redis, "events", "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("some entries in Iggy", LONG, || {
        !iggy.messages("from_redis", "events").is_empty()
    })
    .await;
    redis.restart();
    let mut client = redis.client().await;
    append(&mut client, "events", 100..200).await;
    wait_for("every entry in Iggy after the restart", LONG, || {
        distinct(&iggy.messages("from_redis", "events")) == expected(0..200)
    })
    .await;
    eventually("every entry acknowledged", LONG, async || {
        pending(&mut client, "events").await == 0
    })
    .await;
    runtime.shutdown().await;
    let delivered = iggy.messages("from_redis", "events").len();
    assert!(
        delivered <= 200 + 2 * BATCH,
        "a restart repeats at most the batches in flight: {delivered} delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_iggy_refuses_sends_nothing_is_acknowledged_and_redis_keeps_the_entries() {
    let (redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    let mut client = redis.client().await;
    append(&mut client, "refused", 0..10).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_file(&redis, "refused", "")))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the first entries in Iggy", LONG, || {
        distinct(&iggy.messages("from_redis", "refused")) == expected(0..10)
    })
    .await;
    eventually("the first entries acknowledged", LONG, async || {
        pending(&mut client, "refused").await == 0
    })
    .await;
    iggy.faults().refuse_sends_until_cleared();
    let sends_before = iggy.request_count(SEND_MESSAGES_CODE);
    append(&mut client, "refused", 10..60).await;
    wait_for("several sends refused", LONG, || {
        iggy.request_count(SEND_MESSAGES_CODE) >= sends_before + 3
    })
    .await;
    let unacknowledged = pending(&mut client, "refused").await;
    assert!(
        unacknowledged > 0,
        "the batch Iggy refuses stays pending in the group: {unacknowledged}"
    );
    iggy.faults().clear();
    wait_for("everything in Iggy once sends are accepted", LONG, || {
        distinct(&iggy.messages("from_redis", "refused")) == expected(0..60)
    })
    .await;
    eventually("every entry acknowledged", LONG, async || {
        pending(&mut client, "refused").await == 0
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_a_dead_consumer_left_pending_are_taken_over() {
    let (redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    let mut client = redis.client().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("claimed")
        .arg("bridge")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut client)
        .await
        .unwrap();
    append(&mut client, "claimed", 0..30).await;
    // Another consumer reads the first 10 and dies without acknowledging.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("bridge")
        .arg("dead")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg("claimed")
        .arg(">")
        .query_async(&mut client)
        .await
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_file(
            &redis,
            "claimed",
            "claim_min_idle = \"300ms\"",
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("every entry in Iggy, the dead consumer's too", LONG, || {
        distinct(&iggy.messages("from_redis", "claimed")) == expected(0..30)
    })
    .await;
    eventually("every entry acknowledged", LONG, async || {
        pending(&mut client, "claimed").await == 0
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(iggy.messages("from_redis", "claimed").len(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_of_the_binary_mid_stream_loses_no_entry() {
    let (redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    let mut client = redis.client().await;
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector("redis.toml", &source_file(&redis, "crash", ""));
    append(&mut client, "crash", 0..300).await;
    let running = workspace.run();
    wait_for("some entries in Iggy", LONG, || {
        iggy.messages("from_redis", "crash").len() >= 60
    })
    .await;
    running.kill();
    append(&mut client, "crash", 300..400).await;
    let running = workspace.run();
    wait_for("every entry in Iggy after the restart", LONG, || {
        distinct(&iggy.messages("from_redis", "crash")) == expected(0..400)
    })
    .await;
    eventually("every entry acknowledged", LONG, async || {
        pending(&mut client, "crash").await == 0
    })
    .await;
    running.terminate();
    let delivered = iggy.messages("from_redis", "crash").len();
    println!("kill -9: 400 entries, {delivered} delivered, 0 lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_mode_delivers_what_arrives_while_subscribed_and_subscribes_again_when_cut() {
    let (redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    let mut client = redis.client().await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&format!(
            r#"
type = "source"
key = "redis-pubsub"
path = "redis"
[[streams]]
stream = "from_redis"
topic = "channel"
schema = "json"
linger_time = "1ms"
[plugin_config]
url = "{}"
mode = "pubsub"
channels = ["news"]
"#,
            redis.url()
        )))
        .unwrap();
    runtime.start_enabled().await;
    eventually("the source subscribed", LONG, async || {
        subscribers(&mut client, "news").await == 1
    })
    .await;
    publish(&mut client, 0..50).await;
    wait_for("every published message in Iggy", LONG, || {
        distinct(&iggy.messages("from_redis", "channel")) == expected(0..50)
    })
    .await;
    // The engine opens a fresh source once the subscription is gone.
    kill_subscribers(&mut client).await;
    eventually("the source subscribed again", LONG, async || {
        subscribers(&mut client, "news").await == 1
    })
    .await;
    publish(&mut client, 50..100).await;
    wait_for("what was published after the reopen in Iggy", LONG, || {
        distinct(&iggy.messages("from_redis", "channel")) == expected(0..100)
    })
    .await;
    runtime.shutdown().await;
}

async fn publish(client: &mut MultiplexedConnection, range: std::ops::Range<u64>) {
    for n in range {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("news")
            .arg(format!("{{\"n\":{n}}}"))
            .query_async(client)
            .await
            .unwrap();
    }
}

async fn produce(iggy: &IggyTestServer, topic: &str, range: std::ops::Range<u64>) {
    let client = IggyClient::from_connection_string(&iggy.connection_string()).unwrap();
    client.connect().await.unwrap();
    let mut messages: Vec<IggyMessage> = range
        .map(|n| {
            IggyMessage::builder()
                .id(u128::from(n) + 1)
                .payload(Bytes::from(format!("{{\"n\":{n}}}")))
                .build()
                .unwrap()
        })
        .collect();
    client
        .send_messages(
            &Identifier::named("to_redis").unwrap(),
            &Identifier::named(topic).unwrap(),
            &Partitioning::partition_id(0),
            &mut messages,
        )
        .await
        .unwrap();
}

/// `iggy_id` -> copies in the stream.
async fn stream_ids(client: &mut MultiplexedConnection, stream: &str) -> HashMap<String, usize> {
    let mut ids = HashMap::new();
    for (_, fields) in entries(client, stream).await {
        *ids.entry(field(&fields, "iggy_id").unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_appends_each_message_once_with_its_metadata() {
    let (redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    iggy.create_topic("to_redis", "orders", 1);
    produce(&iggy, "orders", 0..120).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_file(&redis, "orders", "out")))
        .unwrap();
    runtime.start_enabled().await;
    let mut client = redis.client().await;
    eventually("every message in the stream", LONG, async || {
        stream_ids(&mut client, "out").await.len() == 120
    })
    .await;
    runtime.shutdown().await;
    let stored = entries(&mut client, "out").await;
    assert_eq!(stored.len(), 120, "nothing failed: each message once");
    for (index, (_, fields)) in stored.iter().enumerate() {
        assert_eq!(
            field(fields, "payload"),
            Some(format!("{{\"n\":{index}}}").as_str())
        );
        assert_eq!(
            field(fields, "iggy_id"),
            Some((index + 1).to_string().as_str())
        );
        assert_eq!(
            field(fields, "iggy_offset"),
            Some(index.to_string().as_str())
        );
        assert_eq!(field(fields, "iggy_topic"), Some("to_redis/orders"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_a_client_certificate_both_ways_deliver_and_a_wrong_ca_or_none_fails_open_for_good()
 {
    // redis-server's TLS port with the test CA's server certificate,
    // requiring a client certificate it signed. Before the runtime
    // installed a rustls provider, the first TLS connection panicked.
    let pki = support::pki::TestPki::generate();
    let (redis, iggy) = (RedisServer::with_tls(&pki), IggyTestServer::start());
    let tls = format!(
        "ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
        pki.ca, pki.client_cert, pki.client_key
    );
    let over_tls = |file: String| file.replace(&redis.url(), &redis.tls_url()) + &tls;
    iggy.create_topic("to_redis", "orders", 1);
    produce(&iggy, "orders", 0..20).await;
    let mut client = redis.client().await;
    append(&mut client, "events", 0..20).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let sink = over_tls(sink_file(&redis, "orders", "out"));
    assert!(sink.contains("rediss://"), "{sink}");
    runtime.add(connector(&sink)).unwrap();
    runtime
        .add(connector(&over_tls(source_file(&redis, "events", ""))))
        .unwrap();
    runtime.start_enabled().await;
    eventually("every message in the stream", LONG, async || {
        stream_ids(&mut client, "out").await.len() == 20
    })
    .await;
    wait_for("every entry in Iggy", LONG, || {
        distinct(&iggy.messages("from_redis", "events")) == expected(0..20)
    })
    .await;
    runtime.shutdown().await;

    // Another CA's certificate, or none where the server asks for one:
    // refused for good at open, naming the field.
    let url = redis.tls_url();
    let wrong_ca = json!({"ca_file": pki.other_ca, "cert_file": pki.client_cert,
        "key_file": pki.client_key});
    let no_certificate = json!({"ca_file": pki.ca});
    for (fields, field) in [(wrong_ca, "ca_file"), (no_certificate, "cert_file")] {
        let sink = with(
            &json!({"url": url, "stream": "out", "connect_timeout": "2s"}),
            fields.clone(),
        );
        let source = with(
            &json!({"url": url, "streams": ["events"], "group": "other",
                "connect_timeout": "2s"}),
            fields,
        );
        let sink_error = support::sinks::build("redis", &sink)
            .open()
            .await
            .expect_err("the sink opened");
        let source_error = support::drive::build("redis", source)
            .open(None)
            .await
            .expect_err("the source opened");
        for error in [sink_error, source_error] {
            support::pki::assert_refused(&error, field);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_survives_a_redis_restart_and_loses_nothing() {
    let (mut redis, iggy) = (RedisServer::start(), IggyTestServer::start());
    iggy.create_topic("to_redis", "events", 1);
    produce(&iggy, "events", 0..50).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&sink_file(&redis, "events", "out")))
        .unwrap();
    runtime.start_enabled().await;
    let mut client = redis.client().await;
    eventually("the first messages in the stream", LONG, async || {
        stream_ids(&mut client, "out").await.len() == 50
    })
    .await;
    redis.kill();
    produce(&iggy, "events", 50..100).await;
    redis.restart();
    let mut client = redis.client().await;
    eventually(
        "every message in the stream after the restart",
        LONG,
        async || stream_ids(&mut client, "out").await.len() == 100,
    )
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_with_a_wrong_password_stops_naming_the_url_field() {
    let (redis, iggy) = (RedisServer::with_password("right"), IggyTestServer::start());
    iggy.create_topic("to_redis", "auth", 1);
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let file = sink_file(&redis, "auth", "out").replace(":right@", ":wrong@");
    runtime.add(connector(&file)).unwrap();
    runtime.start_enabled().await;
    let view = support::wait::try_eventually("the sink to stop", LONG, || async {
        let view = runtime
            .view(iggy_connect::connectors::ConnectorKind::Sink, "redis-out")
            .unwrap();
        match view.status.stop_reason {
            Some(_) => support::wait::Check::Ready(view),
            None => support::wait::Check::Pending(format!("{:?}", view.status)),
        }
    })
    .await
    .unwrap();
    runtime.shutdown().await;
    let message = view
        .status
        .last_error
        .map(|error| error.message)
        .unwrap_or_default();
    assert!(message.contains("plugin_config.url"), "{message}");
    assert!(
        !message.contains("wrong"),
        "the password is not shown: {message}"
    );
}
