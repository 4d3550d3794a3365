//! Live samples of one connector's messages for `GET /{sources|sinks}/{key}/tap`.
//!
//! The pipeline calls [`Tap::source_records`] and friends once per batch and
//! stage. With nobody tapping that stage the call is one atomic load; with a
//! tap it copies at most [`PER_BATCH`] messages into a bounded
//! `tokio::sync::broadcast` ring, which never waits: a subscriber that falls
//! behind loses the oldest frames and is told how many.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::sync::broadcast;

use crate::clock::now_micros;
use crate::engine::dead_letter;
use crate::message::{Headers, OutgoingMessage, SinkMessage, SourceRecord, TopicRef};

/// Frames a subscriber may lag behind before it loses the oldest ones.
const CAPACITY: usize = 1024;

/// Messages of one batch copied for a tap, at most; the rest are reported
/// as skipped.
pub const PER_BATCH: usize = 256;

/// Where in the pipeline a message is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapStage {
    /// Source: records as polled, before transforms. Sink: messages decoded
    /// and transformed, before the write.
    In,
    /// Source: messages the bus acknowledged. Sink: messages the backend took.
    Out,
    /// Messages sent to the dead-letter topic.
    Dlq,
}

impl TapStage {
    const ALL: [TapStage; 3] = [TapStage::In, TapStage::Out, TapStage::Dlq];

    pub fn as_str(self) -> &'static str {
        match self {
            TapStage::In => "in",
            TapStage::Out => "out",
            TapStage::Dlq => "dlq",
        }
    }
}

impl std::str::FromStr for TapStage {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        TapStage::ALL
            .into_iter()
            .find(|stage| stage.as_str() == text)
            .ok_or_else(|| format!("unknown stage \"{text}\": expected in, out or dlq"))
    }
}

/// One message as a tap saw it.
#[derive(Debug, Clone)]
pub struct TapFrame {
    /// Microseconds since the epoch, when the pipeline saw it.
    pub time_micros: u64,
    pub topic: Option<TopicRef>,
    pub partition: Option<u32>,
    pub offset: Option<u64>,
    pub headers: Headers,
    pub payload: Bytes,
}

/// What a subscriber receives.
#[derive(Debug, Clone)]
pub enum TapEvent {
    Message(Arc<TapFrame>),
    /// Messages of a batch beyond [`PER_BATCH`], not copied.
    Skipped(u64),
}

/// One connector's tap: a ring per stage and how many subscribe to each.
#[derive(Debug)]
pub struct Tap {
    stages: [Ring; 3],
}

#[derive(Debug)]
struct Ring {
    subscribers: Arc<AtomicUsize>,
    sender: broadcast::Sender<TapEvent>,
}

/// A subscription to one stage; unsubscribes when dropped.
pub struct TapSubscription {
    pub receiver: broadcast::Receiver<TapEvent>,
    subscribers: Arc<AtomicUsize>,
}

