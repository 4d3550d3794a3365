//! The delivery contract, tested through the runtime with scripted connectors on
//! the in-memory bus. Each test names one guarantee and fails without it.

mod deferred;
mod dlq;
mod fast_paths;
mod paced;
mod pipelined;
mod prefetch;
mod retries;
mod scripted;
mod tap;
#[path = "../../../tests/support/wait.rs"]
#[allow(dead_code)]
mod wait;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;

use scripted::{GROUP, STREAM, ScriptedFactory, ScriptedSource, SinkControl, Step, TOPIC};

use crate::config::{DeadLetterTarget, OnError};
use crate::connectors::{BatchPolicy, ConnectorKind};
use crate::engine::backoff::Backoff;
use crate::engine::dead_letter;
use crate::engine::runtime::{Runtime, RuntimeOptions};
use crate::engine::{Status, StopReason};
use crate::iggy::{Bus, MemoryBus, ProducerTarget};
use crate::message::{OutgoingMessage, Payload, SourceRecord};
use crate::state::{MemoryStateStore, StateStore, StoredState};

/// `config` dead-lettering to the topic `dlq` of the test stream.
fn dead_lettering(mut config: crate::config::ConnectorConfig) -> crate::config::ConnectorConfig {
    config.dead_letter = Some(DeadLetterTarget {
        stream: STREAM.into(),
        topic: "dlq".into(),
    });
    config
}

/// A record that encodes as JSON (`{"n": 1}`) and one that does not.
fn one_good_one_unencodable() -> Vec<SourceRecord> {
    vec![
        SourceRecord::new(Payload::Json(serde_json::json!({ "n": 1 }))),
        SourceRecord::new(Payload::Raw(Bytes::from_static(b"{not json"))),
    ]
}

const FAST: Backoff = Backoff {
    initial: Duration::from_millis(1),
    max: Duration::from_millis(5),
    multiplier: 2.0,
};

struct Harness {
    bus: MemoryBus,
    state: Arc<MemoryStateStore>,
    factory: Arc<ScriptedFactory>,
    runtime: Arc<Runtime>,
}

impl Harness {
    fn new(shutdown_timeout: Duration) -> Self {
        Self::with_store(shutdown_timeout, |_, state| state)
    }

    /// A harness whose runtime saves state through what `store` makes of the
    /// in-memory store (which the harness still inspects).
    fn with_store(
        shutdown_timeout: Duration,
        store: impl FnOnce(&MemoryBus, Arc<MemoryStateStore>) -> Arc<dyn StateStore>,
    ) -> Self {
        Self::with_options(shutdown_timeout, FAST, store)
    }

    fn with_options(
        shutdown_timeout: Duration,
        source_backoff: Backoff,
        store: impl FnOnce(&MemoryBus, Arc<MemoryStateStore>) -> Arc<dyn StateStore>,
    ) -> Self {
        Self::with_runtime(
            |options| {
                options.shutdown_timeout = shutdown_timeout;
                options.source_backoff = source_backoff;
            },
            store,
        )
    }

    /// A harness whose runtime options `configure` adjusts (from quick
    /// backoffs and a 5 s shutdown timeout).
    fn with_runtime(
        configure: impl FnOnce(&mut RuntimeOptions),
        store: impl FnOnce(&MemoryBus, Arc<MemoryStateStore>) -> Arc<dyn StateStore>,
    ) -> Self {
        let bus = MemoryBus::new();
        let state = Arc::new(MemoryStateStore::new());
        let factory = Arc::new(ScriptedFactory::default());
        let mut options = RuntimeOptions {
            shutdown_timeout: Duration::from_secs(5),
            source_backoff: FAST,
            sink_backoff: FAST,
            factory: factory.clone(),
            ..RuntimeOptions::default()
        };
        configure(&mut options);
        let runtime =
            Runtime::with_options(Arc::new(bus.clone()), store(&bus, state.clone()), options);
        Self {
            bus,
            state,
            factory,
            runtime,
        }
    }

    /// Registers `source` under `key` (with a NACK limit override) and starts it.
    async fn start_source(&self, key: &str, source: ScriptedSource, nack_limit: Option<u32>) {
        self.factory.source_once(key, source);
        self.runtime
            .add(scripted::source_config(key, nack_limit))
            .unwrap();
        self.runtime.start_enabled().await;
    }

