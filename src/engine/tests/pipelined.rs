//! Sources with several batches in flight (docs/ARCHITECTURE.md, rules S1 to
//! S3): in-order commits, a NACK retried in place, group commit of state.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use super::scripted::{self, STREAM, ScriptedSource, Step, TOPIC};
use super::{Harness, dead_lettering, state_bytes, wait_for};
use crate::config::KindConfig;
use crate::connectors::{BatchPolicy, ConnectorKind};
use crate::iggy::MemoryBus;
use crate::message::{Payload, SourceRecord};
use crate::state::{MemoryStateStore, StateError, StateStore, StoredState};

/// Four batches of three numbers each: 0..12.
fn four_batches() -> Vec<Step> {
    (0..4).map(|k| Step::numbers(k * 3..k * 3 + 3)).collect()
}

/// A state store whose first save waits until the topic holds `until`
/// messages (so later batches are sent meanwhile), then fails or succeeds.
struct HeldStore {
    inner: Arc<MemoryStateStore>,
    bus: MemoryBus,
    until: usize,
    fail: bool,
    held: AtomicBool,
}

impl HeldStore {
    fn new(bus: &MemoryBus, inner: Arc<MemoryStateStore>, until: usize, fail: bool) -> Arc<Self> {
        Arc::new(Self {
            inner,
            bus: bus.clone(),
            until,
            fail,
            held: AtomicBool::new(false),
        })
    }
}

#[async_trait]
impl StateStore for HeldStore {
    async fn load(&self, key: &str) -> Result<Option<StoredState>, StateError> {
        self.inner.load(key).await
    }

    async fn save(&self, key: &str, state: &StoredState) -> Result<(), StateError> {
        if !self.held.swap(true, Ordering::SeqCst) {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.bus.messages(STREAM, TOPIC).len() < self.until {
                assert!(Instant::now() < deadline, "later batches were never sent");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if self.fail {
                return Err(StateError::Unavailable("held save fails".into()));
            }
        }
        self.inner.save(key, state).await
    }

    async fn clear(&self, key: &str) -> Result<(), StateError> {
        self.inner.clear(key).await
    }

    fn location(&self, key: &str) -> String {
        self.inner.location(key)
    }
}

/// S1, S3: a send NACK of batch k while k+1.. are polled retries batch k in
/// place: the later batches wait, nothing is committed past k, and every
/// record reaches the topic once, in order.
#[tokio::test]
async fn given_a_send_nack_with_later_batches_polled_when_retried_should_send_the_same_batch_again_first()
 {
    let harness = Harness::new(Duration::from_secs(5));
    // The first send fails after a delay in which the next batches are polled.
    harness.bus.delay_sends(Duration::from_millis(200));
    harness.bus.refuse_sends(1);
    let (source, log) = ScriptedSource::new(four_batches(), BatchPolicy::default());
    let polls = log.clone();
    *log.probe.lock().unwrap() = Some(Box::new(move || {
        format!("polls={}", polls.polls.load(Ordering::SeqCst))
    }));
    harness.start_source("src", source.in_flight(4), None).await;

    wait_for("every batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 4
    })
    .await;
    let at_commit = log.at_commit.lock().unwrap().clone();
    assert!(
        at_commit[0] != "polls=1",
        "later batches were polled while the first was retried: {at_commit:?}"
    );
    assert_eq!(harness.numbers_in_topic(TOPIC), (0..12).collect::<Vec<_>>());
    assert_eq!(harness.state.get("src").unwrap().data, state_bytes(12));
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.metrics.nacks.get(), 1);
    harness.runtime.shutdown().await;
}

/// `max_in_flight_bytes` stops polling once the batches in flight hold that
/// many payload bytes, below `max_in_flight`; one batch may always be in
/// flight however large. Sends are slow, so without the byte bound the
/// source polls four batches before the first commit (the test above).
#[tokio::test]
async fn given_a_byte_bound_when_batches_fill_it_should_poll_no_further_until_a_commit() {
    // A batch of three `{"n":k}` is 21 payload bytes: 1 byte holds one
    // batch in flight, 30 bytes two.
    for (bytes, polls_at_first_commit) in [(1, "polls=1"), (30, "polls=2")] {
        let harness = Harness::new(Duration::from_secs(5));
        harness.bus.delay_sends(Duration::from_millis(200));
        let (source, log) = ScriptedSource::new(four_batches(), BatchPolicy::default());
        let polls = log.clone();
        *log.probe.lock().unwrap() = Some(Box::new(move || {
            format!("polls={}", polls.polls.load(Ordering::SeqCst))
        }));
        harness.factory.source_once("src", source.in_flight(4));
        let mut config = scripted::source_config("src", None);
        if let KindConfig::Source {
            max_in_flight_bytes,
            ..
        } = &mut config.kind_config
        {
            *max_in_flight_bytes = Some(bytes);
        }
        harness.runtime.add(config).unwrap();
        harness.runtime.start_enabled().await;

        wait_for("every batch to commit", || {
            log.commits.load(Ordering::SeqCst) == 4
        })
        .await;
        let at_commit = log.at_commit.lock().unwrap().clone();
        assert_eq!(
            at_commit[0], polls_at_first_commit,
            "{bytes} bytes: {at_commit:?}"
        );
        assert_eq!(harness.numbers_in_topic(TOPIC), (0..12).collect::<Vec<_>>());
        harness.runtime.shutdown().await;
    }
}

