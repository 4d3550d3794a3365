//! The engine retries for the connectors (rules K3 and 5 of
//! docs/ARCHITECTURE.md): `open` while the backend is down, a connection lost
//! mid-run, a write the backend took in part, and a backend's `Retry-After`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::scripted::{
    self, Answer, GROUP, STREAM, ScriptedSource, SinkControl, SourceLog, Step, TOPIC,
};
use super::{FAST, Harness, state_bytes, wait_for};
use crate::config::OnError;
use crate::connectors::{BatchPolicy, ConnectorKind, Rejection, RetrySettings, SinkError};
use crate::engine::{CLOSE_WAIT, Status, StopReason};
use crate::state::{StateStore, StoredState};

/// Rule 5: a sink whose backend is down when it starts is opened again and
/// again, `starting` with the error and the count meanwhile, and delivers
/// once the backend is up, with no restart.
#[tokio::test]
async fn given_a_backend_down_at_open_when_the_sink_starts_should_retry_open_as_starting_then_deliver()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    control.down_at_open.store(true, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness.produce(&[br#"{"n":0}"#, br#"{"n":1}"#]).await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("three failed opens", || {
        control.opens.load(Ordering::SeqCst) >= 3
    })
    .await;
    let status = harness.status(ConnectorKind::Sink, "snk");
    assert_eq!(status.status, Status::Starting);
    assert!(status.open_attempts >= 2, "{status:?}");
    let error = status.last_error.expect("the open error is shown");
    assert!(error.message.contains("connection refused"), "{error:?}");
    // Every failed instance was closed before the next was built.
    assert!(control.closes.load(Ordering::SeqCst) >= 2);

    control.down_at_open.store(false, Ordering::SeqCst);
    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(1)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0, 1]);
    let view = harness.runtime.view(ConnectorKind::Sink, "snk").unwrap();
    assert_eq!(view.status.status, Status::Running);
    assert_eq!(view.status.open_attempts, 0);
    assert!(view.metrics.open_retries.get() >= 3);
    harness.runtime.shutdown().await;
}

/// Rule 5: a fatal `open` error (credentials, a refused config) is not
/// retried: the sink stops with `start_failed`.
#[tokio::test]
async fn given_a_fatal_open_error_when_the_sink_starts_should_stop_with_start_failed_at_once() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    control.open_fatal.store(true, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("the sink to fail", || {
        harness.status(ConnectorKind::Sink, "snk").status == Status::Error
    })
    .await;
    let status = harness.status(ConnectorKind::Sink, "snk");
    assert_eq!(status.stop_reason, Some(StopReason::StartFailed));
    assert!(
        status
            .last_error
            .unwrap()
            .message
            .contains("credentials refused")
    );
    assert_eq!(control.opens.load(Ordering::SeqCst), 1);
}

/// `[engine] max_open_attempts` caps the retries of `open`.
#[tokio::test]
async fn given_max_open_attempts_when_the_backend_stays_down_should_stop_with_start_failed_naming_it()
 {
    let harness = Harness::with_runtime(
        |options| options.max_open_attempts = Some(3),
        |_, state| state,
    );
    let control = Arc::new(SinkControl::default());
    control.down_at_open.store(true, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("the sink to give up", || {
        harness.status(ConnectorKind::Sink, "snk").status == Status::Error
    })
    .await;
    let status = harness.status(ConnectorKind::Sink, "snk");
    assert_eq!(status.stop_reason, Some(StopReason::StartFailed));
    let message = status.last_error.unwrap().message;
    assert!(message.contains("max_open_attempts"), "{message}");
    assert_eq!(control.opens.load(Ordering::SeqCst), 3);
}

/// Rule 5: a source whose backend is down at start is opened again on a
/// fresh instance, each time from the same saved state, never skipping it.
#[tokio::test]
async fn given_saved_state_and_a_backend_down_at_open_when_retried_should_open_every_time_from_that_state()
 {
    let harness = Harness::new(Duration::from_secs(5));
    harness
        .state
        .save(
            "src",
            &StoredState {
                connector: "scripted".into(),
                data: state_bytes(3),
            },
        )
        .await
        .unwrap();
    let (first, log) = ScriptedSource::new(Vec::new(), BatchPolicy::default());
    drop(first);
    log.open_failures.store(2, Ordering::SeqCst);
    let fresh = log.clone();
    harness.factory.source_with("src", move || {
        Box::new(ScriptedSource::with_log(
            vec![Step::numbers(3..5)],
            BatchPolicy::default(),
            fresh.clone(),
        ))
    });
    harness
        .runtime
        .add(scripted::source_config("src", None))
        .unwrap();
    harness.runtime.start_enabled().await;

    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(
        *log.opens.lock().unwrap(),
        vec![Some(state_bytes(3)); 3],
        "every open attempt restores the saved state"
    );
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![3, 4]);
    harness.runtime.shutdown().await;
}