impl Drop for TapSubscription {
    fn drop(&mut self) {
        self.subscribers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Default for Tap {
    fn default() -> Self {
        let ring = || Ring {
            subscribers: Arc::new(AtomicUsize::new(0)),
            sender: broadcast::channel(CAPACITY).0,
        };
        Self {
            stages: [ring(), ring(), ring()],
        }
    }
}

impl Tap {
    pub fn subscribe(&self, stage: TapStage) -> TapSubscription {
        let ring = self.ring(stage);
        ring.subscribers.fetch_add(1, Ordering::Relaxed);
        TapSubscription {
            receiver: ring.sender.subscribe(),
            subscribers: ring.subscribers.clone(),
        }
    }

    /// Whether anybody taps `stage`: the one atomic load an untapped batch costs.
    pub fn is_tapped(&self, stage: TapStage) -> bool {
        self.ring(stage).subscribers.load(Ordering::Relaxed) > 0
    }

    /// A source's polled records; `routes` names each `stream_index`.
    pub fn source_records(&self, routes: &[&TopicRef], records: &[SourceRecord]) {
        if !self.is_tapped(TapStage::In) {
            return;
        }
        self.publish(TapStage::In, records.len(), records.iter(), |record| {
            frame(
                routes.get(record.stream_index).copied(),
                record.partition,
                None,
                &record.headers,
                record.payload.to_bytes(),
            )
        });
    }

    /// Messages sent to the bus (`Out`, `topic` their target) or to the
    /// dead-letter topic (`Dlq`: each frame names the message's origin, read
    /// from its dead-letter headers).
    pub fn outgoing(
        &self,
        stage: TapStage,
        topic: Option<&TopicRef>,
        messages: &[OutgoingMessage],
    ) {
        if !self.is_tapped(stage) {
            return;
        }
        self.publish(stage, messages.len(), messages.iter(), |message| {
            if stage == TapStage::Dlq {
                let context = dead_letter::Context::of(&message.headers);
                return frame(
                    context.origin.as_ref().or(topic),
                    context.partition_id.or(message.partition),
                    context.offset,
                    &message.headers,
                    message.payload.clone(),
                );
            }
            frame(
                topic,
                message.partition,
                None,
                &message.headers,
                message.payload.clone(),
            )
        });
    }

    /// A sink's messages read from `topic`.
    pub fn sink_messages<'a>(
        &self,
        stage: TapStage,
        topic: &TopicRef,
        messages: impl ExactSizeIterator<Item = &'a SinkMessage>,
    ) {
        if !self.is_tapped(stage) {
            return;
        }
        self.publish(stage, messages.len(), messages, |message| {
            frame(
                Some(topic),
                Some(message.partition_id),
                Some(message.offset),
                &message.headers,
                message.payload.to_bytes(),
            )
        });
    }

    fn publish<T>(
        &self,
        stage: TapStage,
        count: usize,
        items: impl Iterator<Item = T>,
        to_frame: impl Fn(T) -> TapFrame,
    ) {
        let sender = &self.ring(stage).sender;
        for item in items.take(PER_BATCH) {
            // Fails only when every subscriber left meanwhile.
            if sender
                .send(TapEvent::Message(Arc::new(to_frame(item))))
                .is_err()
            {
                return;
            }
        }
        if count > PER_BATCH {
            let _ = sender.send(TapEvent::Skipped((count - PER_BATCH) as u64));
        }
    }

    fn ring(&self, stage: TapStage) -> &Ring {
        &self.stages[stage as usize]
    }
}

fn frame(
    topic: Option<&TopicRef>,
    partition: Option<u32>,
    offset: Option<u64>,
    headers: &Headers,
    payload: Bytes,
) -> TapFrame {
    TapFrame {
        time_micros: now_micros(),
        topic: topic.cloned(),
        partition,
        offset,
        headers: headers.clone(),
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Payload;

    fn topic() -> TopicRef {
        TopicRef {
            stream: "s".into(),
            topic: "t".into(),
        }
    }

    #[test]
    fn given_no_subscriber_when_a_batch_passes_should_not_be_tapped() {
        let tap = Tap::default();
        assert!(!tap.is_tapped(TapStage::In));
        let subscription = tap.subscribe(TapStage::In);
        assert!(tap.is_tapped(TapStage::In));
        assert!(!tap.is_tapped(TapStage::Out));
        drop(subscription);
        assert!(!tap.is_tapped(TapStage::In));
    }

    #[test]
    fn given_a_subscriber_when_a_large_batch_passes_should_copy_per_batch_and_report_the_rest() {
        let tap = Tap::default();
        let mut subscription = tap.subscribe(TapStage::In);
        let records: Vec<SourceRecord> = (0..PER_BATCH + 5)
            .map(|index| SourceRecord::new(Payload::Text(index.to_string())))
            .collect();
        let topic = topic();
        tap.source_records(&[&topic], &records);
        let mut messages = 0;
        let mut skipped = 0;
        while let Ok(event) = subscription.receiver.try_recv() {
            match event {
                TapEvent::Message(frame) => {
                    assert_eq!(frame.topic.as_ref(), Some(&topic));
                    messages += 1;
                }
                TapEvent::Skipped(count) => skipped += count,
            }
        }
        assert_eq!((messages, skipped), (PER_BATCH, 5));
    }

    #[test]
    fn given_a_stage_name_when_parsed_should_round_trip() {
        for stage in TapStage::ALL {
            assert_eq!(stage.as_str().parse::<TapStage>(), Ok(stage));
        }
        assert!("transformed".parse::<TapStage>().is_err());
    }
}
