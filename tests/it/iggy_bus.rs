//! The engine on the Iggy bus: the real `iggy` 0.11.0 client over TCP against the
//! in-process Iggy protocol test server.
#![cfg(all(feature = "random-source", feature = "faulty-sink"))]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy_binary_protocol::codes::SEND_MESSAGES_CODE;
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::{Runtime, Status, StopReason};
use iggy_connect::iggy::{Bus, ConnectionSettings, IggyBus, ProducerTarget};
use iggy_connect::message::OutgoingMessage;
use iggy_connect::state::FileStateStore;

use crate::support::accounting::{self, Seen, seqs_in_file};
use crate::support::iggy_server::{IggyTestServer, ServerConfig};
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(30);

fn settings(server: &IggyTestServer) -> ConnectionSettings {
    ConnectionSettings::password(server.address().to_string(), "iggy", "iggy")
}

fn runtime(server: &IggyTestServer, state_dir: &Path) -> Arc<Runtime> {
    runtime_with(settings(server), state_dir)
}

fn runtime_with(settings: ConnectionSettings, state_dir: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(settings)),
        Arc::new(FileStateStore::new(state_dir).unwrap()),
        Duration::from_secs(5),
    )
}

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("test.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad test config: {issues}"))
        .0
}

fn random_source(key: &str, stream: &str, max_count: u64, extra: &str) -> ConnectorConfig {
    connector(&format!(
        r#"
        type = "source"
        key = "{key}"
        path = "random"
        {extra}
        [[streams]]
        stream = "{stream}"
        topic = "events"
        schema = "json"
        [plugin_config]
        interval = "1ms"
        max_count = {max_count}
        messages_range = [20, 50]
        payload_size = 50
        "#
    ))
}

fn file_sink(key: &str, stream: &str, output: &Path, fail_marker: &Path) -> ConnectorConfig {
    connector(&format!(
        r#"
        type = "sink"
        key = "{key}"
        path = "faulty"
        [[streams]]
        stream = "{stream}"
        topics = ["events"]
        schema = "json"
        batch_length = 100
        poll_interval = "1ms"
        [plugin_config]
        output = "{}"
        fail_while_exists = "{}"
        "#,
        output.display(),
        fail_marker.display()
    ))
}

fn seqs_in_topic(server: &IggyTestServer, stream: &str) -> Seen {
    accounting::seqs_in_topic(server, stream, "events")
}