/// Rule 5: a source whose connection is lost mid-run is closed and opened
/// again from the state of its last committed batch.
#[tokio::test]
async fn given_a_lost_connection_when_the_source_polls_should_reopen_it_from_committed_state() {
    let harness = Harness::new(Duration::from_secs(5));
    let log = start_source_that_reconnects(&harness, 0).await;

    wait_for("both batches to commit", || {
        log.commits.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(*log.opens.lock().unwrap(), vec![None, Some(state_bytes(3))]);
    assert_eq!(log.closes.load(Ordering::SeqCst), 1);
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2, 3, 4]);
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.metrics.reopens.get(), 1);
    assert_eq!(view.status.status, Status::Running);
    harness.runtime.shutdown().await;
}

/// Rule 5: a sink whose connection is lost during a write is closed and
/// opened again, and the batch is written by the fresh instance; the offsets
/// stay put until then.
#[tokio::test]
async fn given_a_lost_connection_when_the_sink_writes_should_reopen_it_and_write_the_batch_again() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    control.disconnects.store(1, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness.produce(&[br#"{"n":0}"#, br#"{"n":1}"#]).await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(1)
    })
    .await;
    assert_eq!(control.written_numbers(), vec![0, 1]);
    assert_eq!(control.opens.load(Ordering::SeqCst), 2);
    assert_eq!(control.closes.load(Ordering::SeqCst), 1);
    let view = harness.runtime.view(ConnectorKind::Sink, "snk").unwrap();
    assert_eq!(view.metrics.reopens.get(), 1);
    harness.runtime.shutdown().await;
}

/// Rule K3: after a write the backend took in part, only what is not durable
/// is written again; what it refused goes through `on_error`, and the
/// offsets move once every message is durable or set aside.
#[tokio::test]
async fn given_a_partial_write_when_retried_should_write_again_only_what_is_not_durable() {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    let partial: Answer = Box::new(|batch, written| {
        written.extend_from_slice(&batch[..2]);
        Err(SinkError::partial(
            vec![0, 1],
            vec![Rejection {
                index: 2,
                reason: "mapping refused".into(),
            }],
            SinkError::transient("429 on the rest"),
        ))
    });
    control.answers.lock().unwrap().push_back(partial);
    harness.factory.sink("snk", control.clone());
    harness
        .produce(&[
            br#"{"n":0}"#,
            br#"{"n":1}"#,
            br#"{"n":2}"#,
            br#"{"n":3}"#,
            br#"{"n":4}"#,
        ])
        .await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Skip))
        .await;

    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(4)
    })
    .await;
    assert_eq!(
        *control.batches.lock().unwrap(),
        vec![vec![0, 1, 2, 3, 4], vec![3, 4]]
    );
    assert_eq!(control.written_numbers(), vec![0, 1, 3, 4]);
    let view = harness.runtime.view(ConnectorKind::Sink, "snk").unwrap();
    assert_eq!(view.metrics.skipped.get(), 1);
    assert_eq!(view.metrics.processed.get(), 4);
    assert_eq!(view.metrics.retries.get(), 1);
    harness.runtime.shutdown().await;
}