    /// A sink `key` whose backend refuses the messages marked `"bad"`.
    fn rejecting_sink(&self, key: &str) -> Arc<SinkControl> {
        let control = Arc::new(SinkControl::default());
        control.reject_bad.store(true, Ordering::SeqCst);
        self.factory.sink(key, control.clone());
        control
    }

    /// A source `key`, polled once, whose first poll returns `records` (no
    /// state); not started.
    fn one_batch_source(&self, key: &str, records: Vec<SourceRecord>) -> Arc<scripted::SourceLog> {
        let (source, log) = ScriptedSource::new(
            vec![Step::Batch {
                records,
                state: None,
            }],
            BatchPolicy::default(),
        );
        self.factory.source_once(key, source);
        log
    }

    async fn start_sink(&self, config: crate::config::ConnectorConfig) {
        self.runtime.add(config).unwrap();
        self.runtime.start_enabled().await;
    }

    /// The states saved so far, oldest first (their data).
    fn saved_states(&self) -> Vec<Vec<u8>> {
        self.state
            .saves()
            .into_iter()
            .map(|(_, data)| data)
            .collect()
    }

    fn numbers_in_topic(&self, topic: &str) -> Vec<u64> {
        self.bus
            .messages(STREAM, topic)
            .iter()
            .filter_map(|message| {
                serde_json::from_slice::<serde_json::Value>(&message.payload)
                    .ok()?
                    .get("n")?
                    .as_u64()
            })
            .collect()
    }

    fn status(&self, kind: ConnectorKind, key: &str) -> crate::engine::StatusSnapshot {
        self.runtime.view(kind, key).unwrap().status
    }

    async fn produce(&self, payloads: &[&[u8]]) {
        let producer = self
            .bus
            .producer(&ProducerTarget {
                stream: STREAM.into(),
                topic: TOPIC.into(),
                partitions: 1,
                batch_length: 1000,
                linger_time: Duration::ZERO,
            })
            .await
            .unwrap();
        let messages: Vec<OutgoingMessage> = payloads
            .iter()
            .map(|payload| OutgoingMessage {
                id: None,
                headers: Vec::new(),
                payload: Bytes::copy_from_slice(payload),
                partition: None,
                origin_timestamp: None,
            })
            .collect();
        producer.send(&messages).await.unwrap();
    }
}

/// Polls `condition` until it holds, failing the test after 10 s.
async fn wait_for(what: &str, condition: impl FnMut() -> bool) {
    wait::wait_for(what, Duration::from_secs(10), condition).await;
}

fn state_bytes(end: u64) -> Vec<u8> {
    end.to_le_bytes().to_vec()
}

/// Rule S2 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_batch_when_delivered_should_commit_only_after_send_and_state_save() {
    let harness = Harness::new(Duration::from_secs(5));
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::default());
    let (bus, state) = (harness.bus.clone(), harness.state.clone());
    *log.probe.lock().unwrap() = Some(Box::new(move || {
        format!(
            "messages={} state={:?}",
            bus.messages(STREAM, TOPIC).len(),
            state.get("src").map(|stored| stored.data)
        )
    }));
    harness.start_source("src", source, None).await;

    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(
        *log.at_commit.lock().unwrap(),
        vec![format!("messages=3 state={:?}", Some(state_bytes(3)))]
    );
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2]);
    harness.runtime.shutdown().await;
}

/// Rule S2, S3 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_state_save_failures_when_delivering_should_not_commit_until_the_state_is_saved() {
    let harness = Harness::new(Duration::from_secs(5));
    harness.state.refuse_saves(2);
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::default());
    let state = harness.state.clone();
    *log.probe.lock().unwrap() = Some(Box::new(move || format!("saves={}", state.saves().len())));
    harness.start_source("src", source, None).await;

    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(*log.at_commit.lock().unwrap(), vec!["saves=1".to_string()]);
    // The send succeeded the first time: retrying the save did not resend it.
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2]);
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.metrics.nacks.get(), 2);
    harness.runtime.shutdown().await;
}