/// S1, S3: a failed state save while later batches are already in Iggy
/// commits none of them; the save is retried and nothing is sent twice.
#[tokio::test]
async fn given_a_state_save_failing_while_later_batches_are_sent_when_retried_should_commit_none_before_it()
 {
    let harness = Harness::with_store(Duration::from_secs(5), |bus, memory| {
        HeldStore::new(bus, memory, 9, true)
    });
    let (source, log) = ScriptedSource::new(four_batches(), BatchPolicy::default());
    let state = harness.state.clone();
    *log.probe.lock().unwrap() = Some(Box::new(move || {
        format!("{:?}", state.get("src").map(|stored| stored.data))
    }));
    harness.start_source("src", source.in_flight(4), None).await;

    wait_for("every batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 4
    })
    .await;
    // The first commit came after a save that succeeded (the failed one
    // saved nothing) and covers at least its batch.
    let at_commit = log.at_commit.lock().unwrap().clone();
    assert!(at_commit[0].starts_with("Some("), "{at_commit:?}");
    assert_eq!(harness.numbers_in_topic(TOPIC), (0..12).collect::<Vec<_>>());
    assert_eq!(harness.state.get("src").unwrap().data, state_bytes(12));
    let view = harness.runtime.view(ConnectorKind::Source, "src").unwrap();
    assert_eq!(view.metrics.nacks.get(), 1);
    harness.runtime.shutdown().await;
}

/// S1 (group commit): batches acknowledged while a save runs are covered by
/// one save of the newest state, then committed in poll order.
#[tokio::test]
async fn given_batches_acknowledged_during_a_save_when_committing_should_save_once_for_all_and_commit_in_order()
 {
    let harness = Harness::with_store(Duration::from_secs(5), |bus, memory| {
        HeldStore::new(bus, memory, 12, false)
    });
    let (source, log) = ScriptedSource::new(four_batches(), BatchPolicy::default());
    let state = harness.state.clone();
    *log.probe.lock().unwrap() = Some(Box::new(move || {
        let saved = state.get("src").map(|stored| stored.data);
        format!("{saved:?}")
    }));
    harness.start_source("src", source.in_flight(4), None).await;

    wait_for("every batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 4
    })
    .await;
    let saves = harness.saved_states();
    assert_eq!(saves, vec![state_bytes(3), state_bytes(12)]);
    // Each commit came after the save covering its batch, in poll order.
    let covered = |end| format!("{:?}", Some(state_bytes(end)));
    assert_eq!(
        *log.at_commit.lock().unwrap(),
        vec![covered(3), covered(12), covered(12), covered(12)]
    );
    assert_eq!(harness.numbers_in_topic(TOPIC), (0..12).collect::<Vec<_>>());
    harness.runtime.shutdown().await;
}

/// A batch with transforms is prepared in slices on several threads (one
/// per core): the topic and the dead-letter topic keep the batch's order.
#[tokio::test]
async fn given_a_large_batch_with_transforms_when_prepared_in_slices_should_keep_its_order_and_its_dead_letters()
 {
    let harness = Harness::new(Duration::from_secs(5));
    // Every seventh record does not encode as JSON and is dead-lettered.
    let records = (0..1000u64)
        .map(|n| match n % 7 {
            0 => SourceRecord::new(Payload::Raw(Bytes::from(format!("not json {n}")))),
            _ => SourceRecord::new(Payload::Json(serde_json::json!({ "n": n }))),
        })
        .collect();
    let log = harness.one_batch_source("src", records);
    let mut config = dead_lettering(scripted::source_config("src", None));
    config.transforms = vec![(
        "add_fields".into(),
        serde_json::json!({"fields": [{"key": "t", "value": {"static": 1}}]}),
    )];
    harness.runtime.add(config).unwrap();
    harness.runtime.start_enabled().await;

    wait_for("the batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 1
    })
    .await;
    let kept: Vec<u64> = (0..1000).filter(|n| n % 7 != 0).collect();
    assert_eq!(harness.numbers_in_topic(TOPIC), kept);
    let transformed = harness.bus.messages(STREAM, TOPIC);
    assert!(transformed.iter().all(|message| {
        serde_json::from_slice::<serde_json::Value>(&message.payload).unwrap()["t"] == 1
    }));
    let dead: Vec<String> = harness
        .bus
        .messages(STREAM, "dlq")
        .iter()
        .map(|message| String::from_utf8_lossy(&message.payload).into_owned())
        .collect();
    let expected: Vec<String> = (0..1000)
        .filter(|n| n % 7 == 0)
        .map(|n| format!("not json {n}"))
        .collect();
    assert_eq!(dead, expected);
    harness.runtime.shutdown().await;
}

/// S3: acknowledged batches that follow each other closely share state
/// saves (up to half a window each); the first batch, after no commit at
/// all, is saved at once. The clock is paused, so no linger runs out while
/// batches flow: only the half-window rule and the source's last batch
/// start a save.
#[tokio::test(start_paused = true)]
async fn given_batches_acknowledged_close_together_when_committed_should_share_state_saves() {
    let harness = Harness::new(Duration::from_secs(5));
    let steps = (0..16).map(|k| Step::numbers(k * 3..k * 3 + 3)).collect();
    let (source, log) = ScriptedSource::new(steps, BatchPolicy::default());
    harness.start_source("src", source.in_flight(8), None).await;

    wait_for("every batch to commit", || {
        log.commits.load(Ordering::SeqCst) == 16
    })
    .await;
    let saves = harness.saved_states();
    assert_eq!(saves.first(), Some(&state_bytes(3)), "{saves:?}");
    assert_eq!(saves.last(), Some(&state_bytes(48)), "{saves:?}");
    assert!(
        saves.len() <= 1 + 15_usize.div_ceil(4),
        "{} saves for 16 batches: {saves:?}",
        saves.len()
    );
    assert_eq!(harness.numbers_in_topic(TOPIC), (0..48).collect::<Vec<_>>());
    harness.runtime.shutdown().await;
}
