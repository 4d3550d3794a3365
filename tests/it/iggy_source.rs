//! The iggy source replicating between two in-process Iggy test servers over
//! the real `iggy` client: the remote cluster it consumes through a consumer
//! group, and ours, which the engine produces to.
#![cfg(feature = "iggy-source")]

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::{
    Client as _, HeaderKey, HeaderValue, Identifier, IggyClient, IggyMessage, MessageClient,
    PartitionClient, Partitioning,
};
use iggy_binary_protocol::codes::SEND_MESSAGES_CODE;
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::{ConnectionSettings, IggyBus};
use iggy_connect::state::FileStateStore;

use crate::support::iggy_server::{IggyTestServer, StoredMessage};
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(60);
const GROUP: &str = "replicator";
/// The source's `batch_length`: the most one uncommitted batch can repeat.
const BATCH: usize = 10;

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("test.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad test config: {issues}"))
        .0
}

/// A runtime producing to `ours`, with its state in `state`.
fn runtime(ours: &IggyTestServer, state: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(ConnectionSettings::password(
            ours.address().to_string(),
            "iggy",
            "iggy",
        ))),
        Arc::new(FileStateStore::new(state).unwrap()),
        Duration::from_secs(5),
    )
}

/// A replicator of `topics` (remote `stream/topic`) into `targets` (ours).
fn replicator(
    remote: &IggyTestServer,
    topics: &[&str],
    targets: &[(&str, &str)],
    extra: &str,
) -> ConnectorConfig {
    connector(&replicator_toml(remote, topics, targets, extra))
}