/// Rule S3 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_refused_sends_when_retried_should_resend_the_same_batch_and_never_save_state_past_it()
 {
    let harness = Harness::new(Duration::from_secs(5));
    harness.bus.refuse_sends(3);
    let (source, log) = ScriptedSource::new(
        vec![Step::numbers(0..3), Step::numbers(3..6)],
        BatchPolicy::default(),
    );
    let polls = log.clone();
    *log.probe.lock().unwrap() = Some(Box::new(move || {
        format!("polls={}", polls.polls.load(Ordering::SeqCst))
    }));
    harness.start_source("src", source, None).await;

    wait_for("both batches to commit", || {
        log.commits.load(Ordering::SeqCst) == 2
    })
    .await;
    // No poll happened while the first batch was being retried.
    assert_eq!(
        *log.at_commit.lock().unwrap(),
        vec!["polls=1".to_string(), "polls=2".to_string()]
    );
    // Saves happened only after each batch was sent, in order.
    let saves = harness.saved_states();
    assert_eq!(saves, vec![state_bytes(3), state_bytes(6)]);
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2, 3, 4, 5]);
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.metrics.nacks.get(), 3);
    assert_eq!(view.metrics.sent.get(), 6);
    assert_eq!(view.status.status, Status::Running);
    harness.runtime.shutdown().await;
}

/// Rule S4, S6 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_sends_refused_past_the_limit_when_retried_should_stop_with_reason_nack_limit() {
    let harness = Harness::new(Duration::from_secs(5));
    harness.bus.refuse_sends(u32::MAX);
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::default());
    harness.factory.source_once("src", source);
    harness
        .runtime
        .add(scripted::source_config("src", Some(3)))
        .unwrap();
    harness.runtime.start_enabled().await;

    wait_for("the source to stop", || {
        harness.status(ConnectorKind::Source, "src").status == Status::Error
    })
    .await;
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.status.stop_reason, Some(StopReason::NackLimit));
    assert!(
        view.status
            .last_error
            .unwrap()
            .message
            .contains("max_consecutive_nacks = 3")
    );
    assert_eq!(view.metrics.nacks.get(), 3);
    assert_eq!(log.commits.load(Ordering::SeqCst), 0);
    assert_eq!(log.closes.load(Ordering::SeqCst), 1);
    assert!(
        harness.state.get("src").is_none(),
        "no state may cover an unsent batch"
    );
}

/// Rule S4 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_nack_limit_zero_when_sends_fail_many_times_should_never_stop() {
    let harness = Harness::new(Duration::from_secs(5));
    harness.bus.refuse_sends(25);
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::default());
    harness.factory.source_once("src", source);
    harness
        .runtime
        .add(scripted::source_config("src", Some(0)))
        .unwrap();
    harness.runtime.start_enabled().await;

    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.metrics.nacks.get(), 25);
    assert_eq!(view.status.status, Status::Running);
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2]);
    harness.runtime.shutdown().await;
}

/// Rule S6 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_connector_that_panics_when_polled_should_stop_only_that_connector_with_reason_panic()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let (panicking, _) = ScriptedSource::new(vec![Step::Panic], BatchPolicy::default());
    let (healthy, healthy_log) = ScriptedSource::new(
        vec![Step::numbers(0..2), Step::numbers(2..4)],
        BatchPolicy::default(),
    );
    harness.factory.source_once("bad", panicking);
    harness.factory.source_once("good", healthy);
    harness
        .runtime
        .add(scripted::source_config("bad", None))
        .unwrap();
    harness
        .runtime
        .add(scripted::source_config("good", None))
        .unwrap();
    harness.runtime.start_enabled().await;

    wait_for("the panicking source to stop", || {
        harness.status(ConnectorKind::Source, "bad").status == Status::Error
    })
    .await;
    let bad = harness.status(ConnectorKind::Source, "bad");
    assert_eq!(bad.stop_reason, Some(StopReason::Panic));
    assert!(bad.last_error.unwrap().message.contains("scripted panic"));
    wait_for("the healthy source to keep going", || {
        healthy_log.commits.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(
        harness.status(ConnectorKind::Source, "good").status,
        Status::Running
    );
    harness.runtime.shutdown().await;
}

/// Rule K2, S6 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_panicking_sink_when_writing_should_stop_it_with_reason_panic_and_commit_nothing() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    control.panic_next.store(true, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness.produce(&[br#"{"n":0}"#]).await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("the sink to stop", || {
        harness.status(ConnectorKind::Sink, "snk").status == Status::Error
    })
    .await;
    assert_eq!(
        harness.status(ConnectorKind::Sink, "snk").stop_reason,
        Some(StopReason::Panic)
    );
    assert_eq!(harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0), None);
}

