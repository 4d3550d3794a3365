//! Rule S8: the engine, not the source, waits between polls. Counted on a
//! paused clock: a wait the engine owns shows as time the clock skipped, a
//! missing one as none.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::scripted::{ScriptedSource, SourceLog, Step, TOPIC};
use super::{Harness, wait_for};
use crate::connectors::{BatchPolicy, ConnectorKind};
use crate::engine::Status;

const INTERVAL: Duration = Duration::from_secs(60);

/// Runs a script of caught-up and not caught-up batches with up to
/// `in_flight` batches in flight; returns the time between consecutive polls.
async fn gaps_between_polls(in_flight: usize) -> Vec<Duration> {
    let harness = Harness::new(Duration::from_secs(5));
    let (source, log) = ScriptedSource::new(
        vec![
            Step::numbers(0..2).caught_up(INTERVAL),
            Step::empty().caught_up(INTERVAL),
            Step::numbers(2..4),
            Step::numbers(4..5),
        ],
        BatchPolicy::default(),
    );
    harness
        .start_source("src", source.in_flight(in_flight), None)
        .await;
    wait_for("the four batches to commit", || {
        log.commits.load(Ordering::SeqCst) == 4
    })
    .await;
    harness.runtime.shutdown().await;
    assert_eq!(
        harness.numbers_in_topic(TOPIC),
        [0, 1, 2, 3, 4],
        "the empty batch sends nothing"
    );
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    let timed: u64 = view.metrics.batch_durations.counts().iter().sum();
    assert_eq!(timed, 3, "the empty batch is timed as a batch");
    poll_gaps(&log)
}

fn poll_gaps(log: &Arc<SourceLog>) -> Vec<Duration> {
    let times = log.poll_times.lock().unwrap().clone();
    times.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn given_a_caught_up_batch_when_polling_again_should_wait_its_interval_and_not_after_other_batches()
 {
    let gaps = gaps_between_polls(1).await;
    assert!(gaps.len() >= 3, "{gaps:?}");
    assert!(
        gaps[0] >= INTERVAL && gaps[1] >= INTERVAL,
        "no wait after a caught-up batch: {gaps:?}"
    );
    assert!(gaps[0] < INTERVAL * 2 && gaps[1] < INTERVAL * 2, "{gaps:?}");
    assert!(
        gaps[2] < Duration::from_secs(1),
        "waited after a batch that was not caught up: {gaps:?}"
    );
}

/// The window has room for more batches, but a caught-up one holds the next
/// poll all the same.
#[tokio::test(start_paused = true)]
async fn given_room_for_more_batches_when_one_is_caught_up_should_still_wait_its_interval() {
    let gaps = gaps_between_polls(4).await;
    assert!(gaps.len() >= 3, "{gaps:?}");
    assert!(
        gaps[0] >= INTERVAL && gaps[1] >= INTERVAL,
        "polled a caught-up source early: {gaps:?}"
    );
    assert!(gaps[2] < Duration::from_secs(1), "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn given_a_stop_during_the_wait_between_polls_should_end_the_pipeline_at_once() {
    let harness = Harness::new(Duration::from_secs(5));
    let (source, log) = ScriptedSource::new(
        vec![
            Step::empty().caught_up(Duration::from_secs(3600)),
            Step::numbers(0..1),
        ],
        BatchPolicy::default(),
    );
    harness.start_source("src", source, None).await;
    wait_for("the empty batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;

    let asked = tokio::time::Instant::now();
    harness
        .runtime
        .stop(ConnectorKind::Source, "src")
        .await
        .unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "the stop waited {:?} for the poll interval",
        asked.elapsed()
    );
    assert_eq!(
        log.polls.load(Ordering::SeqCst),
        1,
        "polled during the stop"
    );
    assert_eq!(log.closes.load(Ordering::SeqCst), 1);
    assert_eq!(
        harness.status(ConnectorKind::Source, "src").status,
        Status::Stopped
    );
    assert!(harness.numbers_in_topic(TOPIC).is_empty());
}
