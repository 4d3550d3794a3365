//! Deferred acknowledgement (rule K6): a sink that buffers gets its offsets
//! committed only as far as it reports durable, per partition, in order.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::scripted::{self, DeferredScript, GROUP, STREAM, SinkControl, TOPIC};
use super::{Harness, wait_for};
use crate::config::{ConnectorConfig, KindConfig, OnError};
use crate::iggy::{Bus, ProducerTarget};
use crate::message::OutgoingMessage;

/// A sink config whose polls return one message each.
fn one_message_batches(key: &str) -> ConnectorConfig {
    let mut config = scripted::sink_config(key, OnError::Stop);
    if let KindConfig::Sink { streams, .. } = &mut config.kind_config {
        streams[0].batch_length = 1;
    }
    config
}

fn deferred_sink(seal_every: usize, flush_interval: Option<Duration>) -> Arc<SinkControl> {
    let control = Arc::new(SinkControl::default());
    *control.deferred.lock().unwrap() = Some(DeferredScript {
        seal_every,
        flush_interval,
    });
    control
}

/// Sends `{"n": i}` for `numbers`, one send each: on a topic of several
/// partitions the in-memory bus spreads sends round robin from partition 0.
async fn produce(harness: &Harness, partitions: u32, numbers: std::ops::Range<u64>) {
    let producer = harness
        .bus
        .producer(&ProducerTarget {
            stream: STREAM.into(),
            topic: TOPIC.into(),
            partitions,
            batch_length: 1000,
            linger_time: Duration::ZERO,
        })
        .await
        .unwrap();
    for n in numbers {
        let message = OutgoingMessage {
            id: None,
            headers: Vec::new(),
            payload: Bytes::from(format!(r#"{{"n":{n}}}"#)),
            partition: None,
            origin_timestamp: None,
        };
        producer.send(&[message]).await.unwrap();
    }
}

async fn start(control: &Arc<SinkControl>, grace: Duration) -> Harness {
    let harness = Harness::new(grace);
    harness.factory.sink("snk", control.clone());
    harness.start_sink(one_message_batches("snk")).await;
    harness
}

fn committed(harness: &Harness, partition: u32) -> Option<u64> {
    harness
        .bus
        .committed_offset(STREAM, TOPIC, GROUP, partition)
}

/// Rule K6 (docs/ARCHITECTURE.md): batches the sink only buffered are not
/// committed; the commit comes once a flush made them durable.
#[tokio::test]
async fn given_a_deferred_sink_when_batches_are_only_buffered_should_commit_nothing_until_durable()
{
    let control = deferred_sink(3, None);
    let harness = start(&control, Duration::from_secs(5)).await;
    produce(&harness, 1, 0..2).await;
    wait_for("two batches accepted and flushed for what is due", || {
        control.flushes.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(control.written_numbers().is_empty());

    produce(&harness, 1, 2..3).await;
    wait_for("the sealed file committed", || {
        committed(&harness, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), [0, 1, 2]);
    // Never a commit for the batches while they were only buffered.
    assert_eq!(harness.bus.commit_log(GROUP), [(0, 2)]);
    harness.runtime.shutdown().await;
}

/// Rule K6 (docs/ARCHITECTURE.md): each partition is committed as far as the
/// sink reports it durable, independently of the others.
#[tokio::test]
async fn given_two_partitions_when_one_is_durable_should_commit_only_that_one() {
    let control = deferred_sink(2, None);
    let harness = start(&control, Duration::from_secs(5)).await;
    // Partitions 0, 1, 0: partition 0 fills a file, partition 1 does not.
    produce(&harness, 2, 0..3).await;
    wait_for("partition 0 committed", || {
        committed(&harness, 0) == Some(1)
    })
    .await;
    wait_for("every batch accepted", || {
        control.flushes.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert_eq!(committed(&harness, 1), None);
    assert_eq!(control.written_numbers(), [0, 2]);

    produce(&harness, 2, 3..4).await;
    wait_for("partition 1 committed", || {
        committed(&harness, 1) == Some(1)
    })
    .await;
    assert_eq!(harness.bus.commit_log(GROUP), [(0, 1), (1, 1)]);
    harness.runtime.shutdown().await;
}

/// Rule K6 (docs/ARCHITECTURE.md): a flush that fails transiently is
/// retried with backoff, commits nothing meanwhile, and the data arrives once
/// it succeeds.
#[tokio::test]
async fn given_failing_flushes_when_retried_should_commit_nothing_until_the_data_is_durable() {
    let control = deferred_sink(3, None);
    control.flush_failures.store(u32::MAX, Ordering::SeqCst);
    let harness = start(&control, Duration::from_secs(5)).await;
    produce(&harness, 1, 0..3).await;
    wait_for("the flush of the sealed file retried", || {
        control.flushes.load(Ordering::SeqCst) >= 6
    })
    .await;
    assert!(harness.bus.commit_log(GROUP).is_empty());
    assert!(control.written_numbers().is_empty());

    control.flush_failures.store(0, Ordering::SeqCst);
    wait_for("the file committed", || committed(&harness, 0) == Some(2)).await;
    assert_eq!(control.written_numbers(), [0, 1, 2]);
    assert_eq!(harness.bus.commit_log(GROUP), [(0, 2)]);
    let view = harness
        .runtime
        .view(crate::connectors::ConnectorKind::Sink, "snk")
        .unwrap();
    assert!(view.metrics.retries.get() >= 3);
    harness.runtime.shutdown().await;
}

/// Rule K6 (docs/ARCHITECTURE.md): with `flush_interval`, what the sink holds
/// is flushed once the oldest batch is that old, with no new data arriving.
#[tokio::test]
async fn given_a_flush_interval_when_batches_wait_should_flush_and_commit_them() {
    let control = deferred_sink(1000, Some(Duration::from_millis(50)));
    let harness = start(&control, Duration::from_secs(5)).await;
    produce(&harness, 1, 0..3).await;
    wait_for("the aged batches committed", || {
        committed(&harness, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), [0, 1, 2]);
    harness.runtime.shutdown().await;
}

/// Rules K6, K5 (docs/ARCHITECTURE.md): a stop flushes what the sink holds
/// within the grace period and commits it.
#[tokio::test]
async fn given_buffered_batches_when_stopping_should_flush_and_commit_them_within_the_grace_period()
{
    let control = deferred_sink(1000, None);
    let harness = start(&control, Duration::from_secs(5)).await;
    produce(&harness, 1, 0..3).await;
    wait_for("three batches accepted", || {
        control.flushes.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(harness.bus.commit_log(GROUP).is_empty());

    harness.runtime.shutdown().await;
    assert_eq!(control.written_numbers(), [0, 1, 2]);
    assert_eq!(harness.bus.commit_log(GROUP), [(0, 2)]);
}

/// Rule K6 (docs/ARCHITECTURE.md): a stop flush that does not finish within
/// the grace period commits nothing (the data is read again after a restart).
#[tokio::test]
async fn given_a_flush_slower_than_the_grace_period_when_stopping_should_commit_nothing() {
    let control = deferred_sink(1000, None);
    let harness = start(&control, Duration::from_millis(100)).await;
    produce(&harness, 1, 0..3).await;
    wait_for("three batches accepted", || {
        control.flushes.load(Ordering::SeqCst) >= 3
    })
    .await;
    *control.flush_delay.lock().unwrap() = Duration::from_secs(30);

    harness.runtime.shutdown().await;
    assert!(control.written_numbers().is_empty());
    assert!(harness.bus.commit_log(GROUP).is_empty());
}

/// Rule K6 (docs/ARCHITECTURE.md): a failed offset commit of durable data is
/// tried again without waiting for new data.
#[tokio::test]
async fn given_a_refused_commit_when_data_is_durable_should_commit_it_again() {
    let control = deferred_sink(3, None);
    let harness = start(&control, Duration::from_secs(5)).await;
    harness.bus.refuse_commits(1);
    produce(&harness, 1, 0..3).await;
    wait_for("the file committed", || committed(&harness, 0) == Some(2)).await;
    assert_eq!(control.written_numbers(), [0, 1, 2]);
    harness.runtime.shutdown().await;
}