/// Rule S6 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_transient_and_fatal_poll_errors_when_polling_should_retry_the_first_and_stop_on_the_second()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let (source, log) = ScriptedSource::new(
        vec![Step::Fail(true), Step::numbers(0..1), Step::Fail(false)],
        BatchPolicy::default(),
    );
    harness.start_source("src", source, None).await;

    wait_for("the fatal error to stop the source", || {
        harness.status(ConnectorKind::Source, "src").status == Status::Error
    })
    .await;
    assert_eq!(log.commits.load(Ordering::SeqCst), 1);
    assert_eq!(
        harness.status(ConnectorKind::Source, "src").stop_reason,
        Some(StopReason::Fatal)
    );
}

/// Rule S5 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_record_that_does_not_encode_when_preparing_should_drop_and_count_it_and_send_the_rest()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let records = vec![
        SourceRecord::new(Payload::Json(serde_json::json!({ "n": 1 }))),
        SourceRecord::new(Payload::Raw(Bytes::from_static(b"{not json"))),
        SourceRecord::new(Payload::Json(serde_json::json!({ "n": 2 }))),
    ];
    let (source, log) = ScriptedSource::new(
        vec![Step::Batch {
            records,
            state: None,
        }],
        BatchPolicy::default(),
    );
    harness.start_source("src", source, None).await;

    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![1, 2]);
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.metrics.errors.get(), 1);
    assert_eq!(view.metrics.nacks.get(), 0);
    assert_eq!(view.metrics.sent.get(), 2);
    harness.runtime.shutdown().await;
}

/// Rule K3 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_message_that_does_not_decode_when_consumed_should_skip_and_count_it_and_write_the_rest()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    harness.factory.sink("snk", control.clone());
    harness
        .produce(&[br#"{"n":0}"#, b"{garbage", br#"{"n":2}"#])
        .await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0, 2]);
    let view = harness.runtime.view(ConnectorKind::Sink, "snk").unwrap();
    assert_eq!(view.metrics.skipped.get(), 1);
    assert_eq!(view.metrics.errors.get(), 1);
    assert_eq!(view.status.status, Status::Running);
    harness.runtime.shutdown().await;
}

/// Rule K2, K3 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_transient_write_failures_when_retrying_should_leave_offsets_uncommitted_until_written()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    control.transient_failures.store(u32::MAX, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness
        .produce(&[br#"{"n":0}"#, br#"{"n":1}"#, br#"{"n":2}"#])
        .await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("several failed writes", || {
        control.writes.load(Ordering::SeqCst) >= 5
    })
    .await;
    assert_eq!(harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0), None);
    assert!(control.written_numbers().is_empty());

    control.transient_failures.store(0, Ordering::SeqCst);
    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0, 1, 2]);
    assert_eq!(
        harness.status(ConnectorKind::Sink, "snk").status,
        Status::Running
    );
    harness.runtime.shutdown().await;
}

/// Rule K2 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_sink_stopped_while_its_writes_fail_when_restarted_should_get_the_batch_again() {
    let harness = Harness::new(Duration::from_millis(50));
    let control = Arc::new(SinkControl::default());
    control.transient_failures.store(u32::MAX, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness.produce(&[br#"{"n":0}"#, br#"{"n":1}"#]).await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("a failed write", || {
        control.writes.load(Ordering::SeqCst) >= 2
    })
    .await;
    harness
        .runtime
        .stop(ConnectorKind::Sink, "snk")
        .await
        .unwrap();
    assert_eq!(
        harness.status(ConnectorKind::Sink, "snk").status,
        Status::Stopped
    );
    assert_eq!(harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0), None);

    control.transient_failures.store(0, Ordering::SeqCst);
    harness
        .runtime
        .start(ConnectorKind::Sink, "snk")
        .await
        .unwrap();
    wait_for("the redelivered batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(1)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0, 1]);
    harness.runtime.shutdown().await;
}

