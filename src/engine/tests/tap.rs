//! The tap sees each stage where the pipeline passes it: what came in, what
//! was delivered, what was dead-lettered.

use super::*;
use crate::engine::tap::{TapEvent, TapFrame, TapStage, TapSubscription};

/// The frames a subscription holds now.
fn frames(subscription: &mut TapSubscription) -> Vec<Arc<TapFrame>> {
    let mut frames = Vec::new();
    while let Ok(event) = subscription.receiver.try_recv() {
        if let TapEvent::Message(frame) = event {
            frames.push(frame);
        }
    }
    frames
}

/// Subscriptions to `in`, `out` and `dlq`.
fn subscribe_all(harness: &Harness, kind: ConnectorKind, key: &str) -> [TapSubscription; 3] {
    let view = harness.runtime.view(kind, key).unwrap();
    [TapStage::In, TapStage::Out, TapStage::Dlq].map(|stage| view.tap.subscribe(stage))
}

fn payloads(frames: &[Arc<TapFrame>]) -> Vec<String> {
    frames
        .iter()
        .map(|frame| String::from_utf8_lossy(&frame.payload).into_owned())
        .collect()
}

#[tokio::test]
async fn given_a_tapped_sink_when_a_message_is_refused_should_show_it_in_and_dead_lettered_and_the_rest_out()
 {
    let harness = Harness::new(Duration::from_secs(5));
    harness.rejecting_sink("snk");
    harness
        .produce(&[br#"{"n":0}"#, br#"{"n":1,"bad":true}"#])
        .await;
    harness
        .runtime
        .add(dead_lettering(scripted::sink_config("snk", OnError::Dlq)))
        .unwrap();
    let [mut tapped_in, mut tapped_out, mut tapped_dlq] =
        subscribe_all(&harness, ConnectorKind::Sink, "snk");
    harness.runtime.start_enabled().await;
    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(1)
    })
    .await;

    let seen_in = frames(&mut tapped_in);
    let offsets: Vec<Option<u64>> = seen_in.iter().map(|frame| frame.offset).collect();
    assert_eq!(offsets, vec![Some(0), Some(1)]);
    assert_eq!(
        seen_in[0].topic.as_ref().map(|topic| topic.topic.as_str()),
        Some(TOPIC)
    );
    let seen_out = frames(&mut tapped_out);
    assert_eq!(payloads(&seen_out), vec![r#"{"n":0}"#]);
    let seen_dlq = frames(&mut tapped_dlq);
    assert_eq!(seen_dlq.len(), 1);
    // The dead letter names where it was read, not the dead-letter topic.
    assert_eq!(
        (
            seen_dlq[0].topic.as_ref().map(|topic| topic.topic.as_str()),
            seen_dlq[0].partition,
            seen_dlq[0].offset
        ),
        (Some(TOPIC), Some(0), Some(1))
    );
    assert!(
        seen_dlq[0]
            .headers
            .iter()
            .any(|(name, value)| name == dead_letter::HEADER_ERROR
                && value.to_string() == "scripted rejection")
    );
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_a_tapped_source_when_a_record_does_not_encode_should_show_it_in_and_dead_lettered_and_the_rest_out()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let log = harness.one_batch_source("src", one_good_one_unencodable());
    harness
        .runtime
        .add(dead_lettering(scripted::source_config("src", None)))
        .unwrap();
    let [mut tapped_in, mut tapped_out, mut tapped_dlq] =
        subscribe_all(&harness, ConnectorKind::Source, "src");
    harness.runtime.start_enabled().await;
    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;

    assert_eq!(
        payloads(&frames(&mut tapped_in)),
        vec![r#"{"n":1}"#, "{not json"]
    );
    let seen_out = frames(&mut tapped_out);
    assert_eq!(payloads(&seen_out), vec![r#"{"n":1}"#]);
    assert_eq!(
        seen_out[0].topic.as_ref().map(|topic| topic.topic.as_str()),
        Some(TOPIC)
    );
    let seen_dlq = frames(&mut tapped_dlq);
    assert_eq!(payloads(&seen_dlq), vec!["{not json"]);
    // The dead letter names the topic the record was meant for.
    assert_eq!(
        seen_dlq[0].topic.as_ref().map(|topic| topic.topic.as_str()),
        Some(TOPIC)
    );
    harness.runtime.shutdown().await;
}
