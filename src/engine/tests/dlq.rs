//! Dead letters read back and replayed: to a fresh instance of the sink, or
//! back to their origin topic, each recorded so it is delivered once unless
//! asked again.

use super::*;
use crate::engine::runtime::{ReplayTarget, Selection};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A sink `snk` with `on_error = "dlq"` whose backend refuses `"bad"`
/// messages; returns once the batch of three (the second bad) is committed.
async fn dead_lettering_sink(harness: &Harness) -> Arc<SinkControl> {
    let control = harness.rejecting_sink("snk");
    harness
        .produce(&[br#"{"n":0}"#, br#"{"n":1,"bad":true}"#, br#"{"n":2}"#])
        .await;
    harness
        .start_sink(dead_lettering(scripted::sink_config("snk", OnError::Dlq)))
        .await;
    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(2)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0, 2]);
    control
}

async fn replay(harness: &Harness, selection: &Selection, target: ReplayTarget) -> Vec<u64> {
    let report = harness
        .runtime
        .replay_dead_letters(ConnectorKind::Sink, "snk", selection, target, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(report.stopped, None, "{report:?}");
    report.offsets
}

#[tokio::test]
async fn given_a_fixed_backend_when_dead_letters_are_replayed_to_the_sink_should_land_once() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = dead_lettering_sink(&harness).await;
    let page = harness
        .runtime
        .dead_letters(ConnectorKind::Sink, "snk", 0, 0, 10)
        .await
        .unwrap();
    assert_eq!(page.dead_letters.len(), 1);
    assert_eq!(page.dead_letters[0].context.offset, Some(1));
    assert!(!page.dead_letters[0].replayed);

    control.reject_bad.store(false, Ordering::SeqCst);
    let replayed = replay(&harness, &Selection::default(), ReplayTarget::Sink).await;
    assert_eq!(replayed, vec![0]);
    assert_eq!(control.written_numbers(), vec![0, 2, 1]);

    // Recorded: a second replay delivers nothing, the list marks it.
    let replayed = replay(&harness, &Selection::default(), ReplayTarget::Sink).await;
    assert!(replayed.is_empty());
    assert_eq!(control.written_numbers(), vec![0, 2, 1]);
    let page = harness
        .runtime
        .dead_letters(ConnectorKind::Sink, "snk", 0, 0, 10)
        .await
        .unwrap();
    assert!(page.dead_letters[0].replayed);

    // Unless asked again.
    let again = Selection {
        again: true,
        ..Selection::default()
    };
    assert_eq!(replay(&harness, &again, ReplayTarget::Sink).await, vec![0]);
    assert_eq!(control.written_numbers(), vec![0, 2, 1, 1]);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_a_backend_still_refusing_when_replayed_should_dead_letter_again_counting_the_attempt()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let control = dead_lettering_sink(&harness).await;
    assert_eq!(
        replay(&harness, &Selection::default(), ReplayTarget::Sink).await,
        vec![0]
    );
    assert_eq!(control.written_numbers(), vec![0, 2]);
    let dead = harness.bus.messages(STREAM, "dlq");
    assert_eq!(dead.len(), 2);
    let again = dead_letter::Context::of(&dead[1].headers);
    assert_eq!((again.attempts, again.offset), (2, Some(1)));
    assert_eq!(again.origin.map(|origin| origin.topic), Some(TOPIC.into()));
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_a_filter_that_matches_none_when_replayed_should_deliver_and_record_nothing() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = dead_lettering_sink(&harness).await;
    control.reject_bad.store(false, Ordering::SeqCst);
    let decode_only = Selection {
        error_class: Some("decode".into()),
        ..Selection::default()
    };
    assert!(
        replay(&harness, &decode_only, ReplayTarget::Sink)
            .await
            .is_empty()
    );
    // The filtered-out dead letter is still there for the next replay.
    let rejected = Selection {
        error_class: Some("rejected".into()),
        ..Selection::default()
    };
    assert_eq!(
        replay(&harness, &rejected, ReplayTarget::Sink).await,
        vec![0]
    );
    assert_eq!(control.written_numbers(), vec![0, 2, 1]);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_target_origin_when_replayed_should_append_to_the_origin_topic_for_the_sink_to_read()
{
    let harness = Harness::new(Duration::from_secs(5));
    let control = dead_lettering_sink(&harness).await;
    control.reject_bad.store(false, Ordering::SeqCst);
    assert_eq!(
        replay(&harness, &Selection::default(), ReplayTarget::Origin).await,
        vec![0]
    );
    let origin = harness.bus.messages(STREAM, TOPIC);
    assert_eq!(origin.len(), 4);
    // Only the attempt count of the dead-letter headers goes along.
    let names: Vec<&str> = origin[3]
        .headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(names, vec![dead_letter::HEADER_ATTEMPTS]);
    wait_for("the running sink to write it", || {
        control.written_numbers() == vec![0, 2, 1]
    })
    .await;
    assert!(
        replay(&harness, &Selection::default(), ReplayTarget::Origin)
            .await
            .is_empty()
    );
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_a_source_dead_letter_when_replayed_should_go_to_the_topic_it_was_meant_for() {
    let harness = Harness::new(Duration::from_secs(5));
    let log = harness.one_batch_source("src", one_good_one_unencodable());
    harness
        .runtime
        .add(dead_lettering(scripted::source_config("src", None)))
        .unwrap();
    harness.runtime.start_enabled().await;
    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    let page = harness
        .runtime
        .dead_letters(ConnectorKind::Source, "src", 0, 0, 10)
        .await
        .unwrap();
    let context = &page.dead_letters[0].context;
    assert_eq!(
        (context.class.as_deref(), context.stage.as_deref()),
        (Some("encode"), Some("encode"))
    );

    let refused = harness
        .runtime
        .replay_dead_letters(
            ConnectorKind::Source,
            "src",
            &Selection::default(),
            ReplayTarget::Sink,
            TIMEOUT,
        )
        .await;
    assert!(refused.is_err());
    let report = harness
        .runtime
        .replay_dead_letters(
            ConnectorKind::Source,
            "src",
            &Selection::default(),
            ReplayTarget::Origin,
            TIMEOUT,
        )
        .await
        .unwrap();
    assert_eq!(report.offsets, vec![0]);
    let payloads: Vec<Bytes> = harness
        .bus
        .messages(STREAM, TOPIC)
        .into_iter()
        .map(|message| message.payload)
        .collect();
    assert_eq!(payloads.last(), Some(&Bytes::from_static(b"{not json")));
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_a_backend_failing_until_the_timeout_when_replayed_should_record_nothing_and_deliver_later()
 {
    let harness = Harness::new(Duration::from_millis(200));
    let control = dead_lettering_sink(&harness).await;
    control.reject_bad.store(false, Ordering::SeqCst);
    control.transient_failures.store(u32::MAX, Ordering::SeqCst);
    let report = harness
        .runtime
        .replay_dead_letters(
            ConnectorKind::Sink,
            "snk",
            &Selection::default(),
            ReplayTarget::Sink,
            Duration::from_millis(300),
        )
        .await
        .unwrap();
    assert!(report.offsets.is_empty(), "{report:?}");
    assert!(report.stopped.is_some(), "{report:?}");
    let page = harness
        .runtime
        .dead_letters(ConnectorKind::Sink, "snk", 0, 0, 10)
        .await
        .unwrap();
    assert!(!page.dead_letters[0].replayed);

    control.transient_failures.store(0, Ordering::SeqCst);
    assert_eq!(
        replay(&harness, &Selection::default(), ReplayTarget::Sink).await,
        vec![0]
    );
    assert_eq!(control.written_numbers(), vec![0, 2, 1]);
    harness.runtime.shutdown().await;
}