/// Rule K3 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_rejected_message_when_on_error_is_stop_should_stop_with_reason_rejected_and_keep_offsets()
 {
    let harness = Harness::new(Duration::from_secs(5));
    harness.rejecting_sink("snk");
    harness
        .produce(&[br#"{"n":0}"#, br#"{"n":1,"bad":true}"#])
        .await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("the sink to stop", || {
        harness.status(ConnectorKind::Sink, "snk").status == Status::Error
    })
    .await;
    let status = harness.status(ConnectorKind::Sink, "snk");
    assert_eq!(status.stop_reason, Some(StopReason::Rejected));
    assert!(status.last_error.unwrap().message.contains("offset 1"));
    assert_eq!(harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0), None);
}

/// Rule K3 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_rejected_message_when_on_error_is_skip_should_count_it_and_write_the_rest() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = harness.rejecting_sink("snk");
    harness
        .produce(&[br#"{"n":0}"#, br#"{"n":1,"bad":true}"#, br#"{"n":2}"#])
        .await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Skip))
        .await;

    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0, 2]);
    assert_eq!(
        harness
            .runtime
            .view(ConnectorKind::Sink, "snk")
            .unwrap()
            .metrics
            .skipped
            .get(),
        1
    );
    harness.runtime.shutdown().await;
}

/// Rule K3 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_rejected_message_when_on_error_is_dlq_should_dead_letter_it_with_headers_saying_why()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let control = harness.rejecting_sink("snk");
    harness
        .produce(&[br#"{"n":0}"#, br#"{"n":1,"bad":true}"#])
        .await;
    harness
        .start_sink(dead_lettering(scripted::sink_config("snk", OnError::Dlq)))
        .await;

    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(1)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0]);
    let dead = harness.bus.messages(STREAM, "dlq");
    assert_eq!(dead.len(), 1);
    let header = |key: &str| {
        dead[0]
            .headers
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.to_string())
    };
    assert_eq!(
        header(dead_letter::HEADER_ERROR).as_deref(),
        Some("scripted rejection")
    );
    assert_eq!(
        header(dead_letter::HEADER_ORIGIN_OFFSET).as_deref(),
        Some("1")
    );
    assert_eq!(
        header(dead_letter::HEADER_ORIGIN_TOPIC).as_deref(),
        Some(TOPIC)
    );
    assert_eq!(
        header(dead_letter::HEADER_ORIGIN_STREAM).as_deref(),
        Some(STREAM)
    );
    assert_eq!(
        header(dead_letter::HEADER_ORIGIN_PARTITION).as_deref(),
        Some("0")
    );
    assert_eq!(
        header(dead_letter::HEADER_ERROR_CLASS).as_deref(),
        Some("rejected")
    );
    assert_eq!(header(dead_letter::HEADER_STAGE).as_deref(), Some("write"));
    assert_eq!(header(dead_letter::HEADER_ATTEMPTS).as_deref(), Some("1"));
    assert_eq!(
        header(dead_letter::HEADER_CONNECTOR).as_deref(),
        Some("snk")
    );
    assert_eq!(
        header(dead_letter::HEADER_CONNECTOR_TYPE).as_deref(),
        Some("sink")
    );
    assert!(header(dead_letter::HEADER_TIME).is_some_and(|time| time.ends_with('Z')));
    assert_eq!(
        harness
            .runtime
            .view(ConnectorKind::Sink, "snk")
            .unwrap()
            .metrics
            .dead_lettered
            .get(),
        1
    );
    harness.runtime.shutdown().await;
}