/// How long the engine waited between a write answered `Retry-After:
/// asked` and the next one, under a runtime whose cap is `cap`, counted on
/// the (paused) tokio clock.
async fn wait_after_throttling(asked: Duration, cap: Duration) -> Duration {
    let harness = Harness::with_runtime(|options| options.max_retry_after = cap, |_, state| state);
    let control = Arc::new(SinkControl::default());
    let throttled: Answer = Box::new(move |_, _| {
        Err(SinkError::transient_after(
            "429 Too Many Requests",
            Some(asked),
        ))
    });
    control.answers.lock().unwrap().push_back(throttled);
    harness.factory.sink("snk", control.clone());
    harness.produce(&[br#"{"n":0}"#]).await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;
    wait_for("the message to be written", || {
        control.written_numbers() == [0]
    })
    .await;
    harness.runtime.shutdown().await;
    let times = control.write_times.lock().unwrap().clone();
    assert_eq!(times.len(), 2);
    times[1] - times[0]
}

/// Rule K3: a backend's `Retry-After` is waited for before the next write,
/// counted on a paused clock (the backoff alone is a few milliseconds).
#[tokio::test(start_paused = true)]
async fn given_a_transient_failure_with_retry_after_when_retried_should_wait_what_the_backend_asked()
 {
    let waited = wait_after_throttling(Duration::from_secs(30), Duration::from_secs(600)).await;
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
}

/// `[engine] max_retry_after` caps what a backend may ask for.
#[tokio::test(start_paused = true)]
async fn given_a_retry_after_past_the_cap_when_retried_should_wait_only_the_cap() {
    let waited = wait_after_throttling(Duration::from_secs(3600), Duration::from_secs(10)).await;
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "{waited:?}"
    );
}

/// A connector's own retry fields are the engine's policy for it: past its
/// `max_retries` failed writes it is reported degraded, keeps retrying, and
/// is no longer degraded once the write succeeds.
#[tokio::test]
async fn given_a_connector_retry_policy_when_writes_keep_failing_should_report_degraded_until_written()
 {
    let harness = Harness::new(Duration::from_secs(5));
    let control = Arc::new(SinkControl::default());
    *control.retry.lock().unwrap() = Some(RetrySettings {
        backoff: FAST,
        degraded_after: Some(3),
    });
    control.transient_failures.store(u32::MAX, Ordering::SeqCst);
    harness.factory.sink("snk", control.clone());
    harness.produce(&[br#"{"n":0}"#]).await;
    harness
        .start_sink(scripted::sink_config("snk", OnError::Stop))
        .await;

    wait_for("the sink to say it is degraded", || {
        let view = harness.runtime.view(ConnectorKind::Sink, "snk").unwrap();
        view.degraded
            .is_some_and(|reason| reason.contains("consecutive failed writes"))
    })
    .await;
    assert_eq!(harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0), None);
    control.transient_failures.store(0, Ordering::SeqCst);
    wait_for("the batch to commit", || {
        harness.bus.committed_offset(STREAM, TOPIC, GROUP, 0) == Some(0)
    })
    .await;
    let view = harness.runtime.view(ConnectorKind::Sink, "snk").unwrap();
    assert_eq!(view.degraded, None);
    assert_eq!(view.status.status, Status::Running);
    harness.runtime.shutdown().await;
}

/// O3: a source whose connection is lost and whose close then never ends
/// (its backend does not answer) is left behind after `CLOSE_WAIT`, and a
/// fresh one opens from committed state.
#[tokio::test(start_paused = true)]
async fn given_a_close_that_never_ends_when_reopening_should_leave_it_after_the_close_wait() {
    let harness = Harness::new(Duration::from_secs(5));
    let started = tokio::time::Instant::now();
    let log = start_source_that_reconnects(&harness, 1).await;

    wait_for("both batches to commit", || {
        log.commits.load(Ordering::SeqCst) == 2
    })
    .await;
    assert!(started.elapsed() >= CLOSE_WAIT, "{:?}", started.elapsed());
    assert_eq!(*log.opens.lock().unwrap(), vec![None, Some(state_bytes(3))]);
    assert_eq!(harness.numbers_in_topic(TOPIC), vec![0, 1, 2, 3, 4]);
    harness.runtime.shutdown().await;
}

/// Starts source `src`: it delivers 0..3 and loses its connection, and the
/// instances built after it deliver 3..5; its first `close_hangs` closes
/// never end.
async fn start_source_that_reconnects(harness: &Harness, close_hangs: u32) -> Arc<SourceLog> {
    let (first, log) = ScriptedSource::new(
        vec![Step::numbers(0..3), Step::Disconnect],
        BatchPolicy::default(),
    );
    log.close_hangs.store(close_hangs, Ordering::SeqCst);
    let first = std::sync::Mutex::new(Some(first));
    let fresh = log.clone();
    harness
        .factory
        .source_with("src", move || match first.lock().unwrap().take() {
            Some(source) => Box::new(source),
            None => Box::new(ScriptedSource::with_log(
                vec![Step::numbers(3..5)],
                BatchPolicy::default(),
                fresh.clone(),
            )),
        });
    harness
        .runtime
        .add(scripted::source_config("src", None))
        .unwrap();
    harness.runtime.start_enabled().await;
    log
}