fn exactly_once(seen: &Seen, count: u64) -> bool {
    seen.len() as u64 == count
        && seen.keys().copied().eq(0..count)
        && seen.values().all(|times| *times == 1)
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_source_through_iggy_reaches_the_sink_exactly_once() {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    let runtime = runtime(&server, &dir.path("state"));
    runtime.add(random_source("rnd", "flow", 500, "")).unwrap();
    runtime
        .add(file_sink(
            "out",
            "flow",
            &dir.path("out.jsonl"),
            &dir.path("fail"),
        ))
        .unwrap();
    runtime.start_enabled().await;

    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    let status = runtime.view(ConnectorKind::Source, "rnd").unwrap().status;
    assert_eq!(
        status.stop_reason,
        Some(StopReason::Completed),
        "{status:?}"
    );
    assert!(exactly_once(&seqs_in_topic(&server, "flow"), 500));
    wait_for("the sink to write everything", LONG, || {
        exactly_once(&seqs_in_file(&dir.path("out.jsonl")), 500)
    })
    .await;
    let group = "iggy-connect-sink-out";
    wait_for("the group offset to cover the topic", LONG, || {
        server.stored_offset("flow", "events", group, 0) == Some(499)
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(
        server.group_members("flow", "events", group),
        0,
        "the sink left its group"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_refusing_sends_for_a_while_loses_and_duplicates_nothing() {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    server.faults().refuse_sends(3);
    let runtime = runtime(&server, &dir.path("state"));
    runtime
        .add(random_source("rnd", "outage", 300, ""))
        .unwrap();
    runtime.start_enabled().await;

    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    let view = runtime.view(ConnectorKind::Source, "rnd").unwrap();
    assert_eq!(
        view.status.stop_reason,
        Some(StopReason::Completed),
        "{:?}",
        view.status
    );
    assert_eq!(view.metrics.nacks.get(), 3);
    assert!(exactly_once(&seqs_in_topic(&server, "outage"), 300));
}

const LIMIT_RUN: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_refusing_sends_past_the_limit_stops_the_source_and_a_restart_resumes() {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    let runtime = runtime(&server, &dir.path("state"));
    // Enough messages that the source is still producing when the refusal
    // starts (about 1 ms a poll): a short run could complete before it.
    runtime
        .add(random_source(
            "rnd",
            "limit",
            LIMIT_RUN,
            "max_consecutive_nacks = 2",
        ))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("some batches to land", LONG, || {
        server.message_count("limit", "events") >= 50
    })
    .await;
    server.faults().refuse_sends_until_cleared();

    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    let status = runtime.view(ConnectorKind::Source, "rnd").unwrap().status;
    assert_eq!(status.status, Status::Error);
    assert_eq!(status.stop_reason, Some(StopReason::NackLimit));
    let before = seqs_in_topic(&server, "limit");
    let delivered = before.len() as u64;
    assert!(exactly_once(&before, delivered));

    server.faults().clear();
    runtime.restart(ConnectorKind::Source, "rnd").await.unwrap();
    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    assert!(exactly_once(&seqs_in_topic(&server, "limit"), LIMIT_RUN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sink_resumes_right_after_its_last_committed_offset() {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    let output = dir.path("out.jsonl");
    let first = runtime(&server, &dir.path("state"));
    first.add(random_source("rnd", "resume", 200, "")).unwrap();
    first
        .add(file_sink("out", "resume", &output, &dir.path("fail")))
        .unwrap();
    first.start_enabled().await;
    first
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    wait_for("the first 200", LONG, || seqs_in_file(&output).len() == 200).await;
    wait_for("the commit of the first 200", LONG, || {
        server.stored_offset("resume", "events", "iggy-connect-sink-out", 0) == Some(199)
    })
    .await;
    first.shutdown().await;

    // More records arrive while no sink runs; the source continues its count.
    let second = runtime(&server, &dir.path("state"));
    second.add(random_source("rnd", "resume", 350, "")).unwrap();
    second
        .add(file_sink("out", "resume", &output, &dir.path("fail")))
        .unwrap();
    second.start(ConnectorKind::Source, "rnd").await.unwrap();
    second
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    assert!(exactly_once(&seqs_in_topic(&server, "resume"), 350));
    second.start(ConnectorKind::Sink, "out").await.unwrap();
    wait_for("the sink to catch up", LONG, || {
        seqs_in_file(&output).len() == 350
    })
    .await;
    second.shutdown().await;
    assert!(
        exactly_once(&seqs_in_file(&output), 350),
        "the sink wrote something twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_whose_writes_fail_does_not_move_the_stored_offset() {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    let (output, marker) = (dir.path("out.jsonl"), dir.path("fail"));
    std::fs::write(&marker, b"").unwrap();
    let runtime = runtime(&server, &dir.path("state"));
    runtime
        .add(random_source("rnd", "failing", 100, ""))
        .unwrap();
    runtime
        .add(file_sink("out", "failing", &output, &marker))
        .unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();

    let sink = runtime.view(ConnectorKind::Sink, "out").unwrap();
    wait_for("several failed writes", LONG, || {
        sink.metrics.retries.get() >= 3
    })
    .await;
    assert_eq!(
        server.stored_offset("failing", "events", "iggy-connect-sink-out", 0),
        None
    );
    assert!(seqs_in_file(&output).is_empty());

    std::fs::remove_file(&marker).unwrap();
    wait_for("the writes to succeed and commit", LONG, || {
        server.stored_offset("failing", "events", "iggy-connect-sink-out", 0) == Some(99)
    })
    .await;
    assert!(exactly_once(&seqs_in_file(&output), 100));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_server_refuses_to_create_fails_the_connector_naming_it_and_existing_topics_still_work()
 {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    server.faults().refuse_topic_creation(4041);
    server.create_topic("existing", "events", 1);
    let runtime = runtime(&server, &dir.path("state"));
    runtime
        .add(random_source("refused", "missing", 10, ""))
        .unwrap();
    runtime
        .add(random_source("works", "existing", 10, ""))
        .unwrap();
    runtime.start_enabled().await;

    runtime
        .wait_until_stopped(ConnectorKind::Source, "refused")
        .await
        .unwrap();
    let status = runtime
        .view(ConnectorKind::Source, "refused")
        .unwrap()
        .status;
    assert_eq!(status.stop_reason, Some(StopReason::StartFailed));
    let message = status.last_error.unwrap().message;
    assert!(
        message.contains("missing/events") && message.contains("4041"),
        "{message}"
    );
    runtime
        .wait_until_stopped(ConnectorKind::Source, "works")
        .await
        .unwrap();
    assert!(exactly_once(&seqs_in_topic(&server, "existing"), 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_mid_stream_lose_nothing() {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    let output = dir.path("out.jsonl");
    let runtime = runtime(&server, &dir.path("state"));
    runtime
        .add(random_source(
            "rnd",
            "drops",
            2000,
            "max_consecutive_nacks = 0",
        ))
        .unwrap();
    runtime
        .add(file_sink("out", "drops", &output, &dir.path("fail")))
        .unwrap();
    runtime.start_enabled().await;
    for threshold in [300, 900, 1500] {
        wait_for("progress", LONG, || {
            server.message_count("drops", "events") >= threshold
        })
        .await;
        server.faults().drop_connections();
    }
    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    let in_topic = seqs_in_topic(&server, "drops");
    assert_eq!(
        in_topic.keys().copied().collect::<Vec<_>>(),
        (0..2000).collect::<Vec<_>>(),
        "a record is missing from the topic"
    );
    wait_for("the sink to get every record", LONG, || {
        seqs_in_file(&output).len() == 2000
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_personal_access_token_signs_in() {
    let server =
        IggyTestServer::start_with(ServerConfig::default().personal_access_token("iggypat-test"));
    let dir = Dir::new();
    let token_file = dir.path("pat");
    std::fs::write(&token_file, "iggypat-test\n").unwrap();
    let config = iggy_connect::config::runtime::IggyConfig {
        address: server.address().to_string(),
        token: secrecy::SecretString::from(format!("file:{}", token_file.display())),
        ..Default::default()
    };
    let settings = ConnectionSettings::from_config(&config).unwrap();
    let runtime = Runtime::new(
        Arc::new(IggyBus::new(settings)),
        Arc::new(FileStateStore::new(dir.path("state")).unwrap()),
        Duration::from_secs(5),
    );
    runtime.add(random_source("rnd", "pat", 10, "")).unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    assert!(exactly_once(&seqs_in_topic(&server, "pat"), 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sink_instances_in_one_group_split_the_partitions_and_write_each_record_once() {
    let server = IggyTestServer::start();
    server.create_topic("split", "events", 2);
    let dir = Dir::new();
    let source_runtime = runtime(&server, &dir.path("state"));
    source_runtime
        .add(random_source("rnd", "split", 2000, ""))
        .unwrap();
    // Two processes' worth of the same sink: same key, so the same group.
    let (first, second) = (dir.path("first.jsonl"), dir.path("second.jsonl"));
    let first_runtime = runtime(&server, &dir.path("state-first"));
    first_runtime
        .add(file_sink("out", "split", &first, &dir.path("fail")))
        .unwrap();
    let second_runtime = runtime(&server, &dir.path("state-second"));
    second_runtime
        .add(file_sink("out", "split", &second, &dir.path("fail")))
        .unwrap();
    first_runtime.start_enabled().await;
    second_runtime.start_enabled().await;
    wait_for("both members in the group", LONG, || {
        server.group_members("split", "events", "iggy-connect-sink-out") == 2
    })
    .await;
    source_runtime.start_enabled().await;

    source_runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    wait_for("every record written by one of the two", LONG, || {
        seqs_in_file(&first).len() + seqs_in_file(&second).len() >= 2000
    })
    .await;
    let (by_first, by_second) = (seqs_in_file(&first), seqs_in_file(&second));
    assert!(
        !by_first.is_empty() && !by_second.is_empty(),
        "each member got a partition"
    );
    let mut all = by_first.clone();
    for (seq, times) in &by_second {
        *all.entry(*seq).or_insert(0) += times;
    }
    assert!(
        exactly_once(&all, 2000),
        "a record was written twice or not at all"
    );
    first_runtime.shutdown().await;
    second_runtime.shutdown().await;
}

/// Settings whose sinks count as stalled after `stall` without a stored offset.
fn stalling_after(server: &IggyTestServer, stall: Duration) -> ConnectionSettings {
    let mut settings = settings(server);
    settings.stall_timeout = stall;
    settings
}

/// The sink finds the ghost a few seconds after it joins again, without
/// waiting for the stall timeout (an hour here: far past the test's
/// deadlines; the default is 60 s, which a sink once waited out after every
/// restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_consumes_again_soon_after_a_broker_restart_leaves_its_old_member_behind() {
    let mut server = IggyTestServer::start();
    let dir = Dir::new();
    let output = dir.path("out.jsonl");
    let group = "iggy-connect-sink-out";
    let runtime = runtime_with(
        stalling_after(&server, Duration::from_secs(3600)),
        &dir.path("state"),
    );
    runtime.add(random_source("rnd", "ghost", 200, "")).unwrap();
    runtime
        .add(file_sink("out", "ghost", &output, &dir.path("fail")))
        .unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    wait_for("the commit of the first 200", LONG, || {
        server.stored_offset("ghost", "events", group, 0) == Some(199)
    })
    .await;

    // The member from before the restart stays (the real server replays its
    // join) and keeps the partition; the sink signs in again as a new member.
    server.restart();
    wait_for("the sink to join again beside its ghost", LONG, || {
        server.group_members("ghost", "events", group) == 2
    })
    .await;
    assert_eq!(
        server.group_assignment("ghost", "events", group)[0],
        vec![0],
        "the ghost holds the partition"
    );
    // 150 more records, written while the ghost holds the partition.
    runtime
        .replace_config(random_source("rnd", "ghost", 350, ""))
        .unwrap();
    runtime.start(ConnectorKind::Source, "rnd").await.unwrap();
    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    assert_eq!(server.message_count("ghost", "events"), 350);
    wait_for(
        "the sink to write the records after the restart",
        LONG,
        || seqs_in_file(&output).len() == 350,
    )
    .await;
    wait_for("their commit", LONG, || {
        server.stored_offset("ghost", "events", group, 0) == Some(349)
    })
    .await;
    assert_eq!(
        server.group_members("ghost", "events", group),
        1,
        "the ghost is gone"
    );
    runtime.shutdown().await;
    let seen = seqs_in_file(&output);
    assert!(seen.keys().copied().eq(0..350), "a record is missing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_stores_no_offset_while_messages_wait_is_degraded_with_its_lag() {
    let server = IggyTestServer::start();
    let dir = Dir::new();
    let output = dir.path("out.jsonl");
    let fail = dir.path("fail");
    std::fs::write(&fail, "").unwrap();
    let runtime = runtime_with(
        stalling_after(&server, Duration::from_millis(500)),
        &dir.path("state"),
    );
    runtime.add(random_source("rnd", "stall", 120, "")).unwrap();
    runtime
        .add(file_sink("out", "stall", &output, &fail))
        .unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "rnd")
        .await
        .unwrap();
    let view = || runtime.view(ConnectorKind::Sink, "out").unwrap();
    wait_for("the sink to be degraded", LONG, || {
        view().degraded.is_some()
    })
    .await;
    let reason = view().degraded.unwrap();
    assert!(reason.contains("120 messages wait"), "{reason}");
    assert!(reason.contains("partition 0: 120"), "{reason}");
    assert_eq!(view().status.status, Status::Running);

    std::fs::remove_file(&fail).unwrap();
    wait_for("the sink to catch up", LONG, || {
        seqs_in_file(&output).len() == 120
    })
    .await;
    wait_for("the degraded flag to clear", LONG, || {
        view().degraded.is_none()
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sinks_group_offsets_move_and_the_sink_reads_from_there() {
    use iggy_connect::engine::offsets;
    use iggy_connect::iggy::OffsetReset;
    let server = IggyTestServer::start();
    let dir = Dir::new();
    let output = dir.path("out.jsonl");
    let group = "iggy-connect-sink-out";
    let runtime = runtime(&server, &dir.path("state"));
    runtime.add(random_source("rnd", "moves", 200, "")).unwrap();
    let sink = file_sink("out", "moves", &output, &dir.path("fail"));
    runtime.add(sink.clone()).unwrap();
    runtime.start_enabled().await;
    wait_for("the commit of all 200", LONG, || {
        server.stored_offset("moves", "events", group, 0) == Some(199)
    })
    .await;
    runtime.stop(ConnectorKind::Sink, "out").await.unwrap();
    let reset = |to: OffsetReset| {
        let (runtime, sink) = (runtime.clone(), sink.clone());
        async move {
            let moved = offsets::reset(runtime.bus(), &sink, &to, None)
                .await
                .unwrap();
            let partition = &moved[0].partitions[0];
            (partition.before, partition.after)
        }
    };
    let stored = || server.stored_offset("moves", "events", group, 0);

    assert_eq!(reset(OffsetReset::Earliest).await, (200, 0));
    assert_eq!(stored(), None);
    assert_eq!(reset(OffsetReset::Latest).await, (0, 200));
    assert_eq!(stored(), Some(199));
    assert_eq!(
        reset(OffsetReset::Offsets([(0, 150)].into())).await,
        (200, 150)
    );
    assert_eq!(stored(), Some(149));
    // A batch shares its timestamp: the first message at or after message
    // 120's time opens its batch.
    let messages = server.messages("moves", "events");
    let at = messages[120].timestamp;
    let first = messages.iter().find(|m| m.timestamp >= at).unwrap().offset;
    assert!(first <= 120 && first > 0, "{first}");
    assert_eq!(reset(OffsetReset::Timestamp(at)).await, (150, first));
    assert_eq!(stored(), Some(first - 1));
    assert_eq!(
        reset(OffsetReset::Timestamp(u64::MAX / 2)).await,
        (first, 200)
    );
    let refused = offsets::reset(
        runtime.bus(),
        &sink,
        &OffsetReset::Offsets([(9, 1)].into()),
        None,
    )
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("no partition 9"), "{refused}");
    assert_eq!(stored(), Some(199), "a refused move changes nothing");
    assert_eq!(
        server.group_members("moves", "events", group),
        0,
        "the reset left the group"
    );

    // From offset 150, the sink writes the last 50 again.
    assert_eq!(
        reset(OffsetReset::Offsets([(0, 150)].into())).await,
        (200, 150)
    );
    runtime.start(ConnectorKind::Sink, "out").await.unwrap();
    wait_for("the last 50 written again", LONG, || {
        seqs_in_file(&output).values().sum::<usize>() == 250
    })
    .await;
    wait_for("the commit of all 200 again", LONG, || {
        stored() == Some(199)
    })
    .await;
    runtime.shutdown().await;
    let seen = seqs_in_file(&output);
    assert_eq!(seen.len(), 200);
    assert_eq!(seen.values().filter(|&&times| times == 2).count(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_batch_sent_again_after_a_lost_reply_stores_the_same_ids_in_the_same_partitions()
{
    let server = IggyTestServer::start();
    let mut settings = settings(&server);
    settings.request_timeout = Duration::from_millis(300);
    let bus = IggyBus::new(settings);
    let producer = bus
        .producer(&ProducerTarget {
            stream: "prepared".into(),
            topic: "events".into(),
            partitions: 4,
            batch_length: 2,
            linger_time: Duration::ZERO,
        })
        .await
        .unwrap();
    // No ids, balanced: the producer picks both when it prepares.
    let messages = (0..4)
        .map(|n| OutgoingMessage::new(None, Vec::new(), Bytes::from(format!("m{n}"))))
        .collect();
    let prepared = producer.prepare(messages);

    server.faults().lose_replies(SEND_MESSAGES_CODE, 1);
    producer
        .send_prepared(&prepared)
        .await
        .expect_err("the first request's reply is lost");
    // Sent again as the engine does, until acknowledged (the client may
    // need a few tries to be back in step after the lost reply).
    let mut attempts = 1;
    while let Err(error) = producer.send_prepared(&prepared).await {
        attempts += 1;
        assert!(attempts < 50, "never acknowledged: {error}");
    }

    let stored = server.messages("prepared", "events");
    let copies = |payload: &str| -> Vec<(u32, u128)> {
        stored
            .iter()
            .filter(|message| message.payload.as_ref() == payload.as_bytes())
            .map(|message| (message.partition_id, message.id))
            .collect()
    };
    // The first request (m0, m1) was stored with its reply lost, then again:
    // every copy is the same message in the same partition.
    for payload in ["m0", "m1", "m2", "m3"] {
        let copies = copies(payload);
        assert!(!copies.is_empty(), "{payload}: {stored:?}");
        assert!(
            copies.iter().all(|copy| *copy == copies[0]),
            "{payload} after {attempts} sends: {stored:?}"
        );
    }
    assert!(copies("m0").len() >= 2, "{stored:?}");
    assert_ne!(copies("m0")[0].0, copies("m2")[0].0, "balanced per request");
}
