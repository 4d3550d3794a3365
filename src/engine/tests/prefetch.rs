//! Sink prefetch (rule K5): the next batch is polled while the current one is
//! written, and no commit passes a write that has not succeeded.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::scripted::{self, GROUP, STREAM, SinkControl, TOPIC};
use super::{Harness, wait_for};
use crate::config::{ConnectorConfig, KindConfig, OnError};

/// A sink config whose polls return one message each.
fn one_message_batches(key: &str) -> ConnectorConfig {
    let mut config = scripted::sink_config(key, OnError::Stop);
    if let KindConfig::Sink { streams, .. } = &mut config.kind_config {
        streams[0].batch_length = 1;
    }
    config
}

async fn start(control: &Arc<SinkControl>, count: u64) -> Harness {
    let harness = Harness::new(Duration::from_secs(5));
    harness.factory.sink("snk", control.clone());
    let payloads: Vec<Vec<u8>> = (0..count)
        .map(|n| format!(r#"{{"n":{n}}}"#).into_bytes())
        .collect();
    let payloads: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    harness.produce(&payloads).await;
    harness.start_sink(one_message_batches("snk")).await;
    harness
}

fn in_order(count: u64) -> Vec<(u32, u64)> {
    (0..count).map(|offset| (0, offset)).collect()
}

/// Rule K5 (docs/ARCHITECTURE.md): one batch is prefetched during a write, and
/// a sink that cannot write concurrently gets its batches one at a time.
#[tokio::test]
async fn given_a_write_in_progress_when_prefetching_should_poll_the_next_batch_and_write_one_at_a_time()
 {
    let control = Arc::new(SinkControl::default());
    control.hold.store(true, Ordering::SeqCst);
    let harness = start(&control, 3).await;

    wait_for("the next batch polled while the first is written", || {
        harness.bus.batches_polled() >= 2
    })
    .await;
    assert_eq!(harness.bus.batches_polled(), 2, "one batch prefetched");
    assert_eq!(control.in_write.load(Ordering::SeqCst), 1);
    assert!(harness.bus.commit_log(GROUP).is_empty());

    control.hold.store(false, Ordering::SeqCst);
    wait_for("every batch committed", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), [0, 1, 2]);
    assert_eq!(control.most_in_write.load(Ordering::SeqCst), 1);
    assert_eq!(harness.bus.commit_log(GROUP), in_order(3));
    harness.runtime.shutdown().await;
}

/// Rules K2, K5 (docs/ARCHITECTURE.md): while a write fails, the batch
/// prefetched after it is neither written nor committed; once the write
/// succeeds it follows, and offsets are committed in order.
#[tokio::test]
async fn given_a_failing_write_and_a_prefetched_batch_when_retrying_should_commit_nothing_past_it()
{
    let control = Arc::new(SinkControl::default());
    *control.failing_number.lock().unwrap() = Some(0);
    control
        .failing_number_left
        .store(u32::MAX, Ordering::SeqCst);
    let harness = start(&control, 3).await;

    wait_for(
        "retries of the first batch with the next one prefetched",
        || control.writes.load(Ordering::SeqCst) >= 3 && harness.bus.batches_polled() >= 2,
    )
    .await;
    assert!(harness.bus.commit_log(GROUP).is_empty());
    assert!(control.written_numbers().is_empty());

    control.failing_number_left.store(0, Ordering::SeqCst);
    wait_for("every batch committed", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), [0, 1, 2]);
    assert_eq!(harness.bus.commit_log(GROUP), in_order(3));
    harness.runtime.shutdown().await;
}

/// Rules K2, K5 (docs/ARCHITECTURE.md): a sink that writes concurrently has a
/// later batch written while an earlier one fails, and still nothing is
/// committed past the failing one; commits follow poll order.
#[tokio::test]
async fn given_a_concurrent_sink_when_an_earlier_write_fails_should_commit_in_poll_order_and_not_past_it()
 {
    let control = Arc::new(SinkControl::default());
    control.concurrent.store(true, Ordering::SeqCst);
    *control.failing_number.lock().unwrap() = Some(0);
    control
        .failing_number_left
        .store(u32::MAX, Ordering::SeqCst);
    let harness = start(&control, 4).await;

    wait_for("the second batch written while the first fails", || {
        control.written_numbers() == [1]
    })
    .await;
    assert!(harness.bus.commit_log(GROUP).is_empty());

    control.failing_number_left.store(0, Ordering::SeqCst);
    wait_for("every batch committed", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(3)
    })
    .await;
    let mut written = control.written_numbers();
    written.sort_unstable();
    assert_eq!(written, [0, 1, 2, 3]);
    assert_eq!(harness.bus.commit_log(GROUP), in_order(4));
    harness.runtime.shutdown().await;
}