/// Rule S7 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_batch_in_flight_when_shutdown_is_requested_should_commit_it_before_stopping() {
    let harness = Harness::new(Duration::from_secs(5));
    harness.bus.delay_sends(Duration::from_millis(300));
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::default());
    harness.start_source("src", source, None).await;

    wait_for("the batch to be in flight", || {
        log.polls.load(Ordering::SeqCst) == 1
    })
    .await;
    harness.runtime.shutdown().await;
    assert_eq!(log.commits.load(Ordering::SeqCst), 1);
    assert_eq!(
        harness.state.get("src").map(|stored| stored.data),
        Some(state_bytes(3))
    );
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2]);
    assert_eq!(
        harness.status(ConnectorKind::Source, "src").status,
        Status::Stopped
    );
    assert_eq!(
        harness.status(ConnectorKind::Source, "src").stop_reason,
        None
    );
}

/// Rule S7 (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_a_send_slower_than_the_grace_period_when_shutting_down_should_leave_the_batch_uncommitted()
 {
    let harness = Harness::new(Duration::from_millis(50));
    harness.bus.delay_sends(Duration::from_secs(3));
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::default());
    harness.start_source("src", source, None).await;

    wait_for("the batch to be in flight", || {
        log.polls.load(Ordering::SeqCst) == 1
    })
    .await;
    harness.runtime.shutdown().await;
    assert_eq!(log.commits.load(Ordering::SeqCst), 0);
    assert!(harness.state.get("src").is_none());
    assert_eq!(
        harness.status(ConnectorKind::Source, "src").status,
        Status::Stopped
    );
}

/// Rule State (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_saved_state_when_a_source_starts_should_open_it_with_that_state() {
    let harness = Harness::new(Duration::from_secs(5));
    harness.state.put(
        "src",
        StoredState {
            connector: "scripted".into(),
            data: state_bytes(42),
        },
    );
    let (source, log) = ScriptedSource::new(Vec::new(), BatchPolicy::default());
    harness.start_source("src", source, None).await;

    wait_for("the source to open", || {
        log.opened_with.lock().unwrap().is_some()
    })
    .await;
    assert_eq!(
        *log.opened_with.lock().unwrap(),
        Some(Some(state_bytes(42)))
    );
    harness.runtime.shutdown().await;
}

/// Rule State (docs/ARCHITECTURE.md).
#[tokio::test]
async fn given_state_written_by_another_connector_when_starting_should_refuse_to_start() {
    let harness = Harness::new(Duration::from_secs(5));
    harness.state.put(
        "src",
        StoredState {
            connector: "postgres".into(),
            data: state_bytes(1),
        },
    );
    let (source, log) = ScriptedSource::new(Vec::new(), BatchPolicy::default());
    harness.start_source("src", source, None).await;

    wait_for("the start to fail", || {
        harness.status(ConnectorKind::Source, "src").status == Status::Error
    })
    .await;
    let status = harness.status(ConnectorKind::Source, "src");
    assert_eq!(status.stop_reason, Some(StopReason::StartFailed));
    assert!(status.last_error.unwrap().message.contains("memory:src"));
    assert!(log.opened_with.lock().unwrap().is_none());
}

/// S4: with the default NACK limit and backoff a source rides out a broker
/// outage of two minutes, then delivers. Time runs 1000 times faster: the
/// default backoff divided by 1000 against an outage of 120 ms.
#[tokio::test]
async fn given_default_settings_when_the_broker_is_down_for_two_minutes_should_keep_the_source_running()
 {
    const SPEEDUP: u32 = 1000;
    let backoff = Backoff {
        initial: Backoff::SOURCE.initial / SPEEDUP,
        max: Backoff::SOURCE.max / SPEEDUP,
        multiplier: Backoff::SOURCE.multiplier,
    };
    let outage = Duration::from_secs(120) / SPEEDUP;
    let harness = Harness::with_options(Duration::from_secs(5), backoff, |_, state| state);
    harness.bus.refuse_sends(u32::MAX);
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::default());
    harness.start_source("src", source, None).await;
    let started = Instant::now();
    let bus = harness.bus.clone();
    tokio::spawn(async move {
        tokio::time::sleep(outage).await;
        bus.refuse_sends(0);
    });

    wait_for("the batch to be delivered after the outage", || {
        let status = harness.status(ConnectorKind::Source, "src");
        assert_ne!(status.status, Status::Error, "{status:?}");
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(started.elapsed() >= outage);
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2]);
    harness.runtime.shutdown().await;
}