/// [`replicator`]'s connector file.
fn replicator_toml(
    remote: &IggyTestServer,
    topics: &[&str],
    targets: &[(&str, &str)],
    extra: &str,
) -> String {
    let streams: String = targets
        .iter()
        .map(|(stream, topic)| {
            format!("[[streams]]\nstream = \"{stream}\"\ntopic = \"{topic}\"\nschema = \"raw\"\n")
        })
        .collect();
    let topics = topics
        .iter()
        .map(|topic| format!("\"{topic}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "type = \"source\"\nkey = \"replicator\"\npath = \"iggy\"\nmax_consecutive_nacks = 0\n{streams}\
         [plugin_config]\naddress = \"{}\"\ntopics = [{topics}]\nconsumer_group = \"{GROUP}\"\n\
         batch_length = {BATCH}\npoll_interval = \"5ms\"\nstall_timeout = \"1s\"\n{extra}\n",
        remote.address()
    )
}

async fn client(server: &IggyTestServer) -> IggyClient {
    let client = IggyClient::from_connection_string(&format!(
        "{}?reestablish_after=50ms&reconnection_interval=100ms",
        server.connection_string()
    ))
    .unwrap();
    client.connect().await.unwrap();
    client
}

fn headers(id: u128) -> BTreeMap<HeaderKey, HeaderValue> {
    BTreeMap::from([
        (
            HeaderKey::from_str("trace").unwrap(),
            HeaderValue::from_str(&format!("t-{id}")).unwrap(),
        ),
        (
            HeaderKey::from_str("attempt").unwrap(),
            HeaderValue::from(3u64),
        ),
    ])
}

/// Sends messages `ids` (payload `m-<id>`, headers of `headers`) to `partition`.
async fn produce(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partition: u32,
    ids: std::ops::Range<u128>,
) {
    let mut messages: Vec<IggyMessage> = ids
        .map(|id| {
            IggyMessage::builder()
                .id(id)
                .payload(Bytes::from(format!("m-{id}")))
                .user_headers(headers(id))
                .build()
                .unwrap()
        })
        .collect();
    client
        .send_messages(
            &Identifier::named(stream).unwrap(),
            &Identifier::named(topic).unwrap(),
            &Partitioning::partition_id(partition),
            &mut messages,
        )
        .await
        .unwrap();
}

fn ids(messages: &[StoredMessage]) -> HashSet<u128> {
    messages.iter().map(|message| message.id).collect()
}

/// How many stored messages repeat an id seen before.
fn duplicates(messages: &[StoredMessage]) -> usize {
    messages.len() - ids(messages).len()
}

fn expected(ids: std::ops::Range<u128>) -> HashSet<u128> {
    ids.collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicates_each_message_once_keeping_ids_headers_and_payloads_under_renamed_names() {
    let (remote, ours) = (IggyTestServer::start(), IggyTestServer::start());
    remote.create_topic("orders", "created", 2);
    remote.create_topic("orders", "paid", 1);
    let producer = client(&remote).await;
    produce(&producer, "orders", "created", 0, 1..81).await;
    produce(&producer, "orders", "created", 1, 81..121).await;
    produce(&producer, "orders", "paid", 0, 1001..1031).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&ours, state.path());
    runtime
        .add(replicator(
            &remote,
            &["orders/created", "orders/paid"],
            &[("dr_orders", "created"), ("billing", "payments")],
            "rename = { \"orders\" = \"dr_orders\", \"orders/paid\" = \"billing/payments\" }",
        ))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("both topics replicated", LONG, || {
        ids(&ours.messages("dr_orders", "created")) == expected(1..121)
            && ids(&ours.messages("billing", "payments")) == expected(1001..1031)
    })
    .await;
    // Messages that arrive while it runs follow.
    produce(&producer, "orders", "created", 1, 121..131).await;
    wait_for("the new messages replicated", LONG, || {
        ids(&ours.messages("dr_orders", "created")) == expected(1..131)
    })
    .await;
    wait_for("the remote offsets stored", LONG, || {
        remote.stored_offset("orders", "created", GROUP, 0) == Some(79)
            && remote.stored_offset("orders", "created", GROUP, 1) == Some(49)
            && remote.stored_offset("orders", "paid", GROUP, 0) == Some(29)
    })
    .await;
    runtime.shutdown().await;

    let created = ours.messages("dr_orders", "created");
    assert_eq!(
        duplicates(&created),
        0,
        "nothing failed, so nothing repeats"
    );
    assert_eq!(created.len(), 130);
    for message in created.iter().chain(&ours.messages("billing", "payments")) {
        assert_eq!(message.payload, Bytes::from(format!("m-{}", message.id)));
        assert_eq!(
            message.user_headers_map(),
            headers(message.id),
            "id {}",
            message.id
        );
    }
    assert!(
        ours.messages("orders", "created").is_empty(),
        "renamed, not copied under the old name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_restart_mid_stream_resumes_after_the_committed_offsets_and_loses_nothing() {
    let (mut remote, ours) = (IggyTestServer::start(), IggyTestServer::start());
    remote.create_topic("edge", "readings", 1);
    let producer = client(&remote).await;
    produce(&producer, "edge", "readings", 0, 1..1001).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&ours, state.path());
    runtime
        .add(replicator(
            &remote,
            &["edge/readings"],
            &[("edge", "readings")],
            "",
        ))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("part of the stream replicated", LONG, || {
        ours.message_count("edge", "readings") >= 30
    })
    .await;
    remote.restart();
    let replicated_at_restart = ours.message_count("edge", "readings");
    // The restart closed the producer's connection too.
    produce(&client(&remote).await, "edge", "readings", 0, 1001..1101).await;
    wait_for("everything replicated after the restart", LONG, || {
        ids(&ours.messages("edge", "readings")) == expected(1..1101)
    })
    .await;
    wait_for("the remote offset to cover the topic", LONG, || {
        remote.stored_offset("edge", "readings", GROUP, 0) == Some(1099)
    })
    .await;
    runtime.shutdown().await;
    let stored = ours.messages("edge", "readings");
    assert!(
        replicated_at_restart < 1000,
        "the restart must land mid-stream ({replicated_at_restart} of 1000 were already replicated)"
    );
    assert!(
        duplicates(&stored) <= BATCH,
        "at most the batch in flight repeats, {} did",
        duplicates(&stored)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_our_cluster_refuses_sends_the_remote_offsets_stay_and_nothing_is_lost() {
    let (remote, ours) = (IggyTestServer::start(), IggyTestServer::start());
    remote.create_topic("core", "events", 1);
    let producer = client(&remote).await;
    produce(&producer, "core", "events", 0, 1..21).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&ours, state.path());
    runtime
        .add(replicator(
            &remote,
            &["core/events"],
            &[("core", "events")],
            "",
        ))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the first messages replicated", LONG, || {
        ids(&ours.messages("core", "events")) == expected(1..21)
    })
    .await;
    wait_for("their offset stored", LONG, || {
        remote.stored_offset("core", "events", GROUP, 0) == Some(19)
    })
    .await;
    ours.faults().refuse_sends_until_cleared();
    let sends_before = ours.request_count(SEND_MESSAGES_CODE);
    produce(&producer, "core", "events", 0, 21..61).await;
    wait_for("several sends refused", LONG, || {
        ours.request_count(SEND_MESSAGES_CODE) >= sends_before + 3
    })
    .await;
    assert_eq!(
        remote.stored_offset("core", "events", GROUP, 0),
        Some(19),
        "no remote offset moves while our cluster refuses the messages"
    );
    ours.faults().clear();
    wait_for(
        "everything replicated once sends are accepted",
        LONG,
        || ids(&ours.messages("core", "events")) == expected(1..61),
    )
    .await;
    wait_for("the remote offset caught up", LONG, || {
        remote.stored_offset("core", "events", GROUP, 0) == Some(59)
    })
    .await;
    runtime.shutdown().await;
    let stored = ours.messages("core", "events");
    assert!(
        duplicates(&stored) <= BATCH,
        "{} repeated",
        duplicates(&stored)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_a_streams_entry_stops_the_start_naming_it() {
    let (remote, ours) = (IggyTestServer::start(), IggyTestServer::start());
    remote.create_topic("a", "b", 1);
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&ours, state.path());
    runtime
        .add(replicator(&remote, &["a/b"], &[("a", "other")], ""))
        .unwrap();
    runtime.start_enabled().await;
    let view = || {
        runtime
            .view(
                iggy_connect::connectors::ConnectorKind::Source,
                "replicator",
            )
            .unwrap()
            .status
    };
    wait_for("the start to fail", LONG, || view().stop_reason.is_some()).await;
    let message = view()
        .last_error
        .map(|error| error.message)
        .unwrap_or_default();
    assert!(
        message.contains("a/b goes to a/b") && message.contains("[[streams]]"),
        "{message}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_remote_partition_lands_in_order_in_the_same_target_partition_with_its_origin_timestamps()
 {
    let (remote, ours) = (IggyTestServer::start(), IggyTestServer::start());
    remote.create_topic("edge", "readings", 3);
    ours.create_topic("core", "readings", 3);
    let producer = client(&remote).await;
    // Uneven partitions (60, 20 and 40 messages), so that no round robin on
    // our side could line up with the remote's by chance.
    let counts = [60u128, 20, 40];
    for (partition, count) in (0u32..).zip(counts) {
        let first = 1 + u128::from(partition) * 1000;
        produce(
            &producer,
            "edge",
            "readings",
            partition,
            first..first + count,
        )
        .await;
    }
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&ours, state.path());
    runtime
        .add(replicator(
            &remote,
            &["edge/readings"],
            &[("core", "readings")],
            "rename = { \"edge\" = \"core\" }",
        ))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("every message replicated", LONG, || {
        ours.messages("core", "readings").len() >= 120
    })
    .await;
    runtime.shutdown().await;

    let origin = remote.messages("edge", "readings");
    let replicated = ours.messages("core", "readings");
    assert_eq!(duplicates(&replicated), 0);
    for (partition, count) in (0u32..).zip(counts) {
        let remote_partition: Vec<(u128, u64)> = origin
            .iter()
            .filter(|message| message.partition_id == partition)
            .map(|message| (message.id, message.origin_timestamp))
            .collect();
        let ours_partition: Vec<(u128, u64)> = replicated
            .iter()
            .filter(|message| message.partition_id == partition)
            .map(|message| (message.id, message.origin_timestamp))
            .collect();
        assert_eq!(remote_partition.len() as u128, count);
        assert_eq!(
            ours_partition, remote_partition,
            "partition {partition}: the same messages, in the same order, with the remote's origin timestamps"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_to_a_remote_topic_while_it_runs_are_replicated_too() {
    let (remote, ours) = (IggyTestServer::start(), IggyTestServer::start());
    remote.create_topic("shop", "orders", 1);
    let producer = client(&remote).await;
    produce(&producer, "shop", "orders", 0, 1..31).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&ours, state.path());
    // A stall timeout far beyond the waits below, so the stalled-group
    // rebuild (which joins again) is not what finds the new partitions: the
    // server reassigns the group when partitions are added, and the client
    // re-syncs its assignment on every heartbeat (5 s).
    let config = replicator_toml(
        &remote,
        &["shop/orders"],
        &[("shop", "orders")],
        "partitioning = \"balanced\"",
    )
    .replace("stall_timeout = \"1s\"", "stall_timeout = \"300s\"");
    runtime.add(connector(&config)).unwrap();
    runtime.start_enabled().await;
    wait_for("the first partition replicated", LONG, || {
        ids(&ours.messages("shop", "orders")) == expected(1..31)
    })
    .await;
    producer
        .create_partitions(
            &Identifier::named("shop").unwrap(),
            &Identifier::named("orders").unwrap(),
            2,
        )
        .await
        .unwrap();
    produce(&producer, "shop", "orders", 1, 31..61).await;
    produce(&producer, "shop", "orders", 2, 61..91).await;
    produce(&producer, "shop", "orders", 0, 91..101).await;
    wait_for(
        "the new partitions replicated",
        Duration::from_secs(30),
        || ids(&ours.messages("shop", "orders")) == expected(1..101),
    )
    .await;
    wait_for("their offsets stored on the remote", LONG, || {
        remote.stored_offset("shop", "orders", GROUP, 1) == Some(29)
            && remote.stored_offset("shop", "orders", GROUP, 2) == Some(29)
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(duplicates(&ours.messages("shop", "orders")), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_metric_counts_the_messages_waiting_on_the_remote_until_they_are_replicated() {
    let metrics = iggy_connect::api::metrics::install().unwrap();
    let lag = || {
        metrics
            .render()
            .lines()
            .find(|line| {
                line.starts_with("iggy_connector_lag{")
                    && line.contains("connector_key=\"replicator\"")
                    && line.contains("stream=\"fleet\"")
                    && line.contains("partition=\"0\"")
            })
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let (remote, ours) = (IggyTestServer::start(), IggyTestServer::start());
    remote.create_topic("fleet", "positions", 1);
    ours.faults().refuse_sends_until_cleared();
    let producer = client(&remote).await;
    produce(&producer, "fleet", "positions", 0, 1..41).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&ours, state.path());
    runtime
        .add(replicator(
            &remote,
            &["fleet/positions"],
            &[("fleet", "positions")],
            "",
        ))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the lag of the 40 waiting messages", LONG, || {
        lag() == Some(40.0)
    })
    .await;
    ours.faults().clear();
    wait_for("the messages replicated", LONG, || {
        ids(&ours.messages("fleet", "positions")) == expected(1..41)
    })
    .await;
    wait_for("the lag back to 0", LONG, || lag() == Some(0.0)).await;
    runtime.shutdown().await;
}
