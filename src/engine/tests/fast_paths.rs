//! The delivery contract on the engine's fast paths: JSON handed to a sink as
//! checked text, and a source state saved to a file store only after the send.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::scripted::{
    self, GROUP, STREAM, ScriptedFactory, ScriptedSource, SinkControl, Step, TOPIC,
};
use super::{FAST, Harness, state_bytes, wait_for};
use crate::connectors::{BatchPolicy, ConnectorKind};
use crate::delivery::OnError;
use crate::engine::runtime::{Runtime, RuntimeOptions};
use crate::iggy::MemoryBus;
use crate::message::Payload;
use crate::state::{FileStateStore, StateStore};

#[tokio::test]
async fn given_a_sink_taking_json_text_when_consuming_should_hand_it_the_stored_bytes_and_still_skip_what_is_not_json()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    control.accepts_json_bytes.store(true, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness
        .produce(&[
            br#"{"n": 0}"#,
            b"{garbage",
            b"{\"n\": 2, \"s\": \"\xff\"}",
            br#"{"n": 3} {"n": 4}"#,
            br#"{"n": 5}"#,
        ])
        .await;
    harness
        .runtime
        .add(scripted::sink_config("snk", OnError::Stop))
        .unwrap();
    harness.runtime.start_enabled().await;

    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(4)
    })
    .await;
    let written: Vec<Payload> = control
        .written
        .lock()
        .unwrap()
        .iter()
        .map(|message| message.payload.clone())
        .collect();
    assert_eq!(
        written,
        vec![
            Payload::JsonBytes(Bytes::from_static(br#"{"n": 0}"#)),
            Payload::JsonBytes(Bytes::from_static(br#"{"n": 5}"#)),
        ]
    );
    let view = harness.runtime.view(ConnectorKind::Sink, "snk").unwrap();
    assert_eq!(view.metrics.skipped.get(), 3);
    assert_eq!(view.metrics.errors.get(), 3);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_a_sink_taking_json_text_and_a_transform_when_consuming_should_hand_it_values() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    control.accepts_json_bytes.store(true, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness.produce(&[br#"{"n": 0}"#]).await;
    let mut config = scripted::sink_config("snk", OnError::Stop);
    config.transforms = vec![(
        "add_fields".into(),
        serde_json::json!({"fields": [{"key": "t", "value": {"static": 1}}]}),
    )];
    harness.runtime.add(config).unwrap();
    harness.runtime.start_enabled().await;

    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(0)
    })
    .await;
    let written = control.written.lock().unwrap()[0].payload.clone();
    assert_eq!(written, Payload::Json(serde_json::json!({"n": 0, "t": 1})));
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn given_a_file_store_and_refused_sends_when_retried_should_save_the_state_only_after_the_send()
 {
    let dir = tempfile::tempdir().unwrap();
    let bus = MemoryBus::new();
    let factory = Arc::new(ScriptedFactory::default());
    let runtime = Runtime::with_options(
        Arc::new(bus.clone()),
        Arc::new(FileStateStore::new(dir.path()).unwrap()),
        RuntimeOptions {
            shutdown_timeout: Duration::from_secs(5),
            source_backoff: FAST,
            sink_backoff: FAST,
            factory: factory.clone(),
            ..RuntimeOptions::default()
        },
    );
    bus.refuse_sends(u32::MAX);
    let (source, log) = ScriptedSource::new(vec![Step::numbers(0..3)], BatchPolicy::never_stop());
    factory.source_once("src", source);
    runtime.add(scripted::source_config("src", None)).unwrap();
    runtime.start_enabled().await;

    let view = || runtime.view(ConnectorKind::Source, "src").unwrap();
    wait_for("three refused sends", || view().metrics.nacks.get() >= 3).await;
    // What a restart would see now: no state.
    let on_disk = FileStateStore::new(dir.path()).unwrap();
    assert_eq!(on_disk.load("src").await.unwrap(), None);
    bus.refuse_sends(0);
    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    let saved = on_disk.load("src").await.unwrap().unwrap();
    assert_eq!(saved.data, state_bytes(3));
    runtime.shutdown().await;
}
